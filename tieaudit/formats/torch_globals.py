"""What tieaudit hands out for the globals ``torch.load(weights_only=True)`` allows.

torch's default allowlist (``torch/_weights_only_unpickler.py:_get_allowed_globals``) maps dotted
names to torch's own callables. Here each name maps to a stand-in that checks its arguments the
way torch's function would (or refuses what torch would refuse) and returns plain records: a
``TensorRecord`` (a strided view into a storage), a ``StorageRef``, a ``DtypeToken`` or a labelled
``Opaque`` leaf. Nothing is imported; no name outside the allowlist is ever resolved here.
"""

from __future__ import annotations

from collections.abc import Callable

from tieaudit.core.dtypes import ITEMSIZE
from tieaudit.formats.torch_records import (
    MAX_INT64,
    NO_FLAGS,
    CounterDict,
    DtypeToken,
    Global,
    Opaque,
    StateDict,
    StorageRef,
    StorageType,
    TensorRecord,
    bad,
    check_int,
)

STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
}
"""Legacy typed storage classes (``torch.`` and ``torch.cuda.``) and their element dtype."""

_LABEL_ONLY_DTYPES = (
    "complex32 float4_e2m1fn_x2 float8_e8m0fnu bits16 bits1x8 bits2x4 bits4x2 bits8 "
    "qint32 qint8 quint2x4 quint4x2 quint8 " + " ".join(f"int{n} uint{n}" for n in range(1, 8))
).split()
"""Dtypes torch's allowlist names that tieaudit cannot view as numpy: allowed as labels only."""

GRAD_DTYPES = frozenset(
    "bfloat16 complex128 complex32 complex64 float16 float32 float4_e2m1fn_x2 float64 float8_e4m3fn "
    "float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu".split()
)
"""Dtypes whose tensors torch lets require gradients (others fail to load with requires_grad)."""

TENSOR_ATTRIBUTES = frozenset(
    "H T __class__ __cuda_array_interface__ __dict__ __weakref__ _backward_hooks _base _cdata _grad "
    "_grad_fn _has_symbolic_sizes_strides _post_accumulate_grad_hooks _python_dispatch _version data "
    "device dtype grad grad_dtype grad_fn imag is_cpu is_cuda is_ipu is_leaf is_maia is_meta is_mkldnn "
    "is_mps is_mtia is_nested is_quantized is_sparse is_sparse_csr is_vulkan is_xla is_xpu itemsize "
    "layout mH mT name nbytes ndim output_nr real requires_grad retains_grad shape volatile".split()
)
"""Data descriptors of torch.Tensor and Parameter: a pickled attribute state setting one of them
(``data``, ``real``, ...) changes or replaces the tensor torch returns."""

LAYOUTS = frozenset(
    f"torch.{name}"
    for name in "strided sparse_coo sparse_csr sparse_csc sparse_bsr sparse_bsc _mkldnn jagged".split()
)
"""Names torch.serialization._get_layout knows."""

DEVICE_TYPES = frozenset(
    "cpu cuda mps xpu xla meta hip ve fpga maia vulkan ipu hpu lazy mtia privateuseone mkldnn opengl "
    "opencl ideep".split()
)
"""Device type names torch.device accepts."""


def _ints(value: object, what: str) -> tuple[int, ...]:
    if type(value) is not tuple and type(value) is not list:
        bad(f"{what} is {type(value).__name__}, expected a tuple of ints")
    items: tuple[object, ...] = tuple(value)
    for item in items:
        if type(item) is not int or item < 0 or item > MAX_INT64:
            return tuple(check_int(each, what) for each in items)  # raises, naming the problem
    return items  # type: ignore[return-value]


def _requires_grad(value: object, dtype: str) -> None:
    if type(value) is not bool:
        bad(f"requires_grad is {type(value).__name__}, expected a bool (torch refuses it)")
    if value and dtype not in GRAD_DTYPES:
        bad(f"a tensor of dtype {dtype} requires gradients, which torch refuses to load")


