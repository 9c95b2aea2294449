"""TIE009 wasted-bytes-cap: a checkpoint's copies waste more bytes than the policy allows."""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.core.shell import advice, tieaudit_command
from tieaudit.core.units import human_bytes
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE009


def file_wasted_bytes(findings: tuple[Finding, ...]) -> int:
    """Bytes the files waste on copies: every finding's but TIE005's (memory ONNX Runtime adds)."""
    return sum(f.wasted_bytes for f in findings if f.rule != "TIE005")


def cap_findings(audited: Audited) -> Iterator[Finding]:
    """TIE009 when the other rules' findings waste more than the policy's max-wasted-bytes."""
    cap, wasted = audited.policy.max_wasted_bytes, file_wasted_bytes(audited.found)
    if cap is None or wasted <= cap:
        return
    names = sorted({name for f in audited.found if f.wasted_bytes for name in f.names})
    path = audited.graph.checkpoint.path
    yield WASTED_BYTES_CAP.finding(
        names,
        f"copies waste {human_bytes(wasted)} ({wasted} bytes), more than the policy's "
        f"max-wasted-bytes of {human_bytes(cap)} ({cap} bytes).",
        fix=advice(
            "re-tie the copies (", tieaudit_command("retie", path, "OUT"), ") or raise max-wasted-bytes"
        ),
        details={"wasted_bytes": wasted, "max_wasted_bytes": cap},
    )


WASTED_BYTES_CAP = Rule(text=TIE009, check=cap_findings, over_findings=True)
