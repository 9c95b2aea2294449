"""The copy detector: each relation found, and the look-alikes that must not be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.records import TensorInfo
from tieaudit.formats.safetensors import SafetensorsReader
from tieaudit.graph import detect
from tieaudit.graph.detect import find_copies


def copies(tmp_path: Path, tensors: dict[str, torch.Tensor], **kwargs: object) -> list[tuple[str, str, str]]:
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    with SafetensorsReader().read(str(path)) as opened:
        groups = find_copies(opened, **kwargs)  # type: ignore[arg-type]
    return sorted((g.kept, m.name, m.relation) for g in groups for m in g.members)


@pytest.fixture
def emb() -> torch.Tensor:
    return torch.randn(500, 64, generator=torch.Generator().manual_seed(0))


def test_equal_copy_found_and_embedding_kept(tmp_path: Path, emb: torch.Tensor) -> None:
    found = copies(tmp_path, {"lm_head.weight": emb.clone(), "model.embed_tokens.weight": emb})
    assert found == [("model.embed_tokens.weight", "lm_head.weight", "equal")]


def test_transposed_copy_found(tmp_path: Path, emb: torch.Tensor) -> None:
    found = copies(tmp_path, {"wte": emb, "onnx::MatMul_1": emb.t()})
    assert found == [("wte", "onnx::MatMul_1", "transposed")]


@pytest.mark.parametrize("rows", [5000, 7])  # the wide one read as strips by pread; a tiny one
def test_a_transposed_copy_is_compared_through_strips_read_by_pread(tmp_path: Path, rows: int) -> None:
    """Strips of the wide matrix come from read_runs (no page of the map touched), for either
    order of the pair; a last-element difference is still seen."""
    from tieaudit.core.bytestore import ByteStore

    wide = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1))
    calls: list[int] = []
    original = ByteStore.read_runs

    def counted(self: ByteStore, *args: object, **kwargs: object) -> bool:
        calls.append(1)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    ByteStore.read_runs = counted  # type: ignore[method-assign]
    try:
        assert copies(tmp_path, {"a": wide, "b": wide.t()}) == [("a", "b", "transposed")]
        assert calls
        changed = wide.t().contiguous()
        changed[-1, -1] += 1
        assert copies(tmp_path, {"a": wide, "b": changed}) == []
    finally:
        ByteStore.read_runs = original  # type: ignore[method-assign]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cast_copy_found_and_wide_kept(tmp_path: Path, emb: torch.Tensor, dtype: torch.dtype) -> None:
    found = copies(tmp_path, {"a_half": emb.to(dtype), "b_full": emb})
    assert found == [("b_full", "a_half", "cast")]


def test_three_equal_copies_go_through_the_hash_stage(
    tmp_path: Path, emb: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[str] = []
    real = detect.full_hash

    def spy(opened: OpenCheckpoint, tensor: TensorInfo) -> bytes:
        hashed.append(tensor.name)
        return real(opened, tensor)

    monkeypatch.setattr(detect, "full_hash", spy)
    other = emb.clone()
    other[499, 63] += 1  # same fingerprint (unsampled element), different bytes
    found = copies(tmp_path, {"a": emb, "b": emb.clone(), "c": emb.clone(), "d": other})
    assert found == [("a", "b", "equal"), ("a", "c", "equal")]
    assert sorted(hashed) == ["a", "b", "c", "d"]  # the four sample-equal tensors were hashed, once each


def test_two_sample_equal_tensors_skip_the_hash_stage(
    tmp_path: Path, emb: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detect, "full_hash", lambda *_: pytest.fail("hashed a pair"))
    assert copies(tmp_path, {"a": emb, "b": emb.clone()}) == [("a", "b", "equal")]


def test_difference_outside_the_samples_is_not_a_copy(tmp_path: Path, emb: torch.Tensor) -> None:
    other = emb.clone()
    other[250, 17] = -other[250, 17]
    assert copies(tmp_path, {"a": emb, "b": other}) == []


def test_constant_tensors_are_never_candidates(tmp_path: Path) -> None:
    found = copies(
        tmp_path,
        {
            "ln1.weight": torch.ones(2048),
            "ln2.weight": torch.ones(2048),
            "bias1": torch.zeros(4096),
            "bias2": torch.zeros(4096),
            "lora_b1": torch.zeros(64, 64),
            "lora_b2": torch.zeros(64, 64),
        },
    )
    assert found == []


def test_small_tensors_are_below_the_threshold(tmp_path: Path) -> None:
    small = torch.randn(8, 8)
    assert copies(tmp_path, {"a": small, "b": small.clone()}) == []
    assert copies(tmp_path, {"a": small, "b": small.clone()}, min_bytes=16) == [("a", "b", "equal")]


def test_a_non_constant_bias_is_a_candidate(tmp_path: Path) -> None:
    bias = torch.randn(1000)
    assert copies(tmp_path, {"cls.predictions.bias": bias, "cls.predictions.decoder.bias": bias.clone()}) == [
        ("cls.predictions.bias", "cls.predictions.decoder.bias", "equal")
    ]


def test_albert_like_transposed_shapes_with_different_values(tmp_path: Path) -> None:
    found = copies(
        tmp_path,
        {
            "predictions.dense.weight": torch.randn(128, 256),
            "embedding_hidden_mapping_in.weight": torch.randn(256, 128),
        },
    )
    assert found == []


def test_signed_zero_is_a_different_byte(tmp_path: Path) -> None:
    zeros = torch.zeros(32, 64)
    zeros[0, 0] = 1.0  # not constant
    negative = zeros.clone()
    negative[5, 5] = -0.0
    assert copies(tmp_path, {"a": zeros, "b": negative}) == []


def test_nan_payloads_must_match(tmp_path: Path, emb: torch.Tensor) -> None:
    a = emb.clone()
    b = emb.clone()
    bits_a = a.view(torch.int32)
    bits_b = b.view(torch.int32)
    bits_a[3, 3] = 0x7FC00001
    bits_b[3, 3] = 0x7FC00002
    assert copies(tmp_path, {"a": a, "b": b}) == []
    assert copies(tmp_path, {"a": a, "b": a.clone()}) == [("a", "b", "equal")]


def test_symmetric_square_copy_is_equal_not_transposed(tmp_path: Path) -> None:
    m = torch.randn(64, 64)
    sym = m + m.t()
    assert copies(tmp_path, {"a": sym, "b": sym.clone()}) == [("a", "b", "equal")]


def test_relations_can_be_limited(tmp_path: Path, emb: torch.Tensor) -> None:
    tensors = {"wte": emb, "t": emb.t(), "h": emb.half()}
    assert copies(tmp_path, tensors, relations={"equal"}) == []
    assert copies(tmp_path, tensors, relations={"cast"}) == [("wte", "h", "cast")]


def test_mixed_group_composes_relations(tmp_path: Path, emb: torch.Tensor) -> None:
    found = copies(tmp_path, {"wte": emb, "copy": emb.clone(), "t": emb.t(), "h": emb.half()})
    assert found == [("wte", "copy", "equal"), ("wte", "h", "cast"), ("wte", "t", "transposed")]


def test_views_are_read_only(tmp_path: Path, emb: torch.Tensor) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"a": emb}, str(path))
    with SafetensorsReader().read(str(path)) as opened:
        array = opened.array(opened.checkpoint.tensors[0])
        assert not array.flags.writeable
        assert np.array_equal(array, emb.numpy())
