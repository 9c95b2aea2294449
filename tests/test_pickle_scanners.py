"""tieaudit's pickle verdicts beside picklescan's and modelscan's, on the hostile and the real files.

- Lists: every global picklescan 1.x (``_unsafe_globals``) or modelscan (``unsafe_globals``, any
  severity) calls dangerous is ``runs-code`` for tieaudit (TIE010).
- Files: for every torch file of the hostile corpus and the generated corpus (real training pickles
  among them: Trainer's rng_state.pth and training_args.bin, a fairseq-style checkpoint, a pickled
  nn.Module), each global either scanner flags dangerous in a file is flagged by tieaudit too: as
  TIE010 when tieaudit reads the file, or named in its refusal when it refuses it.

``python -m pytest tests/test_pickle_scanners.py -s`` prints the side-by-side table (file, each
tool's verdict), which the closing note of issue 13 quotes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import modelscan.modelscan as modelscan_module  # dev extra, installed by make test
import modelscan.settings as modelscan_settings
import picklescan.scanner as picklescan_scanner
import pytest
from conftest import GENERATED, ROOT

from tieaudit.core.errors import InputError
from tieaudit.formats.pickle_globals import classify
from tieaudit.formats.torch_file import TorchReader

SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
RENAMED = {"__builtin__": "builtins"}
"""Python 2 module names both unpicklers (and tieaudit) read under their Python 3 spelling."""


def _dotted(module: str, name: str) -> str:
    return f"{RENAMED.get(module, module)}.{name}"


def _listed(table: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = []
    for module, names in table.items():
        if names == "*":
            pairs.append((module, "anything"))
        else:  # picklescan spells some single names as a bare string ("partial")
            pairs += [(module, name) for name in ([names] if isinstance(names, str) else names)]
    return pairs


def test_every_global_the_scanners_call_dangerous_runs_code_here() -> None:
    listed = _listed(picklescan_scanner._unsafe_globals)
    for severity in modelscan_settings.DEFAULT_SETTINGS["unsafe_globals"].values():
        listed += _listed(severity)
    assert len(listed) > 100
    missed = [f"{m}.{n}" for m, n in listed if classify(RENAMED.get(m, m), n) != "runs-code"]
    assert missed == []


def _files() -> list[Path]:
    hostile = ROOT / "fixtures" / "hostile"
    found = [p for p in sorted(hostile.glob("*")) if p.suffix in SUFFIXES and p.is_file()]
    return found + sorted(p for p in GENERATED.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def _picklescan(path: Path) -> tuple[set[str], str]:
    try:
        result = picklescan_scanner.scan_file_path(str(path))
    except Exception as exc:  # the scanner itself fails on some hostile files
        return set(), f"crashed ({type(exc).__name__})"
    flagged = {_dotted(g.module, g.name) for g in result.globals if g.safety.name == "Dangerous"}
    verdict = "error" if result.scan_err else ("dangerous" if flagged else "clean")
    return flagged, verdict


def _modelscan(path: Path) -> tuple[set[str], str]:
    try:
        report = modelscan_module.ModelScan().scan(str(path))
    except Exception as exc:
        return set(), f"crashed ({type(exc).__name__})"
    flagged = {_dotted(i["module"], i["operator"]) for i in report["issues"]}
    verdict = "error" if report["errors"] else ("dangerous" if flagged else "clean")
    return flagged, verdict


def _tieaudit(path: Path) -> tuple[set[str], str, str]:
    """(globals flagged runs-code, verdict, refusal message)."""
    try:
        with TorchReader().read(str(path)) as opened:
            used = opened.checkpoint.pickle_globals
    except InputError as exc:
        return set(), "refused", exc.message
    flagged = {g.name for g in used if g.verdict == "runs-code"}
    return flagged, "TIE010" if flagged else "clean", ""


@pytest.fixture(scope="module")
def table() -> list[dict[str, Any]]:
    rows = []
    for path in _files():
        if path.stat().st_size == 0 or not os.access(path, os.R_OK):
            continue
        ps_flagged, ps = _picklescan(path)
        ms_flagged, ms = _modelscan(path)
        ours, verdict, refusal = _tieaudit(path)
        rows.append(
            {
                "file": str(path.relative_to(ROOT)),
                "picklescan": ps,
                "modelscan": ms,
                "tieaudit": verdict,
                "theirs": ps_flagged | ms_flagged,
                "ours": ours,
                "refusal": refusal,
            }
        )
    print("\n| file | picklescan | modelscan | tieaudit |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['file']} | {row['picklescan']} | {row['modelscan']} | {row['tieaudit']} |")
    return rows


def test_every_global_a_scanner_flags_in_a_file_is_flagged_here(table: list[dict[str, Any]]) -> None:
    """Flagged as TIE010 when tieaudit reads the file; a file it refuses fails every gate (exit 2),
    whether the refusal names the global (a refused opcode does) or another defect found first (an
    ambiguous zip layout)."""
    missed = [
        f"{row['file']}: {name}"
        for row in table
        for name in row["theirs"]
        if name not in row["ours"] and row["tieaudit"] != "refused"
    ]
    assert missed == []
    named = [row for row in table if row["theirs"] and row["tieaudit"] == "refused"]
    print("\nrefused files the scanners flag, and whether the refusal names the global:")
    for row in named:
        said = any(name.rsplit(".", 1)[-1] in row["refusal"] for name in row["theirs"])
        print(f"  {row['file']}: {'named' if said else 'not named'}: {row['refusal'][:110]}")


def test_the_comparison_covers_attacks_and_real_training_pickles(table: list[dict[str, Any]]) -> None:
    by_file = {Path(row["file"]).name: row for row in table}
    assert by_file["pt_zip_reduce_os_system.pt"]["tieaudit"] == "TIE010"
    assert by_file["pt_zip_reduce_os_system.pt"]["picklescan"] == "dangerous"
    # torch's verdict: weights_only refuses TrainingArguments and numpy arrays alike
    assert by_file["training_args.bin"]["tieaudit"] == "TIE010"
    assert by_file["rng_state.pth"]["tieaudit"] == "TIE010"
    assert sum(row["theirs"] != set() for row in table) >= 8