def _flags(metadata: object, dtype: str) -> frozenset[str]:
    if not metadata:
        return NO_FLAGS
    if type(metadata) is not dict:
        bad(f"tensor metadata is {type(metadata).__name__}, expected a dict")
    flags = frozenset(key for key in ("conj", "neg") if metadata.get(key)) or NO_FLAGS
    if "conj" in flags and not dtype.startswith("complex"):
        bad(f"the conj bit on a {dtype} tensor, which torch refuses")
    return flags


def _view(args: tuple[object, ...], dtype: str | None, metadata: object = None) -> TensorRecord:
    storage, offset, size, stride = args[:4]
    if not isinstance(storage, StorageRef):
        bad(f"tensor rebuilt from a {type(storage).__name__}, not a storage")
    shape, strides = _ints(size, "tensor size"), _ints(stride, "tensor stride")
    if len(shape) != len(strides):
        bad(f"tensor has {len(shape)} sizes but {len(strides)} strides")
    dtype = dtype or storage.dtype
    return TensorRecord(
        storage=storage,
        dtype=dtype,
        offset=check_int(offset, "storage offset"),
        shape=shape,
        strides=strides,
        flags=_flags(metadata, dtype),
    )


def _arity(name: str, args: tuple[object, ...], *counts: int) -> None:
    if len(args) not in counts:
        bad(f"{name} called with {len(args)} arguments")


def rebuild_tensor(*args: object) -> TensorRecord:
    """``torch._utils._rebuild_tensor(storage, storage_offset, size, stride)``."""
    _arity("_rebuild_tensor", args, 4)
    return _view(args, None)


def rebuild_tensor_v2(*args: object) -> TensorRecord:
    """``_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])``."""
    _arity("_rebuild_tensor_v2", args, 6, 7)
    record = _view(args, None, args[6] if len(args) == 7 else None)
    _requires_grad(args[4], record.dtype)
    return record


def rebuild_tensor_v3(*args: object) -> TensorRecord:
    """``_rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])``."""
    _arity("_rebuild_tensor_v3", args, 7, 8)
    if not isinstance(args[6], DtypeToken):
        bad("_rebuild_tensor_v3 called without a dtype")
    record = _view(args, args[6].name, args[7] if len(args) == 8 else None)
    _requires_grad(args[4], record.dtype)
    return record


def parameter(data: object = None, requires_grad: object = True) -> TensorRecord | Opaque:
    """``torch.nn.Parameter(data, requires_grad)``: the data tensor itself."""
    if not isinstance(data, (TensorRecord, Opaque)) or (
        isinstance(data, Opaque) and data.kind != "meta tensor"
    ):
        bad(f"a parameter made from a {type(data).__name__}, not a tensor")
    _requires_grad(requires_grad, data.dtype if isinstance(data, TensorRecord) else "float32")
    return data


def rebuild_parameter(*args: object) -> object:
    """``_rebuild_parameter(data, requires_grad, backward_hooks)``."""
    _arity("_rebuild_parameter", args, 3)
    return parameter(args[0], args[1])


def check_state(state: object) -> None:
    """torch._utils._set_obj_state's rules: attributes set on a tensor must leave its data alone."""
    dict_state, slots_state = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
    if isinstance(state, tuple) and len(state) != 2:
        bad("invalid serialized tensor state (torch refuses it)")
    for part in (dict_state, slots_state):
        if not part:
            continue
        if not isinstance(part, dict):
            bad(f"tensor attribute state is a {type(part).__name__}, not a dict")
        for key in part:
            if type(key) is not str:
                bad(f"a tensor attribute named by a {type(key).__name__}")
            if key in TENSOR_ATTRIBUTES or (key.startswith("__") and key.endswith("__")):
                bad(
                    f"a tensor sets its attribute {key[:40]!r} while loading, which changes what torch "
                    "returns; torch and tieaudit could read different data"
                )


