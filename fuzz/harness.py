"""What the fuzzers feed the readers, and what they check: shared by tests/test_fuzz_readers.py
(hypothesis, bounded) and fuzz/run.py (atheris or hypothesis, long runs).

An input is a ``kind`` (which reader) and bytes. Multi-file kinds (a model folder, an ONNX model
with external data) are bundles: files joined by BUNDLE_SEP, each starting with its name on one
line. Mutators take a ``random.Random``, so hypothesis (``st.randoms()``), atheris (a seed) and a
plain loop drive the same code.

``check_one`` reads the input with the kind's reader and returns what happened. Allowed: a
TieauditError (the input was refused), or an OpenCheckpoint whose every tensor lies inside its
storage and can be viewed. Anything else escapes as an exception: that is a crash.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import random
import re
import signal
import struct
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "fixtures" / "hostile"
GENERATED = ROOT / "fixtures" / "generated"
sys.path.insert(0, str(HOSTILE))
import make_hostile as mh  # type: ignore[import-not-found]  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutators_trust as trust  # type: ignore[import-not-found]  # noqa: E402

if TYPE_CHECKING:
    import onnx

KINDS = ("safetensors", "torch-zip", "torch-legacy", "onnx", "onnx-external", "hf-dir", "sniff")
BUNDLE_SEP = b"\n--tieaudit-fuzz-file--\n"
MARKER = mh.MARKER
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")

EXEC_MODULES = frozenset(
    "os posix nt subprocess runpy pty importlib ctypes socket shutil code codeop pickle _pickle marshal "
    "sys webbrowser platform commands popen2 multiprocessing asyncio".split()
)
EXEC_BUILTINS = frozenset(
    "eval exec getattr setattr delattr compile __import__ open globals locals vars breakpoint input".split()
)
_REFUSED = re.compile(
    r"pickle references (\S+), which is not on the allowlist"  # the strict policy
    r"|(?:INST|STACK_GLOBAL) \(0x[0-9a-f]+\) of (\S+),"  # an opcode refused by name
    r"|its pickle also names (\S+), which runs code"  # an unreadable file naming code to run
)


class Crash(Exception):
    """An input broke a reader's contract (raised by the harness, never by tieaudit)."""


class Hang(Crash):
    """An input ran past its time budget."""


def is_exec_primitive(spelled: str) -> bool:
    """Whether a refused global could run code or commands (os.system, builtins.eval, ...)."""
    module, _, name = spelled.strip("'\"").partition(".")
    if module in ("builtins", "__builtin__"):
        return name in EXEC_BUILTINS
    return module in EXEC_MODULES or any(
        part in spelled for part in ("__globals__", "__builtins__", "__code__")
    )


def refused_global(message: str) -> str | None:
    found = _REFUSED.search(message)
    return next((group for group in found.groups() if group), None) if found else None


# --- bundles ------------------------------------------------------------------------------------


def pack(files: dict[str, bytes]) -> bytes:
    return BUNDLE_SEP.join(name.encode() + b"\n" + data for name, data in files.items())


def unpack(data: bytes) -> dict[str, bytes]:
    """The files of a bundle; sections without a plain file name are dropped."""
    files: dict[str, bytes] = {}
    for section in data.split(BUNDLE_SEP):
        name, _, content = section.partition(b"\n")
        text = name.decode("ascii", "replace")
        if _NAME.fullmatch(text) and text not in (".", "..") and text not in files:
            files[text] = content
    return files


# --- reading and the contract ------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one input did."""

    label: str
    """accepted, rejected, or blocked-exec (a global that could run code, refused, or read as an inert
    placeholder and reported as TIE010)."""
    detail: str = ""
    """The error message, or the tensor count."""


def materialize(kind: str, data: bytes, folder: Path) -> Path:
    """Write the input into folder; returns the path to read."""
    if kind in ("onnx-external", "hf-dir"):
        model = folder / "model"
        model.mkdir()
        for name, content in unpack(data).items():
            (model / name).write_bytes(content)
        return model / "model.onnx" if kind == "onnx-external" else model
    name = {"safetensors": "model.safetensors", "onnx": "model.onnx", "sniff": "model.bin"}.get(
        kind, "model.pt"
    )
    path = folder / name
    path.write_bytes(data)
    return path


def _reader(kind: str) -> Callable[[str], object]:
    from tieaudit.formats import open_checkpoint
    from tieaudit.formats.hf_reader import HfDirReader
    from tieaudit.formats.onnx_model import OnnxReader
    from tieaudit.formats.safetensors import SafetensorsReader
    from tieaudit.formats.torch_file import TorchReader

    readers: dict[str, Callable[[str], object]] = {
        "safetensors": SafetensorsReader().read,
        "torch-zip": TorchReader().read,
        "torch-legacy": TorchReader().read,
        "onnx": OnnxReader().read,
        "onnx-external": OnnxReader().read,
        "hf-dir": HfDirReader().read,
        "sniff": open_checkpoint,
    }
    return readers[kind]


