"""What tieaudit hands out for the globals ``torch.load(weights_only=True)`` allows.

torch's default allowlist (``torch/_weights_only_unpickler.py:_get_allowed_globals``) maps dotted
names to torch's own callables. Here each name maps to a stand-in that checks its arguments the
way torch's function would (or refuses what torch would refuse) and returns plain records: a
``TensorRecord`` (a strided view into a storage), a ``StorageRef``, a ``DtypeToken``, a labelled
``Opaque`` leaf, or an ``OpaqueTensor`` for a tensor kind that is listed but not read (quantized,
sparse, nested, meta, ...: ``torch_kinds``). Nothing is imported; no name outside the allowlist is
ever resolved here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from tieaudit.core.dtypes import ITEMSIZE
from tieaudit.formats import torch_kinds
from tieaudit.formats.torch_builtins import BUILTINS
from tieaudit.formats.torch_records import GRAD_DTYPES as GRAD_DTYPES  # the tests check it here
from tieaudit.formats.torch_records import (
    LABEL_ITEMSIZE,
    MAX_INT64,
    NO_FLAGS,
    QUANTIZED_ITEMSIZE,
    CounterDict,
    DtypeToken,
    Global,
    Opaque,
    OpaqueTensor,
    Placeholder,
    StateDict,
    StorageRef,
    StorageType,
    TensorRecord,
    bad,
    check_arity,
    check_int,
    check_ints,
    check_requires_grad,
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

QUANTIZED_STORAGES: dict[str, str] = {
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
}
"""Quantized storage classes (``torch.`` only): a quantized tensor's bytes, listed, not read."""
assert set(QUANTIZED_STORAGES.values()) == set(QUANTIZED_ITEMSIZE)
QUANTIZED_DTYPES = frozenset(QUANTIZED_ITEMSIZE)
"""Dtypes torch has no meta (or empty) tensors of."""

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

_ints = check_ints
_requires_grad = check_requires_grad
_arity = check_arity


def _flags(metadata: object, dtype: str) -> frozenset[str]:
    """torch._utils.set_tensor_metadata's bits. torch skips falsy metadata and takes a dict of str to
    bool; only what torch.save writes is read ({"conj": True}, {"neg": True}), anything else refused."""
    if not metadata:
        return NO_FLAGS
    if type(metadata) is not dict or not all(
        key in ("conj", "neg") and type(value) is bool for key, value in metadata.items()
    ):
        bad("tensor metadata other than conj/neg bits, which tieaudit does not read")
    if "conj" in metadata and not dtype.startswith("complex"):
        bad(f"the conj bit (even unset) on a {dtype} tensor, which torch refuses")
    return frozenset(key for key in ("conj", "neg") if metadata.get(key)) or NO_FLAGS


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


def parameter(data: object = None, requires_grad: object = True) -> TensorRecord | OpaqueTensor:
    """``torch.nn.Parameter(data, requires_grad)``: the data tensor itself."""
    if not isinstance(data, (TensorRecord, OpaqueTensor)):
        bad(f"a parameter made from a {type(data).__name__}, not a tensor")
    _requires_grad(requires_grad, data.dtype)  # a meta tensor's own dtype too: int64 cannot require grad
    return data


def rebuild_parameter(*args: object) -> object:
    """``_rebuild_parameter(data, requires_grad, backward_hooks)``."""
    _arity("_rebuild_parameter", args, 3)
    return parameter(args[0], args[1])


def with_state(tensor: object, state: object) -> object:
    """tensor with the attributes state sets on it, by torch._utils._set_obj_state's rules:
    attributes must leave its data alone. They are kept on the record (flattening lists the
    tensors among them), never dropped."""
    dict_state, slots_state = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
    if isinstance(state, tuple) and len(state) != 2:
        bad("invalid serialized tensor state (torch refuses it)")
    attributes: dict[str, object] = {}
    for part in (dict_state, slots_state):
        if not part:
            continue
        if not isinstance(part, dict):
            bad(f"tensor attribute state is a {type(part).__name__}, not a dict")
        attributes.update(part)
        for key in part:
            if type(key) is not str:
                bad(f"a tensor attribute named by a {type(key).__name__}")
            if key in TENSOR_ATTRIBUTES or (key.startswith("__") and key.endswith("__")):
                bad(
                    f"a tensor sets its attribute {key[:40]!r} while loading, which changes what torch "
                    "returns; torch and tieaudit could read different data"
                )
    if not attributes or not isinstance(tensor, (TensorRecord, OpaqueTensor)):
        return tensor
    return dataclasses.replace(tensor, attributes={**(tensor.attributes or {}), **attributes})


def rebuild_parameter_with_state(*args: object) -> object:
    """``_rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)``."""
    _arity("_rebuild_parameter_with_state", args, 4)
    return with_state(parameter(args[0], args[1]), args[3])


def rebuild_meta(*args: object) -> OpaqueTensor:
    """``_rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)``: no bytes at all."""
    _arity("_rebuild_meta_tensor_no_storage", args, 4)
    if not isinstance(args[0], DtypeToken) or args[0].name in QUANTIZED_DTYPES:
        bad("_rebuild_meta_tensor_no_storage called without a dtype torch makes meta tensors of")
    shape = _ints(args[1], "tensor size")
    if len(shape) != len(_ints(args[2], "tensor stride")):
        bad("meta tensor with unequal numbers of sizes and strides")
    if math.prod(shape) > MAX_INT64:
        bad("meta tensor with more elements than int64 counts (torch refuses it)")
    _requires_grad(args[3], args[0].name)
    return OpaqueTensor(kind="meta (no data)", dtype=args[0].name, shape=shape)


