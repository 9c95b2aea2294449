"""Scale benchmark (issue 16): tieaudit check and retie on checkpoints of the sizes users run.

Inputs (generated, nothing downloaded; see bench/scale_inputs.py), two sizes per form:
  folder    Llama-8B-shaped Hugging Face folder, 10.8 GB / 5.6 GB, lm_head an untied copy
  sparse    Llama-70B-shaped folder as sparse files, 723 / 363 tensors in 30 / 15 shards
  onnx      GPT-2-like ONNX with embedded weights, 1.9 GB / 0.5 GB (lm_head an equal copy), and
            1.9 GB with lm_head stored transposed (TorchScript export)
  onnx-ext  GPT-2-like ONNX with external data, 6 GB / 2.6 GB (past a protobuf's 2 GB)
  count     safetensors with 10,000 / 1,000 tensors, the same total bytes

Each command runs as its own process (wall time and peak RSS, median of the runs), cold (page
cache dropped before every run, where this machine allows it) and warm (files read first):
  cat every file, sha512 of every tensor, onnx.load (ONNX), tieaudit check (exactly the planted
  TIE001 pair, or no finding for the sparse form); a sparse folder is never read in full: its
  floor is reading every shard's header. On the folders, cold: tieaudit retie IN OUT against
  cp -r IN OUT && sync.

Usage: python bench/scale.py [--small] [--only FORM ...] [--repeat 3] [--cold-repeat 1]
                             [--force] [--keep] [--strict]
Exit 0 (a report) unless --strict and a target FAILs or a check run found something else.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from common import MIB, OUT_DIR, Measurement, console_script, machine_summary, python, run_measured
from common import warm_page_cache as read_once
from detect import verify_check_report
from scale_inputs import FORMS, SCALE_DIR, Input, plan
from scale_report import report

DROP_CACHES = "/proc/sys/vm/drop_caches"
INPUTS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale_inputs.py")
CHECK_REPORT = os.path.join(SCALE_DIR, "check-report.json")
BASELINE_OUT = os.path.join(SCALE_DIR, "sha512.json")


def cold_support() -> tuple[bool, str]:
    """(possible, what the report says): dropping the page cache is tried once, for real."""
    try:
        drop_caches()
    except OSError as exc:
        return False, f"cold: not possible here ({DROP_CACHES}: {exc.strerror or exc}), runs are warm"
    return True, "cold: page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before every cold run"


def drop_caches() -> None:
    os.sync()
    with open(DROP_CACHES, "w") as handle:
        handle.write("3\n")


@dataclass
class Command:
    label: str
    argv: list[str]
    stdout: str | None = None


def commands(inp: Input) -> list[Command]:
    """The timed commands of one input; the first is the reference the ratios divide by."""
    check = [*console_script("tieaudit"), "check", inp.path, "--format", "json", "-o", CHECK_REPORT]
    if inp.sparse:  # reading it whole reads the holes: the floor is its headers
        return [
            Command("read every header", [python(), INPUTS_SCRIPT, "--headers", inp.path]),
            Command("tieaudit check", check),
        ]
    listed = [
        Command("cat", ["cat", *inp.files]),
        Command("sha512 every tensor", [python(), INPUTS_SCRIPT, "--sha512", inp.path], BASELINE_OUT),
    ]
    if inp.is_onnx:
        listed.append(
            Command("onnx.load", [python(), "-c", "import onnx, sys; onnx.load(sys.argv[1])", inp.path])
        )
    return [*listed, Command("tieaudit check", check)]


def _names(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def verify(inp: Input, command: Command, returncode: int) -> list[str]:
    """Problems with one run's output: check's finding, the baseline's groups, an exit code."""
    if command.label == "tieaudit check":
        if inp.expected is not None:
            return verify_check_report(
                CHECK_REPORT, returncode, inp.wasted, names=inp.expected, relation=inp.relation
            )
        problems = [] if returncode == 0 else [f"tieaudit check exited {returncode}, expected 0"]
        try:
            with open(CHECK_REPORT) as handle:
                findings = json.load(handle).get("findings", [])
        except (OSError, ValueError) as exc:
            return [*problems, f"no readable JSON report: {exc}"]
        return problems + [
            f"unexpected finding {f.get('rule')} {_names(f.get('names', []))}" for f in findings[:3]
        ]
    if returncode != 0:
        return [f"{command.label} exited {returncode}"]
    if command.stdout and inp.expected is not None:
        with open(command.stdout) as handle:
            groups = [sorted(g) for g in json.load(handle)["duplicate_groups"]]
        found = sorted(inp.expected) in groups
        if inp.relation == "equal" and not found:
            return [f"{command.label} missed the planted copy {list(inp.expected)}"]
        if inp.relation != "equal" and found:  # a hash of bytes cannot see a transposed copy
            return [f"{command.label} grouped the {inp.relation} pair {list(inp.expected)} as equal bytes"]
    return []


