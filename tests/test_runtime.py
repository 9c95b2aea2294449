"""tieaudit runtime: per-configuration numbers, ORT's copies named from its optimized model, errors bounded.

Every probe is a real ONNX Runtime session in a subprocess; the models are small (a few hundred KiB).
The hostile models (bottom) each run the CLI in a fresh process tree, a few seconds each: about two
minutes for the file on 2 shared CPUs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import Corpus
from onnx import TensorProto, helper, numpy_helper

from tieaudit.cli.main import main
from tieaudit.formats import open_checkpoint
from tieaudit.formats.onnx_model import load_model
from tieaudit.report.json_report import finding_dict
from tieaudit.rules.registry import RULES
from tieaudit.runtime.graph import input_specs
from tieaudit.runtime.measure import measure_runtime, runtime_findings
from tieaudit.runtime.probe import CONFIGS, CRASH_ENV, SLEEP_ENV

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
    with open_checkpoint(str(corpus.path("onnx_gpt2_tied_dynamo"))) as opened:
        assert copy.copy not in opened.checkpoint.names
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
    assert set(finding) == set(finding_dict(RULES["TIE005"].finding(("a",), "m", details={"x": 1})))
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
    assert finding.fix is not None and "session.disable_prepacking" in str(finding.fix)
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
    with open_checkpoint(str(path)) as opened:
        specs = {
            s.name: s
            for s in input_specs(load_model(str(path)), opened.checkpoint, {"sequence": 5, "width": 3})
        }
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
    code, _, err = _cli(
        ["runtime", str(tied_lm(tmp_path / "m.onnx")), "--config", "default", "--timeout", "1"], capsys
    )
    assert code == 2  # the message below says the probe was stopped at 1 s, not after its 60 s
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
        "import sys, tieaudit.cli.main, tieaudit.cli.onnx, tieaudit.runtime.measure, "
        "tieaudit.runtime.export, tieaudit.report.runtime_report; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', 'transformers')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_check_runtime_adds_tie005_to_the_gate(corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    from tieaudit.cli.main import main

    path = str(corpus.path("onnx_gpt2_tied_dynamo"))
    capsys.readouterr()
    assert main(["check", path, "--format", "json"]) == 0  # the file itself stores the matrix once
    capsys.readouterr()
    assert main(["check", path, "--runtime", "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [f["rule"] for f in report["findings"]] == ["TIE005"]
    assert report["summary"]["wasted_bytes"] == 0 and report["summary"]["runtime_wasted_bytes"] > 0


# --- bounded on hostile models: a memory limit per probe, synthetic inputs capped -------------
#
# Each run is the real CLI in a subprocess under an outer RLIMIT_AS, measured with the peak
# resident size of the whole process tree (the CLI and its probes, RUSAGE_CHILDREN in a wrapper):
# a tieaudit without the limits allocates gigabytes here (or dies of the outer limit instead of
# saying why), and never prints the lines asserted below.

OUTER_ADDRESS_SPACE = 4 << 30
"""RLIMIT_AS of the whole run: whatever tieaudit does, the machine never gives it more."""
PEAK_RSS = 512 << 20
"""Largest resident size of any process of a run: the CLI needs ~70 MiB, a probe of a tiny model ~80."""
HANG = 180
"""Seconds after which a run counts as hung (the wrapper's timeout kills it and fails the test);
a hang guard, not a speed target: a run takes a second or two."""
BOUNDED = """
import json, resource, subprocess, sys
limit, hang = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
run = subprocess.run(sys.argv[3:], capture_output=True, text=True, timeout=hang)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"code": run.returncode, "out": run.stdout, "err": run.stderr, "peak": peak}))
"""
LIMIT_LINE = r"the probe exceeded the \d+\.\d [MG]iB memory limit; raise --memory-limit"
ONE = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
MEMORY_ENV = "TIEAUDIT_RUNTIME_MEMORY_LIMIT"


def _bounded(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The CLI run in a fresh process tree under OUTER_ADDRESS_SPACE: exit code, output, peak RSS."""
    wrapper_argv = [sys.executable, "-c", BOUNDED, str(OUTER_ADDRESS_SPACE), str(HANG)]
    command = [*wrapper_argv, sys.executable, "-m", "tieaudit", *args]
    wrapper = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(wrapper.stdout)
    assert result["peak"] < PEAK_RSS, (
        f"a process of the run reached {result['peak'] >> 20} MiB: {result['err']}"
    )
    return result


def _error_lines(result: dict[str, Any]) -> list[str]:
    assert "Traceback" not in result["err"], result["err"]
    return result["err"].strip().splitlines()


