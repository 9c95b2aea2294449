"""Which names a Hugging Face config ties, resolved by model class (``architectures``).

``tie_word_embeddings`` alone names nothing: the tied names belong to the model class
(``_tied_weights_keys``), and a class without a head (``BertModel``) ties nothing whatever the
flag says. The answer comes from tieaudit's tie table only (``tie_table.py``: generated offline
from transformers for every class it defines, flags at every config level, defaults and forced
values applied). A class the table does not hold, or a config outside what the table was computed
for, gets a note: never a guess, and never transformers (auditing imports neither torch nor
transformers and never builds a model from a config it was handed).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tieaudit.core.errors import InputError
from tieaudit.core.records import Checkpoint, DeclaredTie, ModelConfig, Skipped, VocabRoles
from tieaudit.formats.hf.variants import CONFIG, weights_folder
from tieaudit.formats.layer_names import layer_template
from tieaudit.formats.tie_table import (
    TIE_FLAG,
    Answer,
    SwitchState,
    TableEntry,
    resolve,
    tie_table,
)

Resolver = Literal["table"]

MAX_ARCHITECTURES = 64
"""Classes a config.json may name in ``architectures`` (real configs name one; each is a lookup
and possibly a note, so the count is bounded before use)."""
MAX_CLASS_NAME = 200
"""Characters of one class name in ``architectures`` (transformers' longest is under 60)."""

__all__ = [
    "CONFIG",
    "TIE_FLAG",
    "Spelling",
    "TieFlag",
    "TieResolution",
    "class_roles",
    "config_ties",
    "model_config",
    "resolve_ties",
]


@dataclass(frozen=True)
class TieFlag:
    """``tie_word_embeddings`` as config.json states it."""

    value: bool | None
    """The stated value; None when no config level states it."""
    key: str
    """Where it was found (``tie_word_embeddings`` or ``text_config.tie_word_embeddings``)."""


@dataclass(frozen=True, kw_only=True)
class TieResolution:
    """What the config's tie means for one class named in ``architectures``."""

    architecture: str
    """The model class name."""
    ties: Mapping[str, str]
    """``{target: source}`` the class ties under this config (empty: nothing tied)."""
    resolver: Resolver | None
    """Who resolved it: the table; None when it did not (see ``note``)."""
    states: tuple[SwitchState, ...] = ()
    """The class's switches as stated and as acted on (empty when unresolved)."""
    note: str | None = None
    """Why the config tie is not resolved (None when it is), or, with a resolver, which of its
    ties are not (a config whose layer counts differ from the table's)."""

    @property
    def effective(self) -> bool | None:
        """The top-level flag the class acts on (default or forced value applied); None when unresolved."""
        return self.states[0].effective if self.states else None

    @property
    def basis(self) -> str:
        """Why these ties hold, in a few words (for ``DeclaredTie.where``)."""
        return ", ".join([*(state.text for state in self.states), self.resolver or "unresolved"])


Convention = Literal["memory", "disk"]


@dataclass(frozen=True)
class Spelling:
    """How one folder spells a class's names: as transformers names them in memory, or as
    ``save_pretrained`` writes them (the table's ``disk_names``: GPT-NeoX's ``lm_head.weight`` is
    written ``embed_out.weight``, LLaVA's ``model.language_model.*`` is written
    ``language_model.model.*``). Another transformers version may write the in-memory spelling."""

    disk_names: Mapping[str, str | None]
    """In-memory name -> the name save_pretrained writes (only names that differ; None: converted)."""
    stored: frozenset[str]
    """Every tensor name the folder's weight files store."""

    @classmethod
    def of(cls, entry: TableEntry, stored: Collection[str]) -> Spelling:
        """The spelling of entry's names among the stored names."""
        return cls(entry.disk_names, frozenset(stored))

    def _found(self, name: str) -> tuple[str, Convention | None] | None:
        """The stored spelling of name and the convention it shows (None: both spell it alike);
        None when the file stores it under neither spelling."""
        disk = self.disk_names.get(name, name)
        if name in self.stored:
            return name, None if disk == name else "memory"
        if disk is not None and disk in self.stored:
            return disk, "disk"
        return None

    def convention(self) -> Convention:
        """The file's own convention, from the class's renamed names it stores: in-memory when it
        stores some under their in-memory spelling and none under the written one; else written."""
        shown = {found[1] for found in map(self._found, self.disk_names) if found is not None}
        return "memory" if shown == {"memory"} else "disk"

    def spell(self, names: Sequence[str]) -> tuple[str, ...]:
        """Each in-memory name of one tie (or one class's roles) as the file stores it; a name
        stored under neither spelling (a dropped target) takes the convention the rest of names
        shows, else the file's."""
        found = [self._found(name) for name in names]
        shown = {f[1] for f in found if f is not None and f[1] is not None}
        convention = shown.pop() if len(shown) == 1 else self.convention()
        return tuple(
            f[0] if f is not None else self.unstored(name, convention)
            for name, f in zip(names, found, strict=True)
        )

    def unstored(self, name: str, convention: Convention) -> str:
        """name, not stored, spelled by convention (a converted name keeps its in-memory one)."""
        disk = self.disk_names.get(name, name)
        return disk if convention == "disk" and disk is not None else name


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else None


def stated_tie_flag(config: Mapping[str, Any], path: str) -> TieFlag:
    """The stated flag: the top level first, then ``text_config`` (multimodal configs)."""
    levels: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    nested = _text_config(config)
    if nested is not None:
        levels.append(("text_config.", nested))
    for prefix, level in levels:
        value = level.get(TIE_FLAG)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise InputError(f"{prefix}{TIE_FLAG} must be true or false, not {value!r:.60}", path)
        return TieFlag(value, prefix + TIE_FLAG)
    return TieFlag(None, TIE_FLAG)


def stated_vocab_size(config: Mapping[str, Any], path: str) -> int | None:
    """``vocab_size`` from ``text_config``, else from the top level: a wrapper builds its language
    model, embedding and head included, from ``text_config`` (PaliGemma's config class also writes
    a top-level ``vocab_size`` that keeps its default, 257152, whatever the text model's is)."""
    nested = _text_config(config)
    for prefix, level in (("text_config.", nested or {}), ("", config)):
        value = level.get("vocab_size")
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{prefix}vocab_size must be a non-negative integer, not {value!r:.60}", path)
        return value
    return None


def stated_architectures(config: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """The model classes named in ``architectures`` (empty when absent)."""
    value = config.get("architectures")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InputError("architectures must be a list of class names", path)
    if len(value) > MAX_ARCHITECTURES:
        raise InputError(f"architectures names {len(value)} classes (at most {MAX_ARCHITECTURES})", path)
    for item in value:
        if len(item) > MAX_CLASS_NAME:
            raise InputError(f"architectures holds a {len(item)}-character class name", path)
    return tuple(value)


def resolve_class(architecture: str, config: Mapping[str, Any], path: str) -> TieResolution:
    """One class's ties from the table, or why it has none to give."""
    table = tie_table()
    version = f"transformers {table.transformers_version}"
    entry = table.entry(architecture)
    if entry is None:
        failure = table.failure(architecture)
        why = "could not be built when the table was made" if failure else "is not in tieaudit's tie table"
        return TieResolution(
            architecture=architecture,
            ties={},
            resolver=None,
            note=f"architecture {architecture} {why} ({version})",
        )
    answer = resolve(entry, config, path)
    if not isinstance(answer, Answer):
        return TieResolution(
            architecture=architecture,
            ties={},
            resolver=None,
            note=f"architecture {architecture} ({version}): {answer.reason}",
        )
    note = None if answer.partial is None else f"architecture {architecture} ({version}): {answer.partial}"
    return TieResolution(
        architecture=architecture, ties=dict(answer.ties), resolver="table", states=answer.states, note=note
    )


def resolve_ties(config: Mapping[str, Any], path: str) -> tuple[TieResolution, ...]:
    """One resolution per class in ``architectures``, from the tie table alone."""
    return tuple(resolve_class(name, config, path) for name in stated_architectures(config, path))


def config_ties(
    config: Mapping[str, Any], path: str, *, stored: Collection[str] | None = None
) -> tuple[list[DeclaredTie], list[Skipped]]:
    """Declared ties from config.json (at path), and a note for every class not resolved.

    With stored (the tensor names of the folder's weight files), each tie is spelled as those
    files spell it (``Spelling``); without, in transformers' in-memory names.
    """
    file = os.path.basename(path)
    table = tie_table()
    ties: list[DeclaredTie] = []
    notes: list[Skipped] = []
    resolutions = resolve_ties(config, path)
    for resolution in resolutions:
        if resolution.note is not None:
            notes.append(
                Skipped(
                    f"{file}:architectures:{resolution.architecture}",
                    resolution.note if resolution.resolver else f"{resolution.note}; config tie not resolved",
                )
            )
        where = f"{file} ({resolution.basis})"
        entry = table.entry(resolution.architecture)
        spelling = Spelling.of(entry, stored) if stored is not None and entry is not None else None
        for target, source in resolution.ties.items():
            if spelling is not None:
                target, source = spelling.spell((target, source))
            ties.append(DeclaredTie(dropped=target, kept=source, declared_by="config", where=where))
    if not resolutions and stated_tie_flag(config, path).value is not False:
        notes.append(Skipped(f"{file}:architectures", "no architectures listed; config tie not resolved"))
    return ties, notes


def _one_class(config: Mapping[str, Any], path: str) -> Resolved | None:
    """The table's entry and answer for the one class ``architectures`` names; None when it names
    none or several, or the table does not answer for this config."""
    architectures = stated_architectures(config, path)
    entry = tie_table().entry(architectures[0]) if len(architectures) == 1 else None
    if entry is None:
        return None
    answer = resolve(entry, config, path)
    return (entry, answer) if isinstance(answer, Answer) else None


Resolved = tuple[TableEntry, Answer]
"""The table's entry and answer for the one class a config.json names (``_one_class``)."""


def class_roles(resolved: Resolved | None, stored: Collection[str]) -> VocabRoles | None:
    """The vocabulary tensors of the one class ``architectures`` names, spelled as stored; a role
    whose name is a tie target the file does not store is its source (BERT's tied
    ``cls.predictions.decoder.bias`` is stored as ``cls.predictions.bias``). None when
    ``architectures`` names no class or several, or the table does not answer for this config."""
    if resolved is None:
        return None
    entry, answer = resolved
    spelling = Spelling.of(entry, stored)

    def role(name: str | None) -> str | None:
        for _ in range(len(answer.ties) + 1):  # a chain of ties is at most this long
            if name is None:
                return None
            (spelled,) = spelling.spell((name,))
            if spelled in spelling.stored or name not in answer.ties:
                return spelled
            name = answer.ties[name]
        return None  # a cycle of ties: the table never holds one

    embedding, output, bias = entry.embedding_names
    return VocabRoles(
        architecture=entry.name,
        input_embedding=role(embedding),
        output_embedding=role(output),
        output_bias=role(bias),
    )


def class_tie_pairs(resolved: Resolved | None, stored: Collection[str]) -> tuple[tuple[str, str], ...] | None:
    """Every pair the one class ``architectures`` names ties under some setting of its switches,
    spelled as stored; None under the same conditions as ``class_roles``, and when the table gives
    only part of the class's ties for this config (``Answer.partial``: other layer counts)."""
    if resolved is None or resolved[1].partial is not None:
        return None
    entry = resolved[0]
    spelling = Spelling.of(entry, stored)
    pairs = {(t, s) for group in entry.raw["groups"] for t, s in group["ties"].items()}
    spelled = {(a, b) for a, b in (spelling.spell((t, s)) for t, s in pairs)}
    return tuple(sorted(spelled))


def flag_read_by(config: Mapping[str, Any], path: str) -> str | None:
    """The first class ``architectures`` names whose forward reads ``tie_word_embeddings`` (setting
    the flag would change what it computes, not only what it ties); None when no class does."""
    table = tie_table()
    for name in stated_architectures(config, path):
        entry = table.entry(name)
        if entry is not None and entry.flag_in_forward:
            return name
    return None


def class_layer_templates(resolved: Resolved | None, stored: Collection[str]) -> frozenset[str] | None:
    """For a partial answer (``Answer.partial``), the class's tied names (under any switch setting,
    as stored) with numbers replaced by ``#``; None when the answer is whole or there is none."""
    if resolved is None or resolved[1].partial is None:
        return None
    entry = resolved[0]
    spelling = Spelling.of(entry, stored)
    names = {n for group in entry.raw["groups"] for pair in group["ties"].items() for n in pair}
    return frozenset(layer_template(spelling.spell((n,))[0]) for n in names)


def model_config(
    config: Mapping[str, Any] | None,
    path: str,
    *,
    tokenizer_size: int | None,
    tokenizer_file: str,
    stored: Collection[str],
) -> ModelConfig | None:
    """The facts of config.json (at path) that tie rules use (None without config and tokenizer);
    stored: the tensor names of the folder's weight files (for the class's roles)."""
    if config is None and tokenizer_size is None:
        return None
    if config is None:
        return ModelConfig(tokenizer_vocab_size=tokenizer_size, file=tokenizer_file)
    resolved = _one_class(config, path)
    return ModelConfig(
        architectures=stated_architectures(config, path),
        tie_word_embeddings=stated_tie_flag(config, path).value,
        vocab_size=stated_vocab_size(config, path),
        tokenizer_vocab_size=tokenizer_size,
        file=os.path.basename(path),
        roles=class_roles(resolved, stored),
        class_ties=class_tie_pairs(resolved, stored),
        layer_templates=class_layer_templates(resolved, stored),
    )


def with_flag(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of config with the flag set true at the top and where ``text_config`` states it."""
    edited = copy.deepcopy(dict(config))
    edited[TIE_FLAG] = True
    nested = edited.get("text_config")
    if isinstance(nested, dict) and TIE_FLAG in nested:
        nested[TIE_FLAG] = True
    return edited


def class_pairs(ckpt: Checkpoint, config: Mapping[str, Any]) -> set[tuple[str, str]]:
    """``(target, source)`` pairs the model class ties when the flag is true (empty: unresolved)."""
    ties, _ = config_ties(
        with_flag(config), os.path.join(weights_folder(ckpt.path), CONFIG), stored=ckpt.names
    )
    return {(t.dropped, t.kept) for t in ties}
