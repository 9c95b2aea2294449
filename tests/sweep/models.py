"""Which classes the sweep covers, and a tiny CPU config for each.

The classes come from the architecture table (``tieaudit/formats/tie_table.json``, else the
preview at /tmp): every class the table lists with a tie, plus the base class (the auto
``MODEL_MAPPING``) and the ``*EncoderModel`` classes of the same model type. The table is used
only to enumerate: what is tied is taken from the live model (truth.py).

A tiny config starts from the config class's defaults and shrinks sizes by key name (layers 2,
hidden 32, heads 2, vocabulary 256, experts 4...); lists sized by a layer count follow it.
``FIXUPS`` holds what a model type needs on top (found by building it), the table's
``built_with`` what the table's generator needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

ROOT = Path(__file__).resolve().parents[2]
TABLE_PATHS = (ROOT / "tieaudit" / "formats" / "tie_table.json", Path("/tmp/tie_table_preview.json"))

MAX_PARAMS = 24_000_000
"""A tiny model above this many parameters is refused: the shrinking missed a size. Conv stacks
(audio codecs, detection backbones) keep their own widths; up to 96 MB of float32 they are swept."""


def table_path() -> Path:
    """The committed table when present, else the preview."""
    for path in TABLE_PATHS:
        if path.is_file():
            return path
    raise FileNotFoundError("no architecture table: " + ", ".join(map(str, TABLE_PATHS)))


def load_table() -> dict[str, Any]:
    with table_path().open() as handle:
        table: dict[str, Any] = json.load(handle)
    return table


@dataclass(frozen=True)
class Subject:
    """One class the sweep saves, audits, reties and reloads."""

    name: str
    """The model class (transformers attribute)."""
    model_type: str
    config: str
    """The config class."""
    role: str
    """tied (the table lists ties for it), base (the model type's MODEL_MAPPING class) or encoder."""
    switches: tuple[str, ...]
    """Config paths set all true (setting "on") or all false ("off"); empty: one setting, "fixed"."""
    built_with: tuple[tuple[str, Any], ...]
    """Values the table's generator stated so that the class builds."""
    family: tuple[str, ...]
    """Every subject of the same model type, this one first: the loaders of its folders."""

    @property
    def settings(self) -> tuple[str, ...]:
        return ("on", "off") if self.switches else ("fixed",)


def _has_ties(entry: Mapping[str, Any]) -> bool:
    return any(group["ties"] for group in entry.get("groups", []))


def subjects(table: Mapping[str, Any] | None = None) -> dict[str, Subject]:
    """Every class the sweep covers, by name, in a stable order (model type, then name)."""
    table = table if table is not None else load_table()
    classes: Mapping[str, Any] = table["classes"]
    base_of: Mapping[str, str] = table["auto_mappings"]["MODEL_MAPPING_NAMES"]
    roles: dict[str, str] = {}
    for name, entry in classes.items():
        if _has_ties(entry):
            roles[name] = "tied"
    families = {classes[name]["model_type"] for name in roles}
    for name, entry in classes.items():
        kind = entry["model_type"]
        if kind not in families or name in roles:
            continue
        if base_of.get(kind) == name:
            roles[name] = "base"
        elif name.endswith("EncoderModel"):
            roles[name] = "encoder"
    by_type: dict[str, list[str]] = {}
    for name in sorted(roles):
        by_type.setdefault(classes[name]["model_type"], []).append(name)
    out: dict[str, Subject] = {}
    for kind in sorted(by_type):
        for name in by_type[kind]:
            entry = classes[name]
            switches = tuple(
                s["path"] for s in entry.get("switches", []) if not s.get("forced") and roles[name] == "tied"
            )
            family = (name, *(n for n in by_type[kind] if n != name))
            built = tuple(sorted((entry.get("built_with") or {}).items()))
            out[name] = Subject(name, kind, entry["config"], roles[name], switches, built, family)
    return out


# --- shrinking ----------------------------------------------------------------------------------

LAYERS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
    "num_decoder_layers", "num_encoder_layers", "depth", "layers", "num_blocks",
}  # fmt: skip
WIDTH = {
    "hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "hidden_dim", "embedding_size",
    "word_embed_proj_dim", "projection_dim", "out_hidden_size", "encoder_hidden_size",
    "projector_hidden_size", "emb_dim", "text_embed_dim", "vision_embed_dim", "d_embed",
    "embedding_dim", "hidden_size_global", "image_text_hidden_size", "backbone_hidden_size",
    "attention_hidden_size", "projection_hidden_size", "text_hidden_size", "vision_hidden_size",
}  # fmt: skip
HEADS = {
    "num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
    "decoder_attention_heads", "attention_heads", "linear_num_value_heads", "linear_num_key_heads",
    "index_n_heads", "mamba_n_heads", "resampler_n_heads",
}  # fmt: skip
KV_HEADS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"}
HEAD_DIM = {
    "head_dim", "d_kv", "kv_channels", "v_head_dim", "qk_head_dim", "d_head", "dim_head",
    "attention_head_size", "index_head_dim", "linear_key_head_dim", "linear_value_head_dim",
    "resampler_head_dim", "mamba_d_head",
}  # fmt: skip
HALF_HEAD = {"qk_rope_head_dim", "qk_nope_head_dim"}
RANKS = {"kv_lora_rank", "q_lora_rank"}
FFN = {
    "intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
    "moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size", "mlp_dim",
    "d_inner", "ffn_hidden_size", "intermediate_size_mlp", "dense_intermediate_size",
    "shared_experts_intermediate_size", "mlp_hidden_size",
}  # fmt: skip
EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
TOP_K = {"num_experts_per_tok", "moe_topk", "moe_k", "top_k"}
POSITIONS = {"max_position_embeddings", "n_positions", "max_target_positions"}
VOCAB = 256
WIDTH_TO = 32
FFN_TO = 64

