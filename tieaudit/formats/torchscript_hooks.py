"""The globals of a TorchScript archive's pickles, as ``torch.jit.load``'s unpickler resolves them.

``torch.jit.load`` reads ``constants.pkl`` and ``data.pkl`` with torch's C++ unpickler
(``torch/csrc/jit/serialization/unpickler.cpp``), never with Python's: it imports no Python global.
``Unpickler::readGlobal`` resolves a fixed set of names itself and hands every other one to the
archive's type resolver, which compiles the class of that name from the archive's own ``code/``
(``__torch__.LM`` from ``code/__torch__.py``) or fails:

- ``torch._utils._rebuild_tensor_v2``, ``_rebuild_qtensor``, ``_rebuild_sparse_tensor``,
  ``builtins.complex``, ``collections.OrderedDict``, ``torch.device``, the ``torch.<Type>Storage``
  classes and the quantization schemes (``torch.per_tensor_affine``): read here by the stand-ins of
  torch.load(weights_only=True)'s allowlist, which take the same arguments (recorded as ``allowed``
  pickle globals);
- ``torch.jit._pickle``'s ``build_intlist``, ``build_tensorlist``, ``build_doublelist``,
  ``build_boollist`` (a list passed through) and ``restore_type_tag`` (a list or dict and its
  TorchScript type string; the value passed through): read here the same way;
- any other ``torch.`` name fails torch.jit.load ("unknown torch global"), as do ``__main__`` names
  (a tensor table an archive never has), ``build_tensor_from_id`` and RPC references: refused;
- anything else is a TorchScript class (``__torch__.*``, or any name the archive's code defines):
  an inert record here (a ``Placeholder``, never imported or called), made with NEWOBJ and given its
  attributes (or its ``__setstate__`` state) by one BUILD, which is all torch.jit.save writes.

``_rebuild_from_type_v2`` (whose second global torch.jit.load reads without resolving it) and
calls of a class with REDUCE (an enum value) are refused: torch.jit.save writes neither for a
module's tensors, and tieaudit does not model them.
"""

from __future__ import annotations

from tieaudit.core.errors import UnsupportedFormatError
from tieaudit.core.escape import printable
from tieaudit.formats.torch_pickle import MAX_REFERENCED_GLOBALS, Referenced, TorchHooks
from tieaudit.formats.torch_records import Global, Placeholder, bad

__all__ = ["ScriptHooks"]

_DELEGATED = frozenset(
    {
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_qtensor",
        "torch._utils._rebuild_sparse_tensor",
        "builtins.complex",
        "collections.OrderedDict",
        "torch.device",
    }
)
"""Names unpickler.cpp resolves itself that the weights_only stand-ins read with the same arguments."""
_QSCHEMES = frozenset(
    {
        "per_tensor_affine",
        "per_channel_affine",
        "per_tensor_symmetric",
        "per_channel_symmetric",
        "per_channel_affine_float_qparams",
    }
)
"""Quantization schemes unpickler.cpp resolves under ``torch.`` (as toString(QScheme) spells them)."""
_LISTS = frozenset({"build_intlist", "build_tensorlist", "build_doublelist", "build_boollist"})
_WHY_NOT = "torch.jit.load fails on it"


def _list_builder(name: str) -> Global:
    """``torch.jit._pickle.build_*list(data)``: the list itself (torch.jit.load only tags its type)."""

    def call(*args: object) -> object:
        if len(args) != 1 or type(args[0]) is not list:
            bad(f"torch.jit._pickle.{name} called with other than one list")
        return args[0]

    return Global(f"torch.jit._pickle.{name}", call=call)


def _restore_type_tag(*args: object) -> object:
    """``torch.jit._pickle.restore_type_tag(value, type)``: value (a list or dict) with its type."""
    if len(args) != 2 or type(args[1]) is not str:
        bad("torch.jit._pickle.restore_type_tag called with other than a value and a type string")
    if not isinstance(args[0], (list, dict)):
        bad(f"torch.jit._pickle.restore_type_tag of a {type(args[0]).__name__} ({_WHY_NOT})")
    return args[0]


