"""Limits every tensor a reader returns must meet, so that ``Checkpoint.array`` can view it.

A hostile header can describe a tensor with no bytes at all (a zero dimension) but a shape or
strides no numpy view can hold; readers refuse those here rather than leave them to fail later.
"""

from __future__ import annotations

from collections.abc import Sequence

from tieaudit.core.errors import InputError
from tieaudit.core.limits import NPY_INTP_MAX, bounded_product, shown_dims

MAX_DIMS = 64
"""numpy's limit on dimensions (NPY_MAXDIMS)."""
MAX_BYTES = NPY_INTP_MAX
"""Largest byte extent, stride or offset a numpy view can express (npy_intp)."""


def check_viewable(
    name: str, shape: Sequence[int], strides: Sequence[int], *, itemsize: int, byte_offset: int, path: str
) -> None:
    """Raise InputError unless a numpy view of this shape, strides and offset can exist."""
    if len(shape) > MAX_DIMS:
        count = len(shape)
        raise InputError(f"tensor {name!r} has {count} dimensions; at most {MAX_DIMS} can be viewed", path)
    # numpy checks the size as if empty dimensions were 1; the bound is checked before multiplying.
    extent = bounded_product([itemsize, *(max(dim, 1) for dim in shape)], MAX_BYTES)
    if extent is None or byte_offset > MAX_BYTES or any(abs(s) > MAX_BYTES // itemsize for s in strides):
        shown = shown_dims(shape)
        raise InputError(f"tensor {name!r}: shape or strides too large to address ({shown})", path)
