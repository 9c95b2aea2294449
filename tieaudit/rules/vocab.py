"""TIE004: the vocabulary tensors' rows, the output bias and the declared vocabulary size agree.

Which tensors are the vocabulary matrices is data, not a guess from names: for a folder whose
config.json names one class the tie table answers for, exactly the class's input embedding, output
projection and output bias (``ModelConfig.roles``, spelled as the files store them). Without such a
class (a bare .pt, .safetensors or ONNX file, several classes, a class the table does not hold),
only tensors whose role is unambiguous: stored under one of a few whole names used as exactly that
(never a suffix inside a block: RWKV's ``rwkv.blocks.0.attention.output.weight`` is a projection),
or the target and source of a declared tie between them.

A head stored transposed relative to its embedding (a ``.t()`` view of it, a verified transposed
copy, or a tie recorded as transposed) holds the vocabulary along its other axis.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.graph.alias import AliasGraph, relate
from tieaudit.graph.detect import CopyGroup
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE004

EMBEDDING_NAMES = (
    "model.embed_tokens.weight",
    "transformer.wte.weight",
    "gpt_neox.embed_in.weight",
    "shared.weight",
    "model.shared.weight",
    "embed_tokens.weight",
    "wte.weight",
    "tok_embeddings.weight",
    "token_embd.weight",
)
"""Whole names that, without a known class, are taken as the input embedding (stored order decides
between several): transformers' decoder, GPT-2, GPT-NeoX and encoder-decoder spellings, Meta's
original LLaMA layout and GGUF's."""
OUTPUT_NAMES = ("lm_head.weight", "embed_out.weight", "output.weight")
"""Whole names that, without a known class, are taken as the output projection (top level only)."""
OUTPUT_BIAS_NAMES = ("lm_head.bias", "final_logits_bias", "model.final_logits_bias")
"""Whole names that, without a known class, are taken as the output bias (``final_logits_bias``
is stored as a 1 x vocabulary buffer)."""


@dataclass(frozen=True)
class Vocabulary:
    """The tensors TIE004 compares, each None when absent or not stored."""

    embedding: TensorInfo | None
    """The input embedding (vocabulary x width)."""
    output: TensorInfo | None
    """The output projection."""
    bias: TensorInfo | None
    """The output bias."""


def _stored(ckpt: Checkpoint, name: str | None, ndims: Sequence[int]) -> TensorInfo | None:
    if name is None or name not in ckpt.names:
        return None
    tensor = ckpt.tensor(name)
    return tensor if len(tensor.shape) in ndims else None


def _named(ckpt: Checkpoint, names: Sequence[str], ndims: Sequence[int]) -> TensorInfo | None:
    """The first tensor, in stored order, stored under one of names (whole names)."""
    wanted = set(names)
    for tensor in ckpt.tensors:
        if tensor.name in wanted and len(tensor.shape) in ndims:
            return tensor
    return None


def vocabulary(graph: AliasGraph) -> Vocabulary:
    """The class's vocabulary tensors when known; else those whose role is unambiguous."""
    ckpt = graph.checkpoint
    roles = ckpt.config.roles if ckpt.config is not None else None
    if roles is not None:
        return Vocabulary(
            _stored(ckpt, roles.input_embedding, (2,)),
            _stored(ckpt, roles.output_embedding, (2,)),
            _stored(ckpt, roles.output_bias, (1,)),
        )
    embedding = _named(ckpt, EMBEDDING_NAMES, (2,))
    output = _named(ckpt, OUTPUT_NAMES, (2,))
    ties = [s.tie for s in graph.ties]
    if embedding is None or output is None:
        for tie in ties:
            source, target = _stored(ckpt, tie.kept, (2,)), _stored(ckpt, tie.dropped, (2,))
            if output is not None and tie.dropped != output.name:
                continue
            if embedding is not None and tie.kept != embedding.name:
                continue
            if source is not None:
                embedding, output = source, output or target
                break
    bias = _named(ckpt, OUTPUT_BIAS_NAMES, (1, 2))
    return Vocabulary(embedding, output, bias)


def transposed_to(graph: AliasGraph, groups: Sequence[CopyGroup], output: str, *, embedding: str) -> bool:
    """Whether output holds embedding's values transposed: a transposed view of the same storage,
    a verified transposed copy, or a tie recorded as transposed."""
    ckpt = graph.checkpoint
    first, second = ckpt.tensor(output), ckpt.tensor(embedding)
    if first.storage_id == second.storage_id:
        return relate(first, second) == "transposed"
    for group in groups:
        flips = {group.kept: False, **{m.name: m.transposed for m in group.members}}
        if output in flips and embedding in flips:
            return flips[output] != flips[embedding]
    return any(
        s.tie.relation == "transposed" and {s.tie.dropped, s.tie.kept} == {output, embedding}
        for s in graph.ties
    )


def vocab_findings(audited: Audited) -> Iterator[Finding]:
    """TIE004: rows of the embedding and the output projection, output bias, vocab sizes agree
    (the verified copies tell a transposed copy of the embedding)."""
    graph, groups = audited.graph, audited.copies
    ckpt = graph.checkpoint
    found = vocabulary(graph)
    embedding, output, bias = found.embedding, found.output, found.bias
    if output is not None and embedding is not None and output.name == embedding.name:
        output = None  # a tied head the file stores once: its rows are the embedding's
    sizes: dict[str, int] = {}
    names: list[str] = []
    if embedding is not None:
        sizes[f"embedding rows ({embedding.name})"] = embedding.shape[0]
        names.append(embedding.name)
    if output is not None:
        flipped = embedding is not None and transposed_to(
            graph, groups, output.name, embedding=embedding.name
        )
        label = "output rows, stored transposed" if flipped else "output rows"
        sizes[f"{label} ({output.name})"] = output.shape[1 if flipped else 0]
        names.append(output.name)
    if bias is not None:
        sizes[f"output bias length ({bias.name})"] = bias.shape[-1]
        names.append(bias.name)
    config = ckpt.config
    if config is not None and config.vocab_size is not None:
        sizes[f"config vocab_size ({config.file})"] = config.vocab_size
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{k} = {v}" for k, v in sizes.items())
        yield VOCAB_MISALIGNED.finding(
            names,
            f"vocabulary sizes disagree: {listing}.",
            details={"sizes": sizes},
        )
    rows = embedding.shape[0] if embedding else (config.vocab_size if config else None)
    if config is not None and config.tokenizer_vocab_size is not None and rows is not None:
        if config.tokenizer_vocab_size > rows:
            yield VOCAB_MISALIGNED.finding(
                names,
                f"the tokenizer has {config.tokenizer_vocab_size} tokens but the embedding has {rows} rows: "
                f"ids past {rows - 1} index out of range.",
                details={"tokenizer_vocab_size": config.tokenizer_vocab_size, "rows": rows},
            )


VOCAB_MISALIGNED = Rule(text=TIE004, check=vocab_findings)
