"""convert: torch checkpoints to safetensors, loaded back the way users load them.

Each family's tiny model is written as transformers 4.x wrote ``save_pretrained(safe_serialization=
False)``: config.json plus ``torch.save`` of the state dict (shared names as views of one storage),
single or sharded with ``pytorch_model.bin.index.json`` (transformers 5 writes only safetensors).
The converted folder is loaded with every class of the family by ``from_pretrained``: no weight
missing that loading the original folder does not also miss, and outputs equal bit for bit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
import transformers

from tieaudit.cli.main import main

VOCAB = 100


def _t5(cls: Any, config_cls: Any) -> Any:
    config = config_cls(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, decoder_start_token_id=0
    )
    return cls(config)


def _bertish(cls: Any, config_cls: Any) -> Any:
    return cls(
        config_cls(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
        )
    )


FAMILIES: dict[str, tuple[Callable[[], Any], tuple[Any, ...]]] = {
    "gpt2": (
        lambda: transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4)
        ),
        (transformers.GPT2LMHeadModel, transformers.GPT2Model),
    ),
    "llama": (
        lambda: transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=True,
            )
        ),
        (transformers.LlamaForCausalLM, transformers.LlamaModel),
    ),
    "t5": (
        lambda: _t5(transformers.T5ForConditionalGeneration, transformers.T5Config),
        (transformers.T5ForConditionalGeneration, transformers.T5EncoderModel, transformers.T5Model),
    ),
    "mt5": (
        lambda: _t5(transformers.MT5ForConditionalGeneration, transformers.MT5Config),
        (transformers.MT5ForConditionalGeneration, transformers.MT5EncoderModel, transformers.MT5Model),
    ),
    "roberta": (
        lambda: _bertish(transformers.RobertaForMaskedLM, transformers.RobertaConfig),
        (transformers.RobertaForMaskedLM, transformers.RobertaModel, transformers.RobertaForCausalLM),
    ),
    "bert": (
        lambda: _bertish(transformers.BertForMaskedLM, transformers.BertConfig),
        (transformers.BertForMaskedLM, transformers.BertModel),
    ),
}


def write_bin(model: Any, folder: Path, *, shards: int = 1) -> dict[str, torch.Tensor]:
    """The folder transformers 4.x wrote: config.json and pytorch_model.bin (or index + shards)."""
    model.save_pretrained(folder)
    for written in folder.glob("model*.safetensors*"):
        written.unlink()
    state = model.state_dict()
    if shards == 1:
        torch.save(state, folder / "pytorch_model.bin")
        return state
    names = list(state)
    size = -(-len(names) // shards)
    weight_map = {}
    for k in range(shards):
        file = f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[k * size : (k + 1) * size]}
        torch.save(part, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return state


def _inputs(cls: Any) -> dict[str, torch.Tensor]:
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    if "T5" in cls.__name__ and "Encoder" not in cls.__name__:
        return {"input_ids": ids, "decoder_input_ids": ids[:, :3]}
    return {"input_ids": ids}


def _outputs(model: Any, cls: Any) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(**_inputs(cls))
    return [v for v in out.values() if isinstance(v, torch.Tensor)]


def _load(cls: Any, folder: Path) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(1)  # what the class initialises anew (RobertaModel's pooler) is the same twice
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    return model.eval(), info


def convert(source: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(["convert", str(source), str(out), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out + captured.err


@pytest.mark.parametrize(("family", "shards"), [(f, 1) for f in FAMILIES] + [("t5", 2)])
def test_every_class_of_the_family_loads_the_converted_folder(
    family: str, shards: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    build, classes = FAMILIES[family]
    source, out = tmp_path / "bin", tmp_path / "safe"
    state = write_bin(build(), source, shards=shards)
    report = convert(source, out, capsys)
    assert "verified bit for bit" in report
    written = sorted(p.name for p in out.iterdir())
    assert not any(name.endswith(".bin") for name in written)
    if shards == 1:
        assert "model.safetensors" in written
    else:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert sorted(set(index["weight_map"].values())) == [
            f"model-0000{k}-of-00002.safetensors" for k in (1, 2)
        ]
        assert index["metadata"].get("encoder.embed_tokens.weight") == "shared.weight"
    stored: set[str] = set()
    for file in out.glob("*.safetensors"):
        with safetensors.safe_open(str(file), framework="pt") as handle:
            stored |= set(handle.keys())
            for name in handle.keys():
                assert torch.equal(handle.get_tensor(name), state[name]), name
    assert stored < set(state)  # shared names were dropped, not stored twice
    if shards == 1:  # the live model's own sharing restores every dropped name
        live = classes[0](transformers.AutoConfig.from_pretrained(out))
        safetensors.torch.load_model(live, str(out / "model.safetensors"), strict=True)
    for cls in classes:
        original, original_info = _load(cls, source)
        converted, info = _load(cls, out)
        # Only what the original folder misses too: the masked-LM checkpoint has no pooler.
        assert sorted(info["missing_keys"]) == sorted(original_info["missing_keys"]), cls.__name__
        assert not set(info["missing_keys"]) - {"pooler.dense.weight", "pooler.dense.bias"}, cls.__name__
        assert not info["mismatched_keys"], cls.__name__
        for left, right in zip(_outputs(original, cls), _outputs(converted, cls), strict=True):
            assert torch.equal(left, right), cls.__name__


def test_kept_names_are_the_ones_every_class_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    for family, kept, dropped in (
        ("mt5", "shared.weight", ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")),
        ("roberta", "lm_head.bias", ("lm_head.decoder.bias",)),
    ):
        source, out = tmp_path / f"{family}-bin", tmp_path / family
        write_bin(FAMILIES[family][0](), source)
        convert(source, out, capsys)
        with safetensors.safe_open(str(out / "model.safetensors"), framework="pt") as handle:
            metadata = handle.metadata()
            assert kept in handle.keys()
            assert not set(dropped) & set(handle.keys())
        assert metadata["format"] == "pt"
        assert {name: metadata[name] for name in dropped} == dict.fromkeys(dropped, kept)


def test_single_file_loads_with_load_model_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = FAMILIES["gpt2"][0]().eval()
    source, out = tmp_path / "gpt2.bin", tmp_path / "gpt2.safetensors"
    torch.save(model.state_dict(), source)
    report = convert(source, out, capsys)
    assert "drop lm_head.weight = transformer.wte.weight" in report
    assert "input-embedding side" in report
    fresh = transformers.GPT2LMHeadModel(model.config).eval()
    safetensors.torch.load_model(fresh, str(out), strict=True)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    assert fresh.lm_head.weight.data_ptr() == fresh.transformer.wte.weight.data_ptr()


def test_fused_views_are_written_with_their_own_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fused = torch.arange(12 * 8, dtype=torch.float32).reshape(12, 8)
    parts = {"q": fused[0:4], "k": fused[4:8], "v": fused[8:12], "qkv_t": fused.t()}
    source, out = tmp_path / "fused.pt", tmp_path / "fused.safetensors"
    torch.save(parts, source)
    report = convert(source, out, capsys)
    assert "view q: its own 128 B of a 384 B storage" in report
    loaded = safetensors.numpy.load_file(str(out))
    assert sorted(loaded) == ["k", "q", "qkv_t", "v"]
    for name, tensor in parts.items():
        assert loaded[name].shape == tuple(tensor.shape)
        assert np.array_equal(loaded[name], tensor.numpy()), name
    header = 8 + int.from_bytes(out.read_bytes()[:8], "little")
    assert os.path.getsize(out) == header + 3 * 128 + 384  # never the whole storage per slice


def test_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    source, out = tmp_path / "bin", tmp_path / "safe"
    write_bin(FAMILIES["t5"][0](), source)
    assert main(["convert", str(source), str(out), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "keep shared.weight" in plan
    assert "drop encoder.embed_tokens.weight = shared.weight" in plan
    assert "file pytorch_model.bin -> model.safetensors" in plan
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["bin"]


class _Runs:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("touch convert-ran-code",))


def test_a_pickle_that_would_run_code_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source, out = tmp_path / "hostile.pt", tmp_path / "hostile.safetensors"
    torch.save({"w": torch.ones(4), "x": _Runs()}, source)
    assert main(["convert", str(source), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tieaudit: error: ") and "TIE010" in err and "system" in err
    assert not out.exists()
    assert not (tmp_path / "convert-ran-code").exists()


def test_safetensors_input_and_wrong_out_names_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "w.pt"
    torch.save({"w": torch.ones(4)}, source)
    assert main(["convert", str(source), str(tmp_path / "w.bin")]) == 2
    assert "end OUT in .safetensors" in capsys.readouterr().err
    assert main(["convert", str(source), str(tmp_path / "w.txt")]) == 2
    assert "end its name in .safetensors" in capsys.readouterr().err
    safetensors.torch.save_file({"w": torch.ones(4)}, str(tmp_path / "a.safetensors"))
    assert main(["convert", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]) == 2
    assert "convert reads torch files" in capsys.readouterr().err
    assert main(["convert", str(source)]) == 2
    assert "say where the output goes" in capsys.readouterr().err


def test_shared_names_the_class_does_not_tie_are_stored_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tie_word_embeddings false: LlamaForCausalLM loads lm_head.weight from the file, so a .bin that
    shares it with the embedding must keep it stored (dropping it would load it randomly initialised)."""
    torch.manual_seed(0)
    model = FAMILIES["llama"][0]()
    model.config.tie_word_embeddings = False
    source, out = tmp_path / "bin", tmp_path / "safe"
    model.save_pretrained(source)
    for written in source.glob("model*.safetensors*"):
        written.unlink()
    state = dict(model.state_dict())
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # one storage, two names
    torch.save(state, source / "pytorch_model.bin")
    report = convert(source, out, capsys)
    assert "copy lm_head.weight = model.embed_tokens.weight" in report
    with safetensors.safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(handle.keys())
    original, _ = _load(transformers.LlamaForCausalLM, source)
    converted, info = _load(transformers.LlamaForCausalLM, out)
    assert not info["missing_keys"]
    cls = transformers.LlamaForCausalLM
    assert torch.equal(_outputs(original, cls)[0], _outputs(converted, cls)[0])


