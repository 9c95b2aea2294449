"""A transformers Trainer ``checkpoint-N/`` folder's training files, read with its model as one checkpoint.

Beside the model's weights the Trainer writes ``optimizer.pt`` (the optimizer's state dict),
``scheduler.pt``, ``rng_state.pth`` (``rng_state_<rank>.pth`` per process), ``scaler.pt`` (mixed
precision), ``training_args.bin`` (the pickled ``TrainingArguments``) and ``trainer_state.json``.
Each pickle is read by the torch reader; its tensors join the folder's checkpoint under the
file's stem (``optimizer.state.0.exp_avg``: the stored path inside the file, prefixed), its
storages as ``file#id``; the globals their pickles name (numpy arrays in ``rng_state.pth``, the
``TrainingArguments`` class) are read as inert placeholders and reported (TIE010/TIE011). A file
the torch reader refuses is listed with the reason, never passed over in silence: when its pickles
name code (a torch file the reader refuses, a pre-0.4 tar, a bare pickle) they are TIE010's, and one
whose pickles tieaudit cannot walk to their end fails the folder (``walked.UnwalkedPickle``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tieaudit.core.errors import InputError
from tieaudit.core.records import Checkpoint, PickleGlobal, Skipped, StorageInfo, TensorInfo, UnreadTensor
from tieaudit.core.training import OptimizerRecord, OptimizerSlot, TrainingLayout, TrainingPart
from tieaudit.core.units import plural

TRAINER_FILES = {
    "trainer_state.json": "trainer-state",
    "optimizer.pt": "optimizer",
    "scheduler.pt": "lr-scheduler",
    "scaler.pt": "grad-scaler",
    "rng_state.pth": "rng-state",
    "rng_state_*.pth": "rng-state",
    "training_args.bin": "training-args",
}
"""A Trainer ``checkpoint-N/`` folder's files besides the model's, by role (a name with ``*`` is a
glob: one RNG state per process). The one list of them (``formats.hf_dir`` re-exports it)."""
JSON_NOTE = "present; JSON counters and logs, no tensors"
"""Status of trainer_state.json in the report."""
BARE_PICKLE_READ = "read: a pickle, not torch.save data (torch.load unpickles it before failing); no tensors"
"""Status of a file the torch reader refuses that is a pickle naming code (``formats.bare_pickle``)."""
WALKED_READ = "read for the globals its pickles name only, no tensors: {why}"
"""Status of a file tieaudit read no tensors from whose pickles name code (``formats.walked``)."""


def trainer_files(folder: str) -> list[str]:
    """The Trainer files (TRAINER_FILES) a folder holds, in that order (no link is followed here)."""
    found: list[str] = []
    for name in TRAINER_FILES:
        if "*" in name:
            found += sorted(os.path.basename(m) for m in glob.glob(os.path.join(glob.escape(folder), name)))
        elif os.path.lexists(os.path.join(folder, name)):
            found.append(name)
    return found


def _role(name: str) -> str:
    return TRAINER_FILES.get(name) or TRAINER_FILES["rng_state_*.pth"]


@dataclass(frozen=True, kw_only=True)
class TrainerRead:
    """What a Trainer folder's training files add to its checkpoint."""

    tensors: tuple[TensorInfo, ...] = ()
    """Their tensors, named ``<stem>.<stored path>``, files relative to the folder."""
    storages: Mapping[str, StorageInfo] = field(default_factory=dict)
    """Their storages, ids ``<file>#<id>``."""
    memory: Mapping[str, bytes] = field(default_factory=dict)
    """Storage bytes held in memory (legacy pickles), by storage id."""
    skipped: tuple[Skipped, ...] = ()
    """Their non-tensor entries, prefixed like the tensors."""
    skipped_more: int = 0
    """Further non-tensor entries, counted."""
    files: tuple[str, ...] = ()
    """The files read."""
    parts: tuple[TrainingPart, ...] = ()
    """Every training file with its role and whether it was read."""
    optimizers: tuple[OptimizerRecord, ...] = ()
    """The optimizer state dicts found, paths and names prefixed."""
    layout: TrainingLayout | None = None
    """The folder's training layout (set by ``read_trainer_folder``)."""
    pickle_globals: tuple[PickleGlobal, ...] = ()
    """The globals their pickles name, files relative to the folder (TIE010/TIE011)."""
    unread: tuple[UnreadTensor, ...] = ()
    """Their tensors listed but not read, prefixed like the tensors."""

    def part_fields(self) -> dict[str, Any]:
        """What the folder reader's FilePart takes from this (tensors, storages, notes, memory)."""
        return {
            "tensors": self.tensors,
            "storages": dict(self.storages),
            "skipped": self.skipped,
            "skipped_more": self.skipped_more,
            "memory": dict(self.memory),
            "pickle_globals": self.pickle_globals,
            "unread": self.unread,
        }


def _stem(file: str) -> str:
    return os.path.splitext(os.path.basename(file))[0]


def _prefixed_optimizer(record: OptimizerRecord, stem: str, file: str) -> OptimizerRecord:
    def name(stored: str) -> str:
        return f"{stem}.{stored}"

    slots = tuple(
        OptimizerSlot(key=s.key, tensors={k: name(v) for k, v in s.tensors.items()}, shape=s.shape)
        for s in record.slots
    )
    path = name(record.path) if record.path else stem
    return OptimizerRecord(path=path, groups=record.groups, slots=slots, file=file)


