"""Every retie output loads with the loader people use for its form, and gives the input back bit for bit.

- safetensors files: ``safetensors.torch.load_model(model, path, strict=True)`` into the live model
  that wrote the file, and ``load_file``;
- Hugging Face folders: ``from_pretrained`` with every head class of the family (T5's encoder-only
  and seq2seq classes load the same retied folder; so do ``BertModel`` and ``BertForMaskedLM``,
  ``LlamaModel`` and ``LlamaForCausalLM``), compared with the same class loading the input;
- ``.pt``: ``torch.load(weights_only=True)``;
- ONNX: an onnxruntime ``InferenceSession``, outputs equal to the input model's.

Models are tiny, built from transformers configs (random init, no network).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from conftest import Corpus
from safetensors.torch import load_file, load_model, save_file, save_model

from tieaudit.cli.main import main
from tieaudit.repair.retie import retie

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB = 256
LAYERS = {"num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
SMALL = {**LAYERS, "hidden_size": 32, "max_position_embeddings": 64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(width)


def assert_bitwise(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    assert expected, "nothing compared"
    for name, value in expected.items():
        assert name in actual, name
        assert value.dtype == actual[name].dtype and value.shape == actual[name].shape, name
        assert torch.equal(bits(value), bits(actual[name])), name


def clean(path: Path, tmp_path: Path) -> None:
    """check of the output: nothing at or above the default --fail-on (no copy left, no orphan)."""
    assert main(["check", str(path), "--output", str(tmp_path / "check.txt")]) == 0


def build(class_name: str, config_name: str, tied: bool, **kwargs: Any) -> Any:
    config = getattr(transformers, config_name)(vocab_size=VOCAB, tie_word_embeddings=tied, **kwargs)
    torch.manual_seed(0)
    return getattr(transformers, class_name)(config)


# --- safetensors files: load_model(strict=True) into the live model, and load_file -----------------


def _mamba() -> Any:
    kwargs = {"hidden_size": 32, "state_size": 8, "num_hidden_layers": 2, "expand": 2}
    return build("MambaForCausalLM", "MambaConfig", True, **kwargs)


def _llama(tied: bool) -> Any:
    return build("LlamaForCausalLM", "LlamaConfig", tied, **SMALL, num_key_value_heads=2)


def mamba_save_model(path: Path) -> tuple[Callable[[], Any], dict[str, Any]]:
    """save_model of a tied Mamba: the head recorded, A_log equal in both layers (by construction)."""
    save_model(_mamba(), str(path))
    return _mamba, {}


def llama_recorded_copy(path: Path) -> tuple[Callable[[], Any], dict[str, Any]]:
    """save_model's record {dropped: kept}, with the dropped name stored again as a copy."""
    saved = path.with_suffix(".saved")
    save_model(_llama(True), str(saved))
    raw = saved.read_bytes()
    metadata = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]
    state = load_file(str(saved))
    ((dropped, kept),) = [(k, v) for k, v in metadata.items() if k != "format"]
    state[dropped] = state[kept].clone()
    save_file(state, str(path), metadata=metadata)
    return lambda: _llama(True), {}


