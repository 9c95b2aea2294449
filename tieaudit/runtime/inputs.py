"""The synthetic inputs the runtime probe feeds: shapes from the model and ``--dim``, sizes capped before use.

A graph input's shape comes from the file: a fixed size (``dim_value``) or a symbolic name
(``dim_param``) resolved with ``--dim``. Both are checked here, in the parent, before the probe
allocates anything: an 81-byte model declaring a 20000x20000 input is refused in one line instead
of costing gigabytes of memory and tens of seconds of random numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tieaudit.core.errors import InputError, UsageError
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint
from tieaudit.core.units import human_bytes
from tieaudit.formats.onnx_consumers import is_op
from tieaudit.formats.onnx_model import ONNX_DTYPES

if TYPE_CHECKING:
    from onnx import ModelProto, ValueInfoProto

PASS_THROUGH = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast", "Expand", "Slice"}
"""Operators an id tensor flows through unchanged in value on its way to a Gather."""
DEFAULT_DIMS = {"batch": 1, "sequence": 8}
"""Sizes of symbolic dimensions: names containing batch -> batch, seq or len -> sequence, others 1."""
MAX_INPUT_BYTES = 256 << 20
"""One synthetic input: 64x a 1x3x1024x1024 float32 image, 4096x a 4096-token id batch."""
MAX_TOTAL_INPUT_BYTES = 1 << 30
"""All synthetic inputs together: the probe holds every one in memory for the whole run."""
MAX_INPUTS = 10_000
"""Graph inputs the probe fills: a decoder with past keys and values has two per layer (~260 for 128)."""
MAX_INPUT_RANK = 64
"""Dimensions of one input: numpy's own limit (NPY_MAXDIMS)."""


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """A synthetic model input the probe builds."""

    name: str
    """Graph input name."""
    dtype: str
    """numpy dtype name."""
    shape: tuple[int, ...]
    """Concrete shape (symbolic dimensions resolved)."""
    fill: str
    """ids (uniform in [0, high)), ones (masks), positions, normal (floats) or zeros."""
    high: int | None = None
    """For ids: the vocabulary size (rows of the Gather table the ids index)."""
    nbytes: int = 0
    """Bytes of the array (checked against MAX_INPUT_BYTES before the probe builds it)."""


Readers = Mapping[str, list[tuple[str, int, str, tuple[str, ...]]]]
"""Value name -> (op type, input slot, the node's first input, its outputs) of each standard-domain reader."""


def _readers(model: ModelProto) -> Readers:
    """Built once per model, each node's outputs shared by its slots: linear in the graph's edges."""
    readers: dict[str, list[tuple[str, int, str, tuple[str, ...]]]] = defaultdict(list)
    for node in model.graph.node:
        op_type = node.op_type if is_op(node, node.op_type) else ""  # standard domain only
        outputs = tuple(node.output)
        first = node.input[0] if node.input else ""
        for slot, value in enumerate(node.input):
            readers[value].append((op_type, slot, first, outputs))
    return readers


def _vocabulary(
    readers: Readers, ckpt: Checkpoint, tables: Mapping[str, int], *, input_name: str
) -> int | None:
    """Rows of the smallest Gather table the input's values index, following shape-only ops."""
    found: list[int] = []
    seen, pending = {input_name}, [input_name]
    while pending:
        value = pending.pop()
        for op_type, slot, first, outputs in readers.get(value, ()):
            table = ckpt.aliases.get(first, first)
            if op_type == "Gather" and slot == 1 and table in tables:
                found.append(tables[table])
            elif op_type in PASS_THROUGH and slot == 0:
                pending += [o for o in outputs if o not in seen]
                seen.update(outputs)
    return min(found) if found else None


def _dim_size(param: str, dims: Mapping[str, int]) -> tuple[int, str | None]:
    """The size of a symbolic dimension, and the --dim name that sets it (None: none does, it is 1)."""
    lowered = param.lower()
    if param in dims:
        return dims[param], param
    if "batch" in lowered:
        return dims.get("batch", DEFAULT_DIMS["batch"]), "batch"
    if "seq" in lowered or "len" in lowered:
        return dims.get("sequence", DEFAULT_DIMS["sequence"]), "sequence"
    return 1, None


def input_specs(
    model: ModelProto, ckpt: Checkpoint, dims: Mapping[str, int], *, path: str | None = None
) -> tuple[InputSpec, ...]:
    """Synthetic inputs for every graph input that is not an initializer, each within the size limits.

    Raises InputError for a shape the model declares over a limit, UsageError when --dim makes one
    so or names no symbolic dimension of the model.
    """
    initializers = {init.name for init in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in initializers]
    if len(values) > MAX_INPUTS:
        raise InputError(
            f"the model has {len(values)} graph inputs, more than the {MAX_INPUTS} a probe fills", path
        )
    readers = _readers(model)
    tables = {t.name: t.shape[0] for t in ckpt.tensors if t.shape}
    used: set[str] = set()
    settable: dict[str, None] = {}  # --dim names that set a dimension above 1, in input order
    specs = []
    total = 0
    for value in values:
        spec = _spec(value, dims, path, used=used, settable=settable)
        total += spec.nbytes
        if total > MAX_TOTAL_INPUT_BYTES:
            error = UsageError if any(k in dims for k in settable) else InputError
            raise error(
                f"the synthetic inputs would take {human_bytes(total)} or more together, over the "
                f"{human_bytes(MAX_TOTAL_INPUT_BYTES)} they may take in all; {_shrink(settable, one=False)}",
                path,
            )
        specs.append(_fill(spec, readers, ckpt, tables=tables))
    unknown = sorted(set(dims) - used)
    if unknown:
        raise UsageError(_unknown_dims(unknown, values), path)
    return tuple(specs)


