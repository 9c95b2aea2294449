"""The reference loaders (the safetensors library, onnx.load with external data, gguf's GGUFReader),
run on untrusted files in a child process with an address-space cap and a timeout per file.

A hostile file may make a reference loader allocate without bound, crash or hang: any of these
counts as "the reference refuses". One worker reads many files (imports cost once); when it dies
or stalls on a file, that file is recorded as refused and a fresh worker takes the rest.

Run as a script, this module is the worker: one JSON request per line on stdin
(``{"kind": "safetensors" | "onnx" | "gguf", "path": ...}``), one JSON result per line on stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MEMORY_LIMIT = 2 << 30
"""Address space of the worker: numpy and onnx imports take about 1 GiB of it."""
TIMEOUT = 60.0
"""Seconds one file may take before the worker is killed and the file counted as refused."""


@dataclass(frozen=True)
class Reference:
    """What a reference loader made of one file."""

    accepted: bool
    """False when the loader raised, crashed, ran out of memory or time."""
    error: str
    """The loader's error (or how the worker died) when it refused."""
    tensors: tuple[dict[str, Any], ...] = ()
    """Per tensor: name, dtype, shape, sha256 of its bytes (None when it has no numpy view)."""
    metadata: dict[str, str] | None = None
    """safetensors: the ``__metadata__`` map (None when absent)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the worker ---------------------------------------------------------------------------------


def _safetensors(path: str) -> dict[str, Any]:
    import safetensors
    from safetensors import safe_open
    from safetensors.numpy import load_file

    tensors: list[dict[str, Any]] = []
    with safe_open(path, framework="numpy") as handle:
        metadata = handle.metadata()
        missing: list[dict[str, Any]] = []
        for name in handle.keys():
            view = handle.get_slice(name)
            entry: dict[str, Any] = {"name": name, "dtype": view.get_dtype(), "shape": view.get_shape()}
            try:
                array = handle.get_tensor(name)
            except (TypeError, AttributeError):  # bf16, fp8: numpy itself has no such dtype
                entry["sha256"], entry["numpy"] = None, None
                missing.append(entry)
            else:
                entry["sha256"], entry["numpy"] = sha256(array.tobytes()), array.dtype.name
            tensors.append(entry)
    if missing:  # the library's own byte-level reader gives those tensors' bytes
        with open(path, "rb") as raw:
            by_name = {name: bytes(value["data"]) for name, value in safetensors.deserialize(raw.read())}
        for entry in missing:
            entry["sha256"] = sha256(by_name[entry["name"]])
    else:  # the other public entry point must read the same
        loaded = load_file(path)
        assert sorted(loaded) == sorted(t["name"] for t in tensors)
        for entry in tensors:
            assert sha256(loaded[entry["name"]].tobytes()) == entry["sha256"]
    return {"tensors": tensors, "metadata": metadata}


def _graph_tensors(graph: Any, graph_path: str) -> Iterator[tuple[str, str, Any]]:
    """(graph path, value name, TensorProto) for initializers, then Constant values, then subgraphs,
    depth first in node order: the order tieaudit's ONNX reader walks."""
    for init in graph.initializer:
        yield graph_path, init.name, init
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    yield graph_path, node.output[0], attr.t
    for index, node in enumerate(graph.node):
        node_path = f"{graph_path}/{node.name or f'#{index}'}" if graph_path else node.name or f"#{index}"
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g, f"{node_path}/{attr.name}")
            for position, sub in enumerate(attr.graphs):
                yield from _graph_tensors(sub, f"{node_path}/{attr.name}[{position}]")


def _onnx(path: str) -> dict[str, Any]:
    import warnings

    import onnx
    from onnx import numpy_helper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # onnx.load(path) = parse, then load_external_data_for_model(model, folder of path).
        model = onnx.load(path)
        tensors = []
        for graph_path, name, proto in _graph_tensors(model.graph, ""):
            entry = {
                "name": name,
                "graph": graph_path,
                "data_type": proto.data_type,
                "segment": proto.HasField("segment"),
            }
            try:
                array = numpy_helper.to_array(proto)
            except Exception as exc:  # this tensor cannot be decoded; the model itself loaded
                entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
            else:
                numeric = array.dtype.kind != "O"
                entry["dtype"], entry["shape"] = array.dtype.name, list(array.shape)
                entry["sha256"] = sha256(array.tobytes()) if numeric else None
            tensors.append(entry)
    return {"tensors": tensors, "metadata": None}


def _gguf(path: str) -> dict[str, Any]:
    import warnings

    from gguf import GGUFReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = GGUFReader(path)
    tensors = [
        {
            "name": tensor.name,
            "ggml_type": tensor.tensor_type.name,
            "shape": list(tensor.data.shape),
            "sha256": sha256(tensor.data.tobytes()),
        }
        for tensor in reader.tensors
    ]
    return {"tensors": tensors, "metadata": None}


def _serve() -> int:
    readers = {"safetensors": _safetensors, "onnx": _onnx, "gguf": _gguf}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = {"accepted": True, "error": "", **readers[request["kind"]](request["path"])}
        except Exception as exc:  # any refusal by the reference loader is an answer, not a crash
            result = {"accepted": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


# --- the parent ---------------------------------------------------------------------------------


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


class _Worker:
    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=_limit,
            env=env,
        )

    def ask(self, kind: str, path: str) -> Reference:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write((json.dumps({"kind": kind, "path": path}) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            return self._died("the worker died before the request")
        ready, _, _ = select.select([self.process.stdout], [], [], TIMEOUT)
        if not ready:
            self.process.kill()
            self.process.wait()
            return Reference(False, f"no answer in {TIMEOUT:.0f} s (killed)")
        line = self.process.stdout.readline()
        if not line:
            return self._died("the worker died")
        result = json.loads(line)
        return Reference(
            result["accepted"], result["error"], tuple(result.get("tensors", ())), result.get("metadata")
        )

    def _died(self, what: str) -> Reference:
        code = self.process.wait()
        return Reference(False, f"{what} (exit {code}: crash or memory cap)")

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=TIMEOUT)


def run_reference(kind: str, paths: list[str]) -> dict[str, Reference]:
    """The reference loader's answer for every path, each in a capped child process."""
    answers: dict[str, Reference] = {}
    worker = _Worker()
    try:
        for path in paths:
            answers[path] = worker.ask(kind, path)
            if worker.process.poll() is not None:  # died or killed: a fresh one for the rest
                worker = _Worker()
    finally:
        worker.close()
    return answers


if __name__ == "__main__":
    sys.exit(_serve())
