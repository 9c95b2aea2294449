"""Which equal copies retie drops by default: those the format's usual loader restores by itself.

A dropped name comes back only through something the loader acts on.
``safetensors.torch.load_model`` never reads ``{dropped: kept}`` records: it restores a name only
when the live model shares it with a stored one, so in a safetensors file (or a folder without
config.json) a pair such a record already names is re-tied by default: the record says the
model that wrote it shares them; so is, in a file, a pair the model class recognised from the
tensor names (``formats.family``) ties with its config class's defaults: the class built from its
config shares them. Which pairs are left, and why, then depends on the pair (``explain``).
``from_pretrained`` restores a name only through the model class's ties (the tie table, with
``tie_word_embeddings`` set), so in a model folder only those; in a folder of
``pytorch_model.bin`` files the dropped name stays as a view, but ``from_pretrained`` then loads
the two names as one tensor, so the same pairs are the default there.
Equal tensors nobody ties (deterministic initialisation such as Mamba's ``A_log`` in every layer,
sinusoidal position tables in encoder and decoder, shared experts) are left unless --all-equal
asks for them, with the consequence printed. ``torch.load`` restores every view and ONNX consumers
are re-pointed, so .pt and ONNX have no rule here.

Setting the flag in config.json ties every pair of the class at once: ``flag_companions`` finds
the pairs the flag would tie besides the re-tied ones and compares their stored bytes (constant
tensors such as zero biases included, which the copy search skips): equal pairs join the plan; a
difference refuses, naming the largest one.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.components import Components
from tieaudit.core.errors import UsageError
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.formats.family import LOADER, NOT_A_TIE, bare_family
from tieaudit.formats.hf.layouts import Adapter, adapter_beside, base_ties
from tieaudit.formats.hf.variants import weights_folder
from tieaudit.graph.compare import BLOCK_BYTES, BlockComparer, equal_bytes, iter_blocks

__all__ = ["NOT_A_TIE", "LoaderRule", "flag_companions", "loader_rule", "max_difference"]

_UNKNOWN_CLASS = (
    "tieaudit's tie table does not give every tie of the class config.json names (an unknown class, "
    "or layer counts other than the table's)"
)
"""Said instead of "the class does not tie these two" when the table gives the class no pair."""
NOT_DEFAULT = "not re-tied by default"
"""The start of the reason for an equal copy left when nothing says whether the model ties it."""
_RECORD_KINDS = frozenset({"metadata", "index"})
"""Who declares a recorded pair: a ``{dropped: kept}`` record in ``__metadata__`` or the index."""


@dataclass(frozen=True, kw_only=True)
class LoaderRule:
    """Which equal copies the loader people use for this form restores from one stored tensor."""

    accepted: frozenset[frozenset[str]]
    """Pairs of names the loader restores from one stored tensor (re-tied by default)."""
    class_pairs: tuple[tuple[str, str], ...]
    """``(target, source)`` the model class ties with ``tie_word_embeddings`` set (folders only)."""
    declared: tuple[tuple[str, str], ...]
    """``(target, source)`` config.json ties already (folders only)."""
    why_left: str
    """Why an equal copy outside ``accepted`` is left by default."""
    consequence: str
    """What the loader does with such a copy re-tied under --all-equal (``{name}``: the dropped name)."""
    flag_locked: str = ""
    """Why config.json's tie flag may not be set (the class's forward reads it); empty when it may."""
    ties_on_load: frozenset[frozenset[str]] = frozenset()
    """Pairs stored twice that the loader ties when loading (a PEFT adapter made with
    ensure_weight_tying): a copy there is the format's, not a lost tie."""
    explain: Callable[[str, str], str] | None = None
    """Why one pair is left, where that depends on the pair (a bare file's recognised class);
    None: ``why_left`` for every pair."""

    def left_because(self, kept: str, dropped: str) -> str:
        """Why the equal copy dropped of kept is left by default."""
        return self.why_left if self.explain is None else self.explain(kept, dropped)

    @functools.cached_property
    def _joined(self) -> Components:
        pairs = (sorted(pair) for pair in self.accepted if len(pair) == 2)
        return Components((first, second) for first, second in pairs)

    def accepts(self, first: str, second: str) -> bool:
        """True when the loader restores either name from the other, directly or through a chain
        of accepted pairs (a restored name is one tensor with every name tied to it)."""
        return self._joined.same(first, second)

    def accepts_any(self, names: Iterable[str]) -> bool:
        """True when the loader restores some name of names from another (``accepts`` for some
        pair): two of them share a component. Linear in the names, not pairwise."""
        roots = [self._joined.root(name) for name in dict.fromkeys(names)]
        return len(set(roots)) < len(roots)

    def consequence_for(self, dropped: str) -> str:
        """The consequence of re-tying dropped although the loader does not restore it."""
        return self.consequence.format(name=dropped)


