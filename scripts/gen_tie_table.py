"""Generate tieaudit's model-class tie table from the installed transformers (offline, by a developer).

    make tie-table                       # every class, two worker processes
    .venv/bin/python scripts/gen_tie_table.py [--jobs N] [--only NAME ...] [--output PATH]
    .venv/bin/python scripts/gen_tie_table.py --names-only [--jobs N]   # tie_names.json only

tieaudit never builds a model to learn what a config.json ties: it looks the class named in
``architectures`` up in ``tieaudit/formats/tie_table.json``, which this script writes. For every
model class transformers defines (each ``PreTrainedModel`` subclass exported by ``transformers``
or named in its auto-model tables, abstract ``*PreTrainedModel`` bases excepted) it builds the
class on the meta device from its config class's defaults (layer counts shrunk to 2 where the
ties come out the same at the default sizes; the class is built at the default sizes otherwise,
and the table says so), and records:

- the config paths whose stated value changes the tied names (``switches``: ``tie_word_embeddings``
  at every config level, plus the boolean options some classes tie by, such as Marian's
  ``share_encoder_decoder_embeddings``), each with its default and, when the config class ignores
  the stated value, the value it forces;
- the tied names ``{target: source}`` exactly as ``get_expanded_tied_weights_keys(all_submodels=True)``
  computes them, for every combination of stated values of those switches (absent, false, true),
  grouped by the combinations under which each pair holds;
- where a sub-config's model type, or another config value, decides the answer (``sub_models``,
  ``submodels``, ``assumes``), so that a config stating something else is not resolved from here;
- input and output embedding parameter names, and the names ``save_pretrained`` writes for every
  name recorded (transformers 5's key-conversion map, reverted as when saving).

The same run then writes ``tieaudit/formats/tie_names.json`` (``scripts/gen_tie_names.py``): the
tensor names every class of the new table writes, from which tieaudit recognises the class of a
bare checkpoint file; ``--names-only`` writes just that file from the committed table.

Classes that cannot be built are listed under ``failed`` with the reason. The output is
deterministic (sorted; one class per line). Nothing here runs at audit time; the test
``tests/test_tie_table.py`` recomputes every entry with ``class_entry`` and compares.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import functools
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tieaudit" / "formats" / "tie_table.json"
SCHEMA = "tieaudit.tie-table/1"
COMMAND = "make tie-table  (.venv/bin/python scripts/gen_tie_table.py --jobs 2)"

TIE_FLAG = "tie_word_embeddings"
EXTRA_SWITCHES = (
    "share_encoder_decoder_embeddings",  # Marian: shared encoder/decoder embeddings
    "legacy",  # DeBERTa(-v2) MLM: the legacy head is the tied one
    "decoder_bbox_embed_share",  # Grounding DINO: per-layer box heads
    "decoder_cls_embed_share",  # MM Grounding DINO: per-layer class heads
    "with_box_refine",  # Deformable DETR family
    "two_stage",
    "share_bbox_head",  # DEIMv2
)
"""Boolean config options (top level) that some classes read when deciding ``_tied_weights_keys``
(found by reading transformers' modeling code for instance-level ``_tied_weights_keys``)."""
ASSUMED_FIELDS = (
    "additional_vocab_size",  # IDEFICS: an extra tied pair when > 0
    "n_codes_total",  # Bark fine model: one tied head per predicted codebook
    "n_codes_given",
    "layers_block_type",  # Zamba/Zamba2: which layers share the hybrid block
    "num_mem_blocks",
    "hybrid_layer_ids",
    "attn_layer_period",
    "attn_layer_offset",
)
"""Non-boolean config values some classes tie by: the table holds the answer for the class's
default value and says so (``assumes``); a config stating another value is not resolved."""
COUNT_FIELDS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "decoder_num_layers",
    "decoder_num_hidden_layers",
)
"""Layer counts shrunk to SHRUNK_LAYERS, with any other ``depth`` or ``*_layers`` count (and the
per-layer lists cut to match)."""
NOT_COUNTS = ("num_feat_extract_layers",)
"""``*_layers`` entries that are not counts to cut: wav2vec-style feature extractors describe each
convolution in lists the config class checks against this number."""
SHRUNK_LAYERS = 2
MAX_LEVEL_DEPTH = 3
"""Nested sub-configs looked at (``thinker_config.text_config`` is depth 2)."""
HUB_PREFIX = os.path.join(tempfile.gettempdir(), "gen-tie-table-hf-")
ISOLATED = "GEN_TIE_TABLE_HF_HOME"
"""Set (to HF_HOME) once isolate_hub has run: worker processes inherit the isolation instead of
making hub folders of their own (a pool worker exits without running atexit)."""
STATES = ("-", "0", "1")
PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\.]+(weight)|(bias)$")
"""transformers' own test for tied keys it uses as they are, without expanding them
(``get_expanded_tied_weights_keys``, copied with its precedence: ``^...weight`` or ``bias$``)."""
"""A switch as config.json states it: absent, false, true."""


