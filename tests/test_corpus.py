"""Every producer in the fixture corpus, through the CLI, against an independent truth.

Truth for .pt files is torch.load(weights_only=True) storage identity; for ONNX the graph's own
initializer use (read with onnx, not tieaudit); for Hugging Face folders the live model's tied
keys recorded at generation time. Findings are compared with the copies the generator planted.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURE_NAMES as NAMES
from conftest import Corpus

from tieaudit.cli.main import main


def model_path(corpus: Corpus, name: str) -> Path:
    path = corpus.path(name)
    if corpus.entry(name)["format"] == "onnx" and path.is_dir():
        return path / "model.onnx"
    return path


def inspect_json(path: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "report.json"
    assert main(["inspect", str(path), "--format", "json", "--output", str(out)]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def storage_truth(path: Path) -> set[frozenset[str]]:
    """Names sharing one storage, as torch itself loads the file."""
    import torch

    loaded = torch.load(path, weights_only=True, map_location="cpu")
    by_ptr: dict[int, list[str]] = defaultdict(list)

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            by_ptr[value.untyped_storage().data_ptr()].append(prefix)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}" if prefix else str(index), item)

    walk("", loaded)
    return {frozenset(names) for names in by_ptr.values() if len(names) > 1}


def onnx_truth(path: Path) -> dict[str, Counter[str]]:
    """Initializer -> op types of the nodes that read it, main graph and subgraphs, read with onnx."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    uses: dict[str, Counter[str]] = defaultdict(Counter)
    owner = {init.name: init.name for init in model.graph.initializer}  # value -> initializer it is
    nodes: list[onnx.NodeProto] = []

    def collect(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            nodes.append(node)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    collect(attribute.g)

    collect(model.graph)
    changed = True
    while changed:  # Identity(initializer) is another name for it, chains included
        changed = False
        for node in nodes:
            if node.op_type == "Identity" and node.input[0] in owner and node.output[0] not in owner:
                owner[node.output[0]] = owner[node.input[0]]
                changed = True
    for node in nodes:
        for value in node.input:
            if value in owner:
                uses[owner[value]][node.op_type] += 1
    return uses


def groups_of(report: dict[str, Any]) -> set[frozenset[str]]:
    return {frozenset(g["names"]) for g in report["alias_groups"]}


@pytest.mark.parametrize("name", NAMES)
def test_inspect_matches_independent_truth(corpus: Corpus, name: str, tmp_path: Path) -> None:
    entry = corpus.entry(name)
    path = model_path(corpus, name)
    report = inspect_json(path, tmp_path)
    assert report["schema"] == "tieaudit.report/1"
    assert set(report) >= {
        "tieaudit_version",
        "path",
        "format",
        "tensors",
        "alias_groups",
        "declared_ties",
        "findings",
        "summary",
    }
    assert report["format"] == entry["format"]
    expect = entry["expect"]
    if entry["format"] == "torch" or name == "hf_gpt2_bin":
        torch_file = path / "pytorch_model.bin" if path.is_dir() else path
        truth = storage_truth(torch_file)
        assert groups_of(report) == truth
        assert truth == {frozenset(g) for g in expect["storage_groups"]}  # the generator agrees
    elif entry["format"] == "onnx":
        op_truth = onnx_truth(path)
        reported = {k: Counter(u["op_type"] for u in v) for k, v in report.get("consumers", {}).items()}
        for initializer, ops in op_truth.items():
            assert reported[initializer] == ops, initializer
        assert groups_of(report) == set()
    else:
        assert groups_of(report) == set()  # safetensors cannot alias
    if "declared_ties" in expect:
        declared = {(t["target"], t["source"], t["declared_by"]) for t in report["declared_ties"]}
        assert declared == {tuple(t) for t in expect["declared_ties"]}


@pytest.mark.parametrize("name", NAMES)
def test_tie001_matches_the_planted_copies(corpus: Corpus, name: str, tmp_path: Path) -> None:
    report = inspect_json(model_path(corpus, name), tmp_path)
    found = {
        (f["names"][0], other, f["relation"])
        for f in report["findings"]
        if f["rule"] == "TIE001"
        for other in f["names"][1:]
    }
    assert found == {tuple(c) for c in corpus.entry(name)["expect"]["untied_copy"]}


EXPECTED_RULES = {
    "hf_llama_diverged_head": {"TIE002"},
    "hf_llama_lm_head_only": {"TIE003"},
    "hf_llama_vocab_misaligned": {"TIE004"},
    "torch_overlapping_views": {"TIE006"},
    "torch_train_copy": {"TIE007"},  # an Adam state for each copy
    "torch_train_split": {"TIE007"},  # two states for one tied parameter
    "hf_trainer_gpt2_copy": {"TIE007"},
}


@pytest.mark.parametrize("name", NAMES)
def test_other_rules_fire_only_where_planted(corpus: Corpus, name: str, tmp_path: Path) -> None:
    report = inspect_json(model_path(corpus, name), tmp_path)
    rules = {f["rule"] for f in report["findings"]} - {"TIE001"}
    assert rules == EXPECTED_RULES.get(name, set())


def test_diverged_head_reports_the_size_of_the_difference(corpus: Corpus, tmp_path: Path) -> None:
    report = inspect_json(corpus.path("hf_llama_diverged_head"), tmp_path)
    (finding,) = [f for f in report["findings"] if f["rule"] == "TIE002"]
    expected = corpus.entry("hf_llama_diverged_head")["expect"]["max_abs_diff"]
    assert finding["details"]["max_abs_diff"] == pytest.approx(expected, rel=1e-6)
    assert finding["details"]["differing_fraction"] > 0.9
    assert finding["names"] == ["lm_head.weight", "model.embed_tokens.weight"]


def test_summary_counts_wasted_bytes(corpus: Corpus, tmp_path: Path) -> None:
    report = inspect_json(corpus.path("st_cloned_head"), tmp_path)
    summary = report["summary"]
    (finding,) = report["findings"]
    # Independent of audit.py: the safetensors library's own reading of the file, and the head's size.
    from safetensors import safe_open

    with safe_open(str(corpus.path("st_cloned_head")), framework="numpy") as handle:
        stored = {name: handle.get_tensor(name).nbytes for name in handle.keys()}
    (head,) = [name for name in finding["names"] if name != finding["details"]["kept"]]
    assert summary["bytes"] == sum(stored.values())
    assert summary["wasted_bytes"] == finding["wasted_bytes"] == stored[head] > 0
    assert summary["unique_bytes"] == sum(size for name, size in stored.items() if name != head)
    assert summary["warnings"] == 1 and summary["errors"] == 0


def test_dot_output_draws_the_alias_graph(corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "ties.dot"
    assert main(["inspect", str(corpus.path("torch_tied_lm")), "--format", "dot", "-o", str(out)]) == 0
    dot = out.read_text()
    assert dot.startswith("digraph tieaudit {") and dot.rstrip().endswith("}")
    assert '"t:emb.weight" -> "s:' in dot and '"t:head.weight" -> "s:' in dot
