"""The inputs of bench/scale.py: what each one holds (pure data) and how it is generated.

Forms (each at two sizes, so the report shows how cost grows):
  folder    Llama-8B-shaped Hugging Face folder, bf16 shards + index, lm_head an untied byte copy
  sparse    Llama-70B-shaped folder as sparse files: every header, hundreds of tensors, tens of
            shards, but only the first HEAD_BYTES of each tensor written (the rest are holes)
  onnx      GPT-2-like ONNX, weights embedded in the protobuf, lm_head an equal copy of the embedding;
            and the larger one with lm_head stored transposed, as TorchScript export writes it
  onnx-ext  GPT-2-like ONNX with external data (model.onnx + model.onnx.data) past the 2 GB a
            protobuf can hold (why external data exists), the data file streamed to disk
  count     one safetensors file with 1,000 and one with 10,000 small tensors, same total bytes

Generation runs in a child process (`python bench/scale_inputs.py --ensure KEY...`) so the
measuring harness never imports numpy or onnx. Every input is cached under bench/out/scale/ with
a recipe beside it and rebuilt when the recipe changes (or with --force).

Also the child side of the sha512 baseline: `--sha512 PATH` hashes every tensor of a safetensors
file or folder (numpy memmap at the header offsets, as bench/detect.py) or of an ONNX model
(every initializer's bytes after onnx.load, external data loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field

from common import (
    GENERATOR_VERSION,
    OUT_DIR,
    TensorSpec,
    file_size,
    llama_specs,
    read_safetensors_header,
    write_safetensors,
)

SCALE_DIR = os.path.join(OUT_DIR, "scale")
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
ONNX_EMBED, ONNX_HEAD = "transformer.wte.weight", "lm_head.weight"
HEAD_BYTES = 4096
"""Bytes written at the start of each random tensor of a sparse file: its values, so no such tensor
reads as constant (an all-zero one is, and check would then scan each in full: holes included)."""
ST_METADATA = {"format": "pt"}
FORMS = ("folder", "sparse", "onnx", "onnx-ext", "count")


@dataclass(frozen=True)
class Llama:
    """Widths of a Llama-shaped folder."""

    hidden: int
    intermediate: int
    vocab: int
    layers: int
    heads: int
    kv_heads: int

    def specs(self, copy_head: bool = True) -> list[TensorSpec]:
        """The state dict; lm_head a byte copy of the embedding, or (copy_head False) its own values."""
        kv = self.kv_heads * (self.hidden // self.heads)
        specs = llama_specs(self.layers, self.hidden, self.intermediate, self.vocab, kv_hidden=kv)
        if not copy_head:
            specs[-1] = TensorSpec(HEAD, specs[-1].shape)
        return specs

    def config(self) -> dict[str, object]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-05,
            "rope_theta": 500000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }


@dataclass(frozen=True, kw_only=True)
class Input:
    """One generated input: where it is, what it holds, what check must find in it."""

    key: str
    form: str
    path: str
    """What the commands get: a folder, a .safetensors file or a model.onnx."""
    files: list[str]
    """Every file holding its bytes (what cat reads)."""
    nbytes: int
    """Apparent size of those files."""
    tensors: int
    recipe: dict[str, object]
    expected: tuple[str, str] | None
    """The pair check must report as TIE001 (exactly that finding), or None: no finding at all."""
    wasted: int = 0
    relation: str = "equal"
    """The relation of the planted pair (equal, or transposed for a TorchScript-like head)."""
    shards: int = 1
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def is_onnx(self) -> bool:
        return self.form.startswith("onnx")

    @property
    def sparse(self) -> bool:
        return self.form == "sparse"


# --------------------------------------------------------------------------- recipes (pure)


def split_shards(specs: list[TensorSpec], count: int) -> list[list[TensorSpec]]:
    """Consecutive groups of about total/count bytes each (a tensor never straddles two shards)."""
    target = sum(s.nbytes for s in specs) / count
    shards: list[list[TensorSpec]] = [[]]
    filled = 0
    for spec in specs:
        if shards[-1] and filled + spec.nbytes / 2 > target * len(shards) and len(shards) < count:
            shards.append([])
        shards[-1].append(spec)
        filled += spec.nbytes
    return shards


def shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def folder_input(key: str, form: str, shape: Llama, *, shards: int, root: str = SCALE_DIR) -> Input:
    sparse = form == "sparse"
    # In a sparse folder a copy would be equal holes too, and comparing them reads gigabytes of
    # zeros: that form is an untied model (as Llama-70B is), with no finding.
    specs = shape.specs(copy_head=not sparse)
    groups = split_shards(specs, shards)
    folder = os.path.join(root, key)
    files = [os.path.join(folder, shard_name(i, len(groups))) for i in range(len(groups))]
    recipe = {
        "generator": GENERATOR_VERSION,
        "form": form,
        "config": shape.config(),
        "head_bytes": HEAD_BYTES if sparse else None,
        "holes": "random tensors past head_bytes; constant ones written in full" if sparse else None,
        "shards": [[[s.name, list(s.shape), s.fill, s.stream] for s in g] for g in groups],
    }
    return Input(
        key=key,
        form=form,
        path=folder,
        files=files,
        nbytes=sum(file_size(g, ST_METADATA) for g in groups),
        tensors=len(specs),
        recipe=recipe,
        expected=None if sparse else (EMBED, HEAD),
        wasted=0 if sparse else specs[0].nbytes,
        shards=len(groups),
        extra={"shape": asdict(shape)},
    )


def onnx_input(
    key: str,
    *,
    vocab: int,
    hidden: int,
    layers: int,
    external: bool,
    head: str = "equal",
    root: str = SCALE_DIR,
) -> Input:
    """head: "equal" (lm_head a copy of the embedding, read through Transpose) or "transposed"
    (lm_head stored as the embedding's transpose, read by MatMul directly: TorchScript's export)."""
    folder = os.path.join(root, key)
    model = os.path.join(folder, "model.onnx")
    weights = 4 * (2 * vocab * hidden + layers * 2 * hidden * 4 * hidden)
    recipe = {
        "generator": GENERATOR_VERSION,
        "vocab": vocab,
        "hidden": hidden,
        "layers": layers,
        "external": external,
        "head": head,
        "streamed": external,  # external data is written tensor by tensor, never whole in memory
    }
    return Input(
        key=key,
        form="onnx-ext" if external else "onnx",
        path=model,
        files=[model, model + ".data"] if external else [model],
        nbytes=weights,  # the recipe's estimate; the cached files' real size is read by the harness
        tensors=2 + 2 * layers,
        recipe=recipe,
        expected=(ONNX_EMBED, ONNX_HEAD),
        wasted=4 * vocab * hidden,
        relation=head,
        extra={"vocab": vocab, "hidden": hidden, "layers": layers, "head": head},
    )


def count_specs(count: int, rows: int, width: int) -> list[TensorSpec]:
    """count random [rows, width] tensors, the last an untied byte copy of the first."""
    specs = [TensorSpec(EMBED, (rows, width))]
    specs += [TensorSpec(f"model.layers.{i}.weight", (rows, width)) for i in range(count - 2)]
    return [*specs, TensorSpec(HEAD, (rows, width), stream=EMBED)]


def count_input(key: str, *, count: int, rows: int, width: int, root: str = SCALE_DIR) -> Input:
    specs = count_specs(count, rows, width)
    path = os.path.join(root, f"{key}.safetensors")
    return Input(
        key=key,
        form="count",
        path=path,
        files=[path],
        nbytes=file_size(specs, ST_METADATA),
        tensors=count,
        recipe={"generator": GENERATOR_VERSION, "count": count, "rows": rows, "width": width},
        expected=(EMBED, HEAD),
        wasted=specs[0].nbytes,
    )


LLAMA_8B = Llama(hidden=4096, intermediate=14336, vocab=128256, layers=20, heads=32, kv_heads=8)
LLAMA_70B = Llama(hidden=8192, intermediate=28672, vocab=128256, layers=80, heads=64, kv_heads=8)


def _quarter(shape: Llama, layers: int) -> Llama:
    """Every width / 4 (bytes / 16), the same layer count: --small keeps tensor and shard counts."""
    return Llama(
        shape.hidden // 4, shape.intermediate // 4, shape.vocab // 4, layers, shape.heads // 4, shape.kv_heads
    )


def plan(small: bool = False, root: str = SCALE_DIR) -> list[Input]:
    """Every input, largest of each form first. small: bytes / ~16, tensor and shard counts kept."""

    def widths(shape: Llama, layers: int) -> Llama:
        return _quarter(shape, layers) if small else Llama(**{**asdict(shape), "layers": layers})

    tag = "-small" if small else ""
    d, v = (512, 50257 // 4) if small else (2048, 50257)
    half_d = d // 2
    rows = max(1, (10 if small else 160) * 10**6 // (10_000 * 2 * 1024))  # of each of 10k tensors
    return [
        folder_input(f"llama8b-20l{tag}", "folder", widths(LLAMA_8B, 20), shards=3, root=root),
        folder_input(f"llama8b-8l{tag}", "folder", widths(LLAMA_8B, 8), shards=2, root=root),
        folder_input(f"llama70b-80l{tag}", "sparse", widths(LLAMA_70B, 80), shards=30, root=root),
        folder_input(f"llama70b-40l{tag}", "sparse", widths(LLAMA_70B, 40), shards=15, root=root),
        onnx_input(f"gpt-onnx-8l{tag}", vocab=v, hidden=d, layers=8, external=False, root=root),
        onnx_input(f"gpt-onnx-3l{tag}", vocab=v, hidden=half_d, layers=3, external=False, root=root),
        onnx_input(
            f"gpt-onnx-8l-t{tag}", vocab=v, hidden=d, layers=8, external=False, head="transposed", root=root
        ),
        onnx_input(f"gpt-onnx-40l-ext{tag}", vocab=v, hidden=d, layers=40, external=True, root=root),
        onnx_input(f"gpt-onnx-16l-ext{tag}", vocab=v, hidden=d, layers=16, external=True, root=root),
        count_input(f"tensors-10k{tag}", count=10_000, rows=rows, width=1024, root=root),
        count_input(f"tensors-1k{tag}", count=1_000, rows=10 * rows, width=1024, root=root),
    ]


# --------------------------------------------------------------------------- generation (child side)


def _stamp(inp: Input) -> str:
    return inp.path.rstrip("/").removesuffix("/model.onnx") + ".recipe.json"


def cached(inp: Input) -> bool:
    """The input exists as its recipe says (recipe stamp equal, every file present)."""
    stamp = _stamp(inp)
    if not os.path.exists(stamp) or not all(os.path.exists(f) for f in inp.files):
        return False
    with open(stamp) as handle:
        return bool(json.load(handle) == inp.recipe)


def ensure(inp: Input, force: bool = False) -> bool:
    """Generate inp unless cached; True when it was (re)generated."""
    if not force and cached(inp):
        return False
    if inp.form == "count":
        count, rows, width = (int(inp.recipe[k]) for k in ("count", "rows", "width"))  # type: ignore[call-overload]
        write_safetensors(inp.path, count_specs(count, rows, width), ST_METADATA)
    elif inp.is_onnx:
        from scale_onnx import build_onnx  # imports onnx: only when an ONNX input is generated

        build_onnx(os.path.dirname(inp.path), inp)
    else:
        build_folder(inp)
    with open(_stamp(inp), "w") as handle:
        json.dump(inp.recipe, handle)
    return True


def build_folder(inp: Input) -> None:
    """config.json, the shards (streamed; sparse past HEAD_BYTES for the sparse form), the index."""
    partial = inp.path + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    head = HEAD_BYTES if inp.sparse else None
    weight_map: dict[str, str] = {}
    total = 0
    shards = inp.recipe["shards"]
    assert isinstance(shards, list)
    for index, group in enumerate(shards):
        specs = [TensorSpec(name, tuple(shape), fill, stream) for name, shape, fill, stream in group]
        name = shard_name(index, len(shards))
        write_safetensors(os.path.join(partial, name), specs, ST_METADATA, head_bytes=head)
        weight_map.update(dict.fromkeys((s.name for s in specs), name))
        total += sum(s.nbytes for s in specs)
    with open(os.path.join(partial, "config.json"), "w") as handle:
        json.dump(inp.recipe["config"], handle, indent=2)
    with open(os.path.join(partial, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=2)
    shutil.rmtree(inp.path, ignore_errors=True)
    os.replace(partial, inp.path)


# --------------------------------------------------------------------------- sha512 baseline (child side)


def shard_files(path: str) -> list[str]:
    """The .safetensors files of a folder, or [path] for a file."""
    if not os.path.isdir(path):
        return [path]
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


def sha512_groups(path: str) -> dict[str, object]:
    """sha512 of every tensor (every shard of a folder, or every ONNX initializer), grouped by digest."""
    import hashlib

    digests: dict[bytes, list[str]] = {}
    if path.endswith(".onnx"):
        import onnx
        from onnx import numpy_helper

        for init in onnx.load(path).graph.initializer:
            data = init.raw_data or numpy_helper.to_array(init).tobytes()
            digests.setdefault(hashlib.sha512(data).digest(), []).append(init.name)
    else:
        import numpy as np

        for name in shard_files(path):
            start, header = read_safetensors_header(name)
            mapped = np.memmap(name, dtype=np.uint8, mode="r")
            for tensor, info in header.items():
                begin, end = info["data_offsets"]  # type: ignore[misc]
                digest = hashlib.sha512(mapped[start + begin : start + end].data).digest()
                digests.setdefault(digest, []).append(tensor)
    groups = sorted((g for g in digests.values() if len(g) > 1), key=lambda g: (-len(g), g))
    return {
        "baseline": "sha512",
        "tensors": sum(len(g) for g in digests.values()),
        "duplicate_groups": groups,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ensure", nargs="+", metavar="KEY", help="generate these inputs unless cached")
    parser.add_argument("--small", action="store_true", help="the scaled-down inputs")
    parser.add_argument("--force", action="store_true", help="regenerate even when cached")
    parser.add_argument("--sha512", metavar="PATH", help="print the sha512 baseline's groups as JSON")
    parser.add_argument("--headers", metavar="PATH", help="read every shard's header (a header-only floor)")
    args = parser.parse_args(argv)
    if args.sha512:
        print(json.dumps(sha512_groups(args.sha512)))
        return 0
    if args.headers:
        print(
            json.dumps(
                {"tensors": sum(len(read_safetensors_header(f)[1]) for f in shard_files(args.headers))}
            )
        )
        return 0
    by_key = {inp.key: inp for inp in plan(args.small)}
    for key in args.ensure or []:
        generated = ensure(by_key[key], args.force)
        print(json.dumps({"key": key, "generated": generated}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
