"""Generate tieaudit's copy of torch's weights_only allowlist from the installed torch (offline).

    make torch-allowlist
    .venv/bin/python scripts/gen_torch_allowlist.py [--output PATH]

tieaudit's pickle verdict is torch's: a pickle is clean exactly when
``torch.load(weights_only=True)`` with torch's default allowlist loads it. Auditing never imports
torch, so this script records, from the pinned torch, everything ``torch/_weights_only_unpickler.py``
decides a global by, and ``tieaudit/formats/torch_allowlist.json`` commits it:

- ``allowed``: the exact dotted names of ``_get_allowed_globals()``, plus the safe globals
  ``import torch`` itself registers (``add_safe_globals`` calls in torch's own modules, e.g. nested
  jagged tensors): together, the only globals torch's default loads; nothing else, no prefixes;
- ``blocked_modules``: modules torch refuses even when a user adds their globals
  (``_blocklisted_modules``);
- ``import_mapping`` / ``name_mapping``: torch's Python 2 renaming, applied to every GLOBAL before
  the lookup (``torch._utils.IMPORT_MAPPING`` / ``NAME_MAPPING``);
- ``newobj_classes`` / ``build_types``: the classes NEWOBJ may create and BUILD may set state on
  without ``add_safe_globals`` (the rest of the allowlist is called only through REDUCE);
- ``refused_with_hint``: names torch refuses with a dedicated message (nested jagged tensors, DTensor).

``tests/test_torch_allowlist.py`` regenerates this with the installed torch and compares, and checks
that tieaudit's stand-ins (``formats/torch_globals.py``) cover exactly the ``allowed`` names.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parent.parent / "tieaudit" / "formats" / "torch_allowlist.json"


def _listed_names(source: str) -> list[str]:
    """The string lists the unpickler compares ``full_path`` against with ``in`` (its hint cases)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "full_path":
            for comparator in node.comparators:
                if isinstance(comparator, (ast.List, ast.Tuple)):
                    found += [e.value for e in comparator.elts if isinstance(e, ast.Constant)]
    return sorted(set(found))


def allowlist() -> dict[str, Any]:
    """Everything torch's weights_only unpickler decides a global by, as plain data."""
    import torch
    import torch._weights_only_unpickler as unpickler
    from torch._utils import IMPORT_MAPPING, NAME_MAPPING

    allowed = dict(unpickler._get_allowed_globals())
    allowed.update(unpickler._get_user_allowed_globals())  # what `import torch` registered itself
    names_of = {id(value): name for name, value in allowed.items()}
    build_types = ["torch.Tensor", "torch.nn.parameter.Parameter", "collections.OrderedDict"]
    build_types += sorted(n for n, v in allowed.items() if isinstance(v, type) and n not in build_types)
    return {
        "generated_by": "scripts/gen_torch_allowlist.py",
        "torch": torch.__version__.split("+")[0],
        "allowed": sorted(allowed),
        "blocked_modules": sorted(unpickler._blocklisted_modules),
        "import_mapping": dict(sorted(IMPORT_MAPPING.items())),
        "name_mapping": sorted([list(k), list(v)] for k, v in NAME_MAPPING.items()),
        "newobj_classes": sorted(
            {names_of[id(torch.nn.Parameter)]} | {n for n, v in allowed.items() if isinstance(v, type)}
        ),
        "build_types": build_types,
        "refused_with_hint": _listed_names(textwrap.dedent(inspect.getsource(unpickler.Unpickler.load))),
    }


def render(data: dict[str, Any]) -> str:
    """Deterministic JSON, one list item per line."""
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    args.output.write_text(render(allowlist()), encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