FIXUPS: dict[str, dict[str, Any]] = {
    "MinistralConfig": {"head_dim": 128},  # the default head_dim is None; hidden 4096 / 32 heads
    "HunYuanDenseV1Config": {"head_dim": 128},
    "NemotronConfig": {"num_key_value_heads": 32},  # None by default; 32 attention heads
    "EsmConfig": {"vocab_size": 33},  # None by default; ESM-2's vocabulary
    "VideoMAEConfig": {"image_size": 32},  # positions are tabled in pure Python: 3 s a build at 224
    "ChameleonConfig": {"vocabulary_map": {}},  # None by default; read with .get
    "Emu3Config": {"vocabulary_map": {}},
    **{  # the DETR family builds its default backbone with timm (not installed): ResNet instead
        name: {"use_timm_backbone": False}
        for name in (
            "DetrConfig",
            "ConditionalDetrConfig",
            "DeformableDetrConfig",
            "DabDetrConfig",
            "TableTransformerConfig",
        )
    },
}
"""Stated values that make a config class's defaults build, where transformers' defaults do not.
None of them takes part in tying (the classes' tied keys are plain names or the backbone's); the
entry records them (``built_with``)."""


# --- the classes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No Python warnings or stray prints while classes are imported and built (transformers'
    logging is turned down once per process, by isolate_hub)."""
    with warnings.catch_warnings(), open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        warnings.simplefilter("ignore")
        yield


def isolate_hub() -> None:
    """This process only: no network and an empty hub cache (a class whose build would download
    something fails the same way on every machine, and nothing is written to the user's cache),
    and transformers' logging at errors only. Call it before transformers is imported."""
    if os.environ.get(ISOLATED) != os.environ.get("HF_HOME"):  # a worker inherits its parent's
        home = tempfile.mkdtemp(prefix=HUB_PREFIX)
        atexit.register(shutil.rmtree, home, True)
        os.environ.update(
            {"HF_HOME": home, ISOLATED: home, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        )
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.set_verbosity_error()


@functools.cache
def auto_mapping_tables() -> dict[str, dict[str, str]]:
    """transformers' auto-model tables: ``MODEL_..._MAPPING_NAMES`` -> {model_type: class name}."""
    from transformers.models.auto import modeling_auto

    tables = {}
    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if name.startswith("MODEL") and name.endswith("_MAPPING_NAMES") and isinstance(table, Mapping):
            tables[name] = {
                str(k): v for k, v in table.items() if isinstance(v, str)
            }  # tuples name several classes for one type; none of them is a model class table here
    return tables


def resolve_class(name: str, module: str | None = None) -> type:
    """A model class by name: its modeling module when known, else the ``transformers`` namespace."""
    import importlib

    import transformers

    if module:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    found = getattr(transformers, name, None)
    if isinstance(found, type):
        return found
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    for table in auto_mapping_tables().values():
        for model_type, class_name in table.items():
            if class_name == name:
                package = importlib.import_module(
                    f"transformers.models.{model_type_to_module_name(model_type)}"
                )
                return getattr(package, name)  # type: ignore[no-any-return]
    raise LookupError(f"{name} is not a transformers model class")


def model_class_names() -> tuple[list[str], list[str], dict[str, str]]:
    """(model classes, abstract bases excluded, names that failed to import with the reason)."""
    import transformers

    candidates = {n for n in dir(transformers) if n[:1].isupper()}
    named = {n for table in auto_mapping_tables().values() for n in table.values()}
    candidates |= named
    classes, bases, failed = [], [], {}
    for name in sorted(candidates):
        try:
            with quiet():
                found = resolve_class(name)
        except Exception as exc:  # a class whose module needs a missing package
            if name.endswith(("Model", "LMHead")) or "For" in name:
                failed[name] = f"import failed: {one_line(exc)}"
            continue
        if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
            if name in named:  # an auto table names it as a model class: say why it is not one here
                failed[name] = f"not a PreTrainedModel subclass here: {getattr(found, '__qualname__', found)}"
            continue
        if found is transformers.PreTrainedModel:
            continue
        (bases if name.endswith("PreTrainedModel") else classes).append(name)
    return classes, bases, failed


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:240]}"


# --- configs -------------------------------------------------------------------------------------


def config_levels(config: Any, prefix: str = "", depth: int = 0) -> list[str]:
    """The config paths of config and its nested sub-configs ("" is the top level)."""
    from transformers import PretrainedConfig

    levels = [prefix]
    if depth >= MAX_LEVEL_DEPTH:
        return levels
    for key, value in sorted(vars(config).items()):  # stored values: some attributes raise when read
        if not key.startswith("_") and isinstance(value, PretrainedConfig):
            levels += config_levels(value, f"{prefix}{key}.", depth + 1)
    return levels


def at_level(config: Any, level: str) -> Any:
    for key in level.split(".")[:-1] if level else []:
        config = getattr(config, key)
    return config


def dict_level(data: dict[str, Any], level: str, create: bool = False) -> dict[str, Any] | None:
    for key in level.split(".")[:-1] if level else []:
        nested = data.get(key)
        if not isinstance(nested, dict):
            if not create:
                return None
            nested = data[key] = {}
        data = nested
    return data


