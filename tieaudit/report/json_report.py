"""The JSON report (schema tieaudit.report/1, DESIGN.md): built from the records in one place."""

from __future__ import annotations

import json
from typing import Any

from tieaudit.audit import Audit
from tieaudit.core.records import Consumer
from tieaudit.core.version import __version__
from tieaudit.formats.family import bare_family
from tieaudit.report.training import training_dict
from tieaudit.rules.finding import Finding

SCHEMA = "tieaudit.report/1"


MAX_LISTED_SKIPPED = 10_000
"""Non-tensor entries listed by name (``skipped_total`` counts them all): a 64 KB pickle can hold
hundreds of thousands of integer leaves, which would make a report of megabytes."""


def finding_dict(finding: Finding) -> dict[str, Any]:
    return {
        "rule": finding.rule,
        "kind": finding.kind,
        "severity": finding.severity,
        "names": list(finding.names),
        "relation": finding.relation,
        "wasted_bytes": finding.wasted_bytes,
        "message": finding.message,
        "fix": None if finding.fix is None else str(finding.fix),
        **({"details": dict(finding.details)} if finding.details else {}),
    }


def consumer_dict(consumer: Consumer) -> dict[str, Any]:
    """One node input slot reading a tensor, with its role (and the matrix products a chain reaches)."""
    reaches = [consumer_dict(r) for r in consumer.reaches]
    return {
        "node": consumer.node,
        "op_type": consumer.op_type,
        "slot": consumer.slot,
        "graph": consumer.graph,
        "role": consumer.role,
        **({"reaches": reaches} if reaches else {}),
    }


def report_dict(audit: Audit) -> dict[str, Any]:
    """The report as plain data, field names per DESIGN.md."""
    ckpt = audit.graph.checkpoint
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "tieaudit_version": __version__,
        "path": ckpt.path,
        "format": ckpt.format,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "nbytes": t.nbytes,
                "storage": t.storage_id,
                "file": t.file,
                "strides": list(t.strides),
                "byte_offset": t.byte_offset,
            }
            for t in ckpt.tensors
        ],
        "alias_groups": [
            {
                "storage": g.storage_id,
                "names": list(g.names),
                "relation": g.relation,
                "nbytes": g.nbytes,
                "pairs": [[p.first, p.second, p.relation] for p in g.pairs],
                **({"pairs_truncated": True} if g.pairs_truncated else {}),
                **({"aliases": list(g.aliases)} if g.aliases else {}),
            }
            for g in audit.graph.groups
        ],
        "declared_ties": [
            {
                "target": s.tie.dropped,
                "source": s.tie.kept,
                "declared_by": s.tie.declared_by,
                "where": s.tie.where,
                "target_stored": s.dropped_stored,
                "source_stored": s.kept_stored,
                "shared_storage": s.shared_storage,
            }
            for s in audit.graph.ties
        ],
        "findings": [finding_dict(f) for f in audit.findings],
        "summary": audit.summary().as_dict(),
    }
    if ckpt.skipped:
        listed = ckpt.skipped[:MAX_LISTED_SKIPPED]
        report["skipped"] = [{"name": s.name, "reason": s.reason} for s in listed]
        if ckpt.skipped_total > len(listed):
            report["skipped_total"] = ckpt.skipped_total
    if ckpt.unread:  # every one: convert and retie account for each
        report["unread_tensors"] = [
            {
                "name": u.name,
                "kind": u.kind,
                "dtype": u.dtype,
                "shape": None if u.shape is None else list(u.shape),
                "file": u.file,
            }
            for u in ckpt.unread
        ]
    if ckpt.notes:
        report["notes"] = list(ckpt.notes)
    if ckpt.pickle_globals:
        report["pickle_globals"] = [
            {"name": g.name, "verdict": g.verdict, "use": g.use, "file": g.file}
            for g in ckpt.pickle_globals
        ]
    if ckpt.config is not None:
        config = ckpt.config
        report["config"] = {
            "file": config.file,
            "architectures": list(config.architectures),
            "tie_word_embeddings": config.tie_word_embeddings,
            "vocab_size": config.vocab_size,
            "tokenizer_vocab_size": config.tokenizer_vocab_size,
        }
    family = bare_family(ckpt)  # a bare file: the class its names match (no config.json names one)
    if family is not None:
        report["family"] = family.as_dict()
    if ckpt.consumers:
        report["consumers"] = {
            name: [consumer_dict(c) for c in uses] for name, uses in ckpt.consumers.items()
        }
    if ckpt.format == "onnx":
        report["consumer_ties"] = [
            {
                "initializer": tie.initializer,
                "consumers": [consumer_dict(c) for c in tie.consumers],
                "nbytes": tie.nbytes,
                "aliases": list(tie.aliases),
            }
            for tie in audit.graph.consumer_ties
        ]
    if ckpt.gguf is not None:
        facts = ckpt.gguf
        report["gguf"] = {
            "version": facts.version,
            "architecture": facts.architecture,
            "tokenizer": facts.tokenizer,
            "head": facts.head,
            "loader": facts.loader,
            "llama_cpp": facts.llama_cpp,
            "pair": {
                name: {"ggml_type": kind, "shape": list(shape)} for name, (kind, shape) in facts.pair.items()
            },
        }
    if ckpt.aliases:
        report["aliases"] = dict(ckpt.aliases)
    training = training_dict(audit.graph)
    if training is not None:
        report["training"] = training
    return report


def render_json(audit: Audit) -> str:
    """The report as indented JSON text."""
    return json.dumps(report_dict(audit), indent=2) + "\n"