def peft_adapter(ckpt: Checkpoint, adapter: Adapter) -> LoaderRule:
    """An adapter's loader (PEFT's ``set_peft_model_state_dict``) restores no name from another; made
    with ensure_weight_tying, it ties the saved copies of the base model's tied modules on load
    (it stores both: safetensors cannot alias)."""
    tied: set[frozenset[str]] = set()
    if adapter.ensure_weight_tying:
        for target, source in base_ties(adapter)[0].items():
            first = [t.name for t in ckpt.tensors if t.name.endswith("." + target)]
            second = [t.name for t in ckpt.tensors if t.name.endswith("." + source)]
            tied.update(frozenset((a, b)) for a in first for b in second)
    return LoaderRule(
        accepted=frozenset(),
        class_pairs=(),
        declared=(),
        why_left="a PEFT adapter: PEFT loads every module it saved as its own, whatever the file records",
        consequence="PEFT will load {name} from the base model instead of the adapter: it is not stored",
        flag_locked="a PEFT adapter ties what it saves only if made with ensure_weight_tying=True (TIE013)",
        ties_on_load=frozenset(tied),
    )


def loader_rule(ckpt: Checkpoint) -> LoaderRule | None:
    """The rule for a safetensors file or a model folder; None for .pt and ONNX (no rule needed)."""
    if ckpt.format not in ("safetensors", "hf-dir"):
        return None
    config = None
    adapter = adapter_beside(ckpt.path)
    if adapter is not None:
        return peft_adapter(ckpt, adapter)
    if ckpt.format == "hf-dir":
        from tieaudit.formats.hf_dir import read_config

        config, _ = read_config(weights_folder(ckpt.path))
    if config is None:
        return _file_rule(ckpt)
    from tieaudit.formats.hf_dir import torch_weights
    from tieaudit.formats.hf_ties import class_pairs, flag_read_by

    pairs = tuple(sorted(class_pairs(ckpt, config)))
    declared = tuple(sorted((t.dropped, t.kept) for t in ckpt.declared_ties if t.declared_by == "config"))
    known = ckpt.config is not None and ckpt.config.class_ties is not None
    unties = "the class does not tie these two" if pairs and known else _UNKNOWN_CLASS
    start = NOT_A_TIE if pairs and known else f"{NOT_DEFAULT}; --all-equal re-ties it"
    if torch_weights(ckpt.files):  # the name stays in the .bin as a view of the kept storage
        why = (
            f"{start} (from_pretrained loads names that share storage in a pytorch_model.bin as "
            f"one tensor, and {unties}: the two would train as one)"
        )
        consequence = (
            "from_pretrained will load {name} and the tensor kept as one tensor: the model class "
            "does not tie them, and they would train as one"
        )
    else:
        why = (
            f"{start} (from_pretrained restores a dropped name only through the model class's "
            f"own ties, and {unties}: the copy would come back randomly initialised)"
        )
        consequence = "from_pretrained will initialise {name} randomly: the model class does not tie it"
    reader = flag_read_by(config, os.path.join(weights_folder(ckpt.path), "config.json"))
    if reader is not None and set(pairs) - set(declared):
        locked = (
            f"{reader}'s forward reads tie_word_embeddings, so setting it would change the model's "
            "outputs, not only its ties"
        )
        why = f"the model class ties these two only with tie_word_embeddings set, and {locked}"
        accepted = frozenset(frozenset(pair) for pair in declared)
        return LoaderRule(
            accepted=accepted,
            class_pairs=pairs,
            declared=declared,
            why_left=why,
            consequence=consequence,
            flag_locked=locked,
        )
    return LoaderRule(
        accepted=frozenset(frozenset(pair) for pair in pairs),
        class_pairs=pairs,
        declared=declared,
        why_left=why,
        consequence=consequence,
    )


