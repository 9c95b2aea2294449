"""Auditing Hugging Face folders imports neither torch nor transformers and opens no socket.

Every architecture in tieaudit's tie table gets a folder (config.json naming it, the tie flag
stated true and false, a tiny safetensors file holding the names the tie reads); all of them are
audited by ``tieaudit check`` in one process (tests/guarded_cli.py) where importing torch or
transformers raises and ``socket.socket`` refuses. Its declared ties must be the table's answer,
computed here from the table's groups, and nothing may be written outside the folders. A few are
re-tied under the same guard. The config attacks of fixtures/hostile/cases_hf.py (a nested
``auto_map``, a ``backbone`` naming a Hub repository, ``depths: [10**9]``...) run the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "tieaudit" / "formats" / "tie_table.json").read_text())
GUARD = Path(__file__).resolve().parent / "guarded_cli.py"
HOSTILE = ROOT / "fixtures" / "hostile"
sys.path.insert(0, str(HOSTILE))
import cases_hf  # type: ignore[import-not-found]  # noqa: E402
import make_hostile  # type: ignore[import-not-found]  # noqa: E402

TIMEOUT = 600.0
"""The guarded process audits thousands of folders; a hang shows up as this timeout."""
ATTACK_TIMEOUT = 120.0
"""A hostile config's guarded process (inspect and check together) past this is a hang; how fast it
runs is bench's to measure, not a test's (a busy two-core machine makes wall time noisy)."""
RETIED = [
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "T5ForConditionalGeneration",
    "LlavaForConditionalGeneration",
]
"""Classes re-tied under the guard: a plain head, a default-off flag, a forced flag, a nested config."""


def expected_ties(entry: dict[str, Any], state: str) -> dict[str, str]:
    """The table's answer when config.json states only the top-level flag ('0' or '1')."""
    combo = state + "-" * (len(entry["switches"]) - 1)
    if "unresolved" in entry or combo in entry.get("refused", []):
        return {}
    ties: dict[str, str] = {}
    for group in entry["groups"]:
        if combo in group["on"]:
            ties.update(group["ties"])
    return ties


