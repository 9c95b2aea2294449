"""Differential test: every ONNX file in the corpora, read by tieaudit and by onnx itself
(``onnx.load(path)``, which loads external data from the model's folder, then
``numpy_helper.to_array`` for every initializer and Constant value, subgraphs included), onnx run
in a capped child process (tests/reference_loaders.py).

Whenever both accept a model, they agree on every tensor's name, dtype, shape and bytes, in the
order both walk the graphs; a tensor tieaudit does not read (strings, 4-bit types, segments) is
listed among its skipped entries. Whenever onnx refuses, tieaudit refuses. Where tieaudit refuses
a model onnx accepts, its message names one of the deliberate differences below; among them,
every location that leaves the folder or goes through a link, wherever the tensor sits.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import GENERATED, MALFORMED, ROOT, Corpus
from onnx import helper
from reference_loaders import Reference, run_reference

from tieaudit.core.errors import InputError
from tieaudit.formats.onnx_model import OnnxReader

HOSTILE = ROOT / "fixtures" / "hostile"
sys.path.insert(0, str(HOSTILE))
import make_hostile  # type: ignore[import-not-found]  # noqa: E402  (the corpus generator: cases, setups)

READ_TYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64",
    15: "complex128", 16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz",
    19: "float8_e5m2", 20: "float8_e5m2fnuz",
}  # fmt: skip
"""TensorProto.DataType values tieaudit reads, and the canonical dtype it must report (written out
here, not taken from tieaudit)."""

DELIBERATE = {
    "only the model's folder is read": "absolute locations and '..' are refused wherever the "
    "tensor sits, although onnx normalises 'sub/../w.bin' and never loads sparse initializers "
    "or training graphs (ONNX Runtime may)",
    "goes through the symbolic link": "links are refused on every tensor's path, loaded by onnx or not",
    "outside the model's folder": "a location resolving outside the folder",
    "contains a NUL byte": "onnx's C++ layer cuts the location at the NUL and reads another file",
    "is not a count": "offsets and lengths other than plain digits ('+1', ' 1', '1_0'): Python's "
    "int() reads them, C++ readers read them differently",
    "contains a backslash": "a separator on Windows, part of the file name elsewhere",
    "appears twice in graph": "two initializers with one name: which one a node reads is undefined",
    "at most 64 can be viewed": "numpy views hold at most 64 dimensions",
    "has a negative dimension": "ONNX dims are non-negative; numpy's reshape reads -1 as 'infer'",
    "the model has no graph": "an empty or graphless protobuf parses as a ModelProto with nothing "
    "in it: no runtime can run it, and it has no tensors to audit",
    "(values): ": "sparse tensors: onnx.load never opens their external data, ONNX Runtime does; "
    "tieaudit checks it as strictly as any tensor's",
    "(indices): ": "as above, for a sparse tensor's indices",
    "in training_info[": "training graphs: onnx.load never opens their external data; checked all the same",
    "(default value): ": "functions' default attribute values: onnx.load never opens their external "
    "data; checked all the same",
    "tieaudit.ties": "tieaudit's own tie record in metadata_props is malformed: onnx keeps it as an "
    "opaque string, tieaudit cannot tell which ties it declares",
}
"""Fragments of tieaudit's error -> why it refuses what onnx accepts."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _same_value(ours: str, value_name: str) -> bool:
    """Whether tieaudit's tensor name is the value name, or that name made unique (``graph/name``,
    ``name#2``), as the reader renames a value that repeats an earlier one."""
    base = re.sub(r"#\d+$", "", ours)
    return base == value_name or base.endswith("/" + value_name)


SKIPPED_TYPES = set(onnx.TensorProto.DataType.values()) - set(READ_TYPES) - {onnx.TensorProto.UNDEFINED}
"""Data types ONNX defines that tieaudit lists as skipped (strings, 2- and 4-bit types, ...)."""


def _read_by_tieaudit(tensor: dict[str, object]) -> bool:
    return tensor["data_type"] in READ_TYPES and not tensor["segment"]


def _skipped_by_tieaudit(tensor: dict[str, object]) -> bool:
    data_type = tensor["data_type"]
    return data_type in SKIPPED_TYPES or (data_type in READ_TYPES and bool(tensor["segment"]))