def split_path(path: str) -> tuple[str, str]:
    """``text_config.tie_word_embeddings`` -> (``text_config.``, ``tie_word_embeddings``)."""
    head, _, last = path.rpartition(".")
    return (head + "." if head else ""), last


def counted(key: object, value: object) -> bool:
    """Whether a config entry is a layer or block count that shrinking may cut."""
    if not isinstance(key, str):  # id2label and the like have integer keys
        return False
    generic = (key == "depth" or key.endswith("_layers")) and key not in NOT_COUNTS
    is_count = key in COUNT_FIELDS or generic
    return is_count and isinstance(value, int) and not isinstance(value, bool) and value > SHRUNK_LAYERS


def shrink(data: dict[str, Any]) -> list[str]:
    """Cut layer counts in data (every level) to SHRUNK_LAYERS, with the per-layer lists and
    ``per_layer_config`` entries that go with them; returns the paths changed. A cut the config
    class refuses, or a class that then does not build, is built at its default sizes instead."""
    changed = []

    def walk(level: dict[str, Any], prefix: str) -> None:
        originals = set()
        for key, value in list(level.items()):
            if counted(key, value):
                originals.add(value)
                level[key] = SHRUNK_LAYERS
                changed.append(prefix + key)
        for key, value in list(level.items()):
            if key == "per_layer_config" and isinstance(value, dict):
                kept = {k: v for k, v in value.items() if not (str(k).isdigit() and int(k) >= SHRUNK_LAYERS)}
                if kept != value:
                    level[key] = kept
                    changed.append(prefix + key)
            elif isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, list) and "layer" in str(key) and len(value) in originals:
                level[key] = value[:SHRUNK_LAYERS]
                changed.append(prefix + key)

    walk(data, "")
    return sorted(changed)


def stated(base: dict[str, Any], switches: Sequence[str], combo: str) -> dict[str, Any]:
    """base with every switch removed, then each stated as combo says ("-" absent, "0", "1")."""
    data = copy.deepcopy(base)
    for path, state in zip(switches, combo, strict=True):
        key = split_path(path)[1]
        holder = dict_level(data, path, create=state != "-")
        if holder is None:
            continue
        holder.pop(key, None)
        if state != "-":
            holder[key] = state == "1"
    return data


def effective(config: Any, path: str) -> bool | None:
    value = getattr(at_level(config, path), split_path(path)[1], None)
    return value if isinstance(value, bool) else None


# --- building ------------------------------------------------------------------------------------


def json_key(data: object) -> str:
    return json.dumps(data, sort_keys=True, default=repr)


def default_dict(cls: type, shrunk: bool) -> tuple[dict[str, Any], list[str], Any]:
    """The config class's defaults as a config.json would state them (FIXUPS applied; layer counts
    shrunk if asked), the paths shrinking changed, and the defaults' config object."""
    config_class = cls.config_class  # type: ignore[attr-defined]
    with quiet():
        config = config_class(**FIXUPS.get(config_class.__name__, {}))
        data: dict[str, Any] = config.to_dict()
    for key in ("transformers_version", "architectures", "_name_or_path"):
        data.pop(key, None)
    return data, (shrink(data) if shrunk else []), config


def can_tie(module: Any) -> bool:
    """Whether a PreTrainedModel declares tied keys (a class attribute, or computed from its config)."""
    return bool(getattr(module, "_tied_weights_keys", None)) or computed_keys(module)


def computed_keys(module: Any) -> bool:
    """Whether the module computes ``_tied_weights_keys`` from its config (in __init__ or a property)."""
    return "_tied_weights_keys" in vars(module) or isinstance(
        getattr(type(module), "_tied_weights_keys", None), property
    )


def pretrained_modules(model: Any) -> list[tuple[str, Any]]:
    from transformers import PreTrainedModel

    return [(p, m) for p, m in model.named_modules() if isinstance(m, PreTrainedModel)]


