"""The ONNX wire walker (tieaudit.formats.onnx_wire) and the reader on top of it.

The skeleton, its placeholders put back, must serialize exactly as onnx.load's parse of the file
(every field, unknown ones too) on crafted spellings and on a few thousand byte mutations; what
the walker refuses, protobuf refuses. Embedded raw_data is served from the file's map, never copied.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import GENERATED, MALFORMED, ROOT, Corpus
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from onnx import TensorProto, helper, numpy_helper
from test_onnx_tensors import _edges_to_tensors

from tieaudit.core.errors import InputError
from tieaudit.formats import onnx_wire
from tieaudit.formats.onnx_model import OnnxReader
from tieaudit.formats.onnx_wire import RAW_DATA, SCHEMA, Skeleton, skeleton, skeleton_of

sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
import cases_onnx_wire as wire  # type: ignore[import-not-found]
import make_hostile  # type: ignore[import-not-found]


def test_schema_is_onnx_s_own_field_numbers_and_reaches_every_tensor() -> None:
    walked = set()
    for kind, fields in SCHEMA.items():
        descriptor = getattr(onnx, kind).DESCRIPTOR
        for number, target in fields.items():
            field = descriptor.fields_by_number[number]
            assert field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.name == target
            assert target in SCHEMA
            walked.add((descriptor.full_name, field.name))
    assert walked == _edges_to_tensors()  # every edge through which onnx can reach a TensorProto
    raw = onnx.TensorProto.DESCRIPTOR.fields_by_number[RAW_DATA]
    assert (raw.name, raw.type) == ("raw_data", FieldDescriptor.TYPE_BYTES)


def _restore(message: Message, found: Skeleton, data: bytes) -> None:
    """Put every raw_data's real bytes back in place of its placeholder."""
    if message.DESCRIPTOR.full_name == "onnx.TensorProto" and message.HasField("raw_data"):
        offset, length = found.locate(message.raw_data)
        message.raw_data = data[offset : offset + length]
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _restore(item, found, data)


def _parse(data: bytes) -> bytes | None:
    """onnx.load's parse of data, serialized deterministically; None when protobuf refuses it."""
    try:
        return bytes(onnx.load_model_from_string(data).SerializeToString(deterministic=True))
    except DecodeError:
        return None


def _verdict(path: Path, data: bytes | None = None) -> str:
    """'same' when the skeleton parses to what the file parses to, 'refused' when both refuse,
    'whole' when the walker leaves the file to a whole parse; anything else is a difference.
    data: the file's bytes, walked in memory (without a file to write)."""
    if data is None:
        data = path.read_bytes()
    expected = _parse(data)
    try:
        found = skeleton(str(path)) if path.exists() else skeleton_of(data, str(path))
    except InputError as exc:
        assert "\n" not in exc.message
        return "refused" if expected is None else f"walker refuses ({exc.message}), protobuf accepts"
    if found is None:
        return "whole"
    try:
        model = onnx.load_model_from_string(found.data)
    except DecodeError:
        return "refused" if expected is None else "the skeleton is refused, the file is not"
    if expected is None:
        return "the skeleton parses, the file does not"
    _restore(model, found, data)
    return "same" if model.SerializeToString(deterministic=True) == expected else "different"


WIRE_CASES = [case for case in make_hostile.CASES if case.name.startswith(("onnx_wire_", "onnx_ok_wire_"))]


@pytest.mark.parametrize("case", [c for c in WIRE_CASES if c.committed], ids=lambda c: c.name)
def test_crafted_spellings_parse_as_the_file_parses(case: Any) -> None:
    path = ROOT / "fixtures" / "hostile" / case.name
    expected = {"whole"} if "parsed whole" in case.attacks else {"same", "refused"}
    assert _verdict(path) in expected


def test_every_corpus_model_is_walked_and_parses_as_the_file_parses(corpus: Corpus) -> None:
    """Real exporters' files (torch's TorchScript and dynamo exporters, onnx.helper) go through the
    walker, not the whole parse, so the differential tests compare the walker's reading."""
    generated = sorted(p for p in GENERATED.rglob("*.onnx") if p.is_file())
    assert len(generated) >= 8
    verdicts = {str(p.relative_to(GENERATED)): _verdict(p) for p in generated}
    assert verdicts == dict.fromkeys(verdicts, "same")
    malformed = sorted(MALFORMED.glob("*.onnx"))
    assert {_verdict(p) for p in malformed} <= {"same", "refused"}


