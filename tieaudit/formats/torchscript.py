"""TorchScript archives (``torch.jit.save``, ``.pt``/``.jit``/``.ptl``): their tensors, nothing run.

A TorchScript archive is a zip laid out as torch.save's (one folder, a ``version`` record) holding
``constants.pkl`` (a tuple of the tensor constants the code reads as ``CONSTANTS.c0``, ...,
storages in ``constants/``), ``data.pkl`` (the module: an object of a ``__torch__.*`` class whose
attributes are its parameters, buffers, other attributes and submodules, storages in ``data/``),
the TorchScript source of those classes in ``code/`` and, from ``torch.jit.trace``,
``traced_inputs.pkl`` (the example inputs: torch.jit.save stores their shapes over empty records
in ``traced_inputs/``, and torch.jit.load reads only their types, so they hold no values and are
not read here; the note says so). ``torch.load`` takes a zip for
one exactly when its folder holds a record named ``constants.pkl`` (``_is_torchscript_zip``):
``weights_only=True`` then refuses it ("Cannot use weights_only=True with TorchScript archives"),
``weights_only=False`` hands it to ``torch.jit.load``, which compiles the code and runs it (a
class's ``__setstate__`` while loading, ``forward`` when called). Its pickles import no Python global
(``torchscript_hooks``).

Here the pickles are read by tieaudit's VM with the semantics of torch.jit.load's unpickler, the
classes kept as inert records and nothing compiled or run; the tensors are named as a user of
``torch.jit.load(path)`` finds them: the attribute path (``embed.weight``, ``blocks.0.lin.bias``,
which is ``state_dict()``'s key for a parameter or buffer; tensors in other attributes, lists and
dicts too), ``CONSTANTS.c<i>`` for the constants, and for a lite-interpreter archive
``bytecode.<path>``. Storages are the archive's members (``data/0``), so
a head tied to its embedding is one storage under two names and a separate equal copy is TIE001.
The legacy ``model.json`` layout (torch < 1.3) is refused.
"""

from __future__ import annotations

import dataclasses
import os
import stat

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.core.escape import printable
from tieaudit.core.units import plural
from tieaudit.formats.pickle_budget import PickleBudget
from tieaudit.formats.pickle_vm import Truncated
from tieaudit.formats.torch_checkpoint import LocateStorage, build_checkpoint
from tieaudit.formats.torch_pickle import MAX_PICKLE_BYTES, Referenced, load_pickle, truncated_error
from tieaudit.formats.torch_records import Placeholder, StorageRef
from tieaudit.formats.torchscript_hooks import ScriptHooks
from tieaudit.formats.zip_archive import LOCAL_MAGIC, ZipArchive, pread, read_archive, read_member, shown

__all__ = ["CONSTANTS", "REEXPORT", "is_torchscript", "is_torchscript_file", "read_torchscript"]

MARKER = "constants.pkl"
"""The record torch.load takes a zip for a TorchScript archive by (``_is_torchscript_zip``)."""
CONSTANTS = "CONSTANTS"
"""The name the archive's code reads its tensor constants under (``CONSTANTS.c0``)."""
BYTECODE = "bytecode"
"""A lite-interpreter archive's bytecode pickle (read by _load_for_lite_interpreter), whose tensors
are named too: they are stored in the file."""
TRACED_INPUTS = "traced_inputs.pkl"
"""torch.jit.trace's example inputs: shapes over empty records, not values (not read)."""
REEXPORT = "re-export it from the source model with the weights tied (torch.jit.save of the tied module)"
"""What to do about a TorchScript archive's copies: tieaudit does not write TorchScript."""
CUSTOM_CLASSES = "__torch__.torch.classes."
"""C++ classes torch (or a loaded extension) registers, found without source (packed params)."""
NAMED_CLASSES = 2
"""TorchScript classes the note names (the rest are counted)."""


def is_torchscript(archive: ZipArchive, prefix: str) -> bool:
    """torch.load's test: the archive's folder holds a record named exactly ``constants.pkl``."""
    return archive_has(archive, prefix + MARKER)


