"""Build a small real checkpoint with a tie problem, then inspect, check and retie it.

A tiny GPT-2 (random init, from a config) is saved the way a careless conversion does it: the
lm_head is cloned instead of tied, so the file holds the embedding twice.
"""

from __future__ import annotations

import os
import subprocess
import sys


def build(folder: str) -> str:
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(config)
    state = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()  # the copy a tie should have been
    path = os.path.join(folder, "gpt2-untied.safetensors")
    save_file(state, path)
    return path


def run(*args: str) -> int:
    command = [sys.executable, "-m", "tieaudit.cli", *args]
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
    fixed = os.path.join(folder, "gpt2-tied.safetensors")
    if os.path.exists(fixed):
        os.unlink(fixed)
    if run("retie", path, "--dry-run") != 0 or run("retie", path, fixed) != 0:
        return 1
    after = run("check", fixed)
    print(
        f"(check of the retied file exited {after}; "
        f"{os.path.getsize(path)} -> {os.path.getsize(fixed)} bytes)"
    )
    return 0 if after == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
