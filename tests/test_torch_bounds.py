"""Bounded work on torch files: any input of 64 KB is read within the reader's limits and 256 MB.

The inputs are the most expensive 64 KB torch files we could build against tieaudit's own limits:
pickles of the cheapest-to-write, costliest-to-run opcodes, stored, and deflated right up to the
inflation limit (where a 64 KB archive holds the largest pickle it can); archives with as many
members as fit; legacy streams. Each is read (and every tensor viewed) in a forked child of a
fresh interpreter that has imported the reader already, as a run has; peak memory comes from
wait4. The work is bounded by what the reader counts (MAX_OPCODES, the pickle budget, the inflation
ratio), whose limits the inputs are built against; a read still going after HANG_CPU_SECONDS of CPU
is killed (RLIMIT_CPU) and fails as a hang: a guard, not a speed target (the suite shares a loaded
machine; bench/ holds the speed targets). (What the
report renderers do with, say, 200000 leaves is their own cost; the hostile-corpus test runs the
whole CLI on every hostile file.)
"""

from __future__ import annotations

import functools
import json
import os
import random
import resource
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
from builders import legacy_file, pickle_of, proto, state_dict, tensor, weights  # type: ignore[import-not-found]  # noqa: E402
from cases_torch import VERSION, Raw, archive, raw_zip  # type: ignore[import-not-found]  # noqa: E402

from tieaudit.core.errors import InputError  # noqa: E402
from tieaudit.formats.pickle_vm import MAX_OPCODES  # noqa: E402
from tieaudit.formats.zip_archive import INFLATION_SLACK, MAX_INFLATION_RATIO  # noqa: E402

INPUT_BYTES = 64 << 10
HANG_CPU_SECONDS = 30
"""CPU seconds after which a read is killed as a hang (each takes a fraction of a second)."""
PEAK_BYTES = 256 << 20
"""The budget for its peak resident memory (imports included)."""


