"""Issue 23, point 1: the pickle verdict is torch's, so a pickle that runs code is never "clean".

Each payload of ``fixtures/hostile/cases_trust2_verdict.py`` is proven live here: a full
``torch.load(weights_only=False)`` in a child process creates the marker file (the code ran),
``torch.load(weights_only=True)`` refuses the file, and ``tieaudit check`` exits 1 with TIE010
naming the global. The same holds inside a Trainer checkpoint folder (``training_args.bin``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch_child import torch_load

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "fixtures" / "hostile"
sys.path.insert(0, str(HOSTILE))
import builders  # type: ignore[import-not-found]  # noqa: E402
import cases_trust2_verdict as verdict_cases  # type: ignore[import-not-found]  # noqa: E402

TRAINER = ROOT / "fixtures" / "generated" / "training" / "checkpoint-2"
LIVE = [p for p in verdict_cases.PAYLOADS if p.runs]

_LOAD = """
import sys, torch
try:
    torch.load(sys.argv[1], weights_only=sys.argv[2] == "1")
except Exception as exc:
    print(type(exc).__name__, str(exc)[:200])
    sys.exit(7)
"""


def _torch_load(path: Path, *, weights_only: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _LOAD, str(path), "1" if weights_only else "0"],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _check(target: Path, out: Path) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(target), "--format", "json", "-o", str(out)],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(out.read_text())


def _tie010_names(document: dict[str, object]) -> list[str]:
    reports = document.get("reports", [document])
    assert isinstance(reports, list)
    return [n for r in reports for f in r["findings"] if f["rule"] == "TIE010" for n in f["names"]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, Path, str]]:
    """Each live payload in its own folders, loaded by torch: (wide folder, torch's answer without
    weights_only, strict folder, its answer with it). One child for each kind of load (torch is
    imported twice, not twice per payload: tests/torch_child.py); each load in its payload's folder,
    where the payload's code writes its marker."""
    base = tmp_path_factory.mktemp("verdict")
    folders = {}
    for payload in LIVE:
        data = builders._zip_with_evil(payload.build(), payload.protocol)
        wide, strict = base / "wide" / payload.slug, base / "strict" / payload.slug
        for folder in (wide, strict):
            folder.mkdir(parents=True)
            (folder / "model.pt").write_bytes(data)
        folders[payload.slug] = (wide, strict)
    wide_answers = torch_load([wide for wide, _ in folders.values()], weights_only=False)
    strict_answers = torch_load([strict for _, strict in folders.values()], weights_only=True)
    return {
        slug: (wide, wide_answers[str(wide)], strict, strict_answers[str(strict)])
        for slug, (wide, strict) in folders.items()
    }


@pytest.mark.parametrize("payload", LIVE, ids=[p.slug for p in LIVE])
def test_payload_runs_under_full_unpickle_and_check_fails_it(
    payload: object, loaded: dict[str, tuple[Path, str, Path, str]], tmp_path: Path
) -> None:
    assert isinstance(payload, verdict_cases.Payload)
    wide, _, strict, refused = loaded[payload.slug]
    assert (wide / builders.MARKER).exists(), "the payload did not run: it proves nothing"

    assert refused == "UnpicklingError", refused
    assert not (strict / builders.MARKER).exists()

    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "model.pt").write_bytes(builders._zip_with_evil(payload.build(), payload.protocol))
    code, document = _check(audit / "model.pt", tmp_path / "report.json")
    assert code == 1
    assert payload.named in _tie010_names(document)
    assert not (audit / builders.MARKER).exists()


def test_trainer_folder_training_args_payload_fails_check(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-2"
    shutil.copytree(TRAINER, folder)
    attack = verdict_cases.PAYLOADS[0]  # pathlib.Path.write_text
    (folder / "training_args.bin").write_bytes(builders._zip_with_evil(attack.build(), attack.protocol))

    _torch_load(folder / "training_args.bin", weights_only=False)
    assert (folder / builders.MARKER).exists()
    (folder / builders.MARKER).unlink()

    code, document = _check(folder, tmp_path / "report.json")
    assert code == 1
    assert attack.named in _tie010_names(document)
    assert not (folder / builders.MARKER).exists()


def test_real_training_args_is_tie010_as_torch_refuses_it(tmp_path: Path) -> None:
    """A genuine Trainer training_args.bin names transformers' TrainingArguments: torch's
    weights_only load refuses it, so tieaudit's verdict is TIE010 too (no 'probably data' class)."""
    refused = _torch_load(TRAINER / "training_args.bin", weights_only=True)
    assert refused.returncode == 7, refused.stdout
    code, document = _check(TRAINER, tmp_path / "report.json")
    assert code == 1
    assert "transformers.training_args.TrainingArguments" in _tie010_names(document)


NAMESPACE = ROOT / "fixtures" / "generated" / "pickles" / "namespace_ckpt.pt"


def _with_policy(tmp_path: Path, names: list[str]) -> subprocess.CompletedProcess[str]:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(f"safe-globals = {json.dumps(names)}\n")
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(NAMESPACE), "--policy", str(policy),
         "--format", "json", "-o", str(tmp_path / "r.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_policy_safe_globals_turns_exactly_those_names_into_tie011(tmp_path: Path) -> None:
    """safe-globals mirrors add_safe_globals: exact names only, and torch then loads the file."""
    loads = subprocess.run(
        [sys.executable, "-c", "import argparse, sys, torch\n"
         "with torch.serialization.safe_globals([argparse.Namespace]):\n"
         "    torch.load(sys.argv[1], weights_only=True)", str(NAMESPACE)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert loads.returncode == 0, loads.stderr
    vouched = _with_policy(tmp_path, ["argparse.Namespace"])
    assert vouched.returncode == 0, vouched.stderr
    findings = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert [(f["rule"], f["names"]) for f in findings if f["rule"] in ("TIE010", "TIE011")] == [
        ("TIE011", ["argparse.Namespace"])
    ]
    for near_miss in (["argparse.Namespac"], ["argparse.Namespace.x"], ["argparse.ArgumentParser"]):
        assert _with_policy(tmp_path, near_miss).returncode == 1, near_miss


@pytest.mark.parametrize(
    "name", ["os.system", "posix.system", "sys.modules", "nt.system", "argparse", "a..b"]
)
def test_policy_refuses_safe_globals_torch_never_accepts(name: str, tmp_path: Path) -> None:
    done = _with_policy(tmp_path, [name])
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "safe-globals" in done.stderr
