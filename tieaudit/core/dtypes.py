"""Canonical dtype names (torch spelling) and their numpy equivalents.

Every reader maps its format's dtype to one of these names, so the graph, the detector and the
report speak one vocabulary. bfloat16 and float8 come from ml_dtypes.
"""

from __future__ import annotations

from functools import cache

import numpy as np

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

_ML_DTYPES = {
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
}


def itemsize(dtype: str) -> int:
    """Bytes per element of a canonical dtype name (1 for a GGML block type: its raw bytes)."""
    return 1 if dtype in GGML_BLOCK_TYPES else ITEMSIZE[dtype]


@cache
def to_numpy(dtype: str) -> np.dtype[np.generic]:
    """numpy dtype for a canonical name (ml_dtypes for bfloat16 and float8; bytes for a GGML block
    type)."""
    if dtype in GGML_BLOCK_TYPES:
        return np.dtype("u1")
    if dtype in _ML_DTYPES:
        import ml_dtypes

        extended: np.dtype[np.generic] = np.dtype(getattr(ml_dtypes, dtype))
        return extended
    return np.dtype(dtype)


def uint_view_dtype(dtype: str) -> np.dtype[np.generic]:
    """An unsigned integer dtype of the same width, for byte-exact comparison."""
    size = itemsize(dtype)
    return np.dtype({1: "u1", 2: "<u2", 4: "<u4", 8: "<u8", 16: "V16"}[size])
