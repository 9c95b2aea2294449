"""retie on torch.save checkpoints: copies become one storage again, everything else stays as it was.

The truth is ``torch.load(weights_only=True)`` of the output: kept and dropped names share one
storage (``data_ptr``), every name's bytes equal the input's, non-tensor content is unchanged, and
the toy LM gives the same logits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Corpus
from producers_torch import ToyLM  # type: ignore[import-not-found]
from torch import nn

from tieaudit.cli.main import main
from tieaudit.core.errors import UsageError
from tieaudit.repair.retie import RetieResult, retie

torch.manual_seed(0)
SLACK = 4096
"""Bytes of zip and pickle overhead allowed between the size saved and the copy's size."""


def load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_content(before: Any, after: Any, where: str = "<root>") -> None:
    """Same structure, types, non-tensor values; tensors equal bit for bit with the same dtype."""
    assert type(before) is type(after), where
    if isinstance(before, torch.Tensor):
        layout = (before.dtype, before.shape, before.requires_grad)
        assert layout == (after.dtype, after.shape, after.requires_grad), where
        assert torch.equal(bits(before), bits(after)), where
    elif isinstance(before, dict):
        assert list(before) == list(after), where
        for key in before:
            assert_same_content(before[key], after[key], f"{where}.{key}")
    elif isinstance(before, (list, tuple)) and not isinstance(before, torch.Size):
        assert len(before) == len(after), where
        for index, (left, right) in enumerate(zip(before, after, strict=True)):
            assert_same_content(left, right, f"{where}.{index}")
    else:
        assert before == after, where


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def findings(path: Path, tmp_path: Path) -> tuple[int, list[dict[str, Any]]]:
    report = tmp_path / f"{path.name}.json"
    code = main(["check", str(path), "--fail-on", "warning", "-f", "json", "-o", str(report)])
    found: list[dict[str, Any]] = json.loads(report.read_text())["findings"]
    return code, found


def run_retie(source: Path, tmp_path: Path, **options: Any) -> tuple[RetieResult, Path]:
    out = tmp_path / "out" / source.name
    out.parent.mkdir(exist_ok=True)
    return retie(str(source), str(out), **options), out


# ---------------------------------------------------------------- corpus fixtures


@pytest.mark.parametrize(
    ("fixture", "kept", "dropped", "transposed"),
    [
        ("torch_cloned_head", "emb.weight", "head.weight", False),
        ("torch_transposed_copy", "emb", "proj", True),
    ],
)
def test_copy_becomes_one_storage(
    corpus: Corpus, tmp_path: Path, fixture: str, kept: str, dropped: str, transposed: bool
) -> None:
    source = corpus.path(fixture)
    result, out = run_retie(source, tmp_path)
    [decision] = result.plan.applied
    assert (decision.kept, decision.dropped, decision.transposed) == (kept, dropped, transposed)
    before, after = load(source), load(out)
    assert not shares_storage(before[kept], before[dropped])
    assert shares_storage(after[kept], after[dropped])
    if transposed:
        assert after[dropped].stride() == after[kept].stride()[::-1]
    assert_same_content(before, after)
    saved = os.path.getsize(source) - os.path.getsize(out)
    assert abs(saved - decision.nbytes) <= SLACK, (saved, decision.nbytes)
    assert result.output_bytes == os.path.getsize(out)
    code, found = findings(out, tmp_path)
    assert code == 0 and found == []


def test_retied_state_dict_gives_the_same_logits(corpus: Corpus, tmp_path: Path) -> None:
    source = corpus.path("torch_cloned_head")
    _, out = run_retie(source, tmp_path)
    ids = torch.randint(0, 256, (3, 9))
    original, repaired = ToyLM(tied=False), ToyLM(tied=False)
    original.load_state_dict(load(source))
    repaired.load_state_dict(load(out), assign=True)  # assign: the model takes the loaded storages
    assert shares_storage(repaired.emb.weight, repaired.head.weight)
    with torch.no_grad():
        assert torch.equal(original(ids), repaired(ids))


def test_cast_copy_is_left_with_a_reason(corpus: Corpus, tmp_path: Path) -> None:
    source = corpus.path("torch_fp16_copy")
    result, out = run_retie(source, tmp_path)
    [decision] = result.plan.decisions
    assert (decision.dropped, decision.relation, decision.applied) == ("emb_fp16", "cast", False)
    assert "cannot be represented" in decision.reason
    assert result.written is None and not out.exists()  # nothing to re-tie: nothing written


@pytest.mark.parametrize("fixture", ["torch_tied_lm", "torch_legacy_tied", "torch_train_ckpt"])
def test_tied_checkpoint_is_not_rewritten(corpus: Corpus, tmp_path: Path, fixture: str) -> None:
    """Already tied (a training checkpoint too): nothing to re-tie, so no OUT."""
    source = corpus.path(fixture)
    result, out = run_retie(source, tmp_path)
    assert result.plan.decisions == () and result.written is None
    assert not out.exists()


