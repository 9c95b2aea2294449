"""What the model class recognised from a bare file's names ties, and what it does not.

A bare checkpoint file (a lone safetensors or .pt file, audited without a config.json) names no
class. ``bare_family`` recognises the class from the tensor names (``family_names.recognise``)
and reads its ties from the tie table, as a model folder's ``architectures`` would, assuming the
config class's defaults (nothing is stated): the ties that hold then are what
``safetensors.torch.load_model`` restores into the class built from its defaults.

With several candidate classes (classes that write the same names), only what every candidate
agrees on is used:

- ``accepted``: pairs every candidate ties by default, spelled as the file stores them: retie
  re-ties them by default, and check's fix needs no --all-equal;
- ``by_construction``: names every candidate writes, no two of which any candidate ties under any
  setting of its switches (compared with numbered segments as ``#``, so a tie between layers of
  another count still counts): equal by construction, a TIE001 note that retie leaves.

A candidate whose ties the table does not give for every config (``unresolved``, or tied names that
move with the layer counts) makes neither answer: the copy stays a warning.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tieaudit.core.records import Checkpoint
from tieaudit.formats.family_names import Recognition, name_template, recognise, table_version, written
from tieaudit.formats.hf_ties import Spelling
from tieaudit.formats.tie_table import TableEntry, tie_table

BARE_FORMATS = ("safetensors", "torch")
"""The single-file formats whose class is recognised from the names (not a folder: its
config.json names the class; not ONNX or GGUF: their names are not the class's)."""
NOT_A_TIE = "equal by construction is not a tie; --all-equal re-ties it"
"""The start of retie's reason for an equal copy the known class does not tie (formats.loaders)."""
CLOSEST_SHOWN = 0.5
"""A class an unrecognised file's names are this close to is named in messages (JSON: always)."""
NAMED_CLASSES = 5
"""Candidate classes named in one message (the JSON report lists every one)."""
LOADER = (
    "safetensors.torch.load_model(strict=True) loads the output only into a model that shares them, "
    "and from_pretrained restores a dropped name only through the model class's ties"
)
"""What the loaders do with an equal copy re-tied although nothing says the model ties it."""


_NAMES_AS = {"disk": "save_pretrained", "memory": "state_dict"}
"""How the JSON report names a spelling: as save_pretrained writes, or as the state_dict holds them."""


@dataclass(frozen=True, kw_only=True)
class Family:
    """A bare file's recognised class (or candidates) and what they tie."""

    recognition: Recognition
    """Which classes the names match, and how well."""
    pairs: tuple[tuple[str, str], ...]
    """``(target, source)`` as stored, that every candidate ties with nothing stated in its config."""
    tied: frozenset[tuple[str, str]]
    """Name templates (numbered segments as ``#``) some candidate ties under some setting."""
    known: frozenset[str]
    """Name templates every candidate writes (after the wrapper prefix)."""
    unknown: tuple[str, ...]
    """Candidates whose ties the table does not give for every config."""
    defaults: Mapping[frozenset[str], str]
    """For a tied template pair no candidate ties by default: the settings that tie it."""

    @property
    def accepted(self) -> frozenset[frozenset[str]]:
        """``pairs`` as unordered pairs."""
        return frozenset(frozenset(pair) for pair in self.pairs)

    def accepts_any(self, names: Collection[str]) -> bool:
        """Whether two of names are a pair every candidate ties by default (``pairs``)."""
        present = set(names)
        return any(target in present and source in present for target, source in self.pairs)

    @property
    def recognised(self) -> bool:
        return bool(self.recognition.candidates)

    @property
    def named(self) -> str:
        """The class, or the candidate classes, as a message names them."""
        names = self.recognition.classes
        if len(names) == 1:
            return f"the model class {names[0]}"
        more = len(names) - NAMED_CLASSES
        return f"the model classes {', '.join(names[:NAMED_CLASSES])}" + (
            f" and {more} more" if more > 0 else ""
        )

    @property
    def how(self) -> str:
        """How the class was recognised, in a few words."""
        found = self.recognition
        wrapped = f" under the prefix {found.prefix}" if found.prefix else ""
        exact = sum(c.share == 1.0 for c in found.candidates)
        more = len(found.candidates) - exact
        if found.confidence == "exact" and not more:
            match = "an exact match" if exact == 1 else f"{exact} classes write exactly these names"
        elif found.confidence == "exact":
            verb = "class writes" if exact == 1 else "classes write"
            match = f"{exact} {verb} exactly these names, {more} more write them all and a few more"
        else:
            match = f"a partial match, {found.share:.0%} of names in common"
        return f"recognised from the tensor names{wrapped}: {match}"

    def none_ties(self, what: str, *, start: bool = True) -> str:
        """ "The model class X (how) does not tie {what}", or its plural; capitalised at a start."""
        if len(self.recognition.candidates) == 1:
            said = f"the model class {self.recognition.classes[0]} ({self.how}) does not tie {what}"
        else:
            said = f"none of {self.named} ({self.how}) ties {what}"
        return said[0].upper() + said[1:] if start else said

    def all_tie(self, what: str) -> str:
        """"The model class X (how) ties {what} by default", or its plural, capitalised."""
        if len(self.recognition.candidates) == 1:
            return f"The model class {self.recognition.classes[0]} ({self.how}) ties {what} by default"
        return f"Each of {self.named} ({self.how}) ties {what} by default"

    def _templates(self, names: Collection[str]) -> list[str]:
        prefix = self.recognition.prefix
        return [name_template(n[len(prefix) :] if prefix and n.startswith(prefix) else n) for n in names]

    def ties_some(self, names: Collection[str]) -> bool:
        """Whether some candidate ties two of names under some setting (templates compared)."""
        templates = Counter(self._templates(names))
        return any(a in templates and b in templates and (a != b or templates[a] > 1) for a, b in self.tied)

    def by_construction(self, names: Collection[str]) -> bool:
        """Equal by construction: every candidate writes every name, and none ties any two."""
        if not self.recognised or self.unknown:
            return False
        return all(t in self.known for t in self._templates(names)) and not self.ties_some(names)

    def left_because(self, first: str, second: str) -> str:
        """Why retie leaves this equal pair by default (it is not in ``accepted``)."""
        if self.by_construction((first, second)):
            return (
                f"{NOT_A_TIE} ({self.none_ties('these two', start=False)}: "
                "safetensors.torch.load_model(strict=True) refuses a file without one of them)"
            )
        return (
            f"not re-tied by default: {self.why_not(first, second)}; --all-equal re-ties it (then {LOADER})"
        )

    def why_not(self, first: str, second: str) -> str:
        """Why a pair that is not equal by construction is not one every candidate ties by default."""
        if self.unknown:
            return f"the tie table does not give every tie of {', '.join(self.unknown)} ({self.how})"
        if not self.ties_some((first, second)):
            return f"{self.named} ({self.how}) may not write both {first} and {second}"
        pair = frozenset(self._templates((first, second)))
        setting = self.defaults.get(pair)
        if setting is not None and len(self.recognition.candidates) == 1:
            return f"{self.named} ({self.how}) ties these two only with {setting}, not with its defaults"
        if setting is not None:
            return f"{self.named} ({self.how}) tie these two only with {setting}, not with their defaults"
        return f"not all of {self.named} ({self.how}) tie these two by default"

    def as_dict(self) -> dict[str, Any]:
        """The JSON report's ``family`` field."""
        found = self.recognition
        closest = found.closest
        return {
            "recognised": self.recognised,
            "confidence": found.confidence,
            "classes": list(found.classes),
            "candidates": [
                {"class": c.name, "names_as": _NAMES_AS[c.spelling], "share": c.share}
                for c in found.candidates
            ],
            "share": found.share,
            "prefix": found.prefix,
            "distinct_names": found.names,
            "tied_by_default": [list(pair) for pair in self.pairs],
            **({"ties_unknown": list(self.unknown)} if self.unknown else {}),
            **({"closest": {"class": closest.name, "share": closest.share}} if closest else {}),
            "table": f"transformers {table_version()}",
        }

    def closest_text(self) -> str:
        """`` (closest: X, 85% of names in common)`` when not recognised and a class comes that close."""
        closest = self.recognition.closest
        if closest is None or closest.share < CLOSEST_SHOWN:
            return ""
        return f" (closest: {closest.name}, {closest.share:.0%} of names in common)"

    def describe(self) -> str:
        """One line for the text report: the class and how sure, and what it ties by default."""
        if not self.recognised:
            return (
                f"model class: not recognised from the tensor names{self.closest_text()}; retie re-ties "
                "by default only what a {dropped: kept} record names"
            )
        classes = self.named.removeprefix("the model class ").removeprefix("the model classes ")
        ties = "; ".join(f"{target} = {source}" for target, source in self.pairs[:NAMED_CLASSES])
        more = f" and {len(self.pairs) - NAMED_CLASSES} more" if len(self.pairs) > NAMED_CLASSES else ""
        tied = f"tied by default: {ties}{more}" if ties else "nothing tied by default"
        unknown = f"; ties not known for every config: {', '.join(self.unknown)}" if self.unknown else ""
        return f"model class: {classes} ({self.how}); {tied}{unknown}"


def bare_family(ckpt: Checkpoint) -> Family | None:
    """The recognised class of a bare file (None: not a bare file, or its format has no class)."""
    if ckpt.config is not None or ckpt.format not in BARE_FORMATS or ckpt.training is not None:
        return None
    names = frozenset(ckpt.names) | frozenset(t.dropped for t in ckpt.declared_ties)
    return _family(names)


@functools.lru_cache(maxsize=2)  # one checkpoint is asked several times in a row; names may be many
def _family(names: frozenset[str]) -> Family:
    found = recognise(names)
    table = tie_table()
    entries = [(c, table.entry(c.name)) for c in found.candidates]
    unknown = tuple(c.name for c, e in entries if e is None or _moves(e))
    accepted: dict[frozenset[str], tuple[str, str]] | None = None
    tied: set[tuple[str, str]] = set()
    defaults: dict[frozenset[str], str] = {}
    by_default: set[frozenset[str]] = set()
    known: frozenset[str] | None = None
    prefix = found.prefix
    inner = frozenset(n[len(prefix) :] for n in names) if prefix else names
    for candidate, entry in entries:
        if entry is None:
            continue
        writes = written(candidate.name, candidate.spelling)
        known = writes if known is None else known & writes
        spelling = Spelling.of(entry, inner)
        nothing = "-" * len(entry.switches)
        mine: dict[frozenset[str], tuple[str, str]] = {}
        for group in entry.raw["groups"]:
            for target, source in group["ties"].items():
                spelled = spelling.spell((target, source))
                templates = (name_template(spelled[0]), name_template(spelled[1]))
                tied.add(templates)
                if nothing in group["on"]:
                    mine[frozenset(spelled)] = (prefix + spelled[0], prefix + spelled[1])
                    by_default.add(frozenset(templates))
                else:
                    defaults.setdefault(frozenset(templates), _setting(entry, group["on"]))
        accepted = mine if accepted is None else {k: v for k, v in accepted.items() if k in mine}
    return Family(
        recognition=found,
        pairs=() if accepted is None or unknown else tuple(sorted(accepted.values())),
        tied=frozenset(tied),
        known=known or frozenset(),
        unknown=unknown,
        defaults={k: v for k, v in defaults.items() if k not in by_default},
    )


def _moves(entry: TableEntry) -> bool:
    """Whether the class's ties depend on config values the file does not show."""
    return "unresolved" in entry.raw or bool(entry.raw.get("size_dependent"))


def _setting(entry: TableEntry, on: list[str]) -> str:
    """The first combination of stated switches under which a group of ties holds, as words."""
    stated = [
        f"{s.path}={'true' if state == '1' else 'false'}"
        for s, state in zip(entry.switches, on[0], strict=True)
        if state != "-"
    ]
    return " and ".join(stated) or "its defaults"
