"""What each command imports before it answers (issue 25): ``--version``, ``--help`` and usage errors
import neither numpy nor the gate nor a format reader, and auditing safetensors, torch and GGUF files
imports neither onnx nor ml_dtypes nor torch: not even for an ONNX model, which is parsed with onnx's
schema captured as data (``formats/onnx_proto``). Each case runs in a fresh interpreter and reports
``sys.modules``, so a later import at module level cannot bring them back silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

PROBE = """
import json, sys
from tieaudit.cli.launch import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""

PARSING_ONLY = (
    "numpy",
    "rich",
    "tieaudit.formats",
    "tieaudit.gate.discover",
    "tieaudit.gate.check",
    "tieaudit.audit",
)
"""Nothing answering from the command line alone needs these."""
NEVER_FOR_AUDIT = ("onnx", "ml_dtypes", "torch", "transformers")
"""An audit of a safetensors, torch, GGUF or ONNX file needs none of these."""
NOT_FOR_ONE_CLEAN_FILE = (
    "rich",
    "multiprocessing",
    "concurrent.futures.process",
    "tieaudit.gate.walk",
    "tieaudit.formats.pickle_vm",
    "tieaudit.formats.hf.layouts",
    "tieaudit.formats.tie_table",
)
"""`check` of one safetensors or ONNX file without copies needs none of these: no table layout
(the check report is plain lines), no process pool, no folder walk, no pickle machine, no model
class table (consulted only to explain a copy)."""


def imported(args: list[str], cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("MODULES ")]
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["check", "--help"],
        ["retie", "--help"],
        ["rule", "--help"],
        ["check", "--fail-on", "bogus", "x"],
    ],
)
def test_answers_from_the_command_line_import_no_audit_machinery(args: list[str], tmp_path: Path) -> None:
    loaded = imported(args, tmp_path)
    assert not loaded & set(PARSING_ONLY), sorted(loaded & set(PARSING_ONLY))


def _onnx_model(folder: Path) -> None:
    """An ONNX model with a transposed copy (compared), a float16 tensor in a typed field (decoded)
    and one tensor in an external data file (located and confined)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    half = helper.make_tensor(
        "half", TensorProto.FLOAT16, [4], np.arange(4, dtype=np.float16).view(np.uint16)
    )
    graph = helper.make_graph(
        [helper.make_node("Gather", ["wte", "ids"], ["h"]), helper.make_node("MatMul", ["h", "head"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256])],
        [numpy_helper.from_array(weight, "wte"), numpy_helper.from_array(weight.T.copy(), "head"), half],
    )
    onnx.save(helper.make_model(graph), folder / "m.onnx")
    external = helper.make_model(graph)
    onnx.save(external, folder / "x.onnx", save_as_external_data=True, location="x.data", size_threshold=0)
    del graph.initializer[1]  # no copy left: nothing to explain
    onnx.save(helper.make_model(graph), folder / "clean.onnx")


def test_audits_of_every_format_import_no_onnx_ml_dtypes_or_torch(tmp_path: Path) -> None:
    import gguf
    import torch
    from safetensors import torch as safetensors_torch

    save_file({"a": np.zeros((64, 64), np.float32)}, str(tmp_path / "m.safetensors"))
    torch.save({"a": torch.zeros(8, 8)}, tmp_path / "m.pt")
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _onnx_model(tmp_path)
    wide = torch.randn(64, 64)  # a bfloat16 and a float8 copy of it: compared by their values
    casts = {"wide": wide, "half": wide.to(torch.bfloat16), "eighth": wide.to(torch.float8_e4m3fn)}
    safetensors_torch.save_file(casts, str(tmp_path / "casts.safetensors"))
    for name in ("m.safetensors", "m.pt", "m.gguf", "m.onnx", "x.onnx", "casts.safetensors"):
        for command in ("check", "inspect"):
            loaded = imported([command, name], tmp_path)
            assert "tieaudit.formats" in loaded  # the probe really audited
            assert not loaded & set(NEVER_FOR_AUDIT), (command, name, sorted(loaded & set(NEVER_FOR_AUDIT)))
    found = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", "casts.safetensors", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    relations = json.loads(found.stdout)["findings"][0]["details"]["relations"]
    assert relations == {"half": "cast", "eighth": "cast"}  # the casts were really compared
    # ONNX and GGUF files are sniffed after torch's (a polyglot is what torch.load makes of it),
    # which takes the pickle machine: only safetensors, sniffed first, is without it.
    for name, allowed in (("m.safetensors", set()), ("clean.onnx", {"tieaudit.formats.pickle_vm"})):
        loaded = imported(["check", name], tmp_path)
        assert "tieaudit.formats" in loaded
        unneeded = loaded & set(NOT_FOR_ONE_CLEAN_FILE) - allowed
        assert not unneeded, (name, sorted(unneeded))


def test_retie_imports_ml_dtypes_only_for_the_types_its_verification_needs(tmp_path: Path) -> None:
    """The reference loader (the safetensors library's numpy framework) reads bfloat16 and float8
    only through ml_dtypes' types: imported then (in a thread, while the output is written), and
    not for a file without them."""
    import torch
    from safetensors import torch as safetensors_torch

    wide = torch.randn(64, 64)
    for name, tensor in (("f32", wide), ("bf16", wide.to(torch.bfloat16))):
        safetensors_torch.save_file({"a": tensor, "b": tensor.clone()}, str(tmp_path / f"{name}.safetensors"))
        args = ["retie", f"{name}.safetensors", f"{name}-out.safetensors", "--all-equal"]
        loaded = imported(args, tmp_path)
        assert (tmp_path / f"{name}-out.safetensors").is_file(), name  # written and verified
        assert ("ml_dtypes" in loaded) == (name == "bf16"), name
