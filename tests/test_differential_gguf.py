"""Differential test: every GGUF file of the hostile corpus, files written by gguf's own writer and
headers crafted next to each rule gguf's reader checks, read by tieaudit and by ``gguf.GGUFReader``
(in a capped child process, tests/reference_loaders.py).

Whenever GGUFReader refuses a file, tieaudit refuses it (the ``general.alignment`` type and the
header-field key names were the differences). Whenever both accept it, they agree on every tensor's
name, GGML type and bytes, and on its shape wherever GGUFReader gives one in elements. Where
tieaudit refuses a file GGUFReader accepts, its message names one of the deliberate differences
below: limits and llama.cpp's own rules, which GGUFReader does not check.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import ROOT
from reference_loaders import Reference, run_reference

from tieaudit.core.errors import InputError
from tieaudit.formats.gguf import GgufReader

HOSTILE = ROOT / "fixtures" / "hostile"
sys.path.insert(0, str(HOSTILE))
import make_hostile  # type: ignore[import-not-found]  # noqa: E402  (the corpus generator: cases, setups)

DELIBERATE = {
    "dimensions; ggml allows": "more than GGML_MAX_DIMS (4) dimensions: llama.cpp refuses them",
    "not a multiple of": "a tensor offset off the alignment: llama.cpp refuses it",
    "overlap": "two tensors over the same bytes: a re-tie would corrupt one",
    "is not whole": "a row that is not whole blocks of its quantized type",
    "is not UTF-8": "a string value tieaudit reports (architecture, tokenizer) that is not UTF-8",
    "unknown value type": "an array whose element type GGUF does not define (GGUFReader checks it "
    "only when the array has an element)",
    "a big-endian GGUF file": "big-endian files are not read (GGUFReader byte-swaps them)",
    "tieaudit reads": "a count past the MAX_GGUF_* limits",
    "-byte limit": "a key or tensor name past MAX_GGUF_NAME_BYTES",
    "nests arrays deeper": "arrays nested past MAX_GGUF_ARRAY_DEPTH",
    "does not read yet": "a block type tieaudit does not know the layout of",
}
"""Fragments of tieaudit's error -> why it refuses what GGUFReader accepts."""
ELEMENT_TYPES = {"F32", "F16", "F64", "I8", "I16", "I32", "I64"}
"""GGML types GGUFReader views as numbers (its shape is in elements, as tieaudit's)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def compare(path: Path, reference: Reference) -> str | None:
    """None when tieaudit and GGUFReader agree on path, else what differs."""
    try:
        with GgufReader().read(str(path)) as opened:
            ours = [
                (t.name, t.dtype, list(t.shape), _sha256(np.ascontiguousarray(opened.array(t)).tobytes()))
                for t in opened.checkpoint.tensors
            ]
    except InputError as exc:
        if not reference.accepted or any(fragment in exc.message for fragment in DELIBERATE):
            return None
        return f"tieaudit refuses ({exc.message}) what GGUFReader accepts"
    if not reference.accepted:
        return f"tieaudit accepts what GGUFReader refuses ({reference.error})"
    theirs = [(t["name"], t["ggml_type"], t["shape"], t["sha256"]) for t in reference.tensors]
    if [t[0] for t in ours] != [t[0] for t in theirs]:
        return f"names {[t[0] for t in ours]} vs {[t[0] for t in theirs]}"
    problems = []
    for (name, dtype, shape, digest), (_, ggml_type, their_shape, their_digest) in zip(
        ours, theirs, strict=True
    ):
        if digest != their_digest:
            problems.append(f"{name}: bytes differ")
        if ggml_type in ELEMENT_TYPES and shape != their_shape:
            problems.append(f"{name}: shape {shape} vs {their_shape}")
        # a block type: tieaudit names it and gives bytes per row, as GGUFReader's byte shape does
        if (
            ggml_type not in ELEMENT_TYPES
            and ggml_type != "BF16"
            and (dtype != ggml_type or shape != their_shape)
        ):
            problems.append(f"{name}: {dtype} {shape} vs {ggml_type} {their_shape}")
    return "; ".join(problems) or None


def disagreements(paths: list[Path]) -> list[str]:
    """What differs, file by file; a ``*_ok_*`` file must be accepted by both (no vacuous agreement)."""
    references = run_reference("gguf", [str(p) for p in paths])
    found = []
    for path in paths:
        reference = references[str(path)]
        problem = compare(path, reference)
        if problem is not None:
            found.append(f"{path.name}: {problem}")
        elif "_ok_" in path.name and not reference.accepted:
            found.append(f"{path.name}: a file meant to be valid is refused ({reference.error})")
    return found


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _file(
    pairs: list[tuple[bytes, int, bytes]], infos: list[bytes], data: bytes, *, align: int = 32
) -> bytes:
    """A GGUF v3 file: key/values (key, value type, encoded value), tensor infos, then data at align."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(pairs))
    head += b"".join(_string(key) + struct.pack("<I", kind) + value for key, kind, value in pairs)
    head += b"".join(infos)
    return head + b"\0" * (-len(head) % align) + data


