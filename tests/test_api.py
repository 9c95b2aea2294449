"""The Python API: every name of ``tieaudit.__all__`` resolves, is what the type checker sees, and
``import tieaudit`` imports nothing heavy (each name is imported when first used)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import tieaudit

INIT = Path(tieaudit.__file__)


def test_every_exported_name_resolves_to_its_defining_module() -> None:
    for name in tieaudit.__all__:
        value = getattr(tieaudit, name)
        if name != "__version__":
            assert value is getattr(importlib.import_module(tieaudit._WHERE[name]), name), name
    assert tieaudit.__all__ == ["__version__", *tieaudit._WHERE]
    assert sorted(dir(tieaudit)) == sorted(tieaudit.__all__)


def test_the_type_checker_sees_the_same_names_from_the_same_modules() -> None:
    tree = ast.parse(INIT.read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == tieaudit._WHERE


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        tieaudit.audit_paths  # noqa: B018
    except AttributeError as exc:
        assert "audit_paths" in str(exc)
    else:
        raise AssertionError("tieaudit.audit_paths resolved")


def test_import_tieaudit_imports_no_numpy_torch_or_report() -> None:
    probe = (
        "import sys, tieaudit; heavy = [m for m in ('numpy', 'torch', 'tieaudit.audit', 'tieaudit.report') "
        "if m in sys.modules]; print(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
