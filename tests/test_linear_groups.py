"""Work on one group of N equal copies, or on N names, grows linearly in N (red team 5).

A 8.7 MB safetensors file of 8 000 equal 1 KiB tensors took 48.8 s to check (every pair of the copy
group was asked whether the loader restores one from the other, and whether config.json declared
it), and converting a 1.1 MB file of 20 000 empty tensors to .pt took 23.7 s (``Checkpoint.names``
rebuilt its set of every name for each name asked about). Counted, not timed: the number of
union-find lookups and set builds per name must not grow with N.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tieaudit.audit import audit_path
from tieaudit.core import components
from tieaudit.formats import open_checkpoint


def _equal_copies(path: Path, count: int) -> None:
    save_file({f"layers.{i}.weight": np.arange(256, dtype=np.float32) for i in range(count)}, str(path))


def test_one_copy_group_costs_lookups_linear_in_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"root": 0}
    root = components.Components.root

    def counted(self: components.Components, name: str) -> str:
        calls["root"] += 1
        return root(self, name)

    monkeypatch.setattr(components.Components, "root", counted)
    per_name = []
    for count in (200, 800):
        _equal_copies(tmp_path / f"eq{count}.safetensors", count)
        calls["root"] = 0
        audit = audit_path(str(tmp_path / f"eq{count}.safetensors"))
        assert [f.rule for f in audit.findings] == ["TIE001"]
        per_name.append(calls["root"] / count)
    assert per_name[1] <= per_name[0] * 1.5 + 1, per_name  # pairwise would be 4x


def test_names_are_built_once(tmp_path: Path) -> None:
    _equal_copies(tmp_path / "eq.safetensors", 10)
    with open_checkpoint(str(tmp_path / "eq.safetensors")) as opened:
        assert opened.checkpoint.names is opened.checkpoint.names
