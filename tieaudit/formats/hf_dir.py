"""Hugging Face model folders: config.json, weight files (single, sharded, indexed), tokenizer.json.

Weight files are chosen as ``find_weights`` says. Every file read must stay inside the folder, by
name and by link; the one exception is a hub cache snapshot, whose files
are links into the repository's ``blobs`` folder, and only when that folder is a real folder of
the repository (not a link: a ``blobs`` linked to ``/`` would make every file "inside").
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tieaudit.core.bytestore import ByteStore
from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.escape import printable, quoted
from tieaudit.core.limits import TooLarge, nesting_depth_exceeds, parse_failure, read_limited
from tieaudit.core.records import DeclaredTie, PickleGlobal, Skipped, StorageInfo, TensorInfo, UnreadTensor
from tieaudit.formats.hf.variants import is_shard_index, variant_file, variant_of
from tieaudit.formats.hf_ties import CONFIG, config_ties
from tieaudit.formats.magic import read_head, refuse_head
from tieaudit.formats.safetensors import read_header
from tieaudit.formats.tie_records import metadata_ties
from tieaudit.formats.trainer_dir import TRAINER_FILES as TRAINER_FILES  # the one list of them
from tieaudit.formats.trainer_dir import trainer_files as trainer_files

TOKENIZER = "tokenizer.json"
SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
TORCH_SINGLE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
DIFFUSERS_SAFE = "diffusion_pytorch_model.safetensors"  # a diffusers component's weights, by its names
DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
DIFFUSERS_TORCH = "diffusion_pytorch_model.bin"
ADAPTER_TORCH = "adapter_model.bin"  # a PEFT adapter's, saved with safe_serialization=False
TORCH_SINGLES = (TORCH_SINGLE, DIFFUSERS_TORCH, ADAPTER_TORCH)
LOOKED_FOR = ", ".join((SAFE_SINGLE, SAFE_INDEX, "*.safetensors", TORCH_INDEX, *TORCH_SINGLES, "variants"))
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter's (formats.hf.layouts reads it)
READ_BESIDE_WEIGHTS = (CONFIG, ADAPTER_CONFIG, TOKENIZER, *TRAINER_FILES)
"""Files (fnmatch patterns) read beside the weights when present; a file the reader learns to read
goes here too, so that discovery counts it as part of the folder (``hf_covered.covered_files``)."""


@dataclass(frozen=True, kw_only=True)
class WeightSet:
    """The weight files a folder holds, and the index that lists them, if any."""

    files: tuple[str, ...]
    """Weight files relative to the folder, in reading order."""
    index: str | None = None
    """The index file (relative), when the weights are sharded through one."""
    weight_map: Mapping[str, str] = field(default_factory=dict)
    """Index ``weight_map``: tensor name -> file holding it."""
    index_metadata: Mapping[str, str] = field(default_factory=dict)
    """The index's string-valued ``metadata`` entries (may hold ``{dropped: kept}`` records)."""


@dataclass(frozen=True, kw_only=True)
class FilePart:
    """What one weight file contributes to the folder's checkpoint."""

    file: str
    """The file, relative to the folder."""
    tensors: tuple[TensorInfo, ...]
    """Its tensors (files and storage ids rewritten for the folder once ``rebased``)."""
    storages: dict[str, StorageInfo]
    """Its storages by id (folder-wide once ``rebased``)."""
    declared_ties: tuple[DeclaredTie, ...] = ()
    """Ties the file itself records (safetensors ``__metadata__``)."""
    skipped: tuple[Skipped, ...] = ()
    """Entries the file's reader did not treat as tensors (at most MAX_KEPT_SKIPPED)."""
    skipped_more: int = 0
    """Further such entries, counted but not kept."""
    memory: dict[str, bytes] = field(default_factory=dict)
    """Storage bytes that live in memory rather than in the file, by storage id."""
    pickle_globals: tuple[PickleGlobal, ...] = ()
    """The globals its pickle names (torch files), relative to the folder."""
    unread: tuple[UnreadTensor, ...] = ()
    """Its tensors listed but not read (quantized, sparse, meta, ...: torch files)."""


