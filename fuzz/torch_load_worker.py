"""A torch.load(weights_only=True) worker for the pickle-verdict differential (fuzz/pickle_verdict.py).

Imports torch once, then reads one request per line on stdin (``{"path": ..., "timeout": ...}``)
and writes one JSON line per request on stdout: ``{"status": "loads" | "loads-device-mapped" |
"refuses", "error": "...", "dirty": bool}``. Nothing but ``torch.load(path, weights_only=True)``
runs on a file; weights_only=False is never used.

Loading one file can change what torch accepts for the next: a load that imports a module (torch's
own ``torch.nested._internal`` adds names to the safe globals when imported) leaves torch in
another state. So a load after which the imported modules or the safe globals differ is answered
with ``dirty`` and the worker exits; the parent starts a fresh one. (A fork per load would keep
every load pristine too, but costs tens of milliseconds of page-table copying per file.)

A file whose storages name a device this machine lacks (``cuda:0`` on a CPU-only machine) fails
here only for the machine's sake: it is loaded again with a ``map_location`` that maps exactly the
storages torch refuses for a missing device to the CPU, and anything else torch refuses still
refuses (``loads-device-mapped`` when that load succeeds). The address space is capped; the parent
kills a worker that takes too long (a hang) and counts one that dies as torch crashing on the file.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import sys
import warnings
from pathlib import Path
from typing import Any

EXTRA_ADDRESS_SPACE = 3 << 30
"""Address space a load may add to the worker's (torch's libraries are mapped already)."""
MISSING_DEVICE = re.compile(
    r"is_available\(\) is False|device module is not registered|Storage device not recognized: mps"
    r"|without MTIA backend|device_count\(\) is"
)
"""What torch says when a storage's device is fine but this machine does not have it."""


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 4 << 30


def _error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    _, found, rest = text.partition("WeightsUnpickler error: ")
    return f"{type(exc).__name__}: {(rest if found else text)[:300]}"


def _load(torch: Any, path: str) -> dict[str, str]:
    from torch.serialization import default_restore_location

    def on_any_device(storage: Any, location: str) -> Any:
        try:
            return default_restore_location(storage, location)
        except RuntimeError as exc:
            if MISSING_DEVICE.search(str(exc)):
                return storage
            raise

    try:
        torch.load(path, weights_only=True)
        return {"status": "loads", "error": ""}
    except Exception as exc:
        first = _error(exc)
        if not MISSING_DEVICE.search(first):
            return {"status": "refuses", "error": first}
    try:
        torch.load(path, weights_only=True, map_location=on_any_device)
        return {"status": "loads-device-mapped", "error": first}
    except Exception as exc:
        return {"status": "refuses", "error": _error(exc)}


def _state(torch: Any) -> tuple[int, int]:
    """What a load may change that changes later loads: imported modules, safe globals."""
    from torch._weights_only_unpickler import _get_user_allowed_globals

    return len(sys.modules), len(_get_user_allowed_globals())


def main() -> int:
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever torch prints goes to stderr, never into the answers
    warm = io.BytesIO()  # a first save and load import what torch.load needs, before the baseline
    torch.save({"w": torch.zeros(2)}, warm)
    warm.seek(0)
    torch.load(warm, weights_only=True)
    limit = _address_space() + EXTRA_ADDRESS_SPACE
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    pristine = _state(torch)
    from torch._weights_only_unpickler import _get_user_allowed_globals

    ready = {"ready": torch.__version__, "safe_globals": sorted(_get_user_allowed_globals())}
    answers.write(json.dumps(ready) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        answer = _load(torch, request["path"])
        dirty = _state(torch) != pristine
        answers.write(json.dumps({**answer, "dirty": dirty}) + "\n")
        answers.flush()
        if dirty:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
