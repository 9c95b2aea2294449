"""Hugging Face model folders, built with transformers ``save_pretrained`` from tiny random configs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file, save_model

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.records import Checkpoint
from tieaudit.formats import hf_ties
from tieaudit.formats.hf_reader import HfDirReader

BERT: dict[str, Any] = {
    "vocab_size": 100,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}
LLAMA: dict[str, Any] = {
    "vocab_size": 100,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}

BUILDERS: dict[str, Callable[[], transformers.PreTrainedModel]] = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=1, eos_token_id=1
        )
    ),
    "llama-tied": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**LLAMA, tie_word_embeddings=True)
    ),
    "llama-untied": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**LLAMA, tie_word_embeddings=False)
    ),
    "t5": lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(vocab_size=100, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    ),
    "bert-mlm": lambda: transformers.BertForMaskedLM(transformers.BertConfig(**BERT, intermediate_size=32)),
    "bert-base": lambda: transformers.BertModel(transformers.BertConfig(**BERT, intermediate_size=32)),
    "albert-mlm": lambda: transformers.AlbertForMaskedLM(
        transformers.AlbertConfig(**BERT, embedding_size=8, intermediate_size=32)
    ),
}


class Saved:
    """A live model and the folder save_pretrained wrote it to."""

    def __init__(self, model: transformers.PreTrainedModel, folder: Path) -> None:
        self.model = model
        self.folder = folder

    @property
    def truth(self) -> dict[str, str]:
        """What transformers itself ties in the live model."""
        return dict(self.model.get_expanded_tied_weights_keys(all_submodels=True))

    def config(self) -> dict[str, Any]:
        return dict(json.loads((self.folder / "config.json").read_text()))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Saved]:
    """Each model built and saved once per module, on first use."""
    cache: dict[str, Saved] = {}

    def get(name: str) -> Saved:
        if name not in cache:
            torch.manual_seed(0)
            model = BUILDERS[name]()
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder)
            cache[name] = Saved(model, folder)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2 saved in several shards with a model.safetensors.index.json."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("sharded")
    BUILDERS["gpt2"]().save_pretrained(folder, max_shard_size="20KB")
    return folder


def copy_of(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(folder, target)
    return target


def read(folder: Path | str) -> OpenCheckpoint:
    """Read a folder (config ties come from tieaudit's tie table)."""
    return HfDirReader().read(str(folder))


def config_ties(checkpoint: Checkpoint) -> dict[str, str]:
    return {t.dropped: t.kept for t in checkpoint.declared_ties if t.declared_by == "config"}


def rewrite_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# --- config ties against the live model ------------------------------------------------------

MODELS = sorted(BUILDERS)


@pytest.mark.parametrize("name", MODELS)
def test_config_ties_equal_the_live_models_ties(saved: Callable[[str], Saved], name: str) -> None:
    with read(saved(name).folder) as opened:
        checkpoint = opened.checkpoint
        assert config_ties(checkpoint) == saved(name).truth
        assert all("table" in t.where for t in checkpoint.declared_ties)


@pytest.mark.parametrize("name", ["gpt2", "llama-tied", "t5", "bert-mlm", "albert-mlm"])
def test_tied_targets_are_declared_but_not_stored(saved: Callable[[str], Saved], name: str) -> None:
    with read(saved(name).folder) as opened:
        checkpoint = opened.checkpoint
        ties = config_ties(checkpoint)
        assert ties
        for target, source in ties.items():
            assert target not in checkpoint.names
            assert source in checkpoint.names
            assert target in saved(name).model.state_dict()


def test_untied_llama_declares_nothing_and_stores_its_head(saved: Callable[[str], Saved]) -> None:
    with read(saved("llama-untied").folder) as opened:
        checkpoint = opened.checkpoint
        assert config_ties(checkpoint) == {}
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= checkpoint.names
        assert checkpoint.config is not None and checkpoint.config.tie_word_embeddings is False


def test_bert_model_has_no_head_so_no_ties(saved: Callable[[str], Saved]) -> None:
    with read(saved("bert-base").folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.config is not None and checkpoint.config.tie_word_embeddings is True
        assert checkpoint.declared_ties == ()
        assert checkpoint.skipped == ()  # known class: nothing unresolved


def test_where_names_the_resolver(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    with read(saved("gpt2").folder) as opened:
        checkpoint = opened.checkpoint
        assert [t.where for t in checkpoint.declared_ties] == ["config.json (tie_word_embeddings, table)"]
    # A class the old hand-written table did not hold comes from the generated table too.
    from safetensors.numpy import save_file
    from transformers import GPTNeoConfig

    config = GPTNeoConfig(
        vocab_size=64,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        attention_types=[[["global"], 1]],
        max_position_embeddings=16,
    )
    config.architectures = ["GPTNeoForCausalLM"]
    config.save_pretrained(tmp_path)
    save_file({"transformer.wte.weight": np.zeros((64, 16), np.float32)}, str(tmp_path / "model.safetensors"))
    with read(str(tmp_path)) as opened:
        checkpoint = opened.checkpoint
        assert [(t.dropped, t.kept, t.where) for t in checkpoint.declared_ties] == [
            ("lm_head.weight", "transformer.wte.weight", "config.json (tie_word_embeddings, table)")
        ]


# --- the table against transformers, on the saved configs -----------------------------------


def variants(saved: Callable[[str], Saved]) -> list[dict[str, Any]]:
    """Every saved config, plus each with the tie flag false and absent."""
    configs = []
    for name in MODELS:
        config = saved(name).config()
        configs.extend([config, {**config, "tie_word_embeddings": False}])
        configs.append({k: v for k, v in config.items() if k != "tie_word_embeddings"})
    return configs


def test_table_answers_as_transformers_builds_the_same_configs(saved: Callable[[str], Saved]) -> None:
    """For real saved configs (not the class defaults the generator starts from), the table's
    answer is what transformers computes when it builds the class from that config."""
    for config in variants(saved):
        (architecture,) = config["architectures"]
        (resolution,) = hf_ties.resolve_ties(config, "config.json")
        model_class = getattr(transformers, architecture)
        with torch.device("meta"):
            model = model_class(model_class.config_class.from_dict(dict(config)))
        assert resolution.resolver == "table", architecture
        assert dict(resolution.ties) == model.get_expanded_tied_weights_keys(all_submodels=True), config


def test_t5_ties_even_when_the_config_says_false(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("t5").folder, tmp_path)
    rewrite_json(folder / "config.json", tie_word_embeddings=False)
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert config_ties(checkpoint) == saved("t5").truth
        assert checkpoint.config is not None and checkpoint.config.tie_word_embeddings is False
        assert "tie_word_embeddings=false forced to true" in checkpoint.declared_ties[0].where


def test_bert_bias_tie_follows_the_flag(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("bert-mlm").folder, tmp_path)
    rewrite_json(folder / "config.json", tie_word_embeddings=False)
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert config_ties(checkpoint) == {}


@pytest.mark.parametrize(("name", "tied"), [("gpt2", True), ("llama-tied", False)])
def test_absent_flag_takes_the_class_default(
    saved: Callable[[str], Saved], tmp_path: Path, name: str, tied: bool
) -> None:
    folder = copy_of(saved(name).folder, tmp_path)
    config = saved(name).config()
    del config["tie_word_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.config is not None and checkpoint.config.tie_word_embeddings is None
        assert bool(config_ties(checkpoint)) is tied
        assert all("not stated, defaulted to true" in t.where for t in checkpoint.declared_ties)


def test_unknown_architecture_is_noted_not_guessed(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("gpt2").folder, tmp_path)
    rewrite_json(folder / "config.json", architectures=["MadeUpForCausalLM"])
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.declared_ties == ()
        (note,) = checkpoint.skipped
        assert note.reason == (
            "architecture MadeUpForCausalLM is not in tieaudit's tie table "
            f"(transformers {hf_ties.tie_table().transformers_version}); config tie not resolved"
        )


def test_config_without_architectures_is_noted(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("gpt2").folder, tmp_path)
    config = saved("gpt2").config()
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.declared_ties == ()
        assert [s.reason for s in checkpoint.skipped] == ["no architectures listed; config tie not resolved"]


def test_nested_text_config_supplies_flag_and_vocab(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("gpt2").folder, tmp_path)
    config = saved("gpt2").config()
    text = {"tie_word_embeddings": True, "vocab_size": 77}
    del config["tie_word_embeddings"], config["vocab_size"]
    (folder / "config.json").write_text(json.dumps({**config, "text_config": text}))
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.config is not None
        assert (checkpoint.config.tie_word_embeddings, checkpoint.config.vocab_size) == (True, 77)


# --- weight files ---------------------------------------------------------------------------


def test_sharded_folder_reads_every_shard_and_the_index(sharded: Path) -> None:
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    with read(sharded) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.format == "hf-dir"
        assert checkpoint.names == set(index["weight_map"])
        assert set(checkpoint.files) == {"config.json", "model.safetensors.index.json", *shards}
        for tensor in checkpoint.tensors:
            assert tensor.file == index["weight_map"][tensor.name]
            assert tensor.storage_id.startswith(f"{tensor.file}#")
        assert config_ties(checkpoint) == {"lm_head.weight": "transformer.wte.weight"}


def test_sharded_bytes_are_the_models_bytes(sharded: Path) -> None:
    torch.manual_seed(0)
    state = BUILDERS["gpt2"]().state_dict()
    with read(sharded) as opened:
        checkpoint = opened.checkpoint
        for tensor in checkpoint.tensors:
            assert (opened.array(tensor) == state[tensor.name].numpy()).all(), tensor.name


def test_index_metadata_tie_records_are_declared_by_index(sharded: Path, tmp_path: Path) -> None:
    folder = copy_of(sharded, tmp_path)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["metadata"]["lm_head.weight"] = "transformer.wte.weight"
    index_path.write_text(json.dumps(index))
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        by_index = [t for t in checkpoint.declared_ties if t.declared_by == "index"]
        assert [(t.dropped, t.kept) for t in by_index] == [("lm_head.weight", "transformer.wte.weight")]


def test_shard_metadata_tie_records_are_declared_by_metadata(tmp_path: Path) -> None:
    model = BUILDERS["gpt2"]()
    save_model(model, str(tmp_path / "model.safetensors"))  # drops one alias, records {dropped: kept}
    with read(tmp_path) as opened:
        checkpoint = opened.checkpoint
        (tie,) = [t for t in checkpoint.declared_ties if t.declared_by == "metadata"]
        assert {tie.dropped, tie.kept} == {"lm_head.weight", "transformer.wte.weight"}
        assert tie.where == "model.safetensors:__metadata__"
        assert checkpoint.config is None


@pytest.mark.parametrize(
    "evil", ["../evil.safetensors", "/tmp/evil.safetensors", "sub/../../evil.safetensors"]
)
def test_index_leaving_the_folder_is_unsafe(sharded: Path, tmp_path: Path, evil: str) -> None:
    folder = copy_of(sharded, tmp_path)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["lm_head.weight"] = evil
    index_path.write_text(json.dumps(index))
    with pytest.raises(UnsafeInputError, match="leaves the model folder"):
        read(folder)


def test_shard_symlinked_outside_the_folder_is_unsafe(sharded: Path, tmp_path: Path) -> None:
    folder = copy_of(sharded, tmp_path)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    with pytest.raises(UnsafeInputError, match="outside the model folder"):
        read(folder)


def test_hub_cache_snapshot_links_into_blobs_are_allowed(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    snapshot = tmp_path / "models--x--y" / "snapshots" / "abc123"
    blobs = tmp_path / "models--x--y" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for source in saved("gpt2").folder.iterdir():
        shutil.copy(source, blobs / f"sha-{source.name}")
        (snapshot / source.name).symlink_to(Path("../../blobs") / f"sha-{source.name}")
    with read(snapshot) as opened:
        checkpoint = opened.checkpoint
        assert "transformer.wte.weight" in checkpoint.names


def test_empty_weight_map_is_an_error(sharded: Path, tmp_path: Path) -> None:
    folder = copy_of(sharded, tmp_path)
    rewrite_json(folder / "model.safetensors.index.json", weight_map={})
    with pytest.raises(InputError, match="weight_map lists no tensors"):
        read(folder)


def test_weight_map_naming_an_absent_tensor_is_an_error(sharded: Path, tmp_path: Path) -> None:
    folder = copy_of(sharded, tmp_path)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost.weight"] = index["weight_map"]["transformer.wte.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(InputError, match="'ghost.weight'"):
        read(folder)


def test_loose_safetensors_files_are_merged_with_namespaced_storages(tmp_path: Path) -> None:
    save_file({"a.weight": torch.ones(4, 4)}, str(tmp_path / "first.safetensors"))
    save_file(
        {"a.weight": torch.zeros(4, 4), "b.weight": torch.zeros(2)}, str(tmp_path / "second.safetensors")
    )
    with pytest.raises(InputError, match="stored in both first.safetensors and second.safetensors"):
        read(tmp_path)
    save_file({"c.weight": torch.zeros(2)}, str(tmp_path / "second.safetensors"))
    with read(tmp_path) as opened:
        checkpoint = opened.checkpoint
        assert set(checkpoint.storages) == {"first.safetensors#a.weight", "second.safetensors#c.weight"}


def test_pytorch_model_bin_is_read(tmp_path: Path) -> None:
    model = BUILDERS["gpt2"]()
    model.config.architectures = ["GPT2LMHeadModel"]  # what model.save_pretrained would add
    model.config.save_pretrained(tmp_path)
    # transformers 5 save_pretrained writes only safetensors (safe_serialization is gone)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with read(tmp_path) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.files == ("config.json", "pytorch_model.bin")
        head, embedding = checkpoint.tensor("lm_head.weight"), checkpoint.tensor("transformer.wte.weight")
        assert head.storage_id == embedding.storage_id  # torch.save keeps the alias
        assert head.file == "pytorch_model.bin"
        assert config_ties(checkpoint) == {"lm_head.weight": "transformer.wte.weight"}
        expected = model.state_dict()["transformer.wte.weight"].numpy()
        assert (opened.array(embedding) == expected).all()


# --- config and tokenizer files ---------------------------------------------------------------


def test_folder_without_weights_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# a model card, no weights\n")
    with pytest.raises(InputError, match=r"no weights found \(looked for .*\.safetensors"):
        read(tmp_path)


def test_invalid_config_json_is_named(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("gpt2").folder, tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="config.json is not valid JSON"):
        read(folder)


def test_tokenizer_vocab_size_counts_added_tokens_beyond_the_vocab(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = copy_of(saved("gpt2").folder, tmp_path)
    tokenizer = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}},
        "added_tokens": [{"id": 1, "content": "b"}, {"id": 104, "content": "<pad>"}],
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.config is not None
        assert (checkpoint.config.vocab_size, checkpoint.config.tokenizer_vocab_size) == (100, 105)
        assert "tokenizer.json" in checkpoint.files


def test_unigram_tokenizer_vocab_is_a_list() -> None:
    from tieaudit.formats.hf.tokenizer import tokenizer_vocab_size

    assert tokenizer_vocab_size({"model": {"type": "Unigram", "vocab": [["a", 0.0], ["b", -1.0]]}}) == 2


def test_broken_tokenizer_is_a_note_not_a_failure(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    folder = copy_of(saved("gpt2").folder, tmp_path)
    (folder / "tokenizer.json").write_text("{")
    with read(folder) as opened:
        checkpoint = opened.checkpoint
        assert checkpoint.config is not None and checkpoint.config.tokenizer_vocab_size is None
        assert [s.name for s in checkpoint.skipped] == ["tokenizer.json"]


def test_sniff_takes_folders_only(saved: Callable[[str], Saved]) -> None:
    folder = saved("gpt2").folder
    assert HfDirReader().sniff(str(folder), b"")
    assert not HfDirReader().sniff(os.path.join(folder, "model.safetensors"), b"\x00" * 8)