MAX_CONFIG_BYTES = 16 << 20
"""Largest config.json read: real ones are KiB; 20 000-class id2label tables are about 1 MiB."""
MAX_INDEX_BYTES = 64 << 20
"""Largest shard index read: about 10 MiB lists the ~100 000 tensors of a 1T-parameter model."""
MAX_TOKENIZER_BYTES = 64 << 20
"""Largest tokenizer.json read (larger: a note, vocab size unknown): the biggest real ones are ~35 MiB."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of a folder's JSON files: configs, indexes and tokenizers nest under ten levels."""
JSON_LIMITS = {
    CONFIG: ("MAX_CONFIG_BYTES", MAX_CONFIG_BYTES),
    SAFE_INDEX: ("MAX_INDEX_BYTES", MAX_INDEX_BYTES),
    TORCH_INDEX: ("MAX_INDEX_BYTES", MAX_INDEX_BYTES),
    TOKENIZER: ("MAX_TOKENIZER_BYTES", MAX_TOKENIZER_BYTES),
}
"""Size limit of each JSON file a folder may hold, by name (others take the config's)."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def hub_blobs(folder: str) -> str | None:
    """``<repo>/blobs`` when folder is a hub cache snapshot (``<repo>/snapshots/<revision>``) or a
    folder in one (``unet/``, ``onnx/``), found by real path (no link reaches ``<repo>``); ``blobs``
    must then be a real folder in it (a link, to ``/`` or elsewhere, is no blobs folder)."""
    snapshot = os.path.realpath(folder)
    while os.path.basename(os.path.dirname(snapshot)) != "snapshots":
        if os.path.dirname(snapshot) == snapshot:
            return None
        snapshot = os.path.dirname(snapshot)
    blobs = os.path.join(os.path.dirname(os.path.dirname(snapshot)), "blobs")
    try:
        status = os.lstat(blobs)
    except OSError:
        return None
    return blobs if stat.S_ISDIR(status.st_mode) else None


def _encodable(name: str) -> bool:
    """Whether name can be a file name: no NUL byte, no lone surrogate from a JSON escape."""
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return False
    return "\0" not in name


def confined_path(folder: str, name: str, listed_in: str | None = None) -> str:
    """folder/name; refuses names and links leaving the folder (hub cache snapshot -> blobs allowed)."""
    source = f" (listed in {listed_in})" if listed_in else ""
    shown = printable(name)
    if not _encodable(name):
        raise InputError(f"file name '{shown}'{source} is not a valid file name", folder)
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
        raise UnsafeInputError(f"file name '{shown}'{source} leaves the model folder", folder)
    path = os.path.join(folder, name)
    real = os.path.realpath(path)
    blobs = hub_blobs(folder)
    if not _inside(real, os.path.realpath(folder)) and not (blobs and _inside(real, blobs)):
        raise UnsafeInputError(f"{shown}{source} is a link leading outside the model folder", folder)
    if not os.path.isfile(real):
        raise InputError(f"{shown}{source} is missing or not a regular file", folder)
    return path


class RepeatedKeyError(ValueError):
    """A key appears twice in one JSON object: Python's json keeps the last, other readers the first."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKeyError(f"the key {quoted(key, 80)} appears twice in one object")
            seen.add(key)
    return found


def load_json(folder: str, name: str, *, unique_keys: bool = False) -> Any:
    """Parse one JSON file of the folder, size and nesting bounded, with errors naming the file;
    unique_keys: a key repeated in one object is refused (a shard index: which shard holds a name
    must not depend on the reader keeping the first or the last)."""
    path = confined_path(folder, name)
    limit_name, limit = JSON_LIMITS.get(os.path.basename(name), JSON_LIMITS[CONFIG])
    try:
        data = read_limited(path, limit, name)
    except TooLarge as exc:
        raise InputError(f"{exc} ({limit_name})", folder) from exc
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}", folder) from exc
    try:
        document = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys if unique_keys else None)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, too many digits, too deep
        raise InputError(f"{name} is not valid JSON ({parse_failure(exc)})", folder) from exc
    if nesting_depth_exceeds(document, MAX_JSON_DEPTH):
        raise InputError(f"{name} nests arrays or objects deeper than {MAX_JSON_DEPTH} levels", folder)
    return document


