"""What retie re-ties by default: what the format's loader restores, and nothing equal by accident.

- A masked-LM head saved untied whose weight is an equal copy of the word embeddings: setting
  ``tie_word_embeddings`` also ties the head's ``decoder.bias`` to its ``bias``; both are zeros, a
  constant the copy search skips, so the plan compares their bytes and re-ties them too (a real
  difference refuses, naming the largest one).
- Tensors equal by construction (Mamba's ``A_log`` in every layer, Marian's sinusoidal position
  tables in encoder and decoder) in a ``safetensors.torch.save_model`` file are left: dropping one
  makes ``load_model(strict=True)`` fail. ``--all-equal`` re-ties them and says so, and that
  consequence is real.
- T5 and CTRL folders with every tied name stored as a copy keep the declared source.

Truth comes from the live transformers model (``_tied_weights_keys``, storage sharing), never from
tieaudit's tie table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, load_model, save_file, save_model

from tieaudit.cli.main import main
from tieaudit.core.errors import UsageError
from tieaudit.repair.retie import retie

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB = 256
NOT_A_TIE = "equal by construction is not a tie; --all-equal re-ties it"
LAYERS = {"num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
ENCODER = {**LAYERS, "hidden_size": 32, "max_position_embeddings": 64}
MASKED_LM: dict[str, tuple[str, dict[str, Any]]] = {
    "BertForMaskedLM": ("BertConfig", ENCODER),
    "RobertaForMaskedLM": ("RobertaConfig", ENCODER),
    "XLMRobertaForMaskedLM": ("XLMRobertaConfig", ENCODER),
    "AlbertForMaskedLM": ("AlbertConfig", {**ENCODER, "embedding_size": 16}),
    "DebertaForMaskedLM": ("DebertaConfig", ENCODER),
    "DebertaV2ForMaskedLM": ("DebertaV2Config", ENCODER),
    "MPNetForMaskedLM": ("MPNetConfig", ENCODER),
    "RoFormerForMaskedLM": ("RoFormerConfig", ENCODER),
    "MegatronBertForMaskedLM": ("MegatronBertConfig", ENCODER),
    "FNetForMaskedLM": ("FNetConfig", {k: v for k, v in ENCODER.items() if k != "num_attention_heads"}),
    "MobileBertForMaskedLM": (
        "MobileBertConfig",
        {**ENCODER, "embedding_size": 16, "true_hidden_size": 32, "intra_bottleneck_size": 32},
    ),
}


def build(class_name: str, config_name: str, tied: bool, **kwargs: Any) -> Any:
    config = getattr(transformers, config_name)(vocab_size=VOCAB, tie_word_embeddings=tied, **kwargs)
    torch.manual_seed(0)
    return getattr(transformers, class_name)(config)


def tied_keys(class_name: str, config_name: str, **kwargs: Any) -> dict[str, str]:
    """``{target: source}`` the live model ties with the flag on (transformers' own answer)."""
    keys: dict[str, str] = build(class_name, config_name, True, **kwargs)._tied_weights_keys
    return dict(keys)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(width)


def assert_bitwise(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    for name, value in expected.items():
        assert name in actual, name
        assert value.dtype == actual[name].dtype and value.shape == actual[name].shape, name
        assert torch.equal(bits(value), bits(actual[name])), name


def check_exit(path: Path) -> int:
    return main(["check", str(path)])


def masked_lm_copy(folder: Path, class_name: str) -> dict[str, str]:
    """An untied masked LM whose head weight holds the word embeddings, saved with save_pretrained.
    Returns what the class ties with the flag on."""
    config_name, kwargs = MASKED_LM[class_name]
    model = build(class_name, config_name, False, **kwargs)
    with torch.no_grad():
        model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight)
    model.save_pretrained(folder)
    return tied_keys(class_name, config_name, **kwargs)


# --- masked-LM heads: the bias the flag ties too ---------------------------------------------------


@pytest.mark.parametrize("class_name", sorted(MASKED_LM))
def test_masked_lm_copy_is_retied_with_its_equal_bias(tmp_path: Path, class_name: str) -> None:
    source, out = tmp_path / "in", tmp_path / "out"
    ties = masked_lm_copy(source, class_name)
    assert len(ties) == 2, ties  # the head weight and its decoder bias
    stored = load_file(str(source / "model.safetensors"))
    assert set(ties) <= set(stored)
    biases = [t for t in ties if t.endswith("bias")]
    assert all(not stored[t].any() and not stored[ties[t]].any() for t in biases)  # both zeros

    result = retie(str(source), str(out))
    assert {(d.dropped, d.kept) for d in result.plan.applied} == set(ties.items())
    (bias,) = [d for d in result.plan.applied if d.dropped in biases]
    assert "the model class ties it" in bias.why
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert set(load_file(str(out / "model.safetensors"))) == set(stored) - set(ties)
    loaded = getattr(transformers, class_name).from_pretrained(str(out))
    assert_bitwise(stored, loaded.state_dict())
    for target, source_name in ties.items():
        assert loaded.get_parameter(target) is loaded.get_parameter(source_name)
    assert check_exit(out) == 0


def test_masked_lm_plan_shows_the_bias_as_retied_because_the_class_ties_it(tmp_path: Path) -> None:
    masked_lm_copy(tmp_path / "bert", "BertForMaskedLM")
    run = subprocess.run(
        [sys.executable, "-m", "tieaudit", "retie", str(tmp_path / "bert"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "tie  cls.predictions.decoder.bias = cls.predictions.bias" in run.stdout
    assert "because: the model class ties it to cls.predictions.bias" in run.stdout


def _bert_state(bias: torch.Tensor, decoder_bias: torch.Tensor) -> dict[str, torch.Tensor]:
    words = torch.randn(VOCAB, 32)
    return {
        "bert.embeddings.word_embeddings.weight": words,
        "cls.predictions.decoder.weight": words.clone(),
        "cls.predictions.bias": bias,
        "cls.predictions.decoder.bias": decoder_bias,
    }


def _bert_folder(folder: Path, state: dict[str, torch.Tensor]) -> None:
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))


def test_masked_lm_bias_that_differs_refuses_naming_the_difference(tmp_path: Path) -> None:
    bias = torch.zeros(VOCAB)
    decoder_bias = bias.clone()
    decoder_bias[7] = 0.5
    _bert_folder(tmp_path / "bert", _bert_state(bias, decoder_bias))
    for dry_run in (True, False):  # the plan refuses: a dry run does not promise what a run refuses
        with pytest.raises(UsageError, match=r"cls\.predictions\.decoder\.bias.*differ by up to 0\.5"):
            retie(str(tmp_path / "bert"), str(tmp_path / "out"), dry_run=dry_run)
    assert sorted(os.listdir(tmp_path)) == ["bert"]


def test_flag_companion_below_min_size_is_compared_not_searched(tmp_path: Path) -> None:
    """Equal, non-constant biases smaller than --min-size: the copy search never sees them, the
    byte comparison does."""
    bias = torch.randn(VOCAB)
    _bert_folder(tmp_path / "bert", _bert_state(bias, bias.clone()))
    result = retie(str(tmp_path / "bert"), str(tmp_path / "out"), min_bytes=4096)
    assert {d.dropped for d in result.plan.applied} == {
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
    }


# --- equal by construction is not a tie ---------------------------------------------------------

BY_CONSTRUCTION: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "mamba": (
        "MambaForCausalLM",
        "MambaConfig",
        {"hidden_size": 32, "state_size": 8, "num_hidden_layers": 2, "expand": 2},
        "A_log",
    ),
    "marian": (
        "MarianMTModel",
        "MarianConfig",
        {
            "d_model": 32,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "max_position_embeddings": 64,
            "pad_token_id": 1,
            "decoder_start_token_id": 1,
            "eos_token_id": 0,
        },
        "embed_positions",
    ),
}


def save_model_file(path: Path, key: str) -> tuple[Any, str]:
    """A model saved with safetensors.torch.save_model (its ties recorded as {dropped: kept})."""
    class_name, config_name, kwargs, equal = BY_CONSTRUCTION[key]
    model = build(class_name, config_name, True, **kwargs)
    save_model(model, str(path))
    return model, equal


def fresh(key: str) -> Any:
    class_name, config_name, kwargs, _ = BY_CONSTRUCTION[key]
    return build(class_name, config_name, True, **kwargs)


@pytest.mark.parametrize("key", sorted(BY_CONSTRUCTION))
def test_equal_by_construction_is_left_and_load_model_strict_accepts_the_output(
    tmp_path: Path, key: str
) -> None:
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    model, equal = save_model_file(source, key)
    result = retie(str(source), str(out))
    left = [d for d in result.plan.decisions if equal in d.dropped]
    assert left and not any(d.applied for d in left)
    assert all(d.reason.startswith(NOT_A_TIE) for d in left)
    assert not [d for d in result.plan.applied if equal in d.dropped]
    assert result.written is not None or not out.exists()  # nothing to re-tie: the input stays the file
    target = fresh(key)
    missing, unexpected = load_model(target, str(out if result.written else source), strict=True)
    assert not missing and not unexpected
    assert_bitwise(model.state_dict(), target.state_dict())


@pytest.mark.parametrize("key", sorted(BY_CONSTRUCTION))
def test_relations_equal_alone_does_not_override_the_loader_rule(tmp_path: Path, key: str) -> None:
    source = tmp_path / "in.safetensors"
    _, equal = save_model_file(source, key)
    plan = retie(
        str(source), str(tmp_path / "out.safetensors"), relations=frozenset({"equal"}), dry_run=True
    ).plan
    assert not [d for d in plan.applied if equal in d.dropped]


@pytest.mark.parametrize("key", sorted(BY_CONSTRUCTION))
def test_all_equal_reties_them_and_its_consequence_is_real(tmp_path: Path, key: str) -> None:
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    model, equal = save_model_file(source, key)
    result = retie(str(source), str(out), all_equal=True)
    forced = [d for d in result.plan.applied if equal in d.dropped]
    assert forced and all("load_model(strict=True) will refuse this file" in d.consequence for d in forced)
    stored = load_file(str(out))
    assert not {d.dropped for d in forced} & set(stored)
    assert_bitwise({n: t for n, t in model.state_dict().items() if n in stored}, stored)
    with pytest.raises(RuntimeError, match="Missing key"):
        load_model(fresh(key), str(out), strict=True)


def test_all_equal_cli_prints_the_consequence_and_needs_equal(tmp_path: Path) -> None:
    source = tmp_path / "in.safetensors"
    save_model_file(source, "mamba")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tieaudit", "retie", str(source), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    default = cli("--dry-run")
    assert default.returncode == 0 and "left backbone.layers.1.mixer.A_log" in default.stdout
    assert f"why: {NOT_A_TIE}" in default.stdout
    forced = cli("--dry-run", "--all-equal")
    assert forced.returncode == 0 and "tie  backbone.layers.1.mixer.A_log" in forced.stdout
    assert "note: safetensors.torch.load_model(strict=True) will refuse this file" in forced.stdout
    assert "--all-equal: 1 copy re-tied" in forced.stdout
    refused = cli(str(tmp_path / "out.safetensors"), "--all-equal", "--relations", "transposed")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--relations leaves equal out" in refused.stderr and not (tmp_path / "out.safetensors").exists()
    helped = subprocess.run(
        [sys.executable, "-m", "tieaudit", "retie", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--all-equal" in helped.stdout and "equal by construction" in helped.stdout


def test_a_recorded_pair_stored_twice_is_retied_by_default(tmp_path: Path) -> None:
    """A {dropped: kept} record says the writing model shares the pair: load_model restores it."""
    model = build("LlamaForCausalLM", "LlamaConfig", True, **ENCODER, num_key_value_heads=2)
    saved = tmp_path / "saved.safetensors"
    save_model(model, str(saved))
    state = load_file(str(saved))
    record = {k: v for k, v in json.loads(_header(saved))["__metadata__"].items() if k != "format"}
    ((dropped, kept),) = record.items()
    state[dropped] = state[kept].clone()
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(state, str(source), metadata={"format": "pt", dropped: kept})
    result = retie(str(source), str(out))
    assert [(d.dropped, d.kept) for d in result.plan.applied] == [(dropped, kept)]
    target = build("LlamaForCausalLM", "LlamaConfig", True, **ENCODER, num_key_value_heads=2)
    load_model(target, str(out), strict=True)
    assert_bitwise(model.state_dict(), target.state_dict())


def _header(path: Path) -> str:
    raw = path.read_bytes()
    return raw[8 : 8 + int.from_bytes(raw[:8], "little")].decode()


def test_folder_copy_the_class_does_not_tie_with_all_equal_says_it_loads_randomly(tmp_path: Path) -> None:
    model = build("LlamaForCausalLM", "LlamaConfig", False, **ENCODER, num_key_value_heads=2)
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        attention.k_proj.weight.copy_(attention.q_proj.weight)
    model.save_pretrained(tmp_path / "in")
    left = retie(str(tmp_path / "in"), str(tmp_path / "default"), dry_run=True).plan
    assert [d.reason.startswith(NOT_A_TIE) for d in left.decisions if not d.applied] == [True]
    result = retie(str(tmp_path / "in"), str(tmp_path / "out"), all_equal=True)
    (forced,) = [d for d in result.plan.applied if d.consequence]
    assert f"from_pretrained will initialise {forced.dropped} randomly" in forced.consequence
    assert forced.dropped not in load_file(str(tmp_path / "out" / "model.safetensors"))
    loaded = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert not torch.equal(loaded.get_parameter(forced.dropped), model.get_parameter(forced.dropped))


# --- copy groups keep the declared source ----------------------------------------------------------

DECLARED_SOURCE = {
    "T5ForConditionalGeneration": (
        "T5Config",
        {"d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2},
    ),
    "CTRLLMHeadModel": (
        "CTRLConfig",
        {"n_embd": 32, "n_layer": 1, "n_head": 2, "dff": 64, "n_positions": 32},
    ),
}


def cloned_tied_folder(folder: Path, class_name: str) -> tuple[Any, dict[str, str]]:
    """A tied model whose every tied name is stored as its own copy (clone of the state dict)."""
    config_name, kwargs = DECLARED_SOURCE[class_name]
    model = build(class_name, config_name, True, **kwargs)
    folder.mkdir()
    model.config.architectures = [class_name]
    model.config.save_pretrained(folder)
    state = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return model, dict(model._tied_weights_keys)


@pytest.mark.parametrize("class_name", sorted(DECLARED_SOURCE))
def test_copy_group_keeps_the_declared_source_and_leaves_no_copy(tmp_path: Path, class_name: str) -> None:
    source, out = tmp_path / "in", tmp_path / "out"
    model, ties = cloned_tied_folder(source, class_name)
    sources = set(ties.values())
    result = retie(str(source), str(out))
    assert {d.kept for d in result.plan.applied} == sources
    assert {d.dropped for d in result.plan.applied} == set(ties)
    stored = set(load_file(str(out / "model.safetensors")))
    assert sources <= stored and not set(ties) & stored
    code = main(["check", str(out), "--format", "json", "--output", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and not [f["rule"] for f in report["findings"] if f["rule"] in ("TIE001", "TIE003")]
    loaded = getattr(transformers, class_name).from_pretrained(str(out))
    assert_bitwise(model.state_dict(), loaded.state_dict())