def _int64(name: str, values: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _float(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


HOSTILE_ALLOCATIONS = {
    # 40000 x 40000 float32 = 6.4 GB from a file of about a hundred bytes, folded at session creation
    "constant_of_shape": (
        [helper.make_node("ConstantOfShape", ["shape"], ["logits"], value=ONE)],
        [_int64("shape", [40000, 40000])],
        [],
    ),
    "expand": (
        [helper.make_node("Expand", ["x", "shape"], ["logits"])],
        [_int64("shape", [40000, 40000])],
        [_float("x", [1])],
    ),
    # 3.6 GB: just under the 4 GiB ONNX Runtime's Tile refuses by itself
    "tile": (
        [helper.make_node("Tile", ["x", "repeats"], ["logits"])],
        [_int64("repeats", [30000, 30000])],
        [_float("x", [1, 1])],
    ),
    "range": (
        [helper.make_node("Range", ["start", "limit", "delta"], ["logits"])],
        [
            numpy_helper.from_array(np.array(v, dtype=np.float32), n)
            for n, v in (("start", 0), ("limit", 2e9), ("delta", 1))
        ],
        [],
    ),
    # not foldable: the shape comes from the input, so the 6.4 GB are asked for during session.run
    "shape_of_the_input_at_run_time": (
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Mul", ["shape", "scale"], ["big"]),
            helper.make_node("ConstantOfShape", ["big"], ["logits"], value=ONE),
        ],
        [_int64("scale", [40000, 5000])],
        [_float("x", ["batch", "sequence"])],
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE_ALLOCATIONS))
def test_a_model_asking_for_gigabytes_exceeds_the_probe_memory_limit_in_one_line(
    tmp_path: Path, name: str
) -> None:
    nodes, initializers, inputs = HOSTILE_ALLOCATIONS[name]
    path = _save(tmp_path / f"{name}.onnx", nodes, initializers, inputs)
    assert path.stat().st_size < 300

    result = _bounded(["runtime", str(path), "--config", "default", "--runs", "1", "--timeout", "60"])

    assert result["code"] == 2
    [line] = _error_lines(result)
    assert re.fullmatch(rf"tieaudit: error: {re.escape(str(path))}: config default: {LIMIT_LINE}", line), line


def test_every_configuration_says_it_exceeded_the_limit_and_json_records_the_limit(tmp_path: Path) -> None:
    nodes, initializers, inputs = HOSTILE_ALLOCATIONS["constant_of_shape"]
    path = _save(tmp_path / "cos.onnx", nodes, initializers, inputs)

    result = _bounded(["runtime", str(path), "--runs", "1", "--memory-limit", "1GiB", "--format", "json"])

    assert result["code"] == 2
    lines = _error_lines(result)
    exceeded = "the probe exceeded the 1.0 GiB memory limit; raise --memory-limit"
    assert lines == [f"tieaudit: error: {path}: config {config}: {exceeded}" for config in CONFIGS]
    document = json.loads(result["out"])
    assert document["memory_limit_bytes"] == 1 << 30
    assert [c["ok"] for c in document["configs"]] == [False] * len(CONFIGS)


def _sparse_zeros(path: Path) -> Path:
    """A 20000x20000 sparse initializer of no values: ORT densifies it (1.6 GB) creating the session."""
    empty = helper.make_tensor("w", TensorProto.FLOAT, [0], [])
    sparse = helper.make_sparse_tensor(
        empty, helper.make_tensor("w_idx", TensorProto.INT64, [0], []), [20000, 20000]
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["w", "y"], ["logits"])],
        "lm",
        [_float("y", [1])],
        [_float("logits", [])],
        sparse_initializer=[sparse],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_runtime_on_a_sparse_initializer_densified_at_session_creation(tmp_path: Path) -> None:
    path = _sparse_zeros(tmp_path / "sparse.onnx")
    assert path.stat().st_size < 300

    result = _bounded(["runtime", str(path), "--config", "default", "--runs", "1"])

    assert result["code"] == 2
    [line] = _error_lines(result)
    assert re.fullmatch(rf"tieaudit: error: {re.escape(str(path))}: config default: {LIMIT_LINE}", line), line


