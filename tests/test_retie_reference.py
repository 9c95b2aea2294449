"""retie verifies its output with the format's reference loader, not only with tieaudit's readers.

A reader that disagrees with the library people load the file with is simulated: tieaudit's own
verification is shown a pristine copy of the staged output, while the staged output itself has a
byte changed inside a stored tensor (or bytes the library refuses appended). safetensors, onnx and
torch read the real file, so retie must refuse, with IN untouched and OUT never created.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tieaudit.repair.retie as retie_module
import tieaudit.repair.verify as verify_module
from tieaudit.cli.main import main
from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.formats import open_checkpoint

CASES = {
    # name: (fixture, file inside the fixture folder or None, how the staged output is changed)
    "safetensors": ("st_cloned_head", None, "flip"),
    "safetensors-uncovered-bytes": ("st_cloned_head", None, "append"),
    "hf-folder": ("hf_llama_cloned_head", None, "flip"),
    "onnx-embedded": ("onnx_gpt2_cloned_dynamo", None, "flip"),
    "onnx-external-data": ("onnx_helper_duplicate", "model.onnx", "flip"),  # saved with external data
    "torch": ("torch_cloned_head", None, "flip"),
}


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _change_stored_bytes(out: str, how: str) -> None:
    """Change the staged output where only a reader of its bytes can notice."""
    if how == "append":
        with open(out, "ab") as handle:
            handle.write(b"\0" * 8)
        return
    root = out if os.path.isdir(out) else os.path.dirname(out)
    with open_checkpoint(out) as opened:
        tensor = max(opened.checkpoint.tensors, key=lambda t: t.nbytes)
        storage = opened.storage(tensor)
        head = opened.array(tensor).tobytes()[:64]
    path = os.path.join(root, storage.file)
    data = bytearray(Path(path).read_bytes())
    position = storage.file_offset + tensor.byte_offset if storage.file_offset >= 0 else data.find(head)
    assert position >= 0 and data[position : position + len(head)] == head
    data[position] ^= 0xFF
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_only_the_reference_loader_reads_differently_is_refused(
    case: str,
    corpus: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fixture, inner, how = CASES[case]
    work, pristine = tmp_path / "work", tmp_path / "pristine"
    work.mkdir()
    origin = corpus.path(fixture)
    source = work / origin.name
    if inner and not origin.is_dir():  # the file's initializers moved to external data
        import onnx

        source.mkdir()
        onnx.save(onnx.load(str(origin)), str(source / inner), save_as_external_data=True, size_threshold=0)
    else:
        (shutil.copytree if origin.is_dir() else shutil.copyfile)(origin, source)
    source = source / inner if inner else source
    out = work / ("out" if origin.is_dir() and not inner else f"out{source.suffix}")
    before = _digest(source.parent if inner else source)

    real_writer, real_open = retie_module._writer, verify_module.open_checkpoint
    redirect: dict[str, str] = {}

    class Disagreeing:
        """Writes the real output, keeps a pristine copy for tieaudit's reader, changes the real one."""

        def __init__(self, inner_writer: Any) -> None:
            self.inner_writer = inner_writer

        def write(self, opened: Any, plan: Any, staged: str) -> list[str]:
            files: list[str] = self.inner_writer.write(opened, plan, staged)
            shutil.copytree(os.path.dirname(staged), pristine)
            redirect[staged] = str(pristine / os.path.basename(staged))
            _change_stored_bytes(staged, how)
            return files

    monkeypatch.setattr(retie_module, "_writer", lambda format: Disagreeing(real_writer(format)))

    def redirected_open(path: str) -> OpenCheckpoint:
        return real_open(redirect.get(path, path))

    monkeypatch.setattr(verify_module, "open_checkpoint", redirected_open)
    assert main(["retie", str(source), str(out), "--all-equal"]) == 2  # st_cloned_head: no record
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: "), lines
    assert "reference loader" in lines[0] or "cannot read" in lines[0], lines[0]
    assert redirect, "the writer was not called"
    assert not out.exists()
    assert not [e for e in os.listdir(source.parent) if ".tieaudit-stage-" in e]
    assert _digest(source.parent if inner else source) == before


@pytest.mark.parametrize("fixture", ["st_cloned_head", "hf_llama_cloned_head", "onnx_gpt2_cloned_dynamo"])
def test_reference_verification_imports_no_torch_for_safetensors_and_onnx(
    fixture: str, corpus: Any, tmp_path: Path
) -> None:
    """The reference check of a safetensors or ONNX output costs no torch import (~seconds)."""
    script = textwrap.dedent(
        """
        import sys
        import tieaudit.repair.verify as verify
        from tieaudit.cli.main import main

        made = []
        real = verify.reference_check

        def counted(*args, **kwargs):
            made.append(1)
            return real(*args, **kwargs)

        verify.reference_check = counted
        code = main(["retie", sys.argv[1], sys.argv[2], "--all-equal"])
        print(code, bool(made), "torch" in sys.modules)
        """
    )
    out = tmp_path / ("out" if corpus.path(fixture).is_dir() else f"out{corpus.path(fixture).suffix}")
    done = subprocess.run(
        [sys.executable, "-c", script, str(corpus.path(fixture)), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.split() == ["0", "True", "False"], done.stderr
