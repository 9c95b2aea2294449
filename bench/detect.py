"""Detector benchmark (issue 3): `tieaudit check` on a ~2 GB Llama-shaped bf16 checkpoint.

Compares, each as a separate process with wall time and peak RSS, median of N runs:
  cat FILE > /dev/null          the I/O floor (page cache warm)
  tieaudit check FILE           the detector under test (must report exactly one TIE001)
  sha512 of every tensor        what a hash-everything dedup does (optimum remove_duplicate_weights)
  torch.equal per shape bucket  the naive exact approach: every pair inside each (dtype, shape) bucket

Usage: python bench/detect.py [--force] [--repeat 3] [--strict] [--keep-going]
Exit 0 (it is a report) unless --strict and a target FAILs or the finding is wrong.
The baselines are this same file run as `detect.py --baseline sha512|torch-equal FILE`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import cast

from common import (
    MIB,
    OUT_DIR,
    Measurement,
    cached_safetensors,
    console_script,
    format_table,
    llama_specs,
    machine_summary,
    python,
    read_safetensors_header,
    run_measured,
    sample_rss,
)

FILE_NAME = "llama-bf16-2gb.safetensors"
EMBED = "model.embed_tokens.weight"
HEAD = "lm_head.weight"

IO_FACTOR, IO_SLACK_S = 2.0, 0.5
SHA_SPEEDUP_TARGET = 10.0
RSS_PERCENT_TARGET = 25.0


# --------------------------------------------------------------------------- baselines (child side)


def _groups_from_pairs(pairs: list[tuple[str, str]]) -> list[list[str]]:
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for first, second in pairs:
        parent[find(second)] = find(first)
    groups: dict[str, list[str]] = defaultdict(list)
    for name in parent:
        groups[find(name)].append(name)
    return sorted(groups.values(), key=lambda g: (-len(g), g))


def baseline_sha512(path: str) -> dict[str, object]:
    """sha512 of every tensor's bytes (memory-mapped with numpy at the header offsets), grouped."""
    import hashlib

    import numpy as np

    data_start, header = read_safetensors_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    by_digest: dict[bytes, list[str]] = defaultdict(list)
    for name, info in header.items():
        begin, end = cast("tuple[int, int]", info["data_offsets"])
        by_digest[hashlib.sha512(mapped[data_start + begin : data_start + end].data).digest()].append(name)
    groups = sorted((g for g in by_digest.values() if len(g) > 1), key=lambda g: (-len(g), g))
    return {"baseline": "sha512", "tensors": len(header), "duplicate_groups": groups}


def baseline_torch_equal(path: str) -> dict[str, object]:
    """torch.equal on every pair inside each (dtype, shape) bucket, one bucket in memory at a time."""
    import torch
    from safetensors import safe_open

    compared = 0
    pairs: list[tuple[str, str]] = []
    with safe_open(path, framework="pt") as handle:
        buckets: dict[tuple[str, tuple[int, ...]], list[str]] = defaultdict(list)
        for name in handle.keys():
            view = handle.get_slice(name)
            buckets[(view.get_dtype(), tuple(view.get_shape()))].append(name)
        for names in buckets.values():
            if len(names) < 2:
                continue
            tensors = [handle.get_tensor(name) for name in names]
            for i in range(len(tensors)):
                for j in range(i + 1, len(tensors)):
                    compared += 1
                    if torch.equal(tensors[i], tensors[j]):
                        pairs.append((names[i], names[j]))
            del tensors
    return {
        "baseline": "torch-equal",
        "pairs_compared": compared,
        "equal_pairs": len(pairs),
        "duplicate_groups": _groups_from_pairs(pairs),
    }


BASELINES = {"sha512": baseline_sha512, "torch-equal": baseline_torch_equal}


# --------------------------------------------------------------------------- checks of the outputs


def verify_check_report(
    report_path: str,
    returncode: int,
    wasted: int,
    *,
    names: tuple[str, str] = (EMBED, HEAD),
    relation: str = "equal",
) -> list[str]:
    """Problems with one `tieaudit check` run; empty when it found exactly the planted copy of names."""
    problems = []
    if returncode != 1:
        problems.append(f"tieaudit check exited {returncode}, expected 1 (findings)")
    try:
        with open(report_path) as handle:
            report = json.load(handle)
    except (OSError, ValueError) as exc:
        return [*problems, f"no readable JSON report at {report_path}: {exc}"]
    findings = report.get("findings", [])
    if len(findings) != 1:
        summary = [(f.get("rule"), f.get("names")) for f in findings[:5]]
        return [*problems, f"expected exactly 1 finding, got {len(findings)}: {summary}"]
    finding = findings[0]
    expected = {"rule": "TIE001", "kind": "untied-copy", "relation": relation, "wasted_bytes": wasted}
    for key, value in expected.items():
        if finding.get(key) != value:
            problems.append(f"finding {key} is {finding.get(key)!r}, expected {value!r}")
    if sorted(finding.get("names", [])) != sorted(names):
        problems.append(f"finding names are {finding.get('names')}, expected {list(names)}")
    return problems