def _file_rule(ckpt: Checkpoint) -> LoaderRule:
    """A safetensors file, or a folder without config.json: the pairs a {dropped: kept} record
    names, and for a file, those its class (recognised from the names) ties by default."""
    recorded = frozenset(
        frozenset((t.dropped, t.kept)) for t in ckpt.declared_ties if t.declared_by in _RECORD_KINDS
    )
    family = bare_family(ckpt)
    consequence = (
        "safetensors.torch.load_model(strict=True) will refuse this file unless the model "
        "shares these tensors ({name} is not stored)"
    )
    if family is not None and family.recognised:
        return LoaderRule(
            accepted=recorded | family.accepted,
            class_pairs=family.pairs,
            declared=family.pairs,  # tied with nothing stated: no flag to set (there is no config)
            why_left=f"{NOT_DEFAULT}: not tied by default by {family.named} ({family.how}); "
            "--all-equal re-ties it",
            consequence=consequence,
            explain=lambda kept, dropped: family.left_because(kept, dropped),
        )
    unrecognised = (
        f"no model class is recognised from the tensor names{family.closest_text()}"
        if family
        else "no config.json"
    )
    return LoaderRule(
        accepted=recorded,
        class_pairs=(),
        declared=(),
        why_left=f"{NOT_DEFAULT}: {unrecognised} and no {{dropped: kept}} record in the file names "
        f"these two; --all-equal re-ties it (then {LOADER})",
        consequence=consequence,
    )


def max_difference(opened: OpenCheckpoint, first: TensorInfo, second: TensorInfo) -> float:
    """The largest absolute elementwise difference (same shape), a block of rows at a time; NaN
    where one side is NaN and the other is not."""
    row_bytes = first.nbytes // max(1, first.shape[0]) if first.shape else first.nbytes
    rows = max(1, BLOCK_BYTES // max(1, row_bytes))
    largest = 0.0
    pairs = zip(iter_blocks(opened, first, rows), iter_blocks(opened, second, rows), strict=True)
    for (_, a), (_, b) in pairs:
        left, right = a.astype(np.float64), b.astype(np.float64)
        both_nan = np.isnan(left) & np.isnan(right)
        diff = np.where(both_nan, 0.0, np.abs(left - right))
        if diff.size:
            worst = float(np.max(diff))
            if math.isnan(worst):
                return worst
            largest = max(largest, worst)
    return largest


def _difference(opened: OpenCheckpoint, target: TensorInfo, source: TensorInfo) -> str:
    """Why two stored tensors are not one: shape, dtype, or the largest difference."""
    if target.shape != source.shape:
        return f"their shapes differ ({list(target.shape)} and {list(source.shape)})"
    if target.dtype != source.dtype:
        return f"their dtypes differ ({target.dtype} and {source.dtype})"
    worst = max_difference(opened, target, source)
    if worst == 0.0:
        return "their bits differ (signed zeros or NaN payloads) although no value differs"
    return f"they differ by up to {worst:.6g}"


def flag_companions(
    opened: OpenCheckpoint, rule: LoaderRule, *, retied: Collection[frozenset[str]], dropped: Collection[str]
) -> list[tuple[str, str]]:
    """``(target, source)`` pairs the flag would tie besides the re-tied ones (``retied``), both
    names still stored and bit for bit equal; refuses when such a pair differs, or when the flag
    may not be set at all (``flag_locked``). Empty when the plan does not set the flag (no re-tied
    pair of the class, or config.json ties them already)."""
    ckpt = opened.checkpoint
    hits = {pair for pair in rule.class_pairs if frozenset(pair) in retied}
    if not hits or hits <= set(rule.declared):
        return []
    if rule.flag_locked:
        target, source = sorted(hits - set(rule.declared))[0]
        raise UsageError(
            f"re-tying {target} to {source} needs tie_word_embeddings set in config.json, but "
            f"{rule.flag_locked}; nothing was written",
            ckpt.path,
        )
    stored = ckpt.names - set(dropped)
    comparer = BlockComparer()
    companions = []
    for target, source in sorted(set(rule.class_pairs) - set(rule.declared) - hits):
        if target not in stored or source not in stored:
            continue
        first, second = ckpt.tensor(target), ckpt.tensor(source)
        if equal_bytes(opened, first, second, comparer=comparer):
            companions.append((target, source))
            continue
        raise UsageError(
            f"setting tie_word_embeddings in config.json would also tie {target} to {source}, which "
            f"both stay stored and are not equal: {_difference(opened, first, second)}; "
            "edit the config yourself if the model should tie them",
            ckpt.path,
        )
    return companions
