"""The runtime report: a plain-text table with a recommendation, and JSON (schema tieaudit.runtime/1)."""

from __future__ import annotations

import json
from typing import Any

from tieaudit.core.escape import printable
from tieaudit.core.units import human_bytes
from tieaudit.core.version import __version__
from tieaudit.report.finding_text import finding_lines
from tieaudit.report.json_report import finding_dict
from tieaudit.report.plain import DEFAULT_WIDTH
from tieaudit.report.wrap import plain
from tieaudit.runtime.export import ExportedFile, ExportResult
from tieaudit.runtime.measure import ConfigResult, RuntimeReport

SCHEMA = "tieaudit.runtime/1"
MIB = 1 << 20
HEADERS = ("config", "created", "after runs", "peak", "median ms", "ORT copies", "one copy")


def measured_note(report: RuntimeReport) -> str:
    """Which memory was measured, and why (the external-data trap)."""
    if report.external_data and not report.embed_weights:
        return (
            "Weights are in external data: ONNX Runtime memory-maps them (counted in RssFile, not RssAnon), "
            "so RSS under-reports them. Measured: RssAnon (anonymous memory), where copies ORT makes live; "
            "--embed-weights loads the weights into the session instead."
        )
    where = "embedded in the .onnx"
    if report.embed_weights:
        where = "loaded from external data into the session from memory (--embed-weights)"
    return f"Weights {where}. Measured: RssAnon (anonymous memory) above the probe's baseline."


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def _row(result: ConfigResult, mapped: bool) -> tuple[str, ...]:
    if result.error is not None:
        return (result.config.name, "error", *[""] * (len(HEADERS) - 2 + mapped))
    copies = result.static.duplicate_bytes if result.static else 0
    row = (
        result.config.name,
        _mib(result.grown("created")),
        _mib(result.grown("after_runs")),
        _mib(result.peak),
        "-" if result.median_ms is None else f"{result.median_ms:.2f}",
        human_bytes(copies) if copies else "none",
        "yes" if result.one_copy else "no",
    )
    # With external data, the mapped weights show in RssFile: the column makes the trap visible.
    return (*row[:4], _mib(result.grown("created", "RssFile")), *row[4:]) if mapped else row


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _static_lines(result: ConfigResult) -> list[str]:
    lines = []
    for dup in result.static.duplicates if result.static else ():
        if dup.mechanism == "constant-folding":
            lines.append(
                f"  {result.config.name}: {dup.copy} = {dup.relation} copy of {dup.original} "
                f"({human_bytes(dup.nbytes)}, constant folding; read by {', '.join(dup.consumers)})"
            )
        else:
            packers = ", ".join(dup.consumers)
            lines.append(
                f"  {result.config.name}: {dup.original} prepacked for {packers} and kept for its "
                f"other readers ({human_bytes(dup.nbytes)}, prepacking)"
            )
    lines += [
        f"  {result.config.name}: {item.op_type} {item.node} of {item.initializer} runs on every call "
        f"({human_bytes(item.nbytes)} temporary each run)"
        for item in (result.static.recomputed if result.static else ())
    ]
    return lines


def _recommendation_lines(report: RuntimeReport) -> list[str]:
    rec = report.recommendation
    if rec is None:
        return ["Recommendation: no measured configuration holds one copy."]
    if rec.config == "default":
        return ["Recommendation: the default session options already hold one copy; nothing to change."]
    chosen = next(r for r in report.configs if r.config.name == rec.config)
    default = next((r for r in report.configs if r.config.name == "default" and r.error is None), None)
    memory = f"{_mib(chosen.grown('created'))} MiB after session creation"
    if default is not None:
        memory += f" ({_mib(default.grown('created'))} MiB with the defaults)"
    cost = "" if rec.latency_cost is None else f" ({rec.latency_cost:+.0%} vs default)"
    return [
        f"Recommendation: {rec.config} ({chosen.config.description}) holds one copy: {memory}; "
        f"median latency {rec.median_ms:.2f} ms{cost}.",
        "",
        *(f"    {line}" for line in rec.python),
    ]


