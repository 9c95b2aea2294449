"""The CI gate: discovery, policy per path, parallel check, baseline and the verdict."""
