"""Tensors torch.load returns as attributes are listed, audited and written, never dropped.

``torch.load(weights_only=True)`` sets the attributes a pickle gives a tensor (``p.extra``, by
``_rebuild_parameter_with_state`` or ``_rebuild_from_type_v2``) and an OrderedDict (BUILD; torch
keeps module versions in ``_metadata``). A tensor among them is an entry torch returns: tieaudit
lists it under its owner's name (``w.extra``), finds copies hidden there, and retie and convert
write it (issue 23, point 4). Attributes holding no tensor (module versions) add no entry.
"""

from __future__ import annotations

import collections
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def names(path: Path) -> list[str]:
    out = run("inspect", str(path), "--format", "json", cwd=path.parent)
    assert out.returncode == 0, out.stderr
    return sorted(tensor["name"] for tensor in json.loads(out.stdout)["tensors"])


def save(root: Any, path: Path) -> Path:
    torch.save(root, path)
    return path


def test_attributes_holding_tensors_are_listed(tmp_path: Path) -> None:
    weight = torch.nn.Parameter(torch.randn(4, 3))
    weight.extra = torch.ones(5)
    plain = torch.randn(2, 2)
    plain.extra = {"inner": [torch.zeros(3)]}
    state = collections.OrderedDict(w=weight, p=plain)
    state.hidden = torch.full((7,), 3.0)  # type: ignore[attr-defined]
    path = save(state, tmp_path / "attributes.pt")
    loaded = torch.load(path, weights_only=True)
    assert loaded.hidden.shape == (7,) and loaded["w"].extra.shape == (5,)  # torch returns them
    assert names(path) == ["hidden", "p", "p.extra.inner.0", "w", "w.extra"]


def test_module_versions_add_no_entry(tmp_path: Path) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    path = save(module.state_dict(), tmp_path / "state_dict.pt")
    assert hasattr(torch.load(path, weights_only=True), "_metadata")
    assert names(path) == ["0.bias", "0.weight", "1.bias", "1.weight"]


@pytest.mark.parametrize("where", ["ordereddict", "parameter"])
def test_a_copy_hidden_in_an_attribute_is_found_and_its_fix_runs(tmp_path: Path, where: str) -> None:
    weight = torch.nn.Parameter(torch.randn(64, 32))
    state = collections.OrderedDict(w=weight)
    if where == "parameter":
        weight.shadow = weight.detach().clone()
        copy = "w.shadow"
    else:
        state.backup = weight.detach().clone()  # type: ignore[attr-defined]
        copy = "backup"
    path = save(state, tmp_path / "model.pt")
    checked = run("check", path.name, cwd=tmp_path)
    assert checked.returncode == 1 and "TIE001" in checked.stdout and copy in checked.stdout, checked.stdout
    fix = next(line.split("fix:", 1)[1] for line in checked.stdout.splitlines() if "fix:" in line)
    command = shlex.split(fix)
    assert command[:2] == ["tieaudit", "retie"], fix
    fixed = run(*command[1:], cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    out = tmp_path / command[-1]
    assert run("check", out.name, cwd=tmp_path).returncode == 0
    loaded = torch.load(out, weights_only=True)
    kept = loaded["w"]
    hidden = kept.shadow if where == "parameter" else loaded.backup
    assert hidden.data_ptr() == kept.data_ptr() and torch.equal(hidden, weight.detach())
    assert type(kept) is torch.nn.Parameter


def test_convert_writes_attribute_tensors_under_their_names(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    weight = torch.nn.Parameter(torch.randn(4, 3))
    weight.extra = torch.arange(5.0)
    path = save({"w": weight}, tmp_path / "param.pt")
    out = tmp_path / "param.safetensors"
    converted = run("convert", str(path), str(out), cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    tensors = load_file(str(out))
    assert sorted(tensors) == ["w", "w.extra"]
    assert (tensors["w.extra"] == weight.extra.numpy()).all()
