"""Arithmetic on sizes taken from files, bounded before it happens.

A shape read from a file can hold integers of thousands of digits; multiplied together they
take seconds to compute and cannot even be printed (Python's int-to-str limit is 4300 digits).
Every product of sizes from input goes through ``bounded_product``, which checks the bound
before each multiplication, so no intermediate ever grows past it.
"""

from __future__ import annotations

from collections.abc import Iterable

U64_MAX = 2**64 - 1
"""Largest value of a u64 field (safetensors dims and offsets, zip64 sizes)."""
NPY_INTP_MAX = 2**63 - 1
"""Largest element count, byte extent, stride or offset a numpy view can express (npy_intp)."""


def bounded_product(factors: Iterable[int], bound: int) -> int | None:
    """The product of non-negative factors, left to right, or None as soon as a factor or a partial
    product would exceed bound (a later zero does not undo that: Rust's ``checked_mul`` fold, which
    the safetensors library uses, fails the same way)."""
    product = 1
    for factor in factors:
        if factor > bound or (factor and product > bound // factor):
            return None
        product *= factor
    return product


def shown_int(value: int) -> str:
    """value for a message: digits when it fits 64 bits, its size otherwise (str() of an int past
    4300 digits raises, and one of 4000 would fill the line)."""
    return str(value) if value.bit_length() <= 64 else f"<a {value.bit_length()}-bit number>"


def shown_dims(shape: Iterable[int], limit: int = 8) -> str:
    """A shape for a message, like ``[16, 4]``, at most limit dimensions shown."""
    dims = list(shape)
    more = ", ..." if len(dims) > limit else ""
    return "[" + ", ".join(shown_int(dim) for dim in dims[:limit]) + more + "]"
