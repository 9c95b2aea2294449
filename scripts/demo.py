"""Build a small real checkpoint with a tie problem, then inspect, check and retie it.

A tiny GPT-2 (random init, from a config) is saved with save_pretrained, then its lm_head is
stored as a clone the way a careless conversion does it: the config declares the tie, the file
holds the embedding twice. retie makes it one tensor again; check then passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def build(folder: str) -> str:
    """A GPT-2 folder as save_pretrained writes it, whose head was then stored as its own copy of
    the embedding (the tie the config declares, lost on the way: a merge or conversion script)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)
    path = os.path.join(folder, "gpt2-untied")
    GPT2LMHeadModel(config).save_pretrained(path)
    weights = os.path.join(path, "model.safetensors")
    state = load_file(weights)
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()  # the copy a tie should have been
    save_file(state, weights, metadata={"format": "pt"})
    return path


def _size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def run(*args: str) -> int:
    command = [sys.executable, "-m", "tieaudit", *args]
    print(f"\n$ tieaudit {' '.join(args)}", flush=True)
    return subprocess.run(command, check=False).returncode


def main() -> int:
    folder = sys.argv[1] if len(sys.argv) > 1 else "demo"
    os.makedirs(folder, exist_ok=True)
    path = build(folder)
    dot = os.path.join(folder, "ties.dot")
    if run("inspect", path) != 0:
        return 1
    if run("inspect", path, "--format", "dot", "--output", dot) != 0:
        return 1
    print(f"(alias graph written to {dot}; render it with: dot -Tsvg {dot} > ties.svg)")
    code = run("check", path)
    print(f"(check exited {code}: 1 means findings at or above --fail-on, as a CI gate wants)")
    if code != 1:
        return 1
    fixed = os.path.join(folder, "gpt2-tied")
    shutil.rmtree(fixed, ignore_errors=True)
    if run("retie", path, "--dry-run") != 0 or run("retie", path, fixed) != 0:
        return 1
    after = run("check", fixed)
    print(
        f"(check of the retied file exited {after}; "
        f"{_size(path)} -> {_size(fixed)} bytes)"
    )
    return 0 if after == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
