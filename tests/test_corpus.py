"""Every producer in the fixture corpus, through the CLI, against an independent truth.

Truth for .pt files is torch.load(weights_only=True) storage identity; for ONNX the graph's own
initializer use (read with onnx, not tieaudit); for Hugging Face folders the live model's tied
keys recorded at generation time. Findings are compared with the copies the generator planted.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURE_NAMES as NAMES
from conftest import Corpus
from inert_pickle import Inert, inert_parts, load_like_torch

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
    """Names sharing one storage, as torch itself loads the file (weights_only; for a file it refuses
    only for a global outside its allowlist, weights_only=False with the tests' inert unpickler)."""
    import torch

    loaded, _ = load_like_torch(torch, path)
    by_ptr: dict[int, list[str]] = defaultdict(list)

    def walk(prefix: str, value: object) -> None:
        items: list[tuple[str, Any]] = []
        if isinstance(value, torch.Tensor):
            by_ptr[value.untyped_storage().data_ptr()].append(prefix)
        elif isinstance(value, Inert):
            items = inert_parts(value)
        elif isinstance(value, dict):
            items = [(str(key), item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(str(index), item) for index, item in enumerate(value)]
        for part, item in items:
            walk(f"{prefix}.{part}" if prefix else part, item)

    walk("", loaded)
    return {frozenset(names) for names in by_ptr.values() if len(names) > 1}


@dataclass(frozen=True)
class OnnxTruth:
    """What the graph itself says, read with onnx (not tieaudit)."""

    uses: dict[str, Counter[str]]
    """Initializer -> op types of the nodes that read it (through Identity), subgraphs included."""
    alias_groups: set[frozenset[str]]
    """An initializer with the Identity outputs that are other names for it."""
    tied: set[str]
    """Initializers read by a Gather (data input) and by a MatMul/Gemm (input A or B), directly or
    through Transpose/Identity nodes."""


def onnx_truth(path: Path) -> OnnxTruth:
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
    passed = dict(owner)  # value -> initializer it is, or is a transpose of
    changed = True
    while changed:
        changed = False
        for node in nodes:
            through = node.op_type in ("Transpose", "Identity") and node.input and node.input[0] in passed
            if through and node.output[0] not in passed:
                passed[node.output[0]] = passed[node.input[0]]
                changed = True
    embedded, projected = set(), set()
    for node in nodes:
        for slot, value in enumerate(node.input):
            if value in owner:
                uses[owner[value]][node.op_type] += 1
            if node.op_type == "Gather" and slot == 0 and value in owner:
                embedded.add(owner[value])
            if node.op_type in ("MatMul", "Gemm") and slot < 2 and value in passed:
                projected.add(passed[value])
    names: dict[str, set[str]] = defaultdict(set)
    for value, initializer in owner.items():
        names[initializer].add(value)
    groups = {frozenset(group) for group in names.values() if len(group) > 1}
    return OnnxTruth(uses=uses, alias_groups=groups, tied=embedded & projected)


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
        graph = onnx_truth(path)
        reported = {k: Counter(u["op_type"] for u in v) for k, v in report.get("consumers", {}).items()}
        for initializer, ops in graph.uses.items():
            assert reported[initializer] == ops, initializer
        assert groups_of(report) == graph.alias_groups
        assert {t["initializer"] for t in report["consumer_ties"]} == graph.tied
    else:
        assert groups_of(report) == set()  # safetensors cannot alias
    if "declared_ties" in expect:
        declared = {(t["target"], t["source"], t["declared_by"]) for t in report["declared_ties"]}
        assert declared == {tuple(t) for t in expect["declared_ties"]}
    if "globals" in expect:  # the verdicts the producer knows for the globals its pickle names
        verdicts = {g["name"]: g["verdict"] for g in report["pickle_globals"]}
        assert {name: verdicts.get(name) for name in expect["globals"]} == expect["globals"]
    if entry["format"] == "torch":
        assert {t["name"] for t in report["tensors"]} == set(expect["tensors"])


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
    "pickle_training_args": {"TIE010"},
    "pickle_whole_module": {"TIE010"},
    "torch_train_copy": {"TIE007"},  # an Adam state for each copy
    "torch_train_split": {"TIE007"},  # two states for one tied parameter
    # TIE010: training_args.bin's TrainingArguments and rng_state.pth's numpy arrays (torch refuses both)
    "hf_trainer_gpt2_copy": {"TIE007", "TIE010"},
    "hf_trainer_gpt2": {"TIE010"},
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
