"""Every place a TensorProto can sit in an ONNX model is walked, so no external-data location
escapes confinement: the walker against onnx.proto's own descriptors, and against a model with an
external tensor planted in each place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper

from tieaudit.core.errors import UnsafeInputError
from tieaudit.formats.onnx_model import OnnxReader
from tieaudit.formats.onnx_tensors import every_tensor

WALKED = {
    ("onnx.ModelProto", "graph"),
    ("onnx.ModelProto", "functions"),
    ("onnx.ModelProto", "training_info"),
    ("onnx.TrainingInfoProto", "initialization"),
    ("onnx.TrainingInfoProto", "algorithm"),
    ("onnx.GraphProto", "initializer"),
    ("onnx.GraphProto", "sparse_initializer"),
    ("onnx.GraphProto", "node"),
    ("onnx.FunctionProto", "node"),
    ("onnx.FunctionProto", "attribute_proto"),
    ("onnx.NodeProto", "attribute"),
    ("onnx.AttributeProto", "t"),
    ("onnx.AttributeProto", "tensors"),
    ("onnx.AttributeProto", "sparse_tensor"),
    ("onnx.AttributeProto", "sparse_tensors"),
    ("onnx.AttributeProto", "g"),
    ("onnx.AttributeProto", "graphs"),
    ("onnx.SparseTensorProto", "values"),
    ("onnx.SparseTensorProto", "indices"),
}
"""The (message, field) edges onnx_tensors.every_tensor follows."""


def _edges_to_tensors() -> set[tuple[str, str]]:
    """Every message-typed field, reachable from ModelProto, through which a TensorProto can be
    reached: computed from the protobuf descriptors of the installed onnx."""
    edges: dict[str, list[tuple[str, str]]] = {}
    pending, seen = [onnx.ModelProto.DESCRIPTOR], set()
    while pending:
        message = pending.pop()
        if message.full_name in seen:
            continue
        seen.add(message.full_name)
        for field in message.fields:
            if field.message_type is not None:
                edges.setdefault(message.full_name, []).append((field.name, field.message_type.full_name))
                pending.append(field.message_type)
    leads: set[str] = {"onnx.TensorProto"}
    changed = True
    while changed:  # a message leads to a tensor when one of its fields does
        changed = False
        for message, fields in edges.items():
            if message not in leads and any(target in leads for _, target in fields):
                leads.add(message)
                changed = True
    return {
        (message, name)
        for message, fields in edges.items()
        if message != "onnx.TensorProto"
        for name, target in fields
        if target in leads
    }


def test_walker_follows_every_field_that_can_hold_a_tensor() -> None:
    assert _edges_to_tensors() == WALKED


def _ext(name: str, location: str) -> TensorProto:
    proto = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[1], data_location=TensorProto.EXTERNAL)
    proto.external_data.add(key="location", value=location)
    return proto


def _sparse(name: str, location: str) -> onnx.SparseTensorProto:
    indices = helper.make_tensor(f"{name}_i", TensorProto.INT64, [1], [0])
    return helper.make_sparse_tensor(_ext(name, location), indices, [4])


def _planted() -> tuple[onnx.ModelProto, set[str]]:
    """A model with an external tensor in each place a TensorProto can sit; returns the names."""
    sub_sparse = [_sparse("sub_sp", "x")]
    sub = helper.make_graph([], "sub", [], [], [_ext("sub_init", "x")], sparse_initializer=sub_sparse)
    node = helper.make_node("Custom", [], ["o"], domain="example", t=_ext("attr_t", "x"), g=sub)
    extra = node.attribute.add(name="ts", type=AttributeProto.TENSORS)
    extra.tensors.append(_ext("attr_ts", "x"))
    sparse_attr = node.attribute.add(name="sp", type=AttributeProto.SPARSE_TENSOR)
    sparse_attr.sparse_tensor.CopyFrom(_sparse("attr_sp", "x"))
    sparse_list = node.attribute.add(name="sps", type=AttributeProto.SPARSE_TENSORS)
    sparse_list.sparse_tensors.append(_sparse("attr_sps", "x"))
    graphs = node.attribute.add(name="gs", type=AttributeProto.GRAPHS)
    graphs.graphs.append(helper.make_graph([], "g2", [], [], [_ext("graphs_init", "x")]))
    graph = helper.make_graph(
        [node], "main", [], [], [_ext("init", "x")], sparse_initializer=[_sparse("sparse", "x")]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    body = helper.make_node("Constant", [], ["y"], value=_ext("fn_const", "x"))
    function = helper.make_function("example", "F", [], ["y"], [body], [helper.make_opsetid("", 17)])
    default = function.attribute_proto.add(name="scale", type=AttributeProto.TENSOR)
    default.t.CopyFrom(_ext("fn_default", "x"))
    model.functions.append(function)
    init_graph = helper.make_graph([], "ti", [], [], [_ext("train_init", "x")])
    algo_graph = helper.make_graph([], "ta", [], [], [_ext("train_algo", "x")])
    model.training_info.add(initialization=init_graph, algorithm=algo_graph)
    names = {
        "init", "sparse", "sub_init", "sub_sp", "attr_t", "attr_ts", "attr_sp", "attr_sps", "graphs_init",
        "fn_const", "fn_default", "train_init", "train_algo",
    }  # fmt: skip
    return model, names


def test_every_planted_external_tensor_is_found() -> None:
    model, names = _planted()
    external = {t.name for _, t in every_tensor(model) if t.data_location == TensorProto.EXTERNAL}
    assert external == names


PLACES = "sparse sub_sp attr_sp attr_sps attr_ts fn_const fn_default train_init train_algo".split()
"""Tensors tieaudit never reads as tensors, each in a different place."""


@pytest.mark.parametrize("place", PLACES)
def test_a_location_outside_the_folder_is_refused_wherever_it_sits(place: str, tmp_path: Path) -> None:
    """Each place on its own (the others moved inside the folder): tieaudit refuses the escape."""
    model, _ = _planted()
    (tmp_path / "x").write_bytes(np.zeros(1, np.float32).tobytes())  # each tensor: one float
    for _, tensor in every_tensor(model):
        if tensor.data_location == TensorProto.EXTERNAL and tensor.name == place:
            tensor.external_data[0].value = "../outside.bin"
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(UnsafeInputError, match=r"contains '\.\.'"):
        OnnxReader().read(str(path))


def test_tensors_inside_the_folder_are_confined_and_accepted(tmp_path: Path) -> None:
    model, _ = _planted()
    (tmp_path / "x").write_bytes(np.zeros(1, np.float32).tobytes())  # each tensor: one float
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with OnnxReader().read(str(path)) as opened:
        ckpt = opened.checkpoint
        assert {t.name for t in ckpt.tensors} >= {"init"}
        assert "sparse" in {s.name for s in ckpt.skipped}