_REBUILDERS: dict[str, Callable[..., object]] = {
    "_rebuild_tensor": rebuild_tensor,
    "_rebuild_tensor_v2": rebuild_tensor_v2,
    "_rebuild_tensor_v3": rebuild_tensor_v3,
    "_rebuild_parameter": rebuild_parameter,
    "_rebuild_parameter_with_state": rebuild_parameter_with_state,
    "_rebuild_meta_tensor_no_storage": rebuild_meta,
    **torch_kinds.REBUILDERS,
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
    if new_type not in (TENSOR, PARAMETER) and not isinstance(new_type, Placeholder):
        bad("_rebuild_from_type_v2 with an unexpected tensor type")
    if type(func_args) is not tuple:
        bad("_rebuild_from_type_v2 with arguments that are not a tuple")
    assert func.call is not None
    result = func.call(*func_args)
    if isinstance(new_type, Placeholder):
        # A subclass outside the allowlist (torch refuses it by default): an inert object of that
        # class holding the rebuilt tensor and its attributes, each listed under its own name.
        made = Placeholder(new_type.name, made=True, args=(result,))
        made.states = [state]
        return made
    return with_state(result, state)


_DEVICE = re.compile(r"([a-z]+)(?::(0|[1-9][0-9]{0,8}))?")
"""A device string as torch.device parses it: a type, then an index without leading zeros (nine
digits always fit the int torch parses it into; ten may not, and are refused here)."""
_UNSET = object()


def _device(kind: object = None, index: object = _UNSET) -> bool:
    """What torch.save writes: ``torch.device("cuda:0")`` or ``torch.device("cuda", 0)``.

    ``torch.device(0)`` is refused: torch resolves it to the machine's accelerator and fails on a
    machine without one, so whether it loads depends on where."""
    if type(kind) is not str:
        return False
    match = _DEVICE.fullmatch(kind)
    if match is None or match.group(1) not in DEVICE_TYPES:
        return False
    if index is _UNSET:
        return True
    if match.group(2) is not None:  # torch refuses an index in the string and another beside it
        return False
    return index is None or (type(index) is int and 0 <= index <= MAX_INT64)


def _size(*args: object) -> Opaque:
    if len(args) > 1 or (args and len(_ints(args[0], "torch.Size")) > 64):
        bad("torch.Size called with arguments tieaudit does not accept")
    return Opaque("torch.Size", tuple(args[0]) if args else ())  # type: ignore[arg-type]


def _named_label(kind: str, check: Callable[..., bool]) -> Callable[..., Opaque]:
    # A device or layout keeps its name: the rebuild functions of torch_kinds read it.
    def stand_in(*args: object) -> Opaque:
        if not check(*args):
            bad(f"{kind} called with arguments tieaudit does not accept")
        name = args[0] if args and type(args[0]) is str else None
        return Opaque(kind, name)

    return stand_in


def _ordered_dict(*args: object) -> StateDict:
    if len(args) > 1 or (args and type(args[0]) not in (dict, StateDict, list, tuple)):
        bad("OrderedDict called with unexpected arguments")
    if args and type(args[0]) in (list, tuple):
        if not _PAIRS.issuperset(map(type, args[0])) or set(map(len, args[0])) - {2}:  # type: ignore[call-overload]
            bad("OrderedDict called with items that are not pairs")
    return StateDict(*args)


_PAIRS = frozenset((list, tuple))


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
        "torch.Size": _size,
        "torch.device": _named_label("torch.device", _device),
        "torch.serialization._get_layout": _named_label(
            "torch.layout", lambda *a: len(a) == 1 and a[0] in LAYOUTS
        ),
        **BUILTINS,
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
    allowed.update({f"torch.{name}": StorageType(dtype, True) for name, dtype in QUANTIZED_STORAGES.items()})
    allowed["torch.storage.UntypedStorage"] = StorageType("uint8", False)
    allowed.update({f"torch.{name}": DtypeToken(name) for name in (*ITEMSIZE, *LABEL_ITEMSIZE)})
    for scheme in (
        "per_tensor_affine",
        "per_tensor_symmetric",
        "per_channel_affine",
        "per_channel_symmetric",
        "per_channel_affine_float_qparams",
    ):
        allowed[f"torch.{scheme}"] = Opaque("torch.qscheme", scheme)
    return allowed


ALLOWLIST: dict[str, object] = _allowlist()
"""Every global tieaudit reads, by dotted name, mapped to its stand-in (a subset of torch's)."""

NOT_READ = {
    "torch.storage.TypedStorage": "TypedStorage objects",
    # registered by `import torch` itself (add_safe_globals), so on torch's default allowlist
    **{f"torch.nested._internal.nested_tensor.{n}": "nested jagged tensors" for n in ("NestedTensor",
                                                                                     "_rebuild_njt")},
    **{f"torch.distributed._mesh_layout.{n}": "device-mesh layouts" for n in ("_FlatLayout", "_MeshLayout")},
}  # fmt: skip
"""Globals torch allows that tieaudit does not read (refused as unsupported, not as unsafe)."""
