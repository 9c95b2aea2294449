"""The ONNX inputs of bench/scale.py: a GPT-2-like graph whose lm_head is an equal copy of the embedding."""

from __future__ import annotations

import math
import os
import shutil
import zlib

from scale_inputs import ONNX_EMBED, ONNX_HEAD, Input


def build_onnx(folder: str, inp: Input) -> None:
    """Gather on the embedding, MatMul-Relu-MatMul-Add layers, lm_head = Transpose(equal copy)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    vocab, hidden, layers = (int(inp.extra[k]) for k in ("vocab", "hidden", "layers"))  # type: ignore[call-overload]
    rng = np.random.default_rng(zlib.crc32(inp.key.encode()))

    def initializer(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        values = rng.standard_normal(math.prod(shape), dtype=np.float32)
        values *= np.float32(0.02)
        return helper.make_tensor(name, TensorProto.FLOAT, shape, values.tobytes(), raw=True)

    embed = initializer(ONNX_EMBED, (vocab, hidden))
    head = helper.make_tensor(ONNX_HEAD, TensorProto.FLOAT, (vocab, hidden), embed.raw_data, raw=True)
    inits = [embed, head]
    nodes = [helper.make_node("Gather", [ONNX_EMBED, "input_ids"], ["h0"])]
    for i in range(layers):
        fc, proj = f"transformer.h.{i}.mlp.c_fc.weight", f"transformer.h.{i}.mlp.c_proj.weight"
        inits += [initializer(fc, (hidden, 4 * hidden)), initializer(proj, (4 * hidden, hidden))]
        nodes += [
            helper.make_node("MatMul", [f"h{i}", fc], [f"fc{i}"]),
            helper.make_node("Relu", [f"fc{i}"], [f"act{i}"]),
            helper.make_node("MatMul", [f"act{i}", proj], [f"proj{i}"]),
            helper.make_node("Add", [f"h{i}", f"proj{i}"], [f"h{i + 1}"]),
        ]
    nodes += [
        helper.make_node("Transpose", [ONNX_HEAD], ["lm_head.t"], perm=[1, 0]),
        helper.make_node("MatMul", [f"h{layers}", "lm_head.t"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gpt",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench/scale")
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    target = os.path.join(partial, "model.onnx")
    if inp.form == "onnx-ext":
        onnx.save_model(
            model,
            target,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
        )
    else:
        onnx.save_model(model, target)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