def read_index(folder: str, name: str) -> WeightSet:
    """A shard index: its weight map (validated) and its string metadata."""
    index = load_json(folder, name, unique_keys=True)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise InputError(f"{name}: weight_map must map tensor names to file names", folder)
    if not weight_map:
        raise InputError(f"{name}: weight_map lists no tensors", folder)
    metadata = index.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InputError(f"{name}: metadata must be an object", folder)
    for file in dict.fromkeys(weight_map.values()):
        confined_path(folder, file, listed_in=name)
    normalized = {k: os.path.normpath(v).replace(os.sep, "/") for k, v in weight_map.items()}
    strings = {k: v for k, v in metadata.items() if isinstance(v, str)}
    return WeightSet(
        files=tuple(sorted(set(normalized.values()))),
        index=name,
        weight_map=normalized,
        index_metadata=strings,
    )


TORCH_SUFFIXES = (".bin", ".pt", ".pth")
"""Weight files of a folder that torch.load reads (the others are safetensors)."""


def torch_weights(files: tuple[str, ...]) -> bool:
    """True when a folder's weight files (or any of its files) include torch pickles."""
    return any(file.endswith(TORCH_SUFFIXES) for file in files)


def find_weights(folder: str) -> WeightSet:
    """The weight files to read, in transformers' order of preference (then diffusers' names, a
    variant's index, loose ``*.safetensors`` but a variant beside the file it varies: audited alone)."""
    def exists(name: str) -> bool:
        return os.path.isfile(os.path.join(folder, name))

    for single, index in ((SAFE_SINGLE, SAFE_INDEX), (DIFFUSERS_SAFE, DIFFUSERS_INDEX)):
        if exists(single):
            return WeightSet(files=(single,))
        if exists(index):
            return read_index(folder, index)
    try:
        names = os.listdir(folder)
    except OSError as exc:
        raise InputError(f"cannot list folder: {exc.strerror or exc}", folder) from exc
    variants = [n for n in names if is_shard_index(n) and variant_of(n) and exists(n)]
    safe = [n for n in variants if ".safetensors." in n]
    if len(safe) == 1:  # only a variant, sharded (model.safetensors.index.fp16.json): its index
        return read_index(folder, safe[0])
    loose = sorted(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(folder), "*.safetensors")))
    plain = set(loose)
    loose = [n for n in loose if n.split(".", 1)[0] + ".safetensors" not in plain or n.count(".") == 1]
    if loose:
        return WeightSet(files=tuple(loose))
    if exists(TORCH_SINGLE):
        return WeightSet(files=(TORCH_SINGLE,))
    if exists(TORCH_INDEX):
        return read_index(folder, TORCH_INDEX)
    for single in (DIFFUSERS_TORCH, ADAPTER_TORCH):
        if exists(single):
            return WeightSet(files=(single,))
    if len(variants) == 1:  # only a .bin variant, sharded (pytorch_model.bin.index.fp16.json)
        return read_index(folder, variants[0])
    singles = [n for n in names if variant_file(n) and n.endswith(".bin") and exists(n)]
    if len(singles) == 1:  # only a .bin variant (pytorch_model.fp16.bin)
        return WeightSet(files=(singles[0],))
    raise InputError(f"no weights found (looked for {LOOKED_FOR})", folder)


def read_safetensors_part(folder: str, file: str) -> FilePart:
    """One safetensors file: its header and its ``__metadata__`` tie records."""
    header = read_header(confined_path(folder, file), file)
    stored = {t.name for t in header.tensors}
    ties = metadata_ties(header.metadata, stored, f"{file}:__metadata__", declared_by="metadata")
    return FilePart(file=file, tensors=header.tensors, storages=header.storages, declared_ties=tuple(ties))


def read_torch_part(folder: str, file: str) -> FilePart:
    """One PyTorch file, read by the torch reader; in-memory storage bytes are copied out."""
    from tieaudit.formats.torch_file import TorchReader

    with TorchReader(torchscript=False).read(confined_path(folder, file)) as opened:
        sub = opened.checkpoint
        memory = {sid: bytes(opened.store.buffer(s)) for sid, s in sub.storages.items() if s.file_offset < 0}
        return FilePart(
            file=file,
            tensors=sub.tensors,
            storages=dict(sub.storages),
            declared_ties=sub.declared_ties,
            skipped=sub.skipped,
            skipped_more=sub.skipped_more,
            memory=memory,
            pickle_globals=tuple(dataclasses.replace(g, file=file) for g in sub.pickle_globals),
            unread=sub.unread,
        )