def is_torchscript_file(path: str) -> bool:
    """A file torch.load takes for a TorchScript archive (a zip from byte 0 whose first member's
    folder holds ``constants.pkl``); False for anything else, or anything unreadable. Reads the
    head and the central directory only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO named like a shard must not block
    except OSError:
        return False
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or pread(fd, len(LOCAL_MAGIC), 0) != LOCAL_MAGIC:
            return False
        archive = read_archive(fd, status.st_size, path)
    except (OSError, InputError):
        return False
    finally:
        os.close(fd)
    first = archive.members[0].name if archive.members else b""
    if b"/" not in first:
        return False
    prefix = first.split(b"/", 1)[0].decode("utf-8", "surrogateescape") + "/"
    return is_torchscript(archive, prefix)


def archive_has(archive: ZipArchive, name: str) -> bool:
    """The archive holds a member of exactly this name."""
    wanted = name.encode("utf-8", "surrogatepass")
    return any(member.name == wanted for member in archive.members)


def _locator(archive: ZipArchive, prefix: str, path: str) -> LocateStorage:
    """A storage's member (``<folder>/data/0``): stored, of exactly the storage's size."""

    def locate(ref: StorageRef) -> int:
        name = prefix + ref.key
        member = archive.find(name)
        quoted = repr(printable(name[:200]))
        if member is None:
            if ref.nbytes == 0:
                return 0  # torch.jit.load reads no record for an empty storage
            raise InputError(f"storage {printable(ref.key[:40])!r} has no zip member {quoted}", path)
        if member.method != 0:
            raise InputError(f"zip member {quoted} is compressed; storages must be stored to be mapped", path)
        if member.size != ref.nbytes:
            raise InputError(
                f"zip member {quoted} holds {member.size} bytes, its storage needs {ref.nbytes}", path
            )
        return member.data_offset

    return locate


@dataclasses.dataclass(kw_only=True)
class _Archive:
    """One archive being read: what its pickles declare, shared by them."""

    fd: int
    path: str
    archive: ZipArchive
    prefix: str
    referenced: Referenced
    budget: PickleBudget
    classes: dict[str, None] = dataclasses.field(default_factory=dict)
    storages: dict[str, StorageRef] = dataclasses.field(default_factory=dict)
    read: list[str] = dataclasses.field(default_factory=list)

    def load(self, record: str, folder: str, *, required: bool = True) -> tuple[bool, object]:
        """(found, root) of the pickle ``<record>.pkl``, its storages in ``folder``."""
        member = self.archive.find(f"{self.prefix}{record}.pkl")
        if member is None:
            if required:
                raise InputError(
                    f"the TorchScript archive has no {self.prefix}{record}.pkl record", self.path
                )
            return False, None
        what = shown(member.name)
        data = read_member(self.fd, member, MAX_PICKLE_BYTES, path=self.path)
        if not data.startswith(b"\x80\x02"):
            raise InputError(f"{what} does not start with PROTO 2, which torch.jit.load requires", self.path)
        hooks = ScriptHooks(self.path, folder, referenced=self.referenced, classes=self.classes)
        try:
            root, _, _ = load_pickle(data, self.path, what, budget=self.budget, hooks=hooks)
        except Truncated:
            raise truncated_error(what, self.path) from None
        for key, ref in hooks.storages.items():
            known = self.storages.setdefault(key, ref)
            if (known.dtype, known.numel, known.typed) != (ref.dtype, ref.numel, ref.typed):
                raise InputError(
                    f"storage {printable(key[:60])!r} is declared with different types or sizes", self.path
                )
        self.read.append(f"{record}.pkl")
        return True, root


def _bytecode_folder(archive: ZipArchive, prefix: str) -> str:
    """Where a lite-interpreter archive's bytecode keeps its tensors: ``bytecode/`` when the archive
    has such members, else ``constants/`` (shared with constants.pkl, as torch writes it since
    bytecode version 6)."""
    own = f"{prefix}bytecode/".encode("utf-8", "surrogatepass")
    return "bytecode/" if any(m.name.startswith(own) for m in archive.members) else "constants/"


def _check_sources(reading: _Archive) -> None:
    """Every class the pickles name is one torch.jit.load compiles from the archive's own code
    (``__torch__.a.b.C`` from ``code/__torch__/a/b.py``) or a C++ class torch registers
    (``__torch__.torch.classes.*``): a name with no source (``os.system``) fails torch.jit.load."""
    for name in reading.classes:
        if name.startswith(CUSTOM_CLASSES):
            continue
        source = f"{reading.prefix}code/{name.rpartition('.')[0].replace('.', '/')}.py"
        if reading.archive.find(source) is None:
            raise InputError(
                f"the pickles name the TorchScript class {printable(name[:120])!r}, whose source "
                f"{printable(source[:200])!r} the archive lacks (torch.jit.load fails on it)",
                reading.path,
            )


def _note(reading: _Archive) -> str:
    """What the report says of the archive's code, one line (names escaped where printed)."""
    code = f"{reading.prefix}code/".encode("utf-8", "surrogatepass")
    sources = sum(1 for m in reading.archive.members if m.name.startswith(code) and m.name.endswith(b".py"))
    classes = list(reading.classes)
    named = ", ".join(c[:120] for c in classes[:NAMED_CLASSES])
    more = f" and {len(classes) - NAMED_CLASSES} more" if len(classes) > NAMED_CLASSES else ""
    traced = reading.archive.find(reading.prefix + TRACED_INPUTS) is not None
    unread = f"; {TRACED_INPUTS} (example input shapes, no values) not read" if traced else ""
    return (
        f"TorchScript archive (torch.jit.save): {', '.join(reading.read)} read inertly, "
        f"{plural(len(classes), 'TorchScript class', 'TorchScript classes')} kept inert"
        f"{' (' + named + more + ')' if classes else ''}{unread}; code/ ({plural(sources, 'source file')}) "
        "not run. torch.jit.load compiles and runs that code (__setstate__ while loading, forward when "
        "called); torch.load(weights_only=True) refuses TorchScript archives, and "
        "torch.load(weights_only=False) hands them to torch.jit.load"
    )


