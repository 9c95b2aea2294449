"""The tables, targets and growth lines of bench/scale.py, from its measurements."""

from __future__ import annotations

import os
from collections.abc import Sequence

from common import MIB, Measurement, format_table
from scale_inputs import FORMS, Input

ONNX_IO_FACTOR, ONNX_IO_SLACK_S = 1.5, 0.3
ONNX_RSS_PERCENT = 15.0
FOLDER_CAT_FACTOR = 0.5
RETIE_CP_FACTOR = 1.2
RETIE_RSS_MIB = 512

TITLES = {
    "folder": "Llama-8B-shaped folder (bf16 shards + index)",
    "sparse": "Llama-70B-shaped folder, sparse shards (headers at full scale)",
    "onnx": "ONNX, weights embedded",
    "onnx-ext": "ONNX, external data",
    "count": "tensor count (same total bytes)",
}

Target = tuple[str, str, "bool | None"]


def _size(inp: Input) -> int:
    return sum(os.path.getsize(f) for f in inp.files)


def _ratio(measured: Measurement, reference: Measurement | None, name: str) -> str:
    if reference is None or reference is measured or reference.median_s <= 0:
        return ""
    return f"{measured.median_s / reference.median_s:.2f}x {name}"


def _reference(ms: dict[str, Measurement], label: str) -> tuple[Measurement | None, str]:
    """What a line's ratio divides by: cat (or the header floor) of the same mode; cp for retie."""
    mode = label.split()[0]
    if "retie" in label:
        return ms.get(f"{mode} cp -r + sync"), "cp+sync"
    for name in ("cat", "read every header"):
        if f"{mode} {name}" in ms:
            return ms[f"{mode} {name}"], "cat" if name == "cat" else "headers"
    return None, ""


def form_table(inputs: Sequence[Input], results: dict[str, dict[str, Measurement]]) -> str:
    rows = []
    for inp in inputs:
        size = _size(inp)
        for label, m in results.get(inp.key, {}).items():
            reference, name = _reference(results[inp.key], label)
            rows.append(
                [
                    f"{inp.key} ({size / 1e9:.2f} GB)",
                    label,
                    f"{m.median_s:.3f}",
                    _ratio(m, reference, name),
                    f"{m.max_rss_bytes / MIB:.0f}",
                    f"{100 * m.max_rss_bytes / size:.1f}%",
                    str(len(m.runs)),
                ]
            )
    headers = ["input", "command", "median s", "ratio", "peak RSS MiB", "RSS/file", "runs"]
    return format_table(headers, rows)


def _get(results: dict[str, dict[str, Measurement]], inp: Input, label: str) -> Measurement | None:
    return results.get(inp.key, {}).get(label)


def _largest(inputs: Sequence[Input], form: str) -> Input | None:
    of_form = [i for i in inputs if i.form == form]
    return max(of_form, key=_size) if of_form else None


def targets(inputs: Sequence[Input], results: dict[str, dict[str, Measurement]], cold: bool) -> list[Target]:
    """The issue's acceptance targets, on the largest input of each form that was run."""
    found: list[Target] = []
    modes = ["cold", "warm"] if cold else ["warm"]
    external, folder = (_largest(inputs, f) for f in ("onnx-ext", "folder"))
    embedded = [i for i in inputs if i.form == "onnx"]
    for head in sorted({i.relation for i in embedded}):  # the largest of each kind of head
        onnx = max((i for i in embedded if i.relation == head), key=_size)
        label = "ONNX embedded" + (f" ({head} head)" if head != "equal" else "")
        for mode in modes:
            cat, check = _get(results, onnx, f"{mode} cat"), _get(results, onnx, f"{mode} tieaudit check")
            if cat and check:
                target = f"{label} {mode}: check <= {ONNX_IO_FACTOR:g} x cat + {ONNX_IO_SLACK_S:g} s"
                found.append(_within(target, check, cat, ONNX_IO_FACTOR, ONNX_IO_SLACK_S))
            if cat and check and head == "transposed" and mode == "warm":  # issue 25: at memory speed
                found.append(_within(f"{label} warm: check <= cat (issue 25)", check, cat, 1.0))
        checks = [_get(results, onnx, f"{m} tieaudit check") for m in modes]
        peak = max((c.max_rss_bytes for c in checks if c), default=0)
        percent = 100 * peak / _size(onnx)
        found.append(
            (
                f"{label}: check peak RSS <= {ONNX_RSS_PERCENT:g}% of file",
                f"{percent:.1f}% ({peak / MIB:.0f} MiB of {_size(onnx) / MIB:.0f} MiB)",
                percent <= ONNX_RSS_PERCENT,
            )
        )
    if external is not None:
        for mode in modes:
            cat, check = (
                _get(results, external, f"{mode} cat"),
                _get(results, external, f"{mode} tieaudit check"),
            )
            if cat and check:
                found.append(_within(f"ONNX external {mode}: check <= cat", check, cat, 1.0))
    if folder is not None:
        found += _folder_targets(folder, results, cold)
    return found


