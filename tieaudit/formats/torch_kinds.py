"""Stand-ins for the tensor kinds torch.load(weights_only=True) rebuilds that tieaudit lists, not reads.

Quantized (``_rebuild_qtensor``), sparse COO/CSR/CSC/BSR/BSC (``_rebuild_sparse_tensor``), nested
(``_rebuild_nested_tensor``), converted or moved while loading (``_rebuild_device_tensor_from_cpu_tensor``,
``_rebuild_device_tensor_from_numpy``) and wrapper subclasses (``_rebuild_wrapper_subclass``). Each
stand-in checks its arguments as torch's function does (refusing what torch refuses, checked in
tests/test_trust2_nodrop.py) and returns an ``OpaqueTensor``: the reader lists it under its name
with its kind, dtype and shape, the audit never reads its bytes as values, and convert and retie
account for it (``repair.entries``). Nothing here allocates what the arguments describe.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tieaudit.formats.torch_records import (
    QUANTIZED_ITEMSIZE,
    DtypeToken,
    Global,
    Opaque,
    OpaqueTensor,
    Placeholder,
    StorageRef,
    TensorRecord,
    bad,
    check_arity,
    check_int,
    check_ints,
    check_requires_grad,
    packed_end,
)

SPARSE_LAYOUTS = frozenset(f"torch.sparse_{name}" for name in ("coo", "csr", "csc", "bsr", "bsc"))
"""Layouts torch._utils._rebuild_sparse_tensor rebuilds (any other it refuses)."""

Tensorish = TensorRecord | OpaqueTensor


def _tensor(value: object, what: str) -> Tensorish:
    if not isinstance(value, (TensorRecord, OpaqueTensor)):
        bad(f"{what} is a {type(value).__name__}, not a tensor (torch fails)")
    return value


def _dims(value: object, what: str) -> tuple[int, ...]:
    """A size given as torch.Size or as a tuple of ints."""
    if isinstance(value, Opaque) and value.kind == "torch.Size" and isinstance(value.value, tuple):
        return value.value
    return check_ints(value, what)


def _fits(storage: StorageRef, offset: int, shape: tuple[int, ...], *, strides: tuple[int, ...]) -> None:
    """torch's setStorage bound: the view's last element lies inside the storage."""
    if len(shape) != len(strides):
        bad(f"tensor has {len(shape)} sizes but {len(strides)} strides")
    last = sum((dim - 1) * stride for dim, stride in zip(shape, strides, strict=True))
    end = offset if 0 in shape else offset + last + 1
    if packed_end(end, storage.dtype) > storage.nbytes:
        bad(f"a view reaching element {end} of a storage of {storage.numel} elements (torch refuses it)")


def _quantizer(params: object, shape: tuple[int, ...]) -> str:
    """The qscheme of _rebuild_qtensor's quantizer_params, checked as torch checks them."""
    if type(params) is not tuple or not params:
        bad("_rebuild_qtensor called with quantizer parameters that are not a tuple")
    scheme = params[0]
    name = scheme.value if isinstance(scheme, Opaque) and scheme.kind == "torch.qscheme" else None
    if name == "per_tensor_affine":
        if len(params) != 3 or type(params[1]) not in (int, float) or type(params[2]) is not int:
            bad("per_tensor_affine parameters are not (qscheme, scale, zero_point)")
        return name
    if name in ("per_channel_affine", "per_channel_affine_float_qparams"):
        if len(params) != 4 or type(params[3]) is not int or not 0 <= params[3] < len(shape):
            bad(f"{name} parameters are not (qscheme, scales, zero_points, axis in range)")
        for values in params[1:3]:
            count = len(values) if type(values) is list else None
            if isinstance(values, TensorRecord):
                count = math.prod(values.shape)
            if count != shape[params[3]]:
                bad(f"{name} scales or zero points do not match the size of the channel axis (torch refuses)")
        return name
    bad(f"a quantized tensor with qscheme {name or type(scheme).__name__}, which torch cannot rebuild")


def rebuild_qtensor(*args: object) -> OpaqueTensor:
    """``_rebuild_qtensor(storage, offset, size, stride, quantizer_params, requires_grad, hooks)``."""
    check_arity("_rebuild_qtensor", args, 7)
    storage = args[0]
    if not isinstance(storage, StorageRef) or storage.dtype not in QUANTIZED_ITEMSIZE:
        what = storage.dtype if isinstance(storage, StorageRef) else type(storage).__name__
        bad(f"a quantized tensor over a {what} storage, which torch refuses")
    shape, strides = check_ints(args[2], "tensor size"), check_ints(args[3], "tensor stride")
    _fits(storage, check_int(args[1], "storage offset"), shape, strides=strides)
    scheme = _quantizer(args[4], shape)
    check_requires_grad(args[5], storage.dtype)
    return OpaqueTensor(kind=f"quantized ({scheme})", dtype=storage.dtype, shape=shape)


