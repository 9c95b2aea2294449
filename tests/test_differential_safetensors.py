"""Differential test: every safetensors file in the corpora, read by tieaudit and by the safetensors
library (``safe_open(framework="numpy")``, ``safetensors.numpy.load_file``, and
``safetensors.deserialize`` for the bytes of dtypes numpy lacks), each library run in a capped
child process (tests/reference_loaders.py).

Whenever both accept a file, they agree on names, dtypes, shapes, bytes and ``__metadata__``.
Whenever the library refuses, tieaudit refuses. Where tieaudit refuses a file the library
accepts, its message must name one of the deliberate differences below.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import GENERATED, MALFORMED, ROOT, Corpus
from reference_loaders import Reference, run_reference

from tieaudit.core.errors import InputError
from tieaudit.formats import open_checkpoint
from tieaudit.formats.safetensors import read_header

HOSTILE = ROOT / "fixtures" / "hostile"
sys.path.insert(0, str(HOSTILE))
import make_hostile  # type: ignore[import-not-found]  # noqa: E402  (the corpus generator: cases, setups)

LIBRARY_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "C64": "complex64", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool",
}  # fmt: skip
"""The library's dtype names and the canonical names tieaudit must report for them (written
out here, not taken from tieaudit, so a wrong entry there shows)."""

DELIBERATE = {
    "appears twice": "duplicate JSON keys: the library keeps the last entry, other readers the "
    "first, so the file means different tensors to different loaders",
    "at most 64 can be viewed": "numpy views hold at most 64 dimensions",
    "too large to address": "no numpy view spans more than 2**63-1 bytes, even an empty one",
    "which tieaudit does not read": "4- and 6-bit and exponent-only dtypes: skipping them would "
    "let retie write a copy without them",
    "is not an object with dtype, shape and data_offsets": "serde also reads a tensor entry "
    "spelled as a 3-element list; the format (and every other reader) has objects",
    "(not a string)": "serde also reads a dtype spelled {\"F32\": null}; the format has strings",
    "is out of range": "numbers that round to the largest double: serde's rounding near it is "
    "looser than Python's, so tieaudit refuses the whole last ulp",
    "tieaudit.ties": "tieaudit's own tie record in __metadata__ is malformed: the library keeps it "
    "as an opaque string, tieaudit cannot tell which ties it declares",
}
"""Fragments of tieaudit's error -> why it refuses what the library accepts."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # a link loop, an over-long name: no file to compare
        return False


def compare(path: Path, reference: Reference) -> str | None:
    """None when tieaudit and the library agree on path, else what differs."""
    try:
        header = read_header(str(path), path.name)
        with open_checkpoint(str(path)) as opened:
            ours = {
                t.name: (t.dtype, list(t.shape), _sha256(np.ascontiguousarray(opened.array(t)).tobytes()))
                for t in opened.checkpoint.tensors
            }
    except InputError as exc:
        if not reference.accepted:
            return None
        if any(fragment in exc.message for fragment in DELIBERATE) and "_ok_" not in path.name:
            return None
        return f"tieaudit refuses ({exc.message}) what the library accepts"
    if not reference.accepted:
        return f"tieaudit accepts what the library refuses ({reference.error})"
    theirs = {
        t["name"]: (LIBRARY_DTYPES.get(t["dtype"], t["dtype"]), t["shape"], t["sha256"])
        for t in reference.tensors
    }
    problems = []
    if sorted(ours) != sorted(theirs):
        problems.append(f"names {sorted(ours)[:5]} vs {sorted(theirs)[:5]}")
    both = sorted(set(ours) & set(theirs))
    problems.extend(f"{n!r}: {ours[n]} vs {theirs[n]}" for n in both if ours[n] != theirs[n])
    # Dtypes numpy knows: the library's numpy dtype is the very one tieaudit views the bytes as.
    numpy_dtypes = {t["name"]: t["numpy"] for t in reference.tensors if t["numpy"] is not None}
    problems.extend(
        f"{n!r}: numpy dtype {numpy_dtypes[n]} vs {ours[n][0]}"
        for n in both
        if n in numpy_dtypes and numpy_dtypes[n] != ours[n][0]
    )
    if header.metadata != (reference.metadata or {}):
        problems.append(f"__metadata__ {header.metadata} vs {reference.metadata}")
    return "; ".join(problems) or None