def rebased(part: FilePart, namespaced: bool) -> FilePart:
    """The part with files relative to the folder and, when merging, storage ids ``file#id``."""

    def key(storage_id: str) -> str:
        return f"{part.file}#{storage_id}" if namespaced else storage_id

    return dataclasses.replace(
        part,
        tensors=tuple(
            dataclasses.replace(t, storage_id=key(t.storage_id), file=part.file) for t in part.tensors
        ),
        storages={
            key(sid): dataclasses.replace(s, storage_id=key(sid), file=part.file)
            for sid, s in part.storages.items()
        },
        memory={key(sid): data for sid, data in part.memory.items()},
        unread=tuple(dataclasses.replace(u, file=part.file) for u in part.unread),
        skipped=tuple(dataclasses.replace(s, file=part.file) for s in part.skipped),
    )


def read_part(folder: str, file: str, namespaced: bool) -> FilePart:
    """One weight file by the reader of its kind (safetensors by name, else PyTorch), rebased."""
    shard = confined_path(folder, file)
    refuse_head(shard, *read_head(shard))  # an LFS pointer is named as one here too
    if file.endswith(".safetensors"):
        return rebased(read_safetensors_part(folder, file), namespaced)
    return rebased(read_torch_part(folder, file), namespaced)


def check_weight_map(weights: WeightSet, parts: list[FilePart], folder: str) -> None:
    """Every index entry must name a tensor its shard really holds; no name may be stored twice."""
    holder: dict[str, str] = {}
    for part in parts:
        for tensor in part.tensors:
            first = holder.setdefault(tensor.name, part.file)
            if first != part.file:
                raise InputError(f"tensor {tensor.name!r} is stored in both {first} and {part.file}", folder)
    for name, file in weights.weight_map.items():
        if holder.get(name) != file:
            raise InputError(
                f"{weights.index}: weight_map puts {name!r} in {file}, which does not hold it", folder
            )


def read_config(folder: str) -> tuple[dict[str, Any] | None, list[str]]:
    """config.json as an object (None when the folder has none) and the file read."""
    if not os.path.isfile(os.path.join(folder, CONFIG)):
        return None, []
    config = load_json(folder, CONFIG)
    if not isinstance(config, dict):
        raise InputError(f"{CONFIG} is not a JSON object", folder)
    return config, [CONFIG]


def gather_declarations(
    folder: str,
    config: Mapping[str, Any] | None,
    weights: WeightSet,
    *,
    parts: list[FilePart],
) -> tuple[tuple[DeclaredTie, ...], list[Skipped]]:
    """Ties declared by config.json, shard metadata and the index; notes on what was not resolved."""
    ties: list[DeclaredTie] = []
    notes: list[Skipped] = []
    stored = {t.name for part in parts for t in part.tensors}
    if config is not None:
        ties, notes = config_ties(config, os.path.join(folder, CONFIG), stored=stored)
    for part in parts:
        ties.extend(part.declared_ties)
        notes.extend(part.skipped)
    if weights.index is not None:
        where = f"{weights.index}:metadata"
        ties.extend(metadata_ties(dict(weights.index_metadata), stored, where, declared_by="index"))
    return unique_ties(ties), notes


def byte_store(folder: str, parts: list[FilePart]) -> ByteStore:
    """A store over the folder, holding the storages that live in memory."""
    store = ByteStore(folder)
    for part in parts:
        for storage_id, data in part.memory.items():
            store.hold(storage_id, data)
    return store


def unique_ties(ties: list[DeclaredTie]) -> tuple[DeclaredTie, ...]:
    """Ties in first-seen order, one per (target, source, declared_by)."""
    seen: dict[tuple[str, str, str], DeclaredTie] = {}
    for tie in ties:
        seen.setdefault((tie.dropped, tie.kept, tie.declared_by), tie)
    return tuple(seen.values())
