"""torch's weights_only allowlist, as data: the names ``torch.load(weights_only=True)`` loads by default.

``torch_allowlist.json`` is generated offline from the pinned torch by
``scripts/gen_torch_allowlist.py`` (``make torch-allowlist``) and checked against torch by
``tests/test_torch_allowlist.py``; reading it never imports torch. Names are matched whole, after
torch's Python 2 renaming, exactly as torch's unpickler matches them: no prefixes, no attribute
walks (``pathlib.PosixPath._flavour.pathmod.os.system`` is one name, and not on the list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True, kw_only=True)
class TorchAllowlist:
    """What torch's unpickler decides a GLOBAL by (see ``scripts/gen_torch_allowlist.py``)."""

    torch: str
    """The torch version it was generated from."""
    allowed: frozenset[str]
    """Exact dotted names torch's default allowlist holds."""
    blocked_modules: frozenset[str]
    """Modules torch refuses even for globals a user adds with ``add_safe_globals``."""
    import_mapping: dict[str, str]
    """Python 2 module -> Python 3 module, applied when no name mapping applies."""
    name_mapping: dict[tuple[str, str], tuple[str, str]]
    """Python 2 (module, name) -> Python 3 (module, name)."""
    refused_with_hint: frozenset[str]
    """Names torch refuses with a message of their own (nested jagged tensors, DTensor)."""

    def spelled(self, module: str, name: str) -> tuple[str, str]:
        """GLOBAL module/name as torch looks it up (its ``_read_global_instruction``)."""
        mapped = self.name_mapping.get((module, name))
        if mapped is not None:
            return mapped
        return self.import_mapping.get(module, module), name


@cache
def torch_allowlist() -> TorchAllowlist:
    """The committed allowlist (read once)."""
    text = resources.files("tieaudit.formats").joinpath("torch_allowlist.json").read_text("utf-8")
    data = json.loads(text)
    return TorchAllowlist(
        torch=data["torch"],
        allowed=frozenset(data["allowed"]),
        blocked_modules=frozenset(data["blocked_modules"]),
        import_mapping=dict(data["import_mapping"]),
        name_mapping={(a, b): (c, d) for (a, b), (c, d) in data["name_mapping"]},
        refused_with_hint=frozenset(data["refused_with_hint"]),
    )