def _filler(rng: random.Random, size: int) -> bytes:
    """A BINUNICODE string of random letters: bytes that do not deflate, to set the ratio."""
    text = bytes(
        rng.choice(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(size)
    )
    return b"X" + struct.pack("<I", size) + text


def _deflated_to_the_limit(head: bytes, block: bytes, tail: bytes) -> bytes:
    """An archive under 64 KB whose data.pkl (head, n blocks, tail) inflates as far as allowed.

    Each block is the costly pattern plus a filler string that sets the compression ratio; n is
    the largest keeping the archive under 64 KB and the pickle within MAX_INFLATION_RATIO.
    """
    rng = random.Random(0)
    # Letters from a 62-character alphabet deflate to about 0.77 of their size: a filler of a fifth
    # of the pattern brings each block just under the allowed ratio.
    blocks = [block + _filler(rng, len(block) // 5) for _ in range(2000)]

    def build(count: int) -> bytes | None:
        pickle = head + b"".join(blocks[:count]) + tail
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        packed = len(packer.compress(pickle) + packer.flush())
        data = raw_zip([Raw(b"archive/data.pkl", pickle, deflate=True), Raw(b"archive/version", VERSION)])
        fits = len(data) <= INPUT_BYTES and len(pickle) <= MAX_INFLATION_RATIO * packed + INFLATION_SLACK
        return data if fits else None

    low, high = 1, len(blocks)
    while low < high:
        middle = (low + high + 1) // 2
        if build(middle) is None:
            high = middle - 1
        else:
            low = middle
    data = build(low)
    assert data is not None, "not even one block fits"
    return data


def _stored(pickle: bytes) -> bytes:
    return raw_zip([Raw(b"archive/data.pkl", pickle), Raw(b"archive/version", VERSION)])


def _fill(build: Callable[[int], bytes]) -> bytes:
    """build(n) for the largest n whose output fits in 64 KB."""
    low, high = 1, INPUT_BYTES
    while low < high:
        middle = (low + high + 1) // 2
        if len(build(middle)) <= INPUT_BYTES:
            low = middle
        else:
            high = middle - 1
    return build(low)


def _tensors(count: int) -> bytes:
    """count tensors, each over its own storage record (names sharing one storage are the alias
    graph's work, quadratic in the names: see the report of this change)."""
    entries = [(f"w{i}", tensor(str(i), 2, (2,))) for i in range(count)]
    members = [Raw(b"archive/data/%d" % i, weights(2)) for i in range(1, count)]
    return raw_zip(archive(pickle_of(state_dict(*entries)), extra=members))


def _legacy_tensors(count: int) -> bytes:
    entries = [(f"w{i}", tensor(str(i), 2, (2,), legacy=True)) for i in range(count)]
    keys = [str(i) for i in range(count)]
    return legacy_file(pickle_of(state_dict(*entries)), keys, [(2, weights(2))] * count)


PATTERNS: dict[str, tuple[bytes, bytes, bytes]] = {
    "empty-lists": (proto(2), b"]" * 1300, b"."),
    "appends": (proto(2) + b"](", b"]" * 1300, b"e."),
    "int-leaves": (proto(2) + b"](", b"K\x07" * 650, b"e."),
    "none-values": (
        proto(2) + b"}(",
        b"".join(b"K" + bytes([i]) + b"N" for i in range(256)) * 2 + b"K\x00",
        b"u.",
    ),
    "nested-tuples": (proto(2), (b"(" * 199 + b"t" * 199) * 3, b"."),
    "setitems": (  # the filler string is the value of one more key
        proto(2) + b"}(",
        b"".join(b"J" + struct.pack("<i", i) + b"N" for i in range(200)) + b"J" + struct.pack("<i", -1),
        b"u.",
    ),
    "memo": (proto(2), b"".join(b"]r" + struct.pack("<I", i) for i in range(200)), b"."),
}

INPUTS: dict[str, Callable[[], bytes]] = {
    **{f"deflated-{name}": functools.partial(_deflated_to_the_limit, *p) for name, p in PATTERNS.items()},
    "stored-empty-lists": lambda: _fill(lambda n: _stored(proto(2) + b"]" * n + b".")),
    "stored-nested-tuples": lambda: _fill(lambda n: _stored(proto(2) + (b"(" * 199 + b"t" * 199) * n + b".")),
    "members": lambda: _fill(
        lambda n: raw_zip(archive(extra=[Raw(b"archive/e/%d" % i, b"") for i in range(n)]))
    ),
    "tensors": lambda: _fill(_tensors),
    "legacy-empty-lists": lambda: _fill(lambda n: legacy_file(proto(2) + b"]" * n + b".", [], [])),
    "legacy-tensors": lambda: _fill(_legacy_tensors),
}


def _read(path: str) -> int:
    """What an audit does with a torch file: read it, view every tensor. Returns the tensor count."""
    from tieaudit.formats.torch_file import TorchReader

    try:
        with TorchReader().read(path) as opened:
            for info in opened.checkpoint.tensors:
                opened.array(info)
            return len(opened.checkpoint.tensors)
    except InputError:
        return -1


def _measure(folder: str) -> dict[str, tuple[int, int]]:
    """Each input read in a forked child of this interpreter: (tensors, -1 refused or -2 crashed or
    killed as a hang, peak bytes)."""
    import tieaudit.formats.torch_file  # noqa: F401 - imported before forking, as a run has it

    found = {}
    for name, build in INPUTS.items():
        data = build()
        assert len(data) <= INPUT_BYTES, (name, len(data))
        path = os.path.join(folder, f"{name}.pt")
        Path(path).write_bytes(data)
        result = path + ".count"
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                resource.setrlimit(resource.RLIMIT_CPU, (HANG_CPU_SECONDS, HANG_CPU_SECONDS))
                Path(result).write_text(str(_read(path)))
            except BaseException:
                code = 1
            os._exit(code)
        _, status, usage = os.wait4(pid, 0)
        count = int(Path(result).read_text()) if os.waitstatus_to_exitcode(status) == 0 else -2
        found[name] = (count, usage.ru_maxrss * 1024)
    return found


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, int]]:
    """The measurements, taken in a fresh interpreter (no torch, no test modules loaded)."""
    folder = tmp_path_factory.mktemp("bounds")
    run = subprocess.run(
        [sys.executable, __file__, str(folder)], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found: dict[str, tuple[int, int]] = {k: tuple(v) for k, v in json.loads(run.stdout).items()}
    return found


@pytest.mark.parametrize("name", list(INPUTS))
def test_a_64kb_torch_file_reads_within_its_limits_and_256mb(
    name: str, measured: dict[str, tuple[int, int]]
) -> None:
    count, peak = measured[name]
    assert count != -2, f"{name}: the read crashed, or ran past {HANG_CPU_SECONDS} s of CPU (a hang)"
    assert peak < PEAK_BYTES, f"{name}: {peak >> 20} MiB"


def test_the_valid_inputs_really_are_read(measured: dict[str, tuple[int, int]]) -> None:
    """The measured work is the full read: the tensor inputs produce their tensors."""
    assert measured["tensors"][0] > 200 and measured["legacy-tensors"][0] > 200
    assert all(count >= 0 for name, (count, _) in measured.items() if name != "deflated-setitems")


def test_the_deflated_inputs_reach_the_inflation_limit() -> None:
    """The deflated inputs are as large as the limits allow: their pickles inflate at least 7 times."""
    for name in PATTERNS:
        data = INPUTS[f"deflated-{name}"]()
        start = data.index(b"archive/data.pkl") + len(b"archive/data.pkl")
        inflater = zlib.decompressobj(-15)
        inflated = inflater.decompress(data[start:], 4 << 20)
        assert len(data) > INPUT_BYTES - 4096, (name, len(data))
        assert len(inflated) >= 7 * (len(data) - 300), (name, len(inflated), len(data))
        assert len(inflated) < MAX_OPCODES


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1])))