def check_checkpoint(opened: object) -> int:
    """Every tensor inside its storage and viewable; every storage inside its file. Returns the count."""
    from tieaudit.core.bytestore import OpenCheckpoint
    from tieaudit.core.dtypes import itemsize

    if not isinstance(opened, OpenCheckpoint):
        raise Crash(f"reader returned {type(opened).__name__}, not an OpenCheckpoint")
    ckpt = opened.checkpoint
    for stored in ckpt.storages.values():
        if len(opened.store.buffer(stored)) != stored.nbytes:
            raise Crash(f"storage {stored.storage_id!r} is not {stored.nbytes} bytes long")
    for tensor in ckpt.tensors:
        storage = ckpt.storages.get(tensor.storage_id)
        if storage is None:
            raise Crash(f"tensor {tensor.name!r} points at a missing storage {tensor.storage_id!r}")
        if len(tensor.shape) != len(tensor.strides) or min((*tensor.shape, *tensor.strides), default=0) < 0:
            raise Crash(f"tensor {tensor.name!r} has shape {tensor.shape} and strides {tensor.strides}")
        start, end = tensor.byte_span()
        if not 0 <= start <= end <= storage.nbytes:
            raise Crash(
                f"tensor {tensor.name!r} spans bytes {start}..{end} of a {storage.nbytes}-byte storage"
            )
        array = opened.array(tensor)
        if array.shape != tensor.shape or array.dtype.itemsize != itemsize(tensor.dtype):
            raise Crash(f"tensor {tensor.name!r} viewed as {array.shape} {array.dtype}")
        if array.size:  # touch the first and last element
            _ = array[(0,) * array.ndim], array[tuple(dim - 1 for dim in array.shape)]
    return len(ckpt.tensors)


def check_one(kind: str, data: bytes, folder: Path, audit: bool = False) -> Outcome:
    """Read one input; an allowed outcome is returned, anything else raises (a crash).

    With audit, an accepted checkpoint also goes through the alias graph and the rules, as the CLI
    takes it (TieauditErrors from there are allowed too).
    """
    from tieaudit.core.errors import TieauditError

    path = materialize(kind, data, folder)
    try:
        opened = _reader(kind)(str(path))
    except TieauditError as exc:
        spelled = refused_global(exc.message)
        return Outcome("blocked-exec" if spelled and is_exec_primitive(spelled) else "rejected", exc.message)
    finally:
        if (folder / MARKER).exists() or Path(MARKER).exists():
            raise Crash("pickle code ran: the payload's marker file exists")
    from tieaudit.core.bytestore import OpenCheckpoint

    assert isinstance(opened, OpenCheckpoint)
    with opened:
        count = check_checkpoint(opened)
        if audit:
            try:
                _audit(opened)
            except TieauditError as exc:
                return Outcome("rejected", exc.message)
        runs = [g.name for g in opened.checkpoint.pickle_globals if g.verdict == "runs-code"]
    if runs:  # read with inert placeholders: the code is named (TIE010), nothing was called
        return Outcome("blocked-exec", f"{count} tensors; names {', '.join(runs)}")
    return Outcome("accepted", f"{count} tensors")


def _audit(opened: object) -> None:
    """What the CLI does after reading: the alias graph, the rules, and the JSON and text reports."""
    from tieaudit.audit import Audit
    from tieaudit.core.bytestore import OpenCheckpoint
    from tieaudit.graph.alias import build_graph
    from tieaudit.report import render
    from tieaudit.rules.policy import Policy
    from tieaudit.rules.registry import evaluate

    assert isinstance(opened, OpenCheckpoint)
    graph = build_graph(opened.checkpoint)
    audit = Audit(graph, evaluate(graph, opened, Policy()))
    json.loads(render(audit, "json", color=False))
    render(audit, "text", color=False)


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread if the block runs longer than seconds (SIGALRM)."""

    def expired(signum: int, frame: object) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- byte mutations ----------------------------------------------------------------------------

INTERESTING = (
    0,
    1,
    -1,
    7,
    8,
    255,
    256,
    2**15,
    2**16,
    2**31 - 1,
    -(2**31),
    2**32,
    2**53,
    2**62,
    2**63,
    2**64 - 1,
)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One byte edit: flip, truncate, insert, delete, overwrite, duplicate, or an interesting integer."""
    out = bytearray(data)
    size = len(out)
    pos = rng.randrange(size + 1)
    action = rng.randrange(8)
    if action == 0 and size:
        out[min(pos, size - 1)] ^= 1 << rng.randrange(8)
    elif action == 1:
        del out[rng.randrange(size + 1) :]
    elif action == 2:
        out[pos:pos] = rng.randbytes(rng.choice((1, 2, 4, 8, rng.randrange(1, 64))))
    elif action == 3:
        del out[pos : pos + rng.choice((1, 2, 4, 8, rng.randrange(1, 256)))]
    elif action == 4 and size:
        chunk = rng.randbytes(rng.choice((1, 4, 8)))
        out[pos : pos + len(chunk)] = chunk
    elif action == 5 and size:
        start = rng.randrange(size)
        out[pos:pos] = out[start : start + rng.randrange(1, 128)]
    elif action == 6:
        width = rng.choice((1, 2, 4, 8))
        value = rng.choice(INTERESTING) % (1 << (8 * width))
        out[pos : pos + width] = value.to_bytes(width, "little")
    else:
        out[pos:pos] = rng.choice(
            (b"\x00" * 8, b"\xff" * 8, b"{", b"}", b'"', b"PK\x03\x04", b"\x80\x02", b".")
        )
    return bytes(out)


