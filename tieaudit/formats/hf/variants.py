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

CONFIG = "config.json"
"""A Hugging Face model folder's configuration file."""
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


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""A PEFT adapter's weight files (read with the adapter_config.json beside them)."""
ADAPTER_STEM = "adapter_model."
"""How every PEFT adapter weight file's name starts."""


def may_be_adapter(path: str) -> bool:
    """Whether path can be a PEFT adapter: a folder, or a file named like an adapter's weights
    (the test made before any config is read)."""
    return os.path.isdir(path) or os.path.basename(path).startswith(ADAPTER_STEM)


def weights_target(path: str) -> bool:
    """Whether path names one weight set of the model folder holding it, read with that folder's
    configs: a shard index, an unsharded variant beside config.json (``model.fp16.safetensors``:
    ``from_pretrained(variant=...)`` reads it with that config), or a PEFT adapter's weights beside
    its adapter_config.json (beside the base model's weights too)."""
    name, folder = os.path.basename(path), os.path.dirname(path) or os.curdir
    if not os.path.isfile(path):
        return False
    if is_shard_index(name):
        return True
    if variant_file(name) and not name.startswith(ADAPTER_STEM):
        return os.path.isfile(os.path.join(folder, CONFIG))
    return name in ADAPTER_WEIGHTS and os.path.isfile(os.path.join(folder, "adapter_config.json"))


def weights_label(path: str) -> str:
    """How a weight set's retie output is named after its folder: its variant, ``adapter``, or empty."""
    name = os.path.basename(path)
    if is_shard_index(name):
        return variant_of(name)
    return variant_file(name) or ("adapter" if name in ADAPTER_WEIGHTS else "")


def weights_folder(path: str) -> str:
    """The model folder a checkpoint path reads: the path itself, or the folder of a weight set's file."""
    return os.path.dirname(path) or os.curdir if weights_target(path) else path


def beside_weights(folder: str, chosen: str | None) -> list[str]:
    """The shard indexes present in folder other than chosen (the one its reader reads, if any),
    sorted: each a checkpoint of its own."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n for n in names if n != chosen and index_target(os.path.join(folder, n)))


WEIGHT_STEMS = ("model", "pytorch_model", "diffusion_pytorch_model", "adapter_model")
"""Names of the weight files transformers, diffusers and PEFT save (before the variant and suffix)."""


def variant_file(name: str) -> str:
    """The variant a weight file's name carries, unsharded (``model.fp16.safetensors``,
    ``pytorch_model.fp16.bin`` -> ``fp16``), or empty."""
    stem, dot, suffix = name.rpartition(".")
    base, _, variant = stem.partition(".")
    if not dot or suffix not in ("safetensors", "bin") or base not in WEIGHT_STEMS or "-of-" in variant:
        return ""
    return variant if variant and "." not in variant else ""