def _unknown_dims(unknown: list[str], values: list[ValueInfoProto]) -> str:
    params = sorted(
        {d.dim_param for v in values for d in v.type.tensor_type.shape.dim if d.HasField("dim_param")}
    )
    shown = ", ".join(printable(p) for p in params[:20]) + (", ..." if len(params) > 20 else "")
    has = f"its symbolic dimensions: {shown}" if params else "every input size is fixed in the model"
    names = ", ".join(f"--dim {printable(n)}" for n in unknown)
    return (
        f"{names} names no symbolic dimension of the model ({has}; --dim batch and --dim sequence "
        "set those whose names contain batch, and seq or len)"
    )


def _shrink(settable: Mapping[str, None], one: bool) -> str:
    """How the user makes one input (or all) smaller: the --dim names that set their dimensions, if any."""
    if not settable:
        fixed = "its shape" if one else "their shapes"
        return f"the model fixes {fixed} (--dim sets only symbolic dimensions)"
    sizes = ", ".join(f"--dim {printable(k)}=N" for k in settable)
    return f"give {'it' if one else 'them'} smaller sizes with {sizes}"


def _spec(
    value: ValueInfoProto,
    dims: Mapping[str, int],
    path: str | None,
    *,
    used: set[str],
    settable: dict[str, None],
) -> InputSpec:
    """Name, dtype and resolved shape of one input, its size checked before anything is allocated.

    Adds to used the --dim names it applied, to settable those that set a dimension above 1.
    """
    import numpy as np
    import onnx

    name = printable(value.name)
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise UsageError(f"input '{name}' is not a tensor; synthetic inputs cannot be built for it", path)
    type_name = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
    dtype = ONNX_DTYPES.get(type_name)
    if dtype is None or dtype.startswith(("bfloat", "float8", "complex")):
        raise UsageError(
            f"input '{name}' has type {type_name}; synthetic inputs cannot be built for it", path
        )
    declared = tensor_type.shape.dim
    if len(declared) > MAX_INPUT_RANK:
        raise InputError(f"input '{name}' has {len(declared)} dimensions, more than {MAX_INPUT_RANK}", path)
    shape: list[int] = []
    mine: dict[str, None] = {}  # the --dim names that set a dimension of this input above 1
    for dim in declared:
        if dim.HasField("dim_value"):
            if dim.dim_value < 0:
                raise InputError(f"input '{name}' declares a negative size ({dim.dim_value})", path)
            shape.append(dim.dim_value)
            continue
        size, key = _dim_size(dim.dim_param, dims)
        shape.append(size)
        if key is not None and key in dims:
            used.add(key)
        if key is not None and size > 1:
            mine[key] = None
    settable.update(mine)
    itemsize = np.dtype(dtype).itemsize
    nbytes = _checked_bytes(shape, itemsize)
    if nbytes is None:
        total = itemsize * math.prod(shape)  # <= 64 dims of < 2**63 each: a few hundred digits at most
        shown = human_bytes(total) if total < 1 << 50 else "over 1 PiB"
        error = UsageError if any(k in dims for k in mine) else InputError
        raise error(
            f"input '{name}' would be {'x'.join(map(str, shape))} {dtype} ({shown}), over the "
            f"{human_bytes(MAX_INPUT_BYTES)} a synthetic input may take; {_shrink(mine, one=True)}",
            path,
        )
    return InputSpec(name=value.name, dtype=dtype, shape=tuple(shape), fill="", nbytes=nbytes)


def _checked_bytes(shape: list[int], itemsize: int) -> int | None:
    """Bytes of an array of this shape, or None when over MAX_INPUT_BYTES (checked before each multiply)."""
    if 0 in shape:
        return 0
    nbytes = itemsize
    for size in shape:
        if size > MAX_INPUT_BYTES // nbytes:
            return None
        nbytes *= size
    return nbytes


def _fill(spec: InputSpec, readers: Readers, ckpt: Checkpoint, *, tables: Mapping[str, int]) -> InputSpec:
    """How the probe fills the input: noise for floats, ids below the vocabulary, ones for masks."""
    lowered = spec.name.lower()
    if spec.dtype.startswith(("float", "double")):
        fill, high = "normal", None
    else:
        high = _vocabulary(readers, ckpt, tables, input_name=spec.name) if spec.dtype != "bool" else None
        named = "ones" if "mask" in lowered else "positions" if "position" in lowered else "zeros"
        fill = "ids" if high else named
    return InputSpec(
        name=spec.name, dtype=spec.dtype, shape=spec.shape, fill=fill, high=high or None, nbytes=spec.nbytes
    )
