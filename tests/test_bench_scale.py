"""bench/scale.py's inputs are what they claim, at tiny sizes: the shards and index of a Hugging Face
folder agree, sparse files have their full apparent size on little disk, the ONNX models load with
onnx.load (embedded and external), and each planted lm_head equals its embedding byte for byte.
The harness itself runs end to end on tiny ONNX models (warm only: a test never drops the page
cache of a shared machine) and its targets FAIL when a measurement misses them."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
inputs: Any = importlib.import_module("scale_inputs")
common: Any = importlib.import_module("common")

TINY = inputs.Llama(hidden=64, intermediate=160, vocab=256, layers=4, heads=4, kv_heads=2)


def tensor_bytes(path: str, name: str) -> bytes:
    start, header = common.read_safetensors_header(path)
    begin, end = header[name]["data_offsets"]
    with open(path, "rb") as handle:
        handle.seek(start + begin)
        return handle.read(end - begin)


def folder_tensors(folder: str) -> dict[str, str]:
    """name -> shard path, from the shards' own headers."""
    found: dict[str, str] = {}
    for path in inputs.shard_files(folder):
        _, header = common.read_safetensors_header(path)
        for name, info in header.items():
            assert info["dtype"] == "BF16"
            assert name not in found, f"{name} in two shards"
            found[name] = path
    return found


def test_folder_is_a_consistent_sharded_checkpoint_with_an_untied_copy(tmp_path: Path) -> None:
    inp = inputs.folder_input("f", "folder", TINY, shards=3, root=str(tmp_path))
    assert inputs.ensure(inp) is True
    assert sorted(os.listdir(inp.path)) == sorted(
        ["config.json", "model.safetensors.index.json"] + [os.path.basename(f) for f in inp.files]
    )
    assert len(inp.files) == 3 and inp.files[0].endswith("model-00001-of-00003.safetensors")
    with open(os.path.join(inp.path, "config.json")) as handle:
        config = json.load(handle)
    assert config["tie_word_embeddings"] is False and config["num_key_value_heads"] == 2
    with open(os.path.join(inp.path, "model.safetensors.index.json")) as handle:
        index = json.load(handle)
    tensors = folder_tensors(inp.path)
    assert {n: os.path.basename(p) for n, p in tensors.items()} == index["weight_map"]
    assert len(tensors) == inp.tensors == 4 * 9 + 3
    sizes = {n: tensor_bytes(p, n) for n, p in tensors.items()}
    assert index["metadata"]["total_size"] == sum(len(b) for b in sizes.values())
    assert sum(os.path.getsize(f) for f in inp.files) == inp.nbytes
    assert len(sizes["model.layers.0.self_attn.k_proj.weight"]) == 2 * 32 * 64  # 2 kv heads x 16
    assert tensors[inputs.EMBED] != tensors[inputs.HEAD], "the copy should sit in another shard"
    assert sizes[inputs.EMBED] == sizes[inputs.HEAD]
    assert sizes[inputs.EMBED] != sizes["model.layers.0.self_attn.q_proj.weight"][: len(sizes[inputs.EMBED])]
    assert inputs.ensure(inp) is False, "a second ensure reuses the cached folder"


def test_sparse_folder_has_full_headers_on_little_disk_and_no_finding(tmp_path: Path) -> None:
    # hidden 4096: a norm (8 KiB) is longer than HEAD_BYTES, so a cut-short norm would show
    shape = inputs.Llama(hidden=4096, intermediate=1024, vocab=2048, layers=3, heads=32, kv_heads=8)
    inp = inputs.folder_input("s", "sparse", shape, shards=4, root=str(tmp_path))
    inputs.ensure(inp)
    tensors = folder_tensors(inp.path)
    assert len(tensors) == inp.tensors and inp.shards == 4 and inp.expected is None
    apparent = sum(os.path.getsize(f) for f in inp.files)
    assert apparent == inp.nbytes > 100 * 10**6
    assert sum(os.stat(f).st_blocks * 512 for f in inp.files) < apparent / 20
    for path in inp.files:  # the last tensor ends at the end of the file
        start, header = common.read_safetensors_header(path)
        assert start + max(i["data_offsets"][1] for i in header.values()) == os.path.getsize(path)
    head = inputs.HEAD_BYTES
    embed, lm_head = (tensor_bytes(tensors[n], n) for n in (inputs.EMBED, inputs.HEAD))
    assert embed[:head].count(0) < head // 4 and embed[head:] == bytes(len(embed) - head)
    assert embed[:head] != lm_head[:head], "an untied head in the sparse form: no planted copy"
    norm = "model.layers.1.input_layernorm.weight"
    assert tensor_bytes(tensors[norm], norm) == b"\x80\x3f" * 4096, "constant tensors written in full"
    audit = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", inp.path, "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert (audit.returncode, json.loads(audit.stdout)["findings"]) == (0, []), audit.stderr


