"""tieaudit export of the head classes users ship: the class comes from config.json's architectures.

Tiny random models (hidden 32, one layer, vocabulary 100) are saved with save_pretrained: a tied T5
(seq2seq: two files in the folder OUT, encoder_model.onnx and decoder_model.onnx, each re-tied and
checked) and a BertForMaskedLM (exported as itself, with input_ids and attention_mask). Other
classes are refused in one line naming the supported kinds and the class found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers

from tieaudit.cli.main import main
from tieaudit.runtime.export import export_model


def _perturbed(model: Any) -> Any:
    """Norm weights and biases off their ones and zeros: no two parameters hold equal values."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.normal_(0, 0.02)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("kinds")
    t5_config: dict[str, Any] = {
        "vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1,
        "num_heads": 4, "tie_word_embeddings": True, "decoder_start_token_id": 0, "pad_token_id": 0,
    }  # fmt: skip
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(**t5_config))
    bert = transformers.BertForMaskedLM(
        transformers.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64,
        )
    )  # fmt: skip
    for name, model in (("t5", t5), ("bert", bert)):
        _perturbed(model).save_pretrained(root / name)
    return {"t5": root / "t5", "bert": root / "bert"}


def test_t5_exports_encoder_and_decoder_files_each_retied_with_parity(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "t5-onnx"
    result = export_model(str(folders["t5"]), str(out), atol=1e-5)

    assert result.passed and result.written, result
    assert (result.kind, result.model_class) == ("seq2seq LM", "T5ForConditionalGeneration")
    assert sorted(p.name for p in out.iterdir()) == ["decoder_model.onnx", "encoder_model.onnx"]
    names = ("encoder_model.onnx", "decoder_model.onnx")
    assert [f.path for f in result.files] == [str(out / n) for n in names]
    assert result.remaining == () and result.max_abs_diff <= 1e-5 and result.runtime_error is None
    # The decoder reads the shared embedding twice (decoder embed and the tied lm_head): one initializer.
    decoder = result.files[1]
    assert [(d.relation, d.kept) for d in decoder.retied] == [("transposed", "lm_head.weight")]
    state = transformers.T5ForConditionalGeneration.from_pretrained(folders["t5"]).state_dict()
    for name in ("encoder_model.onnx", "decoder_model.onnx"):  # the model's own parameter names
        initializers = {i.name for i in onnx.load(str(out / name)).graph.initializer}
        assert {n for n in initializers if "." in n} <= set(state), name
        assert initializers & {"shared.weight", "encoder.embed_tokens.weight", "lm_head.weight"}, name
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        assert main(["check", str(out / name)]) == 0  # no TIE001: no copy in either file

    # Checked here, not taken from the result: the two files chained give T5's logits, at new sizes.
    model = transformers.T5ForConditionalGeneration.from_pretrained(folders["t5"]).eval()
    ids, decoder_ids = torch.randint(0, 100, (2, 6)), torch.randint(0, 100, (2, 3))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits.numpy()
    encoder = ort.InferenceSession(str(out / "encoder_model.onnx"))
    [hidden] = encoder.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    feeds = {"input_ids": decoder_ids.numpy(), "encoder_hidden_states": hidden}
    feeds["encoder_attention_mask"] = mask.numpy()
    [logits] = ort.InferenceSession(str(out / "decoder_model.onnx")).run(["logits"], feeds)
    assert float(np.max(np.abs(logits - expected))) <= 1e-5
    shared = model.shared.weight.detach().numpy()
    decoder_inits = onnx.load(str(out / "decoder_model.onnx")).graph.initializer
    shapes = (shared.shape, shared.T.shape)
    holding = [i.name for i in decoder_inits if onnx.numpy_helper.to_array(i).shape in shapes]
    assert len(holding) == 1, holding


def test_bert_masked_lm_is_exported_as_bert_for_masked_lm(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bert.onnx"
    capsys.readouterr()
    assert main(["export", str(folders["bert"]), str(out), "--atol", "1e-5"]) == 0
    summary = capsys.readouterr().err
    assert "source: BertForMaskedLM (masked LM, from config.json's architectures)" in summary
    assert "BertLMHeadModel" not in summary and "tie check: ok" in summary and ": FAILED" not in summary
    assert main(["check", str(out)]) == 0

    model = transformers.BertForMaskedLM.from_pretrained(folders["bert"]).eval()
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padding: the mask is a real input
    session = ort.InferenceSession(str(out))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    [logits] = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits.numpy()
    assert float(np.max(np.abs(logits - expected))) <= 1e-5


@pytest.mark.parametrize(
    ("architectures", "named"),
    [
        (["BertForTokenClassification"], "config.json's architectures names BertForTokenClassification"),
        (["EvilForCausalLM", "BertModel"], "config.json's architectures names EvilForCausalLM, BertModel"),
        (None, "config.json names none"),
    ],
)
def test_other_classes_are_refused_in_one_line_naming_the_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], architectures: list[str] | None, named: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "bert"} | ({"architectures": architectures} if architectures else {})
    (folder / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["export", str(folder), str(tmp_path / "out.onnx")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"tieaudit: error: {folder}: export supports Hugging Face causal LM, masked LM and seq2seq LM "
        "classes (e.g. T5ForConditionalGeneration, e.g. BertForMaskedLM, e.g. GPT2LMHeadModel); " + named
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_seq2seq_out_must_be_a_folder_name(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["export", str(folders["t5"]), str(tmp_path / "t5.onnx")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"tieaudit: error: {tmp_path / 't5.onnx'}: a seq2seq LM is exported as encoder_model.onnx, "
        "decoder_model.onnx: OUT is the folder for them, not a .onnx file"
    )
    assert list(tmp_path.iterdir()) == []


def test_bart_is_a_seq2seq_lm_though_transformers_also_lists_it_as_a_masked_lm(tmp_path: Path) -> None:
    """BartForConditionalGeneration is in both of transformers' mappings: the seq2seq kind comes first,
    so it gets two parts with optimum's names and inputs (built here, not exported: that is T5's test)."""
    from tieaudit.runtime.export_source import load_source

    config: dict[str, Any] = {
        "vocab_size": 100, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "max_position_embeddings": 64,
    }  # fmt: skip
    model: Any = transformers.BartForConditionalGeneration(transformers.BartConfig(**config))
    model.save_pretrained(tmp_path / "bart")
    loaded = load_source(str(tmp_path / "bart"), {"batch": 2, "sequence": 6, "decoder_sequence": 3})

    assert (loaded.kind, loaded.model_class, loaded.folder_out) == (
        "seq2seq LM",
        "BartForConditionalGeneration",
        True,
    )
    encoder, decoder = loaded.parts
    assert (encoder.file, encoder.input_names) == ("encoder_model.onnx", ("input_ids", "attention_mask"))
    assert (decoder.file, decoder.input_names, decoder.output_names) == (
        "decoder_model.onnx",
        ("input_ids", "encoder_hidden_states", "encoder_attention_mask"),
        ("logits",),
    )
    assert [tuple(t.shape) for t in decoder.inputs] == [(2, 3), (2, 6, 32), (2, 6)]
    with torch.no_grad():
        assert tuple(decoder.module(*decoder.inputs).shape) == (2, 3, 100)
    # each part holds the model's tensors under the names its state_dict gives them, the one BART
    # holds itself (final_logits_bias, outside any submodule) included, and reads them from there
    for part in (encoder, decoder):
        assert set(part.module.state_dict()) == set(model.state_dict())
    with torch.no_grad():
        before = decoder.module(*decoder.inputs)
        bias = dict(decoder.module.named_buffers())["final_logits_bias"]
        # swapped through the part, as the exporter swaps its tensors: the model's forward reads it
        decoder.module.final_logits_bias = bias + 1.0
        assert torch.equal(decoder.module(*decoder.inputs), before + 1.0)
