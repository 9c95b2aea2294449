"""Issue 23, point 3: the pickle VM is bounded in memory and work on any input.

Every input here is under 10 MB: a torch zip whose data.pkl is the attack (stored, as torch.save
writes it, or deflated up to the inflation limit), or a legacy stream. They are built at test
time from the builders of fixtures/hostile/cases_trust2_vmbudget.py (whose 64 KB versions are in
the hostile corpus): memo'd containers and strings copied, scanned or hashed by allowed calls and
placeholders again and again, tuple keys that hash in 2**depth, keys solved for one hash, floods of
small containers, memo entries and opcodes, names and tensors for the flattening and the reports
to carry. Each runs through ``tieaudit inspect --format json`` and ``tieaudit check`` in a
subprocess of a fresh helper process, which reports the CLI's peak RSS from
``getrusage(RUSAGE_CHILDREN)``. The CLI runs under an address-space cap and a CPU limit of its own,
so that a regression fails here rather than taking the machine down.

The acceptance: at most 512 MiB peak for any of them, and the work bounded by the counted pickle
budget (units, see tieaudit/formats/pickle_budget.py): a refusal is exit 2 and one line naming the
file and the limit it crossed; a run still going after CPU_LIMIT seconds of CPU is killed as a hang
and fails (how fast the reads are is bench/'s business, not a test's: the machine is shared). Real
checkpoints spend a small part of their budget; a MemoryError anywhere is exit 2 with one line,
never exit 3 with a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "fixtures" / "generated"
sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
import cases_trust2_vmbudget as attacks  # type: ignore[import-not-found]  # noqa: E402

INPUT_BYTES = 10 << 20
PEAK_BYTES = 512 << 20
"""Its peak resident memory (interpreter and imports included)."""
ADDRESS_SPACE = 3 << 30
"""The CLI's address-space cap: a regression runs out of memory here instead of on the machine."""
CPU_LIMIT = 60
"""The CLI's CPU-time limit (RLIMIT_CPU): a hang guard, not a speed target (a run takes a second or
two): a regression that loops is killed (SIGXCPU), and fails."""
FAST = 1
"""zlib level of the 10 MB deflated attacks: the inflated pickle is the attack, and at level 9 building
the memo one alone took 90 s of CPU (two passes over 30 MB of near-repeats)."""
COMMANDS = (("inspect", "--format", "json"), ("check",))
REPORTED = ("shared_tensor_fanout", "long_shared_names", "real_shaped_dense")
"""Attacks on what the reports carry: run through inspect's JSON report too. The others are
refused (or read) by the reader that inspect and check share, before any report is made, so
``check`` alone runs them (each 10 MB run takes seconds; the suite keeps to its time)."""
KILLED = (-signal.SIGXCPU, -signal.SIGKILL)
"""The return codes of a run killed at CPU_LIMIT."""


def commands_of(name: str) -> tuple[tuple[str, ...], ...]:
    """The commands an attack runs through."""
    reported = name in REPORTED or ATTACKS[name].expect == VALID
    return COMMANDS if reported else (("check",),)


BUDGET = "pickle budget"
COLLISIONS = "MAX_KEY_COLLISIONS"
DIMS = "dimensions; at most 64"
VISITS = "entries (or shared containers)"
VALID = ""
"""The expectation for an input torch loads and tieaudit reads within budget (exit 0 or 1)."""
CODE = "TIE010"
"""The expectation for an input naming a global outside torch's allowlist: whatever its budget, the
walk of its whole pickle names the global (TIE010: inspect exits 0, check 1)."""

# The helper: a fresh process whose only child is the CLI, so RUSAGE_CHILDREN is that run's.
HELPER = r"""
import json, os, resource, subprocess, sys
argv, cwd, cap, cpu = json.loads(sys.argv[1])
def limits():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, preexec_fn=limits, check=False)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"returncode": done.returncode, "stderr": done.stderr, "peak": usage.ru_maxrss * 1024}))
"""


@dataclass(frozen=True)
class Attack:
    """One input and what tieaudit must say about it."""

    build: Callable[[], bytes]
    """Its bytes (under 10 MB)."""
    expect: str
    """A fragment of the one-line refusal; VALID when the input is read (exit 0 or 1)."""