# --- pickle mutations --------------------------------------------------------------------------

GLOBALS = (
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("collections", "OrderedDict"),
    ("torch", "FloatStorage"),
    ("torch", "HalfStorage"),
    ("torch", "UntypedStorage"),
    ("torch", "bfloat16"),
    ("torch", "Size"),
    ("torch", "device"),
    ("builtins", "set"),
    ("builtins", "range"),
    ("builtins", "bytearray"),
    ("_codecs", "encode"),
    ("numpy", "dtype"),
    ("posix", "system"),
    ("builtins", "eval"),
    ("builtins", "exec"),
    ("builtins", "getattr"),
    ("__builtin__", "__import__"),
    ("subprocess", "Popen"),
    ("runpy", "_run_code"),
    ("torch._utils", "_rebuild_tensor_v2.__globals__"),
    ("__main__", "Model"),
)
STRINGS = (
    "",
    "0",
    "1",
    "storage",
    "cpu",
    "cuda:0",
    "../x",
    "/etc/passwd",
    "a" * 300,
    "\x00",
    "conj",
    "weight",
)
SNIPPETS = (
    b"r" + struct.pack("<I", 1 << 28),  # LONG_BINPUT far beyond the memo
    b"j" + struct.pack("<I", 1 << 28),  # LONG_BINGET of nothing
    b"(" * 64,
    b"]q\x00h\x00a",  # a self-referencing list
    b"N",
    b"0",
    b"t",
    b"R",
    b"b",
    b"Q",
    b"s",
    b"u",
    b"e",
    b"\x82\x01",  # EXT1
    b"\x8d" + struct.pack("<Q", 1 << 40),  # BINUNICODE8 of 2**40 bytes
    b"\x8e" + struct.pack("<Q", 1 << 33),  # BINBYTES8 of 8 GiB
    b"\x93",
    b"h\x00",
    b".",
    b"K\x01" + b"\x85" * 5000,  # a tuple nested 5000 deep (hash recursion when used as a key)
    b"\x8b" + struct.pack("<i", 2080) + b"\x7f" * 2080,  # LONG4 of 5000 digits
    b"I" + b"9" * 5000 + b"\n",  # a protocol-0 INT of 5000 digits
    b"\x8a\xff" + b"\x11" * 255,  # the widest LONG1
    b"\x95" + struct.pack("<Q", 8),  # FRAME
    b"}(X\x04\x00\x00\x00dataN" + b"u",  # an attribute state naming data
)


def _ops(data: bytes) -> list[tuple[str, object, int, int]]:
    """(opcode name, argument, start, end) of each opcode, through STOP."""
    found: list[tuple[str, object, int, int]] = []
    previous: tuple[str, object, int] | None = None
    stream = io.BytesIO(data)
    for opcode, arg, pos in pickletools.genops(stream):
        start = pos if pos is not None else 0
        if previous is not None:
            found.append((*previous, start))
        previous = (opcode.name, arg, start)
    if previous is not None:
        found.append((*previous, stream.tell()))
    return found


