"""The architecture sweep's fast subset (issue 11): eight families, every variant, each case one
test. A case passes only when every answer of tieaudit agrees with the live transformers model and
retie's output loads bit for bit with every loader; ``make sweep`` runs every architecture.

The cases run in two worker processes (tests/sweep/run.py); this module imports neither torch nor
transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.sweep import run

FAST = (
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "GPTNeoXForCausalLM",
    "T5ForConditionalGeneration",
    "BertForMaskedLM",
    "LlavaForConditionalGeneration",
    "MambaForCausalLM",
    "MarianMTModel",
)
CASES = [(name, variant) for name, variants in run.plan(FAST, None) for variant in variants]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    work: Path = tmp_path_factory.mktemp("sweep")
    with (work / "workers.log").open("w") as log:
        done = run.sweep(run.plan(FAST, None), 2, 300.0, 4 << 30, str(work), False, log, progress=None)
    return {(r["class"], r["variant"]): r for r in done}


def _reason(result: dict[str, Any]) -> str:
    if result["status"] != "disagree":
        return f"{result['status']}: {result.get('reason', '')}"
    return "; ".join(f"{d['cause']}: {d['detail']}" for d in result["disagreements"])


@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{n}-{v}" for n, v in CASES])
def test_case_agrees(results: dict[tuple[str, str], dict[str, Any]], name: str, variant: str) -> None:
    result = results[(name, variant)]
    assert result["status"] == "agree", f"{name} {variant}: {_reason(result)}"
