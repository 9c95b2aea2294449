"""The model-class tie table: which names a config.json ties, for every class transformers defines.

``tie_table.json`` (package data beside this module) is generated offline by
``scripts/gen_tie_table.py`` (``make tie-table``) from the pinned transformers: every model class
built on the meta device, its tied names for every combination of the config switches that
change them, the switches' defaults and forced values, and the names ``save_pretrained`` writes.
Auditing reads that file only (loaded on first use, cached): it never imports torch or
transformers and never builds a model from an untrusted config.

``TableEntry.resolve`` answers for one config.json as stated. It refuses to answer (an
``Unresolved`` reason, never a guess) when the config steps outside what the table was computed
for: another model type, a nested model type whose class could tie differently, or a value the
class's ties depend on (``assumes``) stated differently.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tieaudit.core.errors import InputError
from tieaudit.formats.layer_names import truncated, unnumbered

TABLE_RESOURCE = "tie_table.json"
TABLE_SCHEMA = "tieaudit.tie-table/1"
TIE_FLAG = "tie_word_embeddings"
MAX_SHOWN = 60
"""Characters of a config value quoted back in a message (a value may be megabytes long)."""


@dataclass(frozen=True)
class Switch:
    """A config path whose stated value changes what a class ties."""

    path: str
    """As config.json spells it: ``tie_word_embeddings``, ``text_config.tie_word_embeddings``."""
    default: bool | None
    """The value the config class gives it when config.json does not state it (None: no field)."""
    forced: bool | None
    """The value the config class uses whatever is stated; None when it follows the statement."""


@dataclass(frozen=True, kw_only=True)
class SwitchState:
    """One switch as a config.json states it, and the value the class acts on."""

    switch: Switch
    """The switch."""
    stated: bool | None
    """The stated value (None: not stated)."""
    effective: bool | None
    """The value the config class uses (forced, stated, else default)."""
    default_from: str | None = None
    """When not stated and the default comes from another config class: its model type."""

    @property
    def code(self) -> str:
        """The state as the table's combinations spell it: ``-``, ``0`` or ``1``."""
        if self.stated is None and self.default_from is None:
            return "-"
        value = self.stated if self.stated is not None else self.effective
        return "1" if value else "0"

    @property
    def text(self) -> str:
        """A few words on why the switch has its value (for ``DeclaredTie.where``)."""
        path, shown = self.switch.path, _json_bool(self.effective)
        if self.stated is None:
            source = f" ({self.default_from})" if self.default_from else ""
            return f"{path} not stated, defaulted to {shown}{source}"
        if self.effective is not None and self.stated != self.effective:
            return f"{path}={_json_bool(self.stated)} forced to {shown}"
        return path


@dataclass(frozen=True)
class Answer:
    """What one class ties under one config.json."""

    ties: Mapping[str, str]
    """``{target: source}`` (in-memory names, as transformers names them); empty: nothing tied."""
    states: tuple[SwitchState, ...]
    """The class's switches as stated, in table order (the first is the top-level flag)."""
    partial: str | None = None
    """Set when config.json states a value the class's tied names depend on (``assumes``) other
    than the table's: only ties between names outside numbered layers are given, and this says why."""


@dataclass(frozen=True)
class Unresolved:
    """Why the table does not answer for this config."""

    reason: str
    """One clause, e.g. ``text_config.model_type is t5 where the table holds opt``."""


@dataclass(frozen=True, kw_only=True)
class Submodel:
    """A PreTrainedModel inside a class, as the generator found it."""

    prefix: str
    """Its module path (``model.language_model``)."""
    cls: str
    """Its class name."""
    config: str | None
    """The config path it is built from ("" the top; None: not one of the config's levels)."""
    auto: str | None
    """The auto table that picks its class from that config's model type (when one does)."""


