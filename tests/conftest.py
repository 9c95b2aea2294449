"""Shared fixtures: the generated corpus (built on demand, in a subprocess) and the malformed files.

Imports nothing heavy: the generator runs in its own process, so torch never loads here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "fixtures" / "generate.py"
GENERATED = ROOT / "fixtures" / "generated"
MALFORMED = ROOT / "fixtures" / "malformed"
# The producer modules (fixtures/producers_*.py) hold the toy models the tests rebuild; importing
# them imports torch, so tests import them themselves.
sys.path.insert(0, str(ROOT / "fixtures"))

# The width variables as pytest's process saw them at its start: `import readline` (which pytest
# does) exports COLUMNS=80 and LINES=24 into the C environment when stdin is no terminal, where
# os.environ does not see them but child processes inherit them. An xdist worker is such a child:
# its os.environ would hold them, and a report rendered in-process would wrap at 80 columns where
# a run without workers renders at tieaudit's default width. A worker gives os.environ back the
# starting process's view, and leaves the C environment (what its own children inherit) as it is.
WIDTH_VARIABLES = ("COLUMNS", "LINES")
_WIDTH_SEEN = "TIEAUDIT_TESTS_WIDTH_ENV"
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ[_WIDTH_SEEN] = json.dumps({name: os.environ.get(name) for name in WIDTH_VARIABLES})
elif _WIDTH_SEEN in os.environ:
    for _name, _value in json.loads(os.environ[_WIDTH_SEEN]).items():
        if _value is None and _name in os.environ:
            os.putenv(_name, os.environ.pop(_name))  # out of os.environ, still in what children inherit

# Every fixture fixtures/generate.py must produce; tests parametrize over this list.
FIXTURE_NAMES = [
    "torch_tied_lm",
    "torch_untied_lm",
    "torch_cloned_head",
    "torch_transposed_copy",
    "torch_fp16_copy",
    "torch_transposed_view",
    "torch_overlapping_views",
    "torch_train_ckpt",
    "torch_legacy_tied",
    "torch_bf16_tied",
    "st_save_model_tied",
    "st_cloned_head",
    "st_untied_lm",
    "st_transposed_copy",
    "st_cast_copy",
    "st_gpt2_cloned_head",
    "hf_gpt2",
    "hf_llama_tied",
    "hf_llama_untied",
    "hf_llama_cloned_head",
    "hf_t5",
    "hf_bert_mlm",
    "hf_albert_mlm",
    "hf_llama_diverged_head",
    "hf_llama_lm_head_only",
    "hf_llama_vocab_misaligned",
    "hf_gpt2_sharded",
    "hf_gpt2_bin",
    "hub_sharded_tied",
    "onnx_gpt2_tied_dynamo",
    "onnx_gpt2_tied_dynamo_extdata",
    "onnx_gpt2_tied_torchscript",
    "onnx_gpt2_cloned_dynamo",
    "onnx_helper_shared",
    "onnx_helper_duplicate",
    "onnx_helper_shared_external",
    "onnx_helper_subgraph",
    "torch_train_copy",
    "torch_train_split",
    "torch_train_named",
    "torch_lightning_ckpt",
    "torch_deepspeed_states",
    "torch_dcp_train",
    "hf_trainer_gpt2",
    "hf_trainer_gpt2_copy",
]


# The modules that take most of the suite's time, costliest first (measured with --durations and
# CPU per module; the whole suite runs in two xdist workers, `make test`). Collected first, so a
# worker starts on each of them early instead of one finishing alone at the end (--dist loadfile
# keeps a module on one worker: its module fixtures are built once); marked slow, so that
# `make test-fast` (-m "not slow") can leave them out. `make test` runs them all.
SLOW_MODULES = (
    "test_trust2_pickle_differential.py",
    "test_differential_torch.py",
    "test_readme_commands.py",
    "test_trust2_vm_budget.py",
    "test_tie_table.py",
    "test_hostile.py",
    "test_runtime.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(SLOW_MODULES)}
    for item in items:
        if item.path.name in rank:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept within a module


class Corpus:
    """The generated fixtures, looked up by name in MANIFEST.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest: dict[str, Any] = json.loads((root / "MANIFEST.json").read_text())
        self.entries: dict[str, dict[str, Any]] = {e["name"]: e for e in self.manifest["fixtures"]}

    def entry(self, name: str) -> dict[str, Any]:
        if name not in self.entries:
            failed = {f["name"]: f["error"] for f in self.manifest["failed"]}
            pytest.fail(f"fixture {name!r} not generated: {failed.get(name, 'unknown name')}")
        return self.entries[name]

    def path(self, name: str) -> Path:
        return self.root / self.entry(name)["path"]


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    # The generator returns at once when its manifest is current; a fresh build takes ~15 s.
    run = subprocess.run([sys.executable, str(GENERATOR), str(GENERATED)], capture_output=True, text=True)
    if run.returncode != 0:
        pytest.fail(f"fixtures/generate.py failed (it needs torch and transformers):\n{run.stderr[-4000:]}")
    return Corpus(GENERATED)


@pytest.fixture(scope="session")
def malformed_dir() -> Path:
    return MALFORMED
