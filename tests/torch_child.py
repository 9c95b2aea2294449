"""torch.load run in a child process over one-file folders, for the trust tests' marker proofs.

Each folder holds one file (and, once a payload ran, MARKER); the child loads it with or without
weights_only and answers, per folder, "loaded ..." (the keys, and w's values where there is one) or
the name of the exception torch raised. torch runs only in the child: the test process imports
neither it nor anything a payload could reach.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TORCH_LOAD = """
import json, os, sys, warnings
import torch
warnings.simplefilter("ignore")
outcome = {}
for folder in sys.argv[2:]:
    os.chdir(folder)
    (name,) = [n for n in os.listdir(".") if n != "MARKER"]
    try:
        loaded = torch.load(name, weights_only=sys.argv[1] == "1")
        outcome[folder] = "loaded " + repr(sorted(loaded)) if isinstance(loaded, dict) else "loaded"
        if isinstance(loaded, dict) and "w" in loaded:
            outcome[folder] += " " + repr(loaded["w"].tolist())
    except Exception as exc:
        outcome[folder] = type(exc).__name__
print(json.dumps(outcome))
"""


def torch_load(folders: list[Path], *, weights_only: bool) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", TORCH_LOAD, "1" if weights_only else "0", *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return outcome
