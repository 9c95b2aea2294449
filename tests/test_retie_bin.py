"""retie of Hugging Face folders whose weights are ``pytorch_model.bin`` files (single or sharded).

Each output is loaded the way users load it: ``torch.load(weights_only=True)`` of every .bin (every
name present, the re-tied ones sharing the kept storage) and ``from_pretrained`` with every class
of the family, compared bit for bit with the input. Equal tensors the class does not tie are left
by default, since from_pretrained would load a shared pair as one tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from test_retie_loaders import _llama, assert_bitwise, clean

from tieaudit.cli.main import main
from tieaudit.repair.retie import retie

SHARDS = ("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin")
INDEX = "pytorch_model.bin.index.json"
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
"""Llama's input embedding and head, as the file stores them."""


def _state(model: Any) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}


def llama_bin(folder: Path, *, sharded: bool) -> dict[str, torch.Tensor]:
    """An untied Llama whose head is a separate copy of the embedding, as pytorch_model.bin;
    sharded: the embedding in the second shard, the head in the first."""
    model = _llama(False)
    state = _state(model)
    state[HEAD] = state[EMBED].clone()
    folder.mkdir()
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.save_pretrained(folder)
    if not sharded:
        torch.save(state, folder / "pytorch_model.bin")
        return state
    second = {EMBED: state[EMBED]}
    first = {k: v for k, v in state.items() if k != EMBED}
    torch.save(first, folder / SHARDS[0])
    torch.save(second, folder / SHARDS[1])
    weight_map = {**dict.fromkeys(first, SHARDS[0]), **dict.fromkeys(second, SHARDS[1])}
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return state


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.bin")):
        found.update(torch.load(str(path), weights_only=True))
    return found


def _from_pretrained(class_name: str, folder: Path) -> tuple[dict[str, torch.Tensor], set[str], Any]:
    model, info = getattr(transformers, class_name).from_pretrained(str(folder), output_loading_info=True)
    return dict(model.state_dict()), set(info["missing_keys"]), model


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_bin_folder_is_retied_as_views_and_loads_everywhere(tmp_path: Path, sharded: bool) -> None:
    source, out = tmp_path / "in", tmp_path / "out"
    state = llama_bin(source, sharded=sharded)
    assert main(["check", str(source), "--output", str(tmp_path / "before.txt")]) == 1  # TIE001

    result = retie(str(source), str(out))
    assert [(d.dropped, d.kept) for d in result.plan.applied] == [(HEAD, EMBED)]
    assert result.output_bytes < result.input_bytes - state[HEAD].nbytes // 2

    after = _read_all(out)
    assert after.keys() == state.keys()  # every name stays, as a view
    assert_bitwise(state, after)
    assert after[HEAD].untyped_storage().data_ptr() == after[EMBED].untyped_storage().data_ptr()
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    if sharded:  # the head moved to the embedding's shard; the index follows
        index = json.loads((out / INDEX).read_text())
        assert index["weight_map"][HEAD] == SHARDS[1]
        assert index["metadata"]["total_size"] == json.loads((source / INDEX).read_text())["metadata"][
            "total_size"
        ] - state[HEAD].nbytes
        assert HEAD not in torch.load(str(out / SHARDS[0]), weights_only=True)
    clean(out, tmp_path)

    for class_name in ("LlamaForCausalLM", "LlamaModel"):
        before, missing_before, _ = _from_pretrained(class_name, source)
        loaded, missing_after, model = _from_pretrained(class_name, out)
        assert missing_after == missing_before == set(), class_name
        assert_bitwise(before, loaded)
        if class_name == "LlamaForCausalLM":
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def bin_equal_by_construction(folder: Path) -> dict[str, torch.Tensor]:
    """A tied Llama (head shared in the .bin) whose two layers' MLP weights are equal: no tie."""
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, num_key_value_heads=2, tie_word_embeddings=True,
        )
    )  # fmt: skip
    state = _state(model)
    state[HEAD] = state[EMBED]
    first, second = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"
    state[second] = state[first].clone()
    folder.mkdir()
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.save_pretrained(folder)
    torch.save(state, folder / "pytorch_model.bin")
    return state


def test_bin_folder_leaves_equal_copies_the_class_does_not_tie(tmp_path: Path) -> None:
    source = tmp_path / "in"
    bin_equal_by_construction(source)
    plan = retie(str(source), str(tmp_path / "plan"), dry_run=True).plan
    (left,) = plan.decisions
    assert not left.applied and "as one tensor" in left.reason and "train as one" in left.reason

    out = tmp_path / "out"
    forced = retie(str(source), str(out), all_equal=True).plan
    (applied,) = forced.applied
    assert "as one tensor" in applied.consequence
    _, _, model = _from_pretrained("LlamaForCausalLM", out)
    up = [layer.mlp.up_proj.weight.data_ptr() for layer in model.model.layers]
    assert up[0] == up[1]  # the stated consequence, as from_pretrained does it


def test_bin_folder_cast_copy_is_not_representable(tmp_path: Path) -> None:
    source = tmp_path / "in"
    state = llama_bin(source, sharded=False)
    state[HEAD] = state[EMBED].to(torch.float16)
    torch.save(state, source / "pytorch_model.bin")
    relations = frozenset({"equal", "cast"})
    plan = retie(str(source), str(tmp_path / "out"), relations=relations, dry_run=True).plan
    (decision,) = plan.decisions
    assert not decision.applied
    assert decision.reason == "a cast copy cannot be represented in pytorch_model.bin; both stay stored"
