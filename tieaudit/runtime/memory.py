"""How much memory a runtime probe may use: the default derived from the model, and the overrides.

The limit is RLIMIT_DATA in the probe (``runtime_probe.limit_memory``): writable memory, what an
allocation consumes. Measured on this project's models with the probe itself (the smallest limit
each configuration still ran under, 2 CPUs): the corpus's GPT-2 (0.5 MiB of weights) 127 MiB in
every configuration; the bench's GPT-2 (204 MiB) 541-860 MiB embedded, 478-765 MiB with external
data, 796-1083 MiB with --embed-weights. Each ORT intra-op thread adds its stack and arena
(8.5 MiB measured per thread). The constants below leave room above the largest of these.
"""

from __future__ import annotations

import os
import resource

from tieaudit.core.errors import UsageError
from tieaudit.core.units import human_bytes, parse_size
from tieaudit.runtime.graph import ModelFacts

MEMORY_LIMIT_ENV = "TIEAUDIT_RUNTIME_MEMORY_LIMIT"
"""The probes' memory limit (a size: 4GiB, 512MB, bytes) for check --runtime and export; runtime's default."""
MEMORY_BASE = 512 << 20
"""A probe without weights: the corpus's GPT-2 (0.5 MiB) runs in 127 MiB; 4x for allocator slack."""
MEMORY_PER_WEIGHT_BYTE = 8
"""The bench GPT-2 (204 MiB) runs in 127 MiB + 4.7x its weights at most (--embed-weights); 8x: 1.7x slack."""
MEMORY_PER_INPUT_BYTE = 4
"""A float input is drawn as float64 (2x), then cast (1x); the first node's output is as large (1x)."""
MEMORY_PER_THREAD = 8 << 20
"""Beyond its stack, one ORT intra-op thread (one per CPU): its malloc arena, 0.5 MiB measured."""
UNLIMITED_STACK = 32 << 20
"""A thread's stack where RLIMIT_STACK is unlimited (glibc then picks its own default, at most this)."""
MIN_MEMORY_LIMIT = 64 << 20
"""Python with numpy alone needs ~65 MiB: a smaller limit is a mistake (MiB meant, bytes written)."""
MAX_MEMORY_LIMIT = 1 << 60
"""rlim_t is 64 bits; no machine has more memory than this."""


def default_memory_limit(model: ModelFacts, cpus: int | None = None) -> int:
    """Bytes a probe of this model may use: a base, a share per CPU, multiples of model and inputs."""
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack = UNLIMITED_STACK if stack == resource.RLIM_INFINITY or stack < 0 else min(stack, UNLIMITED_STACK)
    threads = (cpus or os.cpu_count() or 1) * (stack + MEMORY_PER_THREAD)
    data = MEMORY_PER_WEIGHT_BYTE * model.weight_bytes + MEMORY_PER_INPUT_BYTE * model.input_bytes
    return min(MAX_MEMORY_LIMIT, MEMORY_BASE + threads + data)


def checked_memory_limit(limit: int, source: str) -> int:
    """limit when a probe can run in it; UsageError naming source (the option or variable) otherwise."""
    if limit < MIN_MEMORY_LIMIT:
        raise UsageError(
            f"{source}: {human_bytes(limit)} is less than the {human_bytes(MIN_MEMORY_LIMIT)} a probe needs "
            "to start (a size without a unit is bytes: write 4GiB or 512MB)"
        )
    if limit > MAX_MEMORY_LIMIT:
        raise UsageError(f"{source}: {limit} bytes is more memory than any machine has")
    return limit


def memory_limit_from_env() -> int | None:
    """TIEAUDIT_RUNTIME_MEMORY_LIMIT in bytes (None when unset); UsageError when it is no valid limit."""
    text = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not text:
        return None
    try:
        limit = parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{MEMORY_LIMIT_ENV}: {exc}") from None
    return checked_memory_limit(limit, MEMORY_LIMIT_ENV)
