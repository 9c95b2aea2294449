"""Equal by construction is not a tie: a copy group the known model class does not tie is a note.

Mamba initialises ``A_log`` the same in every layer; the class ties nothing there, from_pretrained
would initialise a dropped layer's ``A_log`` randomly, so retie leaves it by default. ``check``
reports the wasted bytes as a TIE001 note (below the default --fail-on) with the opt-in fix. A copy
that no loader rule restores by default (a bare safetensors file without a record, a folder whose
class is unknown) keeps its warning, and its fix names --all-equal. A class-tied copy keeps the
plain retie fix. These are built from the bytes and configs transformers writes, without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from tieaudit.cli.main import main

ROWS, WIDTH = 64, 64


def _folder(folder: Path, architecture: str, model_type: str, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"architectures": [architecture], "model_type": model_type, "vocab_size": ROWS}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _check(path: Path, tmp_path: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    out = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    code = main(["check", str(path), "--format", "json", "--output", str(out), *args])
    return code, json.loads(out.read_text())["findings"]


def _matrix(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, WIDTH)).astype(np.float32)


def test_equal_layers_of_a_class_that_does_not_tie_them_are_a_note(tmp_path: Path) -> None:
    a_log = _matrix(0)
    tensors = {f"backbone.layers.{i}.mixer.A_log": a_log.copy() for i in range(3)}
    tensors["backbone.embeddings.weight"] = _matrix(1)
    folder = _folder(tmp_path / "mamba", "MambaForCausalLM", "mamba", tensors)
    code, findings = _check(folder, tmp_path)
    assert code == 0
    (finding,) = findings
    assert (finding["rule"], finding["severity"]) == ("TIE001", "note")
    assert set(finding["names"]) == {f"backbone.layers.{i}.mixer.A_log" for i in range(3)}
    assert "equal by construction" in finding["message"] and finding["fix"].endswith("--all-equal")
    assert finding["wasted_bytes"] == 2 * a_log.nbytes
    # A policy can still make it an error, and --fail-on note fails on it.
    assert _check(folder, tmp_path, "--fail-on", "note")[0] == 1


def test_a_copy_the_class_ties_stays_a_warning_with_the_plain_fix(tmp_path: Path) -> None:
    embedding = _matrix(2)
    tensors = {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.copy()}
    folder = _folder(tmp_path / "llama", "LlamaForCausalLM", "llama", tensors)
    code, findings = _check(folder, tmp_path)
    (finding,) = findings
    assert code == 1 and finding["severity"] == "warning"
    assert "--all-equal" not in finding["fix"]


def test_a_copy_no_loader_restores_names_all_equal_in_its_fix(tmp_path: Path) -> None:
    embedding = _matrix(3)
    path = tmp_path / "bare.safetensors"
    save_file({"emb.weight": embedding, "head.weight": embedding.copy()}, str(path))
    code, findings = _check(path, tmp_path)
    (finding,) = findings
    assert code == 1 and finding["severity"] == "warning"
    assert finding["fix"].endswith("--all-equal")
    unknown = _folder(tmp_path / "unknown", "NoSuchModelForCausalLM", "nosuch", {
        "a.weight": embedding, "b.weight": embedding.copy()})  # fmt: skip
    code, findings = _check(unknown, tmp_path)
    (finding,) = [f for f in findings if f["rule"] == "TIE001"]
    assert code == 1 and finding["severity"] == "warning" and finding["fix"].endswith("--all-equal")
