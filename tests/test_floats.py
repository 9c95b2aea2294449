"""tieaudit.core.floats against ml_dtypes, the library it replaces at run time.

decode() is checked over every code of every type; encode() over every code's value, every rounding
midpoint and its neighbours on both sides, specials and NaN payloads, random bit patterns, and every
float16. The last tests feed deliberately wrong codecs to the same checks, to show they can fail.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from tieaudit.core import floats

NAMES = sorted(floats.NARROW)
FLOAT8 = [name for name in NAMES if name != "bfloat16"]
SOURCES: list[type[np.floating[Any]]] = [np.float16, np.float32, np.float64]
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
Encoder = Callable[[npt.NDArray[Any], str], npt.NDArray[Any]]


def reference_encode(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "invalid value" for NaN and overflow
        return values.astype(getattr(ml_dtypes, dtype)).view(floats.storage_dtype(dtype))


def reference_decode(bits: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    return bits.view(getattr(ml_dtypes, dtype)).astype(np.float32)


def every_code(dtype: str) -> npt.NDArray[Any]:
    storage = floats.storage_dtype(dtype)
    return np.arange(1 << (8 * storage.itemsize)).astype(storage)


def as_bits(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return values.view(UINT[values.dtype.itemsize])


def encode_mismatches(encoder: Encoder, values: npt.NDArray[Any], dtype: str) -> list[str]:
    """Where encoder(values, dtype) differs from ml_dtypes' cast, described (the first five)."""
    got = encoder(values, dtype)
    want = reference_encode(values, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    flat, source = values.reshape(-1), as_bits(values).reshape(-1)
    width = 2 * values.dtype.itemsize
    notes = [
        f"{dtype} from {values.dtype} 0x{int(source[i]):0{width}x} ({flat[i]!r}): "
        f"got 0x{int(got.reshape(-1)[i]):x}, ml_dtypes 0x{int(want.reshape(-1)[i]):x}"
        for i in bad[:5]
    ]
    return notes + ([f"... {bad.size} mismatches in all"] if bad.size > 5 else [])


def decode_mismatches(decoder: Callable[[npt.NDArray[Any], str], npt.NDArray[Any]], dtype: str) -> list[str]:
    """Codes whose float32 bits from decoder differ from ml_dtypes' (NaN bits included)."""
    codes = every_code(dtype)
    got = decoder(codes, dtype)
    assert got.dtype == np.float32 and got.shape == codes.shape
    want = reference_decode(codes, dtype).view(np.uint32)
    bad = np.flatnonzero(got.view(np.uint32) != want)
    got_bits = got.view(np.uint32)
    return [
        f"{dtype} 0x{int(codes[i]):x}: got 0x{got_bits[i]:08x}, ml_dtypes 0x{want[i]:08x}" for i in bad[:5]
    ]


@np.errstate(invalid="ignore", over="ignore")
def finite_values(dtype: str) -> npt.NDArray[np.float64]:
    """Every finite value of a type, ascending (one zero)."""
    decoded = reference_decode(every_code(dtype), dtype).astype(np.float64)
    return np.unique(decoded[np.isfinite(decoded)])


def midpoints(dtype: str) -> npt.NDArray[np.float64]:
    """Every midpoint between consecutive finite values, and the overflow ones past +-max."""
    finite = finite_values(dtype)
    step = finite[-1] - finite[-2]
    ends = np.concatenate([[-finite[-1] - step], finite, [finite[-1] + step]])
    return (ends[:-1] + ends[1:]) / 2


NAN_BITS = {
    np.float16: [0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF, 0xFFFF, 0x7D00],
    np.float32: [
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000, 0xFFC00001,
    ],
    np.float64: [
        0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFF0000000000001,
        0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x7FF0000020000000, 0xFFF4000000000000,
    ],
}  # fmt: skip


@np.errstate(invalid="ignore", over="ignore")
def specials(source: type[np.floating[Any]]) -> npt.NDArray[Any]:
    """+-0, +-inf, NaNs of several payloads and both signs, subnormals and the extremes of source."""
    info = np.finfo(source)
    tiny = np.array([info.smallest_subnormal, info.smallest_normal, info.max], dtype=source)
    ordinary = np.array([0.0, np.inf, 1.0, 1e-30, 1e-45, 1e-300, 1e30, 1e39, 1e300], dtype=np.float64)
    values = np.concatenate([ordinary.astype(source), tiny, np.nextafter(tiny, source(0))])
    values = np.concatenate([values, -values])
    nans = np.array(NAN_BITS[source], dtype=UINT[np.dtype(source).itemsize]).view(source)
    return np.concatenate([values, nans])


def candidates(dtype: str, source: type[np.floating[Any]]) -> npt.NDArray[Any]:
    """Every value of the type, every midpoint, each with its two neighbours in source (float32 or
    float64), and specials."""
    exact = np.concatenate([finite_values(dtype), midpoints(dtype)])
    points = exact.astype(source)
    assert np.array_equal(points.astype(np.float64), exact)  # midpoints are exact one format up
    infinity = source(np.inf)
    near = [points, np.nextafter(points, infinity), np.nextafter(points, -infinity)]
    return np.concatenate([*near, specials(source)])


def random_bits(source: type[np.floating[Any]], count: int, seed: int) -> npt.NDArray[Any]:
    """Uniform random bit patterns of source (NaNs and all)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 64, size=count, dtype=np.uint64, endpoint=False)
    return bits.astype(UINT[np.dtype(source).itemsize]).view(source)


@np.errstate(invalid="ignore", over="ignore")
def random_in_range(dtype: str, source: type[np.floating[Any]], count: int, seed: int) -> npt.NDArray[Any]:
    """Random values of source, any sign and mantissa, from a quarter of the type's smallest
    subnormal to four times its largest value."""
    info = ml_dtypes.finfo(getattr(ml_dtypes, dtype))
    low, high = int(np.log2(float(info.smallest_subnormal))) - 2, int(np.log2(float(info.max))) + 2
    rng = np.random.default_rng(seed)
    fraction = rng.random(count) + 1.0  # 52 random mantissa bits
    values = np.ldexp(fraction, rng.integers(low, high + 1, count))
    signs = rng.choice([-1.0, 1.0], count)
    return (values * signs).astype(source)


# -- decode -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NAMES)
def test_decode_every_code_bit_for_bit(dtype: str) -> None:
    assert not decode_mismatches(floats.decode, dtype)


@pytest.mark.parametrize("dtype", NAMES)
def test_decode_then_encode_gives_back_every_non_nan_code(dtype: str) -> None:
    codes = every_code(dtype)
    values = floats.decode(codes, dtype)
    keep = ~np.isnan(values)
    assert np.array_equal(floats.encode(values[keep], dtype), codes[keep])
    assert np.array_equal(floats.encode(values[keep].astype(np.float64), dtype), codes[keep])
    if dtype in FLOAT8:  # every float8 value is a float16 too
        halves = values[keep].astype(np.float16)
        assert np.array_equal(halves.astype(np.float32), values[keep])
        assert np.array_equal(floats.encode(halves, dtype), codes[keep])
    assert keep.sum() == codes.size - {"bfloat16": 2 * 127, "float8_e5m2": 6, "float8_e4m3fn": 2}.get(
        dtype, 1
    )


# -- encode -------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [np.float32, np.float64])
@pytest.mark.parametrize("dtype", NAMES)
def test_encode_codes_midpoints_and_their_neighbours(dtype: str, source: type[np.floating[Any]]) -> None:
    values = candidates(dtype, source)
    assert not encode_mismatches(floats.encode, values, dtype)


@pytest.mark.parametrize("dtype", NAMES)
def test_encode_every_float16(dtype: str) -> None:
    values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    assert not encode_mismatches(floats.encode, values, dtype)


@pytest.mark.parametrize("dtype", NAMES)
def test_encode_random_float32(dtype: str) -> None:
    values = np.concatenate(
        [random_bits(np.float32, 1_500_000, seed=1), random_in_range(dtype, np.float32, 1_000_000, seed=2)]
    )
    assert not encode_mismatches(floats.encode, values, dtype)


@pytest.mark.parametrize("dtype", NAMES)
def test_encode_random_float64(dtype: str) -> None:
    in_range = random_in_range(dtype, np.float64, 1_000_000, seed=3)
    values = np.concatenate([random_bits(np.float64, 500_000, seed=4), in_range])
    assert not encode_mismatches(floats.encode, values, dtype)


def test_encode_float64_below_and_above_float32s_range() -> None:
    tiny = np.ldexp(1.0, np.arange(-1074, -120))
    values = np.concatenate([tiny, tiny * 1.5, np.nextafter(tiny, 1.0), np.nextafter(tiny, 0.0)])
    values = np.concatenate(
        [values, np.ldexp(1.0, np.arange(120, 1024)), 3.4e38 * np.linspace(0.99, 1.01, 999)]
    )
    values = np.concatenate([values, -values])
    for dtype in NAMES:
        assert not encode_mismatches(floats.encode, values, dtype)


# What ml_dtypes does, written down: a change in a new ml_dtypes shows up here before it shows up as
# a mismatch somewhere else.
F32 = np.float32
F64 = np.float64
DOCUMENTED = [
    ("bfloat16", F32, [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], [0x7FC0, 0xFFC0, 0x7FC0, 0xFFC0]),
    # the overflow tie (to the even inf), minus just below it, half the smallest subnormal, a negative tie
    ("bfloat16", F32, [0x7F7F8000, 0xFF7F7FFF, 0x00008000, 0x80018000], [0x7F80, 0xFF7F, 0x0000, 0x8002]),
    ("bfloat16", F64, [0x3FF0100000001000], [0x3F81]),  # 1 + 2**-8 + 2**-40: once, not via float32
    # just past 2**-134 (half the smallest subnormal), 2**-134 itself, the smallest double
    ("bfloat16", F64, [0x3790000000000001, 0x3790000000000000, 0x0000000000000001], [0x0001, 0x0000, 0x0000]),
    # NaN, -inf, 464 (the overflow tie, to the even 448), just past it, -464
    ("float8_e4m3fn", F32,
        [0x7FC00000, 0xFF800000, 0x43E80000, 0x43E80001, 0xC3E80000], [0x7F, 0xFF, 0x7E, 0x7F, 0xFE]),
    # NaN, -NaN, inf, 61440 (the overflow tie, to the even inf), just below it
    ("float8_e5m2", F32,
        [0x7FC00000, 0xFFC00000, 0x7F800000, 0x47700000, 0x476FFFFF], [0x7E, 0xFE, 0x7C, 0x7C, 0x7B]),
    # -NaN, inf, 248 (the overflow tie, to the even NaN), -0.0, -2**-11 (half the smallest subnormal)
    ("float8_e4m3fnuz", F32,
        [0xFFC00000, 0x7F800000, 0x43780000, 0x80000000, 0xBA000000], [0x80, 0x80, 0x80, 0, 0]),
    # -NaN, -inf, 61440 (the overflow tie, to the even NaN), -0.0, -2**-18 (half the smallest subnormal)
    ("float8_e5m2fnuz", F32,
        [0xFFC00000, 0xFF800000, 0x47700000, 0x80000000, 0xB6800000], [0x80, 0x80, 0x80, 0, 0]),
    ("float8_e5m2fnuz", np.float16, [0x7B53, 0xFB53], [0x7F, 0xFF]),  # 60000: not past the midpoint
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "source", "inputs", "codes"), DOCUMENTED)
def test_documented_cases(
    dtype: str, source: type[np.floating[Any]], inputs: list[int], codes: list[int]
) -> None:
    values = np.array(inputs, dtype=UINT[np.dtype(source).itemsize]).view(source)
    assert [int(c) for c in reference_encode(values, dtype)] == codes
    assert [int(c) for c in floats.encode(values, dtype)] == codes


# -- layouts and arguments ----------------------------------------------------------------------


@np.errstate(invalid="ignore", over="ignore")
def layouts(values: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
    """The same data as 0-d, empty, strided, transposed, read-only and byte-swapped arrays."""
    cube = values[: 5 * 7 * 11 * 13].reshape(5, 7, 11, 13)
    frozen = values.copy()
    frozen.flags.writeable = False
    swapped = values.astype(values.dtype.newbyteorder(">" if sys.byteorder == "little" else "<"))
    return [
        values[0, ...],
        values[:0],
        values[::3],
        values[::-2],
        cube.transpose(2, 0, 3, 1),
        frozen,
        swapped,
    ]


@pytest.mark.parametrize("dtype", NAMES)
def test_any_shape_and_strides(dtype: str) -> None:
    # past one chunk, and not a multiple of it, so the last chunk is short
    values = random_in_range(dtype, np.float32, 3 * (1 << 16) + 12_345, seed=5)
    values[::97] = np.nan
    for source in SOURCES:
        with np.errstate(over="ignore"):
            cast = values.astype(source)
        for array in layouts(cast):
            assert not encode_mismatches(floats.encode, array, dtype)
    codes = np.resize(every_code(dtype), values.size)
    for bits in layouts(codes):
        decoded = floats.decode(bits, dtype)
        assert decoded.shape == bits.shape and decoded.dtype == np.float32
        want = reference_decode(bits.astype(codes.dtype), dtype)
        assert np.array_equal(decoded.view(np.uint32), want.view(np.uint32))


def test_storage_dtypes_and_bad_arguments() -> None:
    assert floats.NARROW == {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
    assert {name: floats.storage_dtype(name) for name in NAMES} == {
        name: np.dtype(np.uint16 if name == "bfloat16" else np.uint8) for name in NAMES
    }
    with pytest.raises(ValueError, match="not a narrow float type"):
        floats.encode(np.zeros(3, np.float32), "float16")
    with pytest.raises(TypeError):
        floats.encode(np.zeros(3, np.int32), "bfloat16")
    with pytest.raises(TypeError):
        floats.decode(np.zeros(3, np.uint8), "bfloat16")
    with pytest.raises(TypeError):
        floats.decode(np.zeros(3, np.int8), "float8_e4m3fn")


def test_memory_stays_near_the_output() -> None:
    values = np.random.default_rng(6).standard_normal(1 << 21)  # 16 MiB of float64
    for source in SOURCES:
        array = values.astype(source)
        for dtype in ("bfloat16", "float8_e4m3fn"):
            floats.encode(array[:10], dtype)  # build the tables outside the measurement
            tracemalloc.start()
            try:
                out = floats.encode(array[::-1], dtype)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < out.nbytes + (2 << 20), (source, dtype, peak)
            tracemalloc.start()
            try:
                floats.decode(out, dtype)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 4 * out.size + (2 << 20), (source, dtype, peak)


def test_no_warnings_for_nans_infs_or_overflow() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in NAMES:
            floats.decode(every_code(dtype), dtype)
            for source in SOURCES:
                floats.encode(specials(source), dtype)
            floats.encode(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16), dtype)


def test_importing_floats_does_not_import_ml_dtypes() -> None:
    code = """if True:
        import sys
        import numpy as np
        from tieaudit.core import floats
        for name in sorted(floats.NARROW):
            floats.decode(floats.encode(np.ones(3), name), name)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ml_dtypes", "torch")))
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- the checks can fail ------------------------------------------------------------------------


@np.errstate(invalid="ignore", over="ignore")
def truncating(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """Rounds every finite in-range value toward zero instead of to nearest."""
    out = floats.encode(values, dtype)
    magnitudes = finite_values(dtype)[finite_values(dtype) >= 0]  # index == code, positive codes
    wide = values.astype(np.float64)
    fits = np.isfinite(wide) & (np.abs(wide) <= magnitudes[-1])
    code = np.searchsorted(magnitudes, np.abs(wide[fits]), side="right") - 1
    sign = np.signbit(wide[fits]) & ~((code == 0) & dtype.endswith("fnuz"))
    out[fits] = code | (sign.astype(np.int64) << (8 * out.itemsize - 1))
    return out


def ties_moved(away: bool) -> Encoder:
    """Sends every exact tie away from zero (or toward it) instead of to the even code."""

    @np.errstate(invalid="ignore", over="ignore")
    def encoder(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
        out = floats.encode(values, dtype)
        tie = np.isin(np.abs(values.astype(np.float64)), np.abs(midpoints(dtype)))
        target = np.copysign(np.inf, values) if away else np.zeros_like(values)
        out[tie] = floats.encode(np.nextafter(values, target.astype(values.dtype)), dtype)[tie]
        return out

    return encoder


@np.errstate(invalid="ignore", over="ignore")
def via_float32(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """Rounds float64 to float32 first: two roundings."""
    return floats.encode(values.astype(np.float32), dtype)


def nan_sign_dropped(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    out = floats.encode(values, dtype)
    out[np.isnan(values)] = floats.encode(np.array([np.nan], values.dtype), dtype)[0]
    return out


@np.errstate(invalid="ignore", over="ignore")
def saturating(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """Clamps overflow and inf to the largest finite value."""
    largest = finite_values(dtype)[-1]
    out = floats.encode(values, dtype)
    over = np.abs(values.astype(np.float64)) > largest
    sign = np.signbit(values[over]).astype(np.int64) << (8 * out.itemsize - 1)
    out[over] = floats.encode(np.array(largest), dtype) | sign
    return out


def zero_sign_flipped(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """fnuz: writes 0x80 (its NaN) for a negative value rounding to zero; others: drops -0."""
    out = floats.encode(values, dtype)
    top = 1 << (8 * out.itemsize - 1)
    if dtype.endswith("fnuz"):
        out[(out == 0) & np.signbit(values)] = top
    else:
        out[out == top] = 0
    return out


MUTANTS: list[tuple[str, Encoder, list[type[np.floating[Any]]]]] = [
    ("truncating", truncating, SOURCES),
    ("ties away from zero", ties_moved(away=True), SOURCES),
    ("ties toward zero", ties_moved(away=False), SOURCES),
    ("double rounding", via_float32, [np.float64]),
    ("NaN sign dropped", nan_sign_dropped, SOURCES),
    ("saturating", saturating, SOURCES),
    ("zero sign flipped", zero_sign_flipped, SOURCES),
]


@pytest.mark.parametrize(
    ("label", "mutant", "sources", "dtype"),
    [
        pytest.param(*mutant, dtype, id=f"{mutant[0]}-{dtype}")
        for mutant in MUTANTS
        for dtype in NAMES
        if not (mutant[0] == "NaN sign dropped" and dtype.endswith("fnuz"))  # one NaN, no sign
    ],
)
def test_the_encode_checks_catch_a_wrong_codec(
    label: str, mutant: Encoder, sources: list[type[np.floating[Any]]], dtype: str
) -> None:
    for source in sources:
        if source is np.float16:
            values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
        else:
            values = candidates(dtype, source)
        assert encode_mismatches(mutant, values, dtype), (label, source)


def flushing(bits: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """Reads subnormals as zero."""
    out = floats.decode(bits, dtype)
    out[np.abs(out) < ml_dtypes.finfo(getattr(ml_dtypes, dtype)).smallest_normal] = 0.0
    return out


def canonical_nan(bits: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """Reads every NaN as float32's positive quiet NaN."""
    out = floats.decode(bits, dtype)
    out[np.isnan(out)] = np.float32(np.nan)
    return out


@pytest.mark.parametrize("dtype", NAMES)
def test_the_decode_check_catches_a_wrong_codec(dtype: str) -> None:
    assert decode_mismatches(flushing, dtype)
    assert decode_mismatches(canonical_nan, dtype)