def rebuild_parameter_with_state(*args: object) -> object:
    """``_rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)``."""
    _arity("_rebuild_parameter_with_state", args, 4)
    check_state(args[3])
    return parameter(args[0], args[1])


def rebuild_meta(*args: object) -> Opaque:
    """``_rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)``: no bytes to audit."""
    _arity("_rebuild_meta_tensor_no_storage", args, 4)
    if not isinstance(args[0], DtypeToken):
        bad("_rebuild_meta_tensor_no_storage called without a dtype")
    if len(_ints(args[1], "tensor size")) != len(_ints(args[2], "tensor stride")):
        bad("meta tensor with unequal numbers of sizes and strides")
    _requires_grad(args[3], args[0].name)
    return Opaque("meta tensor")


_REBUILDERS: dict[str, Callable[..., object]] = {
    "_rebuild_tensor": rebuild_tensor,
    "_rebuild_tensor_v2": rebuild_tensor_v2,
    "_rebuild_tensor_v3": rebuild_tensor_v3,
    "_rebuild_parameter": rebuild_parameter,
    "_rebuild_parameter_with_state": rebuild_parameter_with_state,
    "_rebuild_meta_tensor_no_storage": rebuild_meta,
}
TENSOR = Global("torch.Tensor")
"""The tensor class: a type for _rebuild_from_type_v2; calling it (legacy constructor) is refused."""
PARAMETER = Global("torch.nn.parameter.Parameter", call=parameter, new=parameter)


def rebuild_from_type_v2(*args: object) -> object:
    """``torch._tensor._rebuild_from_type_v2(func, new_type, args, state)`` (tensors with attributes)."""
    _arity("_rebuild_from_type_v2", args, 4)
    func, new_type, func_args, state = args
    if not isinstance(func, Global) or func.call not in _REBUILDERS.values():
        bad("_rebuild_from_type_v2 with a function other than a tensor rebuild")
    if new_type not in (TENSOR, PARAMETER) or type(func_args) is not tuple:
        bad("_rebuild_from_type_v2 with an unexpected tensor type or arguments")
    assert func.call is not None
    result = func.call(*func_args)
    check_state(state)
    return result


def _encode(text: object, encoding: object = "utf-8") -> bytes:
    # Protocol 2 spells bytes as _codecs.encode(str, "latin1"); only that and UTF-8 are accepted.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        bad("_codecs.encode called with unexpected arguments")
    try:
        return text.encode("latin-1" if encoding in ("latin1", "latin-1") else "utf-8")
    except UnicodeEncodeError:
        bad("_codecs.encode of text that does not encode (torch fails too)")


def _labelled(kind: str, check: Callable[..., bool]) -> Callable[..., Opaque]:
    def stand_in(*args: object) -> Opaque:
        # Never builds what the arguments ask for (a range, a sized buffer): only checks them.
        if not check(*args):
            bad(f"{kind} called with arguments tieaudit does not accept")
        return Opaque(kind)

    return stand_in


def _device(kind: object = None, index: object = None) -> bool:
    if type(kind) is int:
        return index is None and 0 <= kind <= MAX_INT64
    if type(kind) is not str or (index is not None and type(index) is not int):
        return False
    name, _, number = kind.partition(":")
    return name in DEVICE_TYPES and (not number or (number.isdigit() and len(number) < 10 and index is None))


def _complex(*args: object) -> bool:
    if len(args) > 2 or not all(type(arg) in (int, float, str) for arg in args):
        return False
    try:
        complex(*args)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _scalars(*args: object) -> bool:
    scalars = (str, int, float, bool, type(None), bytes, DtypeToken)
    if len(args) > 1 or (args and type(args[0]) not in (list, tuple)):
        return False
    return all(isinstance(item, scalars) for item in args[0]) if args else True  # type: ignore[attr-defined]


