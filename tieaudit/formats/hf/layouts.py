"""Repository layouts as their libraries define them, each recognised from its own marker file.

- sentence-transformers: ``modules.json`` lists the modules a ``SentenceTransformer`` loads, each
  with the folder it lives in (``""`` for the transformer at the root, ``1_Pooling``, ``2_Dense``).
  A module folder holding weights (Dense) is audited; one holding only its config (Pooling,
  Normalize) is no model.
- diffusers: ``model_index.json`` names a pipeline's components, each a folder (``unet``, ``vae``,
  ``text_encoder``) that its library loads with ``from_pretrained``; a component's own
  ``config.json`` names its class in ``_class_name``.
- PEFT: ``adapter_config.json`` beside ``adapter_model.safetensors`` (or ``adapter_model.bin``): an
  adapter loaded onto a base model (``rules.adapter`` checks what it replaces).
- timm: a ``config.json`` naming ``architecture`` with a ``pretrained_cfg``.

A folder holding a ``config.json`` and no weights is a model only when that config names a model
architecture (``architectures``, ``model_type``, diffusers' ``_class_name``, timm's
``architecture``); otherwise it is skipped, saying why. A marker that cannot be read (too large,
not JSON, another shape) recognises nothing: the folder is then judged by its own files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tieaudit.core.errors import InputError
from tieaudit.core.escape import quoted
from tieaudit.core.limits import read_limited
from tieaudit.formats.hf.variants import ADAPTER_STEM, beside_weights, is_shard_index, may_be_adapter
from tieaudit.formats.hf_dir import (
    ADAPTER_CONFIG,
    DIFFUSERS_INDEX,
    SAFE_INDEX,
    TORCH_INDEX,
    TORCH_SINGLES,
    find_weights,
)
from tieaudit.formats.hf_ties import CONFIG

MODULES = "modules.json"
"""sentence-transformers' list of modules."""
MODEL_INDEX = "model_index.json"
"""A diffusers pipeline's components."""
MAX_MARKER_BYTES = 4 << 20
"""Largest layout marker read (modules.json, model_index.json, ...): real ones are under 10 KiB."""
MAX_LAYOUT_ENTRIES = 1000
"""Most modules or components one marker may list: real pipelines have under twenty."""
FILELESS_MODULES = frozenset({"Normalize"})
"""sentence-transformers module types (exact class names) whose loading reads no file: their folder
may be absent (the MiniLM package's modules.json lists ``2_Normalize`` and ships no such folder)."""
MAX_VARIANT_TENSORS = 1_000_000
"""Entries of a variant's shard index looked at for missing shards (a real index lists under 100 000)."""
MARKER_LEVELS = 3
"""Folders up a nested sentence-transformers module looks for modules.json (a Router's: one more)."""
ARCHITECTURE_KEYS = ("architectures", "model_type", "_class_name", "architecture")
"""Keys of a config.json that name a model architecture (transformers, diffusers, timm)."""
MODEL_MARKERS = (CONFIG, ADAPTER_CONFIG, SAFE_INDEX, TORCH_INDEX, DIFFUSERS_INDEX)
"""A folder holding one of these next to weights is one Hugging Face model."""


@dataclass(frozen=True, kw_only=True)
class Part:
    """What a folder is in the repository layout around it."""

    layout: str
    """The library whose layout it is: sentence-transformers, diffusers, PEFT, timm."""
    what: str
    """What the folder is in that layout (``module 1_Pooling (Pooling)``)."""
    marker: str
    """The marker file that says so (a path)."""
    transformers_config: bool = False
    """Its config.json is a transformers model's (a sentence-transformers transformer module)."""

    def describe(self) -> str:
        """One phrase: ``a sentence-transformers module '1_Pooling' (Pooling; modules.json)``."""
        what, _, kind = self.what.partition(" (")
        inside = f"{kind[:-1]}; " if kind else ""
        return f"a {self.layout} {what} ({inside}{os.path.basename(self.marker)})"

    def kind(self) -> str:
        """The phrase without this folder's name (one reason for every such folder, counted together):
        ``a sentence-transformers module (modules.json)``."""
        return f"a {self.layout} {self.what.split(' ', 1)[0]} ({os.path.basename(self.marker)})"