def test_round_trip_back_to_pt_restores_real_aliasing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    model = FAMILIES["gpt2"][0]().eval()
    source, safe, back = tmp_path / "gpt2.bin", tmp_path / "gpt2.safetensors", tmp_path / "back.pt"
    torch.save(model.state_dict(), source)
    convert(source, safe, capsys)
    report = convert(safe, back, capsys)
    assert "-> torch" in report and "drop lm_head.weight = transformer.wte.weight" in report
    state = torch.load(back, weights_only=True)
    assert sorted(state) == sorted(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(state[name], tensor), name
    assert state["lm_head.weight"].untyped_storage().data_ptr() == (
        state["transformer.wte.weight"].untyped_storage().data_ptr()
    )
    fresh = transformers.GPT2LMHeadModel(model.config).eval()
    fresh.load_state_dict(state, strict=True)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    assert main(["convert", str(safe), str(tmp_path / "x.pt"), "--dry-run"]) == 0
    assert not (tmp_path / "x.pt").exists()
    assert main(["convert", str(safe), str(tmp_path / "x.txt")]) == 2


_PEAK = (
    "import sys\n"
    "import torch  # the run reads the input with torch.load too: its import is in the baseline\n"
    "from tieaudit.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
    "sys.exit(code)\n"
)


def _peak_kib(*args: str) -> int:
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS read from Linux /proc")
def test_peak_memory_is_bounded_by_tensors_not_the_model(tmp_path: Path) -> None:
    """96 MiB of 2 MiB tensors: the run's peak RSS grows by a few tensors over the dry run's (the
    bytes are copied from the mapped input and compared a tensor at a time, with tieaudit's reading
    and torch.load's of the input), never by the model."""
    source = tmp_path / "many.pt"
    torch.save({f"w{i}": torch.full((1 << 19,), float(i)) for i in range(48)}, source)
    baseline = _peak_kib("convert", str(source), "--dry-run")
    peak = _peak_kib("convert", str(source), str(tmp_path / "many.safetensors"))
    assert (tmp_path / "many.safetensors").stat().st_size > 96 << 20
    assert peak - baseline < 40 << 10, (baseline, peak)


def test_a_failed_verification_leaves_no_out_and_no_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tieaudit.repair.retie as publishing  # convert publishes through retie's write_and_publish
    from tieaudit.repair.verify import VerificationError

    def differs(original: object, out: str, **_: object) -> None:
        raise VerificationError("w differs from the input after writing", out)

    source = tmp_path / "in" / "w.pt"
    source.parent.mkdir()
    torch.save({"w": torch.ones(4)}, source)
    monkeypatch.setattr(publishing, "verify_output", differs)
    assert main(["convert", str(source), str(tmp_path / "w.safetensors")]) == 2
    assert "differs from the input after writing; nothing was written" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_to_safetensors_needs_no_torch_and_the_reverse_names_the_extra(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent
    source = tmp_path / "w.pt"
    torch.save({"emb.weight": torch.ones(8, 4), "head.weight": torch.zeros(8, 4)}, source)

    def hidden(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(root / "hidden_extras.py"), "torch,transformers", *argv]
        return subprocess.run(command, capture_output=True, text=True, cwd=root.parent, check=False)

    done = hidden("convert", str(source), str(tmp_path / "w.safetensors"))
    assert done.returncode == 0, done.stderr
    # The forward direction does not need torch: without it, the input's reading for verification
    # is tieaudit's own, and the output says so.
    assert "tieaudit: note: the input was read for verification by tieaudit's own reader only" in done.stderr
    assert "torch.load(weights_only=True), the torch extra) is not installed" in done.stderr
    assert (tmp_path / "w.safetensors").exists()
    done = hidden("convert", str(tmp_path / "w.safetensors"), str(tmp_path / "back.pt"))
    assert done.returncode == 2
    assert done.stderr.strip().endswith("pip install 'tieaudit[torch]'"), done.stderr
    assert not (tmp_path / "back.pt").exists()


def test_the_plan_names_in_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the resolved absolute path: a user reads back what they typed, as retie prints it."""
    torch.save({"emb": torch.ones(4, 4), "head": torch.ones(4, 4)}, tmp_path / "model.pt")
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "model.pt", "model.safetensors"]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "convert plan for model.pt -> safetensors\n" in out
    assert str(tmp_path) not in out
