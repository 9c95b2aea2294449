"""The fixture corpus says what it holds, and what it says is true of the files.

Facts recorded at generation time (from the live objects) are re-derived here from the files
with independent code: torch.load data_ptr grouping, safetensors/onnx loads, config.json.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURE_NAMES as REQUIRED
from conftest import GENERATED, GENERATOR, MALFORMED, Corpus

# A fixture may be missing only with a reason written here (e.g. an exporter bug in a pinned version).
ALLOWED_FAILURES: dict[str, str] = {}
TORCH_FILES = [n for n in REQUIRED if n.startswith("torch_")] + ["hf_gpt2_bin"]
FORMATS = {"torch", "safetensors", "onnx", "hf-dir"}


# --- independent readers -------------------------------------------------------------------


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list | tuple) else []
    found: dict[str, Any] = {}
    for key, value in items:
        found.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def _torch_file(corpus: Corpus, name: str) -> Path:
    torch_file = corpus.entry(name)["expect"].get("torch_file")
    return corpus.path(name) / torch_file if torch_file else corpus.path(name)


def _load_tensors(corpus: Corpus, name: str) -> dict[str, Any]:
    """Every stored tensor of a fixture as a torch tensor, by stored name."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    entry, path = corpus.entry(name), corpus.path(name)
    if entry["format"] == "torch" or "torch_file" in entry["expect"]:
        return _flatten(torch.load(_torch_file(corpus, name), weights_only=True))
    if entry["format"] == "safetensors":
        return load_file(path)
    if entry["format"] == "hf-dir":
        return {k: v for shard in sorted(path.glob("*.safetensors")) for k, v in load_file(shard).items()}
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path / "model.onnx" if path.is_dir() else path))
    return {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in model.graph.initializer}


def _holds(a: Any, b: Any, relation: str) -> bool:
    import torch

    if relation == "equal":
        return a.dtype == b.dtype and torch.equal(a, b)
    if relation == "transposed":
        return a.dim() == 2 and a.dtype == b.dtype and torch.equal(a.t(), b)
    if relation == "cast":
        return a.dtype != b.dtype and torch.equal(a.to(b.dtype), b)
    raise AssertionError(f"unknown relation {relation}")


# --- the manifest itself -------------------------------------------------------------------


