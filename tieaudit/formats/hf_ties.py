"""Which names a Hugging Face config ties, resolved by model class (``architectures``).

``tie_word_embeddings`` alone names nothing: the tied names belong to the model class
(``_tied_weights_keys``), and a class without a head (``BertModel``) ties nothing whatever the
flag says. Two resolvers, same answer for the classes the table knows:

- ``transformers_ties``: builds the class on the meta device and asks transformers itself
  (exact for every built-in class; needs torch and transformers, imported lazily);
- ``table_ties``: a small built-in table mirroring transformers 5 (``TIE_TABLE``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from tieaudit.errors import InputError
from tieaudit.model import DeclaredTie, ModelConfig, Skipped

Resolver = Literal["transformers", "table"]

TIE_FLAG = "tie_word_embeddings"


@dataclass(frozen=True)
class TieRule:
    """How one model class ties weights, as transformers 5 does it."""

    ties: Mapping[str, str] = field(default_factory=dict)
    """``{target: source}``: the class's ``_tied_weights_keys`` (empty: no head to tie)."""
    default_flag: bool = True
    """``tie_word_embeddings`` of the class's config when config.json does not state it."""
    always: bool = False
    """The config class forces the flag to true whatever is stated (T5Config in transformers 5)."""


_LLAMA_LIKE = TieRule({"lm_head.weight": "model.embed_tokens.weight"}, default_flag=False)
_GEMMA_LIKE = TieRule({"lm_head.weight": "model.embed_tokens.weight"}, default_flag=True)
_GPT2_HEAD = TieRule({"lm_head.weight": "transformer.wte.weight"})
_BERT_MLM = TieRule(
    {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
)
_ALBERT_MLM = TieRule(
    {
        "predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
        "predictions.decoder.bias": "predictions.bias",
    }
)
_T5_EMBEDS = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}

TIE_TABLE: dict[str, TieRule] = {
    "GPT2LMHeadModel": _GPT2_HEAD,
    "GPT2DoubleHeadsModel": _GPT2_HEAD,
    "LlamaForCausalLM": _LLAMA_LIKE,
    "MistralForCausalLM": _LLAMA_LIKE,
    "Qwen2ForCausalLM": _LLAMA_LIKE,
    "Qwen3ForCausalLM": _LLAMA_LIKE,
    "Phi3ForCausalLM": _LLAMA_LIKE,
    "GemmaForCausalLM": _GEMMA_LIKE,
    "Gemma2ForCausalLM": _GEMMA_LIKE,
    "OPTForCausalLM": TieRule({"lm_head.weight": "model.decoder.embed_tokens.weight"}),
    "T5ForConditionalGeneration": TieRule({**_T5_EMBEDS, "lm_head.weight": "shared.weight"}, always=True),
    "T5Model": TieRule(_T5_EMBEDS, always=True),
    "T5EncoderModel": TieRule({"encoder.embed_tokens.weight": "shared.weight"}, always=True),
    "BertForMaskedLM": _BERT_MLM,
    "BertForPreTraining": _BERT_MLM,
    "BertLMHeadModel": _BERT_MLM,
    "AlbertForMaskedLM": _ALBERT_MLM,
    "AlbertForPreTraining": _ALBERT_MLM,
    # Base models: known, and tie nothing.
    "GPT2Model": TieRule(),
    "LlamaModel": TieRule(default_flag=False),
    "BertModel": TieRule(),
    "AlbertModel": TieRule(),
}
"""Model class -> tie rule; checked against the installed transformers by the tests."""


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
    """Who resolved it; None when neither transformers nor the table knows the class."""
    flag: TieFlag
    """The flag as stated."""
    effective: bool | None
    """The flag the class acts on (default or forced value applied); None when unresolved."""

    @property
    def basis(self) -> str:
        """Why these ties hold, in a few words (for ``DeclaredTie.where``)."""
        if self.flag.value is None:
            stated = f"{TIE_FLAG} not stated, defaulted to {_json_bool(self.effective)}"
        elif self.effective is not None and self.flag.value != self.effective:
            stated = f"{self.flag.key}={_json_bool(self.flag.value)} forced to {_json_bool(self.effective)}"
        else:
            stated = self.flag.key
        return f"{stated}, {self.resolver or 'unresolved'}"


