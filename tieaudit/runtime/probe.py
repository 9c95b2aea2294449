"""The measured subprocess: one ONNX Runtime session under one named configuration.

Run as ``python -m tieaudit.runtime.probe`` with the request JSON on stdin (started by ``run_probe``
below; stdin, because argv holds at most 128 KiB and a model may have thousands of inputs), one fresh
process per configuration, so that memory numbers start from the same baseline and a crash inside
ONNX Runtime kills only this process. It prints exactly one JSON line on stdout.

Before numpy or onnxruntime is imported the probe lowers its own RLIMIT_DATA to the request's
memory limit: a model that makes ONNX Runtime allocate more (a ConstantOfShape of 6.4 GB in a
135-byte file) fails that allocation, and the probe reports it as the limit being exceeded.

Imports stay minimal (stdlib, numpy, onnxruntime): whatever this module loads is part of the
baseline every configuration is measured against.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tieaudit.core.errors import TieauditError, one_line
from tieaudit.core.escape import printable
from tieaudit.core.units import human_bytes

FOLD_LIMIT_KEY = "optimization.constant_folding_max_output_size_in_bytes"
DISABLED_OPTIMIZERS_KEY = "optimization.disable_specified_optimizers"
PREPACKING_KEY = "session.disable_prepacking"
DEFAULT_FOLD_LIMIT = 1 << 20
"""Bytes: constants up to this size are still folded (shape arithmetic), weight matrices are not."""
SLEEP_ENV = "TIEAUDIT_PROBE_SLEEP"
"""For tests: seconds to sleep before creating the session (simulates a hang)."""
CRASH_ENV = "TIEAUDIT_PROBE_CRASH"
"""For tests: abort (SIGABRT) where ONNX Runtime would create the session, for these comma-separated
configuration names (or ``all``)."""
STATUS_FIELDS = ("RssAnon", "RssFile", "VmRSS", "VmHWM")
OUT_OF_MEMORY_SIGNS = (
    "MemoryError",
    "bad_alloc",
    "Failed to allocate memory",
    "Cannot allocate memory",
    "pthread_create failed",
    "Memory allocation still failed",
)
"""An allocation refused under the limit, in the words of Python, onnxruntime, glibc and OpenBLAS."""
PROBE_ENV = {"OPENBLAS_NUM_THREADS": "1"}
"""numpy's OpenBLAS starts a thread per CPU at import, ~40 MiB of writable memory each; the probe
never calls BLAS, so they would only be counted against the memory limit on a many-core machine."""


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """A named set of ONNX Runtime session options."""

    name: str
    """Short name used on the command line (--config)."""
    description: str
    """What the options change, in a few words."""
    disable_all: bool
    """graph_optimization_level ORT_DISABLE_ALL (otherwise ORT_ENABLE_ALL, the default)."""
    no_folding: bool = False
    """optimization.disable_specified_optimizers = ConstantFolding."""
    no_prepacking: bool = False
    """session.disable_prepacking = 1."""
    fold_limit: bool = False
    """optimization.constant_folding_max_output_size_in_bytes = the fold limit."""

    def entries(self, fold_limit: int = DEFAULT_FOLD_LIMIT) -> list[tuple[str, str]]:
        """The session config entries (key, value) this configuration sets."""
        found = [(DISABLED_OPTIMIZERS_KEY, "ConstantFolding")] if self.no_folding else []
        found += [(FOLD_LIMIT_KEY, str(fold_limit))] if self.fold_limit else []
        return found + ([(PREPACKING_KEY, "1")] if self.no_prepacking else [])

    def python(self, fold_limit: int = DEFAULT_FOLD_LIMIT, path: str = "model.onnx") -> tuple[str, ...]:
        """Python that creates an InferenceSession with these options."""
        lines = ["import onnxruntime as ort", "options = ort.SessionOptions()"]
        if self.disable_all:
            lines.append("options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL")
        lines += [f'options.add_session_config_entry("{k}", "{v}")' for k, v in self.entries(fold_limit)]
        # repr: a Python literal of exactly that path, whatever its quotes or bytes (pasted, it opens it)
        lines.append(f'session = ort.InferenceSession({path!r}, options, providers=["CPUExecutionProvider"])')
        return tuple(lines)


CONFIGS: dict[str, SessionConfig] = {
    c.name: c
    for c in (
        SessionConfig(
            name="default", description="ORT_ENABLE_ALL, ONNX Runtime's defaults", disable_all=False
        ),
        SessionConfig(
            name="disable_all", description="ORT_DISABLE_ALL: no graph optimization", disable_all=True
        ),
        SessionConfig(
            name="no_constant_folding", description="constant folding off", disable_all=False, no_folding=True
        ),
        SessionConfig(
            name="no_prepacking", description="weight prepacking off", disable_all=False, no_prepacking=True
        ),
        SessionConfig(
            name="both_off",
            description="constant folding and prepacking off",
            disable_all=False,
            no_folding=True,
            no_prepacking=True,
        ),
        SessionConfig(
            name="fold_size_limit",
            description="folding limited to small outputs, prepacking off",
            disable_all=False,
            no_prepacking=True,
            fold_limit=True,
        ),
    )
}


def read_status() -> dict[str, int]:
    """Memory fields of /proc/self/status in bytes (empty where /proc is not available)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in STATUS_FIELDS:
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def synthetic_inputs(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """Feeds built from the parent's input specs: ids in [0, high), masks of ones, positions, noise."""
    import numpy as np

    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    for spec in specs:
        shape, dtype, fill = tuple(spec["shape"]), np.dtype(spec["dtype"]), spec["fill"]
        if fill == "ids":
            feeds[spec["name"]] = rng.integers(0, spec["high"], size=shape).astype(dtype)
        elif fill == "ones":
            feeds[spec["name"]] = np.ones(shape, dtype=dtype)
        elif fill == "positions":
            last = shape[-1] if shape else 1
            feeds[spec["name"]] = np.broadcast_to(np.arange(last), shape).astype(dtype)
        elif fill == "normal":
            feeds[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[spec["name"]] = np.zeros(shape, dtype=dtype)
    return feeds


def session_options(config: SessionConfig, fold_limit: int, optimized_path: str | None = None) -> Any:
    """onnxruntime.SessionOptions for the configuration (warnings silenced)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    level = "ORT_DISABLE_ALL" if config.disable_all else "ORT_ENABLE_ALL"
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    for key, value in config.entries(fold_limit):
        options.add_session_config_entry(key, value)
    if optimized_path is not None:
        options.optimized_model_filepath = optimized_path
        # Initializers go to a side file: no 2 GB protobuf limit, and the parent maps them.
        data_name = os.path.basename(optimized_path) + ".data"
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    return options


def _model_source(request: dict[str, Any]) -> Any:
    """The model path, or its bytes with external data loaded (--embed-weights: no memory maps)."""
    if not request.get("embed_weights"):
        return request["model"]
    import onnx

    model = onnx.load(request["model"], load_external_data=True)  # locations checked by the parent
    return model.SerializeToString()


def _create(model: Any, options: Any, config: str) -> Any:
    import onnxruntime as ort

    crash = os.environ.get(CRASH_ENV, "").split(",")
    if config in crash or "all" in crash:
        os.abort()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """Create the session, measure memory and latency, save the optimized model; the result record."""
    import onnxruntime as ort

    config, fold_limit = CONFIGS[request["config"]], int(request["fold_limit"])
    result: dict[str, Any] = {"config": config.name, "onnxruntime_version": ort.__version__}
    model = _model_source(request)
    delay = float(os.environ.get(SLEEP_ENV) or 0)
    if delay:
        time.sleep(delay)
    if request["measure"]:
        feeds = synthetic_inputs(request["inputs"])
        gc.collect()
        result["baseline"] = read_status()
        start = time.perf_counter()
        session = _create(model, session_options(config, fold_limit), config.name)
        result["create_seconds"] = time.perf_counter() - start
        result["created"] = read_status()
        session.run(None, feeds)  # warm-up, not timed
        latencies = []
        for _ in range(int(request["runs"])):
            start = time.perf_counter()
            session.run(None, feeds)
            latencies.append((time.perf_counter() - start) * 1000)
        result["after_runs"] = read_status()
        result["latencies_ms"] = latencies
        result["median_ms"] = statistics.median(latencies) if latencies else None
        del session
    if request.get("optimized_path"):
        _create(model, session_options(config, fold_limit, request["optimized_path"]), config.name)
    return result


# --- the parent's side: start a probe, bound it by a timeout, turn its end into a result or an error


class ProbeError(TieauditError):
    """ONNX Runtime failed, crashed or timed out in a probe subprocess."""


def probe_command() -> list[str]:
    """argv prefix of the probe subprocess (tests replace it)."""
    return [sys.executable, "-m", "tieaudit.runtime.probe"]


class MemoryLimitError(ProbeError):
    """The probe needed more memory than its limit."""


def run_probe(
    request: Mapping[str, object], timeout: float, raise_limit: str = "raise --memory-limit"
) -> dict[str, Any]:
    """Run one probe; its JSON result, or ProbeError for a crash, a timeout or an ORT error.

    MemoryLimitError (a ProbeError) when an allocation was refused under request["memory_limit"];
    raise_limit says how the user gives it more.
    """
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(
        os.environ,
        **PROBE_ENV,
        PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
    )
    process = subprocess.Popen(
        probe_command(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(json.dumps(request), timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: ORT's threads and anything it started
        process.communicate()
        raise ProbeError(
            f"timed out after {timeout:g} s (session creation or inference did not finish)"
        ) from None
    limit = request.get("memory_limit")
    exceeded = MemoryLimitError(
        f"the probe exceeded the {human_bytes(int(limit))} memory limit; {raise_limit}"
        if isinstance(limit, int) and limit
        else "the probe ran out of memory"
    )
    last_err = printable(next((line.strip() for line in reversed(err.splitlines()) if line.strip()), ""))
    if process.returncode < 0:
        try:
            name = signal.Signals(-process.returncode).name
        except ValueError:
            name = f"signal {-process.returncode}"
        if out_of_memory(err):  # std::terminate after a bad_alloc on one of ORT's threads
            raise exceeded
        raise ProbeError(f"onnxruntime crashed (killed by {name})" + (f": {last_err}" if last_err else ""))
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        if out_of_memory(err):
            raise exceeded from None
        raise ProbeError(
            f"the probe exited with code {process.returncode} without a result"
            + (f": {last_err}" if last_err else "")
        ) from None
    if not result.get("ok"):
        if result.get("out_of_memory"):
            raise exceeded
        raise ProbeError(f"onnxruntime failed: {printable(str(result.get('error')))}")
    return result


def limit_memory(limit: int) -> int:
    """Lower this process's RLIMIT_DATA to limit (never raise it, even as root); the limit in force.

    RLIMIT_DATA bounds writable private memory (heap, anonymous maps, thread stacks): what an
    allocation consumes. RLIMIT_AS would also count address space ONNX Runtime reserves and never
    touches (64 MiB per malloc arena, one arena per thread) and the memory-mapped weights, so an
    honest run on a many-core machine would need several GiB more than it uses.
    """
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY and 0 <= soft < limit:
        limit = soft  # an outer limit is tighter: keep it
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return limit


def out_of_memory(message: str) -> bool:
    """The message is an allocation refused (under the memory limit)."""
    return any(sign in message for sign in OUT_OF_MEMORY_SIGNS)


def main(argv: list[str] | None = None) -> int:
    """Entry point: request JSON on stdin (or argv[0]), one JSON line out; 0 measured, 3 failed."""
    args = sys.argv[1:] if argv is None else argv
    try:
        request = json.loads(args[0] if args else sys.stdin.read())
        if request.get("memory_limit"):
            limit_memory(int(request["memory_limit"]))
        result = probe(request)
    except MemoryError:
        print(json.dumps({"ok": False, "error": "MemoryError", "out_of_memory": True}), flush=True)
        return 3
    except Exception as exc:  # onnxruntime's errors are plain RuntimeError/Fail subclasses: report any
        message = f"{type(exc).__name__}: {one_line(exc)}"
        refused = out_of_memory(f"{type(exc).__name__}: {exc}")  # the sign may be past one_line's cut
        print(json.dumps({"ok": False, "error": message, "out_of_memory": refused}), flush=True)
        return 3
    print(json.dumps({"ok": True, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