def mutate_pickle(data: bytes, rng: random.Random) -> bytes:
    """One opcode-level edit (delete, duplicate, swap, new integer, new global, new string, insert),
    falling back to a byte edit when the pickle no longer parses."""
    try:
        ops = _ops(data)
    except Exception:
        return mutate_bytes(data, rng)
    if not ops:
        return mutate_bytes(data, rng)
    name, arg, start, end = rng.choice(ops)
    action = rng.randrange(7)
    if action == 0:
        return data[:start] + data[end:]
    if action == 1:
        return data[:end] + data[start:end] + data[end:]
    if action == 2:
        _, _, start2, end2 = rng.choice(ops)
        (a, b), (c, d) = sorted(((start, end), (start2, end2)))
        if b <= c:
            return data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:]
        return data
    if action == 3:
        ints = [op for op in ops if isinstance(op[1], int) and not isinstance(op[1], bool)]
        if ints:
            _, _, start, end = rng.choice(ints)
            return data[:start] + mh.integer(rng.choice(INTERESTING)) + data[end:]
    if action == 4:
        globals_ = [op for op in ops if op[0] in ("GLOBAL", "INST")]
        if globals_:
            _, _, start, end = rng.choice(globals_)
            return data[:start] + mh.glob(*rng.choice(GLOBALS)) + data[end:]
        return data[:start] + mh.glob(*rng.choice(GLOBALS)) + data[start:]
    if action == 5:
        strings = [op for op in ops if isinstance(op[1], str) and op[0] != "GLOBAL"]
        if strings:
            _, _, start, end = rng.choice(strings)
            return data[:start] + mh.text(rng.choice(STRINGS)) + data[end:]
    snippets = trust.DEEP_SNIPPETS if rng.random() < 0.2 else SNIPPETS
    return data[:start] + rng.choice(snippets) + data[start:]


# --- zip (torch.save) mutations ----------------------------------------------------------------


def _members(data: bytes) -> list[mh.Member]:
    archive = zipfile.ZipFile(io.BytesIO(data))
    return [mh.Member(info.filename, archive.read(info), info.compress_type) for info in archive.infolist()]


def mutate_torch_zip(data: bytes, rng: random.Random) -> bytes:
    """Mostly the pickle (rebuilt into the archive); sometimes names, duplicates or compression."""
    try:
        members = _members(data)
    except Exception:
        return mutate_bytes(data, rng)
    pickles = [m for m in members if m.name.endswith("data.pkl")]
    action = rng.randrange(17)
    if action >= 13:  # 13..16: the layout attacks of mutators_trust (case twins of data.pkl, glue...)
        return _mutate_zip_layout(data, members, rng, action - 3)
    if action < 6 and pickles:
        pickles[0].data = mutate_pickle(pickles[0].data, rng)
    elif action == 6 and members:
        member = rng.choice(members)
        member.name = rng.choice(
            ("../x", "/abs", "a/../../b", member.name + "/", pickles[0].name if pickles else "x")
        )
    elif action == 7 and members:
        members.append(rng.choice(members))
    elif action == 8 and members:
        member = rng.choice(members)
        member.compress = rng.choice(
            (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
        )
    elif action in (9, 10) and members:
        # Names torch folds together (miniz finds members case-insensitively) or cuts (NUL).
        member = rng.choice(members)
        twin = mh.Member(
            rng.choice((member.name.upper(), member.name.swapcase(), member.name + "\x00x")), b""
        )
        twin.data = mutate_bytes(member.data, rng) if member.data and rng.randrange(2) else member.data
        members.insert(rng.randrange(len(members) + 1), twin)
    elif action == 11:
        return _glued(data, rng)
    elif members:
        member = rng.choice(members)
        member.data = mutate_bytes(member.data, rng)
    try:
        return mh.zip_of(members)
    except Exception:
        return mutate_bytes(data, rng)


def _mutate_zip_layout(data: bytes, members: list[mh.Member], rng: random.Random, action: int) -> bytes:
    """The attacks on how torch finds members: a letter-case twin (an evil pickle, or any member's
    bytes), another first entry, a missing version record, glued, padded or flagged archives."""
    if action == 10 and members:
        model = rng.choice(members)
        evil = mh.pickle_of(mh.os_system()) if model.name.endswith("data.pkl") else model.data
        twin = mh.Member(trust.swap_case(model.name, rng), evil, model.compress)
        members.insert(rng.randrange(len(members) + 1), twin)
    elif action == 11 and members:
        rng.shuffle(members)
        if rng.random() < 0.5:
            members.insert(0, mh.Member(rng.choice(("other/x", "x", "ARCHIVE/data.pkl")), b"3\n"))
    elif action == 12:
        members = [m for m in members if not m.name.endswith("version")]
    else:
        other = rng.choice((mh.valid_torch_zip(), mh._zip_with_evil(mh.os_system())))
        return trust.mutate_archive_bytes(data, other, rng)
    try:
        return mh.zip_of(members)
    except Exception:
        return mutate_bytes(data, rng)


def _glued(data: bytes, rng: random.Random) -> bytes:
    """The archive with bytes before or after it, or two archives glued (zipfile and miniz then
    locate records differently)."""
    junk = rng.choice((b"PK\x03\x04" + bytes(60), bytes(rng.randrange(1, 100)), data))
    return junk + data if rng.randrange(2) else data + junk


def mutate_torch_legacy(data: bytes, rng: random.Random) -> bytes:
    """One of the five pickles of a legacy stream (usually the object pickle), or a byte edit."""
    try:
        bounds, position = [], 0
        for _ in range(5):
            stream = io.BytesIO(data[position:])
            for _ in pickletools.genops(stream):
                pass
            bounds.append((position, position + stream.tell()))
            position += stream.tell()
    except Exception:
        return mutate_bytes(data, rng)
    if rng.random() < 0.25:
        return mutate_bytes(data, rng)
    start, end = bounds[3] if rng.random() < 0.6 else rng.choice(bounds)
    return data[:start] + mutate_pickle(data[start:end], rng) + data[end:]


# --- safetensors mutations ---------------------------------------------------------------------

DTYPES = (
    "F32",
    "F16",
    "BF16",
    "F64",
    "I64",
    "U8",
    "BOOL",
    "F8_E4M3",
    "C64",
    "Q7",
    "",
    "f32",
    5,
    None,
    ["F32"],
)
SHAPES: tuple[object, ...] = (
    [],
    [0],
    [-1],
    [2**63],
    [2**70, 0],
    [0, 2**70],
    [1] * 65,
    [3, 5],
    "4",
    [1.5],
    [True],
)


def _split_safetensors(data: bytes) -> tuple[dict[str, object], bytes] | None:
    if len(data) < 8:
        return None
    (length,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + length])
    except Exception:
        return None
    return (header, data[8 + length :]) if isinstance(header, dict) else None


