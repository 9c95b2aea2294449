"""The CI gate: discovery, policy per path, parallel check, baseline and the verdict."""

CONNECT_TIMEOUT_S = 10.0
"""How long reaching a Dask scheduler may take before check gives up (--connect-timeout). Here, not
in executors, so the command line reads it without importing the gate."""
