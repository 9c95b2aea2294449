"""A config whose layer counts differ from the tie table's: the ties outside numbered layers are
still declared (Zamba's head and embedding), the rest is named in a note on the terminal, and an
equal copy whose names the class never ties (``A_log`` in every Mamba layer) stays a note.

The folder is written by hand (config.json + safetensors): no model is built.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tieaudit.audit import audit_path
from tieaudit.cli.main import main

HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"
A_LOG = ("model.layers.0.mamba.A_log", "model.layers.1.mamba.A_log")


def zamba_folder(folder: Path) -> None:
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((64, 16)).astype(np.float32)
    a_log = np.log(np.arange(1, 257, dtype=np.float32)).reshape(16, 16)  # deterministic, not constant
    tensors = {HEAD: embed.copy(), EMBED: embed, A_LOG[0]: a_log, A_LOG[1]: a_log.copy()}
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "architectures": ["ZambaForCausalLM"], "model_type": "zamba", "tie_word_embeddings": True,
        "num_hidden_layers": 2, "layers_block_type": ["linear_attention", "linear_attention"],
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


def test_other_layer_counts_keep_the_head_tie_and_say_what_is_left(tmp_path: Path) -> None:
    folder = tmp_path / "zamba"
    zamba_folder(folder)
    audit = audit_path(str(folder))
    ckpt = audit.graph.checkpoint
    assert [(t.dropped, t.kept) for t in ckpt.declared_ties] == [(HEAD, EMBED)]
    severity = {frozenset(f.names): f.severity for f in audit.findings if f.rule == "TIE001"}
    assert severity == {frozenset((HEAD, EMBED)): "warning", frozenset(A_LOG): "note"}

    out = tmp_path / "check.txt"
    assert main(["check", str(folder), "--output", str(out)]) == 1
    text = out.read_text()
    assert "note: config.json:architectures:ZambaForCausalLM:" in text
    assert "ties between numbered layers not resolved" in text
