"""tieaudit.load_tied: every name back bit for bit, ties back as shared tensors.

The property test injects equal, transposed and cast copies into random state dicts, retie's
them with every relation, and asks load_tied for the original values.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from tieaudit import load_tied
from tieaudit.repair.retie import retie

ALL = frozenset({"equal", "transposed", "cast"})
COPY_KINDS = ("equal", "transposed", "bfloat16", "float16")
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(BITS[tensor.element_size()])


def assert_bitwise(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(bits(got[name]), bits(value)), name


def shares_storage(first: torch.Tensor, second: torch.Tensor) -> bool:
    return bool(first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr())


def copy_of(base: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "equal":
        return base.clone()
    if kind == "transposed":
        return base.t().contiguous()
    return base.to(getattr(torch, kind))


@st.composite
def state_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    """2-4 random float32 matrices (sides 2..40), each with a random set of injected copies."""
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    state: dict[str, torch.Tensor] = {}
    for index in range(draw(st.integers(2, 4))):
        shape = (draw(st.integers(2, 40)), draw(st.integers(2, 40)))
        base = torch.randn(shape, generator=generator)
        state[f"w{index}"] = base
        for kind in draw(st.lists(st.sampled_from(COPY_KINDS), unique=True, max_size=len(COPY_KINDS))):
            state[f"w{index}.{kind}"] = copy_of(base, kind)
    return state


@settings(max_examples=40, deadline=None)
@given(state_dicts())
def test_retie_then_load_tied_gives_every_value_back(state: dict[str, torch.Tensor]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        source, out = Path(folder, "in.safetensors"), Path(folder, "out.safetensors")
        save_file(state, str(source))
        result = retie(str(source), str(out), relations=ALL, min_bytes=0, all_equal=True)
        if result.written is None:  # no copy drawn: nothing to re-tie, nothing written
            assert result.nothing_to_retie and not out.exists()
            out = source
        stored = set(load_file(str(out)))  # the Rust loader accepts the streamed file
        assert stored == {name for name in state if "." not in name}  # every injected copy dropped
        assert result.plan.saved_bytes == sum(t.nbytes for n, t in state.items() if "." in n)
        restored = load_tied(str(out))
    assert_bitwise(state, restored)
    for name in state:
        base, _, kind = name.partition(".")
        if kind == "equal":
            assert restored[name] is restored[base]
        elif kind == "transposed":
            assert shares_storage(restored[name], restored[base])
        elif kind:
            assert not shares_storage(restored[name], restored[base])


def test_import_tieaudit_does_not_import_torch() -> None:
    code = "import sys, tieaudit; tieaudit.__version__; assert 'torch' not in sys.modules; tieaudit.load_tied"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pt_aliases_share_one_storage(corpus: Any) -> None:
    state = load_tied(str(corpus.path("torch_tied_lm")))
    assert shares_storage(state["emb.weight"], state["head.weight"])
    assert_bitwise(torch.load(corpus.path("torch_tied_lm")), state)


def test_pt_transposed_view_stays_a_view(corpus: Any) -> None:
    path = corpus.path("torch_transposed_view")
    state = load_tied(str(path))
    assert shares_storage(state["emb"], state["emb_t"]) and state["emb_t"].stride() == (1, 32)
    assert_bitwise(torch.load(path), state)


def test_pt_bfloat16_bit_for_bit(corpus: Any) -> None:
    path = corpus.path("torch_bf16_tied")
    state = load_tied(str(path))
    assert state["emb.weight"].dtype == torch.bfloat16
    assert_bitwise(torch.load(path), state)


def test_save_model_record_is_the_same_object(corpus: Any) -> None:
    state = load_tied(str(corpus.path("st_save_model_tied")))
    assert state["head.weight"] is state["emb.weight"]


def test_index_record_restored_in_sharded_folder(corpus: Any) -> None:
    state = load_tied(str(corpus.path("hub_sharded_tied")))
    assert state["head.weight"] is state["emb.weight"]
    assert sorted(state) == ["emb.weight", "head.weight", "norm.bias", "norm.weight"]