@pytest.mark.parametrize(
    ("external", "head"), [(False, "equal"), (True, "equal"), (False, "transposed"), (True, "transposed")]
)
def test_onnx_loads_and_its_head_is_a_copy(tmp_path: Path, external: bool, head: str) -> None:
    """Equal: the head's bytes are the embedding's; transposed: the embedding's transpose (the
    embedding drawn whole, the external data streamed in chunks: one random stream either way)."""
    import numpy as np
    import onnx
    import onnxruntime
    from onnx import numpy_helper

    inp = inputs.onnx_input(
        "o", vocab=3000, hidden=1500, layers=2, external=external, head=head, root=str(tmp_path)
    )
    inputs.ensure(inp)
    assert all(os.path.exists(f) for f in inp.files)
    if external:
        assert os.path.getsize(inp.files[1]) >= 4 * 3000 * 1500 * 2
        assert os.path.getsize(inp.files[0]) < 4096
    model = onnx.load(inp.path)
    onnx.checker.check_model(model)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert len(weights) == inp.tensors
    embed, lm_head = weights[inputs.ONNX_EMBED], weights[inputs.ONNX_HEAD]
    assert embed.shape == (3000, 1500) and float(embed.std()) == pytest.approx(0.02, rel=0.05)
    expected = embed if head == "equal" else embed.T
    assert lm_head.shape == expected.shape and lm_head.tobytes() == np.ascontiguousarray(expected).tobytes()
    session = onnxruntime.InferenceSession(inp.path, providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input_ids": np.array([[1, 2, 3]], dtype=np.int64)})
    assert logits.shape == (1, 3, 3000)


def test_count_inputs_hold_the_same_bytes_in_ten_times_the_tensors(tmp_path: Path) -> None:
    many = inputs.count_input("c10", count=100, rows=1, width=1024, root=str(tmp_path))
    few = inputs.count_input("c1", count=10, rows=10, width=1024, root=str(tmp_path))
    data = []
    for inp in (many, few):
        inputs.ensure(inp)
        start, header = common.read_safetensors_header(inp.path)
        assert len(header) == inp.tensors
        assert tensor_bytes(inp.path, inputs.EMBED) == tensor_bytes(inp.path, inputs.HEAD)
        data.append(os.path.getsize(inp.path) - start)
    assert data[0] == data[1] == 100 * 1024 * 2  # only the headers differ


def test_full_plan_has_the_briefed_shapes() -> None:
    """The full-size recipes (not generated here): >= 10 GB folder, 723 tensors in 30 shards."""
    by_key = {i.key: i for i in inputs.plan()}
    assert by_key["llama8b-20l"].nbytes > 10 * 10**9 and by_key["llama8b-20l"].shards == 3
    assert by_key["llama70b-80l"].tensors == 723 and by_key["llama70b-80l"].shards == 30
    assert 1.8e9 < by_key["gpt-onnx-8l"].nbytes < 2**31 - 2**24  # under protobuf's 2 GiB limit
    assert by_key["gpt-onnx-8l-t"].nbytes == by_key["gpt-onnx-8l"].nbytes
    assert by_key["gpt-onnx-8l-t"].relation == "transposed"
    assert by_key["gpt-onnx-16l-ext"].nbytes > 2**31  # external data: past what a protobuf holds
    assert by_key["tensors-10k"].nbytes == pytest.approx(by_key["tensors-1k"].nbytes, rel=0.01)
    small = {i.key.removesuffix("-small"): i for i in inputs.plan(small=True)}
    assert all(small[k].tensors == i.tensors and small[k].shards == i.shards for k, i in by_key.items())


def _tiny_harness(scale: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: list[Any]) -> None:
    for inp in tiny:
        inputs.ensure(inp)
    monkeypatch.setattr(scale, "plan", lambda small: tiny)
    monkeypatch.setattr(scale, "generate", lambda *args: None)
    monkeypatch.setattr(
        scale, "cold_support", lambda: (False, "cold: not possible here (test), runs are warm")
    )
    for name, value in {
        "OUT_DIR": tmp_path,
        "SCALE_DIR": tmp_path,
        "CHECK_REPORT": tmp_path / "check.json",
        "BASELINE_OUT": tmp_path / "sha.json",
    }.items():
        monkeypatch.setattr(scale, name, str(value))


def test_harness_runs_end_to_end_and_fails_strict_on_a_missed_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scale: Any = importlib.import_module("scale")
    tiny = [
        inputs.onnx_input("big", vocab=400, hidden=32, layers=2, external=False, root=str(tmp_path)),
        inputs.onnx_input("little", vocab=200, hidden=32, layers=1, external=False, root=str(tmp_path)),
    ]
    _tiny_harness(scale, tmp_path, monkeypatch, tiny)
    # a file of a few kB: python start alone misses "check <= 1.5 x cat + 0.3 s" and 15% RSS
    assert scale.main(["--only", "onnx", "--repeat", "1", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "cold: not possible here (test), runs are warm" in out
    assert "warm tieaudit check" in out and "warm onnx.load" in out and "cold cat" not in out
    assert "ONNX embedded: check peak RSS <= 15% of file" in out and "FAIL" in out
    assert re.search(r"every check run found exactly what was planted +verified every run +PASS", out)
    assert "growth onnx warm: big / little" in out
    results = json.loads((tmp_path / "scale-results.json").read_text())
    assert results["problems"] == [] and results["passed"] is False


def test_a_wrong_finding_is_an_error_line_and_fails_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scale: Any = importlib.import_module("scale")
    real = inputs.onnx_input("one", vocab=300, hidden=32, layers=1, external=True, root=str(tmp_path))
    wrong = replace(real, expected=(inputs.ONNX_EMBED, "transformer.h.0.mlp.c_fc.weight"))
    _tiny_harness(scale, tmp_path, monkeypatch, [wrong])
    assert scale.main(["--only", "onnx-ext", "--repeat", "1", "--strict"]) == 1
    captured = capsys.readouterr()
    assert "error: one warm round 1: finding names are" in captured.err
    assert "error: one warm round 1: sha512 every tensor missed the planted copy" in captured.err
    assert re.search(r"every check run found exactly what was planted +2 problem\(s\).* +FAIL", captured.out)