def read_marker(path: str) -> Any:
    """A marker file's JSON document, or None when it is absent or cannot be read as one (bounded)."""
    try:
        data = read_limited(path, MAX_MARKER_BYTES, os.path.basename(path))
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def names_architecture(config: Mapping[str, Any]) -> bool:
    """config names a model architecture: transformers', diffusers' or timm's key, non-empty."""
    return any(config.get(key) for key in ARCHITECTURE_KEYS)


def _short_type(value: object) -> str:
    """``sentence_transformers.models.Pooling`` -> ``Pooling`` (escaped: it comes from a file)."""
    text = value if isinstance(value, str) else ""
    return quoted(text.rsplit(".", 1)[-1], 80).strip("'") if text else "unknown type"


def _sentence_module(folder: str, parent: str) -> Part | None:
    marker = os.path.join(parent, MODULES)
    modules = read_marker(marker)
    if not isinstance(modules, list) or len(modules) > MAX_LAYOUT_ENTRIES:
        return None
    name = os.path.basename(folder)
    for module in modules:
        if isinstance(module, dict) and module.get("path") == name:
            kind = _short_type(module.get("type"))
            what = f"module {quoted(name, 80)} ({kind})"
            return Part(layout="sentence-transformers", what=what, marker=marker)
    return None


def _pipeline_component(folder: str, parent: str) -> Part | None:
    marker = os.path.join(parent, MODEL_INDEX)
    index = read_marker(marker)
    if not isinstance(index, dict) or len(index) > MAX_LAYOUT_ENTRIES:
        return None
    entry = index.get(os.path.basename(folder))
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(e, str | None) for e in entry)):
        return None
    library, kind = entry
    transformers = library == "transformers"
    what = f"component {quoted(os.path.basename(folder), 80)} ({_short_type(kind)} from {library})"
    return Part(layout="diffusers", what=what, marker=marker, transformers_config=transformers)


def folder_part(folder: str) -> Part | None:
    """What folder is in its repository's layout, from the markers in it and in its parent; None
    when no marker speaks of it."""
    folder = os.path.normpath(folder)
    parent = os.path.dirname(folder) or "."
    if os.path.isfile(os.path.join(folder, ADAPTER_CONFIG)):
        return Part(layout="PEFT", what="adapter", marker=os.path.join(folder, ADAPTER_CONFIG))
    if os.path.isfile(os.path.join(folder, MODULES)):  # the root module: a transformers model
        marker = os.path.join(folder, MODULES)
        return Part(layout="sentence-transformers", what="model", marker=marker, transformers_config=True)
    found = _sentence_module(folder, parent) if os.path.isfile(os.path.join(parent, MODULES)) else None
    if found is None and os.path.isfile(os.path.join(parent, MODEL_INDEX)):
        found = _pipeline_component(folder, parent)
    if found is not None:
        return found
    return _by_own_config(folder)


def unit_loading(folder: str) -> Part | None:
    """The part a folder is when its library loads it from its place in a larger unit (a marker above
    it: a sentence-transformers module, a pipeline component): a re-tied copy elsewhere is not loaded."""
    part = folder_part(folder) if os.path.isdir(folder) else None
    if part is None or os.path.dirname(part.marker) == os.path.normpath(folder):
        return None
    return part if part.layout in ("sentence-transformers", "diffusers") else None


def _by_own_config(folder: str) -> Part | None:
    """A folder no marker around it speaks of, by its own config.json: a diffusers model saved alone
    (``_class_name``), a timm model (``architecture`` with ``pretrained_cfg``), or a module nested
    deeper in a sentence-transformers model (a Router's ``query_0_Dense``: no architecture, with a
    ``modules.json`` up to MARKER_LEVELS folders up)."""
    marker = os.path.join(folder, CONFIG)
    config = read_marker(marker)
    if not isinstance(config, dict):
        return None
    if config.get("_class_name") and "_diffusers_version" in config:
        kind = _short_type(config.get("_class_name"))
        return Part(layout="diffusers", what=f"model ({kind})", marker=marker)
    if config.get("architecture") and "pretrained_cfg" in config:
        kind = _short_type(config.get("architecture"))
        return Part(layout="timm", what=f"model ({kind})", marker=marker)
    if names_architecture(config):
        return None
    above = folder
    for _ in range(MARKER_LEVELS):
        above = os.path.dirname(above)
        if os.path.isfile(os.path.join(above, MODULES)):
            name, modules = quoted(os.path.relpath(folder, above), 80), os.path.join(above, MODULES)
            return Part(layout="sentence-transformers", what=f"module {name}", marker=modules)
    return None


