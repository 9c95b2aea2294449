"""Training checkpoints through the CLI: which part is the model and which the optimizer state, how
each optimizer key is matched to its parameter, and TIE007's findings and exit codes.

The truth for every match is the manifest's ``optimizer_keys``, recorded from the live optimizer and
model when the fixture was trained (fixtures/producers_training.py); byte counts are ToyLM's
(256 x 32 float32 embedding: 32768 bytes; an AdamW state: exp_avg, exp_avg_sq and a float32 step).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Corpus
from torch import nn

from tieaudit.cli.main import main

EMBEDDING_BYTES = 256 * 32 * 4
ADAM_STATE_BYTES = 2 * EMBEDDING_BYTES + 4  # exp_avg, exp_avg_sq, step (a float32 scalar)


def report(path: Path, tmp_path: Path, *options: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    code = main(["check", str(path), "-f", "json", "-o", str(out), *options])
    document: dict[str, Any] = json.loads(out.read_text())
    return code, document


def single(document: dict[str, Any]) -> dict[str, Any]:
    (only,) = document["reports"] if "reports" in document else [document]
    return only


def state_names(optimizer: str, key: int) -> set[str]:
    return {f"{optimizer}.state.{key}.{entry}" for entry in ("step", "exp_avg", "exp_avg_sq")}


# (fixture, layout kind, model part, optimizer path, matched by, prefix of the truth's names)
PLAIN = "model+optimizer dict"
LAYOUTS = [
    ("torch_train_copy", PLAIN, "model", "optimizer", "order", ""),
    ("torch_train_named", PLAIN, "model_state_dict", "optimizer_state_dict", "names", "model_state_dict."),
    ("torch_lightning_ckpt", "lightning", "state_dict", "optimizer_states.0", "order", ""),
    ("torch_deepspeed_states", "deepspeed", "module", "optimizer", "names", ""),
    ("torch_dcp_train", PLAIN, "model", "optimizer", "names", "model."),
]  # fmt: skip


@pytest.mark.parametrize(("fixture", "kind", "model", "optimizer", "method", "prefix"), LAYOUTS)
def test_the_report_names_the_model_and_the_optimizer_and_matches_every_key(
    corpus: Corpus,
    tmp_path: Path,
    fixture: str,
    kind: str,
    model: str,
    optimizer: str,
    method: str,
    prefix: str,
) -> None:
    truth = corpus.entry(fixture)["expect"]["optimizer_keys"]
    _, document = report(corpus.path(fixture), tmp_path)
    training = single(document)["training"]
    assert (training["kind"], training["model"]) == (kind, model)
    (found,) = training["optimizers"]
    assert (found["path"], found["mapped_by"], found["unmapped"]) == (optimizer, method, None)
    assert found["param_of_key"] == {key: prefix + name for key, name in truth.items()}
    assert found["parameters"] == found["states"] == len(truth)
    names = {t["name"] for t in single(document)["tensors"]}
    assert state_names(optimizer, 0) <= names or all(f"{optimizer}.state.{k}.exp_avg" in names for k in truth)


@pytest.mark.parametrize(
    "fixture",
    [
        "torch_train_named",
        "torch_lightning_ckpt",
        "torch_deepspeed_states",
        "torch_dcp_train",
        "hf_trainer_gpt2",
    ],
)
def test_a_tied_model_with_one_state_per_parameter_passes(
    corpus: Corpus, tmp_path: Path, fixture: str
) -> None:
    code, document = report(corpus.path(fixture), tmp_path)
    # A Trainer folder pickles TrainingArguments (training_args.bin) and numpy arrays (rng_state.pth):
    # torch's weights_only load refuses both files, so TIE010 for each, and nothing else.
    found = [(f["rule"], f["details"].get("file")) for f in single(document)["findings"]]
    trainer = [("TIE010", "training_args.bin"), ("TIE010", "rng_state.pth")]
    assert sorted(found) == sorted(trainer if fixture.startswith("hf_trainer") else [])
    assert code == (1 if fixture.startswith("hf_trainer") else 0)


def test_an_equal_copy_with_a_state_each_is_two_warnings(corpus: Corpus, tmp_path: Path) -> None:
    code, document = report(corpus.path("torch_train_copy"), tmp_path)
    found = single(document)["findings"]
    assert code == 1
    assert [(f["rule"], f["severity"]) for f in found] == [("TIE001", "warning"), ("TIE007", "warning")]
    split = found[1]
    expected = (
        {"model.emb.weight", "model.head.weight"} | state_names("optimizer", 0) | state_names("optimizer", 3)
    )
    assert set(split["names"]) == expected
    assert split["details"] == {"optimizer": "optimizer", "states": [0, 3], "mapped_by": "order"}
    assert split["wasted_bytes"] == ADAM_STATE_BYTES  # the state retie discards
    assert single(document)["summary"]["wasted_bytes"] == EMBEDDING_BYTES + ADAM_STATE_BYTES
    assert "--keep" in split["fix"]


def test_a_tied_model_with_two_states_for_its_tie_is_an_error(corpus: Corpus, tmp_path: Path) -> None:
    code, document = report(corpus.path("torch_train_split"), tmp_path)
    (split,) = single(document)["findings"]
    assert code == 1 and (split["rule"], split["severity"]) == ("TIE007", "error")
    expected = (
        {"model.emb.weight", "model.head.weight"} | state_names("optimizer", 0) | state_names("optimizer", 3)
    )
    assert set(split["names"]) == expected
    assert split["wasted_bytes"] == ADAM_STATE_BYTES
    assert "load_state_dict into the tied model fails" in split["message"]
    optimizer = single(document)["training"]["optimizers"][0]
    assert (
        optimizer["param_of_key"] == {}
        and "lists 4 parameters, the model part has 3" in optimizer["unmapped"]
    )
    assert main(["check", str(corpus.path("torch_train_split")), "--ignore", "TIE007"]) == 0


def test_the_error_really_is_what_torch_refuses(corpus: Corpus) -> None:
    """What TIE007 says of torch_train_split, torch says too: the tied model's AdamW refuses it."""
    from producers_torch import ToyLM  # type: ignore[import-not-found]

    ckpt = torch.load(corpus.path("torch_train_split"), weights_only=True)
    model = ToyLM(tied=True)
    model.load_state_dict(ckpt["model"])
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        torch.optim.AdamW(model.parameters()).load_state_dict(ckpt["optimizer"])


