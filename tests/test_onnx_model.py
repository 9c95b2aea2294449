"""The ONNX reader, on models built by onnx.helper and torch.onnx.export, and on hostile files."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import values
from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.records import Checkpoint, Consumer
from tieaudit.formats.onnx_model import OnnxReader, looks_like_model_proto

RNG = np.random.default_rng(0)
E = RNG.standard_normal((10, 4)).astype(np.float32)


def _read(path: Path) -> OpenCheckpoint:
    return OnnxReader().read(str(path))


def _records(path: Path) -> Checkpoint:
    """What the reader found (records only; the files are closed again)."""
    with _read(path) as open_ckpt:
        return open_ckpt.checkpoint


def _model(
    nodes: Iterable[onnx.NodeProto],
    initializers: Iterable[onnx.TensorProto],
    inputs: Iterable[onnx.ValueInfoProto] = (),
    outputs: Iterable[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _value(name: str, elem: int = TensorProto.FLOAT, shape: list[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _tied_graph(*, copy: bool) -> onnx.ModelProto:
    """Gather(E, ids) and MatMul(emb, Transpose(E or its copy E2))."""
    initializers = [numpy_helper.from_array(E, "E")]
    if copy:
        initializers.append(numpy_helper.from_array(E.copy(), "E2"))
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["emb"], name="gather"),
        helper.make_node("Transpose", ["E2" if copy else "E"], ["Et"], name="transpose"),
        helper.make_node("MatMul", ["emb", "Et"], ["logits"], name="matmul"),
    ]
    return _model(nodes, initializers, [_value("ids", TensorProto.INT64, [3])], [_value("logits")])


def _uses(ckpt: Checkpoint, name: str) -> list[tuple[str, str, int, str]]:
    return [(c.node, c.op_type, c.slot, c.graph) for c in ckpt.consumers[name]]


def _assert_one_line_error(exc: InputError, model: Path) -> None:
    text = str(exc)
    assert text.startswith(str(model)) and "\n" not in text


# --- graphs built with onnx.helper ------------------------------------------------------------


def test_shared_initializer_is_one_tensor_consumed_by_gather_and_transpose(tmp_path: Path) -> None:
    onnx.save_model(_tied_graph(copy=False), tmp_path / "m.onnx")
    open_ckpt = _read(tmp_path / "m.onnx")
    ckpt = open_ckpt.checkpoint
    assert [t.name for t in ckpt.tensors] == ["E"]
    matmul = Consumer(node="matmul", op_type="MatMul", slot=1, graph="main", role="head")
    assert ckpt.consumers["E"] == (
        Consumer(node="gather", op_type="Gather", slot=0, graph="main", role="embedding"),
        Consumer(node="transpose", op_type="Transpose", slot=0, graph="main", role="head", reaches=(matmul,)),
    )
    tensor = ckpt.tensor("E")
    assert (tensor.dtype, tensor.shape, tensor.strides, tensor.byte_offset) == ("float32", (10, 4), (4, 1), 0)
    storage = ckpt.storages["E"]
    assert storage.file == "m.onnx" and storage.nbytes == E.nbytes
    # embedded raw_data is served from the model file itself, at the offset its bytes sit
    raw = (tmp_path / "m.onnx").read_bytes()
    assert raw[storage.file_offset : storage.file_offset + storage.nbytes] == E.tobytes()
    array = open_ckpt.array(tensor)
    assert np.array_equal(array, E) and not array.flags.writeable
    assert ckpt.files == ("m.onnx",) and ckpt.format == "onnx"


def test_value_equal_copy_is_two_storages(tmp_path: Path) -> None:
    onnx.save_model(_tied_graph(copy=True), tmp_path / "m.onnx")
    open_ckpt = _read(tmp_path / "m.onnx")
    ckpt = open_ckpt.checkpoint
    assert ckpt.tensor("E").storage_id != ckpt.tensor("E2").storage_id
    assert len(ckpt.storages) == 2
    assert np.array_equal(open_ckpt.array(ckpt.tensor("E")), open_ckpt.array(ckpt.tensor("E2")))
    assert _uses(ckpt, "E") == [("gather", "Gather", 0, "main")]
    assert _uses(ckpt, "E2") == [("transpose", "Transpose", 0, "main")]


def test_external_data_saved_by_onnx_reads_back_equal_and_read_only(tmp_path: Path) -> None:
    extra: dict[str, np.ndarray] = {
        "ids64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "half": RNG.standard_normal(5).astype(np.float16),
    }
    model = _tied_graph(copy=True)
    model.graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in extra.items())
    onnx.save_model(
        model,
        tmp_path / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    open_ckpt = _read(tmp_path / "m.onnx")
    ckpt = open_ckpt.checkpoint
    assert ckpt.files == ("m.onnx", "w.bin")
    expected = {"E": E, "E2": E, **extra}
    assert {t.name for t in ckpt.tensors} == set(expected)
    for tensor in ckpt.tensors:
        storage = ckpt.storages[tensor.storage_id]
        assert storage.file == "w.bin" and storage.file_offset >= 0 and storage.nbytes == tensor.nbytes
        array = open_ckpt.array(tensor)
        assert array.dtype == expected[tensor.name].dtype
        assert np.array_equal(array, expected[tensor.name]) and not array.flags.writeable
    assert len(ckpt.storages) == 4  # one file, separate ranges, separate storages
    open_ckpt.close()


def test_external_initializers_naming_the_same_bytes_are_one_storage(tmp_path: Path) -> None:
    model = _tied_graph(copy=True)
    onnx.save_model(
        model, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    model = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    first, second = model.graph.initializer
    del second.external_data[:]
    second.external_data.extend(first.external_data)  # E2 now points at E's bytes exactly
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    open_ckpt = _read(tmp_path / "m.onnx")
    ckpt = open_ckpt.checkpoint
    assert ckpt.tensor("E").storage_id == ckpt.tensor("E2").storage_id == "E"
    assert list(ckpt.storages) == ["E"]
    assert np.array_equal(open_ckpt.array(ckpt.tensor("E2")), E)
    assert _uses(ckpt, "E2") == [("transpose", "Transpose", 0, "main")]


def test_typed_fields_convert_to_their_canonical_dtypes(tmp_path: Path) -> None:
    initializers = [
        helper.make_tensor("f", TensorProto.FLOAT, [2], [1.5, -2.0]),
        helper.make_tensor("bf", TensorProto.BFLOAT16, [2], [1.0, 2.0]),
        helper.make_tensor("f8", TensorProto.FLOAT8E4M3FN, [2], [1.0, -0.5]),
        helper.make_tensor("i64", TensorProto.INT64, [3], [1, 2, 3]),
        helper.make_tensor("flag", TensorProto.BOOL, [2], [True, False]),
    ]
    onnx.save_model(_model([], initializers), tmp_path / "m.onnx")
    open_ckpt = _read(tmp_path / "m.onnx")
    ckpt = open_ckpt.checkpoint
    dtypes = {t.name: t.dtype for t in ckpt.tensors}
    assert dtypes == {"f": "float32", "bf": "bfloat16", "f8": "float8_e4m3fn", "i64": "int64", "flag": "bool"}
    assert values(open_ckpt.array(ckpt.tensor("bf")), "bfloat16").tolist() == [1.0, 2.0]
    assert values(open_ckpt.array(ckpt.tensor("f8")), "float8_e4m3fn").tolist() == [1.0, -0.5]
    assert open_ckpt.array(ckpt.tensor("flag")).tolist() == [True, False]


def test_strings_and_4bit_are_skipped_not_errors(tmp_path: Path) -> None:
    words: list[Any] = [b"a", b"b"]
    initializers = [
        helper.make_tensor("words", TensorProto.STRING, [2], words),
        helper.make_tensor("nibbles", TensorProto.INT4, [2], [1, -2]),
        numpy_helper.from_array(E, "E"),
    ]
    onnx.save_model(_model([], initializers), tmp_path / "m.onnx")
    ckpt = _records(tmp_path / "m.onnx")
    assert ckpt.names == {"E"}
    reasons = {s.name: s.reason for s in ckpt.skipped}
    assert set(reasons) == {"words", "nibbles"}
    assert "STRING" in reasons["words"] and "INT4" in reasons["nibbles"]


def _branch(
    name: str, nodes: Iterable[onnx.NodeProto], initializers: Iterable[onnx.TensorProto] = ()
) -> onnx.GraphProto:
    return helper.make_graph(list(nodes), name, [], [_value(f"{name}_out")], initializer=list(initializers))


def test_if_subgraphs_and_constants_are_tensors_with_scoped_consumers(tmp_path: Path) -> None:
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    w_then = RNG.standard_normal((4, 4)).astype(np.float32)
    inner_then = _branch(
        "inner_then", [helper.make_node("MatMul", ["x", "W"], ["inner_then_out"], name="deep")]
    )
    inner_else = _branch("inner_else", [helper.make_node("Identity", ["x"], ["inner_else_out"])])
    then_branch = _branch(
        "then",
        [
            helper.make_node("MatMul", ["x", "W"], ["t0"], name="then_mm"),  # the branch's own W
            helper.make_node(
                "If", ["cond"], ["t1"], name="If_1", then_branch=inner_then, else_branch=inner_else
            ),
            helper.make_node("Add", ["t0", "t1"], ["then_out"], name="then_add"),
        ],
        [numpy_helper.from_array(w_then, "W")],
    )
    else_branch = _branch(
        "else",
        [
            helper.make_node(
                "Constant", [], ["c"], value=numpy_helper.from_array(np.full(4, 3.0, np.float32))
            ),
            helper.make_node("MatMul", ["x", "W"], ["e0"], name="else_mm"),  # the outer W
            helper.make_node("Add", ["e0", "c"], ["else_out"], name="else_add"),
        ],
    )
    nodes = [
        helper.make_node(
            "Constant", [], ["k"], name="const_k", value=numpy_helper.from_array(np.ones(4, np.int64))
        ),
        helper.make_node(
            "If", ["cond"], ["y"], name="If_0", then_branch=then_branch, else_branch=else_branch
        ),
        helper.make_node("Add", ["y", "W"], ["z"], name="main_add"),
    ]
    inputs = [_value("cond", TensorProto.BOOL, []), _value("x", shape=[4, 4])]
    model = _model(nodes, [numpy_helper.from_array(w, "W")], inputs, [_value("z")])
    onnx.save_model(model, tmp_path / "m.onnx")
    open_ckpt = _read(tmp_path / "m.onnx")
    ckpt = open_ckpt.checkpoint
    # make_node stores attributes sorted by name: else_branch is walked before then_branch.
    assert [t.name for t in ckpt.tensors] == ["W", "k", "c", "If_0/then_branch/W"]
    assert np.array_equal(open_ckpt.array(ckpt.tensor("W")), w)
    assert np.array_equal(open_ckpt.array(ckpt.tensor("If_0/then_branch/W")), w_then)
    assert open_ckpt.array(ckpt.tensor("c")).tolist() == [3.0] * 4
    assert ckpt.tensor("k").dtype == "int64"
    # A nested subgraph sees the nearest enclosing W: then_branch's own, not main's.
    assert _uses(ckpt, "If_0/then_branch/W") == [
        ("then_mm", "MatMul", 1, "If_0/then_branch"),
        ("deep", "MatMul", 1, "If_0/then_branch/If_1/then_branch"),
    ]
    assert _uses(ckpt, "W") == [("else_mm", "MatMul", 1, "If_0/else_branch"), ("main_add", "Add", 1, "main")]
    assert _uses(ckpt, "c") == [("else_add", "Add", 1, "If_0/else_branch")]
    assert _uses(ckpt, "k") == []


def test_identity_chain_is_an_alias_and_its_consumers_count(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Identity", ["E"], ["E_a"], name="id1"),
        helper.make_node("Identity", ["E_a"], ["E_b"]),  # unnamed: reported as #1
        helper.make_node("Gather", ["E_b", "ids"], ["emb"], name="gather"),
        helper.make_node("Transpose", ["E_a"], ["Et"], name="transpose"),
        helper.make_node("MatMul", ["emb", "Et"], ["logits"], name="matmul"),
    ]
    model = _model(
        nodes, [numpy_helper.from_array(E, "E")], [_value("ids", TensorProto.INT64, [3])], [_value("logits")]
    )
    onnx.save_model(model, tmp_path / "m.onnx")
    ckpt = _records(tmp_path / "m.onnx")
    assert dict(ckpt.aliases) == {"E_a": "E", "E_b": "E"}
    assert ckpt.names == {"E"}
    assert _uses(ckpt, "E") == [
        ("id1", "Identity", 0, "main"),
        ("#1", "Identity", 0, "main"),
        ("gather", "Gather", 0, "main"),
        ("transpose", "Transpose", 0, "main"),
    ]


# --- torch.onnx.export --------------------------------------------------------------------------


def _export(
    folder: Path, vocab: int, dim: int, dynamo: bool, optimize: bool = True
) -> tuple[Path, np.ndarray]:
    import torch

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, dim)
            self.head = torch.nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = self.head(self.emb(ids))
            return logits

    torch.manual_seed(0)
    module = Tied().eval()
    folder.mkdir()
    path = folder / "m.onnx"
    with warnings.catch_warnings():  # the exporters' deprecation notices are not ours to fix
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
        torch.onnx.export(
            module, (torch.randint(0, vocab, (2, 5)),), str(path), dynamo=dynamo, optimize=optimize
        )
    return path, module.emb.weight.detach().numpy().copy()


def _graph_truth(path: Path) -> dict[str, list[tuple[str, str, int, str]]]:
    """Who reads each main-graph initializer, straight from the protobuf."""
    graph = onnx.load(path, load_external_data=False).graph
    truth: dict[str, list[tuple[str, str, int, str]]] = {init.name: [] for init in graph.initializer}
    for node in graph.node:
        assert not any(attr.HasField("g") for attr in node.attribute)  # a flat graph: main only
        for slot, name in enumerate(node.input):
            if name in truth:
                truth[name].append((node.name, node.op_type, slot, "main"))
    return truth


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    root = tmp_path_factory.mktemp("exports")
    return {
        "dynamo": _export(root / "dynamo", 100, 16, dynamo=True),
        "dynamo_unoptimized": _export(root / "dynamo_unoptimized", 100, 16, dynamo=True, optimize=False),
        "dynamo_large": _export(root / "dynamo_large", 1000, 64, dynamo=True),
        "torchscript": _export(root / "torchscript", 100, 16, dynamo=False),
    }


@pytest.mark.parametrize("kind", ["dynamo", "dynamo_unoptimized", "dynamo_large", "torchscript"])
def test_consumer_map_of_torch_exports_matches_the_graph(
    exports: dict[str, tuple[Path, np.ndarray]], kind: str
) -> None:
    path, _ = exports[kind]
    ckpt = _records(path)
    assert {name: _uses(ckpt, name) for name in ckpt.consumers} == _graph_truth(path)


@pytest.mark.parametrize("kind", ["dynamo_unoptimized", "dynamo_large"])
def test_dynamo_export_keeps_one_embedding_read_by_gather_and_transpose(
    exports: dict[str, tuple[Path, np.ndarray]], kind: str
) -> None:
    path, weight = exports[kind]
    open_ckpt = _read(path)
    ckpt = open_ckpt.checkpoint
    (tensor,) = ckpt.tensors
    assert sorted(op for _, op, _, _ in _uses(ckpt, tensor.name)) == ["Gather", "Transpose"]
    assert ckpt.files == ("m.onnx", "m.onnx.data")  # the dynamo exporter writes external data
    assert np.array_equal(open_ckpt.array(tensor), weight)


def test_dynamo_export_of_a_small_vocabulary_folds_the_transpose_into_a_copy(
    exports: dict[str, tuple[Path, np.ndarray]],
) -> None:
    path, weight = exports["dynamo"]
    open_ckpt = _read(path)
    ckpt = open_ckpt.checkpoint
    assert len(ckpt.tensors) == 2 and len(ckpt.storages) == 2
    gathered = next(t for t in ckpt.tensors if [u[1] for u in _uses(ckpt, t.name)] == ["Gather"])
    copy = next(t for t in ckpt.tensors if [u[1] for u in _uses(ckpt, t.name)] == ["MatMul"])
    assert np.array_equal(open_ckpt.array(gathered), weight)
    assert open_ckpt.array(copy).tobytes() == np.ascontiguousarray(weight.T).tobytes()


def test_torchscript_export_stores_the_embedding_and_a_transposed_copy(
    exports: dict[str, tuple[Path, np.ndarray]],
) -> None:
    path, weight = exports["torchscript"]
    open_ckpt = _read(path)
    ckpt = open_ckpt.checkpoint
    assert len(ckpt.tensors) == 2 and len(ckpt.storages) == 2
    embedding = ckpt.tensor("emb.weight")
    (copy,) = (t for t in ckpt.tensors if t.name.startswith("onnx::MatMul_"))
    assert _uses(ckpt, embedding.name)[0][1] == "Gather" and _uses(ckpt, copy.name)[0][1] == "MatMul"
    storage = ckpt.storages[copy.storage_id]
    assert copy.shape == (16, 100) and storage.file == path.name and storage.file_offset > 0
    assert np.array_equal(open_ckpt.array(embedding), weight)
    assert open_ckpt.array(copy).tobytes() == np.ascontiguousarray(weight.T).tobytes()


# --- hostile and malformed input ----------------------------------------------------------------

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """Every path opened while the test runs (audit hooks cannot be removed, so one is gated)."""
    global _OPENED
    if not getattr(sys, "_tieaudit_onnx_hook", False):
        sys.addaudithook(_audit)
        sys._tieaudit_onnx_hook = True  # type: ignore[attr-defined]
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def _external_model(
    folder: Path, location: str, offset: int | None = None, length: int | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensor = numpy_helper.from_array(E, "E")
    set_external_data(tensor, location, offset, length)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    path = folder / "m.onnx"
    path.write_bytes(_model([helper.make_node("Gather", ["E", "ids"], ["y"])], [tensor]).SerializeToString())
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A weights file with E's bytes, next to (not inside) the model's folder."""
    target = tmp_path / "x.bin"
    target.write_bytes(E.tobytes())
    return target