def _seeds() -> list[bytes]:
    return [
        wire._raw_everywhere(),
        wire._padded(),
        wire._mistyped(),
        wire.model(wire.tensor_head() + wire.ld(9, b"\0" * 4) + wire.ld(9, bytes(range(256)))),
        wire.model(
            wire.tensor_head((2,)) + wire.tag(4, 5) + b"\0\0\x80\x3f" + wire.tag(4, 5) + b"\0\0\0\x40",
            graph_tail=wire.tag(99, 0) + wire.varint(1 << 63) + wire.tag(98, 5) + b"abcd",
        ),
    ]


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """A byte edit: truncate, overwrite, insert or delete a few bytes, or duplicate a slice."""
    buf = bytearray(data)
    at = rng.randrange(len(buf))
    action = rng.randrange(5)
    if action == 0:
        return bytes(buf[:at])
    if action == 1:
        buf[at] = rng.choice((0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x2A, 0x4A, 0x12, rng.randrange(256)))
    elif action == 2:
        buf[at:at] = rng.randbytes(rng.randrange(1, 4))
    elif action == 3:
        del buf[at : at + rng.randrange(1, 4)]
    else:
        end = min(len(buf), at + rng.randrange(1, 40))
        buf[at:at] = buf[at:end]
    return bytes(buf)


MUTATIONS = 20_000


def test_mutated_files_parse_as_the_file_parses(tmp_path: Path) -> None:
    rng = random.Random(20261201)
    counts: dict[str, int] = {}
    differences = []
    seeds = _seeds()
    path = tmp_path / "m.onnx"
    for index in range(MUTATIONS):
        data = rng.choice(seeds)
        for _ in range(rng.randint(1, 2)):
            data = _mutate(data, rng) or data
        verdict = _verdict(path, data)  # path does not exist: walked in memory
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict not in ("same", "refused", "whole"):
            differences.append(f"mutation {index}: {verdict}: {data.hex()}")
    assert differences == []
    # every verdict occurs often (about 12% same, 58% refused, 30% whole with this seed)
    assert min(counts["same"], counts["refused"], counts["whole"]) > MUTATIONS // 20


