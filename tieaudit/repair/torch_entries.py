"""Every entry of a ``torch.load`` result by dotted name, and whether two readings of one agree.

retie's and convert's verification compares the reference loader's reading of the output with its
reading of the input entry by entry (``repair.reference``). tieaudit's own tensors are compared a
block of rows at a time there; this module compares what tieaudit does not read as values: the
other tensor kinds (quantized, sparse, nested, meta, complex32, conj- or neg-bit views, ...),
storages, and every non-tensor value (epochs, learning rates, sizes, strings). Tensors are compared
by their stored bits, with the metadata torch rebuilds them from (dtype, shape, layout, device,
requires_grad, conj and neg bits, quantizer). torch is imported by the caller (the torch extra).
"""

from __future__ import annotations

from typing import Any

from tieaudit.core.errors import InputError
from tieaudit.core.escape import quoted
from tieaudit.repair.torch_writer import walk_leaves


def torch_entries(torch: Any, root: Any, path: str) -> dict[str, Any]:
    """Every leaf of root under the reader's dotted name; two leaves of one name are an InputError
    (the reader refuses such a file too: neither may be kept silently)."""
    entries: dict[str, Any] = {}

    def record(name: str, value: Any) -> Any:
        if name in entries:
            raise InputError(f"torch.load gives two entries named {quoted(name)}", path)
        entries[name] = value
        return value

    walk_leaves(torch, root, record)
    return entries


def _plain_bits(torch: Any, tensor: Any) -> Any:
    """The stored bits of a strided tensor as integers, the conj and neg bits not applied."""
    if tensor.is_conj():
        tensor = tensor.conj()  # a view with the bit cleared: the stored values
    if tensor.is_neg():
        tensor = torch._neg_view(tensor)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(tensor.element_size())
    if width is not None:  # a view of the same element size: any strides, any dtype (bits8, int4, ...)
        return tensor.detach().view(width).contiguous()
    return tensor.detach().contiguous().reshape(-1).view(torch.int64)


def _facts(tensor: Any) -> tuple[object, ...]:
    return (
        type(tensor).__name__,
        str(tensor.dtype),
        tuple(tensor.shape) if not tensor.is_nested else None,
        str(tensor.layout),
        tensor.device.type,
        bool(tensor.requires_grad),
        bool(tensor.is_conj()),
        bool(tensor.is_neg()),
    )


def _quantizer(torch: Any, tensor: Any) -> tuple[object, ...]:
    scheme = tensor.qscheme()
    if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return (str(scheme), float(tensor.q_scale()), int(tensor.q_zero_point()))
    return (str(scheme), int(tensor.q_per_channel_axis()))


def _parts(torch: Any, tensor: Any) -> list[Any]:
    """The tensors a tensor of another kind is made of, compared in turn by their bits."""
    layout = tensor.layout
    if tensor.is_quantized:
        channels = (
            []
            if tensor.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric)
            else [
                tensor.q_per_channel_scales(),
                tensor.q_per_channel_zero_points(),
            ]
        )
        return [tensor.int_repr(), *channels]
    if layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    if tensor.is_nested:
        sizes = (tensor._nested_tensor_size(), tensor._nested_tensor_strides())
        return [*sizes, tensor._nested_tensor_storage_offsets(), tensor.values()]
    return [tensor]


def _same_tensor(torch: Any, before: Any, after: Any) -> str | None:
    if _facts(before) != _facts(after):
        return f"is {_facts(after)[:6]} in the output, not {_facts(before)[:6]}"
    if before.is_quantized and _quantizer(torch, before) != _quantizer(torch, after):
        return "has another quantizer in the output"
    if before.layout == torch.sparse_coo and before.is_coalesced() != after.is_coalesced():
        return "is coalesced in one reading only"
    if before.device.type == "meta":
        return None  # no data: the metadata is all there is
    for left, right in zip(_parts(torch, before), _parts(torch, after), strict=True):
        if left.shape != right.shape or not torch.equal(_plain_bits(torch, left), _plain_bits(torch, right)):
            return "holds other bits in the output"
    return None


def _storage_bits(torch: Any, storage: Any) -> Any:
    untyped = storage.untyped() if isinstance(storage, torch.storage.TypedStorage) else storage
    return torch.empty(0, dtype=torch.uint8).set_(untyped, 0, (untyped.nbytes(),), (1,))


def same_entry(torch: Any, before: Any, after: Any) -> str | None:
    """How after (the output's entry) differs from before (the input's): None when it does not."""
    if type(before) is not type(after):
        return f"is a {type(after).__name__} in the output, not a {type(before).__name__}"
    if isinstance(before, torch.Tensor):
        return _same_tensor(torch, before, after)
    if isinstance(before, (torch.storage.TypedStorage, torch.storage.UntypedStorage)):
        typed = isinstance(before, torch.storage.TypedStorage)
        if typed and before.dtype != after.dtype:
            return "is a storage of another dtype in the output"
        if not torch.equal(_storage_bits(torch, before), _storage_bits(torch, after)):
            return "holds other bytes in the output"
        return None
    if isinstance(before, (float, complex)):  # NaN equals itself here; -0.0 is not 0.0
        return None if repr(before) == repr(after) else "holds another value in the output"
    return None if before == after else "holds another value in the output"