def _remove(*paths: str) -> None:
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


def measure(inp: Input, mode: str, repeat: int) -> tuple[dict[str, Measurement], list[str]]:
    """Round-robin the input's commands repeat times, cold (caches dropped) or warm."""
    listed = commands(inp)
    if mode == "warm":
        if inp.sparse:  # untimed runs bring its headers and samples in
            for command in listed:
                run_measured(command.argv, stdout=command.stdout)
        else:
            for path in inp.files:
                read_once(path)
    results = {c.label: Measurement(f"{mode} {c.label}", c.argv) for c in listed}
    problems: list[str] = []
    for round_no in range(1, repeat + 1):
        for command in listed:
            _remove(CHECK_REPORT)
            if mode == "cold":
                drop_caches()
            run = run_measured(command.argv, stdout=command.stdout)
            results[command.label].runs.append(run)
            found = verify(inp, command, run.returncode)
            problems += [f"{inp.key} {mode} round {round_no}: {p}" for p in found]
            print(
                f"  {inp.key} {mode} {round_no}/{repeat}  {command.label:<20} {run.wall_s:8.3f} s "
                f"{run.max_rss_bytes / MIB:8.1f} MiB  exit {run.returncode}",
                file=sys.stderr,
                flush=True,
            )
    return results, problems


def retie_output_problems(out: str) -> list[str]:
    """The retied folder must drop lm_head and declare the tie (config), as from_pretrained needs."""
    try:
        with open(os.path.join(out, "model.safetensors.index.json")) as handle:
            weight_map = json.load(handle)["weight_map"]
        with open(os.path.join(out, "config.json")) as handle:
            tied = json.load(handle).get("tie_word_embeddings")
    except (OSError, ValueError, KeyError) as exc:
        return [f"retie output unreadable: {exc}"]
    problems = ["retie kept lm_head.weight"] if "lm_head.weight" in weight_map else []
    return problems + ([] if tied is True else [f"retie output tie_word_embeddings is {tied!r}"])


def measure_retie(
    inp: Input, repeat: int, cold: bool, keep: bool
) -> tuple[dict[str, Measurement], list[str]]:
    """tieaudit retie IN OUT against cp -r IN OUT && sync, each from a dropped cache, outputs removed."""
    out, copy = os.path.join(SCALE_DIR, "retie-out"), os.path.join(SCALE_DIR, "cp-out")
    listed = [
        Command("cp -r + sync", ["sh", "-c", 'cp -r "$0" "$1" && sync', inp.path, copy]),
        Command("tieaudit retie", [*console_script("tieaudit"), "retie", inp.path, out]),
    ]
    mode = "cold" if cold else "warm"
    results = {c.label: Measurement(f"{mode} {c.label}", c.argv) for c in listed}
    problems: list[str] = []
    for round_no in range(1, repeat + 1):
        for command in listed:
            _remove(out, copy)  # at most the input and one output on disk
            if cold:
                drop_caches()
            else:
                os.sync()
            run = run_measured(command.argv)
            results[command.label].runs.append(run)
            where = f"{inp.key} retie round {round_no}"
            if run.returncode != 0:
                problems.append(f"{where}: {command.label} exited {run.returncode}")
            elif command.label == "tieaudit retie":
                problems += [f"{where}: {p}" for p in retie_output_problems(out)]
            print(
                f"  {inp.key} {mode} {round_no}/{repeat}  {command.label:<20} {run.wall_s:8.3f} s "
                f"{run.max_rss_bytes / MIB:8.1f} MiB  exit {run.returncode}",
                file=sys.stderr,
                flush=True,
            )
    if not keep:
        _remove(out, copy)
    return results, problems


