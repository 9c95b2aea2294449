"""A class whose forward reads tie_word_embeddings: retie never sets the flag for it.

SwitchTransformers (and Udop) rescale the decoder output by ``d_model ** -0.5`` before the head
when ``tie_word_embeddings`` is set, so turning the flag on to re-tie a cloned head would change
every logit. The tie table records such classes (``flag_in_forward``, from the class's source);
retie leaves the copy and says why, --all-equal refuses, and check's fix does not suggest either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from tieaudit.audit import audit_path
from tieaudit.core.errors import UsageError
from tieaudit.formats.tie_table import tie_table
from tieaudit.repair.retie import retie

HEAD, EMBED = "lm_head.weight", "shared.weight"


def _switch_untied_clone(folder: Path) -> None:
    # not in the config's typed signature: transformers sets them from its **kwargs
    sparse_steps: dict[str, Any] = {"encoder_sparse_step": 2, "decoder_sparse_step": 2}
    config = transformers.SwitchTransformersConfig(
        vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
        num_experts=2, **sparse_steps, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.SwitchTransformersForConditionalGeneration(config)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.shared.weight)
    model.save_pretrained(folder)


def test_the_table_records_the_classes_whose_forward_reads_the_flag() -> None:
    table = tie_table()
    flagged = {"SwitchTransformersForConditionalGeneration", "UdopForConditionalGeneration"}
    for name in flagged:
        entry = table.entry(name)
        assert entry is not None and entry.flag_in_forward, name
    for name in ("T5ForConditionalGeneration", "GPT2LMHeadModel", "BartForConditionalGeneration"):
        entry = table.entry(name)
        assert entry is not None and not entry.flag_in_forward, name


def test_retie_leaves_the_copy_instead_of_changing_the_outputs(tmp_path: Path) -> None:
    source = tmp_path / "switch"
    _switch_untied_clone(source)
    plan = retie(str(source), str(tmp_path / "plan"), dry_run=True).plan
    left = [d for d in plan.decisions if {d.kept, d.dropped} == {HEAD, EMBED}]
    assert left and not any(d.applied for d in left)
    assert all("forward reads tie_word_embeddings" in d.reason for d in left)
    assert not plan.applied

    with pytest.raises(UsageError, match="would change the model's outputs"):
        retie(str(source), str(tmp_path / "out"), all_equal=True)
    assert not (tmp_path / "out").exists()

    (finding,) = [f for f in audit_path(str(source)).findings if f.rule == "TIE001"]
    assert finding.fix is not None
    assert str(finding.fix).startswith("keep them:") and "--all-equal" not in str(finding.fix)