def missing_parts(folder: str) -> list[tuple[str, str]]:
    """(path, message) for each module (modules.json) or component (model_index.json) the folder's
    marker lists whose folder is absent: the library refuses to load such a repository."""
    missing = []
    modules = (
        read_marker(os.path.join(folder, MODULES)) if os.path.isfile(os.path.join(folder, MODULES)) else None
    )
    if isinstance(modules, list) and len(modules) <= MAX_LAYOUT_ENTRIES:
        for module in modules:
            path = module.get("path") if isinstance(module, dict) else None
            kind = _short_type(module.get("type")) if isinstance(module, dict) else ""
            if kind in FILELESS_MODULES or not isinstance(path, str) or not path:
                continue
            if not os.path.isdir(os.path.join(folder, path)):
                missing.append(
                    (
                        os.path.join(folder, path),
                        f"{MODULES} lists the {kind} module here, which is missing: "
                        "SentenceTransformer cannot load this model",
                    )
                )
    index = (
        read_marker(os.path.join(folder, MODEL_INDEX))
        if os.path.isfile(os.path.join(folder, MODEL_INDEX))
        else None
    )
    if isinstance(index, dict) and len(index) <= MAX_LAYOUT_ENTRIES:
        for name, entry in index.items():
            listed = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
            if listed and not name.startswith("_") and not os.path.isdir(os.path.join(folder, name)):
                missing.append(
                    (
                        os.path.join(folder, name),
                        f"{MODEL_INDEX} lists the component {quoted(name, 80)} "
                        f"({_short_type(entry[1])}), which is missing: the pipeline cannot load",
                    )
                )
    return missing


def missing_variant_shards(folder: str) -> list[tuple[str, str]]:
    """(path, message) for a variant's shard index (``model.safetensors.index.fp16.json``) listing
    shards that are absent: ``from_pretrained(variant=...)`` fails on it (transformers itself leaves
    one behind when a plain save follows a variant save into one folder)."""
    try:
        chosen = find_weights(folder).index
    except InputError:  # the folder's own audit says why it has no weights
        return []
    found = []
    for name in beside_weights(folder, chosen):
        index = os.path.join(folder, name)
        document = read_marker(index)
        weight_map = document.get("weight_map") if isinstance(document, dict) else None
        if not isinstance(weight_map, dict) or len(weight_map) > MAX_VARIANT_TENSORS:
            continue
        files = {f for f in weight_map.values() if isinstance(f, str)}
        absent = sorted(f for f in files if not os.path.isfile(os.path.join(folder, f)))
        if absent:
            more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
            found.append(
                (
                    index,
                    f"lists {quoted(absent[0], 120)}{more}, which {'are' if more else 'is'} missing: "
                    "from_pretrained with this variant fails",
                )
            )
    return found


def loader_gaps(folder: str) -> list[tuple[str, str]]:
    """(path, message) for everything the folder's markers list that its loader needs and cannot
    find: modules, pipeline components, a variant's shards."""
    return missing_parts(folder) + missing_variant_shards(folder)


def config_only_reason(folder: str) -> str:
    """Why a folder holding a config.json and nothing to audit is no model (empty when it is one,
    or when its config cannot be read: its audit then says what is wrong)."""
    config = read_marker(os.path.join(folder, CONFIG))
    if not isinstance(config, dict) or names_architecture(config):
        return ""
    part = folder_part(folder)
    if part is not None:
        return f"{part.kind()} holding no weights"
    return CONFIG_ONLY


CONFIG_ONLY = f"a {CONFIG} naming no model architecture, with no weights beside it"
"""Why a folder whose config describes no model is skipped."""