def rebuild_sparse_tensor(*args: object) -> OpaqueTensor:
    """``_rebuild_sparse_tensor(layout, data)``: COO (indices, values, size[, coalesced]) or a
    compressed layout (compressed indices, plain indices, values, size)."""
    check_arity("_rebuild_sparse_tensor", args, 2)
    layout, data = args
    name = layout.value if isinstance(layout, Opaque) and layout.kind == "torch.layout" else None
    if not isinstance(name, str) or name not in SPARSE_LAYOUTS:
        bad(f"rebuilding a sparse tensor for layout {name or type(layout).__name__}, which torch refuses")
    if type(data) is not tuple:
        bad("_rebuild_sparse_tensor called with data that is not a tuple")
    counts = (3, 4) if name == "torch.sparse_coo" else (4,)
    if len(data) not in counts:
        bad(f"{name} data of {len(data)} parts")
    parts = data[:2] if name == "torch.sparse_coo" else data[:3]
    values = _tensor(parts[-1], f"a {name} tensor's values")
    for index in parts[:-1]:
        if _tensor(index, f"a {name} tensor's indices").dtype not in ("int64", "int32"):
            bad(f"a {name} tensor with indices that are not integers (torch refuses)")
    shape = _dims(data[2] if name == "torch.sparse_coo" else data[3], "sparse tensor size")
    if name == "torch.sparse_coo" and len(data) == 4 and data[3] is not None and type(data[3]) is not bool:
        bad("a sparse COO tensor whose is_coalesced is not a bool")
    return OpaqueTensor(kind=f"sparse ({name.removeprefix('torch.')})", dtype=values.dtype, shape=shape)


def rebuild_nested_tensor(*args: object) -> OpaqueTensor:
    """``_rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)``."""
    check_arity("_rebuild_nested_tensor", args, 4)
    buffer = _tensor(args[0], "a nested tensor's buffer")
    sizes, strides, offsets = args[1:]
    if not all(isinstance(t, TensorRecord) and t.dtype == "int64" for t in (sizes, strides, offsets)):
        bad("a nested tensor whose sizes, strides or offsets are not int64 tensors (torch refuses)")
    assert isinstance(sizes, TensorRecord) and isinstance(strides, TensorRecord)
    assert isinstance(offsets, TensorRecord)
    if sizes.shape != strides.shape or len(sizes.shape) != 2 or offsets.shape != sizes.shape[:1]:
        bad("a nested tensor whose sizes, strides and offsets disagree in shape (torch refuses)")
    return OpaqueTensor(kind=f"nested ({sizes.shape[0]} components)", dtype=buffer.dtype, shape=None)


def _device_name(device: object) -> str:
    if isinstance(device, Opaque) and device.kind == "torch.device" and isinstance(device.value, str):
        return device.value
    if type(device) is str and device:
        return device
    bad(f"a device given as a {type(device).__name__}, not a device name")


def rebuild_from_cpu_tensor(*args: object) -> Tensorish:
    """``_rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad)``: ``data.to``;
    on the CPU with data's own dtype torch returns data itself (the same storage), else a new tensor."""
    check_arity("_rebuild_device_tensor_from_cpu_tensor", args, 4)
    data = _tensor(args[0], "the tensor to convert")
    if not isinstance(args[1], DtypeToken):
        bad("_rebuild_device_tensor_from_cpu_tensor called without a dtype")
    device, dtype = _device_name(args[2]), args[1].name
    check_requires_grad(args[3], dtype)
    if device.partition(":")[0] == "cpu" and dtype == data.dtype:
        return data
    return OpaqueTensor(kind=f"converted to {dtype} on {device} while loading", dtype=dtype, shape=data.shape)


def rebuild_from_numpy(*args: object) -> OpaqueTensor:
    """``_rebuild_device_tensor_from_numpy(data, dtype, device, requires_grad)``: data is a numpy
    array, whose globals torch's default allowlist refuses (they are placeholders here)."""
    check_arity("_rebuild_device_tensor_from_numpy", args, 4)
    if not isinstance(args[0], Placeholder):
        what = type(args[0]).__name__
        bad(f"_rebuild_device_tensor_from_numpy of a {what}, not a numpy array (torch fails)")
    if not isinstance(args[1], DtypeToken):
        bad("_rebuild_device_tensor_from_numpy called without a dtype")
    _device_name(args[2])
    check_requires_grad(args[3], args[1].name)
    return OpaqueTensor(kind=f"made from {args[0].name[:80]} while loading", dtype=args[1].name, shape=None)


def rebuild_wrapper_subclass(*args: object) -> OpaqueTensor:
    """``_rebuild_wrapper_subclass(cls, dtype, size, stride, offset, layout, device, requires_grad)``:
    a tensor with no storage of its own, of a class defining ``__torch_dispatch__``."""
    check_arity("_rebuild_wrapper_subclass", args, 8)
    cls, dtype = args[0], args[1]
    if isinstance(cls, Global):  # torch.Tensor, Parameter: no allowlisted class defines it
        bad(f"_rebuild_wrapper_subclass of {cls.name}, which torch refuses (no __torch_dispatch__)")
    if not isinstance(cls, Placeholder) or not isinstance(dtype, DtypeToken):
        bad("_rebuild_wrapper_subclass called without a class and a dtype")
    shape = _dims(args[2], "tensor size")
    if len(shape) != len(check_ints(args[3], "tensor stride")):
        bad("a wrapper subclass tensor with unequal numbers of sizes and strides")
    check_int(args[4], "storage offset")
    _device_name(args[6])
    check_requires_grad(args[7], dtype.name)
    return OpaqueTensor(kind=f"{cls.name[:80]} wrapper subclass (no storage)", dtype=dtype.name, shape=shape)


REBUILDERS: dict[str, Callable[..., object]] = {
    "_rebuild_qtensor": rebuild_qtensor,
    "_rebuild_sparse_tensor": rebuild_sparse_tensor,
    "_rebuild_nested_tensor": rebuild_nested_tensor,
    "_rebuild_device_tensor_from_cpu_tensor": rebuild_from_cpu_tensor,
    "_rebuild_device_tensor_from_numpy": rebuild_from_numpy,
    "_rebuild_wrapper_subclass": rebuild_wrapper_subclass,
}
"""torch._utils rebuild functions of the kinds above, by name (torch_globals adds them to its own)."""