def disagreements(paths: list[Path]) -> list[str]:
    """What differs, file by file; and every legitimate hostile-corpus file (``*_ok_*``) must be
    one both readers accept, so that those comparisons are not vacuous."""
    references = run_reference("safetensors", [str(p) for p in paths])
    found = []
    for path in paths:
        problem = compare(path, references[str(path)])
        if problem is not None:
            found.append(f"{path}: {problem}")
        elif "_ok_" in path.name and not references[str(path)].accepted:
            found.append(f"{path}: a file meant to be valid is refused ({references[str(path)].error})")
    return found


def test_generated_corpus_reads_as_the_library_reads(corpus: Corpus) -> None:
    paths = sorted(p for p in GENERATED.rglob("*.safetensors") if _is_regular(p))
    assert len(paths) >= 20  # single files and shards inside Hugging Face folders
    assert disagreements(paths) == []


def test_malformed_files_read_as_the_library_reads() -> None:
    paths = sorted(MALFORMED.glob("*.safetensors"))
    assert len(paths) >= 4
    assert disagreements(paths) == []


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Every safetensors file of the hostile corpus, prepared (links, permissions) in a copy."""
    base = tmp_path_factory.mktemp("hostile-st")
    found: list[Path] = []
    for index, case in enumerate(make_hostile.CASES):
        work = base / str(index)
        work.mkdir()
        target = make_hostile.prepare(case, HOSTILE, work)
        candidates = [target] if target.suffix == ".safetensors" else []
        if target.is_dir() and not target.is_symlink():
            candidates = sorted(target.rglob("*.safetensors"))
        found.extend(p for p in candidates if _is_regular(p))
    return found


def test_hostile_corpus_reads_as_the_library_reads(hostile_files: list[Path]) -> None:
    assert len(hostile_files) >= 60
    assert disagreements(hostile_files) == []


def test_the_library_refuses_what_the_issue_names(hostile_files: list[Path]) -> None:
    """The reference really is strict where tieaudit now is: these are refusals, not differences."""
    by_name = {p.name: p for p in hostile_files}
    names = ["st_trailing_bytes.safetensors", "st_duplicate_field.safetensors", "st_nan_number.safetensors"]
    references = run_reference("safetensors", [str(by_name[n]) for n in names])
    assert [references[str(by_name[n])].accepted for n in names] == [False, False, False]


def _file(header: bytes, data: bytes, pad: bytes = b" ") -> bytes:
    header += pad * (-len(header) % 8) if pad else b""
    return len(header).to_bytes(8, "little") + header + data


_A = b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]'
_ZEROS = b"\x00" * 8


def _with(extra: bytes) -> bytes:
    return _file(b"{" + _A + extra + b"}}", _ZEROS)


def _nested(depth: int) -> bytes:
    return _with(b',"x":' + b"[" * depth + b"]" * depth)


CRAFTED: dict[str, bytes] = {
    # JSON the two parsers read differently, each side of every limit
    "depth_127": _nested(125),  # the top object and the entry make 127 levels: accepted
    "depth_128": _nested(126),
    "int_308_digits": _with(b',"x":' + b"9" * 308),
    "int_309_digits": _with(b',"x":' + b"9" * 309),
    "int_below_i64": _with(b',"x":' + str(-(2**63) - 1).encode()),
    "float_underflow": _with(b',"x":1e-400'),
    "float_max": _with(b',"x":1.7976931348623157e308'),  # serde accepts; tieaudit: named difference
    "float_past_max": _with(b',"x":1.8e308'),
    "infinity": _with(b',"x":-Infinity'),
    "surrogate_pair": _with(b',"x":"\\ud83d\\ude00"'),
    "lone_low_surrogate": _with(b',"x":"\\udc00"'),
    "high_then_letter": _with(b',"x":"\\ud800\\u0041"'),
    "repeat_in_ignored": _with(b',"x":{"k":1,"k":2}'),
    "repeat_ignored_field": _with(b',"x":1,"x":2'),
    "nul_in_name": _file(b'{"a\\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', _ZEROS),
    "empty_name": _file(b'{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', _ZEROS),
    "raw_tab_in_string": _with(b',"x":"\t"'),
    "raw_del_in_string": _with(b',"x":"\x7f"'),
    "whitespace_padding": _file(b"{" + _A + b"}}\t\n\r ", _ZEROS, pad=b""),
    "form_feed_padding": _file(b"{" + _A + b"}}\x0c", _ZEROS, pad=b""),
    "junk_after_json": _file(b"{" + _A + b"}}x", _ZEROS),
    "trailing_comma": _file(b"{" + _A + b"},}", _ZEROS),
    "shape_trailing_comma": _file(b'{"a":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}', _ZEROS),
    "leading_zero": _file(b'{"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}', _ZEROS),
    "negative_zero_dim": _file(b'{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}', b""),
    "header_length_zero": _file(b"", b"", pad=b""),
    "header_null": _file(b"null", b""),
    # structure
    "entry_null": _file(b'{"a":null}', b""),
    "metadata_only": _file(b'{"__metadata__":{"format":"pt"}}', b""),
    "metadata_list": _file(b'{"__metadata__":[],' + _A + b"}}", _ZEROS),
    "metadata_false": _file(b'{"__metadata__":false,' + _A + b"}}", _ZEROS),
    "metadata_value_null": _file(b'{"__metadata__":{"k":null},' + _A + b"}}", _ZEROS),
    "metadata_tensor_like": _file(
        b'{"__metadata__":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', _ZEROS
    ),
    "metadata_in_entry": _with(b',"__metadata__":1'),
    "dtype_lowercase": _file(b'{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}', _ZEROS),
    "dtype_map_list": _file(b'{"a":{"dtype":{"F32":[]},"shape":[2],"data_offsets":[0,8]}}', _ZEROS),
    "entry_list_of_4": _file(b'{"a":["F32",[2],[0,8],5]}', _ZEROS),
    "shape_as_int": _file(b'{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', _ZEROS),
    "offsets_as_object": _file(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":{"0":0}}}', _ZEROS),
    "no_shape": _file(b'{"a":{"dtype":"F32","data_offsets":[0,8]}}', _ZEROS),
    "no_offsets": _file(b'{"a":{"dtype":"F32","shape":[2]}}', _ZEROS),
    "dim_2_64": _file(b'{"a":{"dtype":"F32","shape":[0,18446744073709551616],"data_offsets":[0,0]}}', b""),
    "dim_negative": _file(b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}', b""),
    "offset_2_64": _file(b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,18446744073709551616]}}', b""),
    "hundred_dims": _file(
        b'{"a":{"dtype":"F32","shape":[' + b",".join([b"1"] * 100) + b'],"data_offsets":[0,4]}}', b"\x00" * 4
    ),
    # offsets and sizes
    "empty_at_start_after": _file(
        b"{" + _A + b'},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}', _ZEROS
    ),
    "empty_at_end": _file(b"{" + _A + b'},"b":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}', _ZEROS),
    "empty_past_end": _file(
        b"{" + _A + b'},"b":{"dtype":"F32","shape":[0],"data_offsets":[20,20]}}', _ZEROS
    ),
    "scalar": _file(b'{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', b"\x00" * 4),
    "e8m0": _file(b'{"a":{"dtype":"F8_E8M0","shape":[8],"data_offsets":[0,8]}}', _ZEROS),
    "f6_four": _file(b'{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}', b"\x00" * 3),
    "f4_odd": _file(b'{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}', b"\x00"),
    "bf16_bytes": _file(b'{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}', bytes(range(8))),
    "fp8_bytes": _file(b'{"a":{"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]}}', bytes(range(8))),
    "bool_bytes": _file(b'{"a":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}}', bytes(range(8))),
}
"""Headers next to each rule's edge, from running the library on them (both verdicts occur)."""


