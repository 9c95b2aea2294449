"""ONNX ties kept by sharing: one initializer read as embedding (Gather) and as head (MatMul/Gemm,
directly or through Transpose/Identity), and Identity aliases, shown by inspect and left alone by check.

Models come from onnx.helper (graphs shaped like the exporters' output) and from torch.onnx.export
of a tiny tied GPT-2, whose initializers are counted with onnx itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import Corpus
from onnx import TensorProto, helper, numpy_helper

from tieaudit.cli.main import main

E = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
"""The tied matrix of the helper graphs: vocabulary 50, hidden size 8 (1600 bytes)."""


def _save(path: Path, nodes: list[onnx.NodeProto], initializers: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 50])],
        initializer=[numpy_helper.from_array(array, name) for name, array in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save_model(model, path)
    return path


def _tied_with_alias(tmp_path: Path) -> Path:
    """Gather reads E through an Identity alias; Transpose(E) feeds the head MatMul."""
    nodes = [
        helper.make_node("Identity", ["E"], ["E_alias"], name="alias"),
        helper.make_node("Gather", ["E_alias", "ids"], ["hidden"], name="embed"),
        helper.make_node("Transpose", ["E"], ["E_t"], perm=[1, 0], name="transpose"),
        helper.make_node("MatMul", ["hidden", "E_t"], ["logits"], name="lm_head"),
    ]
    return _save(tmp_path / "tied.onnx", nodes, {"E": E})


def _run(args: list[str], out: Path) -> tuple[int, str]:
    code = main([*args, "--output", str(out)])
    return code, out.read_text()


def _inspect_json(path: Path, tmp_path: Path) -> dict[str, Any]:
    code, text = _run(["inspect", str(path), "--format", "json"], tmp_path / "report.json")
    assert code == 0
    report: dict[str, Any] = json.loads(text)
    return report


def _check_json(path: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    code, text = _run(["check", str(path), "--format", "json"], tmp_path / "check.json")
    report: dict[str, Any] = json.loads(text)
    return code, report


def _use(node: str, op_type: str, slot: int, role: str, **extra: Any) -> dict[str, Any]:
    return {"node": node, "op_type": op_type, "slot": slot, "graph": "main", "role": role, **extra}


# --- onnx.helper graphs ---------------------------------------------------------------------------


def test_json_names_the_initializer_its_consumers_roles_and_alias(tmp_path: Path) -> None:
    report = _inspect_json(_tied_with_alias(tmp_path), tmp_path)
    head = _use("lm_head", "MatMul", 1, "head")
    assert report["consumer_ties"] == [
        {
            "initializer": "E",
            "consumers": [
                _use("alias", "Identity", 0, "alias"),
                _use("embed", "Gather", 0, "embedding"),
                _use("transpose", "Transpose", 0, "head", reaches=[head]),
            ],
            "nbytes": 50 * 8 * 4,
            "aliases": ["E_alias"],
        }
    ]
    assert report["alias_groups"] == [
        {
            "storage": "E",
            "names": ["E", "E_alias"],
            "relation": "identical",
            "nbytes": 1600,
            "pairs": [["E", "E_alias", "identical"]],
            "aliases": ["E_alias"],
        }
    ]
    assert report["aliases"] == {"E_alias": "E"}
    assert [t["name"] for t in report["tensors"]] == ["E"]  # an alias is a name, not a tensor
    assert report["findings"] == [] and report["summary"]["wasted_bytes"] == 0


def test_text_lists_the_tie_with_consumers_roles_and_size(tmp_path: Path) -> None:
    code, text = _run(["inspect", str(_tied_with_alias(tmp_path))], tmp_path / "report.txt")
    assert code == 0
    section = text.split("Ties kept by shared consumers", 1)[1].split("No findings.", 1)[0]
    rows = [
        [c.strip() for c in line.strip()[1:-1].split("│")] for line in section.splitlines() if "│" in line
    ]
    assert rows == [
        ["E", "Identity alias (input 0)", "alias", "1.6 KiB"],
        ["(alias E_alias)", "Gather embed (input 0)", "embedding", ""],
        ["", "Transpose transpose (input 0)", "head", ""],
        ["", "-> MatMul lm_head (input 1)", "", ""],
    ]
    groups = text.split("Tie groups (names sharing one storage)", 1)[1].split("Ties kept", 1)[0]
    assert re.search(r"│ E +│ E +│ identical │ 1\.6 KiB │", groups)
    assert re.search(r"│ +│ E_alias \(Identity alias\) +│", groups)


def test_dot_draws_the_initializer_with_edges_to_its_consumers_by_role(tmp_path: Path) -> None:
    code, dot = _run(["inspect", str(_tied_with_alias(tmp_path)), "--format", "dot"], tmp_path / "t.dot")
    assert code == 0
    edges = set(re.findall(r'^  ("[^"]+") -> ("[^"]+") \[([^]]*)\];$', dot, flags=re.MULTILINE))
    assert edges == {
        ('"t:E"', '"s:E"', 'label="identical"'),
        ('"t:E_alias"', '"s:E"', 'label="Identity alias"'),
        ('"t:E"', '"n:main/alias"', 'color=gray40, label="alias (input 0)"'),
        ('"t:E"', '"n:main/embed"', 'color=blue, label="embedding (input 0)"'),
        ('"t:E"', '"n:main/transpose"', 'color=darkgreen, label="head (input 0)"'),
        ('"n:main/transpose"', '"n:main/lm_head"', 'color=darkgreen, label="head (input 1)"'),
    }
    assert '"n:main/lm_head" [shape=box, style=rounded, label="MatMul lm_head"];' in dot
    assert re.search(r'"t:E" \[shape=box, style=filled, fillcolor=palegreen, label="E\\n1\.6 KiB', dot)


def test_a_kept_tie_is_not_a_finding_for_check(tmp_path: Path) -> None:
    code, report = _check_json(_tied_with_alias(tmp_path), tmp_path)
    assert code == 0
    assert report["findings"] == [] and report["summary"]["wasted_bytes"] == 0


def test_gemm_and_transpose_identity_chains_are_heads(tmp_path: Path) -> None:
    """A Gemm reading E as B (transB=1) is a head; so is MatMul(Identity(Transpose(E))). A Gemm's
    bias and a Transpose feeding no matrix product are not."""
    bias = np.zeros(50, dtype=np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["hidden"], name="embed"),
        helper.make_node("Reshape", ["hidden", "flat"], ["rows"], name="flatten"),
        helper.make_node("Gemm", ["rows", "E", "b"], ["gemm_out"], transB=1, name="gemm"),
        helper.make_node("Transpose", ["E"], ["E_t"], perm=[1, 0], name="transpose"),
        helper.make_node("Identity", ["E_t"], ["E_t2"], name="pass"),
        helper.make_node("MatMul", ["hidden", "E_t2"], ["mm_out"], name="matmul"),
        helper.make_node("Transpose", ["b2"], ["b2_t"], perm=[1, 0], name="transpose_b2"),
        helper.make_node("Add", ["mm_out", "gemm_out"], ["sum"], name="add"),
        helper.make_node("Reshape", ["sum", "shape"], ["logits"], name="unflatten"),
        helper.make_node("Add", ["b2_t", "b2_t"], ["unused"], name="other"),
    ]
    initializers: dict[str, np.ndarray] = {
        "E": E,
        "b": bias,
        "b2": E.copy()[:2],
        "flat": np.array([4, 8], dtype=np.int64),
        "shape": np.array([1, 4, 50], dtype=np.int64),
    }
    report = _inspect_json(_save(tmp_path / "m.onnx", nodes, initializers), tmp_path)
    (tie,) = report["consumer_ties"]
    assert tie["initializer"] == "E"
    assert tie["consumers"] == [
        _use("embed", "Gather", 0, "embedding"),
        _use("gemm", "Gemm", 1, "head"),
        _use("transpose", "Transpose", 0, "head", reaches=[_use("matmul", "MatMul", 1, "head")]),
    ]
    assert report["consumers"]["b"] == [_use("gemm", "Gemm", 2, "other")]
    assert report["consumers"]["b2"] == [_use("transpose_b2", "Transpose", 0, "other")]


def test_a_head_in_a_subgraph_reached_from_the_main_graph(tmp_path: Path) -> None:
    """Transpose(E) in the main graph, its output read by a MatMul inside an If branch."""
    out = helper.make_tensor_value_info("branch_logits", TensorProto.FLOAT, [1, 4, 50])
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["hidden", "E_t"], ["branch_logits"], name="head_mm")], "then", [], [out]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["zeros"], ["branch_logits"], name="no_head")], "else", [], [out]
    )
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["hidden"], name="embed"),
        helper.make_node("Transpose", ["E"], ["E_t"], perm=[1, 0], name="transpose"),
        helper.make_node(
            "If", ["cond"], ["logits"], then_branch=then_branch, else_branch=else_branch, name="if"
        ),
    ]
    initializers: dict[str, np.ndarray] = {
        "E": E,
        "cond": np.array(True),
        "zeros": np.zeros((1, 4, 50), dtype=np.float32),
    }
    report = _inspect_json(_save(tmp_path / "m.onnx", nodes, initializers), tmp_path)
    (tie,) = report["consumer_ties"]
    reached = {**_use("head_mm", "MatMul", 1, "head"), "graph": "if/then_branch"}
    assert tie["consumers"] == [
        _use("embed", "Gather", 0, "embedding"),
        _use("transpose", "Transpose", 0, "head", reaches=[reached]),
    ]


def test_a_subgraph_value_named_like_an_outer_chain_hides_it(tmp_path: Path) -> None:
    """The branch computes its own E_t (Neg of an input): its MatMul reads that, not Transpose(E)."""
    out = helper.make_tensor_value_info("branch_logits", TensorProto.FLOAT, [1, 4, 50])
    branch_nodes = [
        helper.make_node("Neg", ["other_t"], ["E_t"], name="own"),
        helper.make_node("MatMul", ["hidden", "E_t"], ["branch_logits"], name="branch_mm"),
    ]
    branch = helper.make_graph(branch_nodes, "then", [], [out])
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["hidden"], name="embed"),
        helper.make_node("Transpose", ["E"], ["E_t"], perm=[1, 0], name="transpose"),
        helper.make_node("Add", ["E_t", "E_t"], ["unused"], name="add"),
        helper.make_node("If", ["cond"], ["logits"], then_branch=branch, else_branch=branch, name="if"),
    ]
    graph = helper.make_graph(
        nodes,
        "lm",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4]),
            helper.make_tensor_value_info("other_t", TensorProto.FLOAT, [8, 50]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 50])],
        initializer=[numpy_helper.from_array(E, "E")],
    )
    path = tmp_path / "m.onnx"  # not check_model'ed: the checker refuses a name an outer graph defines
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    report = _inspect_json(path, tmp_path)
    assert report["consumer_ties"] == []
    assert report["consumers"]["E"] == [
        _use("embed", "Gather", 0, "embedding"),
        _use("transpose", "Transpose", 0, "other"),
    ]


def test_an_equal_copy_is_no_kept_tie_but_a_finding(tmp_path: Path) -> None:
    """Gather(E) and Transpose(E_copy) -> MatMul: each initializer has one role, the copy is TIE001."""
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["hidden"], name="embed"),
        helper.make_node("Transpose", ["E_copy"], ["E_t"], perm=[1, 0], name="transpose"),
        helper.make_node("MatMul", ["hidden", "E_t"], ["logits"], name="lm_head"),
    ]
    path = _save(tmp_path / "copy.onnx", nodes, {"E": E, "E_copy": E.copy()})
    report = _inspect_json(path, tmp_path)
    assert report["consumer_ties"] == [] and report["alias_groups"] == []
    assert [(f["rule"], f["names"], f["relation"]) for f in report["findings"]] == [
        ("TIE001", ["E", "E_copy"], "equal")
    ]
    code, _ = _check_json(path, tmp_path)
    assert code == 1


# --- torch.onnx.export of a tiny tied GPT-2 -------------------------------------------------------

VOCAB, HIDDEN = 100, 32


def _export_gpt2(path: Path, *, optimize: bool) -> Path:
    import torch
    import transformers

    from tieaudit.runtime.export_kinds import logits_only

    transformers.logging.set_verbosity_error()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=HIDDEN, n_head=2, vocab_size=VOCAB, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    assert model.lm_head.weight is model.transformer.wte.weight  # tied in torch
    ids = torch.zeros((1, 8), dtype=torch.int64)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(logits_only(model), (ids,), str(path), dynamo=True, optimize=optimize)
    return path


def _matrix_shapes(path: Path) -> Counter[tuple[int, ...]]:
    """How many initializers have the tied matrix's shape or its transpose, counted with onnx."""
    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = Counter(tuple(init.dims) for init in graph.initializer)
    return Counter({shape: shapes[shape] for shape in ((VOCAB, HIDDEN), (HIDDEN, VOCAB))})


