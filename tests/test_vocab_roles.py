"""TIE004 compares the tensors the tie table names for the class, not whatever ends in
``output.weight`` (issue 11): RWKV, LED, BigBirdPegasus and ProphetNet have projections named
``*.output.weight`` inside their blocks. Without a known class only whole names whose role is
unambiguous count. A head stored transposed relative to its embedding is read by its logical shape.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from tieaudit.cli.main import main
from tieaudit.formats.hf_reader import HfDirReader

SMALL: dict[str, Any] = {
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
}
SMALL.update(encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=100, d_model=16)

BUILDERS: dict[str, Callable[[bool], transformers.PreTrainedModel]] = {
    "RwkvForCausalLM": lambda tie: transformers.RwkvForCausalLM(
        transformers.RwkvConfig(
            vocab_size=100,
            hidden_size=16,
            num_hidden_layers=2,
            attention_hidden_size=16,
            intermediate_size=32,
            context_length=32,
            tie_word_embeddings=tie,
        )
    ),
    "LEDForConditionalGeneration": lambda tie: transformers.LEDForConditionalGeneration(
        transformers.LEDConfig(
            **SMALL,
            max_encoder_position_embeddings=64,
            max_decoder_position_embeddings=64,
            attention_window=[4],
            tie_word_embeddings=tie,
        )
    ),
    "BigBirdPegasusForConditionalGeneration": lambda tie: transformers.BigBirdPegasusForConditionalGeneration(
        transformers.BigBirdPegasusConfig(
            **SMALL, max_position_embeddings=64, attention_type="original_full", tie_word_embeddings=tie
        )
    ),
    "ProphetNetForConditionalGeneration": lambda tie: transformers.ProphetNetForConditionalGeneration(
        transformers.ProphetNetConfig(
            vocab_size=100,
            hidden_size=16,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_encoder_attention_heads=2,
            num_decoder_attention_heads=2,
            ngram=2,
            num_buckets=8,
            relative_max_distance=16,
            max_position_embeddings=64,
            tie_word_embeddings=tie,
        )
    ),
    "GPTNeoXForCausalLM": lambda tie: transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=100,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
            tie_word_embeddings=tie,
        )
    ),
    "BertForMaskedLM": lambda tie: transformers.BertForMaskedLM(
        transformers.BertConfig(
            vocab_size=100,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            tie_word_embeddings=tie,
        )
    ),
}
PROJECTIONS = [
    "RwkvForCausalLM",
    "LEDForConditionalGeneration",
    "BigBirdPegasusForConditionalGeneration",
    "ProphetNetForConditionalGeneration",
]
"""Classes with ``*.output.weight`` projections inside their blocks."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], Path]:
    """save_pretrained of each class, tied or not, once per module; a torch.save of its state
    dict beside the folder (``<folder>.pt``)."""
    cache: dict[tuple[str, bool], Path] = {}

    def get(name: str, tie: bool) -> Path:
        if (name, tie) not in cache:
            torch.manual_seed(0)
            model = BUILDERS[name](tie)
            folder = tmp_path_factory.mktemp(name) / f"tie-{tie}"
            model.save_pretrained(folder)
            torch.save(model.state_dict(), folder.with_suffix(".pt"))
            cache[(name, tie)] = folder
        return cache[(name, tie)]

    return get