def _offsets(rng: random.Random, pair: object) -> object:
    begin, end = pair if isinstance(pair, list) and len(pair) == 2 else (0, 0)
    begin, end = (begin, end) if isinstance(begin, int) and isinstance(end, int) else (0, 0)
    delta = rng.choice((1, 2, 4, 8, 16, 2**32, 2**64))
    return rng.choice(
        (
            [end, begin],
            [begin, end + delta],
            [begin - delta, end],
            [begin + delta, end + delta],
            [begin],
            [0, 2**64],
        )
    )


def mutate_header(header: dict[str, object], rng: random.Random) -> None:
    """One edit of a safetensors header (in place)."""
    names = [k for k in header if k != "__metadata__"]
    action = rng.randrange(8)
    if not names or action == 7:
        header["__metadata__"] = rng.choice(
            (
                {},
                {"a": 1},
                [],
                {"tieaudit.ties": "{"},
                {"tieaudit.ties": '{"x": {"source": 1}}'},
                {"x": names[0] if names else "y"},
            )
        )
        return
    name = rng.choice(names)
    entry = header[name]
    if not isinstance(entry, dict):
        header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
        return
    if action == 0:
        entry["dtype"] = rng.choice(DTYPES)
    elif action == 1:
        entry["shape"] = (
            rng.choice(SHAPES)
            if rng.random() < 0.5
            else [rng.randrange(0, 9) for _ in range(rng.randrange(4))]
        )
    elif action == 2:
        entry["data_offsets"] = _offsets(rng, entry.get("data_offsets"))
    elif action == 3:
        entry.pop(rng.choice(("dtype", "shape", "data_offsets")), None)
    elif action == 4:
        header[name + rng.choice(("", "_copy", "\x00", "/../x"))] = dict(entry)
    elif action == 5:
        del header[name]
    else:
        other = header.get(rng.choice(names))
        if isinstance(other, dict):
            entry["data_offsets"] = other.get("data_offsets")


def _mutate_safetensors_trust(data: bytes, rng: random.Random) -> bytes:
    """Duplicate keys, bytes no tensor covers, sizes out of proportion, names attacking a log."""
    (length,) = struct.unpack("<Q", data[:8])
    raw, body = data[8 : 8 + length], data[8 + length :]
    action = rng.randrange(4)
    if action == 0:
        raw = trust.safetensors_duplicate_key(raw, rng)
    elif action == 1:
        body += rng.choice((b"\x00", b"\x00" * 8, rng.randbytes(64)))
    else:
        parts = _split_safetensors(data)
        if parts is None:
            return mutate_bytes(data, rng)
        header, body = parts
        names = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
        if not names:
            return mutate_bytes(data, rng)
        name = rng.choice(names)
        if action == 2:
            header[name]["shape"] = rng.choice(trust.HUGE_DIMS)  # type: ignore[index]
        else:
            header[trust.evil_name(name, rng)] = header.pop(name)
        raw = json.dumps(header).encode()
        if action == 2 and rng.random() < 0.3:
            raw = raw.replace(b'"shape": [', b'"shape": [' + trust.DIGITS_5000.encode() + b", ", 1)
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


INJECTED: tuple[bytes, ...] = (
    b"NaN",
    b"-Infinity",
    b"1e400",
    b"-0",
    b"9" * 5000,
    b"9" * 300,
    b'"\\ud800"',
    b"[" * 200 + b"]" * 200,
    b'{"k":1,"k":2}',
)
"""JSON values Python's json reads and the safetensors library's serde_json refuses (or reads
differently), put into a tensor entry by ``_raw_header``."""


