"""bfloat16 and float8 held as their unsigned storage bits, with numpy only.

decode() widens the bits to float32 and encode() rounds float16/32/64 values to the bits, each bit
for bit as ml_dtypes does it (tests/test_floats.py holds the two against ml_dtypes): round to
nearest even, and ml_dtypes' own NaN, inf, overflow and -0 rules per format.

encode() works through float32: float16 widens exactly, and float64 narrows with round-to-odd, which
keeps the later rounding a single one: float32 holds at least two more significand bits than each
format here across that format's whole range (bfloat16's subnormals included).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

_CHUNK = 1 << 16
"""Elements per pass: the temporaries stay in cache and never grow with the input."""


def _chunks(
    source: npt.NDArray[Any], out: npt.NDArray[Any]
) -> Iterator[tuple[npt.NDArray[Any], npt.NDArray[Any]]]:
    """Matching 1-D runs of source and out, in C order and at most _CHUNK long.

    A strided or byte-swapped source is copied (into native order) one chunk at a time.
    """
    if source.size == 0:
        return
    iterator = np.nditer(
        [source, out],
        flags=["external_loop", "buffered"],
        op_flags=[["readonly"], ["writeonly"]],
        op_dtypes=[source.dtype.newbyteorder("="), out.dtype],
        casting="equiv",
        buffersize=_CHUNK,
        order="C",
    )
    with iterator:
        yield from iterator


@dataclass(frozen=True, kw_only=True)
class _Format:
    """A narrow format's layout and ml_dtypes' special codes."""

    storage: type[np.unsignedinteger[Any]]
    exp_bits: int
    man_bits: int
    bias: int
    kind: str  # "ieee": inf and NaNs at the top exponent; "fn": no inf; "fnuz": no inf, no -0
    max_code: int  # largest finite positive code
    overflow: int  # what ml_dtypes writes for inf and for a finite value past the largest (positive)
    nan: int  # what ml_dtypes writes for any NaN (positive; the sign is kept unless fnuz)


# Format definitions (OCP / AMD float8 and Google bfloat16), with the codes ml_dtypes writes.
_FORMATS: dict[str, _Format] = {
    "bfloat16": _Format(
        storage=np.uint16,
        exp_bits=8,
        man_bits=7,
        bias=127,
        kind="ieee",
        max_code=0x7F7F,
        overflow=0x7F80,
        nan=0x7FC0,
    ),
    "float8_e4m3fn": _Format(
        storage=np.uint8, exp_bits=4, man_bits=3, bias=7, kind="fn", max_code=0x7E, overflow=0x7F, nan=0x7F
    ),
    "float8_e5m2": _Format(
        storage=np.uint8, exp_bits=5, man_bits=2, bias=15, kind="ieee", max_code=0x7B, overflow=0x7C, nan=0x7E
    ),
    "float8_e4m3fnuz": _Format(
        storage=np.uint8, exp_bits=4, man_bits=3, bias=8, kind="fnuz", max_code=0x7F, overflow=0x80, nan=0x80
    ),
    "float8_e5m2fnuz": _Format(
        storage=np.uint8, exp_bits=5, man_bits=2, bias=16, kind="fnuz", max_code=0x7F, overflow=0x80, nan=0x80
    ),
}

NARROW: frozenset[str] = frozenset(_FORMATS)

_F32_QNAN = 0x7FC00000  # float32's quiet NaN, which ml_dtypes widens every float8 NaN to
_F32_SIGN = 0x80000000


def _format(dtype: str) -> _Format:
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise ValueError(f"not a narrow float type: {dtype!r}") from None


def storage_dtype(dtype: str) -> np.dtype[np.unsignedinteger[Any]]:
    """The unsigned integer dtype that holds a narrow type's bits (uint16 or uint8)."""
    return np.dtype(_format(dtype).storage)