a, zipped, deflated, legacy = attacks, attacks.zipped, attacks.deflated, attacks.legacy
ATTACKS: dict[str, Attack] = {
    # memo'd containers and strings handed to allowed calls or placeholders again and again
    "ordereddict_copies": Attack(lambda: zipped(a.ordereddict_copies(200_000, 1_000_000)), BUDGET),
    "counter_copies": Attack(lambda: zipped(a.counter_copies(200_000, 1_000_000)), BUDGET),
    "set_scans": Attack(lambda: zipped(a.set_scans(1_000_000, 1_000_000)), BUDGET),
    "encode_copies": Attack(lambda: zipped(a.encode_copies(4_000_000, 1_000_000)), BUDGET),
    "bytearray_scans": Attack(lambda: zipped(a.bytearray_scans(4_000_000, 1_000_000)), BUDGET),
    "placeholder_calls": Attack(lambda: zipped(a.placeholder_calls(1_000_000, 1_000_000)), CODE),
    # a size is read once per rebuild, and no size has more dimensions than a view can have
    "tensor_size_copies": Attack(lambda: zipped(a.tensor_size_copies(1_000_000, 1_000_000)), DIMS),
    "persistent_id_copies": Attack(lambda: zipped(a.persistent_id_copies(4_000_000, 1_000_000)), BUDGET),
    "placeholder_builds": Attack(lambda: zipped(a.placeholder_builds(4_000_000)), CODE),
    # keys expensive to hash, keys of one hash
    "dag_tuple_dict_key": Attack(lambda: zipped(a.dag_tuple_dict_key(120)), BUDGET),
    "dag_tuple_ordereddict_key": Attack(lambda: zipped(a.dag_tuple_ordereddict_key(120)), BUDGET),
    "colliding_int_keys": Attack(lambda: zipped(a.colliding_int_keys(700_000)), COLLISIONS),
    "colliding_tuple_keys": Attack(lambda: zipped(a.colliding_tuple_copies(400_000, 10)), COLLISIONS),
    # many small objects: containers, memo entries, opcodes, stack slots (stored and deflated)
    "empty_sets": Attack(lambda: zipped(a.many_empty_sets(9_900_000)), BUDGET),
    "empty_sets_deflated": Attack(lambda: deflated(a.many_empty_sets(56_000_000), level=FAST), BUDGET),
    "none_pushes_deflated": Attack(lambda: deflated(a.none_pushes(56_000_000), level=FAST), BUDGET),
    "memo_entries": Attack(lambda: zipped(a.many_memo_entries(1_900_000)), VALID),
    "memo_entries_deflated": Attack(lambda: deflated(a.many_memo_entries(6_000_000), level=FAST), BUDGET),
    "setitems_growth": Attack(lambda: zipped(a.many_int_keys(1_600_000)), VISITS),
    "appends_growth": Attack(lambda: zipped(a.many_appends(3_000_000)), VISITS),
    "global_flood": Attack(lambda: zipped(a.global_flood(500_000)), CODE),
    # what the flattening and the reports carry: names and tensors
    "shared_tensor_fanout": Attack(lambda: zipped(a.shared_tensor_fanout(999)), BUDGET),
    "shared_tensor_fanout_in_budget": Attack(
        lambda: zipped(a.shared_tensor_fanout(320, 2_400_000), 2_400_000), VALID
    ),
    "long_shared_names": Attack(lambda: zipped(a.long_shared_names(4_000_000, 199, 4000)), BUDGET),
    "real_shaped_dense": Attack(lambda: zipped(a.real_shaped(50_000)), BUDGET),
    "real_shaped_in_budget": Attack(lambda: zipped(a.real_shaped(25_000, 1_500_000), 1_500_000), VALID),
    # the same classes in a legacy stream
    "legacy_ordereddict_copies": Attack(lambda: legacy(a.ordereddict_copies(200_000, 1_000_000)), BUDGET),
    "legacy_set_scans": Attack(lambda: legacy(a.set_scans(1_000_000, 1_000_000)), BUDGET),
    "legacy_colliding_int_keys": Attack(lambda: legacy(a.colliding_int_keys(700_000)), COLLISIONS),
    "legacy_empty_sets": Attack(lambda: legacy(a.many_empty_sets(9_900_000)), BUDGET),
    "legacy_dag_tuple_dict_key": Attack(lambda: legacy(a.dag_tuple_dict_key(120)), BUDGET),
}