def verdict(reference: Reference) -> Reference:
    """The reference's answer for the model: refused too when onnx loaded it but cannot decode a
    tensor that tieaudit does not skip."""
    undecodable = [t["error"] for t in reference.tensors if "error" in t and not _skipped_by_tieaudit(t)]
    return Reference(False, undecodable[0]) if undecodable else reference


def compare(path: Path, reference: Reference) -> str | None:
    """None when tieaudit and onnx agree on path, else what differs.

    onnx refuses a model when onnx.load fails, or when to_array fails on a tensor tieaudit does not
    skip; a tensor tieaudit skips (strings, 4-bit types, segments) is only listed as skipped."""
    reference = verdict(reference)
    try:
        with OnnxReader().read(str(path)) as opened:
            ours = [
                (t.name, t.dtype, list(t.shape), _sha256(np.ascontiguousarray(opened.array(t)).tobytes()))
                for t in opened.checkpoint.tensors
            ]
            skipped = [s.name for s in opened.checkpoint.skipped]
    except InputError as exc:
        if not reference.accepted:
            return None
        if any(fragment in exc.message for fragment in DELIBERATE) and "_ok_" not in path.name:
            return None
        return f"tieaudit refuses ({exc.message}) what onnx accepts"
    if not reference.accepted:
        return f"tieaudit accepts what onnx refuses ({reference.error})"
    problems: list[str] = []
    position = 0
    for theirs in reference.tensors:
        name = theirs["name"]
        if not _read_by_tieaudit(theirs):
            # not read by tieaudit (onnx may fail to decode it, too): it must be listed as skipped
            if not any(_same_value(s, name) for s in skipped):
                problems.append(f"{name!r} (data type {theirs['data_type']}) is neither read nor skipped")
            continue
        if position == len(ours):
            problems.append(f"{name!r} is missing")
            continue
        mine = ours[position]
        position += 1
        expected = (READ_TYPES[theirs["data_type"]], theirs["shape"], theirs["sha256"])
        if not _same_value(mine[0], name) or mine[1:] != expected or theirs["dtype"] != mine[1]:
            problems.append(f"{mine} vs {name!r} {expected} (numpy {theirs['dtype']})")
    problems.extend(f"{extra[0]!r} is not a tensor onnx has" for extra in ours[position:])
    return "; ".join(problems) or None


def disagreements(paths: list[Path]) -> list[str]:
    """What differs, file by file; and every legitimate hostile-corpus file (``*_ok_*``) must be
    one both readers accept, so that those comparisons are not vacuous."""
    references = run_reference("onnx", [str(p) for p in paths])
    found = []
    for path in paths:
        problem = compare(path, references[str(path)])
        if problem is not None:
            found.append(f"{path}: {problem}")
        elif "_ok_" in path.name and not verdict(references[str(path)]).accepted:
            found.append(f"{path}: a file meant to be valid is refused ({references[str(path)].error})")
    return found


def test_generated_corpus_reads_as_onnx_reads(corpus: Corpus) -> None:
    paths = sorted(p for p in GENERATED.rglob("*.onnx") if _is_regular(p))
    assert len(paths) >= 8  # embedded, external data, subgraphs, torch and onnx.helper producers
    assert disagreements(paths) == []


def test_the_onnx_packages_own_backend_models_read_as_onnx_reads() -> None:
    """The ~150 real small models the onnx package ships (onnx/backend/test/data): real exporters'
    output, not ours (issue 24)."""
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    paths = sorted(p for p in data.rglob("*.onnx") if _is_regular(p))
    assert len(paths) >= 100
    assert disagreements(paths) == []


