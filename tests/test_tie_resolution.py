"""How the tie table answers for a config.json (tieaudit/formats/tie_table.py).

Synthetic entries pin down the rules (forced and default flags, nested levels, configs the table
was not computed for); real configs of a few families are checked against what transformers
itself ties when it builds the class from the same config.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers

from tieaudit.core.errors import InputError
from tieaudit.formats.tie_table import Answer, TableEntry, TieTable, Unresolved, resolve, tie_table

HEAD = {"lm_head.weight": "model.embed_tokens.weight"}
WRAPPED = {"lm_head.weight": "model.language_model.embed_tokens.weight"}


def table_with(entry: dict[str, Any], **extra: Any) -> TableEntry:
    raw = {
        "schema": "tieaudit.tie-table/1",
        "transformers": "test",
        "classes": {"Wrapper": entry, **extra.get("classes", {})},
        "failed": {},
        "config_defaults": {"llama": False, "gemma": True, "mystery": None},
        "auto_mappings": {"MODEL_MAPPING_NAMES": {"llama": "LlamaModel", "gemma": "GemmaModel"}},
    }
    found = TieTable(raw).entry("Wrapper")
    assert found is not None
    return found


SIMPLE = {
    "model_type": "simple",
    "switches": [{"path": "tie_word_embeddings", "default": False}],
    "groups": [{"on": ["1"], "ties": HEAD}],
}
NESTED = {
    "model_type": "wrapper",
    "switches": [
        {"path": "tie_word_embeddings", "default": False},
        {"path": "text_config.tie_word_embeddings", "default": False},
    ],
    "groups": [{"on": ["-1", "01", "1-", "10", "11"], "ties": WRAPPED}],
    "sub_models": {"text_config": "llama"},
    "submodels": [
        {
            "prefix": "model.language_model",
            "class": "LlamaModel",
            "config": "text_config",
            "auto": "MODEL_MAPPING_NAMES",
        }
    ],
    "absent_is_default": ["text_config.tie_word_embeddings"],
}
BASES: dict[str, dict[str, Any]] = {
    "LlamaModel": {"model_type": "llama", "switches": [], "groups": []},
    "GemmaModel": {"model_type": "gemma", "switches": [], "groups": []},
}


def answer(entry: TableEntry, config: dict[str, Any]) -> Answer:
    found = resolve(entry, config, "config.json")
    assert isinstance(found, Answer), found
    return found


def reason(entry: TableEntry, config: dict[str, Any]) -> str:
    found = resolve(entry, config, "config.json")
    assert isinstance(found, Unresolved), found
    return found.reason


@pytest.mark.parametrize(
    ("stated", "tied"),
    [({}, False), ({"tie_word_embeddings": True}, True), ({"tie_word_embeddings": False}, False)],
)
def test_a_flag_follows_the_statement_else_its_default(stated: dict[str, Any], tied: bool) -> None:
    assert bool(answer(table_with(SIMPLE), stated).ties) is tied


def test_a_forced_flag_ignores_the_statement() -> None:
    forced = {**SIMPLE, "switches": [{"path": "tie_word_embeddings", "default": True, "forced": True}]}
    forced["groups"] = [{"on": ["-", "0", "1"], "ties": HEAD}]
    found = answer(table_with(forced), {"tie_word_embeddings": False})
    assert found.ties == HEAD
    assert found.states[0].text == "tie_word_embeddings=false forced to true"


def test_a_nested_flag_counts_where_the_class_says() -> None:
    entry = table_with(NESTED, classes=BASES)
    assert answer(entry, {"text_config": {"tie_word_embeddings": True}}).ties == WRAPPED
    assert (
        answer(entry, {"tie_word_embeddings": False, "text_config": {"tie_word_embeddings": True}}).ties
        == WRAPPED
    )
    assert answer(entry, {"text_config": {"model_type": "llama"}}).ties == {}


def test_another_nested_model_type_brings_its_own_default() -> None:
    entry = table_with(NESTED, classes=BASES)
    found = answer(entry, {"text_config": {"model_type": "gemma"}})
    assert found.ties == WRAPPED  # GemmaConfig ties by default, and the wrapper follows its text config
    assert "defaulted to true (gemma)" in found.states[1].text


def test_a_nested_model_type_the_table_cannot_place_is_not_resolved() -> None:
    entry = table_with(NESTED, classes=BASES)
    assert "text_config.model_type is 'opt'" in reason(entry, {"text_config": {"model_type": "opt"}})
    # stating the flag does not help: the class transformers would pick for opt is unknown here
    assert "is 'opt'" in reason(entry, {"text_config": {"model_type": "opt", "tie_word_embeddings": True}})


def test_a_nested_class_that_ties_by_itself_is_not_swapped() -> None:
    tying = copy.deepcopy(BASES)
    tying["GemmaModel"]["groups"] = [{"on": ["1"], "ties": {"a.weight": "b.weight"}}]
    assert "is 'gemma'" in reason(table_with(NESTED, classes=tying), {"text_config": {"model_type": "gemma"}})


def test_another_top_level_model_type_is_not_resolved() -> None:
    assert "model_type is 'llama', not simple" in reason(table_with(SIMPLE), {"model_type": "llama"})


def test_a_value_the_ties_depend_on_gives_only_unnumbered_ties_when_it_differs() -> None:
    """Layer counts other than the table's move the ties between numbered layers (Zamba's shared
    blocks, DETR's per-layer heads), not those outside them (the word embeddings): only the latter
    are given, and the answer says why the rest is not."""
    ties = {**HEAD, "model.layers.5.block.weight": "model.layers.2.block.weight"}
    entry = table_with(
        {**SIMPLE, "groups": [{"on": ["1"], "ties": ties}],
         "assumes": {"decoder_layers": 6, "layers_block_type": ["a", "b"]}}
    )  # fmt: skip
    whole = answer(entry, {"decoder_layers": 6, "tie_word_embeddings": True})
    assert whole.ties == ties and whole.partial is None
    part = answer(entry, {"decoder_layers": 3, "tie_word_embeddings": True})
    assert part.ties == HEAD
    assert part.partial is not None
    assert "depend on decoder_layers, which config.json sets to 3" in part.partial
    assert part.partial.endswith("ties between numbered layers not resolved")
    untied = answer(entry, {"decoder_layers": 3})  # the switch ties nothing, at any size
    assert untied.ties == {} and untied.partial is None
    flagged = answer(entry, {"decoder_layers": True, "tie_word_embeddings": True})
    assert "sets to true" in (flagged.partial or "")  # true is not 6, nor is it 1
    deep: list[Any] = []
    for _ in range(100_000):  # a nested value is compared without recursing into it
        deep = [deep]
    nested = answer(entry, {"layers_block_type": deep, "tie_word_embeddings": True})
    assert "a list of 1 entries" in (nested.partial or "")


def test_combinations_transformers_refuses_are_not_resolved() -> None:
    entry = table_with({**SIMPLE, "refused": ["1"]})
    assert "refuses to build it from a config stating tie_word_embeddings=true" in reason(
        entry, {"tie_word_embeddings": True}
    )


def test_a_switch_that_is_not_a_boolean_is_bad_input() -> None:
    with pytest.raises(InputError, match="text_config.tie_word_embeddings must be true or false, not 'yes'"):
        resolve(
            table_with(NESTED, classes=BASES), {"text_config": {"tie_word_embeddings": "yes"}}, "config.json"
        )


def test_an_entry_marked_unresolved_is_not_resolved() -> None:
    assert reason(table_with({**SIMPLE, "unresolved": "why not"}), {}) == "why not"


# --- real configs against transformers ----------------------------------------------------------


def live_ties(architecture: str, config: dict[str, Any]) -> dict[str, str]:
    model_class = getattr(transformers, architecture)
    with torch.device("meta"):
        model = model_class(model_class.config_class.from_dict(copy.deepcopy(config)))
    return dict(model.get_expanded_tied_weights_keys(all_submodels=True))


TINY_TEXT = {
    "num_hidden_layers": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
}
TINY_VISION = {
    "model_type": "clip_vision_model",
    "num_hidden_layers": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_attention_heads": 2,
}
REAL = [
    (
        "LlavaForConditionalGeneration",
        {
            "model_type": "llava",
            "text_config": {"model_type": "mistral", **TINY_TEXT},
            "vision_config": TINY_VISION,
        },
    ),
    (
        "LlavaForConditionalGeneration",
        {
            "model_type": "llava",
            "text_config": {"model_type": "gemma", **TINY_TEXT},
            "vision_config": TINY_VISION,
        },
    ),
    (
        "LlavaForConditionalGeneration",
        {
            "model_type": "llava",
            "text_config": {"model_type": "gemma", "tie_word_embeddings": False, **TINY_TEXT},
            "vision_config": TINY_VISION,
        },
    ),
    (
        "LlavaForConditionalGeneration",
        {
            "model_type": "llava",
            "tie_word_embeddings": True,
            "text_config": {"model_type": "llama", **TINY_TEXT},
            "vision_config": TINY_VISION,
        },
    ),
    (
        "MarianMTModel",
        {
            "model_type": "marian",
            "share_encoder_decoder_embeddings": False,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "d_model": 16,
        },
    ),
    ("MarianMTModel", {"model_type": "marian", "encoder_layers": 1, "decoder_layers": 1, "d_model": 16}),
    (
        "T5ForConditionalGeneration",
        {"model_type": "t5", "tie_word_embeddings": False, "num_layers": 1, "d_model": 16},
    ),
    ("Gemma3ForCausalLM", {"model_type": "gemma3_text", **TINY_TEXT}),
]


@pytest.mark.parametrize(("architecture", "config"), REAL, ids=[f"{a}-{i}" for i, (a, _) in enumerate(REAL)])
def test_the_table_answers_as_transformers_builds_real_configs(
    architecture: str, config: dict[str, Any]
) -> None:
    entry = tie_table().entry(architecture)
    assert entry is not None
    found = answer(entry, {"architectures": [architecture], **config})
    assert dict(found.ties) == live_ties(architecture, config)


def test_a_checked_truncation_rule_gives_the_ties_of_fewer_layers() -> None:
    """DETR-family heads: one ``bbox_embed`` entry per decoder layer (the generator checked the rule
    against transformers at 2 and 3 layers); with fewer layers the last entries' ties go, with more
    than the table's the answer stays partial."""
    ties = {f"model.decoder.bbox_embed.{i}.weight": f"bbox_embed.{i}.weight" for i in range(6)}
    entry = table_with(
        {**SIMPLE, "groups": [{"on": ["1"], "ties": ties}],
         "assumes": {"decoder_layers": 6, "encoder_layers": 6},
         "truncate": {"key": "decoder_layers", "lists": ["bbox_embed", "model.decoder.bbox_embed"],
                      "others": ["encoder_layers"], "checked": [2, 3]}}
    )  # fmt: skip
    three = answer(entry, {"decoder_layers": 3, "encoder_layers": 1, "tie_word_embeddings": True})
    assert three.partial is None
    assert three.ties == {f"model.decoder.bbox_embed.{i}.weight": f"bbox_embed.{i}.weight" for i in range(3)}
    more = answer(entry, {"decoder_layers": 8, "tie_word_embeddings": True})
    assert more.ties == {} and more.partial is not None
