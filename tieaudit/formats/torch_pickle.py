"""An allowlist unpickler for torch.save pickles that never runs pickle code and never imports torch.

``find_class`` hands out tieaudit's own stand-ins for the few globals torch.save writes (tensor
rebuild functions, storage types, dtypes, plain containers); any other global is refused by name.
``persistent_load`` turns torch's storage ids into ``StorageRef`` records, so the result is plain
data: dicts, lists, ``TensorRecord``s and labelled ``Opaque`` leaves.
"""

from __future__ import annotations

import pickle
import pickletools
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, NoReturn

from tieaudit.dtypes import ITEMSIZE
from tieaudit.errors import InputError, TieauditError, UnsafeInputError, UnsupportedFormatError

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

# Dtypes torch can name in a pickle that tieaudit cannot view as numpy; allowed as labels only.
_LABEL_ONLY_DTYPES = (
    "complex32 float8_e8m0fnu float4_e2m1fn_x2 bits8 bits16 bits1x8 bits2x4 bits4x2 "
    "qint8 qint32 quint8 quint4x2 quint2x4 " + " ".join(f"int{n} uint{n}" for n in range(1, 8))
).split()


def _bad(message: str) -> NoReturn:
    raise pickle.UnpicklingError(message)


class _NoBuild:
    """Refuses the BUILD opcode, which would otherwise rewrite a validated record's fields."""

    def __setstate__(self, state: object) -> None:
        _bad(f"BUILD on a {type(self).__name__} record")


@dataclass(frozen=True)
class StorageType(_NoBuild):
    """Stand-in for a torch storage class named in a persistent id."""

    dtype: str
    """Element dtype (uint8 for untyped storages)."""
    typed: bool
    """False for ``UntypedStorage``, whose numel counts bytes."""


@dataclass(frozen=True)
class DtypeToken(_NoBuild):
    """Stand-in for a ``torch.<dtype>`` global."""

    name: str
    """torch's spelling, e.g. float8_e4m3fn."""


@dataclass(frozen=True)
class StorageRef(_NoBuild):
    """A storage as a persistent id describes it."""

    key: str
    """Record key: the ``data/<key>`` member of a zip, or the legacy storage key."""
    dtype: str
    """Element dtype of the storage type (uint8 when untyped)."""
    numel: int
    """Number of elements of ``dtype`` (bytes when untyped)."""
    typed: bool
    """False for ``UntypedStorage``; its tensors say their own dtype."""
    location: str
    """Device the storage was saved from, e.g. cpu or cuda:0."""

    @property
    def nbytes(self) -> int:
        """Bytes the storage holds."""
        return self.numel * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class TensorRecord(_NoBuild):
    """What a tensor rebuild call describes: a strided view into one storage."""

    storage: StorageRef
    """The storage viewed."""
    dtype: str
    """torch dtype name of the elements."""
    offset: int
    """Element offset of element 0 in the storage (non-negative)."""
    shape: tuple[int, ...]
    """Size in elements per dimension."""
    strides: tuple[int, ...]
    """Stride in elements per dimension (non-negative)."""
    flags: frozenset[str] = field(default_factory=frozenset)
    """Set bits of torch's tensor metadata (``conj``, ``neg``): stored bytes are not the values."""


@dataclass(frozen=True)
class Opaque:
    """A value kept only as a label (torch.device, torch.Size, a set, a numpy scalar, ...)."""

    kind: str
    """What it was, e.g. ``torch.device``."""

    def __setstate__(self, state: object) -> None:
        # numpy.dtype is rebuilt with BUILD; the label is all tieaudit keeps of it.
        if self.kind != "numpy.dtype":
            _bad(f"BUILD on a {self.kind} value")