class Study:
    """One class at one size: its configs, its meta-device build(s), its ties per stated config.

    Ties are computed one of two ways, with the same answer (the generator checks it):

    - rebuild: the class is built from each distinct effective config (needed when a switch
      changes the modules built, or a submodel computes its tied keys from its config);
    - flags: the class is built once with nothing stated, and for each stated config every
      submodel's ``tie_word_embeddings`` is set to what that config gives the submodel's level;
      ``get_expanded_tied_weights_keys`` reads the flags when called, so this is what a build
      from that config would answer, for a fraction of the time.
    """

    def __init__(self, cls: type, shrunk: bool, switches: list[str] | None, rebuild: bool | None) -> None:
        self.cls = cls
        self.config_class = cls.config_class  # type: ignore[attr-defined]
        self.configs: dict[str, Any] = {}
        self.models: dict[str, Any] = {}
        self.answers: dict[tuple[bool, str], dict[str, str] | None] = {}
        full, self.shrunk, defaults = default_dict(cls, shrunk)
        self.at_defaults = not shrunk
        """Built at the config class's default sizes (else with layer counts cut to SHRUNK_LAYERS)."""
        self.candidates = self.candidate_switches(full, defaults)
        every = [*self.candidates, *(switches or [])]
        self.base = stated(full, every, "-" * len(every))
        """The defaults with no switch stated: what every combination starts from."""
        self.reference = self.build(self.base, cached=False)
        self.levels = self.module_levels()
        if rebuild is None:
            rebuild = (
                any(p in EXTRA_SWITCHES for p in self.candidates)
                or any(level is None and can_tie(module) for module, level in self.levels)
                or any(computed_keys(module) for module, _ in self.levels)
            )
        self.rebuild = rebuild
        self.switches = switches if switches is not None else self.relevant_switches()

    # configs and models

    def config(self, data: dict[str, Any]) -> Any:
        """The config object transformers makes of data (as from_pretrained would, from config.json)."""
        key = json_key(data)
        if key not in self.configs:
            with quiet():  # what from_dict does, without formatting the config for a log line
                self.configs[key] = self.config_class(**copy.deepcopy(data))
        return self.configs[key]

    def build(self, data: dict[str, Any], cached: bool = True) -> Any:
        """The class built from the config of data on the meta device (weights neither allocated nor
        initialised), once per distinct effective config when cached."""
        import torch
        from transformers.initialization import no_init_weights

        key = json_key(self.config(data).to_dict()) if cached else ""
        if not cached or key not in self.models:
            with quiet():  # a config of its own: the model keeps it and may change it
                config = self.config_class(**copy.deepcopy(data))
                with torch.device("meta"), no_init_weights():
                    model = self.cls(config)
            if not cached:
                return model  # the reference, whose flags are set per question: never handed out as a build
            self.models[key] = model
        return self.models[key]

    def module_levels(self) -> list[tuple[Any, str | None]]:
        """Every PreTrainedModel in the reference build with the config level it was built from."""
        config = self.reference.config
        by_id = {id(at_level(config, level)): level for level in config_levels(config)}
        by_json: dict[str, str] = {}
        for level in config_levels(config):
            by_json.setdefault(json_key(at_level(config, level).to_dict()), level)
        found = []
        for _, module in pretrained_modules(self.reference):
            level = by_id.get(id(module.config))
            found.append(
                (module, level if level is not None else by_json.get(json_key(module.config.to_dict())))
            )
        return found

    def set_flags(self, config: Any) -> None:
        for module, level in self.levels:
            if level is not None:
                value = getattr(at_level(config, level), TIE_FLAG, None)
                setattr(module.config, TIE_FLAG, value is True)

    def ties(self, data: dict[str, Any], rebuild: bool | None = None) -> dict[str, str] | None:
        """``{target: source}`` as transformers computes it for the model of data; None when
        transformers refuses data (its config class raises, or the class does not build from it)."""
        rebuild = self.rebuild if rebuild is None else rebuild
        key = (rebuild, json_key(data))
        if key not in self.answers:
            try:
                config = self.config(data)
                if rebuild:
                    model = self.build(data)
                else:
                    self.set_flags(config)
                    model = self.reference
                with quiet():
                    found = model.get_expanded_tied_weights_keys(all_submodels=True)
            except Exception:
                self.answers[key] = None
            else:
                self.answers[key] = {str(t): str(s) for t, s in sorted(found.items())}
        return self.answers[key]

    def expands(self) -> bool:
        """Whether some submodel's tied keys are patterns expanded over the parameters, or computed
        from its config: then the tied names may depend on layer counts."""
        for _, module in pretrained_modules(self.reference):
            keys = getattr(module, "_tied_weights_keys", None) or {}
            if computed_keys(module) or not all(PLAIN_KEY.match(k) for k in [*keys, *keys.values()]):
                return True
        return False

    # switches

    def candidate_switches(self, full: dict[str, Any], defaults: Any) -> list[str]:
        paths = [f"{level}{TIE_FLAG}" for level in config_levels(defaults)]
        return paths + [key for key in EXTRA_SWITCHES if isinstance(full.get(key), bool)]

    def relevant_switches(self) -> list[str]:
        """The top-level flag, and each other candidate whose stated value changes the ties in
        some context (the other candidates all absent, all false, all true)."""
        relevant = []
        for index, path in enumerate(self.candidates):
            if path == TIE_FLAG:  # always listed: its default and whether it is forced are recorded
                relevant.append(path)
                continue
            for other in STATES:
                answers = set()
                for state in STATES:
                    combo = "".join(state if i == index else other for i in range(len(self.candidates)))
                    answers.add(json_key(self.ties(stated(self.base, self.candidates, combo))))
                if len(answers) > 1:
                    relevant.append(path)
                    break
        return relevant

    def truth_table(self, rebuild: bool | None = None) -> dict[str, dict[str, str] | None]:
        """combination -> ties, for every combination of stated values of the switches."""
        table = {}
        for combo in itertools.product(STATES, repeat=len(self.switches)):
            code = "".join(combo)
            table[code] = self.ties(stated(self.base, self.switches, code), rebuild)
        return table

    def checked(self) -> None:
        """In flags mode, rebuild for the all-false and all-true combinations: a difference means
        the flags change what is built, and the class is done by rebuilding instead."""
        if self.rebuild:
            return
        for state in "01":
            data = stated(self.base, self.switches, state * len(self.switches))
            rebuilt = self.ties(data, rebuild=True)
            if rebuilt is not None and rebuilt != self.ties(data, rebuild=False):
                self.rebuild = True
                return

    def switch_facts(self) -> list[dict[str, Any]]:
        """Per switch: its default (nothing stated) and the value the config class forces, if any."""
        facts = []
        nothing = self.config(self.base)
        for index, path in enumerate(self.switches):
            values = []
            for state in "01":
                combo = "".join(state if i == index else "-" for i in range(len(self.switches)))
                try:
                    values.append(effective(self.config(stated(self.base, self.switches, combo)), path))
                except Exception:  # the config class refuses this value: it is not forced to it
                    values.append(None if state == "1" else False)
            fact: dict[str, Any] = {"path": path, "default": effective(nothing, path)}
            if values[0] == values[1]:
                fact["forced"] = values[1]
            facts.append(fact)
        return facts

    def absent_is_default(self, table: Mapping[str, Mapping[str, str] | None]) -> list[str]:
        """Nested switches for which stating the default is the same as stating nothing (so a
        config naming another nested model type can have that type's default substituted)."""
        same = []
        nothing = self.config(self.base)
        for index, path in enumerate(self.switches):
            default = effective(nothing, path)
            if "." not in path or default is None:
                continue
            state = "1" if default else "0"
            if all(table[c] == table[c[:index] + state + c[index + 1 :]] for c in table if c[index] == "-"):
                same.append(path)
        return same


