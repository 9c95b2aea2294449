"""Opcode-level mutations of torch pickles, for the pickle-verdict differential (fuzz/pickle_verdict.py).

A pickle is walked with ``pickletools.genops`` and its stack simulated, so that every complete value
(the opcodes that together push one value: a tensor rebuild, a storage id, a dict with its items)
is known as a byte span. Operators then edit the pickle where torch's weights_only unpickler decides
something: which global a GLOBAL names (every allowed name, names one character off, attribute chains
of allowed names, Python 2 spellings, blocked modules, names torch refuses with a hint, bytes that
are not UTF-8), what REDUCE, NEWOBJ and BUILD are applied to, the opcodes themselves (deleted,
duplicated, swapped, replaced by ones torch lacks), the protocol, the values passed to allowed
functions, and where the pickle ends. Every operator takes a ``random.Random``, so a case is fixed by
the run's seed and its index.
"""

from __future__ import annotations

import functools
import io
import pickletools
import random
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tieaudit.formats.torch_allowlist import torch_allowlist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / "hostile"))
from builders import call, dct, glob, integer, lst, pickle_of, state_dict, torch_zip, tup  # type: ignore[import-not-found]


def text(value: str) -> bytes:
    """BINUNICODE; lone surrogates pass as torch's reader decodes them (``surrogatepass``)."""
    raw = value.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


_INFO = {op.name: op for op in pickletools.opcodes}
_BY_CODE = {op.code.encode("latin-1"): op for op in pickletools.opcodes}

TORCH_READS = frozenset(
    "BININT1 MARK BINUNICODE REDUCE BINPERSID EMPTY_TUPLE BININT2 BININT NONE EMPTY_LIST BINFLOAT "
    "SHORT_BINSTRING STOP LONG_BINPUT BINGET TUPLE BINPUT SETITEMS SETITEM APPEND APPENDS EMPTY_DICT "
    "LONG_BINGET GLOBAL BUILD TUPLE1 NEWFALSE TUPLE2 TUPLE3 NEWTRUE LONG1 NEWOBJ EMPTY_SET PROTO".split()
)
"""The 34 opcodes torch.load(weights_only=True) interprets."""
TORCH_LACKS = tuple(code for code, op in _BY_CODE.items() if op.name not in TORCH_READS)
"""Every other opcode (STACK_GLOBAL, INST, OBJ, EXT1, FRAME, MEMOIZE, text and bytes opcodes, ...)."""


@dataclass(frozen=True)
class Op:
    """One opcode of a pickle: its name and byte span."""

    name: str
    pos: int
    end: int


@dataclass
class Parsed:
    """A pickle's opcodes (up to STOP, or up to the first that does not parse) and its value spans."""

    data: bytes
    ops: list[Op] = field(default_factory=list)
    values: list[tuple[int, int]] = field(default_factory=list)
    """Byte spans that push exactly one value (each one complete at some point of the pickle)."""
    tuples: list[tuple[int, Op, list[tuple[int, int]]]] = field(default_factory=list)
    """Tuples (call arguments, storage ids, sizes): where their opcodes start, the opcode that builds
    them, and the spans of their items."""


@functools.lru_cache(maxsize=256)
def parse(data: bytes) -> Parsed:
    """The pickle's opcodes and value spans (kept for the seeds' pickles, parsed again and again)."""
    parsed = Parsed(data)
    stream = io.BytesIO(data)
    found: list[tuple[str, int]] = []
    try:
        for opcode, _, pos in pickletools.genops(stream):
            found.append((opcode.name, pos or 0))
    except (ValueError, EOFError, UnicodeDecodeError, struct.error):
        pass
    for index, (name, pos) in enumerate(found):
        if index + 1 < len(found):
            end = found[index + 1][1]
        else:
            end = stream.tell() if name == "STOP" else len(data)
        parsed.ops.append(Op(name, pos, end))
    _simulate(parsed)
    return parsed


_EFFECT = {
    op.name: (
        pickletools.markobject in op.stack_before,
        op.stack_before.index(pickletools.markobject)
        if pickletools.markobject in op.stack_before
        else len(op.stack_before),
        len(op.stack_after),
    )
    for op in pickletools.opcodes
}
"""Per opcode: whether it takes the items above the last MARK, how many entries below those it
takes, and how many it pushes."""