def _refused(
    model: Path, opened: list[str], outside: Path, error: type[InputError] = UnsafeInputError
) -> str:
    with pytest.raises(error) as caught:
        _read(model)
    assert type(caught.value) is error
    _assert_one_line_error(caught.value, model)
    assert str(model) in opened  # the hook sees opens...
    assert not [p for p in opened if os.path.realpath(p) == os.path.realpath(outside)]  # ...and not this one
    return caught.value.message


def test_location_with_dotdot_is_refused(tmp_path: Path, outside: Path, opened: list[str]) -> None:
    message = _refused(_external_model(tmp_path / "model", "../x.bin"), opened, outside)
    assert "'E'" in message and "../x.bin" in message


def test_location_with_backslash_dotdot_is_refused(tmp_path: Path, outside: Path, opened: list[str]) -> None:
    _refused(_external_model(tmp_path / "model", "..\\x.bin"), opened, outside)


def test_absolute_location_is_refused(tmp_path: Path, outside: Path, opened: list[str]) -> None:
    message = _refused(_external_model(tmp_path / "model", str(outside)), opened, outside)
    assert str(outside) in message


def test_symlinked_file_pointing_outside_is_refused(tmp_path: Path, outside: Path, opened: list[str]) -> None:
    model = _external_model(tmp_path / "model", "w.bin")
    (tmp_path / "model" / "w.bin").symlink_to(outside)
    assert "symbolic link" in _refused(model, opened, outside)


