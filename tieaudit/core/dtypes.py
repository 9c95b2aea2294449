"""Canonical dtype names (torch spelling) and their numpy equivalents.

Every reader maps its format's dtype to one of these names, so the graph, the detector and the
report speak one vocabulary. bfloat16 and float8 arrays hold their bits (uint16, uint8): numpy has
no such types, and ml_dtypes, which has, costs 0.75 s to import; ``values`` and ``cast`` decode and
round them with numpy alone (``core.floats``), bit for bit as ml_dtypes does.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from tieaudit.core.floats import NARROW, decode, encode, storage_dtype

ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}

FLOATS = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    }
)

GGML_BLOCK_TYPES = frozenset(
    {
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
        "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M",
        "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0",
    }
)  # fmt: skip
"""GGML's block-quantized types (``gguf.GGMLQuantizationType``, block size above 1): no numpy dtype
holds them, and tieaudit never dequantizes. A GGUF tensor of one is recorded under the type's name
as raw bytes: itemsize 1, shape (rows..., bytes per row), compared byte for byte with a tensor of
the same type and never cast or transposed (tests/test_gguf.py holds the list against gguf's)."""


def itemsize(dtype: str) -> int:
    """Bytes per element of a canonical dtype name (1 for a GGML block type: its raw bytes)."""
    return 1 if dtype in GGML_BLOCK_TYPES else ITEMSIZE[dtype]


@cache
def to_numpy(dtype: str) -> np.dtype[np.generic]:
    """The numpy dtype arrays of a canonical dtype have: its own, the bits' unsigned type for
    bfloat16 and float8 (``values`` gives their values), bytes for a GGML block type."""
    if dtype in GGML_BLOCK_TYPES:
        return np.dtype("u1")
    if dtype in NARROW:
        bits: np.dtype[np.generic] = storage_dtype(dtype)
        return bits
    return np.dtype(dtype)


def values(array: np.ndarray, dtype: str) -> np.ndarray:
    """The values of an array of a canonical dtype: bfloat16 and float8 bits decoded to float32
    (exactly), any other array as it is."""
    if dtype in NARROW:
        return decode(array.view(storage_dtype(dtype)), dtype)
    return array


def cast(array: np.ndarray, source: str, target: str) -> np.ndarray:
    """An array of dtype source cast to target as torch's ``.to()`` and ml_dtypes' ``astype`` cast
    (round to nearest even; out of range: inf or NaN, as the target type has), as target's array
    (bits for bfloat16 and float8)."""
    wide = values(array, source)
    if target in NARROW:
        return encode(wide, target)
    with np.errstate(all="ignore"):  # overflow to inf is an answer here, not a warning
        return wide.astype(to_numpy(target))


def uint_view_dtype(dtype: str) -> np.dtype[np.generic]:
    """An unsigned integer dtype of the same width, for byte-exact comparison."""
    size = itemsize(dtype)
    return np.dtype({1: "u1", 2: "<u2", 4: "<u4", 8: "<u8", 16: "V16"}[size])