def is_model_folder(path: str) -> bool:
    """A Hugging Face model folder: config.json or a shard index, next to weight files (a shard
    index alone counts: its shards are what it lists)."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return False
    indexes = any(is_shard_index(n) for n in names)  # plain or a variant's
    if not indexes and not names.intersection(MODEL_MARKERS):
        return False
    weights = (n for n in names if n.endswith(".safetensors") or n in TORCH_SINGLES)
    return any(weights) or indexes


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """What a PEFT adapter's ``adapter_config.json`` says about the base model's modules it replaces."""

    config: str
    """The adapter_config.json read."""
    modules_to_save: tuple[str, ...]
    """Modules the adapter stores whole copies of (matched as PEFT matches them: by name suffix)."""
    ensure_weight_tying: bool
    """PEFT keeps the base model's tied modules tied when it wraps one of them."""
    base_class: str | None
    """The transformers class it was trained on: ``auto_mapping.base_model_class`` (PEFT leaves it
    null when the adapter has a ``task_type``), else the base model's config.json ``architectures``."""
    base: str = ""
    """``base_model_name_or_path`` as recorded (a local folder, a hub id, or empty)."""
    base_ties: bool | None = None
    """The base model's config.json ``tie_word_embeddings``, when that config was found (the folder
    named, or its snapshot in the local hub cache); None when unknown."""


def adapter_beside(path: str) -> Adapter | None:
    """The adapter configuration of a PEFT adapter's weight file (``adapter_model.safetensors``,
    ``adapter_model.bin``) or folder, from its adapter_config.json; None for any other file, or when
    that config cannot be read as one."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if not may_be_adapter(path):
        return None
    if os.path.isdir(path):  # a folder is the adapter only when its weights are (not a base beside one)
        try:
            if not all(f.startswith(ADAPTER_STEM) for f in find_weights(path).files):
                return None
        except InputError:
            return None
    marker = os.path.join(folder, ADAPTER_CONFIG)
    config = read_marker(marker)
    if not isinstance(config, dict):
        return None
    saved = config.get("modules_to_save") or []
    if not isinstance(saved, list) or len(saved) > MAX_LAYOUT_ENTRIES:
        return None
    mapping = config.get("auto_mapping")
    base = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    named = config.get("base_model_name_or_path")
    named = named if isinstance(named, str) else ""
    base_config = _base_config(named, folder)
    if not isinstance(base, str) and base_config is not None:
        stated = base_config.get("architectures")
        base = stated[0] if isinstance(stated, list) and stated and isinstance(stated[0], str) else None
    flag = base_config.get("tie_word_embeddings") if base_config is not None else None
    return Adapter(
        config=marker,
        modules_to_save=tuple(m for m in saved if isinstance(m, str)),
        ensure_weight_tying=config.get("ensure_weight_tying") is True,
        base_class=base if isinstance(base, str) else None,
        base=named,
        base_ties=flag if isinstance(flag, bool) else None,
    )


def _base_config(named: str, beside: str) -> dict[str, Any] | None:
    """The base model's config.json: in the folder base_model_name_or_path names (as given, or
    relative to the adapter's folder), else in the local hub cache's snapshot of that id; nothing is
    downloaded."""
    if not named:
        return None
    for folder in (named, os.path.join(beside, named)):
        config = read_marker(os.path.join(folder, CONFIG))
        if isinstance(config, dict):
            return config
    from tieaudit.core.errors import InputError
    from tieaudit.formats.hf_cache import cached_argument

    try:
        snapshot = cached_argument(named)
    except InputError:  # an id the cache does not hold: unknown, not an error of this adapter
        return None
    config = read_marker(os.path.join(snapshot.folder, CONFIG)) if snapshot is not None else None
    return config if isinstance(config, dict) else None


def base_ties(adapter: Adapter) -> tuple[dict[str, str], bool]:
    """What the adapter's base class ties when its config ties (``{target: source}``, from the tie
    table), and whether it ties by default (its config class's ``tie_word_embeddings`` default)."""
    from tieaudit.formats.tie_table import Answer, tie_table

    entry = tie_table().entry(adapter.base_class) if adapter.base_class else None
    if entry is None or not entry.ties_anything:
        return {}, False
    answer = entry.resolve({"tie_word_embeddings": True}, adapter.config)
    switches = entry.switches
    by_default = bool(switches and switches[0].default) or not switches
    return (dict(answer.ties) if isinstance(answer, Answer) else {}), by_default


__all__ = [
    "base_ties",
    "Adapter",
    "adapter_beside",
    "ADAPTER_CONFIG",
    "MODEL_INDEX",
    "MODULES",
    "Part",
    "config_only_reason",
    "folder_part",
    "is_model_folder",
    "names_architecture",
]