def test_manifest_is_current(corpus: Corpus) -> None:
    spec = importlib.util.spec_from_file_location("fixtures_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generate  # dataclasses look their module up while the module executes
    spec.loader.exec_module(generate)
    assert corpus.manifest["schema"] == "tieaudit.fixtures/1"
    assert corpus.manifest["generator_sha256"] == generate.generator_hash()
    assert generate.is_fresh(GENERATED)


def test_required_fixtures_present(corpus: Corpus) -> None:
    failed = {f["name"]: f["error"] for f in corpus.manifest["failed"]}
    unexplained = {n: e for n, e in failed.items() if n not in ALLOWED_FAILURES}
    assert not unexplained, f"producers failed without a stated reason: {unexplained}"
    missing = [n for n in REQUIRED if n not in corpus.entries and n not in ALLOWED_FAILURES]
    assert not missing


def test_entries_are_complete_and_exist(corpus: Corpus) -> None:
    assert len(corpus.entries) == len(corpus.manifest["fixtures"]), "duplicate fixture names"
    for name, entry in corpus.entries.items():
        assert set(entry) >= {"name", "path", "producer", "format", "attacks_or_shows", "expect"}, name
        assert entry["format"] in FORMATS, name
        assert entry["producer"] and entry["attacks_or_shows"].endswith("."), name
        assert isinstance(entry["expect"].get("untied_copy"), list), name
        assert corpus.path(name).exists(), name


# --- facts re-derived from the files -------------------------------------------------------


@pytest.mark.parametrize("name", TORCH_FILES)
def test_torch_storage_groups(corpus: Corpus, name: str) -> None:
    tensors = _load_tensors(corpus, name)
    by_storage: dict[int, list[str]] = {}
    for key, tensor in tensors.items():
        if tensor.untyped_storage().nbytes():
            by_storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(key)
    groups = sorted(sorted(g) for g in by_storage.values() if len(g) > 1)
    expect = corpus.entry(name)["expect"]
    assert groups == expect["storage_groups"]
    assert sorted(tensors) == expect["tensors"]


def test_untied_copies_hold(corpus: Corpus) -> None:
    checked = 0
    for name, entry in corpus.entries.items():
        if not entry["expect"]["untied_copy"]:
            continue
        tensors = _load_tensors(corpus, name)
        for a, b, relation in entry["expect"]["untied_copy"]:
            assert _holds(tensors[a], tensors[b], relation), (name, a, b, relation)
            assert tensors[a].untyped_storage().data_ptr() != tensors[b].untyped_storage().data_ptr()
            checked += 1
    assert checked >= 9


def test_declared_tie_layouts(corpus: Corpus) -> None:
    diverged = _load_tensors(corpus, "hf_llama_diverged_head")
    for target, source in corpus.entry("hf_llama_diverged_head")["expect"]["declared_tie_broken"]:
        gap = (diverged[target] - diverged[source]).abs().max().item()
        assert 0 < gap < 1e-3
    head_only = _load_tensors(corpus, "hf_llama_lm_head_only")
    for target, source in corpus.entry("hf_llama_lm_head_only")["expect"]["orphan"]:
        assert target in head_only and source not in head_only
    misaligned = corpus.entry("hf_llama_vocab_misaligned")["expect"]["vocab_misaligned"]
    config = json.loads((corpus.path("hf_llama_vocab_misaligned") / "config.json").read_text())
    rows = _load_tensors(corpus, "hf_llama_vocab_misaligned")["model.embed_tokens.weight"].shape[0]
    assert (config["vocab_size"], rows) == (misaligned["config_vocab_size"], misaligned["embedding_rows"])
    assert config["vocab_size"] != rows


def test_declared_ties_recorded_where_written(corpus: Corpus) -> None:
    from safetensors import safe_open

    with safe_open(str(corpus.path("st_save_model_tied")), framework="pt") as handle:
        assert handle.metadata()["head.weight"] == "emb.weight"
    index = json.loads((corpus.path("hub_sharded_tied") / "model.safetensors.index.json").read_text())
    assert index["metadata"]["head.weight"] == "emb.weight"
    for name in ("hf_gpt2", "hf_llama_tied", "hf_t5", "hf_bert_mlm", "hf_albert_mlm"):
        config = json.loads((corpus.path(name) / "config.json").read_text())
        stored = _load_tensors(corpus, name)
        assert config.get("tie_word_embeddings", True) is True, name
        for target, source, _ in corpus.entry(name)["expect"]["declared_ties"]:
            assert source in stored and target not in stored, (name, target)


def test_albert_transposed_shapes_are_not_copies(corpus: Corpus) -> None:
    tensors = _load_tensors(corpus, "hf_albert_mlm")
    for a, b in corpus.entry("hf_albert_mlm")["expect"]["not_copies"]:
        assert tensors[a].shape == tensors[b].shape[::-1]
        assert not _holds(tensors[a], tensors[b], "transposed")


def test_exporters_store_what_the_field_notes_say(corpus: Corpus) -> None:
    dynamo = corpus.entry("onnx_gpt2_tied_dynamo")["expect"]["embedding_initializers"]
    assert len(dynamo) == 1 and dynamo[0][1] == "equal"
    torchscript = corpus.entry("onnx_gpt2_tied_torchscript")["expect"]["embedding_initializers"]
    assert [rel for _, rel in torchscript] == ["equal", "transposed"]
    assert re.fullmatch(r"onnx::MatMul_\d+", torchscript[1][0])
    assert (corpus.path("onnx_gpt2_tied_dynamo_extdata") / "model.onnx.data").exists()
    assert (corpus.path("onnx_helper_shared_external") / "weights.bin").exists()


# --- malformed files -----------------------------------------------------------------------


def test_malformed_manifest_lists_every_file(malformed_dir: Path) -> None:
    listed = set(re.findall(r"^\| `([^`]+)` \|", (malformed_dir / "MANIFEST.md").read_text(), re.M))
    present = {p.name for p in malformed_dir.iterdir()} - {"MANIFEST.md", "make_malformed.py", "__pycache__"}
    assert listed == present
    assert (malformed_dir / "empty.pt").stat().st_size == 0


def test_make_malformed_rebuilds_committed_bytes(malformed_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    subprocess.run(
        [sys.executable, str(MALFORMED / "make_malformed.py"), str(tmp_path)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    for rebuilt in tmp_path.iterdir():
        assert rebuilt.read_bytes() == (malformed_dir / rebuilt.name).read_bytes(), rebuilt.name
    assert not (tmp_path / "tieaudit_pwned_marker").exists()