@dataclass(frozen=True)
class Run:
    """How one CLI run on one attack ended."""

    returncode: int
    stderr: str
    peak: int
    """Its peak resident bytes."""


def _measure(argv: list[str], cwd: Path) -> Run:
    """argv run by a fresh helper process, which reports the run's rusage."""
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),  # this checkout, not whatever tieaudit is installed
    }
    spec = json.dumps([argv, str(cwd), ADDRESS_SPACE, CPU_LIMIT])
    helper = subprocess.run(
        [sys.executable, "-c", HELPER, spec], env=env, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert helper.returncode == 0, helper.stderr[-3000:]
    found: dict[str, Any] = json.loads(helper.stdout)
    return Run(**found)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Run]:
    """Every attack through every command, two runs at a time."""
    folder = tmp_path_factory.mktemp("vm_budget")
    jobs = []
    for name, attack in ATTACKS.items():
        data = attack.build()
        assert len(data) <= INPUT_BYTES, (name, len(data))
        path = folder / f"{name}.pt"
        path.write_bytes(data)
        for command in commands_of(name):
            out = folder / f"{name}.{command[0]}.report"
            argv = [sys.executable, "-m", "tieaudit", command[0], str(path), *command[1:], "-o", str(out)]
            jobs.append(((name, command[0]), argv))
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda job: _measure(job[1], folder), jobs))
    return {key: run for (key, _), run in zip(jobs, done, strict=True)}


@pytest.mark.parametrize(
    ("name", "command"), [(name, command[0]) for name in ATTACKS for command in commands_of(name)]
)
def test_a_10mb_input_stays_within_its_budget_and_512mib(
    runs: dict[tuple[str, str], Run], name: str, command: str
) -> None:
    run = runs[(name, command)]
    assert run.returncode not in KILLED, f"{name}: {command} ran past {CPU_LIMIT} s of CPU (a hang)"
    assert run.peak <= PEAK_BYTES, f"{name}: {command} peaked at {run.peak >> 20} MiB"
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    expect = ATTACKS[name].expect
    if expect == VALID:
        assert run.returncode in ((0,) if command == "inspect" else (0, 1)), run.stderr[-2000:]
        return
    if expect == CODE:
        assert run.returncode == (0 if command == "inspect" else 1), run.stderr[-2000:]
        return
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith("tieaudit: error: ") and f"{name}.pt" in lines[0], lines[0]
    assert expect in lines[0], lines[0]