def grouped(table: Mapping[str, Mapping[str, str] | None]) -> list[dict[str, Any]]:
    """Tie pairs grouped by the set of combinations under which they hold."""
    holds: dict[tuple[str, str], list[str]] = {}
    for combo, ties in table.items():
        for pair in (ties or {}).items():
            holds.setdefault(pair, []).append(combo)
    groups: dict[tuple[str, ...], dict[str, str]] = {}
    for (target, source), combos in holds.items():
        groups.setdefault(tuple(sorted(combos)), {})[target] = source
    return [{"on": list(on), "ties": dict(sorted(ties.items()))} for on, ties in sorted(groups.items())]


def parameter_name(model: Any, module: Any, attribute: str) -> str | None:
    import torch

    if module is None or not isinstance(getattr(module, attribute, None), torch.nn.Parameter):
        return None
    for name, found in model.named_modules():
        if found is module:
            return f"{name}.{attribute}" if name else attribute
    return None


def embedding_names(model: Any) -> dict[str, str | None]:
    """Input embedding, output embedding (head) and head bias as parameter names (None: none)."""
    names: dict[str, str | None] = {}
    with quiet():
        try:
            inputs = model.get_input_embeddings()
        except Exception:  # speech and vision classes raise NotImplementedError
            inputs = None
        try:
            outputs = model.get_output_embeddings()
        except Exception:
            outputs = None
    names["input_embeddings"] = parameter_name(model, inputs, "weight")
    names["output_embeddings"] = parameter_name(model, outputs, "weight")
    names["output_bias"] = parameter_name(model, outputs, "bias")
    return names


def disk_names(model: Any, names: set[str]) -> dict[str, str | None]:
    """In-memory name -> the name save_pretrained writes, for the names that differ (None: the
    tensor is converted, not renamed: fused or split, so no single file name holds it)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        PrefixChange,
        WeightConverter,
        WeightRenaming,
        apply_converters,
        apply_renamings,
    )

    with quiet():
        conversions = [
            c
            for c in get_model_conversion_mapping(model, add_legacy=False)
            if not isinstance(c, PrefixChange)
        ]  # as revert_weight_conversion does for a model not loaded by from_pretrained
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    renamings = [c for c in reverse if isinstance(c, WeightRenaming)]
    converters = [c for c in reverse if isinstance(c, WeightConverter)]
    found: dict[str, str | None] = {}
    for name in sorted(names):
        _, pattern = apply_converters(name, converters)
        on_disk = None if pattern is not None else apply_renamings(name, renamings)
        if on_disk != name:
            found[name] = on_disk
    return found


def submodels(study: Study) -> list[dict[str, Any]]:
    """The PreTrainedModel modules below the top: prefix, class, config level, and the auto table
    that picks the class from that level's model type (when one does)."""
    tables = auto_mapping_tables()
    levels = {id(module): level for module, level in study.levels}
    found = []
    for prefix, module in pretrained_modules(study.reference):
        if not prefix:
            continue
        level = levels.get(id(module))
        model_type = str(getattr(module.config, "model_type", None))
        auto = sorted(n for n, t in tables.items() if t.get(model_type) == type(module).__name__)
        found.append(
            {
                "prefix": prefix,
                "class": type(module).__name__,
                "config": None if level is None else level.rstrip("."),
                "auto": auto[0] if auto else None,
            }
        )
    return found


