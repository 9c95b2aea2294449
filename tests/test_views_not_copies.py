"""A view is not a copy: names viewing one storage are never TIE001 and never wasted bytes, and
what check calls wasted and retie's plan calls saved is what a rewrite really stops writing.

torch.save writes a storage whole while any name views it: nn.LSTM's flatten_parameters keeps the
four weights of a layer as views of one flat buffer, so two equal biases in it are not a copy, and
dropping one of them saves nothing. The plans are checked against the written files for every
writer retie has: the storage bytes of a .pt / .bin zip's ``data/`` members, the data section a
safetensors header declares, the initializer bytes of an ONNX model, each compared exactly (the
containers' own overhead, zip headers and JSON headers, is left out on both sides).
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from safetensors.torch import save_file
from test_retie_bin import llama_bin

from tieaudit.cli.main import main
from tieaudit.repair.retie import _WRITERS

H = 256
"""Hidden size of the LSTM layer: a 4 KiB bias, two 1 MiB weights."""
BIAS_BYTES = 4 * H * 4


def lstm_layer(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One nn.LSTM layer after flatten_parameters: four views of one flat storage, whose two
    biases hold the same values (as when both are initialised from one tensor)."""
    n = 4 * H * H
    flat = torch.randn(2 * n + 8 * H, generator=generator)
    layer = {
        "weight_ih_l0": flat[0:n].view(4 * H, H),
        "weight_hh_l0": flat[n : 2 * n].view(4 * H, H),
        "bias_ih_l0": flat[2 * n : 2 * n + 4 * H],
        "bias_hh_l0": flat[2 * n + 4 * H : 2 * n + 8 * H],
    }
    layer["bias_hh_l0"].copy_(layer["bias_ih_l0"])
    return layer


def check_json(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["check", str(path), "--format", "json"])
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return code, report


def tie001(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["rule"] == "TIE001"]


def retie_saving(source: Path, out: Path, capsys: pytest.CaptureFixture[str], *options: str) -> int | None:
    """Run retie; the saving its plan states, in bytes (None: it said there is nothing to re-tie)."""
    capsys.readouterr()
    assert main(["retie", str(source), str(out), *options]) == 0
    printed = capsys.readouterr()
    text = printed.out + printed.err  # the plan goes to stderr when a file is written
    if "nothing to re-tie" in text:
        assert not out.exists()
        return None
    found = re.search(r"^  saves \S+ \S+ \((\d+) bytes\)$", text, re.MULTILINE)
    assert found is not None, text
    return int(found.group(1))


# ---------------------------------------------------------------- what a container stores


def zip_storage_bytes(path: Path) -> int:
    """Bytes of every storage a torch.save zip holds: its ``<folder>/data/<key>`` members."""
    with zipfile.ZipFile(path) as archive:
        return sum(i.file_size for i in archive.infolist() if i.filename.split("/")[-2:-1] == ["data"])


