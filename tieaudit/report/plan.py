"""The retie plan and outcome, for people."""

from __future__ import annotations

from tieaudit.core.escape import printable
from tieaudit.core.units import human_bytes, plural
from tieaudit.repair.retie import RetieResult


def render_plan(result: RetieResult) -> str:
    """One line per decision, then the bytes saved (planned, or measured on disk)."""
    plan = result.plan
    relations = ", ".join(sorted(plan.relations))
    lines = [f"retie plan for {printable(plan.path)} ({plan.format}; relations: {relations})"]
    if not plan.decisions:
        lines.append("  no copies found")
    for decision in plan.decisions:
        mark = "tie " if decision.applied else "left"
        arrow = {"equal": "=", "transposed": "= T of", "cast": "= cast of"}[decision.relation]
        dropped, kept = printable(decision.dropped), printable(decision.kept)
        line = f"  {mark} {dropped} {arrow} {kept}  ({human_bytes(decision.nbytes)})"
        if not decision.applied:
            line += f"\n       why: {printable(decision.reason)}"
        if decision.why:
            line += f"\n       because: {printable(decision.why)}"
        if decision.consequence:
            line += f"\n       note: {printable(decision.consequence)}"
        lines.append(line)
    for edit in plan.optimizer_edits:
        dropped = ", ".join(str(k) for k in edit.dropped)
        lines.append(
            f"  optimizer {printable(edit.path or '(root)')}: state {edit.kept_slot} keeps "
            f"{printable(edit.kept_name)}'s, key {dropped} dropped, later keys renumbered"
        )
    discarded = sum(1 for name in plan.renamed.values() if name is None)
    if discarded:
        lines.append(
            f"  {plural(discarded, 'optimizer state tensor')} discarded (one state per re-tied parameter)"
        )
    if result.nothing_to_retie:
        lines.append(_nothing(result))
        return "\n".join(lines) + "\n"
    lines.append(f"  saves {human_bytes(plan.saved_bytes)} ({plan.saved_bytes} bytes)")
    forced = sum(1 for d in plan.applied if d.consequence)
    if forced:
        lines.append(
            f"  --all-equal: {plural(forced, 'copy')} re-tied that the format's "
            "loader does not restore by itself (see each note)"
        )
    if result.written is not None:
        lines.append(
            f"wrote {printable(result.written)}: {human_bytes(result.output_bytes)} "
            f"(input {human_bytes(result.input_bytes)}), every original name verified bit for bit"
            + (f"; original kept as {printable(result.backup)}" if result.backup else "")
        )
    return "\n".join(lines) + "\n"


def _nothing(result: RetieResult) -> str:
    """The closing line of a plan that applies no copy (what is left is listed above it)."""
    left = len(result.plan.decisions)
    line = "nothing to re-tie"
    if left:
        line += f" ({plural(left, 'copy')} left, each with its reason above)"
    return line + ("" if result.dry_run else "; nothing written")
