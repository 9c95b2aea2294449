"""TIE005 runtime-duplicate: ONNX Runtime materialises another copy of a shared initializer.

Finding it means running ONNX Runtime's optimizer in a child process, which the runtime stage
(``tieaudit.runtime``, above this package) does when the policy asks for it (``check --runtime``);
it makes its findings with ``RUNTIME_DUPLICATE.finding`` and the audit hands them in as
``Audited.measured``.
"""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE005


def runtime_findings(audited: Audited) -> Iterator[Finding]:
    """TIE005: the duplicates the runtime stage measured for this checkpoint."""
    yield from (f for f in audited.measured if f.rule == RUNTIME_DUPLICATE.id)


RUNTIME_DUPLICATE = Rule(text=TIE005, check=runtime_findings)
