"""Files tieaudit reads no tensors from but whose pickles ``torch.load(weights_only=False)`` runs.

One mechanism for every reader that ends here:

- a bare pickle (``pickle.dump`` output, not torch.save data: ``bare_pickle``);
- a torch.save file tieaudit's torch reader refuses (``torch_file``): an opcode or shape torch's
  weights_only refuses too (INST, OBJ, STACK_GLOBAL, EXT, a malformed persistent id), a storage
  that does not fit, ... The reader stops at the first thing it refuses; the full unpickler reads
  on, so the whole pickle is walked, not only what the reader met before refusing;
- torch's pre-0.4 tar format (``torch_tar``), which weights_only refuses outright.

Their pickles are walked (``pickle_walk``: every opcode, nothing imported or called). A global
outside torch's weights_only allowlist makes the file a checkpoint of format ``pickle`` with no
tensors and those globals, each carrying why no tensors were read (``PickleGlobal.refused``): TIE010
names them and that reason, and every other command refuses the file naming them (``refusal``). A
walk that cannot reach the end of the pickles without finding code (a tieaudit bound, a FRAME read
two ways) is refused with ``UnwalkedPickle``, which no folder reader passes over.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

from tieaudit.core.bytestore import ByteStore, OpenCheckpoint
from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint, PickleGlobal
from tieaudit.formats.pickle_globals import Named
from tieaudit.formats.pickle_walk import Walk, walk_pickles

__all__ = [
    "UNFINISHED",
    "UnwalkedPickle",
    "code_checkpoint",
    "merge_named",
    "named_globals",
    "refusal",
    "runs_code",
    "walk_file",
]

UNFINISHED = ("unscanned", "ambiguous")
"""Walk endings that leave code possible: a tieaudit bound ended it, or a FRAME reads two ways."""


class UnwalkedPickle(UnsafeInputError):
    """A file tieaudit reads no tensors from, whose pickles it cannot walk to their end without
    finding code: refused, never passed over (a folder reader re-raises it)."""


def runs_code(named: Mapping[str, Named]) -> bool:
    """Some global is outside torch's weights_only allowlist."""
    return any(found.verdict == "runs-code" for found in named.values())


def merge_named(into: dict[str, Named], more: Mapping[str, Named]) -> None:
    """Add more's globals to into, uniting what loading does with a global named in both."""
    for name, found in more.items():
        known = into.setdefault(name, Named(found.verdict, set(found.uses)))
        known.uses |= found.uses


def named_globals(named: Mapping[str, Named], file: str, *, refused: str) -> tuple[PickleGlobal, ...]:
    """The globals a walk named, as the report's records (file: its name in the checkpoint)."""
    return tuple(
        PickleGlobal(name=name, verdict=found.verdict, file=file, use=found.described(), refused=refused)
        for name, found in named.items()
    )


def code_checkpoint(path: str, named: Mapping[str, Named], *, refused: str) -> OpenCheckpoint:
    """The checkpoint of a file whose pickles name code: format ``pickle``, no tensors, its globals
    (refused: why no tensors were read, a clause such as "it is a pickle, not torch.save data")."""
    file = os.path.basename(path)
    checkpoint = Checkpoint(
        path=path,
        format="pickle",
        tensors=(),
        storages={},
        files=(file,),
        pickle_globals=named_globals(named, file, refused=refused),
    )
    return OpenCheckpoint(checkpoint, ByteStore(os.path.dirname(os.path.abspath(path))))


def refusal(checkpoint: Checkpoint) -> str:
    """Why a command other than an audit refuses such a file (``tieaudit check`` reports it)."""
    code = [g for g in checkpoint.pickle_globals if g.verdict == "runs-code"]
    named = printable(", ".join(g.name for g in code)[:300])
    why = next((g.refused for g in code if g.refused), "it holds no tensors tieaudit reads")
    return (
        f"{printable(why[:400])}; no tensors, and it names {named}, which "
        "torch.load(weights_only=False) would import and run (TIE010; `tieaudit check` reports it)"
    )


def walk_file(path: str, *, limit: int, until_code: bool = False) -> Walk:
    """The walk of the pickles torch.load(weights_only=False) unpickles from the start of a file
    that is no zip (the legacy stream's five when the first is torch's magic number), through a
    memory map, at most limit bytes of it. ``until_code``: stop at the first global that runs code."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if not size:
                return Walk()  # emptied since it was looked at: no pickle
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return walk_pickles(mapped, min(size, limit), size, until_code=until_code)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", path) from None