def _bytearray(*args: object) -> bool:
    if len(args) == 2:
        _encode(args[0], args[1])
        return True
    return len(args) <= 1 and all(type(arg) is bytes for arg in args)


def _size(*args: object) -> bool:
    return len(args) <= 1 and all(len(_ints(arg, "torch.Size")) <= 64 for arg in args)


def _ordered_dict(*args: object) -> StateDict:
    if len(args) > 1 or (args and type(args[0]) not in (dict, StateDict, list, tuple)):
        bad("OrderedDict called with unexpected arguments")
    if args and type(args[0]) in (list, tuple):
        if not all(type(pair) in (list, tuple) and len(pair) == 2 for pair in args[0]):  # type: ignore[attr-defined]
            bad("OrderedDict called with items that are not pairs")
    return StateDict(*args)


def _counter(*args: object) -> CounterDict:
    if len(args) > 1 or (args and type(args[0]) not in (dict, StateDict, CounterDict)):
        bad("Counter called with arguments tieaudit does not accept")
    return CounterDict(*args)


def _functions() -> dict[str, Global]:
    functions = {
        f"torch._utils.{name}": Global(f"torch._utils.{name}", call=f) for name, f in _REBUILDERS.items()
    }
    singles: dict[str, Callable[..., object]] = {
        "torch._tensor._rebuild_from_type_v2": rebuild_from_type_v2,
        "_codecs.encode": _encode,
        "torch.Size": _labelled("torch.Size", _size),
        "torch.device": _labelled("torch.device", _device),
        "torch.serialization._get_layout": _labelled(
            "torch.layout", lambda *a: len(a) == 1 and a[0] in LAYOUTS
        ),
        "builtins.set": _labelled("set", _scalars),
        "builtins.complex": _labelled("complex", _complex),
        "builtins.bytearray": _labelled("bytearray", _bytearray),
    }
    functions.update({name: Global(name, call=f) for name, f in singles.items()})
    functions["collections.OrderedDict"] = Global(
        "collections.OrderedDict", _ordered_dict, lambda *a: StateDict()
    )
    functions["collections.Counter"] = Global("collections.Counter", _counter, lambda *a: CounterDict())
    functions[TENSOR.name] = TENSOR
    functions[PARAMETER.name] = PARAMETER
    return functions


def _allowlist() -> dict[str, object]:
    allowed: dict[str, object] = dict(_functions())
    for module in ("torch", "torch.cuda"):
        allowed.update(
            {f"{module}.{name}": StorageType(dtype, True) for name, dtype in STORAGE_DTYPES.items()}
        )
    allowed["torch.storage.UntypedStorage"] = StorageType("uint8", False)
    allowed.update({f"torch.{name}": DtypeToken(name) for name in (*ITEMSIZE, *_LABEL_ONLY_DTYPES)})
    for scheme in (
        "per_tensor_affine",
        "per_tensor_symmetric",
        "per_channel_affine",
        "per_channel_symmetric",
    ):
        allowed[f"torch.{scheme}"] = Opaque("torch.qscheme")
    allowed["torch.per_channel_affine_float_qparams"] = Opaque("torch.qscheme")
    return allowed


ALLOWLIST: dict[str, object] = _allowlist()
"""Every global tieaudit reads, by dotted name, mapped to its stand-in (a subset of torch's)."""

NOT_READ = {
    **{f"torch._utils.{name}": "quantized, sparse, nested or subclass tensors" for name in (
        "_rebuild_qtensor", "_rebuild_sparse_tensor", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
        "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor")},
    "torch.storage.TypedStorage": "TypedStorage objects",
    **{f"torch.{name}": "quantized storages" for name in (
        "QInt32Storage", "QInt8Storage", "QUInt2x4Storage", "QUInt4x2Storage", "QUInt8Storage")},
}  # fmt: skip
"""Globals torch allows that tieaudit does not read (refused as unsupported, not as unsafe)."""