@dataclass(frozen=True)
class StandIn(_NoBuild):
    """A callable handed out for an allowlisted global; refusing BUILD keeps it unchanged across reads."""

    name: str
    """The global it stands in for, e.g. ``torch._utils._rebuild_tensor_v2``."""
    func: Callable[..., object]
    """tieaudit's own implementation, which returns plain records."""

    def __call__(self, *args: object) -> object:
        return self.func(*args)


class StateDict(OrderedDict[Any, Any]):
    """Stand-in for ``collections.OrderedDict``."""

    def __init__(self, *args: object) -> None:
        # Only finite containers: an iterable argument could otherwise loop without end.
        if len(args) > 1 or (args and not isinstance(args[0], (list, tuple, dict))):
            _bad("OrderedDict called with unexpected arguments")
        super().__init__(*args)

    def __setstate__(self, state: object) -> None:
        """Drop the state: torch keeps module version ``_metadata`` there, never tensors."""


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        _bad(f"{what} is {type(value).__name__}, expected an int")
    if value < 0:
        _bad(f"{what} is negative ({value})")
    return value


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        _bad(f"{what} is {type(value).__name__}, expected a tuple of ints")
    return tuple(_int(item, what) for item in value)


def _flags(metadata: object) -> frozenset[str]:
    if not metadata:
        return frozenset()
    if not isinstance(metadata, dict):
        _bad("tensor metadata is not a dict")
    return frozenset(str(key) for key, value in metadata.items() if value)


def _view(
    storage: object, offset: object, size: object, stride: object, dtype: str | None, metadata: object
) -> TensorRecord:
    if not isinstance(storage, StorageRef):
        _bad(f"tensor rebuilt from a {type(storage).__name__}, not a storage")
    shape, strides = _ints(size, "tensor size"), _ints(stride, "tensor stride")
    if len(shape) != len(strides):
        _bad(f"tensor has {len(shape)} sizes but {len(strides)} strides")
    offset = _int(offset, "storage offset")
    return TensorRecord(storage, dtype or storage.dtype, offset, shape, strides, _flags(metadata))


def rebuild_tensor(storage: object, offset: object, size: object, stride: object) -> TensorRecord:
    """Stand-in for ``torch._utils._rebuild_tensor``."""
    return _view(storage, offset, size, stride, None, None)


def rebuild_tensor_v2(storage: object, offset: object, size: object, stride: object, *rest: object) -> object:
    """Stand-in for ``_rebuild_tensor_v2``; rest is (requires_grad, hooks[, metadata])."""
    if len(rest) not in (2, 3):
        _bad(f"_rebuild_tensor_v2 called with {4 + len(rest)} arguments")
    return _view(storage, offset, size, stride, None, rest[2] if len(rest) == 3 else None)


def rebuild_tensor_v3(storage: object, offset: object, size: object, stride: object, *rest: object) -> object:
    """Stand-in for ``_rebuild_tensor_v3`` (dtypes without a typed storage class, e.g. float8)."""
    if len(rest) not in (3, 4) or not isinstance(rest[2], DtypeToken):
        _bad("_rebuild_tensor_v3 called without (requires_grad, hooks, dtype[, metadata])")
    return _view(storage, offset, size, stride, rest[2].name, rest[3] if len(rest) == 4 else None)


def rebuild_parameter(
    data: object, requires_grad: object = False, hooks: object = None, state: object = None
) -> TensorRecord:
    """Stand-in for ``_rebuild_parameter`` and ``_rebuild_parameter_with_state``: the data tensor."""
    if not isinstance(data, TensorRecord):
        _bad(f"parameter rebuilt from a {type(data).__name__}, not a tensor")
    return data


def rebuild_meta_tensor(*args: object) -> Opaque:
    """Stand-in for ``torch._utils._rebuild_meta_tensor_no_storage``: no bytes to audit."""
    return Opaque("meta tensor")


