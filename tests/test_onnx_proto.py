"""The ONNX reader parses without ``import onnx`` (issue 25): onnx's own schema, captured as data, in
the protobuf runtime onnx parses with. These tests hold the captured schema, the constants and the
typed-field decoding to onnx's own (``onnx.numpy_helper.to_array`` is the reference)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, onnx_ml_pb2

from tieaudit.core.dtypes import itemsize
from tieaudit.core.errors import InputError
from tieaudit.formats.onnx_descriptor import SERIALIZED
from tieaudit.formats.onnx_model import ONNX_DTYPES
from tieaudit.formats.onnx_proto import EXTERNAL, data_type_name, parse_model, typed_field_bytes


def test_the_committed_schema_is_the_installed_onnxs() -> None:
    assert SERIALIZED == onnx_ml_pb2.DESCRIPTOR.serialized_pb, "run `make onnx-descriptor` and commit"


def test_constants_and_type_names_are_onnxs() -> None:
    assert EXTERNAL == onnx.TensorProto.EXTERNAL
    for number in onnx.TensorProto.DataType.values():
        assert data_type_name(number) == onnx.TensorProto.DataType.Name(number)
    assert data_type_name(9999) == "UNDEFINED"
    assert data_type_name(-1) == "UNDEFINED"


def _parsed_alike(data: bytes) -> None:
    ours = parse_model(data, "m.onnx")
    theirs = onnx.load_model_from_string(data)
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)
    assert type(ours) is not type(theirs)  # really parsed without onnx's classes


def test_models_parse_as_onnx_parses_them(corpus: Any) -> None:
    files = sorted((corpus.root / "onnx").rglob("*.onnx"))
    assert len(files) >= 5
    for path in files:
        _parsed_alike(path.read_bytes())


def test_bytes_onnx_refuses_are_refused(corpus: Any) -> None:
    data = (corpus.root / "onnx" / "helper_shared.onnx").read_bytes()
    for bad in (data[:-3], data + b"\xff", b"\x08\x07\x3a\x05\x0a"):
        with pytest.raises(Exception):  # noqa: B017  (onnx raises DecodeError)
            onnx.load_model_from_string(bad)
        with pytest.raises(InputError, match="not a valid ONNX protobuf"):
            parse_model(bad, "m.onnx")
    with pytest.raises(InputError, match="has no graph"):
        parse_model(b"\x08\x07", "m.onnx")


def test_writers_get_onnxs_own_classes(corpus: Any) -> None:
    model = parse_model(
        (corpus.root / "onnx" / "helper_shared.onnx").read_bytes(), "m.onnx", for_writing=True
    )
    assert isinstance(model, onnx.ModelProto)
    model.graph.node.append(helper.make_node("Identity", ["a"], ["b"]))  # onnx.helper's messages fit


def _values(dtype: str, count: int, rng: np.random.Generator) -> list[int] | list[float]:
    if dtype in ("float32", "float64", "complex64", "complex128"):
        return [float(v) for v in rng.standard_normal(count * (2 if dtype.startswith("complex") else 1))]
    # bits as the writer keeps them, including values wider than the type (only low bytes count)
    top = {"int64": 2**62, "uint64": 2**63, "uint32": 2**40}.get(dtype, 2**31 - 1)
    low = 0 if dtype.startswith("uint") and dtype in ("uint32", "uint64") else -(2**31)
    if dtype == "int64":
        low = -(2**62)
    return [int(v) for v in rng.integers(low, top, size=count)]


@pytest.mark.parametrize("dtype", sorted(set(ONNX_DTYPES.values())))
def test_typed_fields_decode_to_numpy_helpers_bytes(dtype: str) -> None:
    rng = np.random.default_rng(7)
    type_name = next(name for name, value in ONNX_DTYPES.items() if value == dtype)
    number = onnx.TensorProto.DataType.Value(type_name)
    proto = onnx.TensorProto(data_type=number, dims=[3, 5], name="t")
    field = onnx.helper.tensor_dtype_to_field(number)
    getattr(proto, field).extend(_values(dtype, 15, rng))
    expected = numpy_helper.to_array(proto).tobytes()
    assert typed_field_bytes(proto, dtype, numel=15, itemsize=itemsize(dtype)) == expected
    assert len(expected) == 15 * itemsize(dtype)


def test_a_typed_field_of_the_wrong_length_is_refused() -> None:
    proto = onnx.TensorProto(data_type=onnx.TensorProto.FLOAT, dims=[4], float_data=[1.0, 2.0])
    with pytest.raises(ValueError, match="float_data holds 2 values, its shape and dtype need 4"):
        typed_field_bytes(proto, "float32", numel=4, itemsize=4)
