"""Which files of a Hugging Face model folder its reader covers, without reading them.

Discovery audits every other file of the folder on its own (an ``onnx/`` export, a
``model.fp16.safetensors`` beside ``model.safetensors``, a ``.ckpt``), so this follows the reader's
own choices: ``find_weights`` (transformers' order of preference) and ``READ_BESIDE_WEIGHTS``.
"""

from __future__ import annotations

import fnmatch
import os

from tieaudit.core.errors import InputError
from tieaudit.formats.hf.variants import ADAPTER_WEIGHTS, beside_weights, is_shard_index, weights_target
from tieaudit.formats.hf_dir import (
    ADAPTER_CONFIG,
    DIFFUSERS_INDEX,
    READ_BESIDE_WEIGHTS,
    SAFE_INDEX,
    TORCH_INDEX,
    WeightSet,
    find_weights,
    load_json,
)
from tieaudit.formats.magic import is_lfs_pointer, read_head


def _listed_shards(folder: str, indexes: set[str]) -> set[str]:
    """The files the shard indexes present list, read leniently (a missing shard, a bad entry): the
    folder's audit says what is wrong with them, so none is audited as a checkpoint of its own."""
    listed: set[str] = set()
    for index in indexes:
        try:
            document = load_json(folder, index)
        except InputError:
            continue
        weight_map = document.get("weight_map") if isinstance(document, dict) else None
        if isinstance(weight_map, dict):
            listed.update(v for v in weight_map.values() if isinstance(v, str))
    return listed


def covered_files(folder: str) -> frozenset[str]:
    """The folder's files its reader reads, relative to it: those READ_BESIDE_WEIGHTS names that are
    present, and the weights ``find_weights`` chooses with their index. Never raises: when the
    weights cannot be chosen (a bad index), the index files present, whose audit reports why."""
    try:
        names = os.listdir(folder)
    except OSError:
        return frozenset()
    present = [name for name in names if os.path.isfile(os.path.join(folder, name))]
    covered = {n for n in present if any(fnmatch.fnmatchcase(n, p) for p in READ_BESIDE_WEIGHTS)}
    try:
        weights = find_weights(folder)
    except InputError:  # the folder's audit fails, naming why: its index and the shards it lists are its
        indexes = {n for n in present if n in (SAFE_INDEX, TORCH_INDEX, DIFFUSERS_INDEX)}
        return frozenset(covered | indexes | (_listed_shards(folder, indexes) & set(present)))
    covered.update(weights.files)
    if weights.index is not None:
        covered.add(weights.index)
    if not set(weights.files) <= set(ADAPTER_WEIGHTS):  # a base model's: the adapter beside reads it
        covered.discard(ADAPTER_CONFIG)
    # A TorchScript archive the folder's reader refuses (transformers cannot load it) is audited on
    # its own as well, as anywhere else: its report is not hidden behind the folder's.
    from tieaudit.formats.torchscript import is_torchscript_file  # the pickle machinery: only here

    return frozenset(n for n in covered if not is_torchscript_file(os.path.join(folder, n)))


def not_copied(folder: str, weights: WeightSet, *, alone: bool) -> set[str]:
    """The folder's files a writer of these weights does not copy: their own (it rewrites them) and,
    when they are one weight set of the folder (alone: a variant or an adapter named by its file),
    the folder's other weight sets, whose output is not theirs."""
    skip = {*weights.files, *([weights.index] if weights.index else [])}
    if alone:
        try:
            plain = find_weights(folder)
            skip.update(plain.files, [plain.index] if plain.index else [])
        except InputError:
            pass
        for name, parts in beside_sets(folder):  # its own set among them: already skipped
            skip.update((name, *parts))
        skip -= {ADAPTER_CONFIG} if set(weights.files) <= set(ADAPTER_WEIGHTS) else set()
    return skip


def beside_sets(folder: str) -> list[tuple[str, frozenset[str]]]:
    """Each weight set beside the weights the folder's reader reads, named by its file (a shard
    index, an unsharded variant, an adapter's weights), with the files read with it: a checkpoint of
    its own. An index listing a missing shard is not one (``loader_gaps`` makes it the folder's error)."""
    try:
        chosen = find_weights(folder)
        names = sorted(os.listdir(folder))
    except (InputError, OSError):
        return []
    own = {*chosen.files, chosen.index}
    found = []
    for index in beside_weights(folder, chosen.index):
        shards = _listed_shards(folder, {index})
        if shards and all(os.path.isfile(os.path.join(folder, s)) for s in shards):
            found.append((index, frozenset(shards)))
    found.extend(
        (name, frozenset({ADAPTER_CONFIG} if name in ADAPTER_WEIGHTS else ()))
        for name in names
        if name not in own
        and not is_shard_index(name)
        and weights_target(os.path.join(folder, name))
        and not _pointer(os.path.join(folder, name))  # a Git LFS pointer: skipped as such by discovery
    )
    return found


def _pointer(path: str) -> bool:
    try:
        head, size = read_head(path)
    except InputError:
        return False
    return is_lfs_pointer(head, size)