def _raw_header(header: dict[str, object], rng: random.Random) -> bytes:
    """The header as JSON text, sometimes spelled in ways only the raw text can hold: a key twice,
    an injected value, a byte order mark, UTF-16, NUL padding."""
    pairs = [json.dumps(k).encode() + b":" + json.dumps(v).encode() for k, v in header.items()]
    action = rng.randrange(6)
    if pairs and action == 0:
        pairs.insert(rng.randrange(len(pairs) + 1), rng.choice(pairs))  # a duplicate key
    elif pairs and action == 1:
        index = rng.randrange(len(pairs))
        if pairs[index].endswith(b"}"):
            pairs[index] = pairs[index][:-1] + b', "x": ' + rng.choice(INJECTED) + b"}"
    raw = b"{" + b", ".join(pairs) + b"}"
    if action == 2:
        raw = rng.choice((b"\xef\xbb\xbf", b" \n")) + raw
    elif action == 3:
        raw = raw.decode().encode("utf-16")
    return raw + (b"\x00" if action == 4 else b" ") * (-len(raw) % 8)


def mutate_safetensors(data: bytes, rng: random.Random) -> bytes:
    parts = _split_safetensors(data)
    if parts is None or rng.random() < 0.2:
        return mutate_bytes(data, rng)
    if rng.random() < 0.2:
        return _mutate_safetensors_trust(data, rng)
    header, body = parts
    mutate_header(header, rng)
    if rng.random() < 0.25:
        raw = _raw_header(header, rng)
    else:
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
    if rng.random() < 0.1:  # bytes after the last tensor that no tensor covers
        body += rng.choice((b"\x00", b"\x00" * 8, b"PK\x03\x04"))
    length = len(raw)
    if rng.random() < 0.15:
        length = rng.choice((length - 1, length + 8, 0, 100_000_000, 2**64 - 1, len(raw) + len(body)))
    if rng.random() < 0.15:
        body = body[: rng.randrange(len(body) + 1)]
    return struct.pack("<Q", length % 2**64) + raw + body


# --- ONNX mutations ----------------------------------------------------------------------------

LOCATIONS = (
    "w.bin",
    "weights.bin",
    "../w.bin",
    "/etc/passwd",
    "sub/w.bin",
    "w.bin\x00x",
    "",
    ".",
    "..\\w.bin",
)
COUNTS = ("0", "64", "4096", "32768", "9" * 30, "-1", "abc", "")


def mutate_onnx(data: bytes, rng: random.Random) -> bytes:
    """One edit of a ModelProto's initializers, nodes or metadata; a byte edit when it no longer parses."""
    import onnx
    from onnx import TensorProto, helper

    try:
        model = onnx.ModelProto.FromString(data)
    except Exception:
        return mutate_bytes(data, rng)
    graph = model.graph
    inits = list(graph.initializer)
    action = rng.randrange(13)
    if inits and action < 5:
        init = rng.choice(graph.initializer)
        if action == 0:
            del init.dims[:]
            init.dims.extend(rng.choice(([0], [-1], [2**62, 2**62], [1] * 65, [4, 4], [rng.randrange(9)])))
        elif action == 1:
            init.data_type = rng.choice((0, 1, 2, 7, 8, 10, 16, 17, 22, 23, 40, 10**6))
        elif action == 2:
            init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data) + 1)] + rng.randbytes(
                rng.randrange(5)
            )
        elif action == 3:
            init.data_location = TensorProto.EXTERNAL
            del init.external_data[:]
            for key, values in (("location", LOCATIONS), ("offset", COUNTS), ("length", COUNTS)):
                if rng.random() < 0.85:
                    init.external_data.add(key=key, value=rng.choice(values))
        else:
            init.name = rng.choice(
                ("", inits[0].name, "x" * 200, init.name + "_2", trust.evil_name(init.name, rng))
            )
    elif action == 5:
        source = rng.choice([i.name for i in inits] or ["x"])
        nodes = [helper.make_node("Identity", [source], ["a"]), helper.make_node("Identity", ["a"], [source])]
        graph.node.extend(nodes[: rng.randrange(1, 3)])
    elif action == 6:
        value = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        graph.node.append(helper.make_node("Constant", [], [rng.choice(("c", "E", ""))], value=value))
    elif action == 7:
        sub = helper.make_graph([], "sub", [], [], [helper.make_tensor("E", TensorProto.FLOAT, [1], [2.0])])
        graph.node.append(helper.make_node("If", ["cond"], ["o"], then_branch=sub, else_branch=sub))
    elif action >= 9:
        _add_unread_external(model, rng, action)
    else:
        entry = model.metadata_props.add()
        entry.key, entry.value = (
            "tieaudit.ties",
            rng.choice(("{", "[]", '{"a": {"source": "E", "relation": "cast"}}')),
        )
    try:
        return bytes(model.SerializeToString())
    except Exception:
        return mutate_bytes(data, rng)


