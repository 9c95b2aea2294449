"""TorchScript archives (torch.jit.save, issue 24 point 5): read by the inert pickle VM, never run.

The truth is torch's: ``torch.jit.load(path).state_dict()`` for the parameters and buffers (names,
dtypes, shapes, bytes, and which names share one storage), the tensor constants of the loaded
graphs for ``CONSTANTS.c<i>``, and ``torch.load``'s own dispatch (``_is_torchscript_zip``) for when
a zip is a TorchScript archive at all. torch is used here only; auditing never imports it (checked
in a process where importing it fails).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from tieaudit.cli.main import main
from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.formats import open_checkpoint

HERE = Path(__file__).resolve().parent
GUARD = HERE / "guarded_cli.py"
sys.path.insert(0, str(HERE.parent / "fixtures" / "hostile"))
import cases_torchscript  # type: ignore[import-not-found]  # noqa: E402  (hostile builders: no torch)
from builders import MARKER  # type: ignore[import-not-found]  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::UserWarning", "ignore::torch.jit.TracerWarning"
)
TWIN = "CONSTANTS.PKL"
"""constants.pkl spelled otherwise: torch.load's test for a TorchScript archive is case-sensitive."""
CONSTANTS = "CONSTANTS"
"""The name the archive's code reads its tensor constants under (``CONSTANTS.c0``)."""
torch.manual_seed(0)