def generate(inputs: list[Input], small: bool, force: bool) -> None:
    """Generate (or reuse) every input in a child process: this harness never imports numpy."""
    argv = [python(), INPUTS_SCRIPT, "--ensure", *(i.key for i in inputs)]
    argv += ["--small"] * small + ["--force"] * force
    start = time.perf_counter()
    lines = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
    built = [json.loads(line)["key"] for line in lines if json.loads(line)["generated"]]
    action = f"generated {', '.join(built)} in {time.perf_counter() - start:.1f} s" if built else "all cached"
    print(f"inputs under {os.path.relpath(SCALE_DIR)}: {action} (--force rebuilds)")


def describe(inp: Input) -> str:
    apparent = sum(os.path.getsize(f) for f in inp.files)
    on_disk = sum(os.stat(f).st_blocks * 512 for f in inp.files)
    sparse = f", {on_disk / 1e6:.1f} MB on disk (sparse)" if inp.sparse else ""
    expected = (
        f"expects TIE001 {inp.expected[0]} / {inp.expected[1]}" if inp.expected else "expects no finding"
    )
    return (
        f"  {inp.key}: {inp.form}, {apparent / 1e9:.3f} GB{sparse}, {inp.tensors} tensors, "
        f"{len(inp.files)} file(s); {expected}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small", action="store_true", help="scaled-down inputs (bytes / ~16), for development"
    )
    parser.add_argument("--only", nargs="+", choices=FORMS, metavar="FORM", help=f"only these forms: {FORMS}")
    parser.add_argument("--repeat", type=int, default=3, help="warm runs per command (median reported)")
    parser.add_argument("--cold-repeat", type=int, default=1, help="cold runs per command")
    parser.add_argument("--force", action="store_true", help="regenerate the inputs even when cached")
    parser.add_argument("--keep", action="store_true", help="keep the last retie and cp outputs")
    parser.add_argument("--no-retie", action="store_true", help="skip the retie and cp runs")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target FAILs")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.cold_repeat < 1:
        parser.error("--repeat and --cold-repeat must be at least 1")

    forms = args.only or list(FORMS)
    inputs = [i for i in plan(args.small) if i.form in forms]
    os.makedirs(SCALE_DIR, exist_ok=True)
    print(f"machine: {machine_summary()}")
    generate(inputs, args.small, args.force)
    for inp in inputs:
        print(describe(inp))
    cold, cold_line = cold_support()
    print(cold_line, flush=True)

    results: dict[str, dict[str, Measurement]] = {}
    problems: list[str] = []
    for inp in inputs:
        results[inp.key] = {}
        for mode, repeat in (("cold", args.cold_repeat), ("warm", args.repeat)):
            if mode == "cold" and not cold:
                continue
            measured, found = measure(inp, mode, repeat)
            results[inp.key].update({m.label: m for m in measured.values()})
            problems += found
        if inp.form == "folder" and not args.no_retie:
            measured, found = measure_retie(inp, args.cold_repeat, cold, args.keep)
            results[inp.key].update({m.label: m for m in measured.values()})
            problems += found
    _remove(CHECK_REPORT, BASELINE_OUT)

    text, passed = report(inputs, results, problems, small=args.small, cold=cold)
    print()
    print(text)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    name = "scale-small-results.json" if args.small else "scale-results.json"
    summary = {
        "machine": machine_summary(),
        "cold": cold_line,
        "inputs": {
            i.key: {"form": i.form, "path": i.path, "bytes": sum(map(os.path.getsize, i.files))}
            for i in inputs
        },
        "measurements": {key: [m.as_dict() for m in ms.values()] for key, ms in results.items()},
        "problems": problems,
        "passed": passed,
    }
    with open(os.path.join(OUT_DIR, name), "w") as handle:
        json.dump(summary, handle, indent=2)
    print(f"\n{'all targets PASS' if passed else 'some targets FAIL'}; results in bench/out/{name}")
    return 1 if args.strict and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