def test_symlinked_file_inside_the_folder_is_refused_too(
    tmp_path: Path, outside: Path, opened: list[str]
) -> None:
    model = _external_model(tmp_path / "model", "w.bin")
    (tmp_path / "model" / "real.bin").write_bytes(E.tobytes())
    (tmp_path / "model" / "w.bin").symlink_to("real.bin")
    _refused(model, opened, outside)


def test_symlinked_folder_component_is_refused(tmp_path: Path, outside: Path, opened: list[str]) -> None:
    model = _external_model(tmp_path / "model", "sub/x.bin")
    (tmp_path / "model" / "sub").symlink_to(tmp_path)
    assert "sub" in _refused(model, opened, outside)


def test_model_folder_reached_through_a_symlink_is_fine(tmp_path: Path) -> None:
    _external_model(tmp_path / "real", "w.bin")
    (tmp_path / "real" / "w.bin").write_bytes(E.tobytes())
    (tmp_path / "link").symlink_to(tmp_path / "real")
    open_ckpt = _read(tmp_path / "link" / "m.onnx")
    ckpt = open_ckpt.checkpoint
    assert np.array_equal(open_ckpt.array(ckpt.tensor("E")), E)


def test_range_past_the_end_of_the_file_is_an_input_error(
    tmp_path: Path, outside: Path, opened: list[str]
) -> None:
    model = _external_model(tmp_path / "model", "w.bin", offset=8)
    (tmp_path / "model" / "w.bin").write_bytes(E.tobytes())
    assert "past the end" in _refused(model, opened, outside, InputError)


