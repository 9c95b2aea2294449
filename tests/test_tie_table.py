"""tieaudit/formats/tie_table.json is what the installed transformers computes, for every class.

The table is generated offline by scripts/gen_tie_table.py (``make tie-table``); this test imports
that script's per-class function and recomputes every committed entry (switches, tied names for
every combination of stated switches, defaults, forced values, embedding names, the names
save_pretrained writes) from transformers itself, in two worker processes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_tie_table as gen  # type: ignore[import-not-found]  # noqa: E402

TABLE = json.loads(gen.TABLE.read_text())
WORKERS = 2
"""Worker processes recomputing the entries (the suite runs on two cores)."""


def test_table_is_generated_from_the_installed_transformers() -> None:
    assert TABLE["schema"] == gen.SCHEMA
    assert TABLE["transformers"] == importlib.metadata.version("transformers")
    assert TABLE["command"] == gen.COMMAND
    assert len(TABLE["classes"]) > 1000


def test_every_class_in_the_table_is_what_transformers_computes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The workers inherit an empty, offline hub cache (gen.isolate_hub sees it is set up).
    home = str(tmp_path / "hf")
    for key, value in {
        "HF_HOME": home,
        gen.ISOLATED: home,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    began = time.monotonic()
    context = multiprocessing.get_context("spawn")  # fresh interpreters: nothing inherited from pytest
    with ProcessPoolExecutor(WORKERS, mp_context=context) as pool:
        batches = gen.package_batches(TABLE["classes"])
        problems = [p for found in pool.map(gen.check_entries, batches) for p in found]
    assert problems == [], "\n".join(problems[:40])
    print(f"{len(TABLE['classes'])} classes recomputed in {time.monotonic() - began:.1f} s")


def test_every_class_of_transformers_auto_tables_is_listed() -> None:
    """Each model class transformers' auto tables name is in the table, or failed, or excluded."""
    from transformers.models.auto import modeling_auto

    listed = set(TABLE["classes"]) | set(TABLE["failed"])
    listed |= {n for names in TABLE["excluded"].values() for n in names}
    named = {
        class_name
        for attribute in dir(modeling_auto)
        if attribute.startswith("MODEL") and attribute.endswith("_MAPPING_NAMES")
        for class_name in getattr(modeling_auto, attribute).values()
        if isinstance(class_name, str)
    }
    assert sorted(named - listed) == []


def test_failed_classes_give_a_reason() -> None:
    assert all(isinstance(reason, str) and reason for reason in TABLE["failed"].values())


def test_table_is_package_data() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = pyproject["tool"]["setuptools"]["package-data"]["tieaudit.formats"]
    # every data file the readers open is packaged (a wheel holds only what is listed)
    data = sorted(p.name for p in (ROOT / "tieaudit" / "formats").glob("*.json"))
    assert "tie_table.json" in listed and sorted(listed) == data, (listed, data)
    packaged = importlib.resources.files("tieaudit.formats").joinpath("tie_table.json")
    assert json.loads(packaged.read_text("utf-8")) == TABLE
