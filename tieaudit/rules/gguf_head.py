"""GGUF's head against llama.cpp's loader: a head the loader requires and the file lacks (TIE003),
and a head quantized to another type than the embedding (TIE001, a note: relation ``quantized``).

An equal copy (same GGML type, equal bytes) needs nothing here: the copy search finds it as any
other TIE001. A missing head the loader restores from ``token_embd.weight`` is a declared tie of
the loader (``formats.gguf``), shown by inspect and needing no finding.
"""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.core.units import human_bytes
from tieaudit.formats.gguf_heads import EMBEDDING, HEAD
from tieaudit.rules.finding import Audited, Finding, Rule

_UNKNOWN = {
    "conditional": "depends on the model's hyperparameters",
    "unknown": "is not in tieaudit's table",
}


def missing_head_findings(audited: Audited, rule: Rule) -> Iterator[Finding]:
    """TIE003 for a GGUF file without ``output.weight``: an error where llama.cpp's loader requires
    it (the file does not load), a note where the table cannot say."""
    facts = audited.graph.checkpoint.gguf
    if facts is None or facts.head not in ("required", *_UNKNOWN) or EMBEDDING not in facts.pair:
        return
    architecture = facts.architecture or "(none)"
    where = f"llama.cpp's loader for architecture {architecture} (llama.cpp {facts.llama_cpp[:12]})"
    if facts.head == "required":
        yield rule.finding(
            (HEAD, EMBEDDING),
            f'{HEAD} is not stored and {where} requires it: the file does not load ("missing tensor '
            f"'{HEAD}'\"). The converter leaves the head out of a tied model, and this architecture's "
            f"loader does not fall back to {EMBEDDING}.",
            fix=f"convert again with {HEAD} stored (a copy of {EMBEDDING}), or load with a llama.cpp "
            "whose loader for this architecture falls back",
            details={
                "architecture": facts.architecture,
                "loader": facts.loader,
                "llama_cpp": facts.llama_cpp,
            },
        )
        return
    yield rule.finding(
        (HEAD, EMBEDDING),
        f"{HEAD} is not stored, and whether {where} falls back to {EMBEDDING} {_UNKNOWN[facts.head]}: "
        "load the file with llama.cpp to know.",
        severity="note",
        details={"architecture": facts.architecture, "loader": facts.loader, "llama_cpp": facts.llama_cpp},
    )


def quantized_findings(audited: Audited, rule: Rule) -> Iterator[Finding]:
    """TIE001, a note: head and embedding of one shape quantized to different GGML types. Their bytes
    cannot be compared and tieaudit never dequantizes, so whether they came from one matrix is not
    verified; the head's bytes are what a tied conversion would save."""
    facts = audited.graph.checkpoint.gguf
    if facts is None or HEAD not in facts.pair or EMBEDDING not in facts.pair:
        return
    (head_type, head_shape), (embd_type, embd_shape) = facts.pair[HEAD], facts.pair[EMBEDDING]
    if head_type == embd_type or head_shape != embd_shape:
        return
    head_bytes = audited.graph.checkpoint.tensor(HEAD).nbytes
    yield rule.finding(
        (EMBEDDING, HEAD),
        f"{HEAD} ({head_type}) and {EMBEDDING} ({embd_type}) have the same shape {list(head_shape)} and "
        f"different GGML types: if they were quantized from one matrix, a tied conversion saves the "
        f"head's {human_bytes(head_bytes)}. tieaudit does not dequantize, so this is not verified.",
        severity="note",
        relation="quantized",
        fix="if the source model is tied, convert it again without the head (llama-quantize keeps the "
        "tie); if it is untied, nothing to do",
        details={"types": {HEAD: head_type, EMBEDDING: embd_type}, "head_bytes": head_bytes},
    )
