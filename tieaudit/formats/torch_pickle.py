"""torch.save's pickles, read by tieaudit's own pickle VM with torch's weights_only semantics.

``TorchHooks`` decides what the VM's globals, calls, BUILDs and persistent ids become: the
stand-ins of ``torch_globals`` for allowlisted names, ``StorageRef`` records for storage ids, and
an inert ``Placeholder`` for any other global (never imported, never called: calling it makes
another placeholder holding the arguments). Every global a pickle names is recorded with torch's
verdict on it and what loading would do with it (``pickle_globals``): anything outside torch's
default allowlist would be imported and used under ``torch.load(weights_only=False)`` (TIE010).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from tieaudit.core.errors import InputError, UnsafeInputError, UnsupportedFormatError, one_line
from tieaudit.core.escape import printable
from tieaudit.formats.pickle_budget import OverBudget, PickleBudget
from tieaudit.formats.pickle_globals import Named, Use, classify
from tieaudit.formats.pickle_vm import PickleError, Truncated, run_pickle
from tieaudit.formats.torch_globals import ALLOWLIST, NOT_READ
from tieaudit.formats.torch_records import (
    CounterDict,
    DtypeToken,
    Global,
    Opaque,
    Placeholder,
    StateDict,
    StorageRef,
    StorageType,
    TensorRecord,
    bad,
    check_int,
)

__all__ = [
    "DtypeToken",
    "Opaque",
    "Placeholder",
    "StorageRef",
    "TensorRecord",
    "load_pickle",
    "refuse_unknown",
]

MAX_PICKLE_BYTES = 256 << 20
"""A pickle larger than this is refused: real ones hold metadata only (a 1 TB mixture-of-experts
model with Adam state has about 300000 tensors, some 50 MB of pickle). What unpickling may cost
is the file's pickle budget (``pickle_budget``)."""

MAX_REFERENCED_GLOBALS = 4096
"""Distinct globals one file's pickles may name; real checkpoints name fewer than 100."""

Referenced = dict[str, Named]
"""The globals a file's pickles name, dotted, with their verdict and use, in first-reference order."""

Layout = Literal["zip", "legacy", "plain"]
"""How persistent ids look: zip archives (5 fields), legacy streams (6 fields), or none allowed."""

UnknownGlobal = Callable[[str, str], object]
"""The policy for a global outside the allowlist: given its dotted name and the file, what the VM
hands out for it (``inert``: a placeholder), or raise (``refuse_unknown``)."""

_WHY = "torch.load(weights_only=True) refuses it too"

LOCATION = re.compile(r"cpu|meta|mps.*|(?:cuda|xpu|hpu|mtia|privateuseone)(?::(?:0|[1-9][0-9]{0,8}))?", re.S)
"""Storage locations torch's default restore (``torch.serialization.default_restore_location``)
accepts on a machine that has the device: ``cpu`` and ``meta`` exactly, anything starting with
``mps``, and the other backends with an optional index (as ``torch.device`` parses it); ``cuda:0``
loads on a GPU machine, ``cpu:0`` or ``gpu`` on none."""


def inert(name: str, path: str) -> object:
    """The reader's policy: a global outside the allowlist becomes an inert placeholder."""
    del path
    return Placeholder(name)


def refuse_unknown(name: str, path: str) -> object:
    """The strict policy (torch.load(weights_only=True)'s): a global outside the allowlist is refused."""
    raise UnsafeInputError(
        f"pickle references {_shown(name)}, which is not on the allowlist ({_WHY}); refusing to run it", path
    )


