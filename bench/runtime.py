"""Runtime benchmark (issue 5): does ONNX Runtime hold a tied GPT-2-size embedding twice?

Builds a tied GPT-2 from a config (vocab 50257, n_embd 768, 2 layers; random init, no hub), with
its 1-D parameters drawn at random like a trained model's (so no two parameters hold equal values
and the exporter's deduplication of constant vectors does not blur the byte counts), then:

1. exports it with the dynamo exporter, weights embedded in the .onnx, and runs
   `tieaudit runtime` on it: memory per session configuration, ORT's copies, the recommendation;
2. exports it with TorchScript (dynamo=False): `tieaudit check` must flag TIE001 transposed;
3. runs `tieaudit export` on the saved Hugging Face folder: initializer bytes must equal the
   parameter bytes, parity with torch within 1e-5.

Every tieaudit command runs as its own process. Files go to bench/out/runtime/ (rebuilt with --force).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

from common import OUT_DIR, format_table, machine_summary, python

WORK = os.path.join(OUT_DIR, "runtime")
FOLDER = os.path.join(WORK, "gpt2-50257x768x2")
DYNAMO = os.path.join(WORK, "gpt2_dynamo.onnx")
TORCHSCRIPT = os.path.join(WORK, "gpt2_torchscript.onnx")
EXPORTED = os.path.join(WORK, "gpt2_tieaudit_export.onnx")
EMBEDDING_BYTES = 50257 * 768 * 4
MIB = 1 << 20
# Until cli.py registers runtime and export, this shim does (a no-op once they are registered).
SHIM = (
    "import sys; from tieaudit.cli.main import cli, main; from tieaudit.cli import onnx as cli_onnx; "
    "[cli.add_command(c) for c in (cli_onnx.runtime, cli_onnx.export) if c.name not in cli.commands]; "
    "sys.exit(main(sys.argv[1:]))"
)

BUILD = """
import contextlib, io, logging, sys, warnings
import torch, transformers
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
logging.disable(logging.WARNING)
folder, dynamo_path, torchscript_path = sys.argv[1:4]
torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=50257, n_embd=768, n_layer=2, n_head=12, tie_word_embeddings=True)
model = transformers.GPT2LMHeadModel(config).eval()
with torch.no_grad():
    for parameter in model.parameters():
        if parameter.dim() == 1:
            parameter.normal_(0, 0.02)
assert model.lm_head.weight is model.transformer.wte.weight
model.save_pretrained(folder)
print(sum(p.numel() * p.element_size() for p in model.parameters()))

class LogitsOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = model
    def forward(self, input_ids):
        mask = torch.ones_like(input_ids)
        return self.m(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

ids = torch.zeros((1, 8), dtype=torch.int64)
for path, dynamo in ((dynamo_path, True), (torchscript_path, False)):
    extra = {"external_data": False} if dynamo else {}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(LogitsOnly().eval(), (ids,), path, dynamo=dynamo, input_names=["input_ids"],
                          output_names=["logits"], **extra)
"""


def tieaudit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python(), "-c", SHIM, *args], capture_output=True, text=True, check=False)


def build(force: bool) -> int:
    """The model files (reused when present); returns the torch parameter bytes."""
    stamp = os.path.join(WORK, "parameter_bytes.txt")
    if not force and all(os.path.exists(p) for p in (stamp, FOLDER, DYNAMO, TORCHSCRIPT)):
        with open(stamp) as handle:
            return int(handle.read())
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    start = time.perf_counter()
    run = subprocess.run([python(), "-c", BUILD, FOLDER, DYNAMO, TORCHSCRIPT], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"building the model failed:\n{run.stderr[-3000:]}")
    with open(stamp, "w") as handle:
        handle.write(run.stdout.strip().splitlines()[-1])
    print(f"built and exported in {time.perf_counter() - start:.1f} s", flush=True)
    return build(False)


def onnx_initializer_bytes(path: str) -> tuple[int, int]:
    """(bytes of weight initializers, bytes of graph constants: scalars and shape vectors of <= 16 values)."""
    code = (
        "import sys, onnx; from onnx import numpy_helper; m = onnx.load(sys.argv[1]); "
        "a = [numpy_helper.to_array(i) for i in m.graph.initializer]; "
        "print(sum(x.nbytes for x in a if x.size > 16), sum(x.nbytes for x in a if x.size <= 16))"
    )
    run = subprocess.run([python(), "-c", code, path], capture_output=True, text=True, check=True)
    weights, constants = run.stdout.split()
    return int(weights), int(constants)


def runtime_section(runs: int, failures: list[str]) -> None:
    start = time.perf_counter()
    report_path = os.path.join(WORK, "runtime.json")
    run = tieaudit("runtime", DYNAMO, "--runs", str(runs), "--format", "json", "-o", report_path)
    elapsed = time.perf_counter() - start
    if run.returncode not in (0, 1):
        failures.append(f"tieaudit runtime exited {run.returncode}: {run.stderr.strip()}")
        return
    with open(report_path) as handle:
        report = json.load(handle)
    print(f"\n1. tieaudit runtime {os.path.relpath(DYNAMO)}  (exit {run.returncode}, {elapsed:.1f} s)")
    print(report["note"])
    rows = []
    for config in report["configs"]:
        if not config["ok"]:
            rows.append([config["name"], "error", "", "", "", "", config["error"]])
            continue
        rows.append(
            [
                config["name"],
                f"{config['rss_anon_created_bytes'] / MIB:.1f}",
                f"{config['rss_anon_after_runs_bytes'] / MIB:.1f}",
                f"{config['peak_bytes'] / MIB:.1f}",
                f"{config['median_latency_ms']:.2f}",
                f"{config['duplicate_bytes'] / MIB:.1f}",
                "yes" if config["one_copy"] else "no",
            ]
        )
    headers = [
        "config",
        "RssAnon created MiB",
        "after runs MiB",
        "peak MiB",
        "median ms",
        "ORT copy MiB",
        "one copy",
    ]
    print(format_table(headers, rows))
    for config in report["configs"]:
        for dup in config.get("duplicates", []):
            what = f"{dup['copy']} = {dup['relation']} copy of" if dup["copy"] else "prepacked copy of"
            size = f"{dup['nbytes'] / MIB:.1f} MiB"
            print(f"  {config['name']}: {what} {dup['original']} ({size}, {dup['mechanism']})")
    rec = report["recommendation"]
    if rec is None:
        failures.append("no configuration holds one copy")
        return
    cost = rec["latency_cost_vs_default"]
    print(
        f"recommendation: {rec['config']}, median {rec['median_latency_ms']:.2f} ms"
        + ("" if cost is None else f" ({cost:+.0%} vs default)")
    )
    print("\n".join(f"    {line}" for line in rec["session_options"]))
    by_name = {c["name"]: c for c in report["configs"]}
    default = by_name["default"]
    copies = [
        d for d in default["duplicates"] if d["relation"] == "transposed" and d["nbytes"] == EMBEDDING_BYTES
    ]
    if not copies:
        failures.append("default: no transposed copy of the embedding named in the optimized model")
    extra = default["rss_anon_created_bytes"] - by_name[rec["config"]]["rss_anon_created_bytes"]
    print(
        f"default holds {extra / MIB:.1f} MiB more anonymous memory than {rec['config']} "
        f"(the embedding is {EMBEDDING_BYTES / MIB:.1f} MiB)"
    )
    if extra < 0.8 * EMBEDDING_BYTES:
        failures.append(f"default's extra memory {extra / MIB:.1f} MiB is not about one embedding")


def torchscript_section(failures: list[str]) -> None:
    run = tieaudit("check", TORCHSCRIPT, "--format", "json")
    findings = json.loads(run.stdout)["findings"] if run.stdout.strip().startswith("{") else []
    tie001 = [f for f in findings if f["rule"] == "TIE001"]
    print(f"\n2. tieaudit check {os.path.relpath(TORCHSCRIPT)}  (exit {run.returncode})")
    for finding in tie001:
        print(
            f"  {finding['rule']} {finding['relation']}: {', '.join(finding['names'])} "
            f"({finding['wasted_bytes'] / MIB:.1f} MiB)"
        )
    if not any(f["relation"] == "transposed" for f in tie001):
        failures.append("TorchScript export: no TIE001 transposed")


def export_section(parameter_bytes: int, failures: list[str]) -> None:
    for path in (EXPORTED, EXPORTED + ".data"):
        if os.path.exists(path):
            os.unlink(path)
    start = time.perf_counter()
    run = tieaudit("export", FOLDER, EXPORTED, "--atol", "1e-5")
    elapsed = time.perf_counter() - start
    print(
        f"\n3. tieaudit export {os.path.relpath(FOLDER)} {os.path.relpath(EXPORTED)}  "
        f"(exit {run.returncode}, {elapsed:.1f} s)"
    )
    print(run.stderr.rstrip())
    if run.returncode != 0:
        failures.append(f"tieaudit export exited {run.returncode}")
        return
    weights, constants = onnx_initializer_bytes(EXPORTED)
    parity = float(re.search(r"max abs difference (\S+)", run.stderr).group(1))  # type: ignore[union-attr]
    print(
        f"initializer bytes: weights {weights:,} (torch parameters {parameter_bytes:,}), "
        f"graph constants {constants:,} (scalars and shape vectors); parity {parity:.3g}"
    )
    if weights != parameter_bytes:
        failures.append(
            f"export: weight initializer bytes {weights:,} != parameter bytes {parameter_bytes:,}"
        )
    if parity > 1e-5:
        failures.append(f"export: parity {parity:.3g} > 1e-5")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per configuration")
    parser.add_argument("--force", action="store_true", help="rebuild the model files")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    print(f"machine: {machine_summary()}")
    parameter_bytes = build(args.force)
    print(
        f"model: tied GPT-2, vocab 50257, n_embd 768, 2 layers; {parameter_bytes / MIB:.1f} MiB of parameters"
    )
    failures: list[str] = []
    runtime_section(args.runs, failures)
    torchscript_section(failures)
    export_section(parameter_bytes, failures)
    print()
    for failure in failures:
        print(f"error: {failure}")
    print("all targets met" if not failures else f"{len(failures)} target(s) failed")
    return 1 if failures and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
