"""tieaudit export: dynamo export, copies re-tied, parity with torch, and nothing written on failure."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from tieaudit.cli.main import main
from tieaudit.runtime.export import export_model

FACTORIES = textwrap.dedent(
    '''
    import torch


    class TiedLM(torch.nn.Module):
        """Embedding and head are one Parameter; 128 x 32 is small enough for the exporter to fold E.T."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(128, 32)
            self.norm = torch.nn.LayerNorm(32)
            self.head = torch.nn.Linear(32, 128, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.norm(self.embed(ids)))


    def build():
        torch.manual_seed(0)
        model = TiedLM()
        with torch.no_grad():  # a trained-looking norm: no two parameters hold equal values
            model.norm.weight.normal_()
            model.norm.bias.normal_()
        return model, (torch.randint(0, 128, (1, 8)),)


    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
                return x * 2
            return x


    def unexportable():
        return Branchy(), (torch.ones(2, 2),)


    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)  # ONNX Runtime draws other numbers than torch


    def noisy():
        return Noisy(), (torch.ones(4, 4),)
    '''
)


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module importable from the current folder; its name is unique to the test."""
    name = f"factories_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=1000, n_embd=64, n_layer=1, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # LayerNorm ones and zero biases would be merged by the exporter's dedup
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.normal_(0, 0.02)
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    model.save_pretrained(folder)
    return folder


def _initializer_bytes(path: Path) -> int:
    model = onnx.load(str(path))
    return sum(numpy_helper.to_array(init).nbytes for init in model.graph.initializer)


def _leftovers(folder: Path) -> list[str]:
    return sorted(e for e in os.listdir(folder) if e.startswith("."))  # staging folders are hidden


def test_hf_folder_exports_with_the_tie_kept_and_parity(
    gpt2_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpt2.onnx"
    capsys.readouterr()
    assert main(["export", str(gpt2_folder), str(out), "--atol", "1e-5"]) == 0
    summary = capsys.readouterr().err
    assert "re-tied: nothing" in summary and "tie check: ok" in summary and "TIE005" in summary
    assert "  initializers: 464," in summary
    assert (
        f"bytes: {116_160 * 4:,} of parameters, all the torch model holds (a tie counted once); " in summary
    )
    assert _leftovers(tmp_path) == []

    # Checked here, not taken from the summary: every torch parameter stored once, and the logits.
    import onnxruntime as ort
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder).eval()
    names = dict(model.named_parameters(remove_duplicate=False))
    stored = {init.name: numpy_helper.to_array(init) for init in onnx.load(str(out)).graph.initializer}
    # named as the model's state_dict names them (no prefix from the module export wraps it in)
    assert {"transformer.wte.weight", "lm_head.weight"} & set(stored)
    assert {name for name in stored if "." in name} <= set(model.state_dict())
    weights = {name: value for name, value in stored.items() if name in names}
    assert len({id(names[name]) for name in weights}) == len(weights) == len(list(model.parameters()))
    parameter_bytes = sum(p.numel() * 4 for p in model.parameters())  # tied: listed once
    assert sum(v.nbytes for v in weights.values()) == parameter_bytes == 116_160 * 4
    assert sum(v.nbytes for name, v in stored.items() if name not in names) < 1024  # scalar constants
    ids = torch.randint(0, 1000, (2, 5))  # another shape than the example: the axes are dynamic
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.numpy()
    [actual] = ort.InferenceSession(str(out)).run(None, {"input_ids": ids.numpy()})
    assert float(np.max(np.abs(actual - expected))) <= 1e-5


def test_library_result_records_every_check(gpt2_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpt2.onnx"
    result = export_model(str(gpt2_folder), str(out), atol=1e-5)

    assert result.passed and result.written and out.exists()
    assert result.retied == () and result.remaining == () and result.parameters_not_stored == ()
    assert result.parameter_bytes == result.parameter_initializer_bytes == 116_160 * 4
    assert result.max_abs_diff <= 1e-5 and result.runtime_error is None
    assert [(f.rule, f.relation) for f in result.runtime] == [("TIE005", "transposed")]


def test_module_function_copy_is_retied_and_checks_pass(
    factories: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = main(["export", f"{factories}:build", "tied.onnx", "--atol", "1e-5"])
    err = capsys.readouterr().err

    assert code == 0, err
    assert "re-tied: val_" in err and "transposed copy of head.weight" in err
    assert "tie check: ok" in err and "result: written tied.onnx" in err
    assert _initializer_bytes(tmp_path / "tied.onnx") == (128 * 32 + 32 + 32) * 4  # = the torch parameters
    assert main(["check", "tied.onnx"]) == 0  # no TIE001: the copy is a Transpose node again


def test_export_failure_writes_nothing(
    factories: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = main(["export", f"{factories}:unexportable", "bad.onnx"])
    err = capsys.readouterr().err

    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("tieaudit: error: torch.onnx.export(dynamo=True) failed: ")
    assert not (tmp_path / "bad.onnx").exists() and _leftovers(tmp_path) == []


def test_parity_failure_writes_nothing(
    factories: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = main(["export", f"{factories}:noisy", "noisy.onnx"])
    err = capsys.readouterr().err

    assert code == 2
    assert (
        "parity: max abs difference" in err and ": FAILED" in err and "result: FAILED, OUT not written" in err
    )
    assert not (tmp_path / "noisy.onnx").exists() and _leftovers(tmp_path) == []


def test_existing_out_and_bad_source_are_usage_errors(
    factories: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken.onnx").write_bytes(b"keep")
    assert main(["export", f"{factories}:build", "taken.onnx"]) == 2
    assert (tmp_path / "taken.onnx").read_bytes() == b"keep"
    assert main(["export", "no_such_module_xyz:build", "x.onnx"]) == 2
    assert main(["export", str(tmp_path), "x.onnx"]) == 2  # a folder without config.json
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(e.startswith("tieaudit: error: ") for e in errors)
    assert not (tmp_path / "x.onnx").exists()


def test_example_inputs_of_the_hf_wrapper_follow_dims(gpt2_folder: Path) -> None:
    from tieaudit.runtime.export_source import load_source

    loaded = load_source(str(gpt2_folder), {"batch": 2, "sequence": 5})
    assert (loaded.kind, loaded.model_class) == ("causal LM", "GPT2LMHeadModel")
    [source] = loaded.parts
    [ids] = source.inputs
    assert tuple(ids.shape) == (2, 5) and ids.dtype == torch.int64 and int(ids.max()) < 1000
    logits = source.module(*source.inputs)
    assert tuple(logits.shape) == (2, 5, 1000) and np.isfinite(logits.detach().numpy()).all()


def test_a_folder_with_custom_code_is_refused_without_running_it_or_prompting(tmp_path: Path) -> None:
    """Export builds the model, but never from code the folder ships (auto_map) and never online:
    no prompt, the folder's module is not imported, exit 2 in one line."""
    import subprocess

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"architectures": ["EvilForCausalLM"], "model_type": "evil", '
        '"auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}'
    )
    (folder / "evil.py").write_text("import pathlib\npathlib.Path('pwned_marker').touch()\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    run = subprocess.run(
        [str(Path(sys.executable).parent / "tieaudit"), "export", str(folder), str(tmp_path / "out.onnx")],
        cwd=work, env=env, input="y\n", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("tieaudit: error: "), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not list(tmp_path.rglob("pwned_marker")) and not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize(
    ("stored", "repeated", "says"),
    [
        (
            1000,
            0,
            "1,000 of parameters, all the torch model holds (a tie counted once); 24 of graph constants",
        ),
        (
            900,
            0,
            "900 of parameters under their own names, of the 1,000 the torch model holds (a tie counted "
            "once; the exporter merged or folded the other 100 into the graph); 24 of graph constants",
        ),
        (
            1200,
            200,
            "1,000 of parameters, all the torch model holds (a tie counted once); 200 more for parameters "
            "stored again in another file (each file loads alone); 24 of graph constants",
        ),
    ],
)
def test_the_bytes_line_reads_as_information(stored: int, repeated: int, says: str) -> None:
    """Where the initializer bytes come from, said as a fact: no '!=' that reads like a failed check."""
    from tieaudit.report.runtime_report import render_export_summary
    from tieaudit.runtime.export import ExportResult

    result = ExportResult(
        source="src", out="out.onnx", written=True, kind="causal LM", model_class="M", description="d",
        files=(), parameter_bytes=1000, parameter_initializer_bytes=stored, parameter_bytes_repeated=repeated,
        initializer_bytes=stored + 24, parameters_not_stored=(), atol=1e-4,
    )  # fmt: skip
    (line,) = [line for line in render_export_summary(result).splitlines() if "initializers:" in line]
    assert line == f"  initializers: {stored + 24:,} bytes: {says}"
    assert "!=" not in line and "=" not in line
