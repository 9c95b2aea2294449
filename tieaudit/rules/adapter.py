"""TIE013 adapter-unties: a PEFT adapter replaces one side of the base model's tie with its own copy.

``modules_to_save`` makes PEFT store whole copies of the modules it names and, on loading, put
them in place of the base model's. When the base model ties its embedding and head and the
adapter saves only one of them (or both, as two matrices), the loaded model has two: the tie is
broken, unless the adapter was made with ``ensure_weight_tying=True`` (PEFT warns about exactly
this when saving). The base class comes from ``auto_mapping.base_model_class``; what it ties, from
the tie table as if its config said ``tie_word_embeddings: true``. A warning when the class ties by
default; a note when it ties only if the base model's config says so (the adapter cannot tell).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tieaudit.core.escape import printable, quoted
from tieaudit.formats.hf.variants import may_be_adapter
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE013

if TYPE_CHECKING:
    from tieaudit.formats.hf.layouts import Adapter

FIX = (
    "make the adapter with ensure_weight_tying=True (PEFT keeps the tied modules one), or leave the "
    "tied modules out of modules_to_save, and save it again"
)


def _module(parameter: str) -> str:
    """``model.embed_tokens.weight`` -> ``model.embed_tokens``."""
    return parameter.rsplit(".", 1)[0]


def _modules(name: str) -> list[str]:
    """Every module path a stored name lies under: ``a.b.weight`` -> ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def _saved(module: str, adapter: Adapter) -> bool:
    """PEFT's matching: a module is saved when an entry is its name or its name's last parts."""
    return any(module == m or module.endswith("." + m) for m in adapter.modules_to_save)


def adapter_findings(audited: Audited) -> Iterator[Finding]:
    """TIE013 for an adapter whose modules_to_save holds a tied module of its base class."""
    if not may_be_adapter(audited.graph.checkpoint.path):
        return  # the folder layouts' machinery is imported only for what can be an adapter
    from tieaudit.formats.hf.layouts import adapter_beside, base_ties

    adapter = adapter_beside(audited.graph.checkpoint.path)
    if adapter is None or adapter.ensure_weight_tying or not adapter.modules_to_save:
        return
    if adapter.base_class is None or adapter.base_ties is False:
        if adapter.base_class is None:  # said, never silently passed
            yield _unknown_base(adapter, [t.name for t in audited.graph.checkpoint.tensors])
        return
    pairs, by_default = base_ties(adapter)
    by_default = by_default if adapter.base_ties is None else adapter.base_ties
    stored = [t.name for t in audited.graph.checkpoint.tensors]
    for target, source in pairs.items():
        kept = [m for m in (_module(target), _module(source)) if _saved(m, adapter)]
        if not kept:
            continue
        names = [n for n in stored if any(n == f"{m}.weight" or n.endswith(f".{m}.weight") for m in kept)]
        both = len(kept) == 2
        what = (
            f"saves both {printable(kept[0])} and {printable(kept[1])} as two matrices"
            if both
            else f"saves its own {printable(kept[0])} but not "
            f"{printable(_module(source) if kept[0] == _module(target) else _module(target))}"
        )
        when = (
            "whose config ties them"
            if adapter.base_ties
            else "which its class ties by default"
            if by_default
            else "when the base model's config ties them"
        )
        yield ADAPTER_UNTIES.finding(
            names,
            f"the adapter's modules_to_save {what}: on a base {printable(adapter.base_class or '')} "
            f"({when}: {printable(target)} = {printable(source)}), PEFT loads them as two separate "
            f"matrices and the tie is broken ({os.path.basename(adapter.config)}: ensure_weight_tying "
            "is not true).",
            severity="warning" if by_default else "note",
            fix=FIX,
            details={"base_model_class": adapter.base_class, "modules_to_save": list(kept)},
        )


def _unknown_base(adapter: Adapter, stored: list[str]) -> Finding:
    """A note: the adapter saves modules whole, but which base class (and so which ties) is unknown."""
    where = "no base recorded"
    if adapter.base:
        where = f"its base {quoted(adapter.base, 120)} has no config.json here"
    names = [n for n in stored if any(_saved(m, adapter) for m in _modules(n))]
    return ADAPTER_UNTIES.finding(
        names,
        f"the adapter's modules_to_save ({printable(', '.join(adapter.modules_to_save))}) replaces base "
        f"modules whole, but the base model's class is unknown (auto_mapping is null and {where}): "
        "whether that breaks a tie of the base model cannot be told. If a saved module is the embedding "
        "or the head of a base that ties them, PEFT loads them untied.",
        severity="note",
        fix=FIX,
        details={"base_model_name_or_path": adapter.base, "modules_to_save": list(adapter.modules_to_save)},
    )


ADAPTER_UNTIES = Rule(text=TIE013, check=adapter_findings)