def _within(
    label: str, measured: Measurement, reference: Measurement, factor: float, slack: float = 0.0
) -> Target:
    """measured <= factor x reference + slack seconds, as a target line."""
    budget = factor * reference.median_s + slack
    return (label, f"{measured.median_s:.3f} s vs {budget:.3f} s", measured.median_s <= budget)


def _folder_targets(folder: Input, results: dict[str, dict[str, Measurement]], cold: bool) -> list[Target]:
    if not cold:
        return [("folder cold targets", "not measured: the page cache cannot be dropped here", None)]
    found: list[Target] = []
    cat, check = _get(results, folder, "cold cat"), _get(results, folder, "cold tieaudit check")
    if cat and check:
        label = f"folder {_size(folder) / 1e9:.1f} GB cold: check <= {FOLDER_CAT_FACTOR:g} x cat"
        found.append(_within(label, check, cat, FOLDER_CAT_FACTOR))
    cp, retie = _get(results, folder, "cold cp -r + sync"), _get(results, folder, "cold tieaudit retie")
    if cp and retie:
        found.append(
            _within(f"folder cold: retie <= {RETIE_CP_FACTOR:g} x (cp -r + sync)", retie, cp, RETIE_CP_FACTOR)
        )
        found.append(
            (
                f"folder: retie peak RSS <= {RETIE_RSS_MIB} MiB",
                f"{retie.max_rss_bytes / MIB:.0f} MiB",
                retie.max_rss_bytes <= RETIE_RSS_MIB * MIB,
            )
        )
    return found


def growth(inputs: Sequence[Input], results: dict[str, dict[str, Measurement]]) -> list[str]:
    """check's time on the larger input of each form over the smaller one, per mode."""
    lines = []
    for form in FORMS:
        # two sizes of one kind (a transposed-head variant is a third input, not a size)
        pair = sorted(
            (i for i in inputs if i.form == form and i.relation == "equal"), key=_size, reverse=True
        )
        if len(pair) != 2:
            continue
        big, small = pair
        for mode in ("cold", "warm"):
            a, b = (
                _get(results, big, f"{mode} tieaudit check"),
                _get(results, small, f"{mode} tieaudit check"),
            )
            if not (a and b):
                continue
            lines.append(
                f"growth {form} {mode}: {big.key} / {small.key}: bytes {_size(big) / _size(small):.2f}x, "
                f"tensors {big.tensors / small.tensors:.2f}x, shards {big.shards}/{small.shards} -> "
                f"check {a.median_s / b.median_s:.2f}x ({a.median_s:.3f} / {b.median_s:.3f} s), "
                f"peak RSS {a.max_rss_bytes / MIB:.0f} / {b.max_rss_bytes / MIB:.0f} MiB"
            )
    return lines


def report(
    inputs: Sequence[Input],
    results: dict[str, dict[str, Measurement]],
    problems: list[str],
    *,
    small: bool,
    cold: bool,
) -> tuple[str, bool]:
    """Every table, the targets and the growth lines; second value True when nothing FAILs."""
    parts = []
    for form in FORMS:
        of_form = [i for i in inputs if i.form == form]
        if of_form:
            parts.append(f"== {TITLES[form]}\n{form_table(of_form, results)}")
    found = targets(inputs, results, cold)
    found.append(
        (
            "every check run found exactly what was planted",
            "verified every run" if not problems else f"{len(problems)} problem(s), see the error lines",
            not problems,
        )
    )
    rows = [[name, value, "info" if ok is None else "PASS" if ok else "FAIL"] for name, value, ok in found]
    note = ""
    if small:
        note = (
            "(--small: inputs ~1/16 of the full sizes; the targets are for the full sizes: an indication)\n"
        )
    parts.append(note + format_table(["target", "measured", "result"], rows))
    lines = growth(inputs, results)
    if lines:
        parts.append("\n".join(lines))
    return "\n\n".join(parts), all(ok is not False for _, _, ok in found)
