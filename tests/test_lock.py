"""constraints.txt pins the test environment to the releases the committed generated data was made from.

The tie table and names (transformers), the ONNX schema (onnx) and the weights_only allowlist (torch) are
data generated from a library and committed; their tests compare them with the installed library. Without
a pin, a new release on the index fails CI on a commit that changed nothing (transformers 5.25.0 did).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tieaudit.formats.onnx_descriptor import ONNX_VERSION

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tieaudit" / "formats"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"constraints.txt:{number}: not an exact pin: {line!r}"
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        assert name not in found, f"constraints.txt:{number}: {name} pinned twice"
        found[name] = match.group(2)
    return found


def test_every_line_is_an_exact_pin_and_the_project_is_not_pinned() -> None:
    found = pins()
    assert "tieaudit" not in found
    assert {"transformers", "onnx", "torch", "safetensors", "numpy", "pytest"} <= set(found)


def test_generated_data_is_from_the_pinned_releases() -> None:
    found = pins()
    table = json.loads((DATA / "tie_table.json").read_text())
    names = json.loads((DATA / "tie_names.json").read_text())
    allowlist = json.loads((DATA / "torch_allowlist.json").read_text())
    assert table["transformers"] == names["transformers"] == found["transformers"]
    assert ONNX_VERSION == found["onnx"]
    assert allowlist["torch"] == found["torch"]


def test_make_install_applies_the_constraints_and_the_same_torch() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt -e '.[" in makefile
    assert "$(STAMP): pyproject.toml constraints.txt" in makefile
    torch = re.search(r"^TORCH := torch==(\S+)$", makefile, re.MULTILINE)
    assert torch and torch.group(1) == pins()["torch"]
