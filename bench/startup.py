"""Start-up and small files (issue 25): what one call costs before and beside the work.

Each row is the median wall time of --repeat runs of a fresh process, printed beside the floor it is
held to, measured in the same run (so a busy machine moves both): ``python -c pass``, ``import
click``, ``import numpy``, ``onnx.load`` of the same model, ``safe_open`` of the same file. Rows:
``--version``; ``check`` of a 1 MB safetensors, ONNX, GGUF and .pt file; 100 small files in one call
and in 100 calls (a pre-commit hook); the onnx package's own backend test models in one call.

Targets (issue 25): ``--version`` <= ``import click`` + 0.05 s; ``check`` of a 1 MB safetensors file
<= ``import numpy`` + 0.15 s, of a 1 MB ONNX file <= ``import numpy`` + 0.20 s. ``--strict`` exits 1
when one is missed. Inputs are generated under bench/out/startup/ (kept between runs).

    .venv/bin/python bench/startup.py [--repeat 5] [--quick] [--strict]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import OUT_DIR, console_script, format_table, machine_summary, python, run_measured

STARTUP_DIR = os.path.join(OUT_DIR, "startup")
SMALL_FILES = 100
"""Files in the many-small-files rows (a pre-commit hook over a repository's checkpoints)."""


@dataclass(frozen=True)
class Target:
    """A row held to floor + slack seconds."""

    row: str
    floor: str
    slack: float


TARGETS = (
    Target("tieaudit --version", "python -c 'import click'", 0.05),
    Target("check 1 MB safetensors", "python -c 'import numpy'", 0.15),
    Target("check 1 MB onnx", "python -c 'import numpy'", 0.20),
)


def build_inputs(folder: str, small_files: int) -> dict[str, str]:
    """The inputs, generated in a child process (the harness imports neither numpy nor torch)."""
    os.makedirs(folder, exist_ok=True)
    script = f"""
import os, numpy as np, onnx, torch, gguf
from onnx import helper, numpy_helper, TensorProto
from safetensors.numpy import save_file
folder, count = {folder!r}, {small_files}
weights = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)  # 1 MiB
save_file({{"w": weights}}, os.path.join(folder, "small.safetensors"))
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])],
    [numpy_helper.from_array(weights, "w")],
)
onnx.save(helper.make_model(graph), os.path.join(folder, "small.onnx"))
torch.save({{"w": torch.from_numpy(weights)}}, os.path.join(folder, "small.pt"))
writer = gguf.GGUFWriter(os.path.join(folder, "small.gguf"), "gpt2")
writer.add_tensor("token_embd.weight", weights)
writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
many = os.path.join(folder, "many")
os.makedirs(many, exist_ok=True)
for i in range(count):
    save_file({{"w": weights[:16] + i}}, os.path.join(many, f"f{{i:03d}}.safetensors"))
"""
    subprocess.run([python(), "-c", script], check=True)
    names = ("small.safetensors", "small.onnx", "small.pt", "small.gguf", "many")
    return {name: os.path.join(folder, name) for name in names}


def backend_models() -> str | None:
    """The onnx package's backend test data folder (~150 real small models), if installed."""
    probe = "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))"
    found = subprocess.run(
        [python(), "-c", probe], capture_output=True, text=True, check=False
    ).stdout.strip()
    return found if found and os.path.isdir(found) else None


CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""Children may write bytecode caches, as an installed package has them: a shell that sets
PYTHONDONTWRITEBYTECODE would otherwise time the compiling of every module on every call."""


def median_wall(argv: Sequence[str], repeat: int) -> float:
    run_measured(argv, env=CHILD_ENV)  # warm-up: bytecode caches written, files in the page cache
    return statistics.median(run_measured(argv, env=CHILD_ENV).wall_s for _ in range(repeat))


def rows(inputs: dict[str, str], repeat: int, *, backend: str | None) -> dict[str, float]:
    """Every row's median wall time, floors first."""
    py, tie = python(), console_script("tieaudit")
    safetensors, onnx_file = inputs["small.safetensors"], inputs["small.onnx"]
    files = sorted(os.path.join(inputs["many"], f) for f in os.listdir(inputs["many"]))
    measured: dict[str, Callable[[], float]] = {
        "python -c pass": lambda: median_wall([py, "-c", "pass"], repeat),
        "python -c 'import click'": lambda: median_wall([py, "-c", "import click"], repeat),
        "python -c 'import numpy'": lambda: median_wall([py, "-c", "import numpy"], repeat),
        "onnx.load of the 1 MB onnx": lambda: median_wall(
            [py, "-c", f"import onnx; onnx.load({onnx_file!r})"], repeat
        ),
        "safe_open of the 1 MB safetensors": lambda: median_wall(
            [py, "-c", f"from safetensors import safe_open; safe_open({safetensors!r}, 'np').keys()"], repeat
        ),
        "tieaudit --version": lambda: median_wall([*tie, "--version"], repeat),
        "check 1 MB safetensors": lambda: median_wall([*tie, "check", safetensors], repeat),
        "check 1 MB onnx": lambda: median_wall([*tie, "check", onnx_file], repeat),
        "check 1 MB gguf": lambda: median_wall([*tie, "check", inputs["small.gguf"]], repeat),
        "check 1 MB .pt": lambda: median_wall([*tie, "check", inputs["small.pt"]], repeat),
        f"check {len(files)} small files, one call": lambda: median_wall(
            [*tie, "check", "--jobs", "1", *files], repeat
        ),
        f"check {len(files)} small files, {len(files)} calls": lambda: sum(
            run_measured([*tie, "check", f], env=CHILD_ENV).wall_s for f in files
        ),
    }
    if backend is not None:
        measured["check onnx backend test models, one call"] = lambda: median_wall(
            [*tie, "check", "--jobs", "1", backend], 1
        )
    return {name: run() for name, run in measured.items()}


def judge(times: dict[str, float]) -> tuple[list[list[str]], list[str]]:
    """Each target's table row (row, wall, limit, what the limit is, ok or MISSED) and the rows missed."""
    table, missed = [], []
    for target in TARGETS:
        limit = times[target.floor] + target.slack
        ok = times[target.row] <= limit
        missed += [] if ok else [target.row]
        verdict = "ok" if ok else "MISSED"
        table.append(
            [
                target.row,
                f"{times[target.row]:.3f}",
                f"{limit:.3f}",
                f"{target.floor} + {target.slack}",
                verdict,
            ]
        )
    return table, missed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per row (median reported)")
    parser.add_argument(
        "--quick", action="store_true", help="10 small files, no backend models (a smoke run)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    inputs = build_inputs(
        os.path.join(STARTUP_DIR, "quick" if args.quick else "full"), 10 if args.quick else SMALL_FILES
    )
    times = rows(inputs, max(1, args.repeat), backend=None if args.quick else backend_models())
    print(machine_summary())
    print(format_table(["row", "wall s"], [[name, f"{wall:.3f}"] for name, wall in times.items()]))
    table, missed = judge(times)
    print()
    print(format_table(["target", "wall s", "limit s", "limit is", "verdict"], table))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