def llama_clone_all_equal(path: Path) -> tuple[Callable[[], Any], dict[str, Any]]:
    """An untied head cloned from the embedding, no record: re-tied only with --all-equal, and then
    load_model accepts it only into a model that shares the two (the printed consequence)."""
    model = _llama(False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return lambda: _llama(True), {"all_equal": True}


SAFETENSORS_FILES = {
    "mamba_save_model": mamba_save_model,
    "llama_recorded_copy": llama_recorded_copy,
    "llama_clone_all_equal": llama_clone_all_equal,
}


@pytest.mark.parametrize("form", sorted(SAFETENSORS_FILES))
def test_safetensors_file_loads_with_load_model_strict_and_load_file(tmp_path: Path, form: str) -> None:
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    live, options = SAFETENSORS_FILES[form](source)
    result = retie(str(source), str(out), **options)
    expected = load_file(str(source))
    if result.written is None:  # nothing to re-tie (Mamba's A_log copies only): the input is the file
        assert result.nothing_to_retie and not out.exists()
        out = source

    model = live()
    missing, unexpected = load_model(model, str(out), strict=True)
    assert not missing and not unexpected
    assert_bitwise(expected, model.state_dict())  # every input tensor, restored ones included

    stored = load_file(str(out))
    assert set(stored) == set(expected) - {d.dropped for d in result.plan.applied}
    assert_bitwise(stored, expected)
    if form == "llama_clone_all_equal":
        with pytest.raises(RuntimeError, match="Missing key"):
            load_model(_llama(False), str(out), strict=True)
    if form == "llama_recorded_copy":
        clean(out, tmp_path)  # (Mamba's A_log copies are left on purpose: check still names them)


# --- Hugging Face folders: from_pretrained with every class of the family --------------------------


def t5_cloned(folder: Path) -> None:
    """Tied T5 whose four tied names are each stored as a copy (the state dict cloned)."""
    kwargs = {"d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2}
    model = build("T5ForConditionalGeneration", "T5Config", True, **kwargs)
    folder.mkdir()
    model.config.architectures = ["T5ForConditionalGeneration"]
    model.config.save_pretrained(folder)
    state = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def bert_cloned(folder: Path) -> None:
    """Untied BERT MLM whose head weight is a copy of the word embeddings (biases both zeros)."""
    model = build("BertForMaskedLM", "BertConfig", False, **SMALL)
    with torch.no_grad():
        model.cls.predictions.decoder.weight.copy_(model.bert.embeddings.word_embeddings.weight)
    model.save_pretrained(folder)


def llama_cloned(folder: Path) -> None:
    """Untied Llama whose head is a copy of the embedding."""
    model = _llama(False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.save_pretrained(folder)


FAMILIES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "t5": (t5_cloned, ("T5ForConditionalGeneration", "T5EncoderModel", "T5Model")),
    "bert": (bert_cloned, ("BertForMaskedLM", "BertModel")),
    "llama": (llama_cloned, ("LlamaForCausalLM", "LlamaModel")),
}


def _loaded(class_name: str, folder: Path) -> tuple[dict[str, torch.Tensor], set[str]]:
    model, info = getattr(transformers, class_name).from_pretrained(str(folder), output_loading_info=True)
    return dict(model.state_dict()), set(info["missing_keys"])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_folder_loads_with_from_pretrained_for_every_class_of_the_family(tmp_path: Path, family: str) -> None:
    make, classes = FAMILIES[family]
    source, out = tmp_path / "in", tmp_path / "out"
    make(source)
    result = retie(str(source), str(out))
    assert result.plan.applied and all(d.applied for d in result.plan.decisions)
    file_in = load_file(str(source / "model.safetensors"))
    file_out = load_file(str(out / "model.safetensors"))
    assert set(file_out) == set(file_in) - {d.dropped for d in result.plan.applied}
    assert_bitwise(file_out, file_in)
    clean(out, tmp_path)

    for index, class_name in enumerate(classes):
        before, missing_before = _loaded(class_name, source)
        after, missing_after = _loaded(class_name, out)
        assert missing_after == missing_before, class_name  # nothing new comes back random
        assert after.keys() == before.keys(), class_name
        assert_bitwise({k: v for k, v in before.items() if k not in missing_before}, after)
        if index == 0:  # the class that wrote the folder: every stored input tensor, by its own name
            assert_bitwise(file_in, after)


# --- .pt: torch.load(weights_only=True) ------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["torch_cloned_head", "torch_transposed_copy"])
def test_pt_loads_with_torch_load_weights_only(corpus: Corpus, tmp_path: Path, fixture: str) -> None:
    source, out = corpus.path(fixture), tmp_path / "out.pt"
    result = retie(str(source), str(out))
    assert result.plan.applied
    before = torch.load(str(source), weights_only=True)
    after = torch.load(str(out), weights_only=True)
    assert after.keys() == before.keys()
    assert_bitwise(before, after)
    for decision in result.plan.applied:
        dropped, kept = after[decision.dropped], after[decision.kept]
        assert dropped.untyped_storage().data_ptr() == kept.untyped_storage().data_ptr()
    clean(out, tmp_path)


# --- ONNX: onnxruntime gives the input model's outputs ----------------------------------------------


def _feeds(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else (1 if i == 0 else 8) for i, d in enumerate(spec.shape)]
        assert spec.type == "tensor(int64)", spec
        feeds[spec.name] = rng.integers(0, VOCAB, size=shape, dtype=np.int64)
    return feeds


def _outputs(path: Path, feeds: dict[str, np.ndarray] | None = None) -> tuple[dict[str, Any], list[Any]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(session) if feeds is None else feeds
    return feeds, session.run(None, feeds)


@pytest.mark.parametrize("fixture", ["onnx_helper_duplicate", "onnx_gpt2_cloned_dynamo"])
def test_onnx_runs_in_onnxruntime_with_the_input_models_outputs(
    corpus: Corpus, tmp_path: Path, fixture: str
) -> None:
    source, out = corpus.path(fixture), tmp_path / "out.onnx"
    result = retie(str(source), str(out))
    assert result.plan.applied
    feeds, expected = _outputs(source)
    _, actual = _outputs(out, feeds)
    assert len(actual) == len(expected)
    for left, right in zip(expected, actual, strict=True):
        assert left.dtype == right.dtype and left.shape == right.shape
        assert np.array_equal(left, right)
    clean(out, tmp_path)
