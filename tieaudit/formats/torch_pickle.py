"""torch.save's pickles, read by tieaudit's own pickle VM with torch's weights_only semantics.

``TorchHooks`` decides what the VM's globals, calls, BUILDs and persistent ids become: the
stand-ins of ``torch_globals`` for allowlisted names, ``StorageRef`` records for storage ids.
A global outside the allowlist goes to one policy function (``refuse_unknown`` today, which
refuses it by name); everything else about a pickle is decided the same way for every file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from tieaudit.core.errors import InputError, UnsafeInputError, UnsupportedFormatError, one_line
from tieaudit.core.escape import printable
from tieaudit.formats.pickle_vm import PickleError, Truncated, run_pickle
from tieaudit.formats.torch_globals import ALLOWLIST, NOT_READ
from tieaudit.formats.torch_records import (
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

__all__ = ["DtypeToken", "Opaque", "StorageRef", "TensorRecord", "load_pickle", "refuse_unknown"]

MAX_PICKLE_BYTES = 256 << 20
"""A pickle larger than this is refused: real ones hold metadata only (a 1 TB mixture-of-experts
model with Adam state has about 300000 tensors, some 50 MB of pickle). Memory while unpickling is
at most about 64 bytes per pickle byte (one small container per one-byte opcode)."""

Layout = Literal["zip", "legacy", "plain"]
"""How persistent ids look: zip archives (5 fields), legacy streams (6 fields), or none allowed."""

UnknownGlobal = Callable[[str, str], object]
"""The policy for a global outside the allowlist: given its dotted name and the file, what the VM
hands out for it, or raise. The one place a later change can make such globals inert."""

_WHY = "torch.load(weights_only=True) refuses it too"


def refuse_unknown(name: str, path: str) -> object:
    """Today's policy: a global outside the allowlist is refused, by name."""
    shown = printable(name if len(name) <= 120 else name[:120] + "...")
    raise UnsafeInputError(
        f"pickle references {shown}, which is not on the allowlist ({_WHY}); refusing to run it", path
    )


def _legacy_tensor_class(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    return module in ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse") and attr.endswith("Tensor")


def _named(value: object) -> str:
    if isinstance(value, Global):
        return value.name
    return value.kind if isinstance(value, Opaque) else type(value).__name__


class TorchHooks:
    """The torch semantics of one pickle; ``storages`` collects every storage it declares."""

    key_types: tuple[type, ...] = (DtypeToken,)
    container_types: tuple[type, ...] = (StateDict, CounterDict)

    def __init__(self, path: str, layout: Layout, unknown: UnknownGlobal = refuse_unknown) -> None:
        self.path = path
        self.layout = layout
        self.unknown = unknown
        self.storages: dict[str, StorageRef] = {}
        """Storage records by key, in first-reference order."""

    def find_global(self, module: str, name: str) -> object:
        full = f"{module}.{name}"  # torch looks globals up by the joined name
        found = ALLOWLIST.get(full)
        if found is not None:
            return found
        why = NOT_READ.get(full) or ("legacy tensor classes" if _legacy_tensor_class(full) else None)
        if why is not None:
            raise UnsupportedFormatError(
                f"pickle uses {full} ({why}), which tieaudit does not read", self.path
            )
        return self.unknown(full, self.path)

    def reduce(self, func: object, args: tuple[object, ...]) -> object:
        if isinstance(func, Global) and func.call is not None:
            return func.call(*args)
        bad(f"pickle calls {_named(func)}, which tieaudit does not run")

    def newobj(self, cls: object, args: tuple[object, ...]) -> object:
        if isinstance(cls, Global) and cls.new is not None:
            return cls.new(*args)
        bad(f"pickle creates a {_named(cls)} object (NEWOBJ), which tieaudit does not run")

    def build(self, inst: object, state: object) -> None:
        # torch's BUILD sets a tensor's storage view (set_) or a Parameter's state: refused here,
        # since it would change what an already checked record means. OrderedDict and Counter
        # only take attributes (torch keeps module versions there), ignored.
        if type(inst) in (StateDict, CounterDict) and type(state) in (dict, StateDict):
            return
        bad(f"BUILD on a {_named(inst)} value")

    def persistent_load(self, pid: object) -> object:
        fields = 5 if self.layout == "zip" else 6
        if self.layout == "plain" or type(pid) is not tuple:
            bad(f"unexpected persistent id of type {type(pid).__name__}")
        if len(pid) != fields:
            bad(f"a storage id of {len(pid)} fields (torch reads {fields})")
        typename = pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]
        if typename != "storage":
            bad("a persistent id that is not a storage")
        storage_type, key, location, numel = pid[1:5]
        if fields == 6 and pid[5] is not None:
            raise UnsupportedFormatError("legacy storage views (torch < 0.4) are not supported", self.path)
        if not isinstance(storage_type, StorageType) or type(key) is not str:
            bad("malformed storage id (expected storage type, key, location, numel)")
        if fields == 6 and not storage_type.typed:
            # torch.save writes these (float8, uint16, ...), but torch's legacy loader asks the
            # UntypedStorage class for a dtype it does not have: torch.load cannot read the file.
            bad("an untyped storage in a legacy stream, which torch.load fails to read")
        if isinstance(location, bytes):
            location = location.decode("ascii")
        if type(location) is not str:
            bad("malformed storage id (its location is not text)")
        ref = StorageRef(
            key=key,
            dtype=storage_type.dtype,
            numel=check_int(numel, "storage numel"),
            typed=storage_type.typed,
            location=location,
        )
        known = self.storages.setdefault(key, ref)
        if (known.dtype, known.numel, known.typed) != (ref.dtype, ref.numel, ref.typed):
            bad(f"storage {printable(key[:40])!r} is declared twice with different types or sizes")
        return known


def load_pickle(
    data: bytes,
    path: str,
    what: str,
    *,
    start: int = 0,
    layout: Layout = "zip",
    unknown: UnknownGlobal = refuse_unknown,
) -> tuple[object, dict[str, StorageRef], int]:
    """Unpickle the pickle at data[start:]: (root, storages, offset after STOP).

    A malformed pickle, or one torch.load(weights_only=True) would refuse, is an InputError naming
    path and what; a truncated one raises ``Truncated`` (callers reading a window may retry).
    """
    hooks = TorchHooks(path, layout, unknown)
    try:
        root, end = run_pickle(data, start, hooks)
    except Truncated:
        raise
    except PickleError as exc:
        raise InputError(
            f"{what} is not a valid torch pickle ({one_line(exc, 300, escaped=True)})", path
        ) from None
    return root, hooks.storages, end


def truncated_error(what: str, path: str) -> InputError:
    """The error for a pickle that ends before STOP at the end of the file."""
    return InputError(f"{what} is not a valid torch pickle (truncated: it ends before its STOP opcode)", path)