def test_missing_external_file_is_an_input_error(tmp_path: Path, outside: Path, opened: list[str]) -> None:
    assert "does not exist" in _refused(
        _external_model(tmp_path / "model", "w.bin"), opened, outside, InputError
    )


def test_length_that_disagrees_with_the_shape_is_an_input_error(
    tmp_path: Path, outside: Path, opened: list[str]
) -> None:
    model = _external_model(tmp_path / "model", "w.bin", length=8)
    (tmp_path / "model" / "w.bin").write_bytes(E.tobytes())
    assert "length 8" in _refused(model, opened, outside, InputError)


def test_missing_length_means_numel_times_itemsize(tmp_path: Path) -> None:
    model = _external_model(tmp_path / "model", "w.bin")
    (tmp_path / "model" / "w.bin").write_bytes(E.tobytes())
    ckpt = _records(model)
    assert ckpt.storages["E"].nbytes == E.nbytes and ckpt.files == ("m.onnx", "w.bin")


def test_truncated_protobuf_is_an_input_error(tmp_path: Path) -> None:
    whole = tmp_path / "whole.onnx"
    onnx.save_model(_tied_graph(copy=True), whole)
    data = whole.read_bytes()
    truncated = tmp_path / "m.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as caught:
        _read(truncated)
    assert "not a valid ONNX protobuf" in caught.value.message
    _assert_one_line_error(caught.value, truncated)