def _rebased(ckpt: Checkpoint, stem: str, file: str) -> tuple[list[TensorInfo], dict[str, StorageInfo]]:
    tensors = [
        dataclasses.replace(t, name=f"{stem}.{t.name}", storage_id=f"{file}#{t.storage_id}", file=file)
        for t in ckpt.tensors
    ]
    storages = {
        f"{file}#{sid}": dataclasses.replace(s, storage_id=f"{file}#{sid}", file=file)
        for sid, s in ckpt.storages.items()
    }
    return tensors, storages


def read_trainer_folder(
    folder: str, *, confine: Callable[[str, str], str], model: Sequence[TensorInfo], ordered: bool
) -> TrainerRead | None:
    """A folder's Trainer files and its layout (model: the weight files' tensors); None when it
    holds none. confine(folder, name) gives a file's path or refuses a name or link leaving it."""
    names = trainer_files(folder)
    if not names:
        return None
    read = read_trainer_files(folder, [(n, confine(folder, n), _role(n)) for n in names])
    weights = sorted({t.file for t in model})
    layout = trainer_layout(model, read, ordered=ordered, weights=weights)
    return dataclasses.replace(read, layout=layout)


def read_trainer_files(folder: str, files: Sequence[tuple[str, str, str]]) -> TrainerRead:
    """Read each (file relative to folder, its confined path, its role); a pickle the torch reader
    refuses is listed with the reason (its safety is the torch reader's call, not ours)."""
    from tieaudit.formats.bare_pickle import bare_pickle_globals
    from tieaudit.formats.torch_file import TorchReader
    from tieaudit.formats.walked import UnwalkedPickle

    tensors: list[TensorInfo] = []
    storages: dict[str, StorageInfo] = {}
    memory: dict[str, bytes] = {}
    skipped: list[Skipped] = []
    more = 0
    read: list[str] = []
    parts: list[TrainingPart] = []
    optimizers: list[OptimizerRecord] = []
    named: list[PickleGlobal] = []
    unread: list[UnreadTensor] = []
    for file, path, role in files:
        if file.endswith(".json"):
            parts.append(TrainingPart(path=file, role=role, status=JSON_NOTE))
            continue
        stem = _stem(file)
        try:
            opened = TorchReader(torchscript=False).read(path)
        except UnwalkedPickle:
            raise  # code cannot be ruled out: never listed as merely not read
        except InputError as exc:
            bare = bare_pickle_globals(path, file)  # not torch.save data, but unpickled by torch.load
            named += bare
            read += [file] if bare else []
            status = BARE_PICKLE_READ if bare else f"not read: {exc.message}"
            parts.append(TrainingPart(path=file, role=role, status=status))
            continue
        with opened:
            ckpt = opened.checkpoint
            more_tensors, more_storages = _rebased(ckpt, stem, file)
            in_memory = {sid: s for sid, s in ckpt.storages.items() if s.file_offset < 0}
            memory.update({f"{file}#{sid}": bytes(opened.store.buffer(s)) for sid, s in in_memory.items()})
        tensors += more_tensors
        storages.update(more_storages)
        skipped += [Skipped(f"{stem}.{s.name}", s.reason, file) for s in ckpt.skipped]
        unread += [dataclasses.replace(u, name=f"{stem}.{u.name}", file=file) for u in ckpt.unread]
        more += ckpt.skipped_more
        named += [dataclasses.replace(g, file=file) for g in ckpt.pickle_globals]
        read.append(file)
        layout: TrainingLayout | None = ckpt.training
        found = [_prefixed_optimizer(o, stem, file) for o in layout.optimizers] if layout else []
        optimizers += found
        status = "read" + (f", {plural(len(ckpt.tensors), 'tensor')}" if ckpt.tensors else ", no tensors")
        if ckpt.format == "pickle":  # refused as torch data, its pickles naming code (formats.walked)
            why = next((g.refused for g in ckpt.pickle_globals if g.refused), "")
            status = WALKED_READ.format(why=why)
        parts.append(TrainingPart(path=file, role=role, status=status))
    return TrainerRead(
        tensors=tuple(tensors),
        storages=storages,
        memory=memory,
        skipped=tuple(skipped),
        skipped_more=more,
        files=tuple(read),
        parts=tuple(parts),
        optimizers=tuple(optimizers),
        pickle_globals=tuple(named),
        unread=tuple(unread),
    )


def trainer_layout(
    model: Sequence[TensorInfo], trainer: TrainerRead, *, ordered: bool, weights: Sequence[str]
) -> TrainingLayout:
    """The folder's layout: the weight files are the model (stored unprefixed), the Trainer's
    optimizer.pt its optimizer state. ordered: the weights keep state_dict order (one .bin)."""
    return TrainingLayout(
        kind="trainer folder",
        model_prefix="",
        model_names=tuple(t.name for t in model),
        ordered=ordered,
        optimizers=trainer.optimizers,
        parts=(TrainingPart(path=", ".join(weights), role="model"), *trainer.parts),
    )
