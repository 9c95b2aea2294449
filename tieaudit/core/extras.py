"""Optional dependencies: which extra installs each, and one check before a command uses them.

``require`` is called once, before any work, by each entry point that needs an extra (export,
runtime, check --runtime, check --executor dask://, load_tied, writing PyTorch files); a missing
module becomes one line naming the ``pip install`` that fixes it (``MissingExtra``, exit 2 from
the CLI), never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence

from tieaudit.core.errors import MissingExtra, one_line

EXTRA_OF = {
    "torch": "torch",
    "transformers": "transformers",
    "onnxruntime": "runtime",
    "onnxscript": "export",
    "dask": "dask",
    "distributed": "dask",
}
"""Module -> the extra of pyproject.toml that installs it."""


_USABLE = ""
"""_problem's answer for a module that imports."""


def _problem(module: str, *, load: bool) -> str | None:
    """_USABLE, None when module is absent, else why importing it fails (a broken install)."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
        if load:
            importlib.import_module(module)
    except ModuleNotFoundError:
        return None
    except ImportError as exc:  # found but refusing (a blocked import, a missing shared library)
        return None if not load else f"{type(exc).__name__}: {one_line(exc, 200)}"
    except Exception as exc:  # a broken install raises what its native loader raises (OSError, ...)
        return f"{type(exc).__name__}: {one_line(exc, 200)}"
    return _USABLE


def _listing(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def require(for_what: str, modules: Sequence[str], *, extra: str | None = None, load: bool = True) -> None:
    """Raise MissingExtra when one of modules cannot be imported.

    for_what names the feature ("export", "load_tied"); extra is the extra to install (default: the
    extras of the missing modules, from EXTRA_OF). load=False only looks the modules up (for a
    module used in a child process only, such as onnxruntime by the runtime probe).
    """
    problems = {m: p for m in modules if (p := _problem(m, load=load)) != _USABLE}
    if not problems:
        return
    extras = ",".join([extra] if extra else dict.fromkeys(EXTRA_OF.get(m, m) for m in problems))
    absent = [m for m, p in problems.items() if p is None]
    broken = [f"{m} is installed but cannot be imported ({p})" for m, p in problems.items() if p is not None]
    if absent:
        verb = "is" if len(absent) == 1 else "are"
        why = "; ".join([f"{for_what} needs {_listing(absent)}, which {verb} not installed", *broken])
        raise MissingExtra(f"{why}: pip install 'tieaudit[{extras}]'")
    why = f"{for_what}: {'; '.join(broken)}"
    raise MissingExtra(f"{why}: pip install --force-reinstall 'tieaudit[{extras}]'")
