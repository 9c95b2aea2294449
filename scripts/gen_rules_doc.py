"""Write docs/rules.md, the page every rule's help address points at, from the rules' texts.

    make rules-doc
    .venv/bin/python scripts/gen_rules_doc.py [--output PATH] [--check]

Each rule's text is defined once, in ``tieaudit/rules/texts.py``; the page is rendered from it by
``tieaudit.report.rules_doc`` (a table of every rule, then a section per rule whose anchor, ``#tie001``,
is the one SARIF's helpUri and ``tieaudit rule ID`` name). ``tests/test_rule_docs.py`` fails when the
committed page differs from what this writes. ``--check`` writes nothing and exits 1 when it would.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tieaudit.report.rules_doc import rules_doc  # noqa: E402

DEFAULT_OUTPUT = ROOT / "docs" / "rules.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the page")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale; write nothing")
    args = parser.parse_args(argv)
    page = rules_doc()
    current = args.output.read_text(encoding="utf-8") if args.output.exists() else None
    if args.check:
        if current != page:
            print(f"{args.output} is stale: run make rules-doc", file=sys.stderr)
            return 1
        return 0
    if current != page:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        staged = args.output.with_name(f".{args.output.name}.tmp")
        staged.write_text(page, encoding="utf-8")
        os.replace(staged, args.output)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