@pytest.fixture(scope="module")
def crafted_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("crafted-st")
    paths = []
    for label, raw in CRAFTED.items():
        path = base / f"{label}.safetensors"
        path.write_bytes(raw)
        paths.append(path)
    return paths


def test_crafted_headers_read_as_the_library_reads(crafted_files: list[Path]) -> None:
    assert disagreements(crafted_files) == []


def test_crafted_headers_hold_both_verdicts(crafted_files: list[Path]) -> None:
    """Not a one-sided list: the library accepts some of these headers and refuses others."""
    verdicts = [r.accepted for r in run_reference("safetensors", [str(p) for p in crafted_files]).values()]
    assert 10 <= sum(verdicts) <= len(verdicts) - 10


MUTATED = 400
"""Mutated files per run: the fuzzer's header edits (tieaudit/fuzz/harness.py), a fixed seed."""


def test_mutated_files_read_as_the_library_reads(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from fuzz import harness

    rng = random.Random(20261201)
    seeds = harness.all_seeds()["safetensors"]
    paths = []
    for index in range(MUTATED):
        path = tmp_path / f"m{index}.safetensors"
        path.write_bytes(harness.mutate("safetensors", rng.choice(seeds), rng, rounds=rng.randint(1, 3)))
        paths.append(path)
    assert disagreements(paths) == []