def render_runtime_text(report: RuntimeReport, *, errors: bool = True, width: int = DEFAULT_WIDTH) -> str:
    """The human report; errors=False leaves out the Errors section (stderr has those lines, on the
    same screen); its findings as in check, fitting width."""
    out = [
        f"{report.path}  onnxruntime {report.onnxruntime_version}, CPU; "
        f"{human_bytes(report.initializer_bytes)} of initializers"
    ]
    for name, readers in report.shared.items():
        out.append(f"shared initializer: {name} (read by {', '.join(readers)})")
    feeds = ", ".join(
        f"{s.name} {s.dtype}{list(s.shape)}" + (f" ids in [0, {s.high})" if s.fill == "ids" else f" {s.fill}")
        for s in report.inputs
    )
    out += [
        f"inputs: {feeds or 'none'}; {report.runs} timed runs after one warm-up; "
        f"memory limit {human_bytes(report.memory_limit)} per probe",
        measured_note(report),
        "Memory columns: MiB above the probe's baseline (created, after runs: RssAnon; peak: VmHWM;"
        " mapped: RssFile after creation, where external data is counted).",
        "",
    ]
    mapped = report.external_data and not report.embed_weights
    headers = (*HEADERS[:4], "mapped (RssFile)", *HEADERS[4:]) if mapped else HEADERS
    out += _table([headers, *(_row(r, mapped) for r in report.configs)])
    static = [line for r in report.configs for line in _static_lines(r)]
    out += ["", "Copies ONNX Runtime makes (its optimized model, read by tieaudit):", *(static or ["  none"])]
    failures = [f"  {r.config.name}: {r.error}" for r in report.errors]
    if failures and errors:
        out += ["", "Errors:", *failures]
    out += ["", *_recommendation_lines(report)]
    gated = ", ".join(report.gated)
    failed = [r.config.name for r in report.errors if r.config.name in report.gated]
    if report.findings:
        out += ["", f"Findings ({gated}):"]
        out += [plain(line) for f in report.findings for line in finding_lines(f, width)]
    elif failed:
        out += ["", f"Runtime duplicates under {', '.join(failed)}: unknown, the configuration failed."]
    else:
        out += ["", f"No runtime duplicate under {gated}."]
    return "\n".join(printable(line) for line in out) + "\n"  # names come from the model


def _config_dict(result: ConfigResult) -> dict[str, Any]:
    static = result.static
    return {
        "name": result.config.name,
        "description": result.config.description,
        "ok": result.error is None,
        "error": result.error,
        "rss_anon_created_bytes": result.grown("created"),
        "rss_anon_after_runs_bytes": result.grown("after_runs"),
        "rss_file_created_bytes": result.grown("created", "RssFile"),
        "peak_bytes": result.peak,
        "median_latency_ms": result.median_ms,
        "latencies_ms": list(result.latencies_ms),
        "memory": {stage: dict(fields) for stage, fields in result.memory.items()},
        "duplicate_bytes": static.duplicate_bytes if static else None,
        "duplicates": [
            vars(d) | {"consumers": list(d.consumers)} for d in (static.duplicates if static else ())
        ],
        "recomputed": [vars(r) for r in static.recomputed] if static else [],
        "excess_bytes": result.excess_bytes,
        "one_copy": result.one_copy,
    }


def runtime_dict(report: RuntimeReport) -> dict[str, Any]:
    """The report as plain data (schema tieaudit.runtime/1)."""
    rec = report.recommendation
    return {
        "schema": SCHEMA,
        "tieaudit_version": __version__,
        "path": report.path,
        "onnxruntime_version": report.onnxruntime_version,
        "measured": "RssAnon",
        "external_data": report.external_data,
        "weights_embedded": report.embed_weights or not report.external_data,
        "note": measured_note(report),
        "initializer_bytes": report.initializer_bytes,
        "shared_initializers": [{"name": n, "consumers": list(c)} for n, c in report.shared.items()],
        "inputs": [vars(s) | {"shape": list(s.shape)} for s in report.inputs],
        "runs": report.runs,
        "fold_limit_bytes": report.fold_limit,
        "threshold_bytes": report.threshold,
        "memory_limit_bytes": report.memory_limit,
        "configs": [_config_dict(r) for r in report.configs],
        "gated_configs": list(report.gated),
        "recommendation": None
        if rec is None
        else {
            "config": rec.config,
            "median_latency_ms": rec.median_ms,
            "latency_cost_vs_default": rec.latency_cost,
            "session_options": list(rec.python),
        },
        "findings": [finding_dict(f) for f in report.findings],
        "errors": [{"config": r.config.name, "message": r.error} for r in report.errors],
        "summary": {
            "configs": len(report.configs),
            "errors": len(report.errors),
            "duplicate_bytes": sum(f.wasted_bytes for f in report.findings),
            "warnings": sum(f.severity == "warning" for f in report.findings),
        },
    }