@dataclass(frozen=True)
class TableEntry:
    """One model class of the table (see scripts/gen_tie_table.py for how each field is made)."""

    name: str
    """The class name, as ``architectures`` spells it."""
    raw: Mapping[str, Any]
    """The class's record in tie_table.json."""
    table: TieTable
    """The table it belongs to (other classes, defaults of other config classes)."""

    @property
    def model_type(self) -> str:
        """The model type of the class's config class."""
        return str(self.raw["model_type"])

    @property
    def switches(self) -> tuple[Switch, ...]:
        """The config paths whose stated value changes the ties, top-level flag first."""
        return tuple(Switch(s["path"], s.get("default"), s.get("forced")) for s in self.raw["switches"])

    @property
    def ties_anything(self) -> bool:
        """Whether some combination of switches ties at least one pair."""
        return any(group["ties"] for group in self.raw["groups"])

    @property
    def disk_names(self) -> Mapping[str, str | None]:
        """In-memory name -> the name ``save_pretrained`` writes (only names that differ)."""
        return dict(self.raw.get("disk_names", {}))

    @property
    def embedding_names(self) -> tuple[str | None, str | None, str | None]:
        """(input embedding, output embedding, output bias) parameter names; None where absent."""
        return (
            self.raw.get("input_embeddings"),
            self.raw.get("output_embeddings"),
            self.raw.get("output_bias"),
        )

    @property
    def flag_in_forward(self) -> bool:
        """The class's forward reads ``tie_word_embeddings``: setting it changes the outputs too."""
        return self.raw.get("flag_in_forward") is True

    @property
    def submodels(self) -> tuple[Submodel, ...]:
        """The PreTrainedModel modules below the top."""
        return tuple(
            Submodel(prefix=s["prefix"], cls=s["class"], config=s["config"], auto=s["auto"])
            for s in self.raw.get("submodels", [])
        )

    def resolve(self, config: Mapping[str, Any], path: str) -> Answer | Unresolved:
        """The ties of this class under config (the parsed config.json at path), or why the table
        does not answer; a switch stated as something other than true or false is an InputError."""
        try:
            return self._resolve(config, path)
        except _NeedsStatement as exc:
            return Unresolved(f"{exc.args[0]} is not stated and its nested model type's default is not known")

    def _resolve(self, config: Mapping[str, Any], path: str) -> Answer | Unresolved:
        if "unresolved" in self.raw:
            return Unresolved(str(self.raw["unresolved"]))
        stated_type = config.get("model_type")
        if isinstance(stated_type, str) and stated_type != self.model_type:
            return Unresolved(f"config.json's model_type is {_shown(stated_type)}, not {self.model_type}")
        substituted: dict[str, str] = {}
        for level, default_type in sorted(self.raw.get("sub_models", {}).items()):
            other = lookup(config, f"{level}.model_type")
            if isinstance(other, str) and other != default_type:
                problem = self._other_sub_model(level, default_type, other, substituted=substituted)
                if problem is not None:
                    return Unresolved(problem)
        differs = None
        mismatched: dict[str, Any] = {}
        for key, value in sorted(self.raw.get("assumes", {}).items()):
            found = lookup(config, key)
            if found is not None and not _same(found, value):
                mismatched[key] = found
                differs = differs or (
                    f"its tied names depend on {key}, which config.json sets to {_shown(found)} "
                    f"(the table holds the default, {_shown(value)})"
                )
        states = tuple(self._state(switch, config, path, substituted=substituted) for switch in self.switches)
        combo = "".join(state.code for state in states)
        if combo in self.raw.get("refused", []):
            said = [f"{s.switch.path}={_json_bool(s.stated)}" for s in states if s.stated is not None]
            return Unresolved(f"transformers refuses to build it from a config stating {', '.join(said)}")
        ties: dict[str, str] = {}
        for group in self.raw["groups"]:
            if combo in group["on"]:
                ties.update(group["ties"])
        if differs is None or not ties:  # tying nothing under these switches does not move with sizes
            return Answer(ties, states)
        count = self._truncation(mismatched)
        if count is not None:
            fewer = self.raw["assumes"][self.raw["truncate"]["key"]] - count
            return Answer(truncated(ties, self.raw["truncate"]["lists"], fewer), states)
        # Names outside numbered layers (lm_head, embed_tokens) do not move with the layer counts;
        # the ties between numbered layers (Zamba's shared blocks, DETR's per-layer heads) do.
        kept = {t: s for t, s in ties.items() if unnumbered(t) and unnumbered(s)}
        return Answer(kept, states, partial=f"{differs}: ties between numbered layers not resolved")

    def _truncation(self, mismatched: Mapping[str, Any]) -> int | None:
        """The count to cut the ties at, when only the counts the table's ``truncate`` rule covers
        differ (its key, from 2 up to the table's value, and the counts it found changing nothing)."""
        rule = self.raw.get("truncate")
        if not isinstance(rule, dict) or not set(mismatched) <= {rule["key"], *rule.get("others", ())}:
            return None
        default = self.raw["assumes"][rule["key"]]
        count = mismatched.get(rule["key"], default)
        if type(count) is not int or not 2 <= count <= default:
            return None
        return count

    def _other_sub_model(
        self, level: str, default_type: str, other: str, *, substituted: dict[str, str]
    ) -> str | None:
        """None when a nested config of another model type leaves the answer as the table holds
        it (recording whose default its flag then takes); else why not."""
        why = f"{level}.model_type is {_shown(other)} where the table holds {default_type}"
        deeper = [
            s for s in self.switches if s.path.startswith(level + ".") and s.path != f"{level}.{TIE_FLAG}"
        ]
        if deeper or any(lvl.startswith(level + ".") for lvl in self.raw.get("sub_models", {})):
            return why
        for sub in self.submodels:
            if sub.config is None or not (sub.config == level or sub.config.startswith(level + ".")):
                continue
            replacement = self.table.auto_class(sub.auto, other) if sub.config == level else None
            default_entry, other_entry = self.table.entry(sub.cls), self.table.entry(replacement or "")
            if default_entry is None or other_entry is None:
                return why
            if default_entry.ties_anything or other_entry.ties_anything:
                return why
        flag = f"{level}.{TIE_FLAG}"
        if any(s.path == flag for s in self.switches):
            if flag not in self.raw.get("absent_is_default", []) or self.table.flag_default(other) is None:
                substituted[flag] = ""  # known only when config.json states it
            else:
                substituted[flag] = other
        return None

    def _state(
        self, switch: Switch, config: Mapping[str, Any], path: str, *, substituted: dict[str, str]
    ) -> SwitchState:
        value = lookup(config, switch.path)
        if value is not None and not isinstance(value, bool):
            raise InputError(f"{switch.path} must be true or false, not {_shown(value)}", path)
        if value is None and switch.path in substituted:
            other = substituted[switch.path]
            default = self.table.flag_default(other) if other else None
            if default is None:
                raise _NeedsStatement(switch.path)
            forced = switch.forced
            return SwitchState(
                switch=switch,
                stated=None,
                effective=default if forced is None else forced,
                default_from=other,
            )
        if switch.forced is not None:
            return SwitchState(switch=switch, stated=value, effective=switch.forced)
        return SwitchState(switch=switch, stated=value, effective=switch.default if value is None else value)


