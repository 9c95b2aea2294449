"""Generate tieaudit/formats/gguf_heads.json: what llama.cpp's loader does when a GGUF file has no
``output.weight``, per ``general.architecture``, read from llama.cpp's own loader source.

Usage: python scripts/gen_gguf_heads.py LLAMA_CPP_SRC_DIR --version TEXT > tieaudit/formats/gguf_heads.json

LLAMA_CPP_SRC_DIR is llama.cpp's ``src`` folder in the layout where each architecture's loader is
``llama_model_<class>::load_arch_tensors`` in ``src/models/*.cpp`` (2026 and later). Three files
are read: ``llama-arch.cpp`` (``{ LLM_ARCH_X, "name" }``: the architecture's GGUF name),
``llama-model.cpp`` (``case LLM_ARCH_X: return new llama_model_<class>``), ``models/models.h`` (a
class without its own loader reuses its base class's) and the class's ``load_arch_tensors`` body,
whose ``output`` head is classified:

- ``falls-back``: ``output.weight`` is created ``TENSOR_NOT_REQUIRED`` and, when absent, the head is
  ``token_embd.weight`` created ``TENSOR_DUPLICATED`` (the tie is realised by the loader);
- ``required``: ``output.weight`` is created with flags ``0`` (a file without it does not load);
- ``embedding``: the head is always ``token_embd.weight`` (a stored ``output.weight`` is unused);
- ``optional``: ``output.weight`` is ``TENSOR_NOT_REQUIRED`` with no fallback (no head without it);
- ``none``: the loader creates no head; ``conditional``: several creations whose flags differ
  (hyperparameters decide), which tieaudit does not guess.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

_ARCH_NAME = re.compile(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}")
_DISPATCH = re.compile(r"case\s+(LLM_ARCH_\w+)\s*:|return\s+new\s+llama_model_(\w+)\s*\(")
_PARENT = re.compile(r"struct\s+llama_model_(\w+)\s*:\s*public\s+llama_model_(\w+)")
_LOADER = re.compile(r"\bllama_model_(\w+)::load_arch_tensors\s*\([^)]*\)\s*\{")
_OUTPUT = re.compile(
    r"create_tensor\(\s*tn\(\s*LLM_TENSOR_OUTPUT\s*,\s*\"weight\"\s*\)[^;]*?,\s*([^,;]+?)\s*\)\s*;"
)
_FALLBACK = re.compile(
    r"\boutput\s*=\s*create_tensor\(\s*tn\(\s*LLM_TENSOR_TOKEN_EMBD\s*,\s*\"weight\"\s*\)[^;]*TENSOR_DUPLICATED"
)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _body(text: str, start: int) -> str:
    """The text of the braced block whose opening brace is just before start."""
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
    raise SystemExit(f"unbalanced braces after offset {start}")


def classify(body: str) -> str:
    """The head policy of one load_arch_tensors body (see the module docstring)."""
    flags = {re.sub(r"\s+", "", f) for f in _OUTPUT.findall(body)}
    fallback = bool(_FALLBACK.search(body))
    if not flags:
        return "embedding" if fallback else "none"
    if len(flags) > 1:
        return "conditional"
    (flag,) = flags
    if flag == "TENSOR_NOT_REQUIRED":
        return "falls-back" if fallback else "optional"
    if flag == "0":
        return "conditional" if fallback else "required"
    return "conditional"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="llama.cpp's src folder")
    parser.add_argument("--version", required=True, help="the llama.cpp commit or release read")
    args = parser.parse_args()
    names = dict(_ARCH_NAME.findall(_read(os.path.join(args.src, "llama-arch.cpp"))))
    classes: dict[str, str] = {}
    pending: list[str] = []
    for case, made in _DISPATCH.findall(_read(os.path.join(args.src, "llama-model.cpp"))):
        if case:
            pending.append(case)
        else:
            for arch in pending:
                classes.setdefault(arch, made)
            pending = []
    bodies: dict[str, str] = {}
    models = os.path.join(args.src, "models")
    for file in sorted(os.listdir(models)):
        if file.endswith(".cpp"):
            text = _read(os.path.join(models, file))
            for match in _LOADER.finditer(text):
                bodies[match.group(1)] = _body(text, match.end())
    parents = dict(_PARENT.findall(_read(os.path.join(models, "models.h"))))
    heads: dict[str, str] = {}
    for arch, made in sorted(classes.items()):
        cls = made
        while cls not in bodies and cls in parents:
            cls = parents[cls]
        if arch in names and cls in bodies:
            heads[names[arch]] = classify(bodies[cls])
        else:
            print(f"skipped {arch} (class {made}): no name or no load_arch_tensors", file=sys.stderr)
    table = {"llama_cpp": args.version, "generated_by": "scripts/gen_gguf_heads.py", "heads": heads}
    json.dump(table, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