def _simulate(parsed: Parsed) -> None:
    """Follow the stack, each entry being where the opcodes that made it start."""
    starts: list[int] = []
    marks: list[int] = []
    """Indexes of MARKs in ``starts``."""
    for op in parsed.ops:
        if op.name == "MARK":
            marks.append(len(starts))
            starts.append(op.pos)
            continue
        to_mark, extra, pushes = _EFFECT[op.name]
        first = op.pos
        if to_mark:
            if not marks:
                return
            at = marks.pop()
            items = starts[at + 1 :]
            first = starts[at]
            del starts[at:]
            if op.name == "TUPLE":
                parsed.tuples.append((first, op, _item_spans(items, op.pos)))
        if len(starts) < extra or (marks and marks[-1] >= len(starts) - extra):
            return
        taken = starts[len(starts) - extra :] if extra else []
        del starts[len(starts) - extra :]
        if op.name in ("TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"):
            parsed.tuples.append((taken[0] if taken else op.pos, op, _item_spans(taken, op.pos)))
        start = min(first, *taken) if taken else first
        for _ in range(pushes):
            starts.append(start)
            parsed.values.append((start, op.end))


def _item_spans(starts: list[int], close: int) -> list[tuple[int, int]]:
    return [(s, starts[i + 1] if i + 1 < len(starts) else close) for i, s in enumerate(starts)]


# --- what gets spliced in ------------------------------------------------------------------------