def _json_bool(value: bool | None) -> str:
    return "null" if value is None else str(value).lower()


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
            raise InputError(f"{prefix}{TIE_FLAG} must be true or false, not {value!r}", path)
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
            raise InputError(f"{prefix}vocab_size must be a non-negative integer, not {value!r}", path)
        return value
    return None


def stated_architectures(config: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """The model classes named in ``architectures`` (empty when absent)."""
    value = config.get("architectures")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InputError(f"architectures must be a list of class names, not {value!r}", path)
    return tuple(value)


def table_ties(architecture: str, flag: TieFlag) -> tuple[dict[str, str], bool] | None:
    """``({target: source}, effective flag)`` from ``TIE_TABLE``; None for a class not in it."""
    rule = TIE_TABLE.get(architecture)
    if rule is None:
        return None
    effective = True if rule.always else (rule.default_flag if flag.value is None else flag.value)
    return (dict(rule.ties) if effective else {}), effective


@contextmanager
def _quiet_transformers(transformers: Any) -> Iterator[None]:
    """Silence transformers' config warnings while a throwaway model is built."""
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


MAX_BUILT_BLOCKS = 1024
"""Layers or experts a config may ask for before transformers is asked to build its model: the
meta-device build costs about a millisecond per layer, so 10**9 layers would never finish."""


def oversized_field(config: Mapping[str, Any]) -> str | None:
    """The first layer or expert count above MAX_BUILT_BLOCKS, at any nesting level (None if none)."""
    stack: list[object] = [config]
    while stack:  # iterative: a config nested near the recursion limit must not overflow here
        value = stack.pop()
        if isinstance(value, list):
            value = dict(enumerate(value))
        for key, item in value.items() if isinstance(value, Mapping) else ():
            if not isinstance(key, str):
                stack.append(item)
                continue
            counted = "layer" in key.lower() or "expert" in key.lower()
            if counted and isinstance(item, int) and not isinstance(item, bool) and item > MAX_BUILT_BLOCKS:
                return key
            stack.append(item)
    return None


def transformers_ties(architecture: str, config: Mapping[str, Any]) -> tuple[dict[str, str], bool] | None:
    """``({target: source}, effective flag)`` from the installed transformers; None on any failure.

    Only built-in classes are looked up (``auto_map`` / remote code is never honoured); the
    model is built on the meta device, so no weights are allocated, and only when its layer and
    expert counts are plausible (see MAX_BUILT_BLOCKS).
    """
    if oversized_field(config) is not None:
        return None
    try:
        import torch
        import transformers
    except Exception:
        return None
    try:
        model_class = getattr(transformers, architecture, None)
        if not (isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel)):
            return None
        if model_class.config_class is None:
            return None
        with _quiet_transformers(transformers):
            model_config = model_class.config_class.from_dict(copy.deepcopy(dict(config)))
            with torch.device("meta"):
                model = model_class(model_config)
            ties = model.get_expanded_tied_weights_keys(all_submodels=True)
        effective = bool(getattr(model.config, TIE_FLAG, False))
        return {str(target): str(source) for target, source in ties.items()}, effective
    except Exception:  # any failure means "not resolved here": the table decides
        return None


def resolve_ties(
    config: Mapping[str, Any], path: str, use_transformers: bool = True
) -> tuple[TieResolution, ...]:
    """One resolution per class in ``architectures``: the table first (no torch import for the
    common classes), then, for a class it does not know, transformers on the meta device."""
    flag = stated_tie_flag(config, path)
    resolutions = []
    for architecture in stated_architectures(config, path):
        resolver: Resolver | None = None
        found = table_ties(architecture, flag)
        if found is not None:
            resolver = "table"
        elif use_transformers:
            found = transformers_ties(architecture, config)
            resolver = "transformers" if found is not None else None
        ties, effective = found if found is not None else ({}, None)
        resolutions.append(TieResolution(architecture, ties, resolver, flag, effective))
    return tuple(resolutions)


def config_ties(
    config: Mapping[str, Any], path: str, use_transformers: bool = True
) -> tuple[list[DeclaredTie], list[Skipped]]:
    """Declared ties from config.json (at path), and a note for every class not resolved."""
    file = os.path.basename(path)
    ties: list[DeclaredTie] = []
    notes: list[Skipped] = []
    resolutions = resolve_ties(config, path, use_transformers)
    for resolution in resolutions:
        if resolution.resolver is None:
            notes.append(
                Skipped(
                    f"{file}:architectures:{resolution.architecture}",
                    f"architecture {resolution.architecture} not known; config tie not resolved",
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