class _NeedsStatement(Exception):
    """A nested flag of another model type, not stated, whose default the table does not know."""


def resolve(entry: TableEntry, config: Mapping[str, Any], path: str) -> Answer | Unresolved:
    """The ties of the class of entry under config (see ``TableEntry.resolve``)."""
    return entry.resolve(config, path)


def lookup(config: Mapping[str, Any], path: str) -> object:
    """The value at a dotted config path (None when a level is missing or not an object)."""
    value: object = config
    for key in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _same(found: object, expected: object) -> bool:
    """Equality of a config value with a table value (a scalar or a flat list), telling true from 1.

    Element by element, never recursing into found: a config value may be nested thousands deep.
    """
    if isinstance(expected, list):
        return (
            isinstance(found, list)
            and len(found) == len(expected)
            and all(_same_scalar(f, e) for f, e in zip(found, expected, strict=True))
        )
    return _same_scalar(found, expected)


def _same_scalar(found: object, expected: object) -> bool:
    return type(found) is type(expected) and not isinstance(found, (list, dict)) and found == expected


def _shown(value: object) -> str:
    """A config value quoted in a message: scalars as JSON (cut to MAX_SHOWN), containers by size."""
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'mapping'} of {len(value)} entries"
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _json_bool(value: bool | None) -> str:
    return "null" if value is None else str(value).lower()


@dataclass(frozen=True)
class TieTable:
    """The whole table: classes, the classes that could not be built, defaults per model type."""

    raw: Mapping[str, Any]
    """tie_table.json as parsed."""

    @property
    def transformers_version(self) -> str:
        """The transformers version the table was generated from."""
        return str(self.raw["transformers"])

    def entry(self, name: str) -> TableEntry | None:
        """The class named name, or None when the table does not hold it."""
        found = self.raw["classes"].get(name)
        return None if found is None else TableEntry(name, found, self)

    def failure(self, name: str) -> str | None:
        """Why the generator could not build the class named name (None: not listed as failed)."""
        found = self.raw["failed"].get(name)
        return None if found is None else str(found)

    def flag_default(self, model_type: str) -> bool | None:
        """The default ``tie_word_embeddings`` of the config class of model_type (None: unknown)."""
        value = self.raw["config_defaults"].get(model_type)
        return value if isinstance(value, bool) else None

    def auto_class(self, table: str | None, model_type: str) -> str | None:
        """The class transformers' auto table picks for model_type (None: not listed)."""
        found = self.raw["auto_mappings"].get(table or "", {}).get(model_type)
        return found if isinstance(found, str) else None


@functools.cache
def tie_table() -> TieTable:
    """The packaged table, parsed on first use."""
    import importlib.resources  # here: zipfile and pathlib only when the data is read

    text = importlib.resources.files("tieaudit.formats").joinpath(TABLE_RESOURCE).read_text("utf-8")
    raw = json.loads(text)
    if not isinstance(raw, dict) or raw.get("schema") != TABLE_SCHEMA:
        raise RuntimeError(f"tieaudit's {TABLE_RESOURCE} is not a {TABLE_SCHEMA} table")  # a packaging bug
    return TieTable(raw)