def _add_unread_external(model: onnx.ModelProto, rng: random.Random, action: int) -> None:
    """An external tensor where tieaudit does not read tensors but a loader opens files: a sparse
    initializer, a node attribute, a function's Constant, a training graph's initializer."""
    from onnx import TensorProto, helper

    tensor = TensorProto(name="u", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, values in (("location", LOCATIONS), ("offset", COUNTS), ("length", COUNTS)):
        if rng.random() < 0.85:
            tensor.external_data.add(key=key, value=rng.choice(values))
    if action == 9:
        indices = helper.make_tensor("u_i", TensorProto.INT64, [1], [0])
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(tensor, indices, [4]))
    elif action == 10:
        model.graph.node.append(helper.make_node("ConstantOfShape", ["ids"], ["z"], value=tensor))
    elif action == 11:
        body = [helper.make_node("Constant", [], ["y"], value=tensor)]
        opsets = [helper.make_opsetid("", 17)]
        model.functions.append(helper.make_function("fz", "F", [], ["y"], body, opsets))
    else:
        model.training_info.add(initialization=helper.make_graph([], "t", [], [], [tensor]))


# --- bundles -----------------------------------------------------------------------------------

CONFIG_EDITS: tuple[tuple[str, object], ...] = (
    ("architectures", ["LlamaForCausalLM"]),
    ("architectures", ["GPT2LMHeadModel"]),
    ("architectures", ["NopeForCausalLM"]),
    ("architectures", "LlamaForCausalLM"),
    ("architectures", [5]),
    ("tie_word_embeddings", True),
    ("tie_word_embeddings", False),
    ("tie_word_embeddings", "yes"),
    ("vocab_size", -1),
    ("vocab_size", 2**70),
    ("vocab_size", "x"),
    ("text_config", {"tie_word_embeddings": True, "vocab_size": 3}),
    ("text_config", []),
)


def _mutate_json_file(data: bytes, rng: random.Random, index: bool) -> bytes:
    try:
        value = json.loads(data)
    except Exception:
        return mutate_bytes(data, rng)
    if not isinstance(value, dict) or rng.random() < 0.15:
        return mutate_bytes(data, rng)
    if index:
        weight_map = value.get("weight_map")
        if isinstance(weight_map, dict) and weight_map and rng.random() < 0.7:
            key = rng.choice(sorted(weight_map))
            files = sorted({v for v in weight_map.values() if isinstance(v, str)}) or ["x"]
            weight_map[key] = rng.choice(
                (*files, "../x.safetensors", "/etc/passwd", "missing.safetensors", 5, *UNNAMEABLE)
            )
        else:
            value[rng.choice(("weight_map", "metadata"))] = rng.choice(({}, [], {"a": "b"}, None))
    elif rng.random() < 0.1:  # nesting past hf_dir.MAX_JSON_DEPTH, or past the parser's recursion
        depth = rng.choice((65, 100_000))
        value[rng.choice(("text_config", "vocab_size"))] = DEEP
        return json.dumps(value).encode().replace(json.dumps(DEEP).encode(), b"[" * depth + b"]" * depth)
    else:
        key, new = rng.choice(CONFIG_EDITS if rng.random() < 0.7 else trust.CONFIG_ATTACKS)
        value[key] = new
    return json.dumps(value).encode()


UNNAMEABLE = ("x\x00.safetensors", "\ud800.safetensors")
"""Shard names no file can have: a NUL byte, a lone surrogate (written as a JSON escape)."""

DEEP = "tieaudit-fuzz-deep-nesting"
"""Placeholder replaced by brackets after encoding (json.dumps itself recurses once per level)."""


def mutate_bundle(data: bytes, rng: random.Random) -> bytes:
    """Edit one file of a bundle the way its kind is edited; or drop, rename or duplicate a file."""
    files = unpack(data)
    if not files:
        return mutate_bytes(data, rng)
    name = rng.choice(sorted(files))
    action = rng.randrange(10)
    if action == 0 and len(files) > 1:
        del files[name]
    elif action == 1:
        files[rng.choice(("model.safetensors", "pytorch_model.bin", name + ".bak", "model.onnx"))] = (
            files.pop(name)
        )
    elif name.endswith(".safetensors"):
        files[name] = mutate_safetensors(files[name], rng)
    elif name.endswith(".onnx"):
        files[name] = mutate_onnx(files[name], rng)
    elif name.endswith(".json"):
        files[name] = _mutate_json_file(files[name], rng, index=name.endswith("index.json"))
    elif name.endswith(".bin") and files[name][:2] == b"PK":
        files[name] = mutate_torch_zip(files[name], rng)
    else:
        files[name] = files[name][: rng.randrange(len(files[name]) + 1)]
    return pack(files)


