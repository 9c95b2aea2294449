"""Many-checkpoint benchmark (issue 6): `tieaudit check FOLDER` over 200 small checkpoints,
--jobs 1 (in one process) against --jobs 2 (two worker processes).

The folder bench/out/many/ holds 100 safetensors and 100 torch.save files, each a small
GPT-shaped state dict (~1.3 MB); every fifth one stores lm_head.weight as an untied byte copy of
the embedding. Every timed run must exit 1 and report exactly those 40 checkpoints as failing.

Usage: python bench/many.py [--force] [--repeat 3] [--count 200]
The files are written by this script in a child process (`--generate DIR`), which imports torch;
the harness itself stays small (see common.run_measured).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from common import OUT_DIR, Measurement, console_script, format_table, machine_summary, python, run_measured

FOLDER = os.path.join(OUT_DIR, "many")
STAMP = FOLDER + ".recipe.json"
RECIPE_VERSION = 1
VOCAB, HIDDEN, LAYERS = 1000, 96, 2
COPY_EVERY = 5


def checkpoint_name(index: int) -> str:
    suffix = "safetensors" if index % 2 == 0 else "pt"
    kind = "copy" if index % COPY_EVERY == 0 else "clean"
    return f"{index:03d}-{kind}.{suffix}"


def generate(folder: str, count: int) -> None:
    """Child side: write count checkpoints into folder (torch for .pt, safetensors.torch otherwise)."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    for index in range(count):
        generator = torch.Generator().manual_seed(index)
        state = {"transformer.wte.weight": torch.randn(VOCAB, HIDDEN, generator=generator)}
        for layer in range(LAYERS):
            prefix = f"transformer.h.{layer}."
            state[prefix + "attn.c_attn.weight"] = torch.randn(HIDDEN, 3 * HIDDEN, generator=generator)
            state[prefix + "mlp.c_fc.weight"] = torch.randn(HIDDEN, 4 * HIDDEN, generator=generator)
            state[prefix + "ln_1.weight"] = torch.ones(HIDDEN)
        head = state["transformer.wte.weight"]
        state["lm_head.weight"] = (
            head.clone() if index % COPY_EVERY == 0 else torch.randn(VOCAB, HIDDEN, generator=generator)
        )
        path = os.path.join(folder, checkpoint_name(index))
        if path.endswith(".safetensors"):
            save_file(state, path)
        else:
            torch.save(state, path)


def ensure_folder(count: int, force: bool) -> bool:
    """(Re)build bench/out/many when its recipe changed; True when it was generated now."""
    recipe = {"version": RECIPE_VERSION, "count": count, "shape": [VOCAB, HIDDEN, LAYERS, COPY_EVERY]}
    expected = sorted(checkpoint_name(i) for i in range(count))
    if not force and os.path.exists(STAMP) and os.path.isdir(FOLDER):
        with open(STAMP) as handle:
            if json.load(handle) == recipe and sorted(os.listdir(FOLDER)) == expected:
                return False
    shutil.rmtree(FOLDER, ignore_errors=True)
    command = [python(), os.path.abspath(__file__), "--generate", FOLDER, "--count", str(count)]
    subprocess.run(command, check=True)
    with open(STAMP, "w") as handle:
        json.dump(recipe, handle)
    return True


def verify(report_path: str, count: int) -> str | None:
    """A problem with one run's JSON report, or None."""
    with open(report_path) as handle:
        document = json.load(handle)
    failing = sorted(os.path.basename(r["path"]) for r in document["reports"] if r["status"] == "fail")
    expected = sorted(checkpoint_name(i) for i in range(count) if i % COPY_EVERY == 0)
    if document["summary"]["checkpoints"] != count or document["errors"]:
        return f"expected {count} checkpoints and no errors, got {document['summary']}"
    if failing != expected:
        return f"failing checkpoints differ: {len(failing)} reported, {len(expected)} planted"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="regenerate the checkpoints even when cached")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--count", type=int, default=200, help="checkpoints to generate")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generate:
        generate(args.generate, args.count)
        return 0
    generated = ensure_folder(args.count, args.force)
    size = sum(os.path.getsize(os.path.join(FOLDER, n)) for n in os.listdir(FOLDER))
    print(
        f"folder: {os.path.relpath(FOLDER)} ({args.count} checkpoints, {size / 1e6:.1f} MB, "
        f"{'generated' if generated else 'cached'})"
    )
    print(f"machine: {machine_summary()}")
    labels = {1: "check --jobs 1", 2: "check --jobs 2"}
    measurements = {
        jobs: Measurement(
            label, [*console_script("tieaudit"), "check", FOLDER, "--jobs", str(jobs), "--format", "json"]
        )
        for jobs, label in labels.items()
    }
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "report.json")
        for _ in range(args.repeat):
            for measurement in measurements.values():  # round-robin: drift hits both alike
                run = run_measured(measurement.argv, stdout=report)
                measurement.runs.append(run)
                problem = None if run.returncode == 1 else f"exit {run.returncode}, expected 1"
                problem = problem or verify(report, args.count)
                if problem:
                    problems.append(f"{measurement.label}: {problem}")
    rows = [
        [m.label, f"{m.median_s:.2f}", f"{m.min_s:.2f}", f"{m.max_rss_bytes / 1e6:.0f}"]
        for m in measurements.values()
    ]
    print(format_table(["command", "median s", "min s", "peak RSS MB"], rows))
    ratio = measurements[1].median_s / measurements[2].median_s
    print(f"speedup --jobs 2 over --jobs 1: {ratio:.2f}x (medians of {args.repeat} rounds)")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