def verify_baseline(output_path: str, label: str) -> tuple[list[str], str]:
    """(problems, note): the baseline must also have found the embedding/lm_head copy."""
    try:
        with open(output_path) as handle:
            result = json.load(handle)
    except (OSError, ValueError) as exc:
        return [f"{label}: no readable result ({exc})"], ""
    groups = result.get("duplicate_groups", [])
    problems = [] if sorted([EMBED, HEAD]) in [sorted(g) for g in groups] else [f"{label}: missed {HEAD}"]
    others = [g for g in groups if sorted(g) != sorted([EMBED, HEAD])]
    false_names = sum(len(g) for g in others)
    note = f"{label}: {len(groups)} duplicate groups; {false_names} names in groups besides the planted copy"
    if "pairs_compared" in result:
        note += f"; {result['pairs_compared']} pairs compared, {result['equal_pairs']} equal"
    return problems, note


# --------------------------------------------------------------------------- driver


def measure_all(
    path: str, repeat: int, keep_going: bool
) -> tuple[dict[str, Measurement], list[str], list[str]]:
    """Round-robin the commands `repeat` times (so slow drift hits all alike); verify every output."""
    check_json = os.path.join(OUT_DIR, "check.json")
    outputs = {name: os.path.join(OUT_DIR, f"baseline-{name}.json") for name in BASELINES}
    script = os.path.abspath(__file__)
    commands = {
        "cat FILE > /dev/null": ["cat", path],
        "tieaudit check FILE --format json": [
            *console_script("tieaudit"),
            "check",
            path,
            "--format",
            "json",
            "-o",
            check_json,
        ],
        "sha512 every tensor (hash-all)": [python(), script, "--baseline", "sha512", path],
        "torch.equal pairs per bucket": [python(), script, "--baseline", "torch-equal", path],
    }
    stdout_of = {
        "sha512 every tensor (hash-all)": outputs["sha512"],
        "torch.equal pairs per bucket": outputs["torch-equal"],
    }
    results = {label: Measurement(label, argv) for label, argv in commands.items()}
    problems: list[str] = []
    notes: list[str] = []
    wasted = 2 * 32000 * 2048  # lm_head bytes, bf16
    for round_no in range(1, repeat + 1):
        for label, argv in commands.items():
            if label.startswith("tieaudit") and os.path.exists(check_json):
                os.unlink(check_json)
            run = run_measured(argv, stdout=stdout_of.get(label))
            results[label].runs.append(run)
            print(
                f"  round {round_no}/{repeat}  {label:<36} {run.wall_s:7.3f} s  "
                f"{run.max_rss_bytes / MIB:8.1f} MiB  exit {run.returncode}",
                file=sys.stderr,
                flush=True,
            )
            if label.startswith("tieaudit"):
                found = verify_check_report(check_json, run.returncode, wasted)
                problems += [f"round {round_no}: {p}" for p in found]
            elif label in stdout_of:
                if run.returncode != 0:
                    problems.append(f"round {round_no}: {label} exited {run.returncode}")
                found, note = verify_baseline(stdout_of[label], label)
                problems += [f"round {round_no}: {p}" for p in found]
                if round_no == 1:
                    notes.append(note)
            elif run.returncode != 0:
                problems.append(f"round {round_no}: {label} exited {run.returncode}")
        if problems and not keep_going:
            break
    return results, problems, notes