MUTATORS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "safetensors": mutate_safetensors,
    "torch-zip": mutate_torch_zip,
    "torch-legacy": mutate_torch_legacy,
    "onnx": mutate_onnx,
    "onnx-external": mutate_bundle,
    "hf-dir": mutate_bundle,
    "sniff": mutate_bytes,
}


def _edit(kind: str, data: bytes, rng: random.Random) -> bytes:
    try:
        return mutate_bytes(data, rng) if rng.random() < 0.2 else MUTATORS[kind](data, rng)
    except Exception:
        return mutate_bytes(data, rng)


def mutate(kind: str, data: bytes, rng: random.Random, rounds: int = 1) -> bytes:
    """rounds edits: structured ones for the kind, with a byte edit now and then. Never raises: a
    structured edit that cannot be made (protobuf refusing a mutated name, ...) becomes a byte edit."""
    for _ in range(rounds):
        data = _edit(kind, data, rng)
    return data


# --- seeds -------------------------------------------------------------------------------------


def _folder(path: Path, names: tuple[str, ...] | None = None) -> bytes:
    files = {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}
    return pack({k: v for k, v in files.items() if names is None or k in names})


def seeds(generated: Path = GENERATED) -> dict[str, list[bytes]]:
    """Valid inputs per kind: small hand-built ones always, real producers' files when generated."""
    out: dict[str, list[bytes]] = {
        "safetensors": [mh.valid_safetensors()],
        "torch-zip": [mh.valid_torch_zip()],
        "torch-legacy": [mh.valid_torch_legacy()],
        "onnx": [mh.valid_onnx()],
        "onnx-external": [pack(mh.onnx_two_external())],
        "hf-dir": [
            pack(
                {
                    "config.json": json.dumps(mh.LLAMA_CONFIG).encode(),
                    "model.safetensors.index.json": mh._index({"a": "a.safetensors", "b": "b.safetensors"}),
                    "a.safetensors": mh._shard("a"),
                    "b.safetensors": mh._shard("b"),
                }
            )
        ],
        "sniff": [mh.valid_safetensors(), mh.valid_torch_zip(), mh.valid_onnx()],
    }
    real = {
        "safetensors": ["safetensors/cloned_head.safetensors", "safetensors/cast_copy.safetensors"],
        "torch-zip": [
            "torch/tied_lm.pt",
            "torch/transposed_view.pt",
            "torch/overlapping_views.pt",
            "torch/bf16_tied.pt",
        ],
        "torch-legacy": ["torch/legacy_tied.pt"],
        "onnx": ["onnx/helper_shared.onnx", "onnx/helper_subgraph.onnx"],
    }
    for kind, files in real.items():
        out[kind] += [(generated / f).read_bytes() for f in files if (generated / f).is_file()]
    for folder, kind in (("onnx/helper_shared_external", "onnx-external"), ("hf/hub_sharded_tied", "hf-dir")):
        if (generated / folder).is_dir():
            out[kind].append(_folder(generated / folder))
    if (generated / "hf/llama_tied").is_dir():
        out["hf-dir"].append(_folder(generated / "hf/llama_tied", ("config.json", "model.safetensors")))
    return out


def hostile_seeds() -> dict[str, list[bytes]]:
    """The committed hostile files tieaudit refuses, by the kind whose reader they attack (code-execution
    ones included; the valid-but-expensive cases are left to the corpus seeds)."""
    by_tag = {"zip": "torch-zip", "legacy": "torch-legacy", "safetensors": "safetensors", "onnx": "onnx"}
    out: dict[str, list[bytes]] = {kind: [] for kind in KINDS}
    for case in mh.CASES:
        path = HOSTILE / case.name
        kinds = [by_tag[tag] for tag in case.tags if tag in by_tag]
        # exit_code 0: a legitimate spelling the reader must accept, not a hostile seed; but a pickle
        # calling code (read, reported as TIE010) is one
        if case.committed and path.is_file() and kinds and (case.exit_code != 0 or case.finding == "TIE010"):
            out[kinds[-1]].append(path.read_bytes())
    return out


def all_seeds() -> dict[str, list[bytes]]:
    found = seeds()
    for kind, extra in hostile_seeds().items():
        found[kind].extend(extra)
    return found


def run_one(
    kind: str, data: bytes, scratch: Path, seconds: float | None = 10.0, audit: bool = False
) -> Outcome:
    """check_one in a fresh folder under scratch (removed after), within seconds unless None
    (under libFuzzer, whose own -timeout owns SIGALRM)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(dir=scratch))
    try:
        if seconds is None:
            return check_one(kind, data, folder, audit)
        with time_limit(seconds):
            return check_one(kind, data, folder, audit)
    finally:
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                os.chmod(path, 0o755)
        shutil.rmtree(folder, ignore_errors=True)
