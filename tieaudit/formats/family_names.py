"""Which model class wrote a bare checkpoint file, from its tensor names alone.

``tie_names.json`` (package data beside this module, generated offline with the tie table by
``scripts/gen_tie_names.py``) holds, for every class of the tie table, the names its ``state_dict``
holds as ``save_pretrained`` writes them (and as they are in memory, where the two differ), each
numbered segment's number written ``#`` (``model.layers.#.mlp.up_proj.weight``,
``experts.expert_#.wi.weight``: ``name_template``), and which of them a file
may lack (tied targets, which a tied save drops; names only some layer counts or switch values
build). It is read only when a bare file's class is asked for (first use, cached, size bounded);
no torch, no transformers.

``recognise`` compares a file's names, numbered segments as ``#``, after removing one wrapper
prefix that every name carries (``WRAPPER_PREFIXES``). A file saved from a base model (no
``model.`` prefix) needs nothing: the base class (``LlamaModel``) is in the table too.

- exact: every name of the file is a name the class writes, and every name it always writes is
  there. Several classes may write exactly the same names (``MistralForCausalLM`` and
  ``LlamaForCausalLM``): they are all candidates, and only what they all agree on is used.
- partial: no class is exact. A class's share is common / (common + the file's names it does not
  write + the names it always writes that the file lacks); the best share must reach MIN_SHARE,
  and every class within SHARE_MARGIN of it is a candidate.
- either way, a class that writes every name of the file with a share of at least MIN_SHARE is a
  candidate too: its names may vary with config values the fingerprints were not built with
  (ELECTRA builds its embedding projection only when the embedding and hidden sizes differ; such a
  file matches SplinterModel and YosoModel exactly, and ElectraModel only this way).
- not recognised otherwise: never a guess (a wrong class would apply wrong ties).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

NAMES_RESOURCE = "tie_names.json"
NAMES_SCHEMA = "tieaudit.tie-names/1"
MAX_NAMES_BYTES = 8_000_000
"""Largest tie_names.json read (the generated file is well under 1 MB): a packaging mistake
that swapped in something huge is refused, not parsed."""
MIN_SHARE = 0.9
"""Smallest share of names in common for a partial match (tests/sweep/family.py measures it)."""
SHARE_MARGIN = 0.05
"""Classes whose share is this close to the best one are candidates too."""
WRAPPER_PREFIXES = ("base_model.model.", "module.", "_orig_mod.")
"""Prefixes a wrapper adds to every name: PEFT, DistributedDataParallel, torch.compile."""

Confidence = Literal["exact", "partial", "none"]
Spelling = Literal["disk", "memory"]


@dataclass(frozen=True)
class Candidate:
    """One class the file's names match."""

    name: str
    """The model class."""
    spelling: Spelling
    """Whose names the file holds: ``disk`` (as save_pretrained writes) or ``memory`` (state_dict)."""
    share: float
    """Names in common over the names either side requires (1.0 when exact)."""


@dataclass(frozen=True, kw_only=True)
class Recognition:
    """What the names say about the model class."""

    candidates: tuple[Candidate, ...]
    """The classes matched, best share first, then by name; empty when not recognised."""
    confidence: Confidence
    """exact, partial (best share at least MIN_SHARE), or none."""
    prefix: str
    """The wrapper prefix removed from every name before matching ("" when none)."""
    names: int
    """Distinct names of the file, numbered segments as ``#``."""
    closest: Candidate | None = None
    """When not recognised: the best class found and its share (None: no class shares a name)."""

    @property
    def classes(self) -> tuple[str, ...]:
        """The candidate class names."""
        return tuple(c.name for c in self.candidates)

    @property
    def share(self) -> float:
        """The best share (0.0 when not recognised)."""
        return self.candidates[0].share if self.candidates else 0.0


@dataclass(frozen=True, kw_only=True)
class _Print:
    """One class in one spelling: its names as indices into ``_Prints.every``."""

    cls: str
    spelling: Spelling
    names: frozenset[int]
    required: frozenset[int]


@dataclass(frozen=True, kw_only=True)
class _Prints:
    prints: tuple[_Print, ...]
    every: tuple[str, ...]
    """Every name template, sorted."""
    ids: dict[str, int]
    """name template -> its index in every."""
    transformers: str


def front_decoded(coded: Sequence[Any]) -> list[str]:
    """The sorted names, each stored as [characters shared with the previous one, the rest]."""
    names: list[str] = []
    previous = ""
    for item in coded:
        previous = item if isinstance(item, str) else previous[: item[0]] + item[1]
        names.append(previous)
    return names


def _decode(runs: str) -> frozenset[int]:
    """Index runs ``"3-17,20"`` as the set of indices."""
    found: set[int] = set()
    for part in filter(None, runs.split(",")):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return frozenset(found)


