"""tieaudit runtime: per-configuration numbers, ORT's copies named from its optimized model, errors bounded.

Every probe is a real ONNX Runtime session in a subprocess; the models are small (a few hundred KiB),
so the whole file runs in seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Corpus
from onnx import TensorProto, helper, numpy_helper

from tieaudit.cli import cli, main
from tieaudit.cli_onnx import export, runtime
from tieaudit.findings import Finding
from tieaudit.formats import open_checkpoint
from tieaudit.formats.onnx_model import load_model
from tieaudit.report.json_report import finding_dict
from tieaudit.runtime import measure_runtime, runtime_findings
from tieaudit.runtime_graph import input_specs
from tieaudit.runtime_probe import CONFIGS, CRASH_ENV, SLEEP_ENV

for command in (runtime, export):  # until cli.py registers them; add_command replaces by name
    cli.add_command(command)

VOCAB, HIDDEN = 256, 32
EMBEDDING = np.random.default_rng(0).standard_normal((VOCAB, HIDDEN)).astype(np.float32)
FAST = ["--runs", "2", "--config", "default", "--config", "both_off"]


def _save(
    path: Path,
    nodes: list[onnx.NodeProto],
    initializers: list[TensorProto],
    inputs: list[onnx.ValueInfoProto] | None = None,
) -> Path:
    graph = helper.make_graph(
        nodes,
        "lm",
        inputs or [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


def tied_lm(path: Path) -> Path:
    """One initializer E read by Gather and by Transpose -> MatMul: the tie, stored once."""
    return _save(
        path,
        [
            helper.make_node("Gather", ["E", "input_ids"], ["hidden"], name="embed"),
            helper.make_node("Transpose", ["E"], ["e_t"], perm=[1, 0], name="transpose"),
            helper.make_node("MatMul", ["hidden", "e_t"], ["logits"], name="lm_head"),
        ],
        [numpy_helper.from_array(EMBEDDING, "E")],
    )


def untied_lm(path: Path) -> Path:
    """E for the Gather, a separate head W read only by MatMul: nothing for ORT to duplicate."""
    head = np.random.default_rng(1).standard_normal((HIDDEN, VOCAB)).astype(np.float32)
    return _save(
        path,
        [
            helper.make_node("Gather", ["E", "input_ids"], ["hidden"], name="embed"),
            helper.make_node("MatMul", ["hidden", "W"], ["logits"], name="lm_head"),
        ],
        [numpy_helper.from_array(EMBEDDING, "E"), numpy_helper.from_array(head, "W")],
    )


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- measurement and static view ---------------------------------------------------------------


def test_every_configuration_is_measured_and_the_folded_transpose_is_named(corpus: Corpus) -> None:
    report = measure_runtime(str(corpus.path("onnx_gpt2_tied_dynamo")), runs=2)

    assert [r.config.name for r in report.configs] == list(CONFIGS)
    for result in report.configs:
        assert result.error is None
        assert result.grown("created") is not None and result.grown("after_runs") is not None
        assert result.peak is not None and result.median_ms is not None and len(result.latencies_ms) == 2
    by_name = {r.config.name: r for r in report.configs}
    default, both_off = by_name["default"].static, by_name["both_off"].static
    assert default is not None and both_off is not None
    [copy] = default.duplicates
    assert (copy.original, copy.relation, copy.mechanism, copy.nbytes) == (
        "m.lm_head.weight",
        "transposed",
        "constant-folding",
        1000 * 64 * 4,
    )
    assert copy.copy not in open_checkpoint(str(corpus.path("onnx_gpt2_tied_dynamo"))).names
    assert both_off.duplicates == () and both_off.recomputed == ()
    # Folding off alone: the MatMul reads E itself, and prepacking keeps a packed copy beside it.
    [packed] = by_name["no_constant_folding"].static.duplicates  # type: ignore[union-attr]
    assert (packed.original, packed.mechanism, packed.copy) == ("m.lm_head.weight", "prepacking", None)
    assert [r.initializer for r in by_name["disable_all"].static.recomputed] == ["m.lm_head.weight"]  # type: ignore[union-attr]
    assert by_name["both_off"].one_copy and not by_name["default"].one_copy
    assert report.recommendation is not None and report.recommendation.config in (
        "both_off",
        "fold_size_limit",
    )
    assert [(f.rule, f.names, f.relation) for f in report.findings] == [
        ("TIE005", ("m.lm_head.weight", copy.copy), "transposed")
    ]
    assert report.exit_code("warning") == 1 and report.exit_code("error") == 0


def test_json_report_has_the_schema_configs_and_the_finding_layout(
    corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(corpus.path("onnx_gpt2_tied_dynamo"))
    code, out, err = _cli(["runtime", path, "--format", "json", *FAST], capsys)

    assert code == 1 and err == ""
    document = json.loads(out)
    assert document["schema"] == "tieaudit.runtime/1" and document["measured"] == "RssAnon"
    assert [c["name"] for c in document["configs"]] == ["default", "both_off"]
    default, both_off = document["configs"]
    assert default["duplicate_bytes"] == 256000 and both_off["duplicate_bytes"] == 0
    assert both_off["rss_anon_created_bytes"] > 0 and both_off["median_latency_ms"] > 0
    assert document["recommendation"]["config"] == "both_off"
    assert (
        'options.add_session_config_entry("session.disable_prepacking", "1")'
        in (document["recommendation"]["session_options"])
    )
    [finding] = document["findings"]
    assert set(finding) == set(finding_dict(Finding("TIE005", "warning", ("a",), "m", details={"x": 1})))
    assert finding["rule"] == "TIE005" and finding["kind"] == "runtime-duplicate"
    assert finding["details"]["config"] == "default"


def test_text_report_table_recommendation_and_report_only(
    corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(corpus.path("onnx_gpt2_tied_dynamo"))
    code, out, _ = _cli(["runtime", path, *FAST, "--exit-zero"], capsys)

    assert code == 0
    assert "config    created  after runs" in out
    assert "transposed copy of m.lm_head.weight (250.0 KiB, constant folding" in out
    assert "Recommendation: both_off" in out and "vs default" in out
    assert "Measured: RssAnon" in out


def test_external_data_says_what_was_measured(corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(corpus.path("onnx_gpt2_tied_dynamo_extdata") / "model.onnx")
    _, out, _ = _cli(["runtime", path, *FAST], capsys)
    assert "memory-maps them (counted in RssFile, not RssAnon)" in out and "mapped (RssFile)" in out

    _, out, _ = _cli(["runtime", path, *FAST, "--embed-weights"], capsys)
    assert "loaded from external data into the session from memory" in out


def test_runtime_findings_helper_tie_vs_untied_vs_stored_copy(tmp_path: Path, corpus: Corpus) -> None:
    [finding] = runtime_findings(str(tied_lm(tmp_path / "tied.onnx")))
    assert (finding.rule, finding.names[0], finding.relation, finding.wasted_bytes) == (
        "TIE005",
        "E",
        "transposed",
        EMBEDDING.nbytes,
    )
    assert finding.fix is not None and "session.disable_prepacking" in finding.fix
    assert runtime_findings(str(untied_lm(tmp_path / "untied.onnx"))) == []
    # A copy stored in the file (TorchScript's E.T) is TIE001's business, not a runtime duplicate;
    # so is E_copy when ORT folds Transpose(E_copy) into a new initializer and drops E_copy.
    assert runtime_findings(str(corpus.path("onnx_gpt2_tied_torchscript"))) == []
    assert runtime_findings(str(corpus.path("onnx_helper_duplicate"))) == []


def test_synthetic_inputs_follow_the_graph_and_the_dims(tmp_path: Path) -> None:
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("noise", TensorProto.FLOAT, ["batch_size", "width"]),
    ]
    nodes = [
        helper.make_node("Reshape", ["input_ids", "flat"], ["ids_flat"]),
        helper.make_node("Gather", ["E", "ids_flat"], ["logits"]),
    ]
    flat = numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat")
    path = _save(tmp_path / "inputs.onnx", nodes, [numpy_helper.from_array(EMBEDDING, "E"), flat], inputs)
    with open_checkpoint(str(path)) as ckpt:
        specs = {s.name: s for s in input_specs(load_model(str(path)), ckpt, {"sequence": 5, "width": 3})}
    assert (specs["input_ids"].fill, specs["input_ids"].high, specs["input_ids"].shape) == (
        "ids",
        VOCAB,
        (1, 5),
    )
    assert (specs["attention_mask"].fill, specs["noise"].fill, specs["noise"].shape) == (
        "ones",
        "normal",
        (1, 3),
    )


# --- failures: bounded, one clear line each, the other configurations still reported ----------


def test_a_probe_that_crashes_is_an_error_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_ENV, "default")
    code, out, err = _cli(["runtime", str(tied_lm(tmp_path / "m.onnx")), *FAST], capsys)

    assert code == 2
    assert err.strip().splitlines() == [
        f"tieaudit: error: {tmp_path / 'm.onnx'}: config default: onnxruntime crashed (killed by SIGABRT)"
    ]
    assert "\ndefault     error\n" in out and "Errors:" in out and "under default: unknown" in out
    both_off = next(line for line in out.splitlines() if line.startswith("both_off"))
    assert "error" not in both_off and "yes" in both_off


def test_onnxruntime_refusing_the_model_is_an_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _save(
        tmp_path / "custom.onnx",
        [helper.make_node("NoSuchOp", ["E"], ["logits"], domain="example.custom")],
        [numpy_helper.from_array(EMBEDDING, "E")],
        [],
    )
    code, _, err = _cli(["runtime", str(path), "--config", "default", "--format", "json"], capsys)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"tieaudit: error: {path}: config default: onnxruntime failed: ")
    assert "NoSuchOp" in line


def test_a_probe_that_hangs_is_killed_at_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SLEEP_ENV, "60")
    start = time.monotonic()
    code, _, err = _cli(
        ["runtime", str(tied_lm(tmp_path / "m.onnx")), "--config", "default", "--timeout", "1"], capsys
    )
    assert code == 2 and time.monotonic() - start < 20
    assert err.strip().splitlines() == [
        f"tieaudit: error: {tmp_path / 'm.onnx'}: config default: timed out after 1 s "
        "(session creation or inference did not finish)"
    ]


def test_a_file_that_is_not_onnx_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07this is not a protobuf" * 10)
    code, out, err = _cli(["runtime", str(broken)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("tieaudit: error: ")


def test_the_onnx_modules_import_neither_torch_nor_onnxruntime() -> None:
    code = (
        "import sys, tieaudit.cli, tieaudit.cli_onnx, tieaudit.runtime, tieaudit.export, "
        "tieaudit.report.runtime_report; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', 'transformers')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_check_runtime_adds_tie005_to_the_gate(corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    from tieaudit.cli import main

    path = str(corpus.path("onnx_gpt2_tied_dynamo"))
    capsys.readouterr()
    assert main(["check", path, "--format", "json"]) == 0  # the file itself stores the matrix once
    capsys.readouterr()
    assert main(["check", path, "--runtime", "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [f["rule"] for f in report["findings"]] == ["TIE005"]
    assert report["summary"]["wasted_bytes"] == 0 and report["summary"]["runtime_wasted_bytes"] > 0
