"""retie and convert keep everything but the copies: each storage's recorded location (``cuda:0``
stays ``cuda:0``, though no GPU is here), dtypes, strides, storage offsets, and the non-tensor
entries in their order, at the top level and nested.

The inputs record their storages on ``cuda:0`` (or a mix of ``cpu``, ``cuda:0`` and ``cuda:1``)
without a GPU: they are saved on the CPU through a tagger of torch's own registry
(``torch.serialization.register_package``) that answers, while ``recorded_at`` is active, the
location chosen for each storage. Locations are read back the way ``torch.load`` hands them
over, before any device is touched: a ``map_location`` callable, told each storage's recorded
location, that leaves the storage where it is.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from test_retie_bin import EMBED, HEAD, llama_bin
from torch import nn

from tieaudit.cli.main import main
from tieaudit.repair.retie import retie

_chosen: dict[int, str] | None = None
"""Storage (``_cdata``) -> the location to record, while ``recorded_at`` is active."""


def _tag(storage: Any) -> str | None:
    return None if _chosen is None else _chosen.get(storage._cdata)


torch.serialization.register_package(-2_000_011, _tag, lambda storage, location: None)


@contextmanager
def recorded_at(where: dict[int, str]) -> Iterator[None]:
    global _chosen
    _chosen = where
    try:
        yield
    finally:
        _chosen = None


def save_recorded(obj: Any, path: Path, location: Callable[[str], str], **options: Any) -> None:
    """torch.save(obj), each tensor's storage recorded at location(its dotted name)."""
    where: dict[int, str] = {}
    for name, value in leaves(obj):
        if isinstance(value, torch.Tensor):
            where.setdefault(value.untyped_storage()._cdata, location(name))
    with recorded_at(where):
        torch.save(obj, path, **options)


def load_recorded(path: Path) -> tuple[Any, dict[int, str]]:
    """torch.load of path onto the CPU, and the location the file records for each storage."""
    recorded: dict[int, str] = {}

    def note(storage: Any, location: str) -> Any:
        recorded[storage._cdata] = location
        return storage

    return torch.load(path, map_location=note, weights_only=True), recorded


