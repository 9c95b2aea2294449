"""The Hugging Face folder reader: config, weights, tokenizer and a Trainer folder's training files
as one checkpoint (the pieces are in ``hf_dir`` and ``trainer_dir``)."""

from __future__ import annotations

import os

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.records import Checkpoint, Skipped
from tieaudit.formats.hf.layouts import folder_part
from tieaudit.formats.hf.tokenizer import read_tokenizer
from tieaudit.formats.hf.variants import ADAPTER_WEIGHTS, is_shard_index, weights_target
from tieaudit.formats.hf_dir import (
    ADAPTER_CONFIG,
    TOKENIZER,
    TORCH_SINGLE,
    FilePart,
    WeightSet,
    byte_store,
    check_weight_map,
    confined_path,
    find_weights,
    gather_declarations,
    read_config,
    read_index,
    read_part,
)
from tieaudit.formats.hf_ties import CONFIG, model_config
from tieaudit.formats.interface import Reader
from tieaudit.formats.trainer_dir import read_trainer_folder


def weights_at(path: str) -> tuple[str, WeightSet]:
    """The model folder a checkpoint path reads and its weights: a folder's as ``find_weights``
    chooses them, or those a shard index file lists (a variant beside the plain weights)."""
    if weights_target(path):
        folder, name = os.path.dirname(path) or os.curdir, os.path.basename(path)
        return folder, read_index(folder, name) if is_shard_index(name) else WeightSet(files=(name,))
    return path, find_weights(path)


class HfDirReader(Reader):
    """Hugging Face model folders (``save_pretrained`` output, hub snapshots), or one weight set of
    a folder named by its shard index file."""

    format = "hf-dir"

    def sniff(self, path: str, head: bytes) -> bool:
        return os.path.isdir(path) or weights_target(path)

    def read(self, path: str) -> OpenCheckpoint:
        folder, weights = weights_at(path)
        adapter = set(weights.files) <= set(ADAPTER_WEIGHTS)  # not a base model saved beside one
        # An adapter's weights beside its base: config.json is the base's, which PEFT reads apart.
        config, config_files = (None, []) if adapter and folder != path else read_config(folder)
        parts = [read_part(folder, file, len(weights.files) > 1) for file in weights.files]
        check_weight_map(weights, parts, folder)
        model = tuple(t for part in parts for t in part.tensors)
        ordered = weights.files == (TORCH_SINGLE,)  # a safetensors header is sorted by name
        trainer = read_trainer_folder(folder, confine=confined_path, model=model, ordered=ordered)
        if trainer is not None:
            parts.append(FilePart(file=", ".join(trainer.files), **trainer.part_fields()))
        tokenizer_size, tokenizer_files, tokenizer_notes = read_tokenizer(folder)
        ties, notes = gather_declarations(folder, config, weights, parts=parts)
        part = folder_part(folder)
        if part is not None and part.layout == "PEFT" and adapter:  # read for TIE013 and the loader's rule
            config_files.append(ADAPTER_CONFIG)
        if part is not None and not part.transformers_config and config is not None:
            notes = [n for n in notes if not n.name.startswith(f"{CONFIG}:architectures")]
            notes.append(Skipped(CONFIG, f"{part.describe()}: no transformers class, so no class ties"))
        index_files = [weights.index] if weights.index else []
        checkpoint = Checkpoint(
            path=path,
            format="hf-dir",
            tensors=tuple(t for part in parts for t in part.tensors),
            storages={sid: s for part in parts for sid, s in part.storages.items()},
            declared_ties=ties,
            skipped=tuple(notes + tokenizer_notes),
            skipped_more=sum(part.skipped_more for part in parts),
            pickle_globals=tuple(g for part in parts for g in part.pickle_globals),
            unread=tuple(u for part in parts for u in part.unread),
            config=model_config(
                config,
                os.path.join(folder, CONFIG),
                tokenizer_size=tokenizer_size,
                tokenizer_file=TOKENIZER,
                stored={t.name for part in parts for t in part.tensors},
            ),
            files=tuple(config_files + index_files + list(weights.files) + tokenizer_files)
            + (trainer.files if trainer else ()),
            training=trainer.layout if trainer else None,
        )
        return OpenCheckpoint(checkpoint, byte_store(folder, parts))