def test_offset_that_is_not_a_count_is_an_input_error(
    tmp_path: Path, outside: Path, opened: list[str]
) -> None:
    model = _external_model(tmp_path / "model", "w.bin", offset=0)
    onnx_model = onnx.load(model, load_external_data=False)
    for entry in onnx_model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "-8"
    model.write_bytes(onnx_model.SerializeToString())
    (tmp_path / "model" / "w.bin").write_bytes(E.tobytes())
    assert "offset '-8'" in _refused(model, opened, outside, InputError)


def test_embedded_bytes_that_disagree_with_the_shape_are_an_input_error(tmp_path: Path) -> None:
    tensor = numpy_helper.from_array(E, "E")
    tensor.raw_data = tensor.raw_data[:-4]
    (tmp_path / "m.onnx").write_bytes(_model([], [tensor]).SerializeToString())
    with pytest.raises(InputError, match="needs 160 bytes, the protobuf holds 156"):
        _read(tmp_path / "m.onnx")


def test_duplicate_initializer_names_are_an_input_error(tmp_path: Path) -> None:
    model = _model([], [numpy_helper.from_array(E, "E"), numpy_helper.from_array(E, "E")])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(InputError, match="appears twice"):
        _read(tmp_path / "m.onnx")


# --- sniffing and imports -----------------------------------------------------------------------