_SCALARS: dict[str, Callable[[int], int]] = {
    **{k: (lambda v: min(v, WIDTH_TO)) for k in WIDTH},
    **{k: (lambda v: min(v, 2)) for k in HEADS | LAYERS | TOP_K},
    **{k: (lambda v: 1 if v == 1 else 2) for k in KV_HEADS},
    **{k: (lambda v: min(v, 16)) for k in HEAD_DIM | RANKS},
    **{k: (lambda v: min(v, 8)) for k in HALF_HEAD},
    **{k: (lambda v: min(v, FFN_TO)) for k in FFN},
    **{k: (lambda v: min(v, 4)) for k in EXPERTS},
    **{k: (lambda v: min(v, 512)) for k in POSITIONS},
    "n_shared_experts": lambda v: min(v, 1),
    "n_group": lambda v: 1,
    "topk_group": lambda v: 1,
    "vocab_size": lambda v: min(v, VOCAB),
    "index_topk": lambda v: min(v, 16),
}
_WIDTH_LISTS = {"hidden_sizes", "conv_dim", "embed_dims", "encoder_hidden_sizes", "neck_hidden_sizes"}
_ONES_LISTS = {"depths", "stage_num_blocks", "block_repeats", "num_layers_per_stage"}
_HEAD_LISTS = {"num_heads", "num_attention_heads"}


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_key(key: str) -> bool:
    return key.endswith(("token_id", "token_index", "token_ids"))


