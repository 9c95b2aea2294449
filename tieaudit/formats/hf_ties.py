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

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tieaudit.errors import InputError
from tieaudit.formats.tie_table import TIE_FLAG, Answer, SwitchState, resolve, tie_table
from tieaudit.model import DeclaredTie, ModelConfig, Skipped

Resolver = Literal["table"]

MAX_ARCHITECTURES = 64
"""Classes a config.json may name in ``architectures`` (real configs name one; each is a lookup
and possibly a note, so the count is bounded before use)."""
MAX_CLASS_NAME = 200
"""Characters of one class name in ``architectures`` (transformers' longest is under 60)."""

__all__ = ["TIE_FLAG", "TieFlag", "TieResolution", "config_ties", "model_config", "resolve_ties"]


@dataclass(frozen=True)
class TieFlag:
    """``tie_word_embeddings`` as config.json states it."""

    value: bool | None
    """The stated value; None when no config level states it."""
    key: str
    """Where it was found (``tie_word_embeddings`` or ``text_config.tie_word_embeddings``)."""


@dataclass(frozen=True)
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
    """Why the config tie is not resolved (None when it is)."""

    @property
    def effective(self) -> bool | None:
        """The top-level flag the class acts on (default or forced value applied); None when unresolved."""
        return self.states[0].effective if self.states else None

    @property
    def basis(self) -> str:
        """Why these ties hold, in a few words (for ``DeclaredTie.where``)."""
        return ", ".join([*(state.text for state in self.states), self.resolver or "unresolved"])


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
    """``vocab_size`` from the top level, else from ``text_config``."""
    nested = _text_config(config)
    for prefix, level in (("", config), ("text_config.", nested or {})):
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
        return TieResolution(architecture, {}, None, note=f"architecture {architecture} {why} ({version})")
    answer = resolve(entry, config, path)
    if not isinstance(answer, Answer):
        return TieResolution(
            architecture, {}, None, note=f"architecture {architecture} ({version}): {answer.reason}"
        )
    return TieResolution(architecture, dict(answer.ties), "table", answer.states)


def resolve_ties(config: Mapping[str, Any], path: str) -> tuple[TieResolution, ...]:
    """One resolution per class in ``architectures``, from the tie table alone."""
    return tuple(resolve_class(name, config, path) for name in stated_architectures(config, path))


def config_ties(config: Mapping[str, Any], path: str) -> tuple[list[DeclaredTie], list[Skipped]]:
    """Declared ties from config.json (at path), and a note for every class not resolved."""
    file = os.path.basename(path)
    ties: list[DeclaredTie] = []
    notes: list[Skipped] = []
    resolutions = resolve_ties(config, path)
    for resolution in resolutions:
        if resolution.note is not None:
            notes.append(
                Skipped(
                    f"{file}:architectures:{resolution.architecture}",
                    f"{resolution.note}; config tie not resolved",
                )
            )
        where = f"{file} ({resolution.basis})"
        ties.extend(DeclaredTie(t, s, "config", where) for t, s in resolution.ties.items())
    if not resolutions and stated_tie_flag(config, path).value is not False:
        notes.append(Skipped(f"{file}:architectures", "no architectures listed; config tie not resolved"))
    return ties, notes


def model_config(
    config: Mapping[str, Any] | None, path: str, tokenizer_size: int | None, tokenizer_file: str
) -> ModelConfig | None:
    """The facts of config.json (at path) that tie rules use (None without config and tokenizer)."""
    if config is None and tokenizer_size is None:
        return None
    if config is None:
        return ModelConfig(tokenizer_vocab_size=tokenizer_size, file=tokenizer_file)
    return ModelConfig(
        architectures=stated_architectures(config, path),
        tie_word_embeddings=stated_tie_flag(config, path).value,
        vocab_size=stated_vocab_size(config, path),
        tokenizer_vocab_size=tokenizer_size,
        file=os.path.basename(path),
    )
