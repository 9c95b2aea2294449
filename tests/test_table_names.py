"""Declared ties spelled as the files store them (issue 11: names as the file spells them).

transformers names some tensors one way in memory and writes them another way
(``save_pretrained`` applies its key-conversion map in reverse): GPT-NeoX's head is
``lm_head.weight`` in memory and ``embed_out.weight`` on disk; LLaVA and PaliGemma write
``language_model.model.embed_tokens.weight`` / ``language_model.lm_head.weight``; Qwen2-VL writes its
embedding as ``model.embed_tokens.weight``. Tiny models are built here from configs (random init, no
network), saved with ``save_pretrained``, and the truth is taken from transformers itself: the
head's stored name is the key the untied save holds and the tied save does not, and the stored
embedding is the one whose bytes are the live model's input embedding.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from tieaudit.cli.main import main
from tieaudit.formats.tie_table import tie_table

TEXT = {
    "vocab_size": 100,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}


def _neox(tie: bool) -> transformers.PreTrainedModel:
    config = transformers.GPTNeoXConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
    )
    return transformers.GPTNeoXForCausalLM(config)


def _llava(tie: bool) -> transformers.PreTrainedModel:
    config = transformers.LlavaConfig(
        text_config={"model_type": "llama", **TEXT, "num_key_value_heads": 2},
        vision_config={"model_type": "clip_vision_model", **VISION, "image_size": 8, "patch_size": 4},
        image_token_index=99,
        tie_word_embeddings=tie,
    )
    return transformers.LlavaForConditionalGeneration(config)


def _paligemma(tie: bool) -> transformers.PreTrainedModel:
    config = transformers.PaliGemmaConfig(
        text_config={"model_type": "gemma", **TEXT, "head_dim": 8},
        vision_config={"model_type": "siglip_vision_model", **VISION, "image_size": 8, "patch_size": 4},
        image_token_index=99,
        projection_dim=16,
        tie_word_embeddings=tie,
    )
    return transformers.PaliGemmaForConditionalGeneration(config)


def _qwen2_vl(tie: bool) -> transformers.PreTrainedModel:
    text = {**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
    text.update(bos_token_id=0, eos_token_id=0)
    vision = {"depth": 1, "embed_dim": 16, "hidden_size": 16, "num_heads": 2, "mlp_ratio": 2, "patch_size": 2}
    vision.update(spatial_merge_size=1, temporal_patch_size=1)
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie)
    return transformers.Qwen2VLForConditionalGeneration(config)


BUILDERS: dict[str, Callable[[bool], transformers.PreTrainedModel]] = {
    "GPTNeoXForCausalLM": _neox,
    "LlavaForConditionalGeneration": _llava,
    "PaliGemmaForConditionalGeneration": _paligemma,
    "Qwen2VLForConditionalGeneration": _qwen2_vl,
}
CLASSES = sorted(BUILDERS)


@dataclass(frozen=True)
class Pair:
    """One class saved tied and untied, and the names transformers wrote."""

    tied: Path
    """save_pretrained of the tied model."""
    untied: Path
    """save_pretrained of the untied model (same seed)."""
    embedding: str
    """The stored name of the input embedding (its bytes are the live tied model's embedding)."""
    head: str
    """The stored name of the head: the one key the untied save holds and the tied save does not."""


def _stored_name(weights: dict[str, np.ndarray], live: torch.Tensor | torch.nn.Module) -> str:
    assert isinstance(live, torch.Tensor), type(live)  # an embedding's weight (Module.__getattr__'s type)
    (name,) = [
        k for k, v in weights.items() if v.shape == tuple(live.shape) and np.array_equal(v, live.numpy())
    ]
    return name


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Pair]:
    cache: dict[str, Pair] = {}

    def get(name: str) -> Pair:
        if name not in cache:
            base = tmp_path_factory.mktemp(name)
            models = {}
            for tie in (True, False):
                torch.manual_seed(0)
                models[tie] = BUILDERS[name](tie)
                models[tie].save_pretrained(base / str(tie))
            tied = load_file(str(base / "True" / "model.safetensors"))
            untied = load_file(str(base / "False" / "model.safetensors"))
            (head,) = set(untied) - set(tied)
            with torch.no_grad():
                embedding = _stored_name(tied, models[True].get_input_embeddings().weight)
                assert _stored_name(untied, models[False].get_output_embeddings().weight) == head
            cache[name] = Pair(base / "True", base / "False", embedding, head)
        return cache[name]

    return get


