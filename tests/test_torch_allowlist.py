"""The committed allowlist is torch's, and tieaudit's stand-ins cover exactly it (issue 23, point 1)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tieaudit.formats.pickle_globals import blocked, classify
from tieaudit.formats.torch_allowlist import torch_allowlist
from tieaudit.formats.torch_globals import ALLOWLIST, NOT_READ
from tieaudit.formats.torch_pickle import _legacy_tensor_class

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "tieaudit" / "formats" / "torch_allowlist.json"


def _generator() -> object:
    spec = importlib.util.spec_from_file_location(
        "gen_torch_allowlist", ROOT / "scripts" / "gen_torch_allowlist.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_allowlist_is_what_the_installed_torch_allows(tmp_path: Path) -> None:
    """Generated in a fresh interpreter: `import torch` alone decides its safe globals (a test
    session may have added more with add_safe_globals)."""
    fresh = tmp_path / "torch_allowlist.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_torch_allowlist.py"), "--output", str(fresh)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert json.loads(COMMITTED.read_text()) == json.loads(fresh.read_text())
    assert COMMITTED.read_text() == fresh.read_text()
    generator = _generator()
    assert generator.render(json.loads(fresh.read_text())) == fresh.read_text()  # type: ignore[attr-defined]


def test_stand_ins_cover_exactly_the_allowlist() -> None:
    allowed = torch_allowlist().allowed
    assert set(ALLOWLIST) <= allowed, sorted(set(ALLOWLIST) - allowed)
    assert set(NOT_READ) <= allowed, sorted(set(NOT_READ) - allowed)
    uncovered = {n for n in allowed - set(ALLOWLIST) - set(NOT_READ) if not _legacy_tensor_class(n)}
    assert uncovered == set()


def test_verdict_is_exact_name_lookup_never_a_prefix() -> None:
    for name in sorted(torch_allowlist().allowed):
        module, _, attr = name.rpartition(".")
        assert classify(module, attr) == "allowed"
        assert classify(module, attr + ".__globals__") == "runs-code"
        assert classify(module, attr + "x") == "runs-code"
        assert classify(module + ".x", attr) == "runs-code"
    for module, attr in [
        ("pathlib", "Path.write_text"), ("numpy", "ndarray.tofile"), ("argparse", "Namespace"),
        ("numpy", "ndarray"), ("collections", "OrderedDict.fromkeys"), ("torch", "serialization.os.system"),
        ("builtins", "set.__init__"), ("codecs", "open"), ("sys", "modules"), ("collections", "defaultdict"),
    ]:  # fmt: skip
        assert classify(module, attr) == "runs-code", (module, attr)
    assert blocked("os.system") and blocked("posix.system") and not blocked("ossaudiodev.open")


def test_renaming_matches_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import json, torch._utils as u; print(json.dumps("
         "{'i': u.IMPORT_MAPPING, 'n': [[list(k), list(v)] for k, v in u.NAME_MAPPING.items()]}))"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    torch_side = json.loads(done.stdout)
    allowlist = torch_allowlist()
    for (module, name), mapped in ((tuple(k), tuple(v)) for k, v in torch_side["n"]):
        assert allowlist.spelled(module, name) == mapped
    for module, mapped in torch_side["i"].items():
        assert allowlist.spelled(module, "anything_unmapped") == (mapped, "anything_unmapped")
