"""A folder's weight sets by their shard index: ``model.safetensors.index.json`` and the variants saved
beside it (``save_pretrained(variant="fp16")`` writes ``model.safetensors.index.fp16.json`` and
``model.fp16-00001-of-00002.safetensors``; diffusers and ``pytorch_model.bin`` the same way).

A shard index names one checkpoint: the folder read with the weights it lists. ``check`` of a folder
audits its plain weights as the folder and each sharded variant beside them as its own checkpoint,
addressed by its index file, so that a variant's shards are read together (a copy across two shards
is one checkpoint's untied copy, not a copy across files).
"""

from __future__ import annotations

import fnmatch
import os

SHARD_INDEXES = (
    "*.safetensors.index.json",
    "*.safetensors.index.*.json",
    "*.bin.index.json",
    "*.bin.index.*.json",
)
"""Names of shard index files (transformers', diffusers' and PEFT's, plain and variant)."""


def is_shard_index(name: str) -> bool:
    """Whether a file name (no folder) is a shard index's."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SHARD_INDEXES)


def index_target(path: str) -> bool:
    """Whether path names a shard index file: a checkpoint read through the folder holding it."""
    return is_shard_index(os.path.basename(path)) and os.path.isfile(path)


def variant_of(index: str) -> str:
    """The variant an index's name carries (``model.safetensors.index.fp16.json`` -> ``fp16``), or
    empty for a plain index."""
    stem = os.path.basename(index)[: -len(".json")]
    return stem.split(".index.", 1)[1] if ".index." in stem else ""


def weights_folder(path: str) -> str:
    """The model folder a checkpoint path reads: the path itself, or the folder of an index file."""
    return os.path.dirname(path) or os.curdir if index_target(path) else path


def beside_weights(folder: str, chosen: str | None) -> list[str]:
    """The shard indexes present in folder other than chosen (the one its reader reads, if any),
    sorted: each a checkpoint of its own."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n for n in names if n != chosen and index_target(os.path.join(folder, n)))