def test_malformed_files_read_as_onnx_reads() -> None:
    paths = sorted(MALFORMED.glob("*.onnx"))
    assert len(paths) >= 3
    assert disagreements(paths) == []


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Every ONNX file of the hostile corpus, prepared (links, permissions) in a copy."""
    base = tmp_path_factory.mktemp("hostile-onnx")
    found: list[Path] = []
    for index, case in enumerate(make_hostile.CASES):
        if "onnx" not in case.tags and not case.name.endswith(".onnx"):
            continue
        work = base / str(index)
        work.mkdir()
        target = make_hostile.prepare(case, HOSTILE, work)
        candidates = [target] if target.suffix == ".onnx" else []
        if target.is_dir() and not target.is_symlink():
            candidates = sorted(target.rglob("*.onnx"))
        found.extend(p for p in candidates if _is_regular(p))
    return found


def test_hostile_corpus_reads_as_onnx_reads(hostile_files: list[Path]) -> None:
    assert len(hostile_files) >= 30
    assert disagreements(hostile_files) == []


def test_onnx_itself_refuses_what_tieaudit_refuses_for_node_tensors(hostile_files: list[Path]) -> None:
    """onnx.load reads every node's tensor attributes: its own confinement refuses these too, so
    for them tieaudit's refusal is agreement, not a named difference."""
    by_name = {p.name: p for p in hostile_files}
    names = ["onnx_attribute_dotdot.onnx", "onnx_function_constant_dotdot.onnx"]
    references = run_reference("onnx", [str(by_name[n]) for n in names])
    assert [references[str(by_name[n])].accepted for n in names] == [False, False]


def _external(name: str, location: str, dims: list[int], **entries: str) -> onnx.TensorProto:
    external = onnx.TensorProto.EXTERNAL
    proto = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=dims, data_location=external)
    for key, value in [("location", location), *entries.items()]:
        proto.external_data.add(key=key, value=value)
    return proto