def _report(args: list[str], tmp_path: Path, expect: int) -> dict[str, Any]:
    out = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    assert main([*args, "--format", "json", "--output", str(out)]) == expect
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def _edited(folder: Path, tmp_path: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> Path:
    """A copy of folder whose model.safetensors went through edit."""
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    weights = load_file(str(copy / "model.safetensors"))
    edit(weights)
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def _config_ties(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["target"], t["source"]) for t in report["declared_ties"] if t["declared_by"] == "config"]


@pytest.mark.parametrize("name", CLASSES)
def test_tied_save_declares_the_tie_on_the_stored_names(
    saved: Callable[[str], Pair], name: str, tmp_path: Path
) -> None:
    pair = saved(name)
    report = _report(["inspect", str(pair.tied)], tmp_path, 0)
    assert _config_ties(report) == [(pair.head, pair.embedding)]
    stored = {t["name"] for t in report["tensors"]}
    assert pair.embedding in stored and pair.head not in stored
    assert _report(["check", str(pair.tied)], tmp_path, 0)["findings"] == []


@pytest.mark.parametrize("name", CLASSES)
def test_a_diverged_head_is_a_broken_tie(saved: Callable[[str], Pair], name: str, tmp_path: Path) -> None:
    pair = saved(name)

    def diverge(weights: dict[str, np.ndarray]) -> None:
        weights[pair.head] = weights[pair.embedding] + np.float32(0.5)

    folder = _edited(pair.tied, tmp_path, diverge)
    report = _report(["check", str(folder)], tmp_path, 1)
    assert [(f["rule"], f["names"]) for f in report["findings"]] == [("TIE002", [pair.head, pair.embedding])]


@pytest.mark.parametrize("name", CLASSES)
def test_only_the_head_stored_is_an_orphan(saved: Callable[[str], Pair], name: str, tmp_path: Path) -> None:
    pair = saved(name)

    def orphan(weights: dict[str, np.ndarray]) -> None:
        weights[pair.head] = weights.pop(pair.embedding)

    report = _report(["check", str(_edited(pair.tied, tmp_path, orphan))], tmp_path, 1)
    assert [(f["rule"], f["names"]) for f in report["findings"]] == [("TIE003", [pair.head, pair.embedding])]


@pytest.mark.parametrize("name", CLASSES)
def test_a_cloned_head_is_one_copy_the_config_declares_tied(
    saved: Callable[[str], Pair], name: str, tmp_path: Path
) -> None:
    pair = saved(name)

    def clone(weights: dict[str, np.ndarray]) -> None:
        weights[pair.head] = weights[pair.embedding].copy()

    report = _report(["check", str(_edited(pair.tied, tmp_path, clone))], tmp_path, 1)
    (finding,) = report["findings"]
    assert (finding["rule"], set(finding["names"])) == ("TIE001", {pair.head, pair.embedding})
    assert "the config declares them tied, so the loader ties them again" in finding["message"]


@pytest.mark.parametrize("name", CLASSES)
def test_a_cloned_head_with_the_tie_off_is_a_copy(
    saved: Callable[[str], Pair], name: str, tmp_path: Path
) -> None:
    pair = saved(name)

    def clone(weights: dict[str, np.ndarray]) -> None:
        weights[pair.head] = weights[pair.embedding].copy()

    report = _report(["check", str(_edited(pair.untied, tmp_path, clone))], tmp_path, 1)
    assert _config_ties(report) == []
    (finding,) = report["findings"]
    assert (finding["rule"], set(finding["names"])) == ("TIE001", {pair.head, pair.embedding})