def _info(name: bytes, dims: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    packed = struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    return _string(name) + packed + struct.pack("<IQ", ggml_type, offset)


V = gguf.GGUFValueType
ALIGN = b"general.alignment"
EIGHT = np.arange(8, dtype=np.float32).tobytes()
ONE = [_info(b"t", (8,))]
CRAFTED: dict[str, bytes] = {
    "ok_plain": _file([], ONE, EIGHT),
    "ok_alignment_uint32_64": _file([(ALIGN, V.UINT32, struct.pack("<I", 64))], ONE, EIGHT, align=64),
    "alignment_uint8": _file([(ALIGN, V.UINT8, struct.pack("<B", 32))], ONE, EIGHT),
    "alignment_uint16": _file([(ALIGN, V.UINT16, struct.pack("<H", 32))], ONE, EIGHT),
    "alignment_int32": _file([(ALIGN, V.INT32, struct.pack("<i", 32))], ONE, EIGHT),
    "alignment_uint64": _file([(ALIGN, V.UINT64, struct.pack("<Q", 32))], ONE, EIGHT),
    "alignment_int64": _file([(ALIGN, V.INT64, struct.pack("<q", 32))], ONE, EIGHT),
    "alignment_float32": _file([(ALIGN, V.FLOAT32, struct.pack("<f", 32.0))], ONE, EIGHT),
    "alignment_bool": _file([(ALIGN, V.BOOL, b"\x01")], ONE, EIGHT),
    "alignment_string": _file([(ALIGN, V.STRING, _string(b"32"))], ONE, EIGHT),
    "alignment_array": _file([(ALIGN, V.ARRAY, struct.pack("<IQI", V.UINT32, 1, 32))], ONE, EIGHT),
    "alignment_zero": _file([(ALIGN, V.UINT32, struct.pack("<I", 0))], ONE, EIGHT),
    "alignment_three": _file([(ALIGN, V.UINT32, struct.pack("<I", 3))], ONE, EIGHT),
    "key_gguf_version": _file([(b"GGUF.version", V.UINT32, struct.pack("<I", 3))], ONE, EIGHT),
    "key_gguf_tensor_count": _file([(b"GGUF.tensor_count", V.UINT64, struct.pack("<Q", 1))], ONE, EIGHT),
    "key_gguf_kv_count": _file([(b"GGUF.kv_count", V.UINT64, struct.pack("<Q", 1))], ONE, EIGHT),
    "ok_key_gguf_lowercase": _file([(b"gguf.version", V.UINT32, struct.pack("<I", 3))], ONE, EIGHT),
    "key_repeated": _file([(b"k", V.UINT8, b"\x01"), (b"k", V.UINT8, b"\x02")], ONE, EIGHT),
    "key_not_utf8": _file([(b"\xff", V.UINT8, b"\x01")], ONE, EIGHT),
    "tensor_name_not_utf8": _file([], [_info(b"\xff", (8,))], EIGHT),
    "tensor_repeated": _file([], [_info(b"t", (2,)), _info(b"t", (2,), offset=32)], EIGHT * 8),
    "tensor_past_end": _file([], [_info(b"t", (16,))], EIGHT),
    "tensor_unknown_type": _file([], [_info(b"t", (8,), ggml_type=77)], EIGHT),
    "tensor_partial_block": _file([], [_info(b"t", (33,), ggml_type=8)], b"\0" * 64),
    "ok_tensor_no_dims": _file([], [_info(b"t", ())], EIGHT),
    "empty_array_unknown_type": _file([(b"a", V.ARRAY, struct.pack("<IQ", 99, 0))], ONE, EIGHT),
    "version_one": b"GGUF" + struct.pack("<IQQ", 1, 0, 0),
}
"""Headers next to each check (both verdicts occur)."""


def _written(path: Path, *, alignment: int | None) -> None:
    """A small model written by gguf's own writer: float, half, bf16 and block-quantized tensors."""
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    values = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    writer.add_tensor("f32", values)
    writer.add_tensor("f16", values.astype(np.float16))
    for kind in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.BF16):
        packed = quantize(values, kind)
        writer.add_tensor(kind.name.lower(), packed, raw_shape=packed.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The crafted headers, the writer's files and every GGUF case of the hostile corpus."""
    folder = tmp_path_factory.mktemp("gguf-differential")
    paths = []
    for label, data in CRAFTED.items():
        paths.append(folder / f"{label}.gguf")
        paths[-1].write_bytes(data)
    for alignment in (None, 64):
        paths.append(folder / f"ok_written_{alignment}.gguf")
        _written(paths[-1], alignment=alignment)
    for index, case in enumerate(make_hostile.CASES):
        if "gguf" in case.tags and case.committed:
            work = folder / f"hostile-{index}"
            work.mkdir()
            paths.append(make_hostile.prepare(case, HOSTILE, work))
    return paths


def test_gguf_files_read_as_ggufs_reader_reads(files: list[Path]) -> None:
    assert len(files) >= 40
    assert disagreements(files) == []


def test_both_verdicts_occur(files: list[Path]) -> None:
    verdicts = [r.accepted for r in run_reference("gguf", [str(p) for p in files]).values()]
    assert 5 <= sum(verdicts) <= len(verdicts) - 10