def test_limits_leave_the_file_to_a_whole_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(wire.deep_model((onnx_wire.MAX_ONNX_DEPTH - 1) // 3))  # 101 deep: protobuf accepts
    assert skeleton(str(path)) is None
    with OnnxReader().read(str(path)) as opened:  # read as before, through the whole parse
        storage = opened.checkpoint.storages["E"]
        assert storage.file_offset == -1 and bytes(opened.store.buffer(storage)) == wire.weights(64)
    path.write_bytes(wire._raw_everywhere())
    assert skeleton(str(path)) is not None
    monkeypatch.setattr(onnx_wire, "MAX_ONNX_FIELDS", 10)
    assert skeleton(str(path)) is None
    monkeypatch.undo()
    # past protobuf's 2 GiB (scaled down here): the file itself, or a skeleton grown by placeholders
    tiny = wire.model(wire.tensor_head((1,)) + wire.ld(9, b"\0" * 4))  # 4 bytes -> an 8-byte placeholder
    path.write_bytes(tiny)
    assert skeleton(str(path)) is not None
    monkeypatch.setattr(onnx_wire, "PROTOBUF_LIMIT", len(tiny))
    assert skeleton(str(path)) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (wire.model(wire.tensor_head() + wire.tag(9, 2) + b"\x80\x80"), "varint runs past the end"),
        (wire.model(wire.tensor_head() + wire.tag(9, 2) + wire.varint(300) + bytes(256)), "length 300"),
        (wire.model(wire.tag(1, 0) + b"\xff" * 10 + b"\x01"), "longer than 10 bytes"),
        (wire.model(wire.tensor_head() + wire.tag(3, 1) + b"1234"), "fixed-width value"),
        (wire.model(graph_tail=wire.tag(5, 6)), "wire type 6"),
    ],
)
def test_what_the_walker_refuses_protobuf_refuses(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    assert _parse(data) is None
    with pytest.raises(InputError) as refused:
        OnnxReader().read(str(path))
    assert message in refused.value.message and "not a valid ONNX protobuf" in refused.value.message
    assert "\n" not in str(refused.value)


def _typed(name: str, data_type: int, values: np.ndarray, field: str) -> TensorProto:
    proto = TensorProto(name=name, data_type=data_type, dims=list(values.shape))
    getattr(proto, field).extend(values.ravel().tolist())
    return proto


TYPED = [
    _typed("f", TensorProto.FLOAT, np.array([[1.5, -2.0], [3.0, 4.25]], np.float32), "float_data"),
    _typed("i32", TensorProto.INT32, np.array([1, -2, 2**31 - 1], np.int32), "int32_data"),
    _typed("i64", TensorProto.INT64, np.array([-(2**63), 5], np.int64), "int64_data"),
    _typed("d", TensorProto.DOUBLE, np.array([0.1, -1e300]), "double_data"),
    _typed("u64", TensorProto.UINT64, np.array([2**64 - 1, 3], np.uint64), "uint64_data"),
    _typed("u32", TensorProto.UINT32, np.array([2**32 - 1], np.uint32), "uint64_data"),
    _typed("i8", TensorProto.INT8, np.array([-128, 127], np.int8), "int32_data"),
    _typed("u8", TensorProto.UINT8, np.array([0, 255], np.uint8), "int32_data"),
    _typed("h", TensorProto.FLOAT16, np.array([1.0, -2.5], np.float16).view(np.uint16), "int32_data"),
    _typed("b", TensorProto.BOOL, np.array([1, 0, 1], np.uint8), "int32_data"),
]


def test_typed_fields_and_raw_data_read_as_onnx_reads(tmp_path: Path) -> None:
    """Typed-field initializers are decoded from the skeleton (held in memory); raw ones, in the main
    graph, a subgraph and a Constant, are served from the file at the offset of their bytes."""
    path = tmp_path / "m.onnx"
    raw = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "r")
    sub_init = numpy_helper.from_array(np.arange(5, dtype=np.int64), "s")
    branch = helper.make_graph([helper.make_node("Identity", ["s"], ["k"])], "then", [], [], [sub_init])
    branch.output.add(name="k")
    constant = numpy_helper.from_array(np.array([7, 8], np.int16), "v")
    nodes = [
        helper.make_node("If", ["cond"], ["o"], then_branch=branch, else_branch=branch, name="if"),
        helper.make_node("Constant", [], ["c"], value=constant),
    ]
    graph = helper.make_graph(nodes, "g", [], [], [*TYPED, raw])
    onnx.save_model(helper.make_model(graph), path)
    loaded = onnx.load(path)
    protos = [*loaded.graph.initializer, sub_init, constant]
    expected = {p.name: numpy_helper.to_array(p) for p in protos}
    expected["c"] = expected.pop("v")  # a Constant's tensor is named by its output
    file_bytes = path.read_bytes()
    with OnnxReader().read(str(path)) as opened:
        ckpt = opened.checkpoint
        for tensor in ckpt.tensors:
            want = np.ascontiguousarray(expected[tensor.name.rsplit("/", 1)[-1]]).tobytes()
            assert opened.array(tensor).tobytes() == want, tensor.name
            storage = ckpt.storages[tensor.storage_id]
            if tensor.name in {t.name for t in TYPED}:
                assert storage.file_offset == -1  # decoded from typed fields: held in memory
            else:
                view = file_bytes[storage.file_offset : storage.file_offset + storage.nbytes]
                assert storage.file == "m.onnx" and view == opened.array(tensor).tobytes()
        assert sorted(ckpt.names) == sorted([*expected, "if/then_branch/s"])  # both branches hold s


def test_a_64_mib_initializer_is_served_from_the_map_not_copied(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    weight = np.ones((4096, 4096), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "ids"], ["h"])], "g", [], [], [numpy_helper.from_array(weight, "W")]
    )
    onnx.save_model(helper.make_model(graph), path)
    with OnnxReader().read(str(path)) as opened:
        storage = opened.checkpoint.storages["W"]
        assert storage.file_offset > 0 and storage.nbytes == weight.nbytes
        view = opened.store.buffer(storage)
        assert isinstance(view.obj, onnx_wire.mmap.mmap)  # a view of the file's map
        del view
    # a child process: peak RSS after reading grows by far less than the 64 MiB the weight holds
    small = tmp_path / "small.onnx"
    small.write_bytes(wire._raw_everywhere())
    script = textwrap.dedent(
        f"""
        import re
        from tieaudit.formats.onnx_model import OnnxReader
        def peak_kib():  # VmHWM: this process's own peak (ru_maxrss carries the parent's across exec)
            return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1])
        OnnxReader().read({str(small)!r}).close()  # warm: imports, a first parse
        before = peak_kib()
        with OnnxReader().read({str(path)!r}) as opened:
            assert opened.checkpoint.storages["W"].nbytes == 64 << 20
        print(peak_kib() - before)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    grown_kib = int(child.stdout)
    assert grown_kib < 8 << 10