def leaves(value: Any, name: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, value) of every container and leaf, in order; a container's value is its type
    and keys (or length), so that order and kind are compared as well as the leaves."""
    if isinstance(value, dict):
        metadata = getattr(value, "_metadata", None)  # what a state_dict's OrderedDict carries
        yield name, (type(value).__name__, list(value), metadata)
        for key, item in value.items():
            yield from leaves(item, f"{name}.{key}" if name else str(key))
    elif isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        yield name, (type(value).__name__, len(value))
        for index, item in enumerate(value):
            yield from leaves(item, f"{name}.{index}" if name else str(index))
    else:
        yield name, value


def described(obj: Any, recorded: dict[int, str]) -> dict[str, Any]:
    """Every entry by dotted name: a tensor as its recorded location, dtype, shape, stride, storage
    offset, requires_grad and bytes; anything else as its type and value."""
    found: dict[str, Any] = {}
    for name, value in leaves(obj):
        if isinstance(value, torch.Tensor):
            found[name] = {
                "location": recorded[value.untyped_storage()._cdata],
                "dtype": value.dtype,
                "shape": tuple(value.shape),
                "stride": value.stride(),
                "offset": value.storage_offset(),
                "requires_grad": value.requires_grad,
                "bytes": value.detach().contiguous().reshape(-1).view(torch.uint8).tolist(),
            }
        else:
            found[name] = (type(value).__name__, value)
    return found


def assert_preserved(source: Path, out: Path, dropped: dict[str, str]) -> None:
    """out holds source's entries in source's order, each as it was, except that each dropped
    name is now its kept tensor (its storage, location and offset; its own shape and stride)."""
    before_obj, before_where = load_recorded(source)
    after_obj, after_where = load_recorded(out)
    before, after = described(before_obj, before_where), described(after_obj, after_where)
    assert list(after) == list(before)  # every name, container and leaf, in the same order
    for name, was in before.items():
        if name in dropped:
            kept = before[dropped[name]]
            was = {**was, "location": kept["location"], "offset": kept["offset"]}
        assert after[name] == was, name


# ---------------------------------------------------------------- inputs


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(128, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 128, bias=False)


def checkpoint() -> dict[str, Any]:
    """A training checkpoint with an equal copy (the head cloned from the embedding) and the rest
    of what a checkpoint holds: dtypes, a transposed view, a view at an offset, optimizer state of
    another module, nested plain values in a chosen order."""
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.head.weight.copy_(model.emb.weight)
    other = nn.Linear(16, 8)
    optimizer = torch.optim.Adam(other.parameters(), lr=1e-3)
    other(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    big = torch.randn(40, 64)
    return {
        "epoch": 7,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "tables": {
            "half": torch.randn(48, 32).half(),
            "brain": torch.randn(48, 32).bfloat16(),
            "ids": torch.arange(300, dtype=torch.int64),
            "transposed": big.t(),  # stride (1, 64)
            "rows": big[10:30],  # storage offset 640
            "param": nn.Parameter(torch.randn(24, 24)),
        },
        "notes": {"name": "run-3", "lr": 0.25, "done": False, "none": None, "shape": torch.Size([2, 3])},
        "history": [1, 2.5, "three", (4, "five")],
        "z": "last",
    }


DROPPED = {"model.head.weight": "model.emb.weight"}


def everywhere(_: str) -> str:
    return "cuda:0"


def mixed(name: str) -> str:
    """cuda:0 for the model, cuda:1 for the optimizer, cpu for the rest."""
    return "cuda:0" if name.startswith("model.") else "cuda:1" if name.startswith("optimizer.") else "cpu"


def test_the_inputs_record_what_they_should(tmp_path: Path) -> None:
    source = tmp_path / "in.pt"
    save_recorded(checkpoint(), source, mixed)
    obj, recorded = load_recorded(source)
    found = described(obj, recorded)
    assert found["model.emb.weight"]["location"] == "cuda:0"
    assert found["optimizer.state.0.exp_avg"]["location"] == "cuda:1"
    assert found["tables.rows"]["location"] == "cpu" and found["tables.rows"]["offset"] == 640
    assert found["tables.transposed"]["stride"] == (1, 64)
    assert isinstance(obj["model"], collections.OrderedDict) and getattr(obj["model"], "_metadata", None)


@pytest.mark.parametrize("location", [everywhere, mixed], ids=["cuda", "mixed"])
@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_retie_keeps_locations_layouts_and_entries(
    location: Callable[[str], str], zipped: bool, tmp_path: Path
) -> None:
    source, out = tmp_path / "in.pt", tmp_path / "out.pt"
    save_recorded(checkpoint(), source, location, _use_new_zipfile_serialization=zipped)
    result = retie(str(source), str(out))
    assert {d.dropped: d.kept for d in result.plan.applied} == DROPPED
    assert_preserved(source, out, DROPPED)


def test_retie_moves_a_copy_to_the_location_of_the_tensor_it_keeps(tmp_path: Path) -> None:
    source, out = tmp_path / "in.pt", tmp_path / "out.pt"
    save_recorded(checkpoint(), source, lambda name: "cpu" if name == "model.head.weight" else "cuda:0")
    assert main(["retie", str(source), str(out)]) == 0
    obj, recorded = load_recorded(out)
    head, emb = obj["model"]["head.weight"], obj["model"]["emb.weight"]
    assert head.untyped_storage().data_ptr() == emb.untyped_storage().data_ptr()
    assert recorded[head.untyped_storage()._cdata] == "cuda:0"  # one storage, where the kept one was
    assert_preserved(source, out, DROPPED)


def on_device(index: int) -> Callable[[str], str]:
    return lambda _: f"cuda:{index}"


@pytest.mark.parametrize("sharded", [False, True], ids=["bin", "shards"])
def test_retie_of_a_bin_folder_keeps_locations(sharded: bool, tmp_path: Path) -> None:
    folder, out = tmp_path / "llama", tmp_path / "out"
    llama_bin(folder, sharded=sharded)
    files = sorted(p.name for p in folder.glob("*.bin"))
    for index, file in enumerate(files):  # the shards recorded on two devices
        state = torch.load(folder / file, weights_only=True)
        (folder / file).unlink()
        save_recorded(state, folder / file, on_device(index))
    result = retie(str(folder), str(out))
    assert [(d.dropped, d.kept) for d in result.plan.applied] == [(HEAD, EMBED)]
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for side, found in ((folder, before), (out, after)):
        for file in sorted(p.name for p in side.glob("*.bin")):
            found.update(described(*load_recorded(side / file)))
    for name, was in before.items():
        if name == HEAD:
            was = {**was, "location": before[EMBED]["location"], "offset": before[EMBED]["offset"]}
        if name:  # "": each file's top-level container (a shard's keys change when the head moves)
            assert after[name] == was, name


def test_convert_to_pt_writes_what_safetensors_holds(tmp_path: Path) -> None:
    """safetensors records no device: the .pt convert writes records each storage as ``cpu``,
    with each tensor's dtype, shape and bytes, and a recorded tie as the kept tensor itself."""
    torch.manual_seed(1)
    table = torch.randn(64, 32)
    state = {
        "emb.weight": table,
        "half": torch.randn(16, 8).half(),
        "brain": torch.randn(16, 8).bfloat16(),
        "ids": torch.arange(50, dtype=torch.int64),
    }
    source, out = tmp_path / "in.safetensors", tmp_path / "out.pt"
    save_file(state, str(source), metadata={"head.weight": "emb.weight"})
    assert main(["convert", str(source), str(out)]) == 0
    obj, recorded = load_recorded(out)
    assert set(obj) == {*state, "head.weight"}
    assert obj["head.weight"] is obj["emb.weight"]
    for name, tensor in obj.items():
        expected = state["emb.weight" if name == "head.weight" else name]
        assert recorded[tensor.untyped_storage()._cdata] == "cpu", name
        assert (tensor.dtype, tensor.shape, tensor.stride()) == (
            expected.dtype,
            expected.shape,
            expected.stride(),
        )
        assert torch.equal(tensor, expected), name
