"""Run tieaudit as if some optional modules were not installed: ``python hidden_extras.py MODULES ARGV...``.

MODULES is a comma-separated list (``torch,onnxruntime``); importing one of them or a submodule, or
looking it up with ``importlib.util.find_spec``, raises ModuleNotFoundError, exactly as when the
package is absent. ARGV is a tieaudit command line (``tieaudit.cli.main.main(ARGV)``, its exit code
is the process's), or ``-c CODE`` to run Python code instead. Any import of a hidden module that
was attempted is printed to stdout as ``hidden-import-attempt NAME`` at exit, so the caller sees
which code path asked for it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import sys
from collections.abc import Sequence

attempts: list[str] = []


class _Hidden(importlib.abc.MetaPathFinder):
    def __init__(self, hidden: Sequence[str]) -> None:
        self.hidden = frozenset(hidden)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> None:
        if fullname.split(".")[0] in self.hidden:
            attempts.append(fullname)
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def _report() -> None:
    for name in dict.fromkeys(attempts):
        print(f"hidden-import-attempt {name}")


def main(argv: list[str]) -> int:
    hidden = [name for name in argv[0].split(",") if name]
    loaded = [n for n in sys.modules if n.split(".")[0] in hidden]
    if loaded:
        raise SystemExit(f"already imported before hiding: {loaded}")
    sys.meta_path.insert(0, _Hidden(hidden))
    atexit.register(_report)
    if argv[1:2] == ["-c"]:
        exec(compile(argv[2], "<hidden_extras -c>", "exec"), {"__name__": "__main__"})
        return 0
    from tieaudit.cli.main import main as cli

    return cli(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