@pytest.fixture(scope="module")
def gpt2_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpt2")
    (root / "plain").mkdir()
    (root / "optimized").mkdir()
    return {
        "plain": _export_gpt2(root / "plain" / "m.onnx", optimize=False),
        "optimized": _export_gpt2(root / "optimized" / "m.onnx", optimize=True),
    }


def test_dynamo_export_stores_the_tie_once_and_inspect_shows_it(
    gpt2_exports: dict[str, Path], tmp_path: Path
) -> None:
    path = gpt2_exports["plain"]
    assert _matrix_shapes(path) == Counter({(VOCAB, HIDDEN): 1, (HIDDEN, VOCAB): 0})
    report = _inspect_json(path, tmp_path)
    (tie,) = report["consumer_ties"]
    (stored,) = [t for t in report["tensors"] if t["shape"] == [VOCAB, HIDDEN]]
    assert tie["initializer"] == stored["name"] and tie["nbytes"] == VOCAB * HIDDEN * 4
    summary = [(c["op_type"], c["slot"], c["role"]) for c in tie["consumers"]]
    assert summary == [("Gather", 0, "embedding"), ("Transpose", 0, "head")]
    (reached,) = tie["consumers"][1]["reaches"]
    assert (reached["op_type"], reached["slot"], reached["role"]) == ("MatMul", 1, "head")
    code, checked = _check_json(path, tmp_path)
    assert code == 0 and checked["findings"] == []


