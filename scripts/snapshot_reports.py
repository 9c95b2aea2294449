"""Every report tieaudit writes for the fixture corpus, one file per (input, command, format).

Run before and after a change that must not alter output, on the same fixture files, then diff:
    git worktree add --detach /tmp/old BASE
    PYTHONPATH=/tmp/old python scripts/snapshot_reports.py /tmp/before   # the old code
    python scripts/snapshot_reports.py /tmp/after
    diff -r /tmp/before /tmp/after
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ("fixtures/generated", "fixtures/hostile", "fixtures/malformed")
RUNS = (
    ("inspect", "json"),
    ("check", "json"),
    ("check", "sarif"),
    ("inspect", "text"),
    ("inspect", "dot"),
    ("check", "text"),
)
"""The machine formats (the contract) first; SNAPSHOT_MACHINE_ONLY=1 runs only those three."""


def inputs() -> list[Path]:
    """Each file of the corpus, and each folder holding a config.json (a model folder)."""
    found: list[Path] = []
    for top in CORPUS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in {".safetensors", ".pt", ".bin", ".onnx", ".pth", ".ckpt"}:
                found.append(path)
            elif path.is_dir() and (path / "config.json").exists():
                found.append(path)
    return found


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    runs = RUNS[:3] if os.environ.get("SNAPSHOT_MACHINE_ONLY") else RUNS
    for path in inputs():
        rel = path.relative_to(ROOT)
        stem = hashlib.sha256(str(rel).encode()).hexdigest()[:12]
        for command, fmt in runs:
            done = subprocess.run(
                [sys.executable, "-m", "tieaudit", command, str(rel), "--format", fmt],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )
            text = (
                f"# {rel} {command} {fmt}\n# exit {done.returncode}\n"
                f"{done.stdout}\n# stderr\n{done.stderr}"
            )
            (out / f"{stem}-{command}-{fmt}.txt").write_text(text)
    print(f"{len(inputs())} inputs x {len(runs)} runs -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