class TinyLM(torch.nn.Module):
    """An embedding and a head: tied (one Parameter under two names), or an equal separate copy."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.lm_head = torch.nn.Linear(16, 64, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight
        else:
            self.lm_head.weight = torch.nn.Parameter(self.embed.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.embed(x))


class WithConstant(torch.nn.Module):
    """A buffer, and a tensor made in forward: torch.jit.trace stores it as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.arange(4.0) / 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(x) + self.offset + torch.tensor([0.5, -1.0, 2.0, 3.5])


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        self.register_buffer("mask", torch.tril(torch.ones(3, 3)).to(torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Nested(torch.nn.Module):
    """Submodules inside a ModuleList inside a submodule; a bfloat16 parameter; an int64 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.gate = torch.nn.Parameter(torch.randn(8, dtype=torch.bfloat16))
        self.register_buffer("steps", torch.tensor([3, 1, 4], dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x * self.gate.float()


def _scripted(module: torch.nn.Module) -> Callable[[Path], None]:
    return lambda path: torch.jit.save(torch.jit.script(module), str(path))


def _traced(module: torch.nn.Module, example: torch.Tensor) -> Callable[[Path], None]:
    return lambda path: torch.jit.save(torch.jit.trace(module, example, check_trace=False), str(path))


def _frozen(module: torch.nn.Module) -> Callable[[Path], None]:
    """torch.jit.freeze inlines parameters as constants: a tie becomes one constant."""
    return lambda path: torch.jit.save(torch.jit.freeze(torch.jit.script(module.eval())), str(path))


BUILDS: dict[str, Callable[[Path], None]] = {
    "scripted_tied_lm": _scripted(TinyLM(tied=True)),
    "traced_tied_lm": _traced(TinyLM(tied=True), torch.tensor([[1, 2, 3]])),
    "scripted_copy_lm": _scripted(TinyLM(tied=False)),
    "traced_copy_lm": _traced(TinyLM(tied=False), torch.tensor([[1, 2, 3]])),
    "traced_buffer_and_constant": _traced(WithConstant(), torch.randn(2, 4)),
    "scripted_nested": _scripted(Nested()),
    "frozen_tied_lm": _frozen(TinyLM(tied=True)),
}


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("torchscript")
    made = {}
    for name, build in BUILDS.items():
        build(folder / f"{name}.pt")
        made[name] = folder / f"{name}.pt"
    return made


@pytest.fixture()
def opened(archives: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[OpenCheckpoint]:
    with open_checkpoint(str(archives[request.param])) as found:
        yield found


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()


def _graph_constants(module: Any) -> set[tuple[str, tuple[int, ...], bytes]]:
    """The tensor constants of every loaded graph (torch's view of what CONSTANTS holds)."""
    found = set()
    graphs = [sub._c._get_method(name).graph for sub in module.modules() for name in sub._c._method_names()]
    for graph in graphs:
        for node in graph.nodes():
            if node.kind() == "prim::Constant" and node.output().type().kind() == "TensorType":
                value = node.t("value")
                found.add((str(value.dtype).removeprefix("torch."), tuple(value.shape), _bytes(value)))
    return found


@pytest.mark.parametrize("opened", list(BUILDS), indirect=True)
def test_tensors_are_what_torch_jit_load_gives(opened: OpenCheckpoint, archives: dict[str, Path]) -> None:
    ckpt = opened.checkpoint
    assert ckpt.format == "torchscript"
    loaded = torch.jit.load(ckpt.path)
    state = loaded.state_dict()
    constants = {t.name: t for t in ckpt.tensors if t.name.startswith(f"{CONSTANTS}.")}
    assert {t.name for t in ckpt.tensors} == set(state) | set(constants)  # nothing else in these modules
    for name, value in state.items():
        info = ckpt.tensor(name)
        assert info.dtype == str(value.dtype).removeprefix("torch.")
        assert info.shape == tuple(value.shape) and info.strides == value.stride()
        assert opened.array(info).tobytes() == _bytes(value)
    # One storage in torch is one storage here, and the other way round.
    pointers = {name: value.untyped_storage().data_ptr() for name, value in state.items()}
    for first in state:
        for second in state:
            same_here = ckpt.tensor(first).storage_id == ckpt.tensor(second).storage_id
            assert same_here == (pointers[first] == pointers[second]), (first, second)
    assert sorted(constants) == [f"{CONSTANTS}.c{i}" for i in range(len(constants))]
    found = {(t.dtype, t.shape, opened.array(t).tobytes()) for t in constants.values()}
    assert found == _graph_constants(loaded)


@pytest.mark.parametrize("opened", ["traced_buffer_and_constant"], indirect=True)
def test_a_traced_constant_is_read(opened: OpenCheckpoint) -> None:
    (constant,) = [t for t in opened.checkpoint.tensors if t.name.startswith(CONSTANTS)]
    assert constant.name == "CONSTANTS.c0"
    assert opened.array(constant).tolist() == [0.5, -1.0, 2.0, 3.5]
    assert "offset" in opened.checkpoint.names  # the buffer


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", *args, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", ["scripted", "traced"])
def test_check_passes_a_tie_and_fails_an_equal_copy(
    kind: str, archives: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _check(capsys, str(archives[f"{kind}_tied_lm"]))
    assert code == 0 and report["findings"] == []
    assert [g["names"] for g in report["alias_groups"]] == [["embed.weight", "lm_head.weight"]]
    code, report = _check(capsys, str(archives[f"{kind}_copy_lm"]))
    assert code == 1
    (finding,) = report["findings"]
    assert finding["rule"] == "TIE001" and sorted(finding["names"]) == ["embed.weight", "lm_head.weight"]
    assert "re-export" in finding["fix"]
    assert report["format"] == "torchscript" and "TIE010" not in {f["rule"] for f in report["findings"]}


def test_check_of_a_folder_audits_every_name(
    archives: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["model.pt", "model.jit", "model", "export.zip", "sub/weights.bin"]
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(archives["scripted_copy_lm"], tmp_path / name)
    code, report = _check(capsys, str(tmp_path), "--show-files")
    assert code == 1 and report["errors"] == []
    audited = sorted(Path(r["path"]).relative_to(tmp_path).as_posix() for r in report["reports"])
    assert audited == sorted(names)
    for audit in report["reports"]:
        assert audit["format"] == "torchscript" and audit["findings"][0]["rule"] == "TIE001"
    assert {f["verdict"] for f in report["files"]} == {"audited"}
    # named on the command line, each is the same audit
    for name in names:
        code, single = _check(capsys, str(tmp_path / name))
        assert code == 1 and single["findings"][0]["names"] == report["reports"][0]["findings"][0]["names"]


def test_a_model_folder_of_torchscript_weights_is_refused_as_transformers_would(
    archives: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers loads pytorch_model.bin (and a Trainer's scheduler.pt) with
    torch.load(weights_only=True), which refuses a TorchScript archive: the folder's audit says so
    (an error for its weights, a note for a training file), and the archive is audited on its own
    too, as anywhere else; a hidden one is skipped like any checkpoint naming no Python code."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    shutil.copyfile(archives["scripted_tied_lm"], model / "pytorch_model.bin")
    shutil.copyfile(archives["scripted_copy_lm"], model / "exported.pt")
    (model / ".cache").mkdir()
    shutil.copyfile(archives["scripted_copy_lm"], model / ".cache" / "old.pt")
    code, report = _check(capsys, str(model), "--show-files")
    assert code == 2
    (error,) = report["errors"]
    assert "TorchScript" in error["message"] and "weights_only=True" in error["message"]
    assert sorted(Path(r["path"]).name for r in report["reports"]) == ["exported.pt", "pytorch_model.bin"]
    hidden = [f for f in report["files"] if ".cache" in f["path"]]
    assert [f["verdict"] for f in hidden] == ["skipped"]
    trainer = tmp_path / "checkpoint-2"
    trainer.mkdir()
    (trainer / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    (trainer / "trainer_state.json").write_text("{}")
    save_file({"x": np.zeros(4, np.float32)}, str(trainer / "model.safetensors"))
    shutil.copyfile(archives["scripted_copy_lm"], trainer / "scheduler.pt")
    code, report = _check(capsys, str(trainer))
    assert code == 1 and report["errors"] == []
    by_name = {Path(r["path"]).name: r for r in report["reports"]}
    assert by_name["scheduler.pt"]["findings"][0]["rule"] == "TIE001"
    (part,) = [p for p in by_name["checkpoint-2"]["training"]["parts"] if p["path"] == "scheduler.pt"]
    assert part["status"].startswith("not read: a TorchScript archive")


def test_the_report_says_what_runs_the_code_and_finds_no_python_global(
    archives: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = archives["scripted_nested"]
    assert main(["inspect", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (note,) = report["notes"]
    assert "torch.jit.load compiles and runs that code" in note
    assert "__torch__.test_torchscript.Nested" in note
    assert {g["verdict"] for g in report["pickle_globals"]} == {"allowed"}
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "format torchscript" in text and "note: TorchScript archive (torch.jit.save)" in text


def test_torch_load_refuses_torchscript_with_weights_only_and_tieaudit_says_so(
    archives: dict[str, Path],
) -> None:
    """torch.load(weights_only=True) refuses every TorchScript archive (torch/serialization.py,
    _is_torchscript_zip) and weights_only=False is torch.jit.load: the note says both, and no
    global is TIE010's (torch.jit.load's unpickler imports none)."""
    path = str(archives["scripted_tied_lm"])
    with pytest.raises(RuntimeError, match="Cannot use ``weights_only=True`` with TorchScript archives"):
        torch.load(path, weights_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isinstance(torch.load(path, weights_only=False), torch.jit.ScriptModule)
    with open_checkpoint(path) as found:
        (note,) = found.checkpoint.notes
        assert "torch.load(weights_only=True) refuses TorchScript archives" in note
        assert "torch.load(weights_only=False) hands them to torch.jit.load" in note
        assert all(g.verdict == "allowed" for g in found.checkpoint.pickle_globals)


def _rename_member(source: Path, out: Path, old: str, new: str) -> None:
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            info.filename = info.filename.replace(old, new)
            zout.writestr(info, data)


def test_a_case_twin_of_constants_pkl_is_torch_save_data(archives: dict[str, Path], tmp_path: Path) -> None:
    """torch.load's test is an exact name: with CONSTANTS.PKL the zip is torch.save data, whose
    data.pkl names __torch__ classes torch.load(weights_only=False) would import: TIE010."""
    twin = tmp_path / "twin.pt"
    _rename_member(archives["scripted_tied_lm"], twin, "/constants.pkl", f"/{TWIN}")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(str(twin), weights_only=True)
    with open_checkpoint(str(twin)) as found:
        assert found.checkpoint.format == "torch"
        code = {g.name for g in found.checkpoint.pickle_globals if g.verdict == "runs-code"}
        assert "__torch__.test_torchscript.TinyLM" in code


def test_retie_refuses_in_one_line(
    archives: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in ([str(tmp_path / "out.pt")], ["--dry-run"]):
        assert main(["retie", str(archives["scripted_copy_lm"]), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "retie cannot rewrite TorchScript archives" in lines[0]
        assert "re-export it from the source model" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["scripted_tied_lm", "traced_buffer_and_constant", "scripted_nested"])
def test_convert_writes_every_tensor_and_names_what_it_leaves_out(
    name: str, archives: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(archives[name]), str(out)]) == 0
    said = capsys.readouterr()
    assert "not written: its TorchScript code and" in said.err
    assert "torch.jit.load, runs its code" in said.err  # the input side verified by tieaudit alone
    with open_checkpoint(str(archives[name])) as source, safe_open(str(out), "np") as written:
        records = {k: v for k, v in (written.metadata() or {}).items() if k != "format"}
        assert set(written.keys()) | set(records) == source.checkpoint.names
        for tensor in source.checkpoint.tensors:
            stored = written.get_tensor(records.get(tensor.name, tensor.name))
            assert np.array_equal(stored.view(np.uint8), source.array(tensor).view(np.uint8))
    if name == "scripted_tied_lm":
        assert records == {"lm_head.weight": "embed.weight"}


def test_auditing_never_imports_torch(archives: dict[str, Path], tmp_path: Path) -> None:
    spec, result = tmp_path / "spec.json", tmp_path / "result.json"
    paths = [str(archives[n]) for n in ("scripted_tied_lm", "scripted_copy_lm", "traced_buffer_and_constant")]
    runs = [[command, p, "--format", "json"] for p in paths for command in ("inspect", "check")]
    spec.write_text(json.dumps({"runs": runs, "result": str(result)}))
    done = subprocess.run(
        [sys.executable, str(GUARD), str(spec)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(result.read_text())
    assert report["import_attempts"] == [] and report["loaded"] == []
    assert [run["code"] for run in report["runs"]] == [0, 0, 0, 1, 0, 0]


@pytest.mark.parametrize(
    ("build", "runs"),
    [
        (lambda: cases_torchscript.script_archive(cases_torchscript.evil_state_dict()), False),
        (lambda: cases_torchscript.script_archive(cases_torchscript.evil_state_dict(), marker=TWIN), True),
    ],
    ids=["constants.pkl", "CONSTANTS.PKL"],
)
def test_the_hostile_verdicts_are_torchs(
    build: Callable[[], bytes],
    runs: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fixtures/hostile's TorchScript cases, loaded by torch for real in a scratch folder: with an
    exact constants.pkl, torch.load(weights_only=False) is torch.jit.load, which imports nothing and
    fails (tieaudit refuses the archive naming posix.system); with a case twin it is Python's
    unpickler, and posix.system runs (tieaudit: TIE010)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "archive.pt"
    path.write_bytes(build())
    code = main(["check", str(path), "--format", "json"])
    said = capsys.readouterr()
    if runs:
        (finding,) = json.loads(said.out)["findings"]
        assert code == 1 and finding["rule"] == "TIE010" and "posix.system" in finding["names"]
    else:
        (line,) = said.err.strip().splitlines()
        assert code == 2 and "REDUCE of posix.system" in line  # read as TorchScript, refused there
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.load(str(path), weights_only=False)
        except RuntimeError as exc:
            assert not runs and "Unknown type name 'posix.system'" in str(exc)
    assert (tmp_path / MARKER).exists() == runs


def test_a_hand_made_archive_reads_as_torch_jit_load_does(tmp_path: Path) -> None:
    """The hostile corpus's control: a module of class __torch__.M, its source in code/."""
    path = tmp_path / "valid.pt"
    path.write_bytes(cases_torchscript.valid_archive())
    loaded = torch.jit.load(str(path))
    with open_checkpoint(str(path)) as found:
        assert found.checkpoint.names == {"w"}
        assert found.array(found.checkpoint.tensor("w")).tobytes() == _bytes(loaded.w)