@pytest.mark.parametrize("name", ["shared_tensor_fanout_in_budget", "real_shaped_in_budget"])
def test_the_text_report_of_what_the_budget_admits_is_bounded(tmp_path: Path, name: str) -> None:
    """inspect's text report of the largest inputs the budget admits: 102 400 names on one storage
    (one tie group), 25 000 parameters tied with their optimizer state split (a message naming them
    all, 50 000 lines once wrapped). rich lays out every line it is given, so the report lists
    MAX_CELL_NAMES names and MAX_MESSAGE_CHARS characters of a message, and says how many more."""
    path = tmp_path / f"{name}.pt"
    path.write_bytes(ATTACKS[name].build())
    report = tmp_path / "report.txt"
    run = _measure([sys.executable, "-m", "tieaudit", "inspect", str(path), "-o", str(report)], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.peak <= PEAK_BYTES, run.peak >> 20
    text = report.read_text()
    assert len(text.splitlines()) < 500 and "more" in text, text[-3000:]


# ------------------------------------------------------------------ real checkpoints


class _Recorded:
    """Every PickleBudget a read makes, so a test can see what the read spent."""

    def __init__(self) -> None:
        from tieaudit.formats import pickle_budget

        self.made: list[pickle_budget.PickleBudget] = []
        outer = self

        class Recording(pickle_budget.PickleBudget):
            def __init__(self, file_bytes: int) -> None:
                super().__init__(file_bytes)
                outer.made.append(self)

        self.kind = Recording


def _spent(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """(units spent, units allowed, tensors read) for the torch file at path."""
    from tieaudit.formats import torch_file

    recorded = _Recorded()
    monkeypatch.setattr(torch_file, "PickleBudget", recorded.kind)
    with torch_file.TorchReader().read(str(path)) as opened:
        tensors = len(opened.checkpoint.tensors)
    (budget,) = recorded.made
    return budget.limit - budget.left, budget.limit, tensors


def _corpus_torch_files() -> list[Path]:
    suffixes = (".pt", ".pth", ".bin", ".ckpt")
    files = sorted(p for p in GENERATED.rglob("*") if p.suffix in suffixes and p.is_file())
    from tieaudit.formats.torch_file import TorchReader

    reader = TorchReader()
    return [p for p in files if reader.sniff(str(p), p.read_bytes()[:64])]


def test_corpus_checkpoints_spend_a_small_part_of_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every torch file of the generated corpus (state dicts, training checkpoints with optimizer
    state, Lightning, DeepSpeed, a Trainer folder's optimizer.pt, scheduler.pt, rng_state.pth and
    training_args.bin) is read spending under a tenth of its budget."""
    files = _corpus_torch_files()
    assert len(files) >= 20 and any("optimizer.pt" in p.name for p in files)
    for path in files:
        spent, limit, _ = _spent(path, monkeypatch)
        assert spent < limit / 10, (path, spent, limit)


def test_a_training_checkpoint_of_many_tiny_tensors_stays_inside_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The densest real files: torch.save of a mixture-of-experts-like model of 12 000 two-element
    parameters with Adam state (48 000 tensors, each over its own storage record), the shape of a
    1 TB checkpoint's pickle at a thousandth of its size. What it spends per byte of file is what
    PICKLE_UNITS_PER_BYTE was sized from: it must stay well under the allowance."""
    from tieaudit.formats.pickle_budget import PICKLE_UNITS_PER_BYTE

    path = tmp_path / "moe.pt"
    script = (
        "import sys, torch\n"
        "n = 12000\n"
        "names = [f'model.layers.{i // 64}.mlp.experts.{i % 64}.down_proj.weight' for i in range(n)]\n"
        "model = {name: torch.zeros(2) for name in names}\n"
        "state = {i: {'step': torch.tensor(1.0), 'exp_avg': torch.zeros(2), 'exp_avg_sq': torch.zeros(2)}"
        " for i in range(n)}\n"
        "groups = [{'lr': 1e-3, 'betas': (0.9, 0.999), 'params': list(range(n))}]\n"
        "torch.save({'model': model, 'optimizer': {'state': state, 'param_groups': groups}}, sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=300)
    spent, limit, tensors = _spent(path, monkeypatch)
    assert tensors == 48_000
    per_byte = spent / path.stat().st_size
    assert per_byte < 0.75 * PICKLE_UNITS_PER_BYTE, per_byte
    assert spent < 0.75 * limit, (spent, limit)


# ------------------------------------------------------------------ MemoryError


def _out_of_memory(*args: object, **kwargs: object) -> object:
    raise MemoryError


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_a_memory_error_is_one_line_and_exit_2(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Wherever the audit runs out of memory: one line naming the input, exit 2, no traceback."""
    import tieaudit.audit
    import tieaudit.gate.tasks
    from tieaudit.cli.main import main

    monkeypatch.setattr(tieaudit.audit, "audit_path", _out_of_memory)
    monkeypatch.setattr(tieaudit.gate.tasks, "audit_path", _out_of_memory)
    path = str(GENERATED / "torch" / "tied_lm.pt")
    code = main([command, path])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: "), err
    assert "out of memory" in lines[0] and path in lines[0], lines[0]


def test_a_memory_error_under_an_address_space_cap_is_exit_2(tmp_path: Path) -> None:
    """The real thing: the in-budget fan-out read under an address space a little larger than the
    process has after its imports. Python raises MemoryError somewhere in the audit: exit 2, one line."""
    path = tmp_path / "fanout.pt"
    path.write_bytes(ATTACKS["shared_tensor_fanout_in_budget"].build())
    script = (
        "import resource, sys\n"
        "import tieaudit.cli.main, tieaudit.audit, tieaudit.report.json_report\n"
        "status = open('/proc/self/status').read().splitlines()\n"
        "size = next(int(line.split()[1]) for line in status if line.startswith('VmSize'))\n"
        "cap = (size << 10) + (96 << 20)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
        "sys.exit(tieaudit.cli.main.main(['inspect', sys.argv[1], '--format', 'json', '-o', sys.argv[2]]))\n"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "r.json")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "out of memory" in lines[0] and str(path) in lines[0], done.stderr
    assert not (tmp_path / "r.json").exists()