@pytest.mark.parametrize("name", CLASSES)
def test_a_folder_in_the_in_memory_spelling_keeps_it(
    saved: Callable[[str], Pair], name: str, tmp_path: Path
) -> None:
    """Another transformers version may write the in-memory names: the tie follows the file."""
    pair = saved(name)
    entry = tie_table().entry(name)
    assert entry is not None
    memory = {v: k for k, v in entry.disk_names.items() if v is not None}
    embedding, head = memory.get(pair.embedding, pair.embedding), memory.get(pair.head, pair.head)

    def in_memory(weights: dict[str, np.ndarray]) -> None:
        for stored in list(weights):
            weights[memory.get(stored, stored)] = weights.pop(stored)
        weights[head] = weights[embedding] + np.float32(0.5)

    report = _report(["check", str(_edited(pair.tied, tmp_path, in_memory))], tmp_path, 1)
    assert [(f["rule"], f["names"]) for f in report["findings"]] == [("TIE002", [head, embedding])]


def test_spelling_of_a_dropped_target_follows_its_source() -> None:
    """The rule on its own: a name stored under neither spelling takes its partner's convention,
    else the file's (the renamed names it does store), else the written one."""
    from tieaudit.formats.hf_ties import Spelling  # here: the base commit has no Spelling

    renames = {
        "lm_head.weight": "language_model.lm_head.weight",
        "m.embed.weight": "language_model.embed.weight",
    }
    on_disk = Spelling(renames, frozenset({"language_model.embed.weight"}))
    assert on_disk.spell(("lm_head.weight", "m.embed.weight")) == (
        "language_model.lm_head.weight",
        "language_model.embed.weight",
    )
    in_memory = Spelling(renames, frozenset({"m.embed.weight"}))
    assert in_memory.spell(("lm_head.weight", "m.embed.weight")) == ("lm_head.weight", "m.embed.weight")
    neither = Spelling(renames, frozenset({"other.weight"}))
    assert neither.spell(("lm_head.weight", "other.weight")) == (
        "language_model.lm_head.weight",
        "other.weight",
    )
    file_memory = Spelling(renames, frozenset({"m.embed.weight", "other.weight"}))
    assert file_memory.spell(("lm_head.weight", "other.weight")) == ("lm_head.weight", "other.weight")
    converted = Spelling({"lm_head.weight": None}, frozenset({"e.weight"}))
    assert converted.spell(("lm_head.weight", "e.weight")) == ("lm_head.weight", "e.weight")


@pytest.mark.parametrize("name", CLASSES)
def test_retie_of_a_cloned_head_drops_the_stored_head_and_loads_back(
    saved: Callable[[str], Pair], name: str, tmp_path: Path
) -> None:
    """retie's loader rule reads the class's ties in the file's spelling: the cloned head (stored
    as embed_out / language_model.lm_head) is dropped, check passes, from_pretrained restores it."""
    pair = saved(name)

    def clone(weights: dict[str, np.ndarray]) -> None:
        weights[pair.head] = weights[pair.embedding].copy()

    source = _edited(pair.tied, tmp_path, clone)
    out = tmp_path / "retied"
    assert main(["retie", str(source), str(out)]) == 0
    stored = load_file(str(out / "model.safetensors"))
    assert pair.head not in stored and pair.embedding in stored
    assert main(["check", str(out)]) == 0
    cls = getattr(transformers, name)
    with torch.no_grad():
        loaded = cls.from_pretrained(out)
        expected = torch.from_numpy(load_file(str(source / "model.safetensors"))[pair.head])
        assert torch.equal(loaded.get_output_embeddings().weight, expected)
        assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