@functools.cache
def _fingerprints() -> _Prints:
    """The packaged fingerprints, parsed on first use."""
    import importlib.resources  # here: zipfile and pathlib only when the data is read

    resource = importlib.resources.files("tieaudit.formats").joinpath(NAMES_RESOURCE)
    with resource.open("rb") as handle:
        raw = handle.read(MAX_NAMES_BYTES + 1)
    if len(raw) > MAX_NAMES_BYTES:
        raise RuntimeError(f"tieaudit's {NAMES_RESOURCE} is over {MAX_NAMES_BYTES} bytes")  # a packaging bug
    doc: dict[str, Any] = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("schema") != NAMES_SCHEMA:
        raise RuntimeError(f"tieaudit's {NAMES_RESOURCE} is not a {NAMES_SCHEMA} file")
    every = tuple(front_decoded(doc["names"]))
    prints: list[_Print] = []
    spellings: tuple[Spelling, ...] = ("disk", "memory")
    for cls, entry in sorted(doc["classes"].items()):
        for spelling in spellings:
            if spelling in entry:
                names = _decode(entry[spelling])
                optional = _decode(entry[f"{spelling}_optional"])
                prints.append(_Print(cls=cls, spelling=spelling, names=names, required=names - optional))
    ids = {name: i for i, name in enumerate(every)}
    return _Prints(prints=tuple(prints), every=every, ids=ids, transformers=str(doc["transformers"]))


def table_version() -> str:
    """The transformers version the fingerprints were generated from."""
    return _fingerprints().transformers


def written(cls: str, spelling: Spelling) -> frozenset[str]:
    """Every name template the class writes in that spelling (empty when the file holds none)."""
    data = _fingerprints()
    for found in data.prints:
        if found.cls == cls and found.spelling == spelling:
            return frozenset(data.every[i] for i in found.names)
    return frozenset()


def unwrapped(names: Iterable[str]) -> tuple[str, frozenset[str]]:
    """(the wrapper prefix every name carries, or "", the names without it)."""
    names = frozenset(names)
    for prefix in WRAPPER_PREFIXES:
        if names and all(n.startswith(prefix) for n in names):
            return prefix, frozenset(n[len(prefix) :] for n in names)
    return "", names


NUMBERED = re.compile(r"^(?:|.*_)\d+$")
"""A numbered segment: a list index (``layers.3``) or an attribute numbered like one (``expert_3``)."""


def name_template(name: str) -> str:
    """name with each numbered segment's number as ``#``: ``model.layers.#.mlp.up_proj.weight``,
    ``experts.expert_#.wi.weight`` (the generator writes the fingerprints the same way)."""
    return ".".join(
        part.rstrip("0123456789") + "#" if NUMBERED.match(part) else part for part in name.split(".")
    )


def recognise(stored: Collection[str]) -> Recognition:
    """The classes whose names the stored names match (see the module's docstring)."""
    prefix, names = unwrapped(stored)
    templates = frozenset(name_template(n) for n in names)
    found = _recognised(templates)
    return Recognition(
        candidates=found[0], confidence=found[1], prefix=prefix, names=len(templates), closest=found[2]
    )


@functools.lru_cache(maxsize=2)  # one checkpoint is asked several times in a row; names may be many
def _recognised(templates: frozenset[str]) -> tuple[tuple[Candidate, ...], Confidence, Candidate | None]:
    data = _fingerprints()
    known = frozenset(data.ids[t] for t in templates if t in data.ids)
    best: dict[str, tuple[bool, float, bool, bool, Spelling]] = {}
    for found in data.prints:
        shared = len(known & found.names)
        if not shared:
            continue
        extra, missing = len(templates) - shared, len(found.required - known)
        share = shared / (shared + extra + missing)
        key = (extra == 0 and missing == 0, share, extra == 0, found.spelling == "disk")
        previous = best.get(found.cls)
        if previous is None or key > previous[:4]:
            best[found.cls] = (*key, found.spelling)
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    if not ranked:
        return (), "none", None
    # A class that writes every name of the file, lacking only a few it would always write, may
    # be the right one built with other config values (ELECTRA without its embedding projection):
    # a candidate too, beside exact matches, so that nothing is applied it does not agree with.
    supersets = [
        Candidate(name, k[4], round(k[1], 4)) for name, k in ranked if not k[0] and k[2] and k[1] >= MIN_SHARE
    ]
    exact = [Candidate(name, k[4], 1.0) for name, k in ranked if k[0]]
    if exact:
        return (*exact, *supersets), "exact", None
    top = ranked[0][1][1]
    if top < MIN_SHARE:
        name, k = ranked[0]
        return (), "none", Candidate(name, k[4], round(k[1], 4))
    near = [Candidate(name, k[4], round(k[1], 4)) for name, k in ranked if k[1] >= top - SHARE_MARGIN]
    return (*near, *(c for c in supersets if c not in near)), "partial", None
