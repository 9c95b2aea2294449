"""ONNX's protobuf messages without ``import onnx``: onnx's own schema, parsed by the protobuf runtime.

``import onnx`` costs about a second (through ``ml_dtypes``, which initialises every float8 type),
the protobuf runtime it parses with a few milliseconds. Reading a model therefore builds the
message classes from onnx's own ``FileDescriptorProto`` (``onnx_descriptor``, captured from the
installed onnx by ``scripts/gen_onnx_descriptor.py``) in a private descriptor pool, and parses with
them exactly as ``onnx.load_model_from_string`` parses: the same schema, the same parser, the same
check that every byte was consumed. Messages built here are read, never edited: writers that
change a model with ``onnx.helper`` parse it with onnx's classes (``for_writing``).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, cast

from tieaudit.core.errors import InputError, one_line
from tieaudit.formats.onnx_descriptor import SERIALIZED

if TYPE_CHECKING:
    from onnx import ModelProto, TensorProto

EXTERNAL = 1
"""TensorProto.DataLocation.EXTERNAL (checked against the schema by tests/test_onnx_proto.py)."""


@cache
def _classes() -> tuple[type[ModelProto], type[TensorProto]]:
    from google.protobuf import descriptor_pool, message_factory  # type: ignore[import-untyped,unused-ignore]

    pool = descriptor_pool.DescriptorPool()  # private: onnx may register the same names in the default pool
    pool.AddSerializedFile(SERIALIZED)
    model = message_factory.GetMessageClass(pool.FindMessageTypeByName("onnx.ModelProto"))
    tensor = message_factory.GetMessageClass(pool.FindMessageTypeByName("onnx.TensorProto"))
    return cast("type[ModelProto]", model), cast("type[TensorProto]", tensor)


@cache
def _data_type_names() -> dict[int, str]:
    enum = _classes()[1].DESCRIPTOR.enum_types_by_name["DataType"]
    return {value.number: value.name for value in enum.values}


def data_type_name(number: int) -> str:
    """TensorProto.DataType's name for number ("UNDEFINED" for a number no ONNX version defines)."""
    return _data_type_names().get(number, "UNDEFINED")


def parse_model(data: bytes, path: str, *, for_writing: bool = False) -> ModelProto:
    """data parsed as onnx.load parses a file's bytes (with onnx's own classes when for_writing);
    failures become InputError."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]

    if for_writing:
        import onnx

        model = onnx.ModelProto()
    else:
        model = _classes()[0]()
    try:
        decoded = model.ParseFromString(data)
        if decoded is not None and decoded != len(data):
            raise DecodeError(f"Protobuf decoding consumed too few bytes: {decoded} out of {len(data)}")
    except (DecodeError, ValueError, RuntimeError, TypeError) as exc:
        raise InputError(f"not a valid ONNX protobuf: {one_line(exc)}", path) from exc
    if not model.HasField("graph"):
        raise InputError("not a valid ONNX protobuf: the model has no graph", path)
    return model


_TYPED_FIELDS: dict[str, tuple[str, str]] = {
    "float32": ("float_data", "<f4"),
    "complex64": ("float_data", "<f4"),
    "float64": ("double_data", "<f8"),
    "complex128": ("double_data", "<f8"),
    "int64": ("int64_data", "<i8"),
    "uint32": ("uint64_data", "<u8"),
    "uint64": ("uint64_data", "<u8"),
}
"""Canonical dtype -> the typed field onnx.numpy_helper.to_array reads its values from, and their
type; every other supported dtype's values are in int32_data, one value per element."""


def typed_field_bytes(proto: TensorProto, dtype: str, *, numel: int, itemsize: int) -> bytes:
    """The tensor's values kept in a typed field (not raw_data), as the little-endian bytes
    numpy_helper.to_array gives: a narrow type keeps the low bytes of each value (bool, float16,
    bfloat16 and float8 bits in int32_data), complex values are pairs of floats. ValueError when
    the field holds another count than the shape needs."""
    import numpy as np

    field, storage = _TYPED_FIELDS.get(dtype, ("int32_data", "<i4"))
    values = getattr(proto, field)
    per = 2 if dtype.startswith("complex") else 1
    if len(values) != numel * per:
        raise ValueError(f"{field} holds {len(values)} values, its shape and dtype need {numel * per}")
    array = np.array(values, dtype=storage)
    if storage[1] == "f":
        return array.tobytes()
    width = array.dtype.itemsize
    return array.view(f"<u{width}").astype(f"<u{itemsize // per}").tobytes()