def make_folder(folder: Path, name: str, entry: dict[str, Any], state: str, copies: bool = False) -> None:
    """config.json naming the class with the flag stated; model.safetensors holding every name a
    tie of the class reads (sources; with copies, targets too, as equal copies of their source)."""
    folder.mkdir(parents=True)
    config = {"architectures": [name], "model_type": entry["model_type"], "tie_word_embeddings": state == "1"}
    (folder / "config.json").write_text(json.dumps(config))
    names = sorted({s for group in entry["groups"] for s in group["ties"].values()}) or ["dummy.weight"]
    tensors = {n: np.arange(64, dtype=np.float32).reshape(16, 4) + i for i, n in enumerate(names)}
    if copies:
        for group in entry["groups"]:
            for target, source in group["ties"].items():
                tensors.setdefault(target, tensors[source].copy())
    save_file(tensors, str(folder / "model.safetensors"))


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def run_guarded(runs: list[list[str]], scratch: Path, *, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The runs in one guarded process with empty HOME, HF_HOME, TMPDIR and working folder;
    asserts those stay empty (nothing written outside what the runs name)."""
    places = {key: scratch / key.lower() for key in ("HOME", "HF_HOME", "TMPDIR", "CWD")}
    for place in places.values():
        place.mkdir(parents=True)
    spec, result = scratch / "spec.json", scratch / "result.json"
    spec.write_text(json.dumps({"runs": runs, "result": str(result)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update({key: str(place) for key, place in places.items() if key != "CWD"})
    done = subprocess.run(
        [sys.executable, str(GUARD), str(spec)],
        cwd=places["CWD"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.read_text())
    for key, place in places.items():
        assert list(place.iterdir()) == [], f"written into {key}: {list(place.iterdir())}"
    assert report["import_attempts"] == [], report["import_attempts"][:20]
    assert report["loaded"] == []
    assert report["sockets"] == []
    return report


def config_ties(report: dict[str, Any], entry: dict[str, Any]) -> dict[str, str]:
    """The report's config ties in the table's in-memory names (a tie is declared as the files
    spell it: a dropped head may be spelled as save_pretrained writes it, GPT-NeoX's ``embed_out``)."""
    memory = {disk: name for name, disk in entry.get("disk_names", {}).items() if disk is not None}
    return {
        memory.get(t["target"], t["target"]): memory.get(t["source"], t["source"])
        for t in report["declared_ties"]
        if t["declared_by"] == "config"
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    base = tmp_path_factory.mktemp("architectures")
    made = {}
    for index, (name, entry) in enumerate(sorted(TABLE["classes"].items())):
        for state in "01":
            folder = base / f"{index}-{state}"
            make_folder(folder, name, entry, state)
            made[(name, state)] = folder
    return made


def test_every_architecture_audits_to_the_tables_answer_without_torch_transformers_or_sockets(
    folders: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    before = {key: listing(folder) for key, folder in folders.items()}
    paths = [str(folder) for folder in folders.values()]
    began = time.monotonic()
    report = run_guarded([["check", *paths, "--jobs", "1", "--format", "json", "--exit-zero"]], tmp_path)
    seconds = time.monotonic() - began
    (run,) = report["runs"]
    assert run["code"] == 0, run["stderr"][-2000:]
    document = json.loads(run["stdout"])
    assert document["errors"] == []
    by_path = {r["path"]: r for r in document["reports"]}
    assert len(by_path) == len(folders)
    wrong = []
    for (name, state), folder in folders.items():
        entry = TABLE["classes"][name]
        audited = by_path[str(folder)]
        if config_ties(audited, entry) != expected_ties(entry, state):
            wrong.append((name, state, config_ties(audited, entry), expected_ties(entry, state)))
        notes = [s["reason"] for s in audited.get("skipped", [])]
        if "unresolved" in entry or state + "-" * (len(entry["switches"]) - 1) in entry.get("refused", []):
            assert any("config tie not resolved" in note for note in notes), (name, notes)
    assert wrong == [], wrong[:10]
    assert {key: listing(folder) for key, folder in folders.items()} == before
    print(f"{len(folders)} folders of {len(TABLE['classes'])} architectures audited in {seconds:.1f} s")


def test_inspect_and_retie_import_neither_torch_nor_transformers(tmp_path: Path) -> None:
    runs, outs = [], {}
    for name in RETIED:
        entry = TABLE["classes"][name]
        folder = tmp_path / "in" / name
        make_folder(folder, name, entry, "1", copies=True)
        outs[name] = tmp_path / "out" / name
        runs.append(["inspect", str(folder), "--format", "json"])
        runs.append(["retie", str(folder), str(outs[name])])
    (tmp_path / "out").mkdir()
    report = run_guarded(runs, tmp_path / "scratch")
    for name, (inspected, retied) in zip(RETIED, zip(*[iter(report["runs"])] * 2, strict=True), strict=True):
        assert inspected["code"] == 0, inspected["stderr"]
        entry = TABLE["classes"][name]
        assert config_ties(json.loads(inspected["stdout"]), entry) == expected_ties(entry, "1")
        assert retied["code"] == 0, (name, retied["stderr"])
        assert (outs[name] / "model.safetensors").is_file()


@pytest.mark.parametrize("case", cases_hf.cases(), ids=[c.name for c in cases_hf.cases()])
def test_config_attack_is_audited_quietly_without_imports(case: make_hostile.Hostile, tmp_path: Path) -> None:
    """Each hostile config: inspect and check finish fast with the case's exit code, print nothing
    but the report (no prompt), import nothing, open no socket and write nothing."""
    work = tmp_path / "work"
    work.mkdir()
    target = make_hostile.prepare(case, HOSTILE, work)
    before = listing(work)
    report = run_guarded(
        [["inspect", str(target), "--format", "json"], ["check", str(target), "--format", "json"]],
        tmp_path / "scratch",
        timeout=ATTACK_TIMEOUT,
    )
    inspected, checked = report["runs"]
    if case.exit_code == 0:
        assert inspected["code"] == 0 and checked["code"] in (0, 1), (inspected["stderr"], checked["stderr"])
        assert inspected["stderr"] == ""
        json.loads(inspected["stdout"])  # stdout is the report and nothing else
    else:
        assert inspected["code"] == checked["code"] == 2
        assert case.expect.lower() in inspected["stderr"].lower()
    assert listing(work) == before
    assert not list(work.rglob(make_hostile.MARKER))


def test_the_whole_corpus_audits_and_reties_without_torch_transformers_or_sockets(
    corpus: Any, tmp_path: Path
) -> None:
    """Every generated corpus entry (HF folders, .pt, safetensors, ONNX) inspected and checked, and
    every HF folder re-tied, in the guarded process: no import, no socket, nothing written but OUT."""
    entries = [corpus.path(entry["name"]) for entry in corpus.manifest["fixtures"]]
    entries = [path / "model.onnx" if (path / "model.onnx").is_file() else path for path in entries]
    assert len(entries) > 20
    folders = [path for path in entries if path.is_dir()]
    assert len(folders) >= 10
    before = {path: listing(path) if path.is_dir() else path.read_bytes() for path in entries}
    (tmp_path / "out").mkdir()
    runs = [["inspect", str(path), "--format", "json"] for path in entries]
    runs += [["check", str(path), "--format", "json", "--exit-zero"] for path in entries]
    # A folder of pytorch_model.bin files is re-tied with torch (torch.save writes the views), like
    # a .pt: test_retie_of_torch_files_without_torch_is_refused_in_one_line covers it without torch.
    rewritable = [path for path in folders if not any(path.glob("*.bin"))]
    runs += [["retie", str(path), str(tmp_path / "out" / path.name)] for path in rewritable]
    report = run_guarded(runs, tmp_path / "scratch")
    for argv, run in zip(runs, report["runs"], strict=True):
        assert "Traceback" not in run["stderr"], (argv, run["stderr"][-2000:])
        if argv[0] == "retie":  # a folder retie cannot repair is refused in one line, never half-written
            assert run["code"] in (0, 1, 2), (argv, run["stderr"])
        else:
            assert run["code"] == 0, (argv, run["stderr"][-2000:])
            json.loads(run["stdout"])
    retied = [a for a, run in zip(runs, report["runs"], strict=True) if a[0] == "retie" and run["code"] == 0]
    assert len(retied) >= len(folders) // 2, retied
    assert {path: listing(path) if path.is_dir() else path.read_bytes() for path in entries} == before


@pytest.mark.parametrize("fixture", ["hf_gpt2_bin", "torch_cloned_head"])
def test_retie_of_torch_files_without_torch_is_refused_in_one_line(
    corpus: Any, tmp_path: Path, fixture: str
) -> None:
    """Writing .pt or a folder's pytorch_model.bin needs the torch extra: without it, exit 2 and
    one line saying so, nothing written (torch made unimportable in a fresh interpreter)."""
    source, out = corpus.path(fixture), tmp_path / ("out" if corpus.path(fixture).is_dir() else "out.pt")
    if source.is_dir():  # the folder's head made a copy of the embedding: something to re-tie
        import shutil

        import torch

        source = tmp_path.parent / f"{tmp_path.name}-in"
        shutil.copytree(corpus.path(fixture), source)
        state = torch.load(source / "pytorch_model.bin", weights_only=True)
        state["lm_head.weight"] = state["lm_head.weight"].clone()
        torch.save(state, source / "pytorch_model.bin")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from tieaudit.cli.main import main\n"
        f"sys.exit(main(['retie', {str(source)!r}, {str(out)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs torch" in lines[0] and "tieaudit[torch]" in lines[0], lines
    assert list(tmp_path.iterdir()) == []