def test_sniff_recognises_model_protos_by_content(tmp_path: Path) -> None:
    onnx.save_model(_tied_graph(copy=False), tmp_path / "m.model")
    reader = OnnxReader()
    assert reader.sniff(str(tmp_path / "m.model"), (tmp_path / "m.model").read_bytes()[:64])
    assert reader.sniff("anything.onnx", b"")
    assert not reader.sniff("x.pt", b"PK\x03\x04" + bytes(60))
    # A safetensors header length whose low byte is 0x08 (264 bytes of JSON) is not ONNX.
    assert not looks_like_model_proto((264).to_bytes(8, "little") + b'{"a":')
    assert not looks_like_model_proto(b"\x08\x00garbage")


def test_importing_the_reader_does_not_import_onnx() -> None:
    code = "import sys, tieaudit.formats.onnx_model; sys.exit('onnx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_tensors_it_does_not_read_are_listed_by_where_they_are(tmp_path: Path) -> None:
    """A function's Constant, a training graph's initializer and ConstantOfShape's value are not
    read, and are listed in skipped (never silently left out); read and already-listed tensors
    (initializers, Constant values, sparse initializers) are not listed again."""
    value = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["z"], value=value),
        helper.make_node(
            "Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [2], [1, 2])
        ),
    ]
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("sv", TensorProto.FLOAT, [1], [1.0]),
        helper.make_tensor("si", TensorProto.INT64, [1], [0]),
        [4],
    )
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [2], [3.0, 4.0])],
        sparse_initializer=[sparse],
    )
    constant = helper.make_node(
        "Constant", [], ["b"], value=helper.make_tensor("c", TensorProto.FLOAT, [2], [1, 2])
    )
    function = helper.make_function("dom", "F", ["a"], ["b"], [constant], [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17)])
    training = onnx.TrainingInfoProto()
    training.initialization.CopyFrom(
        helper.make_graph([], "init", [], [], [helper.make_tensor("tw", TensorProto.FLOAT, [1], [0.0])])
    )
    model.training_info.append(training)
    onnx.save_model(model, tmp_path / "m.onnx")
    ckpt = _read(tmp_path / "m.onnx").checkpoint
    assert sorted(t.name for t in ckpt.tensors) == ["k", "w"]
    unread = sorted(s.name for s in ckpt.skipped if s.reason.startswith("a tensor tieaudit does not read"))
    assert unread == [
        "attribute 'value' of node #0 ('Constant') in function 'F'",
        "attribute 'value' of node #0 ('ConstantOfShape') in the main graph",
        "initializer 'tw' in training_info[0].initialization",
    ]
    assert [s.name for s in ckpt.skipped if "sparse" in s.reason] == ["sv"]  # listed once
