"""retie on ONNX: copies become graph nodes over one initializer; onnxruntime gives the same logits."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import Corpus
from onnx import TensorProto, helper, numpy_helper

from tieaudit.cli.main import main
from tieaudit.formats.tie_records import TIES_METADATA_KEY
from tieaudit.repair.onnx_writer import ALIGNMENT
from tieaudit.repair.retie import retie

VOCAB = {"gpt2": 1000, "helper": 256}


def _model_path(corpus: Corpus, name: str) -> Path:
    path = corpus.path(name)
    return path / "model.onnx" if path.is_dir() else path


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    logits: np.ndarray = _run_all(path, feeds)[0]
    return logits


def _ids(vocab: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.random.default_rng(1).integers(0, vocab, size=(1, 8), dtype=np.int64)}


def _initializer_bytes(path: Path) -> int:
    model = onnx.load(str(path))  # test side only: onnx resolves OUT's own data file
    return sum(numpy_helper.to_array(init).nbytes for init in model.graph.initializer)


def _ties(path: Path) -> dict[str, dict[str, str]]:
    model = onnx.load(str(path), load_external_data=False)
    record = next((p.value for p in model.metadata_props if p.key == TIES_METADATA_KEY), "{}")
    ties: dict[str, dict[str, str]] = json.loads(record)
    return ties


def _rules(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert main(["check", str(path), "--format", "json"]) == 0
    return [finding["rule"] for finding in json.loads(capsys.readouterr().out)["findings"]]


def _external(path: Path) -> list[TensorProto]:
    initializers = onnx.load(str(path), load_external_data=False).graph.initializer
    return [init for init in initializers if init.data_location == TensorProto.EXTERNAL]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- exported GPT-2: the transposed copy becomes Transpose(embedding) --------------------------


@pytest.mark.parametrize(
    ("fixture", "copy"),
    [("onnx_gpt2_tied_torchscript", "onnx::MatMul_353"), ("onnx_gpt2_cloned_dynamo", "val_155")],
)
def test_gpt2_transposed_copy_is_stored_once_and_logits_are_unchanged(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture: str, copy: str
) -> None:
    source, out = _model_path(corpus, fixture), tmp_path / "tied.onnx"
    result = retie(str(source), str(out))

    assert [(d.kept, d.dropped, d.relation) for d in result.plan.applied] == [
        ("m.transformer.wte.weight", copy, "transposed")
    ]
    before, after = _initializer_bytes(source), _initializer_bytes(out)
    assert after == before - 1000 * 64 * 4
    if fixture == "onnx_gpt2_cloned_dynamo":  # same weights as the tied dynamo export
        assert after == corpus.entry("onnx_gpt2_tied_dynamo")["expect"]["initializer_bytes"]
    model = onnx.load(str(out))
    assert copy not in {init.name for init in model.graph.initializer}
    transpose = model.graph.node[0]
    assert (transpose.op_type, list(transpose.input), list(transpose.output)) == (
        "Transpose",
        ["m.transformer.wte.weight"],
        [copy],
    )
    assert _ties(out) == {copy: {"source": "m.transformer.wte.weight", "relation": "transposed"}}
    assert sorted(os.listdir(tmp_path)) == ["tied.onnx"]

    feeds = _ids(VOCAB["gpt2"])
    expected, actual = _run(source, feeds), _run(out, feeds)
    assert float(np.max(np.abs(expected - actual))) == 0.0
    assert "TIE001" not in _rules(out, capsys)


# --- onnx.helper graphs -------------------------------------------------------------------------


def test_equal_copy_consumers_read_the_kept_initializer(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = _model_path(corpus, "onnx_helper_duplicate"), tmp_path / "tied.onnx"
    retie(str(source), str(out))

    model = onnx.load(str(out))
    assert [init.name for init in model.graph.initializer] == ["E"]
    assert [list(node.input) for node in model.graph.node] == [
        ["E", "input_ids"],
        ["E"],
        ["hidden", "proj_t"],
    ]
    assert out.stat().st_size <= source.stat().st_size - 256 * 32 * 4 + 256
    assert _ties(out) == {"E_copy": {"source": "E", "relation": "equal"}}
    feeds = _ids(VOCAB["helper"])
    np.testing.assert_array_equal(_run(source, feeds), _run(out, feeds))
    assert "TIE001" not in _rules(out, capsys)


def test_retie_of_a_tied_model_is_a_verified_copy(corpus: Corpus, tmp_path: Path) -> None:
    source, out = _model_path(corpus, "onnx_helper_shared"), tmp_path / "same.onnx"
    result = retie(str(source), str(out))

    assert result.plan.applied == () and result.written is None  # nothing to re-tie: no OUT
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("data_file", ["weights.bin", "model.onnx.data"])
def test_external_data_is_written_beside_out_and_the_input_is_untouched(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str], data_file: str
) -> None:
    # helper_duplicate (E_copy: a copy of E) with its initializers in external data
    source, vocab = tmp_path / "in" / "model.onnx", VOCAB["helper"]
    source.parent.mkdir()
    model = onnx.load(str(_model_path(corpus, "onnx_helper_duplicate")))
    onnx.save(model, str(source), save_as_external_data=True, location=data_file, size_threshold=0)
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    inputs = {entry: _sha256(source.parent / entry) for entry in os.listdir(source.parent)}
    assert data_file in inputs
    out = tmp_path / "tied.onnx"
    retie(str(source), str(out))

    assert {entry: _sha256(source.parent / entry) for entry in os.listdir(source.parent)} == inputs
    assert sorted(os.listdir(tmp_path)) == ["tied.onnx", "tied.onnx.data"]
    external = {init.name for init in _external(source)}
    assert external
    for init in onnx.load(str(out), load_external_data=False).graph.initializer:
        if init.name not in external:
            assert init.data_location == TensorProto.DEFAULT and init.HasField("raw_data")
            continue
        entries = {entry.key: entry.value for entry in init.external_data}
        assert init.data_location == TensorProto.EXTERNAL and entries["location"] == "tied.onnx.data"
        if int(entries["length"]) >= ALIGNMENT:
            assert int(entries["offset"]) % ALIGNMENT == 0
    assert _initializer_bytes(out) == _initializer_bytes(source) - EMBEDDING.nbytes  # E_copy dropped
    feeds = _ids(vocab)
    np.testing.assert_array_equal(_run(source, feeds), _run(out, feeds))
    assert "TIE001" not in _rules(out, capsys)


def _value(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _lm(
    initializers: list[TensorProto], nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 8])],
        outputs,
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


EMBEDDING = np.random.default_rng(0).standard_normal((256, 32)).astype(np.float32)


def test_cast_copy_becomes_a_cast_node_when_asked(tmp_path: Path) -> None:
    half = EMBEDDING.astype(np.float16)
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["hidden"]),
        helper.make_node("Gather", ["E16", "input_ids"], ["hidden16"]),
        helper.make_node("Cast", ["hidden16"], ["logits16"], to=TensorProto.FLOAT),
    ]
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    inits = [numpy_helper.from_array(EMBEDDING, "E"), numpy_helper.from_array(half, "E16")]
    onnx.save(_lm(inits, nodes, [_value("hidden", [1, 8, 32]), _value("logits16", [1, 8, 32])]), str(source))
    retie(str(source), str(out), relations=frozenset({"equal", "cast"}))

    model = onnx.load(str(out))
    assert [init.name for init in model.graph.initializer] == ["E"]
    cast = model.graph.node[0]
    assert (cast.op_type, list(cast.input), cast.attribute[0].i) == ("Cast", ["E"], TensorProto.FLOAT16)
    assert _ties(out) == {"E16": {"source": "E", "relation": "cast", "dtype": "float16"}}
    feeds = _ids(256)
    for expected, actual in zip(_run_all(source, feeds), _run_all(out, feeds), strict=True):
        np.testing.assert_array_equal(expected, actual)


def _run_all(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs: list[np.ndarray] = session.run(None, feeds)
    return outputs


def test_equal_copy_read_in_subgraphs_and_named_as_an_output(tmp_path: Path) -> None:
    gather = helper.make_node("Gather", ["E_copy", "input_ids"], ["rows"])
    flatten = helper.make_node("Reshape", ["rows", "table_shape"], ["branch"])
    then_branch = helper.make_graph([gather, flatten], "then", [], [_value("branch", [8, 32])])
    whole = helper.make_node("Identity", ["E_copy"], ["table"])
    else_branch = helper.make_graph([whole], "else", [], [_value("table", [256, 32])])
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["hidden"]),
        helper.make_node("ReduceSum", ["input_ids"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["picked"], then_branch=then_branch, else_branch=else_branch),
    ]
    inits = [
        numpy_helper.from_array(EMBEDDING, "E"),
        numpy_helper.from_array(EMBEDDING.copy(), "E_copy"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([-1, 32], np.int64), "table_shape"),
    ]
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    outputs = [_value("hidden", [1, 8, 32]), _value("picked", [-1, 32]), _value("E_copy", [256, 32])]
    onnx.save(_lm(inits, nodes, outputs), str(source))
    retie(str(source), str(out))

    model = onnx.load(str(out))
    assert [init.name for init in model.graph.initializer] == ["E", "zero", "table_shape"]
    identity = model.graph.node[0]
    assert (identity.op_type, list(identity.input), list(identity.output)) == ("Identity", ["E"], ["E_copy"])
    branches = {attr.name: attr.g for attr in model.graph.node[-1].attribute}
    assert list(branches["then_branch"].node[0].input) == ["E", "input_ids"]
    assert list(branches["else_branch"].node[0].input) == ["E"]
    feeds = _ids(256)
    for expected, actual in zip(_run_all(source, feeds), _run_all(out, feeds), strict=True):
        np.testing.assert_array_equal(expected, actual)


def test_a_retied_output_retied_again_keeps_its_record(corpus: Corpus, tmp_path: Path) -> None:
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    retie(str(_model_path(corpus, "onnx_helper_duplicate")), str(first))
    result = retie(str(first), str(second))

    assert result.plan.applied == () and result.written is None and not second.exists()
    assert _ties(first) == {"E_copy": {"source": "E", "relation": "equal"}}


def test_kept_constant_node_moves_before_the_consumers_it_gains(tmp_path: Path) -> None:
    table = helper.make_node("Constant", [], ["E"], value=numpy_helper.from_array(EMBEDDING, "E"))
    nodes = [
        helper.make_node("Transpose", ["E_copy"], ["proj_t"], perm=[1, 0]),
        table,
        helper.make_node("Gather", ["E", "input_ids"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "proj_t"], ["logits"]),
    ]
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    copy = numpy_helper.from_array(EMBEDDING.copy(), "E_copy")
    onnx.save(_lm([copy], nodes, [_value("logits", [1, 8, 256])]), str(source))
    result = retie(str(source), str(out))

    assert [(d.kept, d.dropped) for d in result.plan.applied] == [("E", "E_copy")]
    model = onnx.load(str(out))
    assert list(model.graph.initializer) == []
    assert [(n.op_type, list(n.input)) for n in model.graph.node[:2]] == [
        ("Constant", []),
        ("Transpose", ["E"]),
    ]
    feeds = _ids(256)
    np.testing.assert_array_equal(_run(source, feeds), _run(out, feeds))


def test_a_model_past_the_protobuf_limit_moves_its_large_initializers_out(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnx.checker, "MAXIMUM_PROTOBUF", 1000)  # stands in for 2 GB
    source, out = _model_path(corpus, "onnx_helper_duplicate"), tmp_path / "tied.onnx"
    retie(str(source), str(out))

    assert sorted(os.listdir(tmp_path)) == ["tied.onnx", "tied.onnx.data"]
    assert [init.name for init in _external(out)] == ["E"]
    assert (tmp_path / "tied.onnx.data").stat().st_size == EMBEDDING.nbytes
    feeds = _ids(VOCAB["helper"])
    np.testing.assert_array_equal(_run(source, feeds), _run(out, feeds))


def test_torchscript_gpt2_after_retie_stores_each_parameter_once(corpus: Corpus, tmp_path: Path) -> None:
    """Initializer bytes == torch parameter bytes, less only the constant parameters (LayerNorm ones,
    zero biases of a random init) that the TorchScript exporter had already merged into one."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "fixtures"))
    import producers_onnx  # type: ignore[import-not-found]

    wrapper, _ = producers_onnx._gpt2_wrapper(clone_head=False)
    params = {name: p.detach().numpy() for name, p in wrapper.named_parameters()}  # tied: listed once
    out = tmp_path / "tied.onnx"
    retie(str(_model_path(corpus, "onnx_gpt2_tied_torchscript")), str(out))
    stored = {init.name: numpy_helper.to_array(init) for init in onnx.load(str(out)).graph.initializer}
    assert set(stored) <= set(params)  # no initializer that is not a parameter (the E.T copy is gone)
    merged = {name: value for name, value in params.items() if name not in stored}
    for name, value in merged.items():
        assert (value == value.flat[0]).all(), name
        assert any(v.shape == value.shape and v.tobytes() == value.tobytes() for v in stored.values()), name
    parameter_bytes = sum(value.nbytes for value in params.values())
    assert sum(v.nbytes for v in stored.values()) == parameter_bytes - sum(v.nbytes for v in merged.values())
    assert parameter_bytes == 464_640 and len(merged) == 6
