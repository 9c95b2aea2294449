"""retie of training checkpoints: the optimizer follows the re-tied copy, checked by torch.optim itself.

The round trip: retie, ``torch.load(weights_only=True)`` of the output, the model loaded into the
tied ToyLM, the optimizer state into a real ``torch.optim.AdamW`` over it, one step. The state kept
is compared with the input's state of the name kept, bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Corpus
from producers_torch import ToyLM  # type: ignore[import-not-found]
from producers_training import train_steps  # type: ignore[import-not-found]
from torch import nn

from tieaudit.cli.main import main


def load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def resume(model_state: dict[str, Any], optimizer_state: dict[str, Any]) -> torch.optim.AdamW:
    """What a user does with the output: the tied model, AdamW over it, the saved state, one step."""
    model = ToyLM(tied=True)
    model.load_state_dict(model_state)
    assert model.head.weight is model.emb.weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(optimizer_state)
    train_steps(model, optimizer)
    return optimizer


def test_differing_states_are_refused_with_both_choices(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.pt"
    assert main(["retie", str(corpus.path("torch_train_copy")), str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "tieaudit: error: model.emb.weight and model.head.weight have different state in optimizer "
        "(keys 0 and 3); retie keeps one: --keep model.emb.weight discards model.head.weight's, "
        "--keep model.head.weight discards model.emb.weight's"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("keep", "kept_key"), [("model.emb.weight", 0), ("model.head.weight", 3)])
def test_keep_chooses_whose_state_the_tied_parameter_keeps(
    corpus: Corpus, tmp_path: Path, keep: str, kept_key: int
) -> None:
    source, out = corpus.path("torch_train_copy"), tmp_path / "out.pt"
    assert main(["retie", str(source), str(out), "--keep", keep]) == 0
    before, after = load(source), load(out)
    state = after["optimizer"]["state"]
    # ToyLM's parameters() once tied: emb (0), norm.weight (1), norm.bias (2); head's entry is gone.
    assert sorted(state) == [0, 1, 2] and after["optimizer"]["param_groups"][0]["params"] == [0, 1, 2]
    assert same(state[0], before["optimizer"]["state"][kept_key])
    assert same(state[1], before["optimizer"]["state"][1]) and same(state[2], before["optimizer"]["state"][2])
    assert after["epoch"] == before["epoch"]
    stepped = resume(after["model"], after["optimizer"])
    assert len(stepped.state_dict()["state"]) == 3
    assert main(["check", str(out), "--fail-on", "note"]) == 0


def test_the_input_is_what_torch_cannot_resume_into_a_tied_model(corpus: Corpus) -> None:
    before = load(corpus.path("torch_train_copy"))
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        resume(before["model"], before["optimizer"])


def _copy_checkpoint(named: bool) -> tuple[dict[str, Any], nn.Module]:
    """An untied ToyLM whose head is copied from emb before any step: both states are alike."""
    model = ToyLM(tied=False)
    with torch.no_grad():
        model.head.weight.copy_(model.emb.weight)
    optimizer = torch.optim.AdamW(model.named_parameters() if named else model.parameters(), lr=1e-3)
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 0}, model


@pytest.mark.parametrize("named", [False, True])
def test_alike_states_need_no_keep_and_param_names_follow(tmp_path: Path, named: bool) -> None:
    ckpt, _ = _copy_checkpoint(named)
    source, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(ckpt, source)
    assert main(["retie", str(source), str(out)]) == 0
    group = load(out)["optimizer"]["param_groups"][0]
    assert group["params"] == [0, 1, 2]
    if named:
        assert group["param_names"] == ["emb.weight", "norm.weight", "norm.bias"]
    else:
        assert "param_names" not in group
    resume(load(out)["model"], load(out)["optimizer"])


def test_a_name_keyed_optimizer_drops_the_copy_by_name(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = ToyLM(tied=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_steps(model, optimizer)
    with torch.no_grad():
        model.head.weight.copy_(model.emb.weight)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    source, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"model": model_state, "optimizer": optimizer_state}, source)
    assert main(["retie", str(source), str(out), "--keep", "model.head.weight"]) == 0
    after, before = load(out)["optimizer"], load(source)["optimizer"]
    assert list(after["state"]) == ["emb.weight", "norm.weight", "norm.bias"]
    assert same(after["state"]["emb.weight"], before["state"]["head.weight"])
    assert after["param_groups"][0]["params"] == ["emb.weight", "norm.weight", "norm.bias"]


def test_a_trainer_folder_is_refused_rather_than_left_stale(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["retie", str(corpus.path("hf_trainer_gpt2_copy")), str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "may have state in optimizer.pt" in line and "does not rewrite the optimizer state yet" in line
    assert not out.exists()


def test_a_tied_trainer_folder_has_nothing_to_retie(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = corpus.path("hf_trainer_gpt2"), tmp_path / "out"
    assert main(["retie", str(source), str(out)]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == "nothing to re-tie; nothing written"
    assert os.listdir(tmp_path) == []