def _check(path: Path, tmp_path: Path, *options: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"check-{len(list(tmp_path.glob('check-*')))}.json"
    code = main(["check", str(path), *options, "--format", "json", "--output", str(out)])
    document: dict[str, Any] = json.loads(out.read_text())
    return code, document


def _rules(document: dict[str, Any]) -> list[str]:
    return [f["rule"] for f in document["findings"]]


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("name", PROJECTIONS)
def test_block_projections_are_not_the_head(
    saved: Callable[[str, bool], Path], name: str, tie: bool, tmp_path: Path
) -> None:
    folder = saved(name, tie)
    for path in (folder, folder.with_suffix(".pt")):
        code, document = _check(path, tmp_path, "--fail-on", "error")
        assert "TIE004" not in _rules(document), (path.name, document["findings"])
        assert code == 0


def _edited(folder: Path, tmp_path: Path, name: str, rows: int) -> Path:
    """A copy of folder whose tensor name has rows rows (random values)."""
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    weights = load_file(str(copy / "model.safetensors"))
    tensor = weights[name]
    weights[name] = np.random.default_rng(0).standard_normal((rows, *tensor.shape[1:])).astype(tensor.dtype)
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


@pytest.mark.parametrize(
    ("name", "head"),
    [("RwkvForCausalLM", "head.weight"), ("GPTNeoXForCausalLM", "embed_out.weight")],
)
def test_the_tables_head_with_other_rows_is_misaligned(
    saved: Callable[[str, bool], Path], name: str, head: str, tmp_path: Path
) -> None:
    """The head the table names (as the file spells it) is the one compared."""
    code, document = _check(_edited(saved(name, False), tmp_path, head, 120), tmp_path, "--fail-on", "error")
    (finding,) = [f for f in document["findings"] if f["rule"] == "TIE004"]
    assert head in finding["names"] and f"output rows ({head}) = 120" in finding["message"]
    assert code == 1


def test_a_tied_output_bias_is_compared_as_stored(saved: Callable[[str, bool], Path], tmp_path: Path) -> None:
    """BERT ties ``cls.predictions.decoder.bias`` to ``cls.predictions.bias`` and stores only the
    latter: the role follows the tie to what is stored."""
    folder = saved("BertForMaskedLM", True)
    with HfDirReader().read(str(folder)) as opened:
        checkpoint = opened.checkpoint
    assert checkpoint.config is not None and checkpoint.config.roles is not None
    roles = checkpoint.config.roles
    assert (roles.input_embedding, roles.output_embedding, roles.output_bias) == (
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.word_embeddings.weight",
        "cls.predictions.bias",
    )
    code, document = _check(_edited(folder, tmp_path, "cls.predictions.bias", 90), tmp_path)
    (finding,) = [f for f in document["findings"] if f["rule"] == "TIE004"]
    assert "output bias length (cls.predictions.bias) = 90" in finding["message"]
    assert code == 1


def test_roles_are_spelled_as_the_file_stores_them(saved: Callable[[str, bool], Path]) -> None:
    with HfDirReader().read(str(saved("GPTNeoXForCausalLM", False))) as opened:
        checkpoint = opened.checkpoint
    assert checkpoint.config is not None and checkpoint.config.roles is not None
    roles = checkpoint.config.roles
    assert (roles.input_embedding, roles.output_embedding, roles.output_bias) == (
        "gpt_neox.embed_in.weight",
        "embed_out.weight",
        None,
    )


def test_several_architectures_give_no_roles(saved: Callable[[str, bool], Path], tmp_path: Path) -> None:
    folder = tmp_path / "two"
    shutil.copytree(saved("RwkvForCausalLM", False), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["RwkvForCausalLM", "RwkvModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with HfDirReader().read(str(folder)) as opened:
        checkpoint = opened.checkpoint
    assert checkpoint.config is not None and checkpoint.config.roles is None
    code, document = _check(folder, tmp_path, "--fail-on", "error")
    assert "TIE004" not in _rules(document) and code == 0  # no whole name matches a block projection


def test_the_text_configs_vocab_size_is_the_models() -> None:
    """PaliGemma's config class writes a top-level vocab_size that keeps its default."""
    from tieaudit.formats.hf_ties import stated_vocab_size

    assert stated_vocab_size({"vocab_size": 257152, "text_config": {"vocab_size": 100}}, "c.json") == 100
    assert stated_vocab_size({"vocab_size": 257152, "text_config": {}}, "c.json") == 257152


# --- files without a known class: only whole names ---------------------------------------------


def _safetensors(tmp_path: Path, tensors: dict[str, tuple[int, int]]) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "m.safetensors"
    save_file({k: rng.standard_normal(shape).astype(np.float32) for k, shape in tensors.items()}, str(path))
    return path


def test_a_suffix_inside_a_block_is_not_a_head(tmp_path: Path) -> None:
    path = _safetensors(
        tmp_path,
        {"model.embed_tokens.weight": (100, 16), "rwkv.blocks.0.attention.output.weight": (16, 16)},
    )
    assert _rules(_check(path, tmp_path)[1]) == []


def test_a_top_level_output_weight_is_the_head(tmp_path: Path) -> None:
    path = _safetensors(tmp_path, {"tok_embeddings.weight": (100, 16), "output.weight": (90, 16)})
    (finding,) = _check(path, tmp_path)[1]["findings"]
    assert finding["rule"] == "TIE004" and "output rows (output.weight) = 90" in finding["message"]


# --- a head stored transposed -------------------------------------------------------------------

VOCAB, WIDTH = 1000, 64


def _transposed(tmp_path: Path, view: bool) -> Path:
    embedding = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(0))
    head = embedding.t() if view else embedding.t().clone()
    path = tmp_path / ("view.pt" if view else "clone.pt")
    torch.save({"model.embed_tokens.weight": embedding, "lm_head.weight": head}, path)
    return path


def test_a_transposed_view_head_is_read_by_its_logical_shape(tmp_path: Path) -> None:
    code, document = _check(_transposed(tmp_path, view=True), tmp_path)
    assert _rules(document) == [] and code == 0
    assert [g["relation"] for g in document["alias_groups"]] == ["transposed"]


def test_a_transposed_copy_head_and_its_retie_pass(tmp_path: Path) -> None:
    clone = _transposed(tmp_path, view=False)
    code, document = _check(clone, tmp_path, "--fail-on", "error")
    assert _rules(document) == ["TIE001"] and document["findings"][0]["relation"] == "transposed"
    assert code == 0
    retied = tmp_path / "retied.pt"
    assert main(["retie", str(clone), str(retied)]) == 0
    code, document = _check(retied, tmp_path)
    assert _rules(document) == [] and code == 0
