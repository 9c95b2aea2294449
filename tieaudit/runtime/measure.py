"""Does ONNX Runtime hold a shared initializer twice? Measure each session configuration, name the copies.

Each configuration runs in a fresh subprocess (``tieaudit.runtime.probe``) with a timeout: anonymous
memory (RssAnon) after session creation and after a few runs, the peak, median latency; then the
optimized model ORT saves is searched for copies of the input's initializers (``runtime_graph``).
The recommendation is the configuration that holds one copy (no static copy, no memory excess)
with the lowest latency.

Each probe runs under a memory limit (``default_memory_limit``: a base, the CPU count and a
multiple of the model's bytes; ``--memory-limit`` or TIEAUDIT_RUNTIME_MEMORY_LIMIT overrides it),
so a small hostile model cannot make ONNX Runtime allocate gigabytes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tieaudit.core.errors import TieauditError, UsageError
from tieaudit.core.exit_codes import ExitCode
from tieaudit.core.extras import require
from tieaudit.core.shell import Advice, advice, tieaudit_command
from tieaudit.core.units import checked_seconds, human_bytes
from tieaudit.rules.finding import SEVERITY_RANK, Finding, Severity
from tieaudit.rules.runtime_duplicate import RUNTIME_DUPLICATE
from tieaudit.runtime.graph import InputSpec, ModelFacts, StaticView, analyse_optimized, read_model
from tieaudit.runtime.memory import MEMORY_LIMIT_ENV, default_memory_limit, memory_limit_from_env
from tieaudit.runtime.probe import CONFIGS, ProbeError, SessionConfig, run_probe

DEFAULT_TIMEOUT = 300.0
DEFAULT_RUNS = 10
NOISE_FLOOR = 16 << 20
"""Memory differences between configurations below this are allocator and thread-pool noise."""
MEASURED_FIELD = "RssAnon"


@dataclass(frozen=True, kw_only=True)
class ConfigResult:
    """One configuration's measurement and static view (or its error)."""

    config: SessionConfig
    """The session options measured."""
    error: str | None = None
    """Why this configuration has no numbers (crash, timeout, ORT error)."""
    memory: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """/proc/self/status fields (bytes) at baseline, created and after_runs."""
    latencies_ms: tuple[float, ...] = ()
    """Each timed run."""
    median_ms: float | None = None
    """Median of latencies_ms."""
    static: StaticView | None = None
    """ORT's copies in the optimized model of this configuration."""
    excess_bytes: int = 0
    """Anonymous memory above the leanest configuration (after creation or after runs, the larger)."""
    one_copy: bool = False
    """No static copy and no memory excess above the threshold."""
    onnxruntime_version: str = ""
    """The version the probe ran."""

    def grown(self, stage: str, key: str = MEASURED_FIELD) -> int | None:
        """Bytes of key above the probe's baseline at stage (created, after_runs)."""
        if stage not in self.memory or key not in self.memory[stage]:
            return None
        return self.memory[stage][key] - self.memory["baseline"][key]

    @property
    def peak(self) -> int | None:
        """Peak resident memory (VmHWM) above the baseline's resident memory (VmRSS)."""
        after, baseline = self.memory.get("after_runs", {}), self.memory.get("baseline", {})
        return after["VmHWM"] - baseline["VmRSS"] if "VmHWM" in after and "VmRSS" in baseline else None


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The configuration to use, and what it costs."""

    config: str
    """Its name."""
    median_ms: float
    """Its median latency."""
    latency_cost: float | None
    """Relative latency change vs default (0.69 = 69% slower); None when default was not measured."""
    python: tuple[str, ...]
    """The Python lines that create such a session."""


@dataclass(frozen=True, kw_only=True)
class RuntimeReport:
    """Everything ``tieaudit runtime`` found for one model."""

    path: str
    onnxruntime_version: str
    external_data: bool
    """Weights in external data: ORT memory-maps them (RssFile), RssAnon does not count them."""
    embed_weights: bool
    """The probe loaded external data into the model bytes (so RssAnon counts the weights)."""
    initializer_bytes: int
    shared: Mapping[str, tuple[str, ...]]
    """Initializers read by two or more nodes -> their readers."""
    inputs: tuple[InputSpec, ...]
    runs: int
    fold_limit: int
    threshold: int
    """Memory excess above which a configuration holds another copy."""
    configs: tuple[ConfigResult, ...]
    gated: tuple[str, ...]
    """Configurations whose copies are findings (default, or the ones asked for without it)."""
    findings: tuple[Finding, ...]
    recommendation: Recommendation | None
    memory_limit: int = 0
    """Bytes each probe could use (RLIMIT_DATA)."""

    @property
    def errors(self) -> tuple[ConfigResult, ...]:
        """Configurations that failed."""
        return tuple(c for c in self.configs if c.error is not None)

    def exit_code(self, fail_on: Severity, *, exit_zero: bool = False) -> ExitCode:
        """BAD_INPUT when a configuration failed; else FINDINGS when a finding reaches fail_on
        (unless exit_zero); else OK."""
        if self.errors:
            return ExitCode.BAD_INPUT
        rank = SEVERITY_RANK[fail_on]
        failing = any(SEVERITY_RANK[f.severity] >= rank for f in self.findings)
        return ExitCode.FINDINGS if failing and not exit_zero else ExitCode.OK


def _probe_config(
    model: ModelFacts,
    config: SessionConfig,
    request: dict[str, object],
    *,
    timeout: float,
    folder: str,
    raise_limit: str,
) -> ConfigResult:
    optimized = os.path.join(folder, f"{config.name}.onnx")
    try:
        probe_request = {**request, "config": config.name, "optimized_path": optimized}
        result = run_probe(probe_request, timeout, raise_limit)
        static = analyse_optimized(
            optimized, model.originals, model.stored, prepacking=not config.no_prepacking
        )
    except TieauditError as exc:
        return ConfigResult(config=config, error=str(exc))
    memory: dict[str, dict[str, int]] = {
        k: result[k] for k in ("baseline", "created", "after_runs") if k in result
    }
    latencies = tuple(result.get("latencies_ms", ()))
    median = result.get("median_ms")
    return ConfigResult(
        config=config,
        error=None,
        memory=memory,
        latencies_ms=latencies,
        median_ms=float(median) if isinstance(median, (int, float)) else None,
        static=static,
        onnxruntime_version=str(result.get("onnxruntime_version", "")),
    )


def _judge(results: list[ConfigResult], threshold: int) -> list[ConfigResult]:
    """Excess over the leanest configuration, and the one-copy verdict, for each measured result."""
    ok = [r for r in results if r.error is None and r.grown("created") is not None]
    if not ok:
        return results
    floors = {stage: min(r.grown(stage) or 0 for r in ok) for stage in ("created", "after_runs")}
    judged = []
    for result in results:
        if result.error is not None or result.grown("created") is None:
            judged.append(result)
            continue
        excess = max((result.grown(stage) or 0) - floors[stage] for stage in floors)
        # A copy made on every run (an unfolded Transpose of the matrix) is a copy too.
        copies = bool(result.static and (result.static.duplicates or result.static.recomputed))
        judged.append(replace(result, excess_bytes=excess, one_copy=not copies and excess < threshold))
    return judged


def _recommend(results: Sequence[ConfigResult], fold_limit: int, path: str) -> Recommendation | None:
    candidates = [r for r in results if r.one_copy and r.median_ms is not None]
    if not candidates:
        return None
    # Where the defaults already hold one copy, nothing needs to change (latency noise is no reason).
    default_ok = [r for r in candidates if r.config.name == "default"]
    best = default_ok[0] if default_ok else min(candidates, key=lambda r: r.median_ms or 0.0)
    default = next((r for r in results if r.config.name == "default" and r.median_ms), None)
    cost = (best.median_ms or 0.0) / default.median_ms - 1 if default and default.median_ms else None
    return Recommendation(
        config=best.config.name,
        median_ms=best.median_ms or 0.0,
        latency_cost=cost,
        python=best.config.python(fold_limit, path),
    )


def duplicate_findings(
    config: str, static: StaticView, fix: Advice | None, *, measured_excess: int | None = None
) -> list[Finding]:
    """TIE005 for each copy ORT holds under config."""
    findings = []
    for dup in static.duplicates:
        if dup.mechanism == "constant-folding":
            what = (
                f"constant-folds {dup.copy} into a new initializer, a {dup.relation} copy of {dup.original} "
                f"({human_bytes(dup.nbytes)}), while the graph still reads {dup.original}"
            )
            names: tuple[str, ...] = (dup.original, dup.copy or "")
        else:
            what = (
                f"prepacks {dup.original} for {', '.join(dup.consumers)} and keeps the original for its "
                f"other readers: {human_bytes(dup.nbytes)} more"
            )
            names = (dup.original,)
        details: dict[str, object] = {
            "config": config,
            "mechanism": dup.mechanism,
            "consumers": list(dup.consumers),
        }
        if measured_excess is not None:
            details["measured_excess_bytes"] = measured_excess
        findings.append(
            RUNTIME_DUPLICATE.finding(
                names,
                f"ONNX Runtime ({config} session options) {what}.",
                relation=dup.relation,
                wasted_bytes=dup.nbytes,
                fix=fix,
                details=details,
            )
        )
    return findings


def require_runtime(for_what: str = "the runtime check") -> None:
    """MissingExtra (pip install 'tieaudit[runtime]') when onnxruntime is not installed: once, before
    any probe, instead of every probe failing on its import. Looked up, not imported: only the
    probes import it, in their own processes."""
    require(for_what, ("onnxruntime",), load=False)


def measure_runtime(
    path: str,
    *,
    configs: Sequence[str] | None = None,
    dims: Mapping[str, int] | None = None,
    runs: int = DEFAULT_RUNS,
    timeout: float = DEFAULT_TIMEOUT,
    fold_limit: int | None = None,
    embed_weights: bool = False,
    memory_limit: int | None = None,
) -> RuntimeReport:
    """Measure each configuration in its own subprocess and analyse ORT's optimized models.

    memory_limit: bytes each probe may use (default: default_memory_limit of the model).
    """
    timeout = checked_seconds(timeout, "--timeout")
    names = list(dict.fromkeys(configs or CONFIGS))
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise UsageError(f"unknown configuration {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    require_runtime("runtime")
    model = read_model(path, dims or {})
    fold_limit = model.fold_limit if fold_limit is None else fold_limit
    limit = default_memory_limit(model) if memory_limit is None else memory_limit
    request: dict[str, object] = {
        "model": model.path,
        "fold_limit": fold_limit,
        "runs": runs,
        "measure": True,
        "memory_limit": limit,
        "embed_weights": embed_weights and model.external,
        "inputs": [vars(s) for s in model.inputs],
    }
    with tempfile.TemporaryDirectory(prefix="tieaudit-runtime-") as folder:
        results = [
            _probe_config(
                model, CONFIGS[n], request, timeout=timeout, folder=folder, raise_limit="raise --memory-limit"
            )
            for n in names
        ]
    threshold = max(NOISE_FLOOR, model.largest_shared // 2)
    results = _judge(results, threshold)
    gated = ("default",) if "default" in names else tuple(names)
    recommendation = _recommend(results, fold_limit, path)
    fix = (
        advice("create the session with " + "; ".join(recommendation.python[2:-1]))
        if recommendation and recommendation.config != "default"
        else None
    )
    findings = [
        f
        for r in results
        if r.config.name in gated and r.static
        for f in duplicate_findings(r.config.name, r.static, fix, measured_excess=r.excess_bytes)
    ]
    version = next((r.onnxruntime_version for r in results if r.onnxruntime_version), "unknown")
    return RuntimeReport(
        path=path,
        onnxruntime_version=version,
        external_data=model.external,
        embed_weights=bool(request["embed_weights"]),
        initializer_bytes=sum(model.sizes.values()),
        shared=model.shared,
        inputs=model.inputs,
        runs=runs,
        fold_limit=fold_limit,
        threshold=threshold,
        configs=tuple(results),
        gated=gated,
        findings=tuple(findings),
        recommendation=recommendation,
        memory_limit=limit,
    )


def runtime_findings(
    path: str,
    timeout: float = DEFAULT_TIMEOUT,
    shown_path: str | None = None,
    *,
    memory_limit: int | None = None,
) -> list[Finding]:
    """TIE005 findings of the default session options, from the optimized model alone (no measurement).

    memory_limit: bytes the probe may use (default: TIEAUDIT_RUNTIME_MEMORY_LIMIT, else
    default_memory_limit of the model). Raises ProbeError when ONNX Runtime cannot create a session
    for the model (or crashes, times out, or needs more memory than the limit).
    """
    require_runtime()
    model = read_model(path, {}, with_inputs=False)  # no inference: no synthetic inputs to build
    fold_limit = model.fold_limit
    limit = memory_limit or memory_limit_from_env() or default_memory_limit(model)
    request = {
        "model": model.path,
        "fold_limit": fold_limit,
        "runs": 0,
        "measure": False,
        "memory_limit": limit,
        "inputs": [],
    }
    raise_limit = f"set {MEMORY_LIMIT_ENV} to more (e.g. {human_bytes(2 * limit).replace(' ', '')})"
    with tempfile.TemporaryDirectory(prefix="tieaudit-runtime-") as folder:
        result = _probe_config(
            model, CONFIGS["default"], request, timeout=timeout, folder=folder, raise_limit=raise_limit
        )
    if result.error is not None or result.static is None:
        raise ProbeError(result.error or "no static view", path)
    shown = shown_path or path
    options = "; ".join(CONFIGS["both_off"].python(fold_limit, shown)[2:-1])  # the lines without the path
    measures = tieaudit_command("runtime", shown)
    fix = advice(f"create the session with {options} (", measures, " measures the cost)")
    return duplicate_findings("default", result.static, fix)
