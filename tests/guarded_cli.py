"""Run tieaudit commands in one process where torch and transformers cannot be imported and no
socket can be opened: ``python guarded_cli.py SPEC.json``.

SPEC holds ``{"runs": [[argv...], ...], "result": PATH}``. Each run is ``tieaudit.cli.main.main(argv)``
with stdout and stderr captured; RESULT gets, per run, the exit code and both streams, and for the
whole process every import of torch or transformers that was attempted (each one raised), every
socket that was asked for (each one refused), and whatever torch or transformers module ended up
loaded anyway. The caller asserts on it; this script only records.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import json
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BLOCKED = ("torch", "transformers")
attempts: list[str] = []
sockets: list[str] = []


class _Blocked(importlib.abc.MetaPathFinder):
    """Refuses torch and transformers (and their submodules), recording each attempt."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> None:
        if fullname.split(".")[0] in BLOCKED:
            attempts.append(fullname)
            raise ImportError(f"{fullname} is blocked: auditing must not import it")


class _NoSocket(socket.socket):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        sockets.append(repr(args))
        raise OSError("sockets are blocked: auditing must not open one")


def _no_connection(*args: Any, **kwargs: Any) -> None:
    sockets.append(repr(args))
    raise OSError("sockets are blocked: auditing must not open one")


def guard() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            raise SystemExit(f"{name} was imported before the guard")
    sys.meta_path.insert(0, _Blocked())
    socket.socket = _NoSocket  # type: ignore[misc]
    socket.create_connection = _no_connection  # type: ignore[assignment]


def main(spec_path: str) -> int:
    guard()
    from tieaudit.cli.main import main as cli

    spec = json.loads(Path(spec_path).read_text())
    results = []
    for argv in spec["runs"]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli(argv)
        results.append({"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
    Path(spec["result"]).write_text(
        json.dumps({"runs": results, "import_attempts": attempts, "sockets": sockets, "loaded": loaded})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