def render_runtime_json(report: RuntimeReport) -> str:
    """The report as indented JSON."""
    return json.dumps(runtime_dict(report), indent=2) + "\n"


def render_export_summary(result: ExportResult) -> str:
    """The one summary ``tieaudit export`` prints at the end (to stderr)."""
    lines = [f"tieaudit export: {result.source} -> {result.out}", f"  source: {result.description}"]
    several = len(result.files) > 1
    for exported in result.files:
        lines += _file_lines(exported, result.atol, indent="    " if several else "  ", several=several)
    lines.append(_bytes_line(result))
    missing = result.parameters_not_stored
    if missing:
        shown = ", ".join(missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        lines.append(f"  not stored under a parameter name (merged or folded by the exporter): {shown}{more}")
    lines.append(f"  result: written {result.out}" if result.written else "  result: FAILED, OUT not written")
    return "\n".join(printable(line) for line in lines) + "\n"  # names come from the model


def _bytes_line(result: ExportResult) -> str:
    """Where the initializer bytes come from: the torch parameters stored under their own names
    (what the model holds, a tie counted once, or what the exporter left of it) and graph constants."""
    stored = result.parameter_initializer_bytes - result.parameter_bytes_repeated
    constants = result.initializer_bytes - result.parameter_initializer_bytes
    held = result.parameter_bytes
    if stored == held:
        parameters = f"{stored:,} of parameters, all the torch model holds (a tie counted once)"
    elif stored < held:
        parameters = (
            f"{stored:,} of parameters under their own names, of the {held:,} the torch model holds (a tie "
            f"counted once; the exporter merged or folded the other {held - stored:,} into the graph)"
        )
    else:
        parameters = (
            f"{stored:,} of parameters under their own names, {stored - held:,} more than the {held:,} the "
            "torch model holds (a tie counted once)"
        )
    repeated = (
        f"; {result.parameter_bytes_repeated:,} more for parameters stored again in another file "
        "(each file loads alone)"
        if result.parameter_bytes_repeated
        else ""
    )
    total = result.initializer_bytes
    return f"  initializers: {total:,} bytes: {parameters}{repeated}; {constants:,} of graph constants"


def _file_lines(exported: ExportedFile, atol: float, *, indent: str, several: bool) -> list[str]:
    """What was re-tied and checked in one exported file."""
    lines = [f"  {exported.path}:"] if several else []
    lines += [
        f"{indent}re-tied: {d.dropped} was a {d.relation} copy of {d.kept} ({human_bytes(d.nbytes)}); "
        "now computed from it in the graph"
        for d in exported.retied
    ] or [f"{indent}re-tied: nothing, the exporter stored every tied matrix once"]
    tie = (
        "ok, no copy left"
        if not exported.remaining
        else "FAILED, copies left: " + "; ".join(", ".join(g.names) for g in exported.remaining)
    )
    lines.append(f"{indent}tie check: {tie}")
    verdict = "ok" if exported.max_abs_diff <= atol else "FAILED"
    lines.append(
        f"{indent}parity: max abs difference {exported.max_abs_diff:.3g} vs torch on the example inputs "
        f"(atol {atol:g}): {verdict}"
    )
    if exported.runtime_error is not None:
        lines.append(f"{indent}runtime check: FAILED: {exported.runtime_error}")
    elif exported.runtime:
        lines += [f"{indent}runtime: {f.rule} {f.message}" for f in exported.runtime]
        fix = exported.runtime[0].fix
        if fix is not None:
            lines.append(f"{indent}  {fix.label}: {fix}")
    else:
        lines.append(f"{indent}runtime: ONNX Runtime's default session options hold no second copy")
    return lines
