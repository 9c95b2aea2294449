"""Matching optimizer keys to parameters, measured on real models: right or reported, never guessed.

Each case trains a real model (a torch module, or a tiny transformers model from its config) one
step with a real torch optimizer, saves ``{"model", "optimizer"}``, reads it with tieaudit (no
torch in the reading) and compares the match with the truth taken from the live optimizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from producers_training import optimizer_keys  # type: ignore[import-not-found]
from torch import nn

from tieaudit.formats import open_checkpoint
from tieaudit.graph.optimizer_map import ModelParam, OptimizerMap, fit_groups, fit_subsequence, map_optimizer

transformers.logging.set_verbosity_error()


def trained(model: nn.Module, groups: Any, make: Any = torch.optim.AdamW) -> Any:
    optimizer = make(groups, lr=1e-3)
    out = model(torch.randint(0, 64, (2, 8)))
    loss = out.logits.sum() if hasattr(out, "logits") else out.sum()
    loss.backward()
    optimizer.step()
    return optimizer


def mapped(path: Path) -> OptimizerMap:
    with open_checkpoint(str(path)) as opened:
        ckpt = opened.checkpoint
        assert ckpt.training is not None
        (record,) = ckpt.training.optimizers
        return map_optimizer(ckpt, ckpt.training, record)


def match_of(omap: OptimizerMap) -> dict[str, str]:
    return {str(k): omap.params[i].names[0].removeprefix("model.") for k, i in omap.owner.items()}


def save_and_map(model: nn.Module, optimizer: Any, tmp_path: Path) -> tuple[OptimizerMap, dict[str, str]]:
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return mapped(path), optimizer_keys(model, optimizer.param_groups)


def tiny(name: str) -> nn.Module:
    small: dict[str, Any] = {
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }
    configs = {
        "gpt2": transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16),
        "llama": transformers.LlamaConfig(intermediate_size=64, tie_word_embeddings=True, **small),
        "bert": transformers.BertConfig(intermediate_size=64, **small),
    }
    classes = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM}
    model: nn.Module = classes.get(name, transformers.BertForMaskedLM)(configs[name])
    return model


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_transformers_models_match_by_order_exactly(name: str, tmp_path: Path) -> None:
    model = tiny(name)
    omap, truth = save_and_map(model, trained(model, model.parameters()), tmp_path)
    assert (omap.method, omap.problem) == ("order", "")
    assert match_of(omap) == truth


def test_trainer_style_groups_interleave_in_one_way(tmp_path: Path) -> None:
    """transformers' Trainer: weights with decay, then biases and norms (groups that interleave)."""
    model = tiny("gpt2")
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    omap, truth = save_and_map(model, trained(model, groups), tmp_path)
    assert omap.method == "order" and match_of(omap) == truth


def test_param_names_are_used_as_given(tmp_path: Path) -> None:
    model = tiny("llama")
    omap, truth = save_and_map(model, trained(model, model.named_parameters()), tmp_path)
    assert (omap.method, match_of(omap)) == ("names", truth)


class BufferFirst(nn.Module):
    """A float buffer registered on the root comes first in state_dict(): it is no parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.norm = nn.LayerNorm(16)
        self.register_buffer("scale", torch.ones(16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.emb(ids) * self.scale)


def test_a_float_buffer_is_skipped_where_shapes_leave_one_fit(tmp_path: Path) -> None:
    model = BufferFirst()
    assert next(iter(model.state_dict())) == "scale"
    omap, truth = save_and_map(model, trained(model, model.parameters()), tmp_path)
    assert omap.method == "order" and match_of(omap) == truth


class ConvBN(nn.Module):
    """Two conv + batch-norm blocks: running stats have the shape of the norm's weight and bias."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8), nn.Conv1d(8, 8, 3), nn.BatchNorm1d(8)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.layers(ids.float().reshape(2, 4, 2).repeat(1, 1, 4))


def test_batch_norm_running_stats_make_the_order_ambiguous(tmp_path: Path) -> None:
    model = ConvBN()
    omap, _ = save_and_map(model, trained(model, model.parameters()), tmp_path)
    assert omap.method == "none" and omap.owner == {}
    assert omap.problem.startswith("several orders of the model's tensors fit")


def test_sgd_without_momentum_has_no_shapes_to_check(tmp_path: Path) -> None:
    """Plain SGD keeps no state: only the count is known, and with buffers the order is not."""
    model = BufferFirst()
    omap, truth = save_and_map(model, trained(model, model.parameters(), torch.optim.SGD), tmp_path)
    assert omap.optimizer.slots == () and len(truth) == 3
    assert omap.method == "none" and "several orders" in omap.problem


def params(*shapes: tuple[int, ...]) -> list[ModelParam]:
    return [ModelParam(names=(f"p{i}",), shape=s) for i, s in enumerate(shapes)]


def test_fit_subsequence_counts_fits() -> None:
    a, b = (4, 2), (2,)
    assert fit_subsequence([a, b], params(a, b)) == [0, 1]
    assert fit_subsequence([a, b], params(b, a, b)) == [1, 2]
    assert fit_subsequence([b], params(b, b)) == "ambiguous"
    assert fit_subsequence([None, b], params(a, b)) == [0, 1]  # a key without state fits anything
    assert fit_subsequence([a, a], params(a)) is None
    assert fit_subsequence([(3,)], params(a, b)) is None


def test_fit_groups_takes_only_forced_steps() -> None:
    w, v = (4, 2), (2,)
    assert fit_groups([[w, w], [v, v]], params(w, v, w, v)) == [[0, 2], [1, 3]]
    assert fit_groups([[v], [v]], params(v, v)) is None  # either group could take the first
    assert fit_groups([[w], [v]], params(w, v, v)) is None  # counts differ: not interleaved
