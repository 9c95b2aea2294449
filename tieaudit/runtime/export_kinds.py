"""The Hugging Face head classes ``tieaudit export`` exports, and how each becomes ONNX parts.

The class is the first name of config.json's ``architectures`` that transformers defines and lists
among its seq2seq, masked or causal LM classes (its ``AutoModelFor...`` mappings); it is never
guessed from ``model_type``, and never code the folder ships. It is built from the folder's config
and weights only (local files, ``trust_remote_code=False``).

- causal LM: ``input_ids`` -> ``logits`` (an attention mask of ones is built inside, which keeps
  transformers off ``aten::diff``).
- masked LM: ``input_ids``, ``attention_mask`` -> ``logits``.
- seq2seq LM: two files, as optimum names them: ``encoder_model.onnx`` (``input_ids``,
  ``attention_mask`` -> ``last_hidden_state``) and ``decoder_model.onnx`` without past key values
  (``input_ids``, ``encoder_hidden_states``, ``encoder_attention_mask`` -> ``logits``).

Batch and sequence axes stay dynamic; ``--dim`` sets the example sizes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tieaudit.core.errors import InputError, UsageError, one_line
from tieaudit.runtime.export_parts import ExportModel, ExportSource

if TYPE_CHECKING:
    import torch

KINDS = (
    ("seq2seq LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "T5ForConditionalGeneration"),
    ("masked LM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "BertForMaskedLM"),
    ("causal LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "GPT2LMHeadModel"),
)
"""(kind, transformers' mapping of its classes, an example), in the order a class is looked up: a
class in two mappings (BART is also a masked LM) is exported as the first."""
SUPPORTED = (
    "export supports Hugging Face causal LM, masked LM and seq2seq LM classes ("
    + ", ".join(f"e.g. {example}" for _, _, example in KINDS)
    + ")"
)
ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"


def _architectures(folder: str) -> list[str]:
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read config.json: {one_line(exc, 200)}", folder) from exc
    names = config.get("architectures") if isinstance(config, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def head_class(folder: str) -> tuple[str, str]:
    """(kind, class name) from config.json's architectures; UsageError naming the supported kinds
    and the classes found when none is one of them."""
    from transformers.models.auto import modeling_auto

    found = _architectures(folder)
    for name in found:
        for kind, mapping, _ in KINDS:
            classes = getattr(modeling_auto, mapping).values()
            if name in classes or any(isinstance(c, tuple) and name in c for c in classes):
                return kind, name
    named = f"config.json's architectures names {', '.join(found)}" if found else "config.json names none"
    raise UsageError(f"{SUPPORTED}; {named}", folder)


def _load(folder: str, class_name: str) -> Any:
    import transformers

    # Exporting builds the model, but never with code from the folder and never from the Hub.
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model_class = getattr(transformers, class_name, None)
    if not isinstance(model_class, type) or not issubclass(model_class, transformers.PreTrainedModel):
        raise UsageError(f"transformers {transformers.__version__} has no model class {class_name}", folder)
    try:
        # Eager attention: plain ops torch.export traces with dynamic axes (T5's SDPA path fails there).
        model = model_class.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False, attn_implementation="eager"
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = one_line(exc, 300)
        raise InputError(f"transformers cannot load it as {class_name}: {why}", folder) from exc
    return model.eval()  # type: ignore[no-untyped-call]


def adopt(wrapper: torch.nn.Module, model: torch.nn.Module) -> None:
    """wrapper holds model's submodules, parameters and buffers under model's own names, so that the
    exporter names each initializer as model.state_dict() names its parameter
    (``transformer.wte.weight``, not ``m.transformer.wte.weight``); its forward calls model, kept as
    ``wrapper.m`` outside the module tree. They are the same objects: the submodules themselves,
    and the very tables of the tensors model holds itself (BART's ``final_logits_bias``), so that
    what the exporter swaps in through the wrapper is what model's forward reads."""
    for name, child in model.named_children():
        wrapper.add_module(name, child)
    for table in ("_parameters", "_buffers", "_non_persistent_buffers_set"):
        object.__setattr__(wrapper, table, getattr(model, table))
    object.__setattr__(wrapper, "m", model)  # not a submodule: its names stay the model's own


def logits_only(model: torch.nn.Module, *, own_names: bool = False) -> torch.nn.Module:
    """A causal LM as input_ids -> logits, in eval mode. The explicit mask of ones keeps
    transformers off aten::diff, which the TorchScript exporter cannot export. own_names: the
    initializers keep the model's own parameter names (``adopt``), as ``tieaudit export`` writes
    them; else the model is held under ``m`` and they are named ``m.<parameter>``, as the committed
    ONNX fixtures (fixtures/producers_onnx.py) have them."""
    import torch

    class LogitsOnly(torch.nn.Module):
        m: torch.nn.Module  # the model, outside the module tree with own_names (adopt)

        def __init__(self) -> None:
            super().__init__()
            if own_names:
                adopt(self, model)
            else:
                self.m = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)
            logits: torch.Tensor = self.m(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
            return logits

    return LogitsOnly().eval()


def masked_logits(model: torch.nn.Module) -> torch.nn.Module:
    """A masked LM as (input_ids, attention_mask) -> logits, in eval mode."""
    import torch

    class MaskedLogits(torch.nn.Module):
        m: torch.nn.Module  # the model, outside the module tree (adopt)

        def __init__(self) -> None:
            super().__init__()
            adopt(self, model)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = self.m(input_ids=input_ids, attention_mask=attention_mask).logits
            return logits

    return MaskedLogits().eval()


def seq2seq_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(encoder, decoder) of a seq2seq LM, each holding the whole model's submodules (``adopt``: the
    initializers are named as the model's state_dict names its parameters): the encoder maps
    (input_ids, attention_mask) to last_hidden_state; the decoder, without past key values, maps
    (input_ids, encoder_hidden_states, encoder_attention_mask) to the logits, through the model's
    own forward (its scaling included)."""
    import torch

    class Encoder(torch.nn.Module):
        m: torch.nn.Module  # the model, outside the module tree (adopt)

        def __init__(self) -> None:
            super().__init__()
            adopt(self, model)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            encoder: Any = self.m.get_encoder()  # type: ignore[operator]
            hidden: torch.Tensor = encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
            return hidden

    class Decoder(torch.nn.Module):
        m: torch.nn.Module  # the model, outside the module tree (adopt)

        def __init__(self) -> None:
            super().__init__()
            adopt(self, model)

        def forward(
            self,
            input_ids: torch.Tensor,
            encoder_hidden_states: torch.Tensor,
            encoder_attention_mask: torch.Tensor,
        ) -> torch.Tensor:
            logits: torch.Tensor = self.m(
                encoder_outputs=(encoder_hidden_states,),
                attention_mask=encoder_attention_mask,
                decoder_input_ids=input_ids,
                use_cache=False,
            ).logits
            return logits

    return Encoder().eval(), Decoder().eval()


def hf_model(folder: str, dims: Mapping[str, int]) -> ExportModel:
    """The folder's head class as the parts to export, with example inputs of the --dim sizes."""
    import torch

    kind, class_name = head_class(folder)
    model = _load(folder, class_name)
    if kind == "seq2seq LM" and not getattr(model.config, "is_encoder_decoder", False):
        raise UsageError(f"{class_name} is not an encoder-decoder model; {SUPPORTED}", folder)
    batch, sequence = dims.get("batch", 1), dims.get("sequence", 8)
    vocab = int(model.get_input_embeddings().weight.shape[0])  # the rows, which may differ from vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, sequence), dtype=torch.int64, generator=generator)
    mask = torch.ones_like(ids)
    axes = {0: "batch", 1: "sequence"}
    shape = f"int64[{batch}, {sequence}]"
    if kind == "causal LM":
        parts: tuple[ExportSource, ...] = (
            ExportSource(
                module=logits_only(model, own_names=True), inputs=(ids,), input_names=("input_ids",),
                output_names=("logits",), dynamic_shapes={"input_ids": axes},
                description=f"input_ids {shape} -> logits",
            ),
        )  # fmt: skip
    elif kind == "masked LM":
        parts = (
            ExportSource(
                module=masked_logits(model), inputs=(ids, mask), input_names=("input_ids", "attention_mask"),
                output_names=("logits",), dynamic_shapes={"input_ids": axes, "attention_mask": axes},
                description=f"input_ids, attention_mask {shape} -> logits",
            ),
        )  # fmt: skip
    else:
        parts = _seq2seq(model, ids, mask, decoder_sequence=dims.get("decoder_sequence", 4))
    shown = "; ".join(f"{p.file + ': ' if p.file else ''}{p.description}" for p in parts)
    return ExportModel(
        kind=kind,
        model_class=class_name,
        parts=parts,
        description=f"{class_name} ({kind}, from config.json's architectures) from {folder}: {shown}, "
        "dynamic axes",
    )


def _seq2seq(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, *, decoder_sequence: int
) -> tuple[ExportSource, ExportSource]:
    import torch

    encoder, decoder = seq2seq_parts(model)
    with torch.no_grad():
        hidden = encoder(ids, mask)
    batch, sequence = ids.shape
    generator = torch.Generator().manual_seed(1)
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
    decoder_ids = torch.randint(0, vocab, (batch, decoder_sequence), dtype=torch.int64, generator=generator)
    axes = {0: "batch", 1: "sequence"}
    return (
        ExportSource(
            module=encoder, inputs=(ids, mask), input_names=("input_ids", "attention_mask"),
            output_names=("last_hidden_state",),
            dynamic_shapes={"input_ids": axes, "attention_mask": axes},
            description=f"input_ids, attention_mask int64[{batch}, {sequence}] -> last_hidden_state",
            file=ENCODER_FILE,
        ),
        ExportSource(
            module=decoder, inputs=(decoder_ids, hidden, mask),
            input_names=("input_ids", "encoder_hidden_states", "encoder_attention_mask"),
            output_names=("logits",),
            dynamic_shapes={
                "input_ids": {0: "batch", 1: "decoder_sequence"},
                "encoder_hidden_states": axes,
                "encoder_attention_mask": axes,
            },
            description=f"input_ids int64[{batch}, {decoder_sequence}], encoder_hidden_states, "
            "encoder_attention_mask -> logits",
            file=DECODER_FILE,
        ),
    )  # fmt: skip
