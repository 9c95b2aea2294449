"""The records the torch pickle reader builds: storages, tensor views, dtypes, labelled leaves.

Plain frozen data: nothing here refers to torch, and nothing from a pickle is ever called.
"""

from __future__ import annotations

import reprlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from tieaudit.core.dtypes import ITEMSIZE
from tieaudit.formats.pickle_vm import PickleError
from tieaudit.formats.viewable import MAX_DIMS

MAX_INT64 = 2**63 - 1
"""torch keeps sizes, strides, offsets and element counts as int64; larger values are refused
before any arithmetic (torch itself fails on them)."""

QUANTIZED_ITEMSIZE: dict[str, int] = {"qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1}
PACKED: dict[str, int] = {"quint4x2": 2, "quint2x4": 4}
"""Elements per byte of the sub-byte quantized dtypes: torch's view bound counts the bytes their
packed elements take (8 quint4x2 elements fit a storage of 4)."""


def packed_end(end: int, dtype: str) -> int:
    """Bytes a view ending before element end takes of a storage of dtype, as torch's set_ counts."""
    return -(-end // PACKED.get(dtype, 1)) * element_size(dtype)
"""Quantized dtypes (torch's QInt8Storage and friends): their tensors are listed, never viewed."""
LABEL_ITEMSIZE: dict[str, int] = {
    "complex32": 4, "float4_e2m1fn_x2": 1, "float8_e8m0fnu": 1, "bits16": 2, "bits1x8": 1,
    "bits2x4": 1, "bits4x2": 1, "bits8": 1, **QUANTIZED_ITEMSIZE,
    **{f"{sign}int{n}": 1 for sign in ("", "u") for n in range(1, 8)},
}  # fmt: skip
"""Dtypes torch's allowlist names that numpy cannot view, with torch's element size: a tensor of
one is listed (kind, dtype, shape) but its bytes are never read as values."""

GRAD_DTYPES = frozenset(
    "bfloat16 complex128 complex32 complex64 float16 float32 float4_e2m1fn_x2 float64 float8_e4m3fn "
    "float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu".split()
)
"""Dtypes whose tensors torch lets require gradients (others fail to load with requires_grad)."""


def element_size(dtype: str) -> int:
    """Bytes per element of a dtype torch's allowlist names (viewable or label-only)."""
    return ITEMSIZE.get(dtype) or LABEL_ITEMSIZE[dtype]


def bad(message: str) -> NoReturn:
    """Refuse the pickle: torch would fail here too, or tieaudit cannot read it the same way."""
    raise PickleError(message)


NO_FLAGS: frozenset[str] = frozenset()
"""The flags of almost every tensor: one shared object (an empty frozenset is 216 bytes, and
CPython makes a new one each time)."""


@dataclass(frozen=True)
class StorageType:
    """Stand-in for a torch storage class named in a persistent id."""

    dtype: str
    """Element dtype (uint8 for untyped storages)."""
    typed: bool
    """False for ``UntypedStorage``, whose numel counts bytes."""


@dataclass(frozen=True)
class DtypeToken:
    """Stand-in for a ``torch.<dtype>`` global."""

    name: str
    """torch's spelling, e.g. float8_e4m3fn."""


@dataclass(frozen=True, kw_only=True)
class StorageRef:
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
        return self.numel * element_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class TensorRecord:
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
    flags: frozenset[str] = NO_FLAGS
    """Set bits of torch's tensor metadata (``conj``, ``neg``): stored bytes are not the values."""
    attributes: dict[str, object] | None = field(default=None, compare=False, repr=False)
    """Attributes loading sets on the tensor (``t.extra``), where the pickle gives any: listed
    under the tensor's name when they hold tensors, since torch.load returns them."""


@dataclass(frozen=True)
class Opaque:
    """A value kept only as a label (torch.device, torch.Size, a set, a layout, a qscheme, ...)."""

    kind: str
    """What it was, e.g. ``torch.device``."""
    value: tuple[int, ...] | str | None = None
    """What a rebuild function needs of it: a torch.Size's dims, a layout's, qscheme's or
    device's name (None for the others)."""


@dataclass(frozen=True, kw_only=True)
class OpaqueTensor:
    """A tensor torch.load rebuilds that is not a strided view of stored values tieaudit reads:
    quantized, sparse, nested, meta, a wrapper subclass, converted while loading. Listed under its
    name with what it is; its bytes are never read as values."""

    kind: str
    """What it is, e.g. ``quantized (per_tensor_affine)`` or ``sparse (sparse_csr)``."""
    dtype: str
    """torch dtype name of its elements (its values' for a sparse tensor)."""
    shape: tuple[int, ...] | None
    """Size per dimension; None where torch gives none (a nested tensor's ragged dims)."""
    attributes: dict[str, object] | None = field(default=None, compare=False, repr=False)
    """Attributes loading sets on it, as for a TensorRecord."""


@dataclass(frozen=True)
class Global:
    """An allowlisted global that is a function or class: what REDUCE and NEWOBJ do with it."""

    name: str
    """The dotted name, e.g. ``torch._utils._rebuild_tensor_v2``."""
    call: Callable[..., object] | None = None
    """tieaudit's version of calling it (REDUCE); None where torch's call is refused here."""
    new: Callable[..., object] | None = None
    """tieaudit's version of ``cls.__new__(cls, *args)`` (NEWOBJ); None where refused here."""


class Placeholder:
    """An inert stand-in for a global outside the allowlist, or for what using one would make.

    Nothing is imported or called: REDUCE and NEWOBJ on a placeholder make another placeholder that
    keeps the arguments, BUILD keeps the state, SETITEM(S)/APPEND(S) go to ``dictitems`` and
    ``listitems``, so every tensor the pickle puts anywhere is still found. Hashed by identity (a
    placeholder may be a dict key, as an enum member is).
    """

    __slots__ = ("args", "dictitems", "listitems", "made", "name", "states")

    def __init__(self, name: str, *, made: bool = False, args: tuple[object, ...] = ()) -> None:
        self.name = name
        """The dotted name of the global (for a made object: the global it came from)."""
        self.made = made
        """False for the global itself; True for an object REDUCE/NEWOBJ made from it."""
        self.args = args
        """The arguments of the call that made it."""
        self.states: list[object] = []
        """The state of each BUILD applied to it (a list: a pickle may BUILD one object a million
        times, and a tuple grown by one each time would be copied every time)."""
        self.dictitems: dict[Any, Any] | None = None
        """What SETITEM(S) put in it (dict subclasses); made on first use, so a placeholder costs
        about what the opcodes that made it cost."""
        self.listitems: list[Any] | None = None
        """What APPEND(S) put in it (list subclasses); made on first use."""

    def items_for(self, kind: type) -> dict[Any, Any] | list[Any]:
        """The container SETITEM(S) (kind dict) or APPEND(S) (kind list) write into."""
        if kind is dict:
            if self.dictitems is None:
                self.dictitems = {}
            return self.dictitems
        if self.listitems is None:
            self.listitems = []
        return self.listitems

    def __repr__(self) -> str:
        shown = reprlib.repr(self.args[0]) if self.made and len(self.args) == 1 else ""
        return f"<{self.name}({shown})>" if self.made else f"<{self.name}>"

    def parts(self) -> list[tuple[str, object]]:
        """What it holds, named as a user would look it up: items by key or index, attributes (a
        dict BUILD state, or CPython's (dict, slots) pair) by name, the rest under ``__state__``
        and ``__args__``."""
        named: list[tuple[str, object]] = []
        named.extend((key_name(key), value) for key, value in (self.dictitems or {}).items())
        named.extend((str(index), value) for index, value in enumerate(self.listitems or ()))
        for index, state in enumerate(self.states):
            pairs: tuple[object, ...] = state if type(state) is tuple and len(state) == 2 else (state,)
            attributes = [part for part in pairs if type(part) is dict]
            if len(attributes) + pairs.count(None) == len(pairs):
                for part in attributes:
                    named.extend((key_name(key), value) for key, value in part.items())
            else:
                named.append(("__state__" if len(self.states) == 1 else f"__state__.{index}", state))
        if self.args:
            named.append(("__args__", self.args))
        return named


def key_name(key: object) -> str:
    """A dict key as a part of a dotted name."""
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    if isinstance(key, DtypeToken):  # as torch.load's dtype object prints: one name in both readings
        return f"torch.{key.name}"
    return reprlib.repr(key)  # bounded depth and length, unlike str() of a hostile key


class StateDict(OrderedDict[Any, Any]):
    """Stand-in for ``collections.OrderedDict``."""

    attributes: dict[str, object] | None = None
    """Attributes BUILD set on it (torch keeps module versions in ``_metadata``): listed under its
    name when they hold tensors, since torch.load returns them."""


class CounterDict(dict[Any, Any]):
    """Stand-in for ``collections.Counter``."""

    attributes: dict[str, object] | None = None
    """Attributes BUILD set on it, as for a StateDict."""


def check_arity(name: str, args: tuple[object, ...], *counts: int) -> None:
    """Refuse a call with a number of arguments torch's function does not take."""
    if len(args) not in counts:
        bad(f"{name} called with {len(args)} arguments")


def check_ints(value: object, what: str) -> tuple[int, ...]:
    """value as a tuple (or list) of non-negative int64s, or refuse."""
    if type(value) is not tuple and type(value) is not list:
        bad(f"{what} is {type(value).__name__}, expected a tuple of ints")
    if len(value) > MAX_DIMS:  # counted before a single dimension is looked at
        bad(f"{what} has {len(value)} dimensions; at most {MAX_DIMS} can be viewed")
    items: tuple[object, ...] = tuple(value)
    # At C speed: a memo'd size list may be handed to thousands of rebuilds.
    if items and (set(map(type, items)) != {int} or min(items) < 0 or max(items) > MAX_INT64):  # type: ignore[type-var,operator]
        return tuple(check_int(each, what) for each in items)  # raises, naming the problem
    return items  # type: ignore[return-value]


def check_requires_grad(value: object, dtype: str) -> None:
    """torch's rule for requires_grad while loading: a bool, and only for dtypes that may have gradients."""
    if type(value) is not bool:
        bad(f"requires_grad is {type(value).__name__}, expected a bool (torch refuses it)")
    if value and dtype not in GRAD_DTYPES:
        bad(f"a tensor of dtype {dtype} requires gradients, which torch refuses to load")


def check_int(value: object, what: str) -> int:
    """value as a non-negative int64, or refuse."""
    if type(value) is not int:
        bad(f"{what} is {type(value).__name__}, expected an int")
    if value < 0:
        bad(f"{what} is negative ({value})")
    if value > MAX_INT64:
        bad(f"{what} ({value}) is too large for torch (more than 2**63-1)")
    return value
