"""A missing extra is one line naming the ``pip install`` that fixes it, exit 2, for every command that
needs one and for ``load_tied``; never a traceback, never once per configuration or per file.

Each case runs in a fresh interpreter where the extra's modules are hidden (tests/hidden_extras.py:
importing or looking them up raises ModuleNotFoundError, as when they are not installed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tieaudit.core.errors import MissingExtra, TieauditError
from tieaudit.core.extras import EXTRA_OF, require

HIDE = Path(__file__).resolve().parent / "hidden_extras.py"
ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120.0


def hidden(modules: str, *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run tieaudit ARGV (or ``-c CODE``) with modules hidden."""
    return subprocess.run(
        [sys.executable, str(HIDE), modules, *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=cwd,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a run that exited 2 (no traceback, nothing else)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in done.stderr and "this is a bug" not in done.stderr
    return lines[0]


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    """A folder export accepts as a Hugging Face folder (config.json); never loaded in these tests."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    return folder


def test_runtime_without_onnxruntime_fails_once_before_any_probe(corpus: Any) -> None:
    done = hidden("onnxruntime", "runtime", str(corpus.path("onnx_helper_shared")))
    assert one_error_line(done) == (
        "tieaudit: error: runtime needs onnxruntime, which is not installed: pip install 'tieaudit[runtime]'"
    )
    assert done.stdout == "hidden-import-attempt onnxruntime\n"  # looked up once, no report, no probe


def test_check_runtime_without_onnxruntime_fails_once(corpus: Any) -> None:
    onnx_files = [str(corpus.path(name)) for name in ("onnx_helper_shared", "onnx_helper_duplicate")]
    done = hidden("onnxruntime", "check", "--runtime", *onnx_files)
    assert one_error_line(done) == (
        "tieaudit: error: check --runtime needs onnxruntime, which is not installed: "
        "pip install 'tieaudit[runtime]'"
    )


def test_check_on_dask_without_the_dask_extra_fails_once_before_connecting(corpus: Any) -> None:
    done = hidden("dask,distributed", "check", "--executor", "dask://127.0.0.1:1", str(corpus.root))
    assert one_error_line(done) == (
        "tieaudit: error: check --executor dask:// needs dask and distributed, which are not installed: "
        "pip install 'tieaudit[dask]'"
    )
    assert done.stdout == "hidden-import-attempt dask\nhidden-import-attempt distributed\n"


def test_check_without_runtime_needs_no_onnxruntime(corpus: Any) -> None:
    done = hidden("onnxruntime,torch,transformers", "check", str(corpus.path("onnx_helper_shared")))
    assert done.returncode in (0, 1), done.stderr
    assert "hidden-import-attempt" not in done.stdout


@pytest.mark.parametrize(
    ("modules", "needs"),
    [
        ("torch", "torch, which is"),
        ("onnxscript", "onnxscript, which is"),
        ("onnxruntime", "onnxruntime, which is"),
        ("torch,onnxscript,onnxruntime", "torch, onnxscript and onnxruntime, which are"),
    ],
)
def test_export_of_a_factory_names_the_export_extra(tmp_path: Path, modules: str, needs: str) -> None:
    done = hidden(modules, "export", "somemodule:build", str(tmp_path / "out.onnx"), cwd=tmp_path)
    assert one_error_line(done) == (
        f"tieaudit: error: export needs {needs} not installed: pip install 'tieaudit[export]'"
    )
    assert list(tmp_path.iterdir()) == []


def test_export_of_a_folder_needs_transformers(tmp_path: Path, hf_folder: Path) -> None:
    done = hidden("transformers", "export", str(hf_folder), str(tmp_path / "out.onnx"))
    assert one_error_line(done) == (
        "tieaudit: error: export of a Hugging Face folder needs transformers, which is not installed: "
        "pip install 'tieaudit[export]'"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_retie_to_a_pt_file_without_torch(corpus: Any, tmp_path: Path) -> None:
    source = corpus.path("torch_cloned_head")
    done = hidden("torch", "retie", str(source), str(tmp_path / "out.pt"))
    assert one_error_line(done) == (
        f"tieaudit: error: {source}: writing PyTorch files needs torch, which is not installed: "
        "pip install 'tieaudit[torch]'"
    )
    assert list(tmp_path.iterdir()) == []


def test_load_tied_without_torch_raises_missing_extra_an_import_error(corpus: Any) -> None:
    code = (
        "from tieaudit.core.errors import MissingExtra, TieauditError\n"
        "from tieaudit.load import load_tied\n"
        "try:\n"
        f"    load_tied({str(corpus.path('torch_cloned_head'))!r})\n"
        "except ImportError as exc:\n"
        "    assert isinstance(exc, MissingExtra) and isinstance(exc, TieauditError)\n"
        "    print('raised', exc)\n"
    )
    done = hidden("torch", "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "raised load_tied needs torch, which is not installed: pip install 'tieaudit[torch]'"
    )


def test_require_passes_for_installed_modules_and_maps_each_to_its_extra() -> None:
    require("test", ("numpy", "torch", "onnxruntime"))
    with pytest.raises(MissingExtra) as raised:
        require("tool", ("numpy", "transformers_not_a_module_xyz", "onnxscript_not_either"))
    assert str(raised.value) == (
        "tool needs transformers_not_a_module_xyz and onnxscript_not_either, which are not installed: "
        "pip install 'tieaudit[transformers_not_a_module_xyz,onnxscript_not_either]'"
    )
    assert EXTRA_OF == {"torch": "torch", "transformers": "transformers", "onnxruntime": "runtime",
                        "onnxscript": "export", "dask": "dask", "distributed": "dask"}


def test_a_broken_install_is_named_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed but failing to import (a missing shared library): the error is quoted, the fix is a
    reinstall; still one line and a TieauditError, never a traceback."""
    broken = "raise OSError('libfoo.so: cannot open shared object file')\n"
    (tmp_path / "broken_extra_mod.py").write_text(broken)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TieauditError) as raised:
        require("feature", ("broken_extra_mod",), extra="torch")
    assert str(raised.value) == (
        "feature: broken_extra_mod is installed but cannot be imported (OSError: libfoo.so: cannot open "
        "shared object file): pip install --force-reinstall 'tieaudit[torch]'"
    )
    assert isinstance(raised.value, ImportError)
    assert "broken_extra_mod" not in sys.modules