def sub_model_types(config: Any) -> dict[str, str]:
    return {
        level.rstrip("."): str(at_level(config, level).model_type) for level in config_levels(config) if level
    }


def assumed(cls: type, study: Study, sized: bool) -> dict[str, Any]:
    """The config values the answer was computed with, beyond the switches: the curated
    ASSUMED_FIELDS, and for a class whose ties depend on sizes, every layer count shrinking changes."""
    found: dict[str, Any] = {}
    stack: list[tuple[str, dict[str, Any]]] = [("", study.base)]
    while stack:  # every config level: Bark's composite states n_codes_total in fine_acoustics_config
        prefix, level = stack.pop()
        for key, value in level.items():
            if key in ASSUMED_FIELDS:
                found[prefix + key] = value
            elif isinstance(value, dict):
                stack.append((f"{prefix}{key}.", value))
    if sized:
        for path in default_dict(cls, shrunk=True)[1]:
            holder = dict_level(study.base, path)
            value = None if holder is None else holder.get(split_path(path)[1])
            if isinstance(value, int):  # the counts (the per-layer lists cut with them follow from them)
                found[path] = value
    return found


# --- one class -----------------------------------------------------------------------------------


def class_entry(name: str, committed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The table entry of one model class, computed from the installed transformers.

    Layer counts: a class whose tied keys are plain parameter names ties the same names at any
    size, so it is built with 2 layers; one whose keys are patterns transformers expands over the
    parameters (``bbox_embed.(?![0])\\d+``), or computes from its config, is also built at its
    default sizes, and when the two answers differ (or only the default sizes build) the entry is
    marked size dependent and assumes the default layer counts. A class that does not build
    shrunk is built at its defaults.

    With committed (the class's entry in the table), its switches, sizes and build mode are taken
    as given rather than searched for: that is what tests/test_tie_table.py recomputes and compares.
    """
    cls = resolve_class(name, committed.get("module") if committed else None)
    if committed is not None:
        switches = [s["path"] for s in committed["switches"]]
        study = Study(cls, committed.get("sizes") != "default", switches, bool(committed.get("rebuild")))
        return finish(cls, study, bool(committed.get("size_dependent")))
    small = attempt(cls, shrunk=True, switches=None, rebuild=None)
    if isinstance(small, Study):
        small.checked()
        if not small.expands():
            return finish(cls, small, size_dependent=False)
    full = attempt(
        cls,
        shrunk=False,
        switches=small.switches if isinstance(small, Study) else None,
        rebuild=small.rebuild if isinstance(small, Study) else None,
    )
    if isinstance(full, str):
        if isinstance(small, str):
            raise BuildError(full)
        return finish(cls, small, size_dependent=False)  # the default sizes do not build: the shrunk answer
    if isinstance(small, str):
        return finish(cls, full, size_dependent=full.expands())
    return (
        finish(cls, full, size_dependent=True)
        if small.truth_table() != full.truth_table()
        else finish(cls, small, size_dependent=False)
    )


class BuildError(Exception):
    """The class does not build from its config class's defaults (the message says why)."""


def attempt(cls: type, shrunk: bool, switches: list[str] | None, rebuild: bool | None) -> Study | str:
    try:
        return Study(cls, shrunk, switches, rebuild)
    except Exception as exc:
        return one_line(exc)


def finish(cls: type, study: Study, size_dependent: bool) -> dict[str, Any]:
    table = study.truth_table()
    groups = grouped(table)
    study.set_flags(study.config(study.base))
    names = embedding_names(study.reference)
    recorded = {n for g in groups for pair in g["ties"].items() for n in pair}
    recorded |= {n for n in names.values() if n}
    entry: dict[str, Any] = {
        "module": cls.__module__,
        "config": study.config_class.__name__,
        "model_type": str(study.config_class.model_type),
        "switches": study.switch_facts(),
        "groups": groups,
        **names,
    }
    refused = sorted(combo for combo, ties in table.items() if ties is None)
    if refused:
        entry["refused"] = refused
    if study.config_class.__name__ in FIXUPS:
        entry["built_with"] = FIXUPS[study.config_class.__name__]
    renamed = disk_names(study.reference, recorded)
    if renamed:
        entry["disk_names"] = renamed
    types = sub_model_types(study.reference.config)
    if types:
        entry["sub_models"] = types
    subs = submodels(study)
    if subs:
        entry["submodels"] = subs
    dynamic = any(computed_keys(module) for module, _ in study.levels)
    assumes = assumed(cls, study, size_dependent) if dynamic or size_dependent else {}
    if assumes:
        entry["assumes"] = assumes
    if study.at_defaults:
        entry["sizes"] = "default"
    if size_dependent:
        entry["size_dependent"] = True
    if study.rebuild:
        entry["rebuild"] = True
    if dynamic and not assumes and not any(s in EXTRA_SWITCHES for s in study.switches):
        entry["unresolved"] = "the class computes its tied names from config values tieaudit does not model"
    absent = study.absent_is_default(table)
    if absent:
        entry["absent_is_default"] = absent
    if flag_in_forward(cls):
        entry["flag_in_forward"] = True
    rule = truncation(study, table, assumes) if size_dependent else None
    if rule is not None:
        entry["truncate"] = rule
    return entry


TRUNCATION_CHECKS = (2, 3)
"""The smaller counts a truncation rule is checked at (below the table's own)."""


def truncation(study: Study, table: Mapping[str, Any], assumes: Mapping[str, Any]) -> dict[str, Any] | None:
    """For a size-dependent class, a count whose smaller values only shorten numbered module lists
    and drop the ties of their last entries (DETR heads: ``bbox_embed.N``, one per decoder layer,
    one more with two_stage), the
    other counts it assumes (``others``) changing nothing: the rule ``truncated`` applies at audit
    time. Recorded only when transformers gives exactly its answer, at every combination of the
    switches, with the count at each of TRUNCATION_CHECKS and at its default, the others cut to 2."""
    from tieaudit.formats.layer_names import first_list, truncated

    names = {n for ties in table.values() if ties for pair in ties.items() for n in pair}
    lists = sorted({found for n in names if (found := first_list(n)) is not None})
    counts = {p: v for p, v in sorted(assumes.items()) if type(v) is int and v > max(TRUNCATION_CHECKS)}
    if not lists or len(counts) != len(assumes):
        return None

    def holds(values: Mapping[str, int], fewer: int) -> bool:
        base = copy.deepcopy(study.base)
        for path, value in values.items():
            holder = dict_level(base, path)
            if holder is None:
                return False
            holder[split_path(path)[1]] = value
        return all(
            study.ties(stated(base, study.switches, code), rebuild=True) == truncated(ties, lists, fewer)
            for code, ties in table.items()
            if ties is not None
        )

    for key, default in counts.items():
        others = [p for p in counts if p != key]
        cut = dict.fromkeys(others, 2)
        checks = [*TRUNCATION_CHECKS, *([default] if others else [])]
        if all(holds({**cut, key: count}, default - count) for count in checks):
            return {"key": key, "lists": lists, "others": others, "checked": list(TRUNCATION_CHECKS)}
    return None


FLAG_READ = re.compile(r"\bconfig\.tie_word_embeddings\b")
"""The flag read in code: ``self.config.tie_word_embeddings``."""


def flag_in_forward(cls: type) -> bool:
    """Whether the class's forward reads tie_word_embeddings: setting the flag then changes what
    the model computes, not only what it ties (SwitchTransformers and Udop rescale the decoder
    output before the head when it is set)."""
    import inspect

    try:
        source = inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return False
    return FLAG_READ.search(source) is not None


def config_defaults() -> dict[str, bool | None]:
    """model_type -> its config class's default ``tie_word_embeddings`` (None: no such field)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    found: dict[str, bool | None] = {}
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            with quiet():
                config = CONFIG_MAPPING[model_type]()
        except Exception:
            continue
        value = getattr(config, TIE_FLAG, None)
        found[model_type] = value if isinstance(value, bool) else None
    return found


# --- the whole table -----------------------------------------------------------------------------


@functools.cache
def committed_classes(table_path: str) -> dict[str, Any]:
    """The ``classes`` of a table file (parsed once per process)."""
    classes: dict[str, Any] = json.loads(Path(table_path).read_text())["classes"]
    return classes


def check_entries(names: list[str], table_path: str = str(TABLE)) -> list[str]:
    """Recompute the committed entries of names from the installed transformers; one line per
    class whose entry differs (what tests/test_tie_table.py and ``--check`` report)."""
    isolate_hub()
    classes = committed_classes(table_path)
    problems = []
    for name in names:
        committed = classes[name]
        try:
            fresh = class_entry(name, committed)
        except Exception as exc:
            problems.append(f"{name}: {one_line(exc)}")
            continue
        if fresh != committed:
            keys = sorted(k for k in fresh.keys() | committed.keys() if fresh.get(k) != committed.get(k))
            problems.append(f"{name}: differs in {', '.join(keys)}")
    return problems


def package_batches(classes: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The classes grouped by modeling package (a worker imports each package once), largest first."""
    packages: dict[str, list[str]] = {}
    for name, entry in sorted(classes.items()):
        packages.setdefault(str(entry["module"]).rsplit(".", 1)[0], []).append(name)
    return sorted(packages.values(), key=lambda batch: (-len(batch), batch[0]))


def worker(names: list[str]) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    isolate_hub()
    results = []
    for name in names:
        began = time.monotonic()
        try:
            results.append((name, class_entry(name), None))
        except BuildError as exc:
            results.append((name, None, str(exc)))
        except Exception as exc:
            results.append((name, None, one_line(exc)))
        print(f"  {name} {time.monotonic() - began:.2f}s", file=sys.stderr, flush=True)
    return results


def by_module(names: list[str], jobs: int) -> list[list[str]]:
    """Batches of classes, one modeling package per batch (each worker imports fewer modules)."""
    import transformers

    packages: dict[str, list[str]] = {}
    for name in names:
        module = getattr(getattr(transformers, name, None), "__module__", name)
        packages.setdefault(module.rsplit(".", 1)[0], []).append(name)
    batches = sorted(packages.values(), key=len, reverse=True)
    return batches if jobs > 1 else [[n for batch in batches for n in batch]]


def render(document: dict[str, Any]) -> str:
    """Sorted JSON, one class (or failure) per line, so a regenerated table diffs by class."""
    lines = ["{"]
    keys = sorted(document)
    for index, key in enumerate(keys):
        value = document[key]
        comma = "," if index < len(keys) - 1 else ""
        if key in ("classes", "failed", "config_defaults", "auto_mappings") and isinstance(value, dict):
            lines.append(f"  {json.dumps(key)}: {{")
            items = sorted(value.items())
            for i, (name, item) in enumerate(items):
                inner = "," if i < len(items) - 1 else ""
                lines.append(f"    {json.dumps(name)}: {json.dumps(item, sort_keys=True)}{inner}")
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


LEGEND = {
    "switches": "config paths (as config.json spells them) whose stated value changes the tied names; "
    "default: the value when not stated; forced: the value the config class uses whatever is stated",
    "groups": "on: the combinations of stated switch values (one character per switch, in order: "
    "'-' not stated, '0' false, '1' true) under which ties ({target: source}, in-memory names) hold",
    "disk_names": "in-memory name -> the name save_pretrained writes (null: converted, not renamed)",
    "sub_models": "model type of each nested config the answer was computed with",
    "submodels": "PreTrainedModel modules below the top, their config path and the auto table choosing them",
    "assumes": "config values the answer depends on, at the values it was computed with",
    "sizes": "'default': built at the class's default sizes (otherwise with layer counts cut to 2: "
    "the tied keys are plain names, or the answer equals the default sizes' answer)",
    "size_dependent": "the tied names depend on layer counts; assumes lists the counts used",
    "absent_is_default": "nested switches for which 'not stated' means the nested config class's default",
    "refused": "combinations transformers refuses (the config class raises, or the class does not build)",
    "built_with": "values stated on top of the class defaults so that they build (FIXUPS in the generator)",
    "unresolved": "why config ties of this class are not resolved from the table",
    "flag_in_forward": "the class's forward reads tie_word_embeddings: setting it changes the outputs too",
    "truncate": "with key stated from 2 up to its assumed value (and others stated as anything), the ties "
    "are those whose names index none of lists (first numbered segment) at that value or beyond",
}


def generate(jobs: int, only: list[str] | None) -> dict[str, Any]:
    import torch
    import transformers

    isolate_hub()
    classes, bases, failed = model_class_names()
    if only:
        classes = [n for n in classes if n in only]
    entries: dict[str, Any] = {}
    batches = by_module(classes, jobs)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = [r for batch in pool.map(worker, batches) for r in batch]
    else:
        results = [r for batch in batches for r in worker(batch)]
    for name, entry, error in results:
        if entry is None:
            failed[name] = error or "unknown"
        else:
            entries[name] = entry
    used = {s["auto"] for e in entries.values() for s in e.get("submodels", []) if s["auto"]}
    tables = auto_mapping_tables()
    return {
        "schema": SCHEMA,
        "generator": "scripts/gen_tie_table.py",
        "command": COMMAND,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "legend": LEGEND,
        "classes": entries,
        "failed": failed,
        "excluded": {"abstract *PreTrainedModel bases": bases},
        "config_defaults": config_defaults(),
        "auto_mappings": {name: dict(sorted(tables[name].items())) for name in sorted(used)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="just these classes (to inspect; not for committing)")
    parser.add_argument("--output", type=Path, default=TABLE)
    parser.add_argument("--check", action="store_true", help="compare the committed table instead of writing")
    parser.add_argument(
        "--names-only",
        action="store_true",
        help="write only the tensor-name fingerprints of the committed table's classes (gen_tie_names.py)",
    )
    parser.add_argument("--names-output", type=Path, default=None, help="the fingerprints' file")
    args = parser.parse_args(argv)
    isolate_hub()  # before any worker starts: they inherit it
    import gen_tie_names  # the fingerprints: written in the same run as the table, or alone

    names = args.names_output or gen_tie_names.NAMES
    if args.names_only:
        return gen_tie_names.write(args.jobs, args.only, output=names, table_path=args.output)
    if args.check:
        classes = json.loads(args.output.read_text())["classes"]
        with ProcessPoolExecutor(args.jobs) as pool:
            problems = [p for found in pool.map(check_entries, package_batches(classes)) for p in found]
        print(
            "\n".join(problems) or f"{args.output}: all {len(classes)} classes as transformers computes them"
        )
        return 1 if problems else 0
    document = generate(args.jobs, args.only)
    args.output.write_text(render(document))
    print(
        f"{args.output}: {len(document['classes'])} classes, {len(document['failed'])} failed "
        f"(transformers {document['transformers']})",
        file=sys.stderr,
    )
    if not args.only:  # the names file covers the whole table, as the table does
        return gen_tie_names.write(args.jobs, None, output=names, table_path=args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
