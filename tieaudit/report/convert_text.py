"""The convert plan and outcome, for people."""

from __future__ import annotations

from tieaudit.core.escape import printable
from tieaudit.core.units import human_bytes, plural
from tieaudit.repair.convert import ConvertResult
from tieaudit.rules.finding import Finding


def render_convert(result: ConvertResult) -> str:
    """The files, the names kept and dropped (and why), the partial views, then the bytes."""
    plan = result.plan
    lines = [f"convert plan for {printable(result.source)} -> {plan.target}"]
    how = "a {dropped: kept} record" if plan.target == "safetensors" else "the kept tensor itself again"
    lines.append(f"  {printable(plan.note)}")
    for source, target in result.files.items():
        if target:
            lines.append(f"  file {printable(source)} -> {printable(target)}")
    stored, recorded = plural(len(plan.stored), "tensor"), plural(len(plan.records), "name")
    lines.append(f"  {stored} stored, {recorded} recorded")
    if plan.omitted:
        lines.append(f"  not written: {printable(plan.omitted)}")
    for group in plan.shared:
        kept = printable(group.kept)
        lines.append(f"  keep {kept}  ({human_bytes(group.nbytes)}; {printable(group.why)})")
        lines.extend(f"    drop {printable(n)} = {kept}  ({how})" for n in group.dropped)
        lines.extend(
            f"    copy {printable(n)} = {kept}  (stored again: the model class does not tie it, "
            "from_pretrained would initialise it randomly)"
            for n in group.copies
        )
    for view in plan.partial:
        others = ", ".join(printable(n) for n in view.shared_with[:4]) or "no other name"
        lines.append(
            f"  view {printable(view.name)}: its own {human_bytes(view.nbytes)} of a "
            f"{human_bytes(view.storage_bytes)} storage (shared with {others})"
        )
    lines.append(
        f"  tensor bytes: {plan.output_bytes} written ({human_bytes(plan.output_bytes)}), "
        f"input storages {plan.input_bytes} ({human_bytes(plan.input_bytes)})"
    )
    if result.written is not None:
        lines.append(
            f"wrote {printable(result.written)}: {human_bytes(result.output_bytes)}, "
            "every input name verified bit for bit"
        )
    lines.extend(_copy_line(finding, written=result.written is not None) for finding in result.copies)
    return "\n".join(lines) + "\n"


def _copy_line(finding: Finding, *, written: bool) -> str:
    """One untied copy the output keeps apart, and what re-ties it: the fix `check OUT` gives (its
    command runs as printed); a dry run's output does not exist yet."""
    kept = str(finding.details.get("kept", ""))
    relations = finding.details.get("relations")
    members = ", ".join(
        f"{printable(name)} ({relation})"
        for name, relation in (relations.items() if isinstance(relations, dict) else ())
    )
    line = f"  untied copy kept apart: {printable(kept)} = {members}  ({human_bytes(finding.wasted_bytes)})"
    if not written:
        return f"{line}; re-tie the output once written"
    if finding.fix is None:
        return line
    return f"{line}\n    {finding.fix.label}: {printable(str(finding.fix))}"  # whole, on its own line
