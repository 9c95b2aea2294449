"""The ONNX inputs of bench/scale.py: a GPT-2-like graph whose lm_head is a copy of the embedding
(equal, read through a Transpose node; or stored transposed, as TorchScript export writes it).

Embedded models are built in memory and saved by onnx (they are under 2 GB). External-data models
are larger than a protobuf can hold: their data file is streamed tensor by tensor (each tensor's
values generated in chunks, the head replaying the embedding's stream) and the model holds only
the references, so generating one needs little memory whatever its size."""

from __future__ import annotations

import math
import os
import shutil
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from scale_inputs import ONNX_EMBED, ONNX_HEAD, Input

if TYPE_CHECKING:
    import onnx


CHUNK = 1 << 22
"""float32 values generated per step when streaming external data (16 MiB)."""


def _values(rng_seed: int, count: int, transpose_of: tuple[int, int] | None = None) -> Iterator[bytes]:
    """count N(0, 0.02) float32 values of one stream as bytes, in chunks; transpose_of=(rows, cols):
    the stream's matrix written transposed (the whole matrix in memory: only the embedding's)."""
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    if transpose_of is not None:
        matrix = rng.standard_normal(count, dtype=np.float32).reshape(transpose_of) * np.float32(0.02)
        yield np.ascontiguousarray(matrix.T).tobytes()
        return
    for start in range(0, count, CHUNK):
        values = rng.standard_normal(min(CHUNK, count - start), dtype=np.float32)
        values *= np.float32(0.02)
        yield values.tobytes()


def _layout(inp: Input) -> list[tuple[str, tuple[int, ...], int, bool]]:
    """(name, shape, stream seed, transposed) of every initializer, in file order."""
    vocab, hidden, layers = (int(inp.extra[k]) for k in ("vocab", "hidden", "layers"))  # type: ignore[call-overload]
    seed = zlib.crc32(inp.key.encode())
    transposed = inp.extra.get("head") == "transposed"
    head = (ONNX_HEAD, (hidden, vocab) if transposed else (vocab, hidden), seed, transposed)
    found = [(ONNX_EMBED, (vocab, hidden), seed, False), head]
    for i in range(layers):
        found.append((f"transformer.h.{i}.mlp.c_fc.weight", (hidden, 4 * hidden), seed + 2 * i + 1, False))
        found.append((f"transformer.h.{i}.mlp.c_proj.weight", (4 * hidden, hidden), seed + 2 * i + 2, False))
    return found


def _graph(inp: Input, initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    vocab, layers = int(inp.extra["vocab"]), int(inp.extra["layers"])  # type: ignore[call-overload]
    transposed = inp.extra.get("head") == "transposed"
    nodes = [helper.make_node("Gather", [ONNX_EMBED, "input_ids"], ["h0"])]
    for i in range(layers):
        fc, proj = f"transformer.h.{i}.mlp.c_fc.weight", f"transformer.h.{i}.mlp.c_proj.weight"
        nodes += [
            helper.make_node("MatMul", [f"h{i}", fc], [f"fc{i}"]),
            helper.make_node("Relu", [f"fc{i}"], [f"act{i}"]),
            helper.make_node("MatMul", [f"act{i}", proj], [f"proj{i}"]),
            helper.make_node("Add", [f"h{i}", f"proj{i}"], [f"h{i + 1}"]),
        ]
    if transposed:
        nodes.append(helper.make_node("MatMul", [f"h{layers}", ONNX_HEAD], ["logits"]))
    else:
        nodes += [
            helper.make_node("Transpose", [ONNX_HEAD], ["lm_head.t"], perm=[1, 0]),
            helper.make_node("MatMul", [f"h{layers}", "lm_head.t"], ["logits"]),
        ]
    graph = helper.make_graph(
        nodes,
        "gpt",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench/scale")


def build_onnx(folder: str, inp: Input) -> None:
    """Embedded: built in memory, saved by onnx. External: the data file streamed, then the model."""
    import onnx
    from onnx import TensorProto, helper

    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    target = os.path.join(partial, "model.onnx")
    initializers = []
    if inp.form == "onnx-ext":
        with open(target + ".data", "wb") as data:
            for name, shape, seed, transposed in _layout(inp):
                offset = data.tell()
                for chunk in _values(seed, math.prod(shape), shape[::-1] if transposed else None):
                    data.write(chunk)
                tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
                tensor.data_location = TensorProto.EXTERNAL
                entries = {"location": "model.onnx.data", "offset": offset, "length": data.tell() - offset}
                for key, value in entries.items():
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, str(value)
                initializers.append(tensor)
        onnx.save_model(_graph(inp, initializers), target)
    else:
        for name, shape, seed, transposed in _layout(inp):
            raw = b"".join(_values(seed, math.prod(shape), shape[::-1] if transposed else None))
            initializers.append(helper.make_tensor(name, TensorProto.FLOAT, shape, raw, raw=True))
        onnx.save_model(_graph(inp, initializers), target)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
