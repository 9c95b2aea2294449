"""Issue 23, point 4: nothing torch.load returns is silently dropped by inspect, check, convert or retie.

Each file is made by torch.save. Every tensor kind tieaudit does not read as values (quantized,
sparse, nested, meta, complex32, conj- and neg-bit views, bit and 4-bit dtypes) sits beside an
embedding and an untied copy of it: inspect and check must list the kind by name and still audit
the rest (the copy is found); convert must refuse in one line naming it, writing nothing; retie
must write it back as torch.load returned it (checked here with torch's own accessors) and must
refuse, naming it, an output that lost or changed it. Names that collide once nested keys are
joined with '.' are refused by every command, naming the name. Verification compares the reference
loader's reading of the output with its reading of the input, not with tieaudit's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tieaudit.cli.main import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch: ComplexHalf, nested, TypedStorage

torch.manual_seed(0)
EMBEDDING = torch.randn(64, 16)


def _kinds() -> dict[str, Callable[[], Any]]:
    def quantized_channel() -> torch.Tensor:
        scales, zeros = torch.rand(8, dtype=torch.float64) + 0.01, torch.zeros(8, dtype=torch.long)
        return torch.quantize_per_channel(torch.randn(8, 8), scales, zeros, 0, torch.qint8)

    return {
        "complex32": lambda: torch.randn(8, 8, dtype=torch.complex64).to(torch.complex32),
        "conj_view": lambda: torch.randn(8, 8, dtype=torch.complex64).conj(),
        "neg_view": lambda: torch._neg_view(torch.randn(8, 8)),
        "meta": lambda: torch.empty(8, 8, device="meta"),
        "quantized_tensor": lambda: torch.quantize_per_tensor(torch.randn(8, 8), 0.1, 3, torch.quint8),
        "quantized_channel": quantized_channel,
        "sparse_coo": lambda: torch.randn(8, 8).relu().to_sparse(),
        "sparse_csr": lambda: torch.randn(8, 8).relu().to_sparse_csr(),
        "sparse_csc": lambda: torch.randn(8, 8).relu().to_sparse_csc(),
        "sparse_bsr": lambda: torch.randn(8, 8).relu().to_sparse_bsr((2, 2)),
        "sparse_bsc": lambda: torch.randn(8, 8).relu().to_sparse_bsc((2, 2)),
        "nested": lambda: torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]),
        "bits8": lambda: torch.randint(0, 255, (8, 8), dtype=torch.uint8).view(torch.bits8),
        "float4_x2": lambda: torch.randint(0, 255, (8, 4), dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        "float8_e8m0": lambda: torch.rand(8, 8).to(torch.float8_e8m0fnu),
        "quantized_parameter": lambda: torch.nn.Parameter(
            torch.quantize_per_tensor(torch.randn(4, 4), 0.5, 1, torch.quint8), requires_grad=False
        ),
        "sparse_with_attribute": _sparse_with_attribute,
    }


def _sparse_with_attribute() -> torch.Tensor:
    tensor = torch.randn(8, 8).relu().to_sparse()
    tensor.note = "saved through _rebuild_from_type_v2"  # type: ignore[attr-defined]
    return tensor


KINDS = _kinds()
EXPECTED_KIND = {
    "complex32": "dtype numpy cannot view",
    "conj_view": "conj bit set",
    "neg_view": "neg bit set",
    "meta": "meta (no data)",
    "quantized_tensor": "quantized (per_tensor_affine)",
    "quantized_channel": "quantized (per_channel_affine)",
    "sparse_coo": "sparse (sparse_coo)",
    "sparse_csr": "sparse (sparse_csr)",
    "sparse_csc": "sparse (sparse_csc)",
    "sparse_bsr": "sparse (sparse_bsr)",
    "sparse_bsc": "sparse (sparse_bsc)",
    "nested": "nested (2 components)",
    "bits8": "dtype numpy cannot view",
    "float4_x2": "dtype numpy cannot view",
    "float8_e8m0": "dtype numpy cannot view",
    "quantized_parameter": "quantized (per_tensor_affine)",
    "sparse_with_attribute": "sparse (sparse_coo)",
}


def _checkpoint(tmp_path: Path, kind: str) -> tuple[Path, dict[str, Any]]:
    state = {"wte.weight": EMBEDDING.clone(), "head.weight": EMBEDDING.clone(), "odd": KINDS[kind]()}
    path = tmp_path / f"{kind}.pt"
    torch.save(state, path)
    return path, state


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: "), lines
    return lines[0]


def _same(torch_value: Any, other: Any) -> bool:
    """Equal as torch gives them back: kind, metadata and every stored value (torch's own accessors)."""
    if type(torch_value) is not type(other):
        return False
    facts = (torch_value.dtype, torch_value.layout, torch_value.device, torch_value.requires_grad)
    if facts != (other.dtype, other.layout, other.device, other.requires_grad):
        return False
    if torch_value.is_nested:
        pairs = zip(torch_value.unbind(), other.unbind(), strict=True)
        return all(torch.equal(a, b) for a, b in pairs)
    if torch_value.shape != other.shape or torch_value.is_conj() != other.is_conj():
        return False
    if torch_value.is_neg() != other.is_neg() or torch_value.device.type == "meta":
        return torch_value.is_neg() == other.is_neg()
    if torch_value.is_quantized:
        return torch.equal(torch_value.int_repr(), other.int_repr()) and torch.equal(
            torch_value.dequantize(), other.dequantize()
        )
    if torch_value.layout != torch.strided:
        return torch.equal(torch_value.to_dense(), other.to_dense())
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[torch_value.element_size()]
    return torch.equal(
        torch_value.resolve_conj().resolve_neg().view(width), other.resolve_conj().resolve_neg().view(width)
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_inspect_and_check_list_every_tensor_kind_and_audit_the_rest(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _checkpoint(tmp_path, kind)
    assert main(["inspect", "--format", "json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["unread_tensors"]
    assert (entry["name"], entry["kind"]) == ("odd", EXPECTED_KIND[kind])
    assert {t["name"] for t in report["tensors"]} == {"wte.weight", "head.weight"}
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "1 tensor listed but not read" in text and f"odd ({EXPECTED_KIND[kind]}" in text
    assert main(["check", str(path)]) == 1  # the untied copy beside it is still found
    out = capsys.readouterr().out
    assert "TIE001" in out and f"odd ({EXPECTED_KIND[kind]}" in out


@pytest.mark.parametrize("kind", list(KINDS))
def test_convert_refuses_every_tensor_kind_it_cannot_write_naming_it(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _checkpoint(tmp_path, kind)
    before = path.read_bytes()
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(path), str(out)]) == 2
    line = _one_error(capsys)
    assert "'odd' is a tensor safetensors cannot hold" in line and EXPECTED_KIND[kind] in line, line
    assert not out.exists() and path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [path.name]


@pytest.mark.parametrize("kind", list(KINDS))
def test_retie_writes_every_tensor_kind_back_as_torch_load_returned_it(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _checkpoint(tmp_path, kind)
    out = tmp_path / "out.pt"
    assert main(["retie", str(path), str(out)]) == 0, capsys.readouterr().err
    before, after = torch.load(path, weights_only=True), torch.load(out, weights_only=True)
    assert list(after) == ["wte.weight", "head.weight", "odd"]
    assert after["head.weight"].data_ptr() == after["wte.weight"].data_ptr()  # the copy re-tied
    assert _same(before["odd"], after["odd"])
    assert getattr(after["odd"], "note", None) == getattr(before["odd"], "note", None)


def _doubled_values(csr: torch.Tensor) -> torch.Tensor:
    return torch.sparse_csr_tensor(csr.crow_indices(), csr.col_indices(), csr.values() * 2, csr.shape)


def _losing_writer(monkeypatch: pytest.MonkeyPatch, change: Callable[[dict[str, Any]], None]) -> None:
    """retie's torch writer, with change applied to the loaded checkpoint before torch.save: an
    output that lost or changed an entry tieaudit's own reader does not compare. (A change must put
    a new object in place: the sink writes a memory-mapped input storage from the file itself.)"""
    import tieaudit.repair.torch_writer as writer

    real_save = writer.save

    def save(torch_module: Any, root: Any, out: str, **kwargs: Any) -> None:
        change(root)
        real_save(torch_module, root, out, **kwargs)

    monkeypatch.setattr(writer, "save", save)


LOSSES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "drops_a_quantized_tensor": ("quantized_tensor", lambda root: root.pop("odd")),
    "changes_a_quantized_scale": (
        "quantized_tensor",
        lambda root: root.__setitem__(
            "odd", torch.quantize_per_tensor(root["odd"].dequantize(), 0.2, 3, torch.quint8)
        ),
    ),
    "drops_a_sparse_tensor": ("sparse_coo", lambda root: root.pop("odd")),
    "changes_a_sparse_value": (
        "sparse_csr",
        lambda root: root.__setitem__("odd", _doubled_values(root["odd"])),
    ),
    "clears_a_conj_bit": ("conj_view", lambda root: root.__setitem__("odd", root["odd"].resolve_conj())),
    "changes_complex32_bits": (
        "complex32",
        lambda root: root.__setitem__("odd", (root["odd"].view(torch.int32) + 1).view(torch.complex32)),
    ),
    "reshapes_a_meta_tensor": (
        "meta",
        lambda root: root.__setitem__("odd", torch.empty(4, 16, device="meta")),
    ),
    "drops_a_nested_tensor": ("nested", lambda root: root.pop("odd")),
    "drops_a_non_tensor_value": ("meta", lambda root: root.__setitem__("odd", 3)),
}


@pytest.mark.parametrize("loss", list(LOSSES))
def test_retie_refuses_an_output_that_lost_or_changed_an_entry_naming_it(
    loss: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kind, change = LOSSES[loss]
    path, _ = _checkpoint(tmp_path, kind)
    before = path.read_bytes()
    _losing_writer(monkeypatch, change)
    out = tmp_path / "out.pt"
    assert main(["retie", str(path), str(out)]) == 2
    line = _one_error(capsys)
    assert "odd" in line and "nothing was written" in line, line
    assert not out.exists() and path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [path.name]


def test_retie_refuses_an_output_that_lost_a_value_of_a_training_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.pt"
    torch.save(
        {"model": {"wte.weight": EMBEDDING.clone(), "head.weight": EMBEDDING.clone()}, "epoch": 7}, path
    )
    _losing_writer(monkeypatch, lambda root: root.__setitem__("epoch", 8))
    assert main(["retie", str(path), str(tmp_path / "out.pt")]) == 2
    assert "epoch holds another value in the output" in _one_error(capsys)


def _swapped_reading(monkeypatch: pytest.MonkeyPatch, reader: Any, first: str, second: str) -> None:
    """A reader that takes first's bytes for second's and back (a reader bug): convert copies what
    tieaudit reads, so tieaudit's own reading of the output agrees with it; only the reference
    loader's reading of the input can notice."""
    real_read = reader.read

    def read(self: Any, path: str) -> Any:
        opened = real_read(self, path)
        by_name = {t.name: t for t in opened.checkpoint.tensors}
        swap = {first: by_name[second].storage_id, second: by_name[first].storage_id}
        tensors = tuple(
            dataclasses.replace(t, storage_id=swap[t.name]) if t.name in swap else t
            for t in opened.checkpoint.tensors
        )
        opened.checkpoint = dataclasses.replace(opened.checkpoint, tensors=tensors)
        return opened

    monkeypatch.setattr(reader, "read", read)


@pytest.mark.parametrize("direction", ["to_safetensors", "to_torch"])
def test_verification_compares_with_the_loader_s_reading_of_the_input_not_tieaudit_s(
    direction: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tieaudit.formats.safetensors import SafetensorsReader
    from tieaudit.formats.torch_file import TorchReader

    state = {"a": torch.randn(16), "b": torch.randn(16)}
    reader: Any
    if direction == "to_safetensors":
        path, out, reader = tmp_path / "in.pt", tmp_path / "out.safetensors", TorchReader
        torch.save(state, path)
    else:
        path, out, reader = tmp_path / "in.safetensors", tmp_path / "out.pt", SafetensorsReader
        save_file(state, str(path))
    _swapped_reading(monkeypatch, reader, "a", "b")
    assert main(["convert", str(path), str(out)]) == 2
    line = _one_error(capsys)
    assert "differs between tieaudit's reading of the input and the reference loader's" in line, line
    assert not out.exists()


COLLISIONS: dict[str, tuple[Callable[[], Any], str]] = {
    "nested_key_and_dotted_key": (lambda: {"a": {"b": torch.ones(4)}, "a.b": torch.zeros(4)}, "a.b"),
    "int_key_and_str_key": (lambda: {0: torch.ones(4), "0": torch.zeros(4)}, "0"),
    "list_index_and_dotted_key": (
        lambda: {"layers": [torch.ones(4)], "layers.0": torch.zeros(4)},
        "layers.0",
    ),
    "bool_key_and_str_key": (lambda: {True: torch.ones(4), "True": torch.zeros(4)}, "True"),
    "tensor_and_value": (lambda: {"a": {"b": 1}, "a.b": torch.zeros(4)}, "a.b"),
    "optimizer_state_int_and_str_keys": (
        lambda: {
            "model": {"w": torch.ones(4)},
            "optimizer": {
                "state": {0: {"exp_avg": torch.ones(4)}, "0": {"exp_avg": torch.zeros(4)}},
                "param_groups": [{"params": [0], "lr": 0.1}],
            },
        },
        "optimizer.state.0.exp_avg",
    ),
}


@pytest.mark.parametrize("case", list(COLLISIONS))
@pytest.mark.parametrize("command", ["inspect", "check", "convert", "retie"])
def test_names_that_collide_after_flattening_are_refused_naming_the_name(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, name = COLLISIONS[case]
    path = tmp_path / "collide.pt"
    torch.save(build(), path)
    out = tmp_path / ("out.safetensors" if command == "convert" else "out.pt")
    argv = [command, str(path)] + ([str(out)] if command in ("convert", "retie") else [])
    assert main(argv) == 2
    line = _one_error(capsys)
    assert f"two entries are named '{name}'" in line, line
    assert sorted(os.listdir(tmp_path)) == ["collide.pt"]


def test_a_trainer_folder_whose_weights_and_optimizer_give_one_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    save_file(
        {"w": torch.ones(4), "optimizer.state.0.exp_avg": torch.ones(4)}, str(folder / "model.safetensors")
    )
    torch.save(
        {"state": {0: {"exp_avg": torch.zeros(4)}}, "param_groups": [{"params": [0]}]},
        folder / "optimizer.pt",
    )
    for command in ("inspect", "check"):
        assert main([command, str(folder)]) == 2
        line = _one_error(capsys)
        assert "two tensors are named 'optimizer.state.0.exp_avg'" in line, line


def test_a_shard_index_naming_one_tensor_twice_is_refused_not_read_last_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": False}))
    save_file({"w": torch.ones(4)}, str(folder / "a.safetensors"))
    save_file({"w": torch.zeros(4), "v": torch.ones(4)}, str(folder / "b.safetensors"))
    # json.load (transformers) keeps the last 'w' (b's); a reader keeping the first would load a's.
    index = (
        '{"metadata": {}, "weight_map": {"w": "a.safetensors", "v": "b.safetensors", "w": "b.safetensors"}}'
    )
    (folder / "model.safetensors.index.json").write_text(index)
    for argv in (["inspect", str(folder)], ["retie", str(folder), str(tmp_path / "out")]):
        assert main(argv) == 2
        assert "the key 'w' appears twice in one object" in _one_error(capsys)
    assert sorted(os.listdir(tmp_path)) == ["sharded"]


def _onnx_model(path: Path) -> None:
    """An embedding, an untied copy of it as the head, and initializers tieaudit does not read."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = EMBEDDING.numpy()
    initializers = [
        numpy_helper.from_array(weight, "emb"),
        numpy_helper.from_array(weight.copy(), "head"),
        helper.make_tensor("labels", TensorProto.STRING, [2], [b"cat", b"dog"]),  # type: ignore[list-item]  # stubs: numbers only
        helper.make_tensor("nibbles", TensorProto.INT4, [4], [1, -2, 3, -4]),
        numpy_helper.from_array(np.arange(3, dtype=np.int64), "ids"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "x"], ["hidden"]),
        helper.make_node("Transpose", ["head"], ["head_t"]),
        helper.make_node("MatMul", ["hidden", "head_t"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _edited_onnx_output(monkeypatch: pytest.MonkeyPatch, edit: Callable[[Any], None]) -> None:
    """retie's ONNX writer, with edit applied to the written graph: an output that lost or changed
    a tensor tieaudit's own reader skips (strings, 4-bit types)."""
    import onnx

    from tieaudit.repair.onnx_writer import OnnxWriter

    real_write = OnnxWriter.write

    def write(self: Any, opened: Any, plan: Any, out: str) -> list[str]:
        files: list[str] = real_write(self, opened, plan, out)
        model = onnx.load(out)
        edit(model.graph)
        onnx.save(model, out)
        return files

    monkeypatch.setattr(OnnxWriter, "write", write)


def _drop_labels(graph: Any) -> None:
    kept = [init for init in graph.initializer if init.name != "labels"]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _rename_a_label(graph: Any) -> None:
    labels = next(init for init in graph.initializer if init.name == "labels")
    labels.string_data[1] = b"cow"


def _change_nibbles(graph: Any) -> None:
    from onnx import TensorProto, helper

    nibbles = next(init for init in graph.initializer if init.name == "nibbles")
    nibbles.CopyFrom(helper.make_tensor("nibbles", TensorProto.INT4, [4], [1, -2, 3, 5]))


def test_retie_of_onnx_carries_the_tensors_tieaudit_does_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnx
    from onnx import numpy_helper

    source, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    _onnx_model(source)
    assert main(["retie", str(source), str(out), "--all-equal"]) == 0, capsys.readouterr().err
    before = {i.name: i for i in onnx.load(str(source)).graph.initializer}
    after = {i.name: i for i in onnx.load(str(out)).graph.initializer}
    for name in ("labels", "nibbles", "ids"):
        assert (numpy_helper.to_array(after[name]) == numpy_helper.to_array(before[name])).all()


@pytest.mark.parametrize(
    "edit",
    [_drop_labels, _rename_a_label, _change_nibbles],
    ids=["drops_strings", "changes_strings", "changes_int4"],
)
def test_retie_of_onnx_refuses_an_output_that_lost_or_changed_a_tensor_it_does_not_read(
    edit: Callable[[Any], None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    _onnx_model(source)
    _edited_onnx_output(monkeypatch, edit)
    assert main(["retie", str(source), str(out), "--all-equal"]) == 2
    line = _one_error(capsys)
    assert ("labels" in line or "nibbles" in line) and "nothing was written" in line, line
    assert not out.exists()


def test_a_dtype_key_is_named_as_torch_names_it_so_both_readings_hold_one_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, out = tmp_path / "by_dtype.pt", tmp_path / "out.pt"
    state = {
        "wte.weight": EMBEDDING.clone(),
        "head.weight": EMBEDDING.clone(),
        "scales": {torch.float16: torch.ones(3)},
    }
    torch.save(state, path)
    assert main(["inspect", "--format", "json", str(path)]) == 0
    names = {t["name"] for t in json.loads(capsys.readouterr().out)["tensors"]}
    assert "scales.torch.float16" in names  # str(torch.float16), the key torch.load gives back
    assert main(["retie", str(path), str(out)]) == 0, capsys.readouterr().err
    assert torch.equal(torch.load(out, weights_only=True)["scales"][torch.float16], torch.ones(3))