def test_check_runtime_runs_under_the_limit_and_the_environment_sets_it(tmp_path: Path) -> None:
    """check --runtime only creates the session: the sparse initializer is what allocates there."""
    path = _sparse_zeros(tmp_path / "sparse.onnx")

    [line] = _error_lines(_bounded(["check", str(path), "--runtime"]))
    assert re.fullmatch(
        rf"tieaudit: error: {re.escape(str(path))}: the probe exceeded the \d+\.\d MiB memory limit; "
        r"set TIEAUDIT_RUNTIME_MEMORY_LIMIT to more \(e\.g\. \d+\.\dGiB\)",
        line,
    ), line
    env = dict(os.environ, **{MEMORY_ENV: "768MiB"})
    result = _bounded(["check", str(path), "--runtime"], env)
    assert result["code"] == 2
    assert _error_lines(result) == [
        f"tieaudit: error: {path}: the probe exceeded the 768.0 MiB memory limit; "
        "set TIEAUDIT_RUNTIME_MEMORY_LIMIT to more (e.g. 1.5GiB)"
    ]
    env[MEMORY_ENV] = "4G"
    [line] = _error_lines(_bounded(["check", str(path), "--runtime"], env))
    assert line == (
        f"tieaudit: error: {path}: {MEMORY_ENV}: '4G' is ambiguous: say 4GB (x1000) or 4GiB (x1024)"
    )


def test_an_honest_allocation_below_the_limit_is_measured(tmp_path: Path) -> None:
    """64 MiB of ConstantOfShape, folded by ORT into a 64 MiB initializer: the default limit leaves room."""
    path = _save(
        tmp_path / "honest.onnx",
        [helper.make_node("ConstantOfShape", ["shape"], ["logits"], value=ONE)],
        [_int64("shape", [4096, 4096])],
        [],
    )
    result = _bounded(["runtime", str(path), "--config", "default", "--config", "disable_all", "--runs", "1"])
    assert result["code"] == 0 and result["err"] == "", result["err"]


DECLARED_INPUTS: dict[str, tuple[list[onnx.ValueInfoProto], list[str], str]] = {
    # (inputs, extra arguments, the error after "tieaudit: error: PATH: ")
    "fixed_20000x20000": (
        [_float("x", [20000, 20000])],
        [],
        "input 'x' would be 20000x20000 float32 (1.5 GiB), over the 256.0 MiB a synthetic input may take; "
        "the model fixes its shape (--dim sets only symbolic dimensions)",
    ),
    "name_with_control_characters": (
        [_float("x\n::error file=a::forged\x1b[31m", [20000, 20000])],
        [],
        "input 'x\\n::error file=a::forged\\x1b[31m' would be 20000x20000 float32 (1.5 GiB), over the "
        "256.0 MiB a synthetic input may take; the model fixes its shape (--dim sets only symbolic "
        "dimensions)",
    ),
    "dimension_of_2_62": (
        [_float("x", [1 << 62, 4])],
        [],
        f"input 'x' would be {1 << 62}x4 float32 (over 1 PiB), over the 256.0 MiB a synthetic input may "
        "take; the model fixes its shape (--dim sets only symbolic dimensions)",
    ),
    "symbolic_made_huge_by_dim": (
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        ["--dim", "sequence=100000000"],
        "input 'input_ids' would be 1x100000000 int64 (762.9 MiB), over the 256.0 MiB a synthetic input may "
        "take; give it smaller sizes with --dim sequence=N",
    ),
    "five_inputs_of_256_mib": (
        [_float(f"x{i}", ["batch", 1024, 1024]) for i in range(5)],
        ["--dim", "batch=64"],
        "the synthetic inputs would take 1.2 GiB or more together, over the 1.0 GiB they may take in all; "
        "give them smaller sizes with --dim batch=N",
    ),
    "negative_size": ([_float("x", [-5, 4])], [], "input 'x' declares a negative size (-5)"),
    "rank_65": ([_float("x", [1] * 65)], [], "input 'x' has 65 dimensions, more than 64"),
    "10001_inputs": (
        [_float(f"x{i}", [1]) for i in range(10001)],
        [],
        "the model has 10001 graph inputs, more than the 10000 a probe fills",
    ),
    "dim_naming_no_dimension": (
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        ["--dim", "foo=3"],
        "--dim foo names no symbolic dimension of the model (its symbolic dimensions: batch_size, "
        "sequence_length; --dim batch and --dim sequence set those whose names contain batch, and seq "
        "or len)",
    ),
}


@pytest.mark.parametrize("name", list(DECLARED_INPUTS))
def test_a_declared_input_over_the_limits_is_one_line_before_any_probe(tmp_path: Path, name: str) -> None:
    inputs, extra, message = DECLARED_INPUTS[name]
    path = _save(
        tmp_path / f"{name}.onnx", [helper.make_node("Identity", [inputs[0].name], ["logits"])], [], inputs
    )

    result = _bounded(["runtime", str(path), "--config", "default", "--runs", "1", "--timeout", "60", *extra])

    assert result["code"] == 2 and result["out"] == ""
    assert _error_lines(result) == [f"tieaudit: error: {path}: {message}"]


