"""What each command imports before it answers (issue 25): ``--version``, ``--help`` and usage errors
import neither numpy nor the gate nor a format reader, and auditing safetensors, torch and GGUF files
imports neither onnx nor ml_dtypes nor torch. Each case runs in a fresh interpreter and reports
``sys.modules``, so a later import at module level cannot bring them back silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

PROBE = """
import json, sys
from tieaudit.cli.launch import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""

PARSING_ONLY = (
    "numpy",
    "rich",
    "tieaudit.formats",
    "tieaudit.gate.discover",
    "tieaudit.gate.check",
    "tieaudit.audit",
)
"""Nothing answering from the command line alone needs these."""
NEVER_FOR_AUDIT = ("onnx", "ml_dtypes", "torch", "transformers")
"""An audit of a safetensors, torch or GGUF file needs none of these."""


def imported(args: list[str], cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("MODULES ")]
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["check", "--help"],
        ["retie", "--help"],
        ["check", "--fail-on", "bogus", "x"],
    ],
)
def test_answers_from_the_command_line_import_no_audit_machinery(args: list[str], tmp_path: Path) -> None:
    loaded = imported(args, tmp_path)
    assert not loaded & set(PARSING_ONLY), sorted(loaded & set(PARSING_ONLY))


def test_audits_of_safetensors_torch_and_gguf_files_import_no_onnx_ml_dtypes_or_torch(tmp_path: Path) -> None:
    import gguf
    import torch

    save_file({"a": np.zeros((64, 64), np.float32)}, str(tmp_path / "m.safetensors"))
    torch.save({"a": torch.zeros(8, 8)}, tmp_path / "m.pt")
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for name in ("m.safetensors", "m.pt", "m.gguf"):
        for command in ("check", "inspect"):
            loaded = imported([command, name], tmp_path)
            assert "tieaudit.formats" in loaded  # the probe really audited
            assert not loaded & set(NEVER_FOR_AUDIT), (command, name, sorted(loaded & set(NEVER_FOR_AUDIT)))
