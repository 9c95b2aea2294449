"""A copy group of more than two names is one finding, counted once, kept under the declared source.

T5 ties ``encoder.embed_tokens``, ``decoder.embed_tokens`` and ``lm_head`` to ``shared``. When all
four are stored as equal copies (a state dict cloned and saved as safetensors beside the config),
the checkpoint wastes three copies' bytes: one TIE001 naming all four, and a retie that keeps
``shared.weight``, the name every class of the family loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tieaudit.audit import audit_path
from tieaudit.formats import open_checkpoint
from tieaudit.graph.alias import build_graph
from tieaudit.repair.plan import make_plan

VOCAB, WIDTH = 1000, 64
T5_EMBEDDINGS = (
    "shared.weight",
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "lm_head.weight",
)


def _t5_folder(folder: Path, names: tuple[str, ...]) -> int:
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    tensors = {name: matrix.copy() for name in names}
    tensors["encoder.final_layer_norm.weight"] = rng.standard_normal(WIDTH).astype(np.float32)
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": VOCAB}
    (folder / "config.json").write_text(json.dumps(config))
    return matrix.nbytes


@pytest.mark.parametrize(
    "names", [T5_EMBEDDINGS, T5_EMBEDDINGS[::-1], T5_EMBEDDINGS[1:]], ids=["4", "4-reversed", "3"]
)
def test_one_finding_per_copy_group_counted_once(tmp_path: Path, names: tuple[str, ...]) -> None:
    nbytes = _t5_folder(tmp_path / "t5", names)
    audit = audit_path(str(tmp_path / "t5"))
    copies = [f for f in audit.findings if f.rule == "TIE001"]
    assert len(copies) == 1, [(f.rule, f.names) for f in audit.findings]
    assert set(copies[0].names) == set(names)
    assert copies[0].wasted_bytes == (len(names) - 1) * nbytes
    assert audit.summary().wasted_bytes == (len(names) - 1) * nbytes
    if "shared.weight" in names:
        assert copies[0].names[0] == "shared.weight"  # the declared source is kept


def test_retie_keeps_the_declared_source(tmp_path: Path) -> None:
    _t5_folder(tmp_path / "t5", T5_EMBEDDINGS[::-1])
    with open_checkpoint(str(tmp_path / "t5")) as opened:
        plan = make_plan(build_graph(opened.checkpoint), opened)
    assert {d.kept for d in plan.decisions} == {"shared.weight"}
    assert {d.dropped for d in plan.applied} == set(T5_EMBEDDINGS[1:])


def test_mixed_relations_are_one_finding_with_each_relation(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    matrix = rng.standard_normal((256, 64)).astype(np.float32)
    save_file(
        {"emb.weight": matrix, "head.weight": matrix.copy(), "head_t.weight": np.ascontiguousarray(matrix.T)},
        str(tmp_path / "m.safetensors"),
    )
    copies = [f for f in audit_path(str(tmp_path / "m.safetensors")).findings if f.rule == "TIE001"]
    assert len(copies) == 1
    assert copies[0].relation == "mixed"
    assert copies[0].details["relations"] == {"head.weight": "equal", "head_t.weight": "transposed"}
    assert copies[0].wasted_bytes == 2 * matrix.nbytes
    assert "--relations equal,transposed" in str(copies[0].fix)


def test_small_declared_chain_is_one_group(tmp_path: Path) -> None:
    """Three small equal tensors tied through two declared pairs (``b`` to ``a``, ``c`` to ``b``),
    below the copy search's size threshold (Udop's relative-position biases): one TIE001 naming
    all three, and a retie that keeps the chain's root source and drops both others."""
    path = tmp_path / "chain.safetensors"
    values = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)  # 128 bytes
    save_file({n: values.copy() for n in "abc"}, str(path), metadata={"b": "a", "c": "b"})
    findings = [f for f in audit_path(str(path)).findings if f.rule == "TIE001"]
    assert [sorted(f.names) for f in findings] == [["a", "b", "c"]]
    assert findings[0].wasted_bytes == 2 * values.nbytes
    with open_checkpoint(str(path)) as opened:
        plan = make_plan(build_graph(opened.checkpoint), opened)
    assert sorted((d.kept, d.dropped) for d in plan.applied) == [("a", "b"), ("a", "c")]