def read_torchscript(
    fd: int, path: str, *, archive: ZipArchive, prefix: str, referenced: Referenced, budget: PickleBudget
) -> OpenCheckpoint:
    """Read a TorchScript archive (``is_torchscript``) whose records torch_file has checked."""
    if archive.find(f"{prefix}model.json") is not None:
        raise UnsupportedFormatError(
            "a TorchScript archive of the legacy model.json layout (torch < 1.3), which tieaudit "
            "does not read",
            path,
        )
    reading = _Archive(fd=fd, path=path, archive=archive, prefix=prefix, referenced=referenced, budget=budget)
    _, constants = reading.load("constants", "constants/")  # in torch.jit.load's order
    if type(constants) is not tuple:
        raise InputError(
            f"constants.pkl holds a {type(constants).__name__}, not a tuple (torch.jit.load fails)", path
        )
    _, module = reading.load("data", "data/")
    if not isinstance(module, Placeholder) or not module.made:
        shown_type = "class" if isinstance(module, Placeholder) else type(module).__name__
        raise InputError(f"data.pkl holds a {shown_type}, not a module object (torch.jit.load fails)", path)
    root: dict[object, object] = {
        "": module,
        CONSTANTS: {f"c{i}": value for i, value in enumerate(constants)},
    }
    found, bytecode = reading.load(BYTECODE, _bytecode_folder(archive, prefix), required=False)
    if found:
        root[BYTECODE] = bytecode
    _check_sources(reading)
    opened = build_checkpoint(
        path,
        root,
        reading.storages,
        locate=_locator(archive, prefix, path),
        referenced=referenced,
        budget=budget,
    )
    opened.checkpoint = dataclasses.replace(opened.checkpoint, format="torchscript", notes=(_note(reading),))
    return opened