def safetensors_data_bytes(path: Path) -> int:
    """The data section the header declares: every tensor's [start, end), which tile it."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)) and spans[0][0] == 0
    return int(spans[-1][1])


def onnx_initializer_bytes(path: Path) -> int:
    model = onnx.load(str(path))  # external data resolved beside the model
    return sum(numpy_helper.to_array(init).nbytes for init in model.graph.initializer)


def folder_bytes(measure: Callable[[Path], int], suffix: str) -> Callable[[Path], int]:
    return lambda folder: sum(measure(p) for p in sorted(folder.glob(f"*{suffix}")))


# ---------------------------------------------------------------- views are not copies


def test_equal_views_of_one_storage_are_no_finding_and_nothing_to_retie(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "views.pt"
    torch.save(lstm_layer(torch.Generator().manual_seed(0)), source)
    code, report = check_json(source, capsys)
    assert code == 0, report["findings"]
    assert tie001(report) == [] and report["summary"]["wasted_bytes"] == 0
    for options in ((), ("--all-equal",)):
        assert retie_saving(source, tmp_path / "out.pt", capsys, *options) is None


def test_a_lone_copy_of_a_view_is_dropped_and_the_shared_storage_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layer = lstm_layer(torch.Generator().manual_seed(1))
    # Stored first, so order alone would keep the copy and drop the view, which saves nothing.
    state = {"copy": layer["bias_ih_l0"].clone(), **layer}
    source = tmp_path / "mixed.pt"
    torch.save(state, source)
    code, report = check_json(source, capsys)
    [finding] = tie001(report)
    assert code == 1 and finding["severity"] == "warning"
    assert set(finding["names"]) == {"bias_ih_l0", "copy"}  # bias_hh_l0 is a view, not a copy
    assert finding["details"]["kept"] == "bias_ih_l0"
    assert finding["wasted_bytes"] == report["summary"]["wasted_bytes"] == BIAS_BYTES
    out = tmp_path / "out.pt"
    saved = retie_saving(source, out, capsys)
    assert saved == BIAS_BYTES == zip_storage_bytes(source) - zip_storage_bytes(out)


def test_copies_inside_storages_that_stay_waste_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = lstm_layer(torch.Generator().manual_seed(2))
    second = lstm_layer(torch.Generator().manual_seed(3))
    second["bias_ih_l0"].copy_(first["bias_ih_l0"])  # equal values in two flat buffers
    state = {**{f"l0.{k}": v for k, v in first.items()}, **{f"l1.{k}": v for k, v in second.items()}}
    source = tmp_path / "two.pt"
    torch.save(state, source)
    code, report = check_json(source, capsys)
    [finding] = tie001(report)
    # The values are duplicated (a note says so), but no rewrite can drop either buffer.
    assert code == 0 and finding["severity"] == "note"
    assert finding["wasted_bytes"] == report["summary"]["wasted_bytes"] == 0
    assert "No rewrite saves a byte" in finding["message"]
    assert retie_saving(source, tmp_path / "out.pt", capsys, "--all-equal") is None


def test_a_copy_beside_copies_that_stay_is_counted_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = lstm_layer(torch.Generator().manual_seed(4))
    second = lstm_layer(torch.Generator().manual_seed(5))
    second["bias_ih_l0"].copy_(first["bias_ih_l0"])
    state = {**{f"l0.{k}": v for k, v in first.items()}, **{f"l1.{k}": v for k, v in second.items()}}
    state["lone"] = first["bias_ih_l0"].clone()  # a storage of its own: the one a rewrite drops
    source = tmp_path / "partial.pt"
    torch.save(state, source)
    code, report = check_json(source, capsys)
    [finding] = tie001(report)
    assert code == 1 and finding["severity"] == "warning"
    assert set(finding["names"]) == {"l0.bias_ih_l0", "l1.bias_ih_l0", "lone"}
    assert finding["details"]["stays"] == ["l1.bias_ih_l0"]
    assert finding["wasted_bytes"] == report["summary"]["wasted_bytes"] == BIAS_BYTES
    out = tmp_path / "out.pt"
    saved = retie_saving(source, out, capsys, "--all-equal")
    assert saved == BIAS_BYTES == zip_storage_bytes(source) - zip_storage_bytes(out)


def test_a_storage_is_saved_only_when_every_name_of_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generator = torch.Generator().manual_seed(6)
    table = torch.randn(64, 32, generator=generator)
    copy = table.clone()
    beside = torch.randn(2 * 64 * 32, generator=generator)
    beside[: 64 * 32] = table.flatten()  # the values again, in a storage "rest" keeps written
    state = {
        "table": table,
        "copy": copy,
        "copy_alias": copy,  # one tensor under two names: both go, or its storage stays
        "slice": beside[: 64 * 32].view(64, 32),
        "rest": beside[64 * 32 :],
    }
    source = tmp_path / "names.pt"
    torch.save(state, source)
    code, report = check_json(source, capsys)
    [finding] = tie001(report)
    assert code == 1 and set(finding["names"]) == {"table", "copy", "copy_alias", "slice"}
    # Keeping the slice, whose storage is written anyway, frees both storages of their own.
    assert finding["details"]["kept"] == "slice"
    assert finding["wasted_bytes"] == 2 * table.nbytes
    out = tmp_path / "out.pt"
    saved = retie_saving(source, out, capsys)
    assert saved == 2 * table.nbytes == zip_storage_bytes(source) - zip_storage_bytes(out)
    after = torch.load(out, weights_only=True)
    assert after["copy_alias"] is after["copy"]
    storage = after["slice"].untyped_storage().data_ptr()
    assert {after[n].untyped_storage().data_ptr() for n in ("table", "copy", "rest")} == {storage}


# ---------------------------------------------------------------- every writer: plan == file


def _pt(folder: Path) -> Path:
    """Real copies beside views: an embedding and its cloned head, an LSTM layer whose biases are
    equal views, and a lone copy of one of them (saved) next to the view (not saved)."""
    generator = torch.Generator().manual_seed(7)
    embedding = torch.randn(256, 64, generator=generator)
    layer = lstm_layer(generator)
    state = {"emb.weight": embedding, "head.weight": embedding.clone(), **layer}
    state["bias_copy"] = layer["bias_hh_l0"].clone()
    path = folder / "model.pt"
    torch.save(state, path)
    return path


def _safetensors(folder: Path) -> Path:
    generator = torch.Generator().manual_seed(8)
    embedding = torch.randn(256, 64, generator=generator)
    state = {
        "emb.weight": embedding,
        "head.weight": embedding.clone(),
        "other": torch.randn(99, generator=generator),
    }
    path = folder / "model.safetensors"
    save_file(state, str(path))
    return path


def _onnx(folder: Path) -> Path:
    rng = np.random.default_rng(7)
    table = rng.standard_normal((256, 64)).astype(np.float32)
    initializers = [
        numpy_helper.from_array(table, "emb"),
        numpy_helper.from_array(table.copy(), "head"),  # an equal copy, read by the MatMul
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "mix"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "mix"], ["mixed"]),
        helper.make_node("Gemm", ["mixed", "head"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [8, 256])],
        initializers,
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _hf_bin(folder: Path, *, sharded: bool) -> Path:
    path = folder / "llama"
    llama_bin(path, sharded=sharded)
    return path


def _hf_safetensors(folder: Path) -> Path:
    path = folder / "llama"
    state = llama_bin(path, sharded=False)
    (path / "pytorch_model.bin").unlink()
    save_file(state, str(path / "model.safetensors"))
    return path


WRITERS: dict[str, tuple[str, Callable[[Path], Path], Callable[[Path], int], tuple[str, ...]]] = {
    "torch": ("out.pt", _pt, zip_storage_bytes, ()),
    # a plain safetensors file re-ties an unrecorded equal pair only under --all-equal
    "safetensors": ("out.safetensors", _safetensors, safetensors_data_bytes, ("--all-equal",)),
    "onnx": ("out.onnx", _onnx, onnx_initializer_bytes, ()),
    "hf-dir (safetensors)": (
        "out",
        _hf_safetensors,
        folder_bytes(safetensors_data_bytes, ".safetensors"),
        (),
    ),
    "hf-dir (bin)": ("out", lambda f: _hf_bin(f, sharded=False), folder_bytes(zip_storage_bytes, ".bin"), ()),
    "hf-dir (bin shards)": (
        "out",
        lambda f: _hf_bin(f, sharded=True),
        folder_bytes(zip_storage_bytes, ".bin"),
        (),
    ),
}


def test_every_writer_is_measured_here() -> None:
    assert {case.split(" ")[0] for case in WRITERS} == set(_WRITERS)


@pytest.mark.parametrize("case", list(WRITERS))
def test_the_plan_states_what_the_written_file_saves(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_name, build, measure, options = WRITERS[case]
    (tmp_path / "in").mkdir()
    source = build(tmp_path / "in")
    out = tmp_path / out_name
    saved = retie_saving(source, out, capsys, *options)
    assert saved is not None and saved > 0
    assert measure(source) - measure(out) == saved
    _, report = check_json(source, capsys)
    # check's wasted bytes are what the same rewrite saves (every copy here is one retie applies)
    assert report["summary"]["wasted_bytes"] == saved, report["findings"]
