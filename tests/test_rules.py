"""Rules checked on small inputs built here: TIE004's tokenizer check, TIE002's numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from conftest import Corpus
from safetensors.numpy import save_file

from tieaudit.audit import audit_path
from tieaudit.rules.policy import Policy


def tokenizer_json(size: int) -> str:
    vocab = {f"t{i}": i for i in range(size - 2)}
    added = [{"id": size - 2, "content": "<s>"}, {"id": size - 1, "content": "</s>"}]
    return json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": added})


def rules_of(path: Path) -> list[str]:
    return [f.rule for f in audit_path(str(path), Policy()).findings]


def test_tokenizer_larger_than_the_embedding(corpus: Corpus, tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(corpus.path("hf_llama_tied"), folder)
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "tokenizer.json").write_text(tokenizer_json(rows + 5))
    assert rules_of(folder) == ["TIE004"]
    (folder / "tokenizer.json").write_text(tokenizer_json(rows - 7))  # padding rows are normal
    assert rules_of(folder) == []


def test_output_bias_length_must_match(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal((300, 16)).astype(np.float32)
    path = tmp_path / "m.safetensors"
    save_file({"model.embed_tokens.weight": embedding, "lm_head.bias": np.zeros(299, np.float32)}, str(path))
    (finding,) = audit_path(str(path), Policy()).findings
    assert finding.rule == "TIE004" and "299" in finding.message and "300" in finding.message


def test_declared_tie_with_different_shapes_is_broken(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "m.safetensors"
    save_file(
        {
            "emb.weight": rng.standard_normal((300, 16)).astype(np.float32),
            "head.weight": rng.standard_normal((200, 16)).astype(np.float32),
        },
        str(path),
        metadata={"head.weight": "emb.weight"},  # a stale {dropped: kept} record: both still stored
    )
    findings = audit_path(str(path), Policy()).findings
    assert [f.rule for f in findings] == ["TIE002", "TIE004"]  # rows 200 vs 300 disagree too
    assert "differ in shape" in findings[0].message
