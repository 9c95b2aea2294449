"""The command line contract: exit codes, one-line errors, nothing written on failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Corpus
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

from tieaudit.cli.main import main
from tieaudit.rules.registry import RULES

READ_NOT_REFUSED = {"evil_reduce.pt"}
"""Well-formed files among the malformed ones: a pickle calling os.system is read with inert
placeholders and reported as TIE010 (test_pickle_code_never_runs), not refused."""
MALFORMED = sorted(
    p.name
    for p in (Path(__file__).parent.parent / "fixtures" / "malformed").iterdir()
    if p.suffix in {".pt", ".safetensors", ".bin", ".onnx"} and p.name not in READ_NOT_REFUSED
)


def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tieaudit: error: ") and "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    embedding = np.random.default_rng(0).standard_normal((200, 32)).astype(np.float32)
    path = tmp_path / "clone.safetensors"
    save_file({"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.copy()}, str(path))
    return path


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    path = tmp_path / "clean.safetensors"
    save_file(
        {
            "a": rng.standard_normal((200, 32)).astype(np.float32),
            "b": rng.standard_normal((200, 32)).astype(np.float32),
        },
        str(path),
    )
    return path


def test_check_exit_codes(clone: Path, clean: Path, tmp_path: Path) -> None:
    assert main(["check", str(clean)]) == 0
    assert main(["check", str(clone)]) == 1
    assert main(["check", str(clone), "--fail-on", "error"]) == 0  # TIE001 is a warning
    assert main(["check", str(clone), "--exit-zero"]) == 0
    assert main(["check", str(clone), "--ignore", "TIE001"]) == 0
    assert main(["check", str(tmp_path / "missing.pt")]) == 2
    assert main(["check", str(clone), str(tmp_path / "missing.pt")]) == 2  # incomplete beats findings
    assert main(["check", str(clone), "--ignore", "TIE999"]) == 2
    assert main(["check"]) == 2  # nothing to scan


def test_check_exit_codes_in_a_real_process(clone: Path, clean: Path) -> None:
    assert run(["check", str(clean)]).returncode == 0
    result = run(["check", str(clone)])
    assert result.returncode == 1 and "TIE001" in result.stdout
    assert run(["check", str(clone) + ".nope"]).returncode == 2


def test_inspect_exit_codes(clone: Path, tmp_path: Path) -> None:
    assert main(["inspect", str(clone)]) == 0  # findings do not fail inspect
    missing = run(["inspect", str(tmp_path / "missing.pt")])
    assert missing.returncode == 2
    assert "missing.pt: no such file or folder" in one_error_line(missing.stderr)


def test_check_json_for_several_paths(clone: Path, clean: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert (
        main(["check", str(clone), str(clean), str(tmp_path / "gone.pt"), "-f", "json", "-o", str(out)]) == 2
    )
    document = json.loads(out.read_text())
    assert document["schema"] == "tieaudit.check/1"
    assert [r["path"] for r in document["reports"]] == [str(clone), str(clean)]
    assert document["errors"][0]["path"] == str(tmp_path / "gone.pt")


def test_check_text_names_the_fix(clone: Path) -> None:
    result = run(["check", str(clone)])
    assert "fix: tieaudit retie" in result.stdout


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_inputs_exit_2_with_one_line_and_write_nothing(name: str, tmp_path: Path) -> None:
    source = Path(__file__).parent.parent / "fixtures" / "malformed"
    work = tmp_path / "work"
    shutil.copytree(source, work)
    before = sorted(os.listdir(work))
    out = tmp_path / "report.json"
    for command in ("inspect", "check"):
        result = run([command, str(work / name), "--format", "json", "--output", str(out)], cwd=work)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        line = one_error_line(result.stderr)
        assert name in line
        assert not out.exists()  # inspect and check write no report for bad input
    assert sorted(os.listdir(work)) == before  # no marker file, no output beside the input


def test_pickle_code_never_runs(tmp_path: Path) -> None:
    source = Path(__file__).parent.parent / "fixtures" / "malformed" / "evil_reduce.pt"
    shutil.copy(source, tmp_path / "evil.pt")
    result = run(["inspect", "evil.pt"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # read with an inert placeholder for the global
    assert "TIE010" in result.stdout and "posix.system" in result.stdout
    checked = run(["check", "evil.pt", "--format", "json"], cwd=tmp_path)
    assert checked.returncode == 1  # TIE010 is an error
    (finding,) = json.loads(checked.stdout)["findings"]
    assert (finding["rule"], finding["names"]) == ("TIE010", ["posix.system"])
    assert not (tmp_path / "tieaudit_pwned_marker").exists()


def _external_model(folder: Path, location: str) -> Path:
    weights = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        entry = weights.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        [weights],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_onnx_external_data_outside_the_folder_exits_2(how: str, tmp_path: Path) -> None:
    outside = tmp_path / "x.bin"
    outside.write_bytes(b"\0" * 64)
    folder = tmp_path / "model"
    folder.mkdir()
    if how == "symlink":
        (folder / "w.bin").symlink_to(outside)
    location = {"dotdot": "../x.bin", "absolute": str(outside), "symlink": "w.bin"}[how]
    result = run(["check", str(_external_model(folder, location))])
    assert result.returncode == 2
    assert "model.onnx" in one_error_line(result.stderr)


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run(["--debug", "inspect", str(tmp_path / "missing.pt")])
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_usage_errors_are_one_line() -> None:
    result = run(["check", "--fail-on", "bogus", "x"])
    assert result.returncode == 2
    assert "--fail-on" in one_error_line(result.stderr)


@pytest.mark.parametrize("fixture", ["st_cloned_head", "torch_tied_lm", "torch_legacy_tied"])
def test_auditing_safetensors_and_pt_does_not_import_torch(corpus: Corpus, fixture: str) -> None:
    code = (
        "import sys\nfrom tieaudit.cli.main import main\n"
        f"code = main(['check', {str(corpus.path(fixture))!r}, '--exit-zero'])\n"
        "assert code == 0, code\n"
        "heavy = sorted(m for m in ('torch', 'onnx', 'transformers') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HEAVY="


def test_every_rule_has_a_kind_and_the_help_explains_equality() -> None:
    assert {r.kind for r in RULES.values()} >= {"untied-copy", "declared-tie-broken", "vocab-misaligned"}
    result = run(["check", "--help"])
    assert result.returncode == 0
    assert "byte equality" in result.stdout and "+0.0" in result.stdout and "Examples" in result.stdout


def test_retie_exit_codes(clone: Path, tmp_path: Path) -> None:
    out = tmp_path / "tied.safetensors"
    dry = run(["retie", str(clone), "--dry-run"])
    assert dry.returncode == 0 and "left lm_head.weight = model.embed_tokens.weight" in dry.stdout
    assert "--all-equal re-ties it" in dry.stdout  # no record says the model shares them
    dry = run(["retie", str(clone), "--dry-run", "--all-equal"])
    assert dry.returncode == 0 and "tie  lm_head.weight = model.embed_tokens.weight" in dry.stdout
    assert "load_model(strict=True) will refuse this file" in dry.stdout
    assert not out.exists()
    written = run(["retie", str(clone), str(out), "--all-equal"])
    assert written.returncode == 0, written.stderr
    assert "verified bit for bit" in written.stderr and out.exists()
    assert main(["check", str(out)]) == 0
    assert "OUT already exists" in one_error_line(run(["retie", str(clone), str(out)]).stderr)
    assert "--in-place" in one_error_line(run(["retie", str(clone), str(clone)]).stderr)
    assert run(["retie", str(clone)]).returncode == 2  # OUT needed without --dry-run
    missing = run(["retie", str(tmp_path / "gone.safetensors"), str(tmp_path / "x.safetensors")])
    assert missing.returncode == 2 and not (tmp_path / "x.safetensors").exists()
    bad = run(["retie", str(clone), str(tmp_path / "y.safetensors"), "--relations", "equal,bogus"])
    assert bad.returncode == 2 and not (tmp_path / "y.safetensors").exists()


def test_a_bug_exits_3_with_its_traceback_and_bad_input_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": np.zeros((4, 4), np.float32)}, str(path))
    assert main(["inspect", str(tmp_path / "missing.safetensors")]) == 2
    assert "Traceback" not in capsys.readouterr().err

    def broken(*_: object, **__: object) -> None:
        raise ZeroDivisionError("a tieaudit bug")

    import tieaudit.audit

    monkeypatch.setattr(tieaudit.audit, "audit_path", broken)
    assert main(["inspect", str(path)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a tieaudit bug" in err
    assert "tieaudit: internal error: this is a bug in tieaudit" in err