def test_sarif_carries_tie007(corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(corpus.path("torch_train_split")), "-f", "sarif"]) == 1
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert [r["ruleId"] for r in run["results"]] == ["TIE007"]
    assert "TIE007" in [r["id"] for r in run["tool"]["driver"]["rules"]]


class _Wider(nn.Module):
    """ToyLM's layout with a 300-row vocabulary: its optimizer's states fit no ToyLM parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(300, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 300, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(ids)))


def test_states_of_another_shape_are_an_error(tmp_path: Path) -> None:
    from producers_torch import ToyLM

    other = _Wider()
    optimizer = torch.optim.AdamW(other.parameters())
    other(torch.randint(0, 300, (2, 4))).sum().backward()
    optimizer.step()
    path = tmp_path / "mixed.pt"
    torch.save({"model": ToyLM(tied=True).state_dict(), "optimizer": optimizer.state_dict()}, path)
    code, document = report(path, tmp_path)
    (split,) = single(document)["findings"]
    assert code == 1 and (split["rule"], split["severity"]) == ("TIE007", "error")
    assert "1 states of shape [300, 32], the model part has 0 parameters of that shape" in split["message"]
    assert set(split["names"]) == state_names("optimizer", 0)


def test_a_trainer_folder_is_one_checkpoint(corpus: Corpus, tmp_path: Path) -> None:
    folder = corpus.path("hf_trainer_gpt2")
    truth = corpus.entry("hf_trainer_gpt2")["expect"]["optimizer_keys"]
    code, document = report(folder, tmp_path)
    audited = single(document)
    by_file = {f["details"]["file"]: f for f in audited["findings"]}
    assert code == 1 and {f["rule"] for f in audited["findings"]} == {"TIE010"}
    assert "transformers.training_args.TrainingArguments" in by_file["training_args.bin"]["names"]
    assert "numpy.ndarray" in by_file["rng_state.pth"]["names"]
    training = audited["training"]
    assert training["kind"] == "trainer folder" and training["model"] == ""
    roles = {p["path"]: (p["role"], p["status"]) for p in training["parts"]}
    assert roles["model.safetensors"] == ("model", "read")
    assert roles["optimizer.pt"] == ("optimizer", "read, 48 tensors")  # 16 parameters x 3 entries
    assert roles["scheduler.pt"] == ("lr-scheduler", "read, no tensors")
    # numpy arrays and TrainingArguments are read as inert placeholders (pickle_globals).
    assert roles["rng_state.pth"] == ("rng-state", "read, 1 tensor")  # torch's CPU generator state
    assert roles["training_args.bin"] == ("training-args", "read, no tensors")
    verdicts = {(g["file"], g["name"]): g["verdict"] for g in audited["pickle_globals"]}
    # torch's verdict: weights_only refuses numpy arrays and TrainingArguments alike (TIE010)
    assert verdicts[("rng_state.pth", "numpy.ndarray")] == "runs-code"
    assert verdicts[("training_args.bin", "transformers.training_args.TrainingArguments")] == "runs-code"
    assert roles["trainer_state.json"][0] == "trainer-state"
    (optimizer,) = training["optimizers"]
    assert (optimizer["path"], optimizer["file"], optimizer["groups"], optimizer["parameters"]) == (
        "optimizer",
        "optimizer.pt",
        2,
        16,
    )
    # model.safetensors is sorted by name: only shapes no other parameter has are matched, and rightly.
    assert optimizer["mapped_by"] == "shape" and len(optimizer["param_of_key"]) == 8
    assert all(truth[key] == name for key, name in optimizer["param_of_key"].items())
    names = {t["name"] for t in audited["tensors"]}
    assert state_names("optimizer", 15) <= names and "transformer.wte.weight" in names


def test_check_text_names_the_training_files_pickled_classes(
    corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(corpus.path("hf_trainer_gpt2"))]) == 1  # torch refuses its pickles
    out = capsys.readouterr().out
    assert "not read" not in out  # every Trainer file is read (placeholders for its classes)
    assert "  TIE010 error  pickle-runs-code\n" in out
    assert re.search(  # the message, wrapped to the width
        r"training_args\.bin needs torch\.load\(weights_only=False\), which would import and "
        r"use globals outside torch's weights_only allowlist: transformers\.training_args\.TrainingArguments "
        r"\(imported, instantiated, state set\)",
        " ".join(out.split()),
    )
    assert main(["inspect", str(corpus.path("torch_lightning_ckpt"))]) == 0
    out = capsys.readouterr().out
    assert "note: training checkpoint (lightning): model = state_dict" in out
    assert (
        "note: optimizer = optimizer_states.0: 3 parameters in 1 group, 3 matched to model parameters "
        "by order" in " ".join(out.split())  # a note wraps to the width
    )


def test_a_trainer_folder_with_a_copied_head_warns_for_each_state(corpus: Corpus, tmp_path: Path) -> None:
    code, document = report(corpus.path("hf_trainer_gpt2_copy"), tmp_path)
    truth = corpus.entry("hf_trainer_gpt2_copy")["expect"]["optimizer_keys"]
    found = single(document)["findings"]
    assert code == 1
    assert [(f["rule"], f["severity"]) for f in found] == [
        ("TIE010", "error"),  # rng_state.pth
        ("TIE010", "error"),  # training_args.bin
        ("TIE001", "warning"),
        ("TIE007", "warning"),
    ]
    split = found[3]
    keys = sorted(int(k) for k, name in truth.items() if name in ("transformer.wte.weight", "lm_head.weight"))
    assert split["details"]["states"] == keys and split["details"]["mapped_by"] == "shape"
    assert {"transformer.wte.weight", "lm_head.weight"} <= set(split["names"])
    assert split["fix"] is None  # retie of a folder does not rewrite optimizer.pt (test_retie_training)


def test_a_model_key_without_an_optimizer_is_a_checkpoint_dict(tmp_path: Path) -> None:
    from producers_torch import ToyLM

    path = tmp_path / "weights_only.pt"
    torch.save({"state_dict": ToyLM(tied=True).state_dict(), "epoch": 3}, path)
    code, document = report(path, tmp_path)
    training = single(document)["training"]
    assert (code, training["kind"], training["model"], training["optimizers"]) == (
        0,
        "checkpoint dict",
        "state_dict",
        [],
    )
    plain = tmp_path / "plain.pt"
    torch.save(ToyLM(tied=True).state_dict(), plain)
    assert "training" not in single(report(plain, tmp_path)[1])