ATTRIBUTES = (
    "fromkeys", "__globals__", "__class__", "__init__", "__new__", "__reduce__", "__reduce_ex__",
    "__setstate__", "__subclasses__", "__dict__", "__builtins__", "__call__", "mro", "__mro__", "os",
    "os.system", "sys", "sys.modules", "copy", "update", "pop", "from_file", "__getattribute__",
    "_rebuild_tensor", "_utils", "x",
)  # fmt: skip
"""Attributes appended to allowed names (an attribute chain is one whole name, never a prefix)."""
CHAINS = (
    ("collections", "OrderedDict.fromkeys"), ("collections.OrderedDict", "fromkeys"),
    ("torch._utils", "_rebuild_tensor_v2.__globals__"), ("torch.serialization", "os.system"),
    ("torch.serialization.os", "system"), ("torch", "storage.UntypedStorage.from_file"),
    ("torch", "Tensor.__reduce_ex__"), ("builtins", "set.__init__"), ("torch", "Size.__new__"),
    ("torch", "_utils._rebuild_tensor_v2"), ("torch._utils._rebuild_tensor_v2", ""),
    ("torch.nn", "parameter.Parameter"), ("torch", "nn.parameter.Parameter"), ("_codecs.encode", ""),
    ("", "builtins.set"), ("torch.device", "__init__"), ("pathlib", "Path.write_text"),
    ("pathlib", "PosixPath._flavour.pathmod.os.system"), ("numpy", "ndarray.tofile"),
)  # fmt: skip
PYTHON2 = (
    *(("__builtin__", n) for n in "set complex bytearray getattr eval reduce intern unicode long".split()),
    ("__builtin__", "xrange"),
    ("copy_reg", "_reconstructor"), ("copy_reg", "__newobj__"), ("UserDict", "UserDict"),
    ("UserDict", "IterableUserDict"), ("UserList", "UserList"), ("exceptions", "StandardError"),
    ("exceptions", "Exception"), ("itertools", "izip"), ("whichdb", "whichdb"), ("cStringIO", "StringIO"),
    ("Queue", "Queue"), ("_abcoll", "Mapping"), ("repr", "Repr"),
)  # fmt: skip
BLOCKED = (
    ("os", "system"), ("posix", "system"), ("nt", "system"), ("sys", "modules"), ("sys", "exit"),
    ("os", "path.join"), ("os.path", "join"), ("posixpath", "join"), ("sys", "intern"), ("os", ""),
)  # fmt: skip
OUTSIDE = (
    ("builtins", "eval"), ("builtins", "exec"), ("builtins", "getattr"), ("builtins", "dict"),
    ("builtins", "list"), ("builtins", "tuple"), ("builtins", "int"), ("builtins", "object"),
    ("argparse", "Namespace"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("collections", "defaultdict"), ("collections", "deque"), ("torch", "Generator"),
    ("torch._utils", "_rebuild_tensor_v4"), ("torch", "FakeTensor"), ("torch.cuda.sparse", "BoolTensor"),
    ("torch", "BoolStorage.__new__"), ("transformers.training_args", "TrainingArguments"),
    ("functools", "partial"), ("codecs", "open"), ("_posixsubprocess", "fork_exec"),
)  # fmt: skip
RAW_LINES = (
    (b"torch\xff", b"Size"), (b"torch", b"Si\xc3ze"), (b"\x80", b"\x80"), (b"", b""), (b"torch", b""),
    (b"", b"Size"), (b"torch ", b"Size"), (b" torch", b"Size"), (b"torch", b"Size "), (b"torch\t", b"Size"),
    (b"torch\r", b"Size"), (b"torch\x00", b"Size"), (b"torch", b"Size\ntorch"),
    (b"collections", b"OrderedDict\r"), (b"torch._utils", b"_rebuild_tensor_v2\x00"),
    (b"torch\xed\xa0\x80", b"Size"),
)  # fmt: skip
"""GLOBAL lines as bytes: not UTF-8, empty, padded with spaces or control characters, an extra line."""


@functools.cache
def _allowed() -> list[str]:
    return sorted(torch_allowlist().allowed)


def _split(name: str, rng: random.Random) -> tuple[str, str]:
    """A dotted name as GLOBAL's two lines, cut at any dot (torch joins them back with a dot)."""
    dots = [i for i, c in enumerate(name) if c == "."]
    cut = rng.choice(dots) if dots and rng.random() < 0.3 else name.rfind(".")
    return name[:cut], name[cut + 1 :]


def _one_off(name: str, rng: random.Random) -> str:
    at = rng.randrange(len(name) + 1)
    letter = rng.choice("abcdefghijklmnopqrstuvwxyzST_.0123456789")
    action = rng.randrange(4)
    if action == 0 or at == len(name):
        return name[:at] + letter + name[at:]
    if action == 1:
        return name[:at] + name[at + 1 :]
    if action == 2:
        return name[:at] + letter + name[at + 1 :]
    return name[:at] + name[at].swapcase() + name[at + 1 :]


def global_lines(rng: random.Random) -> tuple[bytes, bytes, str]:
    """A GLOBAL's module and name lines from the pool, and which part of the pool it came from."""
    allowlist = torch_allowlist()
    kind = rng.choices(
        ("allowed", "one-off", "chain", "python2", "mapping", "blocked", "hint", "outside", "raw"),
        weights=(30, 14, 12, 8, 6, 8, 4, 10, 8),
    )[0]
    if kind == "allowed":
        module, name = _split(rng.choice(_allowed()), rng)
    elif kind == "one-off":
        module, name = _split(_one_off(rng.choice(_allowed()), rng), rng)
    elif kind == "chain":
        module, name = rng.choice(CHAINS) if rng.random() < 0.4 else _split(rng.choice(_allowed()), rng)
        if (module, name) not in CHAINS:
            name = f"{name}.{rng.choice(ATTRIBUTES)}"
    elif kind == "python2":
        module, name = rng.choice(PYTHON2)
    elif kind == "mapping":
        pairs = [
            *allowlist.name_mapping,
            *((m, rng.choice(("set", "OrderedDict", "x"))) for m in allowlist.import_mapping),
        ]
        module, name = rng.choice(sorted(pairs))
    elif kind == "blocked":
        module, name = rng.choice(BLOCKED)
    elif kind == "hint":
        module, name = _split(rng.choice(sorted(allowlist.refused_with_hint)), rng)
    elif kind == "outside":
        module, name = rng.choice(OUTSIDE)
    else:
        raw_module, raw_name = rng.choice(RAW_LINES)
        return raw_module, raw_name, kind
    return module.encode("utf-8"), name.encode("utf-8"), kind


def global_op(rng: random.Random) -> tuple[bytes, str]:
    module, name, kind = global_lines(rng)
    return b"c" + module + b"\n" + name + b"\n", f"{kind} {module!r}/{name!r}"


def _float(value: float) -> bytes:
    return b"G" + struct.pack(">d", value)


def _short_binstring(raw: bytes) -> bytes:
    return b"U" + bytes([len(raw)]) + raw


STRINGS = (
    "", "w", "0", "1", "storage", "cpu", "cuda", "cuda:0", "cuda:1", "cuda0", "cuda:-1", "meta", "mps",
    "xpu", "hpu", "privateuseone", "xyz", "CPU", "cpu:0", "data", "real", "__dict__", "conj", "neg",
    "latin1", "utf-8", "ascii", "torch.strided", "torch.sparse_coo", "1+2j", "nan", "\ud800", "é", "a" * 300,
)  # fmt: skip
INTS = (
    0,
    1,
    2,
    3,
    4,
    7,
    -1,
    255,
    256,
    65535,
    65536,
    2**31 - 1,
    -(2**31),
    2**31,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
)


def scalar_value(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return integer(rng.choice(INTS))
    if kind == 1:
        return (
            text(rng.choice(STRINGS))
            if rng.random() < 0.9
            else _short_binstring(rng.choice((b"cpu", b"\xff")))
        )
    if kind == 2:
        return rng.choice((b"N", b"\x88", b"\x89"))
    if kind == 3:
        return _float(rng.choice((0.5, -0.0, float("nan"), float("inf"), 1e308)))
    if kind == 4:
        return rng.choice((b")", b"]", b"}", b"\x8f"))
    return tup(*(integer(rng.choice(INTS[:6])) for _ in range(rng.randrange(4))))


@functools.cache
def _lower_names() -> list[str]:
    """torch.float32 and the like: dtypes, qschemes (values, not callables)."""
    return [n for n in _allowed() if n.count(".") == 1 and n.split(".")[1][:1].islower()]


def _dtype(rng: random.Random) -> bytes:
    return glob(*_split(rng.choice(_lower_names()), rng))


def composite_value(rng: random.Random, donors: list[bytes]) -> bytes:
    """A value built from allowed calls, containers, dtypes, or another value of the same pickle."""
    kind = rng.randrange(9)
    if kind == 0 and donors:
        return rng.choice(donors)
    if kind == 1:
        pairs = [
            (
                text(rng.choice(("conj", "neg", "foo", "data", "_x"))),
                rng.choice((b"\x88", b"\x89", integer(1))),
            )
        ]
        return dct(*pairs) if rng.random() < 0.8 else dct((integer(1), integer(2)))
    if kind == 2:
        return call(glob("collections", "OrderedDict"), *([] if rng.random() < 0.7 else [scalar_value(rng)]))
    if kind == 3:
        args = [text(rng.choice(STRINGS[:20]))] + ([integer(rng.choice(INTS))] if rng.random() < 0.4 else [])
        return call(glob("torch", "device"), *args)
    if kind == 4:
        return call(glob("torch", "Size"), tup(*(integer(rng.choice(INTS)) for _ in range(rng.randrange(3)))))
    if kind == 5:
        return _dtype(rng)
    if kind == 6:
        func = rng.choice(
            (("builtins", "set"), ("builtins", "complex"), ("builtins", "bytearray"), ("_codecs", "encode"))
        )
        return call(glob(*func), *(scalar_value(rng) for _ in range(rng.randrange(3))))
    if kind == 7:
        return lst(*(scalar_value(rng) for _ in range(rng.randrange(3))))
    return call(
        glob("torch.serialization", "_get_layout"), text(rng.choice(("torch.strided", "torch.jagged", "x")))
    )


def any_value(rng: random.Random, donors: list[bytes]) -> bytes:
    return scalar_value(rng) if rng.random() < 0.5 else composite_value(rng, donors)


# --- the operators -------------------------------------------------------------------------------

Mutation = tuple[bytes, str]
"""A mutated pickle and what was done to it."""
Operator = Callable[[Parsed, random.Random], "Mutation | None"]


def _splice(data: bytes, span: tuple[int, int], new: bytes) -> bytes:
    return data[: span[0]] + new + data[span[1] :]


def _donors(parsed: Parsed, rng: random.Random) -> list[bytes]:
    spans = rng.sample(parsed.values, min(8, len(parsed.values)))
    return [parsed.data[a:b] for a, b in spans if b - a <= 4096]


def _value(parsed: Parsed, rng: random.Random) -> tuple[int, int] | None:
    """A value span, small ones (scalars, names, sizes) as likely as the large ones they make up."""
    if not parsed.values:
        return None
    return rng.choice(parsed.values)


def op_replace_global(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """A GLOBAL's module and name replaced by one from the pool."""
    globals_ = [op for op in parsed.ops if op.name == "GLOBAL"]
    if not globals_:
        return None
    target = rng.choice(globals_)
    new, what = global_op(rng)
    return _splice(parsed.data, (target.pos, target.end), new), f"GLOBAL at {target.pos} -> {what}"


def _global_use(parsed: Parsed, rng: random.Random) -> tuple[bytes, str]:
    """A pool global as a value: bare, called (REDUCE), instantiated (NEWOBJ) or given state (BUILD)."""
    new, what = global_op(rng)
    donors = _donors(parsed, rng)
    use = rng.choice(("bare", "REDUCE", "NEWOBJ", "BUILD", "REDUCE+BUILD"))
    args = tup(*(any_value(rng, donors) for _ in range(rng.randrange(3))))
    if use == "REDUCE":
        new += args + b"R"
    elif use == "NEWOBJ":
        new += args + b"\x81"
    elif use == "BUILD":
        new += any_value(rng, donors) + b"b"
    elif use == "REDUCE+BUILD":
        new += args + b"R" + any_value(rng, donors) + b"b"
    return new, f"{use} of {what}"


def op_global_value(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """A value replaced by a pool global, used the way a payload uses it."""
    span = _value(parsed, rng)
    if span is None:
        return None
    new, what = _global_use(parsed, rng)
    return _splice(parsed.data, span, new), f"value {span} -> {what}"


def op_add_entry(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """One more key and value in a dict (before a SETITEMS): a payload beside the real entries."""
    closers = [o for o in parsed.ops if o.name == "SETITEMS"]
    if not closers:
        return None
    at = rng.choice(closers).pos
    if rng.random() < 0.6:
        value, what = _global_use(parsed, rng)
    else:
        value, what = any_value(rng, _donors(parsed, rng)), "a value"
    key = text(rng.choice(("payload", "w", "state", "0"))) if rng.random() < 0.9 else any_value(rng, [])
    return parsed.data[:at] + key + value + parsed.data[at:], f"entry before SETITEMS at {at}: {what}"


def op_respell(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """A GLOBAL spelled another way torch resolves to the same name: cut at another dot, or in a
    Python 2 spelling torch renames to it."""
    globals_ = [o for o in parsed.ops if o.name == "GLOBAL"]
    if not globals_:
        return None
    target = rng.choice(globals_)
    module, _, name = parsed.data[target.pos + 1 : target.end - 1].partition(b"\n")
    full = f"{module.decode('utf-8', 'replace')}.{name.decode('utf-8', 'replace')}"
    python2 = [m for (m, n), (m3, n3) in _renames() if f"{m3}.{n3}" == full]
    if python2 and rng.random() < 0.5:
        new_module, new_name = rng.choice(python2), full.rpartition(".")[2]
        new_module, new_name = next(
            (m, n) for (m, n), (m3, n3) in _renames() if f"{m3}.{n3}" == full and m == new_module
        )
    else:
        new_module, new_name = _split(full, rng) if rng.random() < 0.7 else (full, "")
    new = b"c" + new_module.encode() + b"\n" + new_name.encode() + b"\n"
    return _splice(
        parsed.data, (target.pos, target.end), new
    ), f"GLOBAL at {target.pos} respelled {new_module}/{new_name}"


def _kind(name: str) -> str:
    """What an allowed name is, by its spelling: a storage class, a tensor class, a rebuild function,
    a dtype or other lower-case value, or something else."""
    last = name.rpartition(".")[2]
    if last.endswith("Storage"):
        return "storage"
    if last.endswith("Tensor"):
        return "tensor class"
    if last.startswith("_rebuild"):
        return "rebuild"
    return "value" if last[:1].islower() and name.count(".") == 1 else "other"


def op_same_kind(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """A GLOBAL replaced by another allowed name of its kind (a storage class by another, a dtype by
    another, a tensor rebuild by another): files that stay close to what torch loads."""
    globals_ = [o for o in parsed.ops if o.name == "GLOBAL"]
    if not globals_:
        return None
    target = rng.choice(globals_)
    module, _, name = parsed.data[target.pos + 1 : target.end - 1].partition(b"\n")
    kind = _kind(f"{module.decode('utf-8', 'replace')}.{name.decode('utf-8', 'replace')}")
    choice = rng.choice([n for n in _allowed() if _kind(n) == kind])
    new_module, new_name = _split(choice, rng)
    new = b"c" + new_module.encode() + b"\n" + new_name.encode() + b"\n"
    return _splice(parsed.data, (target.pos, target.end), new), f"GLOBAL at {target.pos} -> {choice}"


@functools.cache
def _renames() -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """Python 2 (module, name) pairs and what torch renames them to (module renames applied to the
    allowed names too: ``__builtin__.set`` is ``builtins.set``)."""
    allowlist = torch_allowlist()
    pairs = list(allowlist.name_mapping.items())
    for old, new in allowlist.import_mapping.items():
        pairs += [
            ((old, n[len(new) + 1 :]), (new, n[len(new) + 1 :]))
            for n in _allowed()
            if n.startswith(new + ".")
        ]
    return pairs


def op_build(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """BUILD applied to an existing value (a tensor, a dict, an OrderedDict, a storage) with a state."""
    span = _value(parsed, rng)
    if span is None:
        return None
    state = any_value(rng, _donors(parsed, rng))
    return parsed.data[: span[1]] + state + b"b" + parsed.data[span[1] :], f"BUILD after value {span}"


def op_call_value(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """REDUCE or NEWOBJ applied to an existing value (a call of what is not a function or a class)."""
    span = _value(parsed, rng)
    if span is None:
        return None
    args = tup(*(any_value(rng, _donors(parsed, rng)) for _ in range(rng.randrange(3))))
    opcode = rng.choice((b"R", b"\x81"))
    return parsed.data[: span[1]] + args + opcode + parsed.data[span[1] :], f"{opcode!r} on value {span}"


def op_replace_value(parsed: Parsed, rng: random.Random) -> Mutation | None:
    span = _value(parsed, rng)
    if span is None:
        return None
    return _splice(parsed.data, span, any_value(rng, _donors(parsed, rng))), f"value {span} replaced"


def op_arity(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """A tuple (call arguments, a storage id, a size) given one item more or one fewer."""
    if not parsed.tuples:
        return None
    start, op, items = rng.choice(parsed.tuples)
    data = parsed.data
    if items and rng.random() < 0.5:
        drop = rng.randrange(len(items))
        kept = [data[a:b] for i, (a, b) in enumerate(items) if i != drop]
        what = f"tuple at {op.pos} loses item {drop}"
    else:
        kept = [data[a:b] for a, b in items]
        kept.insert(rng.randrange(len(kept) + 1), any_value(rng, _donors(parsed, rng)))
        what = f"tuple at {op.pos} gains an item"
    return _splice(data, (start, op.end), tup(*kept)), what


def op_delete(parsed: Parsed, rng: random.Random) -> Mutation | None:
    spans = parsed.values if rng.random() < 0.5 else [(o.pos, o.end) for o in parsed.ops]
    if not spans:
        return None
    span = rng.choice(spans)
    return _splice(parsed.data, span, b""), f"deleted {span}"


def op_duplicate(parsed: Parsed, rng: random.Random) -> Mutation | None:
    spans = parsed.values if rng.random() < 0.5 else [(o.pos, o.end) for o in parsed.ops]
    if not spans:
        return None
    a, b = rng.choice(spans)
    return parsed.data[:b] + parsed.data[a:b] + parsed.data[b:], f"duplicated {(a, b)}"


def op_swap(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """Two values (or two neighbouring opcodes) change places."""
    data = parsed.data
    if rng.random() < 0.6 and len(parsed.values) >= 2:
        first, second = sorted(rng.sample(parsed.values, 2))
        if first[1] > second[0]:
            return None
    elif len(parsed.ops) >= 2:
        at = rng.randrange(len(parsed.ops) - 1)
        first = (parsed.ops[at].pos, parsed.ops[at].end)
        second = (parsed.ops[at + 1].pos, parsed.ops[at + 1].end)
    else:
        return None
    swapped = data[: first[0]] + data[second[0] : second[1]] + data[first[1] : second[0]]
    return swapped + data[first[0] : first[1]] + data[second[1] :], f"swapped {first} and {second}"


def op_foreign_opcode(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """An opcode byte replaced by one torch lacks, or such an opcode inserted with a plausible argument."""
    if not parsed.ops:
        return None
    target = rng.choice(parsed.ops)
    data = parsed.data
    module, name, _ = global_lines(rng)
    forms = {
        "STACK_GLOBAL": text(module.decode("utf-8", "replace"))
        + text(name.decode("utf-8", "replace"))
        + b"\x93",
        "INST": b"(" + b"i" + module + b"\n" + name + b"\n",
        "OBJ": b"(c" + module + b"\n" + name + b"\n" + b"o",
        "EXT1": b"\x82\x01",
        "FRAME": b"\x95" + struct.pack("<Q", len(data) - target.pos),
        "MEMOIZE": b"\x94",
        "BINBYTES": b"C\x03abc",
        "POP": b"0",
        "DUP": b"2",
        "INT": b"I1\n",
        "LONG4": b"\x8b\x01\x00\x00\x00\x01",
        "SHORT_BINUNICODE": b"\x8c\x01w",
        "EMPTY_FROZENSET": b"(\x91",
    }
    if rng.random() < 0.4:
        code = rng.choice(TORCH_LACKS)
        return data[: target.pos] + code + data[target.pos + 1 :], f"opcode at {target.pos} -> {code!r}"
    form = rng.choice(sorted(forms))
    at = target.pos
    return data[:at] + forms[form] + data[at:], f"{form} inserted at {at}"


def op_proto(parsed: Parsed, rng: random.Random) -> Mutation | None:
    data = parsed.data
    number = rng.choice((0, 1, 2, 3, 4, 5, 6, 255))
    if data[:1] == b"\x80" and rng.random() < 0.7:
        if rng.random() < 0.2:
            return data[2:], "PROTO removed"
        return b"\x80" + bytes([number]) + data[2:], f"PROTO {number}"
    return b"\x80" + bytes([number]) + data, f"PROTO {number} prepended"


SCALAR_OPCODES = frozenset(
    "BININT1 BININT2 BININT LONG1 BINUNICODE SHORT_BINSTRING NEWTRUE NEWFALSE NONE BINFLOAT".split()
)


def op_scalar(parsed: Parsed, rng: random.Random) -> Mutation | None:
    """An int, string, bool or float opcode given another value (a size, offset, key, location, flag)."""
    scalars = [o for o in parsed.ops if o.name in SCALAR_OPCODES]
    if not scalars:
        return None
    target = rng.choice(scalars)
    return _splice(parsed.data, (target.pos, target.end), scalar_value(rng)), f"{target.name} at {target.pos}"


def op_memo(parsed: Parsed, rng: random.Random) -> Mutation | None:
    memo = [o for o in parsed.ops if o.name in ("BINGET", "BINPUT", "LONG_BINGET", "LONG_BINPUT")]
    if not memo:
        return None
    target = rng.choice(memo)
    index = rng.choice((0, 1, 2, 255, 2**16, 2**31 - 1, 2**32 - 1))
    code = {"BINGET": b"j", "LONG_BINGET": b"j", "BINPUT": b"r", "LONG_BINPUT": b"r"}[target.name]
    return _splice(parsed.data, (target.pos, target.end), code + struct.pack("<I", index)), f"memo {index}"


def op_truncate(parsed: Parsed, rng: random.Random) -> Mutation | None:
    if len(parsed.data) < 2:
        return None
    cut = (
        rng.choice([o.pos for o in parsed.ops] or [1])
        if rng.random() < 0.5
        else rng.randrange(1, len(parsed.data))
    )
    return parsed.data[:cut], f"truncated at {cut}"


def op_byte(parsed: Parsed, rng: random.Random) -> Mutation | None:
    if not parsed.data:
        return None
    at = rng.randrange(len(parsed.data))
    value = rng.randrange(256)
    return parsed.data[:at] + bytes([value]) + parsed.data[at + 1 :], f"byte {at} -> {value:#04x}"


OPERATORS: tuple[tuple[Operator, int], ...] = (
    (op_replace_global, 20),
    (op_global_value, 12),
    (op_add_entry, 14),
    (op_respell, 6),
    (op_same_kind, 8),
    (op_build, 6),
    (op_call_value, 4),
    (op_replace_value, 8),
    (op_arity, 6),
    (op_scalar, 10),
    (op_delete, 5),
    (op_duplicate, 4),
    (op_swap, 4),
    (op_foreign_opcode, 6),
    (op_proto, 2),
    (op_memo, 2),
    (op_truncate, 2),
    (op_byte, 3),
)
"""Operators and their weights: most edits are to globals and to what they are applied to."""


def mutate(data: bytes, rng: random.Random, *, rounds: int) -> tuple[bytes, list[str]]:
    """data after ``rounds`` operators (each on the result of the one before); what each did."""
    done: list[str] = []
    operators, weights = zip(*OPERATORS, strict=True)
    for _ in range(rounds):
        parsed = parse(data)
        for _attempt in range(8):
            operator = rng.choices(operators, weights=weights)[0]
            result = operator(parsed, rng)
            if result is not None and result[0] != data:
                data = result[0]
                done.append(f"{operator.__name__[3:]}: {result[1]}")
                break
    return data, done


# --- a sweep of every name, deterministic ---------------------------------------------------------


def _storage_pid(key: str) -> bytes:
    return tup(text("storage"), glob("torch", "FloatStorage"), text(key), text("cpu"), integer(2)) + b"Q"


def _sweep_tensor() -> bytes:
    hooks = call(glob("collections", "OrderedDict"))
    args = (_storage_pid("0"), integer(0), tup(integer(2)), tup(integer(1)), b"\x89", hooks)
    return call(glob("torch._utils", "_rebuild_tensor_v2"), *args)


def sweep_file(value: bytes) -> bytes:
    """A torch.save zip of {"w": a 2-float tensor, "x": value} (storages "0", two floats, "1", one
    int64, and "2", eight untyped bytes, for the values that need another)."""
    pickle = pickle_of(state_dict(("w", _sweep_tensor()), ("x", value)))
    return torch_zip(pickle, {"0": b"\x00" * 8, "1": b"\x00" * 8, "2": b"\x00" * 8})


def _v2_args(storage: str, key: str, numel: int, metadata: bytes | None = None) -> tuple[bytes, ...]:
    """Arguments of _rebuild_tensor_v2 viewing the whole of sweep_file's storage ``key``."""
    pid = tup(text("storage"), glob("torch", storage), text(key), text("cpu"), integer(numel)) + b"Q"
    hooks = call(glob("collections", "OrderedDict"))
    extra = [metadata] if metadata else []
    return (pid, integer(0), tup(integer(numel)), tup(integer(1)), b"\x89", hooks, *extra)


def _meta_args(dtype: str) -> tuple[bytes, ...]:
    return (glob("torch", dtype), tup(integer(2)), tup(integer(1)), b"\x89")


TENSOR_MAKERS: tuple[tuple[str, str, tuple[bytes, ...]], ...] = (
    ("float tensor", "_rebuild_tensor_v2", _v2_args("FloatStorage", "0", 2)),
    ("int64 tensor", "_rebuild_tensor_v2", _v2_args("LongStorage", "1", 1)),
    (
        "negated float tensor",
        "_rebuild_tensor_v2",
        _v2_args("FloatStorage", "0", 2, dct((text("neg"), b"\x88"))),
    ),
    ("float meta tensor", "_rebuild_meta_tensor_no_storage", _meta_args("float32")),
    ("int64 meta tensor", "_rebuild_meta_tensor_no_storage", _meta_args("int64")),
    ("bool meta tensor", "_rebuild_meta_tensor_no_storage", _meta_args("bool")),
)
"""Tensors of several dtypes and kinds, as a rebuild function and its arguments."""


def _compositions() -> list[tuple[str, bytes]]:
    """Each tensor passed to each function that takes one: parameters (with and without gradients,
    with and without state), the Parameter class called and instantiated, _rebuild_from_type_v2."""
    hooks = call(glob("collections", "OrderedDict"))
    states = (("no state", b"N"), ("an attribute", dct((text("foo"), integer(1)))))
    values: list[tuple[str, bytes]] = []
    for what, function, args in TENSOR_MAKERS:
        made = call(glob("torch._utils", function), *args)
        for grad, flag in (("with grad", b"\x88"), ("without grad", b"\x89")):
            values.append(
                (
                    f"_rebuild_parameter({what}, {grad})",
                    call(glob("torch._utils", "_rebuild_parameter"), made, flag, hooks),
                )
            )
            values.append(
                (f"Parameter({what}, {grad})", call(glob("torch.nn.parameter", "Parameter"), made, flag))
            )
            values.append(
                (
                    f"NEWOBJ Parameter({what}, {grad})",
                    glob("torch.nn.parameter", "Parameter") + tup(made, flag) + b"\x81",
                )
            )
            for state_name, state in states:
                with_state = call(
                    glob("torch._utils", "_rebuild_parameter_with_state"), made, flag, hooks, state
                )
                values.append((f"_rebuild_parameter_with_state({what}, {grad}, {state_name})", with_state))
        for new_type in (("torch", "Tensor"), ("torch.nn.parameter", "Parameter")):
            for state_name, state in states:
                rebuilt = call(
                    glob("torch._tensor", "_rebuild_from_type_v2"),
                    glob("torch._utils", function),
                    glob(*new_type),
                    tup(*args),
                    state,
                )
                values.append((f"_rebuild_from_type_v2({what} as {new_type[1]}, {state_name})", rebuilt))
    return values + _dtype_views()


def _dtype_views() -> list[tuple[str, bytes]]:
    """Every dtype torch allows as a tensor over 8 untyped bytes (_rebuild_tensor_v3) in sizes up to
    past the bytes, and as a meta tensor with and without gradients."""
    untyped = (
        tup(text("storage"), glob("torch.storage", "UntypedStorage"), text("2"), text("cpu"), integer(8))
        + b"Q"
    )
    hooks = call(glob("collections", "OrderedDict"))
    values: list[tuple[str, bytes]] = []
    for name in (n for n in _lower_names() if n.startswith("torch.") and not n.startswith("torch.per_")):
        dtype = glob(*name.rsplit(".", 1))
        for size in (1, 2, 4, 8, 9, 64):
            args = (untyped, integer(0), tup(integer(size)), tup(integer(1)), b"\x89", hooks, dtype)
            values.append(
                (
                    f"_rebuild_tensor_v3(8 bytes, ({size},), {name})",
                    call(glob("torch._utils", "_rebuild_tensor_v3"), *args),
                )
            )
        for grad in ("True", "False"):
            meta = (dtype, tup(integer(3)), tup(integer(1)), b"\x88" if grad == "True" else b"\x89")
            values.append(
                (
                    f"meta {name} grad={grad}",
                    call(glob("torch._utils", "_rebuild_meta_tensor_no_storage"), *meta),
                )
            )
    return values


SWEEP_ARGS: tuple[tuple[str, tuple[bytes, ...]], ...] = (
    ("()", ()),
    ("(None,)", (b"N",)),
    ("(0,)", (integer(0),)),
    ("('cpu',)", (text("cpu"),)),
    ("((2,),)", (tup(integer(2)),)),
    ("({},)", (b"}",)),
    ("(tensor,)", (_sweep_tensor(),)),
    ("('abc', 'latin1')", (text("abc"), text("latin1"))),
    ("(storage, 0, (2,), (1,))", (_storage_pid("0"), integer(0), tup(integer(2)), tup(integer(1)))),
    ("(float32, (2,), (1,), False)", (glob("torch", "float32"), tup(integer(2)), tup(integer(1)), b"\x89")),
)
"""Arguments every allowed name is called with in the sweep: none, scalars, a size, a dict, a
tensor, text and an encoding, a storage view, a meta tensor's."""


def sweep() -> list[tuple[str, bytes]]:
    """(label, value) pairs: every allowed name bare, called with each of SWEEP_ARGS, instantiated
    (NEWOBJ) and given state (BUILD); every pool name outside the allowlist bare and called."""
    values: list[tuple[str, bytes]] = []
    for name in _allowed():
        module, _, attr = name.rpartition(".")
        found = glob(module, attr)
        values.append((f"{name} bare", found))
        values += [(f"{name}{label}", call(found, *args)) for label, args in SWEEP_ARGS]
        values.append((f"NEWOBJ {name}()", found + b")\x81"))
        values.append((f"NEWOBJ {name}(0,)", found + tup(integer(0)) + b"\x81"))
        values.append((f"{name}() BUILD {{}}", call(found) + b"}b"))
        state = tup(b"}", dct((text("a"), integer(1))))
        values.append((f"{name}() BUILD ({{}}, {{'a': 1}})", call(found) + state + b"b"))
    outside = [*CHAINS, *PYTHON2, *BLOCKED, *OUTSIDE]
    outside += [tuple(n.rsplit(".", 1)) for n in sorted(torch_allowlist().refused_with_hint)]  # type: ignore[misc]
    for module, attr in outside:
        found = glob(module, attr)
        values += [(f"{module}/{attr} bare", found), (f"{module}/{attr}()", call(found))]
    return values + _compositions()