@pytest.mark.parametrize(
    ("fixture", "keep", "other"),
    [("torch_cloned_head", "head.weight", "emb.weight"), ("torch_transposed_copy", "proj", "emb")],
)
def test_keep_chooses_the_stored_side(
    corpus: Corpus, tmp_path: Path, fixture: str, keep: str, other: str
) -> None:
    source = corpus.path(fixture)
    result, out = run_retie(source, tmp_path, keep=keep)
    [decision] = result.plan.applied
    assert (decision.kept, decision.dropped) == (keep, other)
    before, after = load(source), load(out)
    assert shares_storage(after[keep], after[other])
    assert after[keep].is_contiguous()  # the kept tensor is stored as it was; the other is the view
    assert_same_content(before, after)


def test_keep_from_the_command_line(corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "cli.pt"
    assert main(["retie", str(corpus.path("torch_cloned_head")), str(out), "--keep", "head.weight"]) == 0
    after = load(out)
    assert shares_storage(after["emb.weight"], after["head.weight"])


def test_dry_run_writes_nothing(corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "never.pt"
    result = retie(str(corpus.path("torch_cloned_head")), str(out), dry_run=True)
    assert result.written is None and result.plan.saved_bytes == 256 * 32 * 4
    assert main(["retie", str(corpus.path("torch_cloned_head")), str(out), "--dry-run"]) == 0
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- checkpoints built here


def test_legacy_input_with_a_copy(tmp_path: Path) -> None:
    model = ToyLM(tied=False)
    model.head.weight = nn.Parameter(model.emb.weight.detach().clone())
    source = tmp_path / "legacy.pt"
    torch.save(model.state_dict(), source, _use_new_zipfile_serialization=False)
    result, out = run_retie(source, tmp_path)
    after = load(out)
    assert shares_storage(after["emb.weight"], after["head.weight"])
    assert_same_content(load(source), after)
    assert abs(os.path.getsize(source) - os.path.getsize(out) - result.plan.saved_bytes) <= SLACK


def nested_checkpoint() -> dict[str, Any]:
    """Copies inside nested dicts, a tuple and a list of Parameters, beside Adam state and plain leaves."""
    model = ToyLM(tied=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 5))).sum().backward()
    optimizer.step()
    with torch.no_grad():
        model.head.weight.copy_(model.emb.weight)  # an equal copy after training, Adam state kept
    table = torch.randn(64, 32)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 7,
        "extra": {
            "pair": (table, 3, "note", table.t().contiguous()),
            "shape": torch.Size([2, 3]),
            "none": None,
        },
        "params": [nn.Parameter(table.clone()), nn.Parameter(table.clone(), requires_grad=False)],
        "mixed": {"plain": table.clone(), "param": nn.Parameter(table.clone())},
    }


def test_nested_checkpoint_keeps_everything_else(tmp_path: Path) -> None:
    source = tmp_path / "nested.pt"
    torch.save(nested_checkpoint(), source)
    # emb and head were trained apart (two Adam states that differ), then head was copied from emb:
    # re-tying them keeps one state, so retie asks whose.
    with pytest.raises(UsageError, match=r"--keep model\.emb\.weight discards model\.head\.weight's"):
        run_retie(source, tmp_path)
    assert not (tmp_path / "out" / source.name).exists()
    result, out = run_retie(source, tmp_path, keep="model.emb.weight")
    dropped = {d.dropped for d in result.plan.applied}
    assert "model.head.weight" in dropped and "extra.pair.3" in dropped
    before, after = load(source), load(out)
    optimizer_before, optimizer_after = before.pop("optimizer"), after.pop("optimizer")
    assert_same_content(before, after)  # types too: Parameters stay Parameters, the tuple a tuple
    # ToyLM's parameters: emb (0), norm.weight (1), norm.bias (2), head (3): head's state is gone.
    assert sorted(optimizer_after["state"]) == [0, 1, 2] and optimizer_after["param_groups"][0]["params"] == [
        0,
        1,
        2,
    ]
    for key in (0, 1, 2):
        assert_same_content(optimizer_before["state"][key], optimizer_after["state"][key])
    assert shares_storage(after["model"]["emb.weight"], after["model"]["head.weight"])
    table = after["extra"]["pair"][0]
    assert after["extra"]["pair"][3].stride() == (1, 32)
    others = [after["extra"]["pair"][3], *after["params"], after["mixed"]["plain"], after["mixed"]["param"]]
    assert all(shares_storage(table, other) for other in others)
    assert after["mixed"]["plain"] is table  # equal and alike: the very same tensor object
    assert len({id(tensor) for tensor in others}) == len(others)  # the others differ in type or grad
    # The plan's saving counts the storages no name views any more: the discarded head state's too.
    head_state = sum(t.numel() * t.element_size() for t in optimizer_before["state"][3].values())
    assert result.plan.saved_bytes > head_state
    saved = os.path.getsize(source) - os.path.getsize(out)
    assert abs(saved - result.plan.saved_bytes) <= SLACK
    assert [f["rule"] for f in findings(out, tmp_path)[1]] == []