@pytest.mark.parametrize("elem_type", [TensorProto.FLOAT, TensorProto.INT64])
def test_a_model_with_thousands_of_inputs_into_one_node_is_measured(tmp_path: Path, elem_type: int) -> None:
    """1500 inputs with long names into one Concat: a request of ~200 KB, which argv (128 KiB per argument)
    cannot carry; for integer inputs the search for a vocabulary walks the graph once, not once per input."""
    inputs = [
        helper.make_tensor_value_info(f"input_{i:05d}_" + "n" * 60, elem_type, [1]) for i in range(1500)
    ]
    graph = helper.make_graph(
        [helper.make_node("Concat", [v.name for v in inputs], ["logits"], axis=0)],
        "lm",
        inputs,
        [helper.make_tensor_value_info("logits", elem_type, None)],
    )
    path = tmp_path / "many.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))

    result = _bounded(["runtime", str(path), "--config", "default", "--runs", "1"])

    assert result["code"] == 0 and result["err"] == "", result["err"]


def test_memory_limit_option_sizes_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tied_lm(tmp_path / "m.onnx"))
    code, out, _ = _cli(
        [
            "runtime",
            path,
            "--config",
            "default",
            "--runs",
            "1",
            "--memory-limit",
            "1.5GiB",
            "--format",
            "json",
        ],
        capsys,
    )
    assert code == 1 and json.loads(out)["memory_limit_bytes"] == 3 << 29
    code, _, err = _cli(["runtime", path, "--memory-limit", "2048"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "tieaudit: error: --memory-limit: 2.0 KiB is less than the 64.0 MiB a probe needs to start "
        "(a size without a unit is bytes: write 4GiB or 512MB)"
    ]
    code, _, err = _cli(["runtime", path, "--memory-limit", "4G"], capsys)
    assert (
        code == 2
        and len(err.strip().splitlines()) == 1
        and "'4G' is ambiguous: say 4GB (x1000) or 4GiB (x1024)" in err
    )


def test_the_default_limit_follows_the_model_and_cpu_count(corpus: Corpus, tmp_path: Path) -> None:
    from tieaudit.runtime.graph import read_model
    from tieaudit.runtime.memory import MEMORY_BASE, MEMORY_PER_WEIGHT_BYTE, default_memory_limit

    small = read_model(str(tied_lm(tmp_path / "m.onnx")), {})
    external = read_model(str(corpus.path("onnx_gpt2_tied_dynamo_extdata") / "model.onnx"), {})
    data = corpus.path("onnx_gpt2_tied_dynamo_extdata") / "model.onnx.data"
    assert external.weight_bytes >= data.stat().st_size  # external data counts
    one, four = default_memory_limit(small, cpus=1), default_memory_limit(small, cpus=4)
    assert MEMORY_BASE + MEMORY_PER_WEIGHT_BYTE * small.weight_bytes < one < four
    assert default_memory_limit(external, cpus=1) - one >= MEMORY_PER_WEIGHT_BYTE * (
        external.weight_bytes - small.weight_bytes
    )


def test_the_probe_lowers_its_limit_and_keeps_a_tighter_outer_one() -> None:
    code = (
        "import resource; from tieaudit.runtime.probe import limit_memory; "
        "resource.setrlimit(resource.RLIMIT_DATA, (300 << 20, 300 << 20)); "
        "print(limit_memory(1 << 30), limit_memory(200 << 20), resource.getrlimit(resource.RLIMIT_DATA))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().split(maxsplit=2) == [
        str(300 << 20),
        str(200 << 20),
        f"({200 << 20}, {200 << 20})",
    ]


def test_a_crash_after_bad_alloc_is_the_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from tieaudit.runtime import probe as runtime_probe
    from tieaudit.runtime.probe import MemoryLimitError, run_probe

    terminate = "terminate called after throwing an instance of 'std::bad_alloc'"
    crash = f"import os, sys; sys.stderr.write({terminate!r} + chr(10)); os.abort()"
    monkeypatch.setattr(runtime_probe, "probe_command", lambda: [sys.executable, "-c", crash])
    with pytest.raises(
        MemoryLimitError, match=r"^the probe exceeded the 1\.0 GiB memory limit; raise --memory-limit$"
    ):
        run_probe({"memory_limit": 1 << 30}, 30)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 << 30),
        ("512MB", 512 * 10**6),
        ("1048576", 1 << 20),
        ("1.5 KiB", 1536),
        ("2gib", 2 << 30),
        ("7b", 7),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    from tieaudit.core.units import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["4G", "lots", "-1GiB", "1e9", "4 GiBs", "9" * 70, ""])
def test_parse_size_refuses_what_is_no_size(text: str) -> None:
    from tieaudit.core.units import parse_size

    with pytest.raises(ValueError):
        parse_size(text)