def report(results: dict[str, Measurement], size: int, problems: list[str]) -> tuple[str, bool]:
    """The table and the targets; second value True when everything passed."""
    rows = [
        [
            m.label,
            f"{m.median_s:.3f}",
            f"{m.min_s:.3f}",
            f"{m.max_rss_bytes / MIB:.1f}",
            f"{100 * m.max_rss_bytes / size:.1f}%",
            str(len(m.runs)),
        ]
        for m in results.values()
    ]
    table = format_table(["command", "median s", "min s", "peak RSS MiB", "RSS/file", "runs"], rows)

    cat, tie, sha, teq = results.values()
    budget = IO_FACTOR * cat.median_s + IO_SLACK_S
    rss_percent = 100 * tie.max_rss_bytes / size
    targets = [
        (
            f"check median <= {IO_FACTOR:g} x cat + {IO_SLACK_S:g} s",
            f"{tie.median_s:.3f} s vs budget {budget:.3f} s ({tie.median_s / budget:.2f} of budget)",
            tie.median_s <= budget,
        ),
        (
            f"speedup vs sha512 >= {SHA_SPEEDUP_TARGET:g}x",
            f"{sha.median_s / tie.median_s:.2f}x ({sha.median_s:.3f} / {tie.median_s:.3f} s)",
            sha.median_s / tie.median_s >= SHA_SPEEDUP_TARGET,
        ),
        (
            "speedup vs torch.equal (no target)",
            f"{teq.median_s / tie.median_s:.2f}x ({teq.median_s:.3f} / {tie.median_s:.3f} s)",
            None,
        ),
        (
            f"check peak RSS <= {RSS_PERCENT_TARGET:g}% of file",
            f"{rss_percent:.1f}% ({tie.max_rss_bytes / MIB:.1f} MiB of {size / MIB:.1f} MiB)",
            rss_percent <= RSS_PERCENT_TARGET,
        ),
        (
            "check finds exactly TIE001 embed/lm_head",
            "verified every run" if not problems else f"{len(problems)} problem(s), see errors",
            not problems,
        ),
    ]
    lines = [
        format_table(
            ["target", "measured", "result"],
            [
                [name, value, "info" if ok is None else "PASS" if ok else "FAIL"]
                for name, value, ok in targets
            ],
        )
    ]
    return table + "\n\n" + "\n".join(lines), all(ok is not False for _, _, ok in targets)


def rss_breakdown(argv: list[str]) -> dict[str, int]:
    """One more tieaudit run, polled: private memory versus mapped page cache in its peak RSS."""
    peaks = sample_rss(argv)
    print(
        "diagnostic: tieaudit check polled peaks: "
        + ", ".join(
            f"{key} {peaks[key] / MIB:.0f} MiB" for key in ("VmHWM", "RssAnon", "RssFile", "RssShmem")
        )
        + " (RssFile = page-cache pages of the mmap'd checkpoint, which ru_maxrss counts too)"
    )
    return peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="regenerate the checkpoint even when cached")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median reported)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target FAILs")
    parser.add_argument("--keep-going", action="store_true", help="finish all rounds despite a wrong finding")
    parser.add_argument("--layers", type=int, default=17, help="decoder layers (17 gives ~2.0 GB)")
    parser.add_argument("--baseline", choices=sorted(BASELINES), help=argparse.SUPPRESS)
    parser.add_argument("file", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.baseline:  # child process: run one baseline, print its result as JSON
        print(json.dumps(BASELINES[args.baseline](args.file)))
        return 0
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, FILE_NAME)
    specs = llama_specs(layers=args.layers)
    start = time.perf_counter()
    size, generated = cached_safetensors(path, specs, force=args.force)
    elapsed = time.perf_counter() - start
    action = f"generated in {elapsed:.1f} s" if generated else "cached (use --force to rebuild)"
    print(f"checkpoint: {os.path.relpath(path)} ({action})")
    print(
        f"  {size} bytes = {size / 1e9:.3f} GB = {size / (1 << 30):.3f} GiB; {len(specs)} bf16 tensors, "
        f"{args.layers} layers; {HEAD} is an untied byte copy of {EMBED}"
    )
    print(f"machine: {machine_summary()}")

    run_measured(["cat", path])  # warm the page cache: every timed run reads from memory
    print(f"page cache warmed; {args.repeat} round(s) of 4 commands, round-robin:", flush=True)
    results, problems, notes = measure_all(path, args.repeat, args.keep_going)
    text, passed = report(results, size, problems)
    print()
    print(text)
    for note in notes:
        print(f"note: {note}")
    rss = rss_breakdown(results["tieaudit check FILE --format json"].argv)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)

    summary = {
        "tieaudit_rss_breakdown": rss,
        "file": path,
        "file_bytes": size,
        "machine": machine_summary(),
        "measurements": [m.as_dict() for m in results.values()],
        "problems": problems,
        "passed": passed,
    }
    with open(os.path.join(OUT_DIR, "detect-results.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    print(
        f"\n{'all targets PASS' if passed else 'some targets FAIL'}; "
        f"results in {os.path.relpath(os.path.join(OUT_DIR, 'detect-results.json'))}"
    )
    return 1 if args.strict and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
