"""`tieaudit check` over files and folders: discovery, parallel audits, exit codes, text and JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import Corpus
from safetensors.numpy import save_file

from tieaudit.cli.main import cli, main
from tieaudit.formats.hf.layouts import CONFIG_ONLY
from tieaudit.gate.discover import discover, glob_matches
from tieaudit.gate.executors import chunks
from tieaudit.gate.progress import ProgressBar
from tieaudit.rules.policy import Policy


def write_model(path: Path, copy: bool, seed: int = 0) -> Path:
    """A two-matrix safetensors file; with copy, the head is a byte copy of the embedding."""
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((64, 32)).astype(np.float32)
    head = embedding.copy() if copy else rng.standard_normal((64, 32)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": embedding, "lm_head.weight": head}, str(path))
    return path


@pytest.fixture
def tree(tmp_path: Path, corpus: Corpus) -> Path:
    """models/: a clean file, a copy, a torch file, an HF folder (sharded), noise to skip."""
    root = tmp_path / "models"
    write_model(root / "a-clean.safetensors", copy=False)
    write_model(root / "nested" / "b-copy.safetensors", copy=True, seed=1)
    shutil.copy(corpus.path("torch_tied_lm"), root / "nested" / "c.pt")
    shutil.copytree(corpus.path("hf_gpt2_sharded"), root / "gpt2")
    write_model(root / ".cache" / "hidden.safetensors", copy=True)
    write_model(root / ".c.safetensors.tieaudit-stage-x1" / "staged.safetensors", copy=True)
    (root / "notes.txt").write_text("not a checkpoint\n")
    (root / "external.bin").write_bytes(np.arange(64, dtype=np.float32).tobytes())  # ONNX-style raw data
    return root


def relative(paths: list[str], root: Path) -> list[str]:
    return [Path(p).relative_to(root).as_posix() for p in paths]


def test_discovery_walks_folders_keeps_model_folders_whole_and_skips_noise(tree: Path) -> None:
    found = discover([str(tree)])
    assert not found.errors
    assert relative([t.path for t in found.targets], tree) == [
        "a-clean.safetensors",
        "gpt2",  # one model: its five shards are never listed alone
        "nested/b-copy.safetensors",
        "nested/c.pt",
    ]
    assert not any(t.explicit for t in found.targets)


def test_exclude_matches_relative_paths_and_names_but_never_explicit_paths(tree: Path) -> None:
    by_path = discover([str(tree)], ["nested/**"]).targets
    assert relative([t.path for t in by_path], tree) == ["a-clean.safetensors", "gpt2"]
    by_name = discover([str(tree)], ["*.pt", "gpt2"]).targets
    assert relative([t.path for t in by_name], tree) == ["a-clean.safetensors", "nested/b-copy.safetensors"]
    hidden = tree / ".cache" / "hidden.safetensors"
    explicit = discover([str(hidden), str(tree / "notes.txt")], ["*"]).targets
    assert [t.path for t in explicit] == [str(hidden), str(tree / "notes.txt")]
    assert all(t.explicit for t in explicit)


def test_a_path_found_twice_is_audited_once(tree: Path) -> None:
    copy = str(tree / "nested" / "b-copy.safetensors")
    found = discover([copy, str(tree / "nested")]).targets
    assert [t.path for t in found] == [copy, str(tree / "nested" / "c.pt")]


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("models/**/*.onnx", "models/a/b/m.onnx", True),
        ("models/**/*.onnx", "models/m.onnx", True),
        ("models/*.onnx", "models/a/m.onnx", False),
        ("*.onnx", "deep/down/m.onnx", True),  # a name pattern matches the last component
        ("legacy/**", "legacy/x/y.pt", True),
        ("legacy/**", "new/legacy.pt", False),
        ("m[0-9].pt", "m7.pt", True),
        ("m[!0-9].pt", "m7.pt", False),
        ("m?.pt", "m10.pt", False),
    ],
)
def test_glob_syntax(pattern: str, path: str, matches: bool) -> None:
    assert glob_matches(pattern, path) is matches


def test_exit_codes_for_folders_in_process(tree: Path, tmp_path: Path) -> None:
    runner = CliRunner()

    def code(*args: str) -> int:
        return runner.invoke(cli, ["check", *args, "--jobs", "1"]).exit_code

    assert code(str(tree), "--exclude", "b-copy.safetensors") == 0
    assert code(str(tree)) == 1
    assert code(str(tree), "--fail-on", "error") == 0  # TIE001 is a warning
    assert code(str(tree), "--exit-zero") == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(cli, ["check", str(empty)])
    assert result.exit_code == 2 and "nothing scanned: no checkpoints under" in result.output
    assert code(str(tree), "--exclude", "*") == 2  # everything excluded: nothing scanned
    (tree / "broken.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not json}      ")
    assert code(str(tree)) == 2  # incomplete beats findings
    assert code(str(tree), "--exit-zero") == 2
    assert runner.invoke(cli, ["check", str(tree), "--jobs", "0"]).exit_code == 2  # usage


def test_exit_codes_in_a_real_process(tree: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tieaudit", "check", *args]
        return subprocess.run(command, capture_output=True, text=True, check=False, cwd=tmp_path)

    clean = run("models", "--exclude", "b-copy.safetensors", "--jobs", "2")
    assert clean.returncode == 0, clean.stderr
    failing = run("models", "--jobs", "2")
    assert failing.returncode == 1
    assert "FAIL models/nested/b-copy.safetensors" in failing.stdout
    assert failing.stderr.strip().splitlines()[-1].startswith("tieaudit: 4 checkpoints, 1 failing, 0 errors")
    (tmp_path / "empty").mkdir()
    nothing = run("empty")
    assert nothing.returncode == 2
    assert nothing.stderr.strip() == "tieaudit: error: nothing scanned: no checkpoints under empty"
    (tree / "nested" / "truncated.pt").write_bytes(b"PK\x03\x04 not really a zip")
    incomplete = run("models", "--format", "json", "-o", "report.json")
    assert incomplete.returncode == 2
    document = json.loads((tmp_path / "report.json").read_text())
    assert [e["path"] for e in document["errors"]] == ["models/nested/truncated.pt"]
    assert len(document["reports"]) == 4  # the rest is still reported


def test_jobs_2_gives_the_same_report_as_jobs_1(corpus: Corpus, tmp_path: Path) -> None:
    reports = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        main(["check", str(corpus.root), "--jobs", jobs, "--format", "json", "-o", str(out)])
        reports[jobs] = out.read_text()
    assert reports["1"] == reports["2"]
    document = json.loads(reports["1"])
    assert document["schema"] == "tieaudit.check/1"
    assert document["summary"]["checkpoints"] == len(corpus.entries)  # every fixture, each once
    assert document["errors"] == []


def test_chunks_keep_order_and_give_a_large_checkpoint_its_own_task(tmp_path: Path) -> None:
    small = [tmp_path / f"s{i}.bin" for i in range(8)]
    for path in small:
        path.write_bytes(b"x" * 100)
    large = tmp_path / "large.bin"
    large.write_bytes(b"x" * 10_000)
    work = [(str(p), Policy()) for p in [*small[:4], large, *small[4:]]]
    parts = chunks(work, workers=2)
    assert [item for part in parts for item in part] == work
    assert [(str(large), Policy())] in parts


def test_json_shape_follows_the_arguments(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    single = tree / "nested" / "b-copy.safetensors"
    main(["check", str(single), "-f", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    assert report["schema"] == "tieaudit.report/1" and report["status"] == "fail"
    assert report["findings"][0]["baselined"] is False and len(report["findings"][0]["fingerprint"]) == 64
    main(["check", str(tree / "gpt2"), "-f", "json", "-o", str(out)])  # a model folder is one checkpoint
    assert json.loads(out.read_text())["schema"] == "tieaudit.report/1"
    main(["check", str(tree / "nested"), "-f", "json", "-o", str(out), "--jobs", "1"])  # a folder: check/1
    document = json.loads(out.read_text())
    assert document["schema"] == "tieaudit.check/1"
    assert [r["status"] for r in document["reports"]] == ["fail", "ok"]
    assert document["summary"] == {
        "checkpoints": 2,
        "failing": 1,
        "errors": 0,
        "findings": 1,
        "baselined": 0,
        "stale_baseline_entries": 0,
        "wasted_bytes": 64 * 32 * 4,
    }


def test_text_names_each_checkpoint_once(tree: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(tree), "--jobs", "1"])
    lines = result.stdout.splitlines()
    status = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert status == ["ok", "ok", "FAIL", "ok"]
    head = lines.index("  TIE001 warning  untied-copy (equal), 8.0 KiB wasted")
    assert "lm_head.weight" in lines[head + 1]  # its names beneath the head
    assert "wasted" in result.stderr.splitlines()[-1]


def test_progress_bar_only_on_request_and_after_the_delay(capsys: pytest.CaptureFixture[str]) -> None:
    with ProgressBar(3, enabled=False, delay_s=0) as bar:
        bar.advance()
        assert bar._progress is None
    with ProgressBar(1, enabled=True, delay_s=0) as bar:  # one checkpoint: never a bar
        bar.tick()
        assert bar._progress is None
    with ProgressBar(3, enabled=True, delay_s=60) as bar:
        bar.advance()
        assert bar._progress is None  # quick runs never see it
    with ProgressBar(3, enabled=True, delay_s=0) as bar:
        bar.advance()
        assert bar._progress is not None
        bar.advance(2)
    assert capsys.readouterr().out == ""


def test_raw_bin_is_not_a_checkpoint_but_a_torch_bin_is(corpus: Corpus, tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(os.urandom(256).replace(b"\x80", b"\x00"))
    shutil.copy(corpus.path("hf_gpt2_bin") / "pytorch_model.bin", tmp_path / "model.bin")
    assert [Path(t.path).name for t in discover([str(tmp_path)]).targets] == ["model.bin"]


def test_a_config_folder_without_weights_is_walked_or_reported(corpus: Corpus, tmp_path: Path) -> None:
    export = tmp_path / "onnx-export"  # optimum's layout: config.json beside model.onnx
    export.mkdir()
    (export / "config.json").write_text("{}")
    shutil.copy(corpus.path("onnx_helper_shared"), export / "model.onnx")
    assert [t.path for t in discover([str(export)]).targets] == [str(export / "model.onnx")]
    bare = tmp_path / "bare"  # a model's config.json and nothing to audit: the folder's audit says why
    bare.mkdir()
    (bare / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    tool = tmp_path / "tool"  # a config.json naming no model (a module's, a tool's): skipped, saying why
    tool.mkdir()
    (tool / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    found = discover([str(tmp_path)])
    assert [t.path for t in found.targets] == [str(bare), str(export / "model.onnx")]
    verdicts = {f.path: (f.verdict, f.reason) for f in found.files}
    assert verdicts[str(tool / "config.json")] == ("skipped", CONFIG_ONLY)
    result = CliRunner().invoke(cli, ["check", str(bare)])
    assert result.exit_code == 2 and "no weights found" in result.output