def _model(initializers: list[onnx.TensorProto], nodes: list[onnx.NodeProto] | None = None) -> bytes:
    graph = helper.make_graph(
        nodes or [helper.make_node("Gather", ["E", "ids"], ["h"])],
        "crafted",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


def _e(location: str, **entries: str) -> bytes:
    return _model([_external("E", location, [16, 4], **entries)])


def _with_raw_too() -> bytes:
    proto = _external("E", "w.bin", [16, 4], offset="0", length="256")
    proto.raw_data = b"\x01" * 256  # ignored: the data location says external
    return _model([proto])


def _location_is_external_without_flag() -> bytes:
    zeros = np.zeros(64, np.float32).tobytes()
    proto = helper.make_tensor("E", onnx.TensorProto.FLOAT, [16, 4], zeros, raw=True)
    proto.external_data.add(key="location", value="w.bin")  # ignored: data_location is DEFAULT
    return _model([proto])


def _repeated_location(first: str, last: str) -> bytes:
    proto = _external("E", first, [16, 4], offset="0", length="256")
    proto.external_data.add(key="location", value=last)  # onnx and tieaudit: the last one counts
    return _model([proto])


def _subgraph_constant() -> bytes:
    value = _external("c", "w.bin", [4], offset="16", length="16")
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=value)],
        "then",
        [],
        [helper.make_tensor_value_info("k", onnx.TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["h"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch),
    ]
    return _model([_external("E", "w.bin", [16, 4], length="256")], nodes)


def _typed_fields() -> bytes:
    complex_values: list[Any] = [1 + 2j]  # onnx's stubs type vals as numbers only
    text_values: list[Any] = [b"text"]
    inits = [
        helper.make_tensor("E", onnx.TensorProto.FLOAT, [16, 4], np.arange(64, dtype=np.float32)),
        helper.make_tensor("h16", onnx.TensorProto.FLOAT16, [3], np.array([1, 2, 3], np.float16)),
        helper.make_tensor("bf", onnx.TensorProto.BFLOAT16, [2], [1.0, -2.0]),
        helper.make_tensor("u8", onnx.TensorProto.UINT8, [3], [1, 2, 255]),
        helper.make_tensor("b", onnx.TensorProto.BOOL, [2], [True, False]),
        helper.make_tensor("c", onnx.TensorProto.COMPLEX64, [1], complex_values),
        helper.make_tensor("s", onnx.TensorProto.STRING, [1], text_values),
        helper.make_tensor("i4", onnx.TensorProto.INT4, [2], [1, -2]),
    ]
    return _model(inits)


CRAFTED: dict[str, bytes] = {
    "dot_slash": _e("./w.bin", offset="0", length="256"),
    "double_slash": _e("sub//w.bin", offset="0", length="256"),
    "dotdot_inside": _e("sub/../w.bin", offset="0", length="256"),  # onnx accepts; named difference
    "nul_cut": _e("w.bin\x00.txt", offset="0", length="256"),  # onnx reads w.bin; named difference
    "space_offset": _e("w.bin", offset=" 0", length="256"),
    "underscore_length": _e("w.bin", offset="0", length="2_56"),
    "offset_past_end": _e("w.bin", offset="999", length="0"),
    "length_short": _e("w.bin", offset="0", length="252"),
    "no_offset": _e("w.bin", length="256"),
    "no_length_second_tensor": _e("w.bin", offset="256"),  # 4 bytes left: refused by both
    "checksum_basepath_unknown": _e("w.bin", offset="0", length="256", checksum="x", basepath="/", why="?"),
    "raw_data_and_external": _with_raw_too(),
    "external_entries_ignored": _location_is_external_without_flag(),
    "subgraph_constant": _subgraph_constant(),
    "typed_fields": _typed_fields(),
    "empty_location": _e("", offset="0", length="256"),
    "folder_location": _e("sub", offset="0", length="0"),
    "dots_in_file_name": _e("w..bin", offset="0", length="256"),  # onnx finds '..' in any name
    "dots_in_folder_name": _e("sub..x/w.bin", offset="0", length="256"),
    "hash_location": _e("#w.bin", offset="0", length="256"),
    "hard_link_to_outside": _e("outside_link.bin", offset="0", length="256"),
    "hard_link_inside": _e("twin_a.bin", offset="0", length="256"),
    "repeated_location_last_counts": _repeated_location("missing.bin", "w.bin"),
    "repeated_location_last_leaves": _repeated_location("w.bin", "../w.bin"),
    "basepath_elsewhere": _e("w.bin", offset="0", length="256", basepath="sub"),
    "length_past_end": _e("w.bin", offset="8", length="256"),
    "offset_at_end_empty": _model([_external("E", "w.bin", [0, 4], offset="260", length="0")]),
}
"""Models next to each external-data rule's edge, and typed-field encodings (both verdicts occur)."""


@pytest.fixture(scope="module")
def crafted_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("crafted-onnx")
    data = np.arange(65, dtype=np.float32).tobytes()  # 256 bytes of E, then 4 more
    (folder / "w.bin").write_bytes(data)
    (folder / "sub").mkdir()
    (folder / "sub" / "w.bin").write_bytes(data)
    (folder / "sub..x").mkdir()
    for name in ("w..bin", "#w.bin", "sub..x/w.bin", "twin_a.bin"):
        (folder / name).write_bytes(data)
    os.link(folder / "twin_a.bin", folder / "twin_b.bin")  # one file, two names, both inside
    outside = tmp_path_factory.mktemp("outside-the-model") / "secret.bin"
    outside.write_bytes(data)
    os.link(outside, folder / "outside_link.bin")  # made in the folder, reaching a file outside it
    paths = []
    for label, raw in CRAFTED.items():
        path = folder / f"{label}.onnx"
        path.write_bytes(raw)
        paths.append(path)
    return paths


def test_crafted_models_read_as_onnx_reads(crafted_files: list[Path]) -> None:
    assert disagreements(crafted_files) == []


def test_crafted_models_hold_both_verdicts(crafted_files: list[Path]) -> None:
    verdicts = [verdict(r).accepted for r in run_reference("onnx", [str(p) for p in crafted_files]).values()]
    assert 5 <= sum(verdicts) <= len(verdicts) - 5


MUTATED = 150
"""Mutated models per kind and run: the fuzzer's ONNX edits (fuzz/harness.py), a fixed seed."""


def test_mutated_models_read_as_onnx_reads(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from fuzz import harness

    rng = random.Random(20261201)
    paths = []
    for kind in ("onnx", "onnx-external"):
        seeds = harness.all_seeds()[kind]
        for index in range(MUTATED):
            folder = tmp_path / f"{kind}-{index}"
            folder.mkdir()
            data = harness.mutate(kind, rng.choice(seeds), rng, rounds=rng.randint(1, 3))
            paths.append(harness.materialize(kind, data, folder))
    assert disagreements(paths) == []