_TENSOR_TYPES = {("torch", "Tensor"), ("torch._tensor", "Tensor"), ("torch.nn.parameter", "Parameter")}
_TENSOR_TYPE_TOKENS = {key: Opaque(f"{key[0]}.{key[1]}") for key in _TENSOR_TYPES}
_REBUILDERS: dict[str, Callable[..., object]] = {
    "_rebuild_tensor": rebuild_tensor,
    "_rebuild_tensor_v2": rebuild_tensor_v2,
    "_rebuild_tensor_v3": rebuild_tensor_v3,
    "_rebuild_parameter": rebuild_parameter,
    "_rebuild_parameter_with_state": rebuild_parameter,
    "_rebuild_meta_tensor_no_storage": rebuild_meta_tensor,
}


def rebuild_from_type_v2(func: object, new_type: object, args: object, state: object) -> object:
    """Stand-in for ``torch._tensor._rebuild_from_type_v2`` (a tensor carrying Python attributes)."""
    if not isinstance(func, StandIn) or func.func not in _REBUILDERS.values():
        _bad("_rebuild_from_type_v2 with a function other than a tensor rebuild")
    if new_type not in _TENSOR_TYPE_TOKENS.values() or not isinstance(args, tuple):
        _bad("_rebuild_from_type_v2 with an unexpected tensor type or arguments")
    return func(*args)


def _encode(text: object, encoding: object = "utf-8") -> bytes:
    # Protocol 2 spells bytes as _codecs.encode(str, "latin1"); no other codec is looked up.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        _bad("_codecs.encode called with unexpected arguments")
    return text.encode("latin-1")


def _finite(kind: str, *accepted: type) -> Callable[..., Opaque]:
    def stand_in(*args: object) -> Opaque:
        # Never iterate a range or build a sized buffer from an int: both could exhaust memory.
        if len(args) > 3 or not all(isinstance(arg, accepted) for arg in args):
            _bad(f"{kind} called with unexpected arguments")
        return Opaque(kind)

    return stand_in


def _functions() -> dict[tuple[str, str], Callable[..., object]]:
    functions: dict[tuple[str, str], Callable[..., object]] = {
        ("torch._utils", name): rebuild for name, rebuild in _REBUILDERS.items()
    }
    functions[("torch._tensor", "_rebuild_from_type_v2")] = rebuild_from_type_v2
    functions[("torch", "Size")] = _finite("torch.Size", tuple, list)
    functions[("torch", "device")] = _finite("torch.device", str, int)
    functions[("_codecs", "encode")] = _encode
    functions[("builtins", "bytes")] = _finite("bytes", bytes)
    functions[("builtins", "bytearray")] = _finite("bytearray", bytes, str)
    functions[("builtins", "set")] = _finite("set", list, tuple)
    functions[("builtins", "frozenset")] = _finite("frozenset", list, tuple)
    functions[("builtins", "complex")] = _finite("complex", int, float)
    functions[("builtins", "slice")] = _finite("slice", int, type(None))
    functions[("builtins", "range")] = _finite("range", int)
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        functions[(module, "scalar")] = _finite("numpy scalar", Opaque, bytes)
    functions[("numpy", "dtype")] = _finite("numpy.dtype", str, bool)
    return functions


def _allowlist() -> dict[tuple[str, str], object]:
    allowed: dict[tuple[str, str], object] = {
        key: StandIn(f"{key[0]}.{key[1]}", func) for key, func in _functions().items()
    }
    allowed[("collections", "OrderedDict")] = StateDict
    for module in ("torch", "torch.cuda"):
        allowed.update({(module, name): StorageType(dtype, True) for name, dtype in STORAGE_DTYPES.items()})
    for module in ("torch", "torch.storage"):
        allowed[(module, "UntypedStorage")] = StorageType("uint8", False)
    allowed.update({("torch", name): DtypeToken(name) for name in (*ITEMSIZE, *_LABEL_ONLY_DTYPES)})
    allowed.update(_TENSOR_TYPE_TOKENS)
    return allowed