@cache
def _decode_table(dtype: str) -> npt.NDArray[np.uint32]:
    """float32 bits of each of a float8 type's 256 codes, from the format's bit layout."""
    fmt = _format(dtype)
    codes = np.arange(256, dtype=np.int64)
    exp = (codes >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    man = codes & ((1 << fmt.man_bits) - 1)
    significand = man + np.where(exp > 0, 1 << fmt.man_bits, 0)
    magnitude = np.ldexp(significand.astype(np.float64), np.maximum(exp, 1) - fmt.bias - fmt.man_bits)
    sign = (codes >> 7).astype(np.uint32) << 31
    table: npt.NDArray[np.uint32] = magnitude.astype(np.float32).view(np.uint32) | sign
    top = exp == (1 << fmt.exp_bits) - 1
    if fmt.kind == "ieee":
        nan = top & (man != 0)
        table[top & (man == 0)] = 0x7F800000 | sign[top & (man == 0)]
    elif fmt.kind == "fn":
        nan = top & (man == (1 << fmt.man_bits) - 1)
    else:
        nan = codes == 0x80  # its sign bit is set, and ml_dtypes widens it to a negative NaN
    table[nan] = _F32_QNAN | sign[nan]
    table.flags.writeable = False
    return table


def decode(bits: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    """float32 values of narrow-type bits (any shape and strides), exactly as ml_dtypes widens them."""
    fmt = _format(dtype)
    bits = np.asarray(bits)
    if bits.dtype.kind != "u" or bits.dtype.itemsize != np.dtype(fmt.storage).itemsize:
        raise TypeError(f"{dtype} bits must be {np.dtype(fmt.storage).name}, not {bits.dtype}")
    if fmt.storage is np.uint16:
        wide = bits.astype(np.uint32, order="C")
        wide <<= 16  # bfloat16 is the top half of a float32, NaN payloads included
        return wide.view(np.float32)
    table = _decode_table(dtype)
    out = np.empty(bits.shape, dtype=np.uint32)
    for piece, dest in _chunks(bits, out):
        np.take(table, piece, out=dest, mode="clip")
    return out.view(np.float32)


@cache
def _encode_tables(dtype: str) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint8]]:
    """Lookup tables that round float32 bits to a float8 type.

    A float32 is bucketed by its sign, exponent and top man_bits mantissa bits; a bucket holds at
    most one rounding threshold, so the code is pair[2 * bucket + (bits >= threshold[bucket])].
    """
    fmt = _format(dtype)
    shift = 23 - fmt.man_bits
    width = 1 << shift
    finite = _decode_table(dtype)[: fmt.max_code + 1].view(np.float32).astype(np.float64)
    # One step past the largest finite value, had the format gone on: rounding to it overflows.
    steps = np.append(finite, 2 * finite[-1] - finite[-2])
    mids = ((steps[:-1] + steps[1:]) / 2).astype(np.float32)  # exact: float32 has the bits
    # From code k, bits at or past thresholds[k] round up to k + 1 (a tie stays on an even k).
    thresholds = mids.view(np.uint32).astype(np.int64) + (np.arange(mids.size) % 2 == 0)
    starts = np.arange(1 << (8 + fmt.man_bits), dtype=np.int64) << shift
    low = np.searchsorted(thresholds, starts, side="right")  # the code at each bucket's start
    padded = np.append(thresholds, 1 << 32)
    inside = padded[low] < starts + width
    assert np.all(padded[np.minimum(low + 1, mids.size)] >= starts + width)  # at most one
    threshold = np.where(inside, padded[low], starts)
    positive = np.stack([low, low + inside], axis=-1)
    positive[positive > fmt.max_code] = fmt.overflow
    top = 0xFF << fmt.man_bits  # float32's top exponent: inf (to the overflow code), then NaNs
    threshold[top] = 0x7F800001
    positive.reshape(-1)[2 * top + 1 :] = fmt.nan
    negative = positive | 0x80
    if fmt.kind == "fnuz":
        negative[positive == 0] = 0  # no -0: a negative value that rounds to zero is +0
    full_threshold = np.concatenate([threshold, threshold | _F32_SIGN]).astype(np.uint32)
    codes = np.concatenate([positive, negative]).reshape(-1).astype(np.uint8)
    full_threshold.flags.writeable = False
    codes.flags.writeable = False
    return full_threshold, codes


def _bfloat16_from_f32(u: npt.NDArray[np.uint32], dest: npt.NDArray[Any]) -> None:
    """Round float32 bits to bfloat16 (to nearest even; NaN to the quiet NaN, sign kept)."""
    rounded = u >> 16
    rounded &= 1
    rounded += u
    rounded += 0x7FFF
    rounded >>= 16
    dest[...] = rounded
    nan = np.isnan(u.view(np.float32))
    if nan.any():
        dest[nan] = ((u[nan] >> 16) & 0x8000) | 0x7FC0


def _float8_from_f32(u: npt.NDArray[np.uint32], dest: npt.NDArray[Any], dtype: str) -> None:
    """Round float32 bits to a float8 type through the bucket tables."""
    threshold, codes = _encode_tables(dtype)
    bucket = u >> (23 - _format(dtype).man_bits)
    up = u >= np.take(threshold, bucket, mode="clip")
    bucket <<= 1
    bucket += up
    np.take(codes, bucket, out=dest, mode="clip")


def _f32_bits(piece: npt.NDArray[Any]) -> npt.NDArray[np.uint32]:
    """float32 bits of a float16/32/64 chunk; float64 is rounded to odd so one later rounding is exact."""
    if piece.dtype.itemsize == 4:
        return piece.view(np.uint32)
    if piece.dtype.itemsize == 2:
        return piece.astype(np.float32).view(np.uint32)
    narrow = piece.astype(np.float32)
    back = narrow.astype(np.float64).view(np.uint64)
    wide = piece.view(np.uint64)
    u = narrow.view(np.uint32)
    # Same sign on both sides, so comparing bits compares magnitudes: step back toward zero where
    # the cast rounded away, then set the last bit wherever the cast was inexact.
    np.subtract(u, back > wide, out=u, casting="unsafe")
    np.bitwise_or(u, back != wide, out=u, casting="unsafe")
    return u


def encode(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """Narrow-type bits of float16/32/64 values (any shape and strides), exactly as ml_dtypes casts."""
    fmt = _format(dtype)
    values = np.asarray(values)
    if values.dtype.kind != "f" or values.dtype.itemsize not in (2, 4, 8):
        raise TypeError(f"encode takes float16, float32 or float64 values, not {values.dtype}")
    out = np.empty(values.shape, dtype=fmt.storage)
    with np.errstate(over="ignore", invalid="ignore"):  # float64 past float32's range, and sNaNs
        for piece, dest in _chunks(values, out):
            u = _f32_bits(piece)
            if fmt.storage is np.uint16:
                _bfloat16_from_f32(u, dest)
            else:
                _float8_from_f32(u, dest, dtype)
    return out