def shrink(d: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config dict with sizes cut by key name; nested configs shrink too."""
    out: dict[str, Any] = {}
    layer_counts: dict[int, int] = {}
    for key, value in d.items():
        if not isinstance(key, str):  # integer-keyed tables (Aria's patch-to-query map): kept
            out[key] = value
        elif _is_int(value) and "vocab_size" in key and key != "type_vocab_size":
            # vocab_size, *_vocab_size, vocab_size_per_layer_input (Gemma 4's per-layer table)
            out[key] = min(value, VOCAB)
        elif isinstance(value, dict):
            out[key] = shrink(value) if key not in ("id2label", "label2id") else value
        elif _is_int(value) and key in _SCALARS:
            out[key] = _SCALARS[key](value)
            if key in LAYERS and out[key] != value:
                layer_counts[value] = out[key]
        elif isinstance(value, list) and value and all(_is_int(v) for v in value):
            if key in _WIDTH_LISTS:
                out[key] = [min(v, WIDTH_TO) for v in value]
            elif key in _ONES_LISTS:
                out[key] = [min(v, 1) for v in value]
            elif key in _HEAD_LISTS:
                out[key] = [min(v, 2) for v in value]
            else:
                out[key] = value
        else:
            out[key] = value
    vocab = out.get("vocab_size")
    layers = min(layer_counts.values(), default=None)
    for key, value in list(out.items()):
        if key == "per_layer_config" and isinstance(value, dict) and layers is not None:
            # per-layer overrides of layers that no longer exist (the table's generator does the same)
            out[key] = {k: v for k, v in value.items() if not (str(k).isdigit() and int(k) >= layers)}
            continue
        if isinstance(value, list) and len(value) in layer_counts and key not in _WIDTH_LISTS | _ONES_LISTS:
            out[key] = value[: layer_counts[len(value)]]  # per-layer lists (layer_types, ...)
        if _is_int(vocab) and isinstance(key, str) and _token_key(key):
            out[key] = _fit_token(value, vocab)
    return out


def _fit_token(value: Any, vocab: int) -> Any:
    if _is_int(value) and value >= vocab:
        return vocab - 1 - value % 32
    if isinstance(value, list):
        return [_fit_token(v, vocab) for v in value]
    return value


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted config path (``text_config.tie_word_embeddings``), creating nested dicts."""
    *parents, last = path.split(".")
    for part in parents:
        d = d.setdefault(part, {})
    d[last] = value


# What a model type needs on top of the generic shrinking (dotted paths); found by building.
FIXUPS: dict[str, dict[str, Any]] = {}


def tiny_config_dict(subject: Subject, setting: str) -> dict[str, Any]:
    """The config dict the class is built from (before the config class reads it)."""
    import transformers

    config_class = getattr(transformers, subject.config)
    # built_with are the config class's arguments, as the table's generator passed them: some
    # choose sub-configs (use_timm_backbone=False gives a ResNet backbone config, not timm's).
    d = shrink(config_class(**dict(subject.built_with)).to_dict())
    for path, value in FIXUPS.get(subject.model_type, {}).items():
        set_path(d, path, value)
    _mamba_sizes(d)
    for path in subject.switches:
        set_path(d, path, setting == "on")
    return d


def _mamba_sizes(d: dict[str, Any]) -> None:
    """Mamba-2 mixers check heads x head size = expand x hidden size; the shrinking cuts each
    alone, so the head size is derived again (every nested config too)."""
    for value in d.values():
        if isinstance(value, dict):
            _mamba_sizes(value)
    hidden = d.get("hidden_size")
    if not _is_int(hidden):
        return
    for prefix in ("mamba_", ""):
        heads, expand = d.get(prefix + "n_heads" if prefix else "num_heads"), d.get(prefix + "expand")
        size_key = prefix + "d_head" if prefix else "head_dim"
        if _is_int(heads) and _is_int(expand) and size_key in d:
            inner = expand * hidden
            d[size_key] = inner // heads
            if _is_int(d.get("mamba_d_ssm")) and prefix:
                d["mamba_d_ssm"] = inner
            groups = prefix + "n_groups"
            if _is_int(d.get(groups)) and heads % d[groups]:
                d[groups] = 1


def tiny_config(subject: Subject, setting: str) -> Any:
    import transformers

    config_class = getattr(transformers, subject.config)
    return config_class.from_dict(tiny_config_dict(subject, setting))


def build(subject: Subject, setting: str, seed: int = 0) -> Any:
    """The class built from its tiny config on CPU, random init with a fixed seed, in eval mode."""
    import torch
    import transformers

    model_class = getattr(transformers, subject.name)
    config = tiny_config(subject, setting)
    with torch.device("meta"):
        count = sum(p.numel() for p in model_class(config).parameters())
    if count > MAX_PARAMS:
        raise RuntimeError(f"tiny config still has {count:,} parameters (cap {MAX_PARAMS:,})")
    torch.manual_seed(seed)
    model = model_class(config)
    return model.eval()