ALLOWLIST: dict[tuple[str, str], object] = _allowlist()
"""Every global a torch pickle may name, mapped to tieaudit's stand-in for it."""


_PY2_NAMES = {("__builtin__", "xrange"): ("builtins", "range")}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles torch.save's object pickle into plain data; every StorageRef it made is kept."""

    def __init__(self, stream: IO[bytes], path: str) -> None:
        super().__init__(stream, encoding="utf-8")
        self.path = path
        self.storages: dict[str, StorageRef] = {}
        """Storage records by key, in first-reference order."""

    def find_class(self, module: str, name: str) -> Any:
        # Protocol 2 (torch.save's default) spells builtins the Python 2 way; overriding
        # find_class skips pickle's own renaming, so it is done here.
        module, name = _PY2_NAMES.get(
            (module, name), ("builtins" if module == "__builtin__" else module, name)
        )
        stand_in = ALLOWLIST.get((module, name))
        if stand_in is None:
            spelled = f"{module}.{name}"
            # The name comes from the file: keep the one-line message one line and short.
            spelled = spelled if spelled.isprintable() and len(spelled) <= 120 else repr(spelled[:120])
            raise UnsafeInputError(
                f"pickle references {spelled}, which is not on the allowlist; refusing to run it",
                self.path,
            )
        return stand_in

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
            _bad(f"unexpected persistent id of type {type(pid).__name__}")
        storage_type, key, location, numel = pid[1:5]
        if len(pid) == 6 and pid[5] is not None:
            raise UnsupportedFormatError("legacy storage views (torch < 0.4) are not supported", self.path)
        if not (isinstance(storage_type, StorageType) and isinstance(key, str) and isinstance(location, str)):
            _bad("malformed storage id (expected storage type, key, location, numel)")
        ref = StorageRef(key, storage_type.dtype, _int(numel, "storage numel"), storage_type.typed, location)
        known = self.storages.setdefault(key, ref)
        if (known.dtype, known.numel, known.typed) != (ref.dtype, ref.numel, ref.typed):
            _bad(f"storage {key[:40]!r} is declared twice with different types or sizes")
        return known


# Whatever a hostile pickle can make the C unpickler or a stand-in raise.
_MALFORMED: tuple[type[BaseException], ...] = (pickle.UnpicklingError, EOFError, ValueError, TypeError)
_MALFORMED += (AttributeError, LookupError, ArithmeticError, struct.error, RecursionError, MemoryError)


_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def check_memo_indexes(stream: IO[bytes], path: str, what: str) -> None:
    """Walk the opcodes once, then rewind: refuse memo indexes no pickler writes.

    Picklers number memo entries in order, so an entry's index never exceeds the opcodes before
    it. CPython's C unpickler grows its memo array to twice the largest index and zeroes it: a
    9-byte pickle with index 2**29 makes it touch 8 GiB before anything else is checked.
    """
    start = stream.tell()
    for count, (opcode, arg, _) in enumerate(pickletools.genops(stream), start=1):
        if opcode.name in _MEMO_PUTS and isinstance(arg, int) and arg > count:
            raise InputError(
                f"{what} puts memo entry {arg} after {count} opcodes (picklers number entries in order); "
                "refusing the allocation",
                path,
            )
    stream.seek(start)


def load_pickle(stream: IO[bytes], path: str, what: str) -> tuple[object, dict[str, StorageRef]]:
    """Unpickle one pickle from stream; any malformation becomes an InputError naming path and what."""
    unpickler = RestrictedUnpickler(stream, path)
    try:
        check_memo_indexes(stream, path, what)
        return unpickler.load(), unpickler.storages
    except TieauditError:
        raise
    except _MALFORMED as exc:
        detail = (str(exc).splitlines() or [""])[0][:200]
        raise InputError(
            f"{what} is not a valid torch pickle ({type(exc).__name__}: {detail})", path
        ) from None