_JIT_PICKLE: dict[str, Global] = {name: _list_builder(name) for name in _LISTS}
_JIT_PICKLE["restore_type_tag"] = Global("torch.jit._pickle.restore_type_tag", call=_restore_type_tag)


class ScriptHooks(TorchHooks):
    """The hooks for one pickle of a TorchScript archive: storages keyed by their member path under
    the archive's folder (``data/0``, ``constants/0``), TorchScript classes as inert records."""

    def __init__(self, path: str, folder: str, *, referenced: Referenced, classes: dict[str, None]) -> None:
        super().__init__(path, "zip", _refused, referenced=referenced)
        self.folder = folder
        """Where this pickle's storages are, inside the archive's folder (``data/``)."""
        self.classes = classes
        """Every TorchScript class named so far (shared by the archive's pickles), in order."""

    def find_global(self, module: str, name: str) -> object:
        full = f"{module}.{name}"
        if full in _DELEGATED:
            return super().find_global(module, name)
        if module == "torch":
            if name.endswith("Storage") or name in _QSCHEMES:
                return super().find_global(module, name)  # refused there when weights_only has none
            bad(f"the pickle names torch.{_shown(name)}, an unknown torch global ({_WHY_NOT})")
        if module == "torch.jit._pickle":
            found = _JIT_PICKLE.get(name)
            if found is None:
                bad(f"the pickle names torch.jit._pickle.{_shown(name)} ({_WHY_NOT})")
            return found
        if module == "__main__" or full in (
            "torch.distributed.rpc.rref",
            "torch._tensor._rebuild_from_type_v2",
        ):
            raise UnsupportedFormatError(
                f"the pickle names {_shown(full)}, which torch.jit.save does not write for a module's "
                "tensors and tieaudit does not read",
                self.path,
            )
        if full not in self.classes:
            if len(self.classes) >= MAX_REFERENCED_GLOBALS:
                bad(f"the archive names more than {MAX_REFERENCED_GLOBALS} distinct TorchScript classes")
            self.classes[full] = None
        return Placeholder(full)

    def newobj(self, cls: object, args: tuple[object, ...]) -> object:
        if isinstance(cls, Placeholder):
            if cls.made or args:
                bad(f"NEWOBJ of {_shown(cls.name)} other than of a class without arguments ({_WHY_NOT})")
            return Placeholder(cls.name, made=True)
        return super().newobj(cls, args)

    def reduce(self, func: object, args: tuple[object, ...]) -> object:
        if isinstance(func, Placeholder):
            bad(f"REDUCE of {_shown(func.name)} (an enum value or a call), which tieaudit does not read")
        return super().reduce(func, args)

    def build(self, inst: object, state: object) -> None:
        if isinstance(inst, Placeholder):
            if not inst.made or inst.states:
                bad(f"BUILD of {_shown(inst.name)} other than once on a new object ({_WHY_NOT})")
            inst.states.append(state)
            return
        super().build(inst, state)

    def items_of(self, target: object, kind: type) -> object:
        if isinstance(target, Placeholder):
            bad(f"items added to a {_shown(target.name)} object ({_WHY_NOT})")
        return target

    def persistent_load(self, pid: object) -> object:
        # The storage key names a member of this pickle's folder (unpickler.cpp's read_record).
        if type(pid) is tuple and len(pid) == 5 and type(pid[2]) is str:
            pid = (pid[0], pid[1], self.folder + pid[2], pid[3], pid[4])
        return super().persistent_load(pid)


def _refused(name: str, path: str) -> object:
    """A name torch.jit.load would resolve itself but that has no weights_only stand-in."""
    raise UnsupportedFormatError(f"the pickle uses {_shown(name)}, which tieaudit does not read", path)


def _shown(name: str) -> str:
    return printable(name if len(name) <= 120 else name[:120] + "...")