def _legacy_tensor_class(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    return module in ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse") and attr.endswith("Tensor")


def _shown(name: str) -> str:
    return printable(name if len(name) <= 120 else name[:120] + "...")


def _named(value: object) -> str:
    if isinstance(value, Global):
        return value.name
    return value.kind if isinstance(value, Opaque) else type(value).__name__


class TorchHooks:
    """The torch semantics of one pickle; ``storages`` collects every storage it declares."""

    key_types: tuple[type, ...] = (DtypeToken, Placeholder)
    container_types: tuple[type, ...] = (StateDict, CounterDict, Placeholder)

    def __init__(
        self,
        path: str,
        layout: Layout,
        unknown: UnknownGlobal | None = None,
        *,
        referenced: Referenced | None = None,
    ) -> None:
        self.path = path
        self.layout = layout
        self.unknown = unknown or inert
        self.storages: dict[str, StorageRef] = {}
        """Storage records by key, in first-reference order."""
        self.referenced: Referenced = {} if referenced is None else referenced
        """Every global named so far (shared by the pickles of one file)."""

    def _note(self, module: str, name: str) -> None:
        full = f"{module}.{name}"
        if full not in self.referenced:
            if len(self.referenced) >= MAX_REFERENCED_GLOBALS:
                bad(f"the pickle names more than {MAX_REFERENCED_GLOBALS} distinct globals")
            self.referenced[full] = Named(classify(module, name))

    def _used(self, value: object, use: Use) -> None:
        if isinstance(value, Placeholder) and value.name in self.referenced:
            self.referenced[value.name].uses.add(use)

    def find_global(self, module: str, name: str) -> object:
        full = f"{module}.{name}"  # torch looks globals up by the joined name
        self._note(module, name)
        why = NOT_READ.get(full)
        if self.referenced[full].verdict == "allowed":
            found = ALLOWLIST.get(full)
            if found is not None:
                return found
            # Allowed but without a stand-in: never a placeholder, which would pass it as clean.
            why = why or ("legacy tensor classes" if _legacy_tensor_class(full) else "no reader for it")
        if why is not None:
            raise UnsupportedFormatError(
                f"pickle uses {full} ({why}), which tieaudit does not read", self.path
            )
        return self.unknown(full, self.path)

    def reduce(self, func: object, args: tuple[object, ...]) -> object:
        if isinstance(func, Global) and func.call is not None:
            return func.call(*args)
        if isinstance(func, Placeholder):
            self._used(func, "called")
            return Placeholder(func.name, made=True, args=args)
        bad(f"pickle calls {_named(func)}, which tieaudit does not run")

    def newobj(self, cls: object, args: tuple[object, ...]) -> object:
        if isinstance(cls, Global) and cls.new is not None:
            return cls.new(*args)
        if isinstance(cls, Placeholder):
            self._used(cls, "instantiated")
            return Placeholder(cls.name, made=True, args=args)
        bad(f"pickle creates a {_named(cls)} object (NEWOBJ), which tieaudit does not run")

    def items_of(self, target: object, kind: type) -> object:
        # A placeholder for a dict or list subclass takes SETITEM(S) and APPEND(S) into its own
        # plain containers; anything else is its own target (the VM refuses what is not a dict/list).
        if isinstance(target, Placeholder):
            return target.items_for(kind)
        return target

    def build(self, inst: object, state: object) -> None:
        if isinstance(inst, Placeholder):
            self._used(inst, "state set")
            inst.states += (state,)
            return
        # torch's BUILD sets a tensor's storage view (set_) or a Parameter's state: refused here,
        # since it would change what an already checked record means. OrderedDict and Counter
        # only take attributes (torch keeps module versions there): kept, so that flattening
        # lists the tensors among them.
        if isinstance(inst, (StateDict, CounterDict)) and type(state) in (dict, StateDict):
            inst.attributes = {**(inst.attributes or {}), **state}  # type: ignore[dict-item]
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
        if isinstance(storage_type, Placeholder):
            bad(
                f"a storage of type {_shown(storage_type.name)}, "
                "which torch.load(weights_only=True) does not allow"
            )
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
        if not LOCATION.fullmatch(location):
            bad(f"a storage location ({_shown(location[:40])}) that torch.load restores on no device")
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
    unknown: UnknownGlobal = inert,
    referenced: Referenced | None = None,
    budget: PickleBudget | None = None,
    hooks: TorchHooks | None = None,
) -> tuple[object, dict[str, StorageRef], int]:
    """Unpickle the pickle at data[start:]: (root, storages, offset after STOP).

    Globals it names are added to ``referenced``; what it costs is charged to ``budget`` (the
    file's; by default one for len(data) - start bytes). A malformed pickle, one the reader cannot
    read as torch does, or one over budget is an InputError naming path and what; a truncated one
    raises ``Truncated`` (callers reading a window may retry). hooks: other semantics than
    torch.load's (a TorchScript archive's, ``torchscript_hooks``; layout, unknown and referenced
    are then theirs).
    """
    hooks = hooks or TorchHooks(path, layout, unknown, referenced=referenced)
    try:
        budget = budget or PickleBudget(len(data) - start)
        budget.charge(len(data) - start, "the pickle's own bytes (inflated, when compressed)")
        root, end = run_pickle(data, start, hooks, budget=budget)
    except Truncated:
        raise
    except OverBudget as exc:
        raise InputError(f"{what} {exc}", path) from None
    except PickleError as exc:
        raise InputError(
            f"{what} is not a valid torch pickle ({one_line(exc, 300, escaped=True)})", path
        ) from None
    return root, hooks.storages, end


def truncated_error(what: str, path: str) -> InputError:
    """The error for a pickle that ends before STOP at the end of the file."""
    return InputError(f"{what} is not a valid torch pickle (truncated: it ends before its STOP opcode)", path)