def test_dynamo_constant_folding_writes_a_transposed_copy_for_a_small_vocabulary(
    gpt2_exports: dict[str, Path], tmp_path: Path
) -> None:
    """optimize=True folds Transpose(E) into a second initializer (onnxscript folds inputs of up to
    8192 elements; 100 x 32 is 3200): the tie is lost, which check reports as before."""
    path = gpt2_exports["optimized"]
    assert _matrix_shapes(path) == Counter({(VOCAB, HIDDEN): 1, (HIDDEN, VOCAB): 1})
    report = _inspect_json(path, tmp_path)
    assert report["consumer_ties"] == []
    code, checked = _check_json(path, tmp_path)
    assert code == 1
    assert [(f["rule"], f["relation"]) for f in checked["findings"]] == [("TIE001", "transposed")]


def test_torchscript_export_keeps_tie001_and_shows_its_identity_aliases(
    corpus: Corpus, tmp_path: Path
) -> None:
    """The TorchScript exporter writes the head as a transposed copy (TIE001, as before) and
    deduplicates equal initializers into Identity nodes, which are aliases (relation identical)."""
    path = corpus.path("onnx_gpt2_tied_torchscript")
    model = onnx.load(str(path), load_external_data=False)
    identities = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity"}
    initializers = {init.name for init in model.graph.initializer}
    expected: dict[str, set[str]] = {}
    for alias, source in identities.items():
        if source in initializers:
            expected.setdefault(source, {source}).add(alias)
    assert len(expected) == 2  # the LayerNorm ones and zeros (measured: 2 + 4 aliases)
    report = _inspect_json(path, tmp_path)
    assert {g["storage"]: set(g["names"]) for g in report["alias_groups"]} == expected
    assert all(g["relation"] == "identical" for g in report["alias_groups"])
    assert {a for g in report["alias_groups"] for a in g["aliases"]} == set(identities) & {
        a for names in expected.values() for a in names
    }
    assert report["consumer_ties"] == []
    code, checked = _check_json(path, tmp_path)
    assert code == 1
    assert [(f["rule"], f["relation"]) for f in checked["findings"]] == [("TIE001", "transposed")]
