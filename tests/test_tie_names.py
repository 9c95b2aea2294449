"""tieaudit/formats/tie_names.json is what the installed transformers builds, for a sample of classes.

The file is generated offline with the tie table (scripts/gen_tie_names.py, ``make tie-table`` or
``scripts/gen_tie_table.py --names-only``): every class of the table built on the meta device, its
state_dict names as save_pretrained writes them (and in memory where they differ), numbered
segments as ``#``. Rebuilding all 1669 classes takes minutes, so this test rebuilds a sample (the
classes the bare-file tests use, and every 40th class of the table) in a fresh interpreter and
compares; the whole file is checked against the table's class list.
"""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_tie_names as names_gen  # type: ignore[import-not-found]  # noqa: E402
import gen_tie_table as gen  # type: ignore[import-not-found]  # noqa: E402

NAMES = json.loads(names_gen.NAMES.read_text())
TABLE = json.loads(gen.TABLE.read_text())
NAMED = [
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "MambaForCausalLM",
    "PegasusForConditionalGeneration",
    "BertForMaskedLM",
    "T5ForConditionalGeneration",
    "MixtralForCausalLM",  # fused experts in memory: a memory spelling of its own
    "GPTNeoXForCausalLM",  # lm_head.weight written as embed_out.weight
]
SAMPLE = sorted({*NAMED, *sorted(NAMES["classes"])[::40]})


def test_names_are_generated_from_the_installed_transformers_for_every_class_of_the_table() -> None:
    assert NAMES["schema"] == names_gen.SCHEMA and NAMES["command"] == names_gen.COMMAND
    assert NAMES["transformers"] == importlib.metadata.version("transformers") == TABLE["transformers"]
    assert sorted([*NAMES["classes"], *NAMES["failed"]]) == sorted(TABLE["classes"])
    assert len(NAMES["classes"]) > 1000


def test_the_names_list_is_sorted_and_front_coded() -> None:
    every = names_gen.front_decoded(NAMES["names"])
    assert every == sorted(set(every))
    assert names_gen.front_coded(every) == NAMES["names"]
    assert all("." in n or n.isidentifier() for n in every)
    assert not any(part.isdigit() for n in every for part in n.split("."))  # numbered segments are '#'


def test_a_sample_of_classes_is_what_transformers_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = str(tmp_path / "hf")
    for key, value in {
        "HF_HOME": home,
        gen.ISOLATED: home,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing inherited from pytest
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        (results,) = pool.map(names_gen.worker, [SAMPLE])
    problems = []
    for name, fresh, error in results:
        if fresh is None:
            problems.append(f"{name}: {error}")
        elif fresh != (committed := names_gen.decoded(NAMES, name)):
            problems.append(f"{name}: differs in {sorted(k for k in fresh if fresh[k] != committed.get(k))}")
    assert problems == [], "\n".join(problems)
    assert len(results) >= 40


def test_tied_targets_are_optional_and_spellings_follow_the_table() -> None:
    gpt2 = names_gen.decoded(NAMES, "GPT2LMHeadModel")
    assert "lm_head.weight" in gpt2["disk_optional"] and "transformer.wte.weight" not in gpt2["disk_optional"]
    assert "transformer.h.#.attn.c_attn.weight" in gpt2["disk"] and "memory" not in gpt2
    neox = names_gen.decoded(NAMES, "GPTNeoXForCausalLM")
    assert "embed_out.weight" in neox["disk_optional"] and "lm_head.weight" in neox["memory_optional"]
