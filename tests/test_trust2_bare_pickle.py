"""Issue 23, points 1 and 6: a bare pickle (``pickle.dump`` output, not torch.save data) under any name.

torch.load takes any file that is not a zip for a legacy stream and unpickles its first pickle with
the full unpickler before it compares the value with its magic number ("Invalid magic number"):
``torch.load(path, weights_only=False)`` of a ``model.pt``, ``weights.pkl`` or ``checkpoint``
written by ``pickle.dump`` runs whatever the pickle calls. ``check DIR`` skipped such files as "not
a checkpoint format" (exit 0 beside a clean checkpoint), or, under a checkpoint's name, said only
"not a checkpoint tieaudit reads". Each attack below is proven live (a child process's
``torch.load(weights_only=False)`` creates the marker file) and ``check`` must fail it with TIE010
naming ``posix.system`` (what ``os.system`` pickles as), without running it.

The attacks use what ``pickle.dump`` writes at every protocol (FRAME, MEMOIZE, STACK_GLOBAL at 4
and 5, which tieaudit's weights_only VM refuses) and hand-assembled variants whose STACK_GLOBAL
operands come through the memo. A frame read across its end (which the unpickler reads in one of
two ways depending on buffering) is refused as ambiguous. Plain-data pickles stay skipped.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from torch_child import torch_load

from tieaudit.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
import builders  # type: ignore[import-not-found]  # noqa: E402  (the hostile corpus's assemblers)

TRAINER = ROOT / "fixtures" / "generated" / "training" / "checkpoint-2"
MARKER = "MARKER"
COMMAND = f"touch {MARKER}"
NAMED = "posix.system"
"""How ``os.system`` is spelled in a pickle (its ``__module__``), and so in TIE010."""
MAGIC_NUMBER = 0x1950A86A20F9469CFC6C


class _System:
    """Pickles as a call of os.system (building the bytes calls nothing)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (COMMAND,))


def _sbu(text: str) -> bytes:
    """SHORT_BINUNICODE."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _frame(body: bytes) -> bytes:
    return b"\x95" + struct.pack("<Q", len(body)) + body


def _call_tail() -> bytes:
    """The command as a 1-tuple, REDUCE, STOP (after the callable is on the stack)."""
    return _sbu(COMMAND) + b"\x85R."


def _memoized_operands() -> bytes:
    """Protocol 4: decoy strings and the real ones memoised, STACK_GLOBAL's operands fetched back
    with BINGET (what pickle.dump does for a second global of one module)."""
    body = (
        _sbu("collections") + b"\x94" + _sbu("posix") + b"\x94" + _sbu("OrderedDict") + b"\x94"
        + _sbu("system") + b"\x94" + b"h\x01h\x03\x93" + _call_tail()
    )  # fmt: skip
    return b"\x80\x04" + _frame(body)


def _long_binget_operands() -> bytes:
    """Protocol 2 stream using STACK_GLOBAL (the unpickler takes any opcode at any protocol), its
    operands put at far-apart memo indexes with LONG_BINPUT and read back with LONG_BINGET."""
    put = lambda index: b"r" + struct.pack("<I", index)  # noqa: E731
    get = lambda index: b"j" + struct.pack("<I", index)  # noqa: E731
    text = lambda value: b"X" + struct.pack("<I", len(value)) + value.encode()  # noqa: E731
    return (
        b"\x80\x02"
        + text("posix")
        + put(70_000)
        + text("system")
        + put(5)
        + b"0"
        + b"0"
        + (get(70_000) + get(5) + b"\x93" + text(COMMAND) + b"\x85R.")
    )


def _text_put_get_operands() -> bytes:
    """Protocol 0 text: STRING operands PUT, popped, fetched back with GET, then STACK_GLOBAL."""
    return b"S'posix'\np10\n0S'system'\np11\n0g10\ng11\n\x93(S'" + COMMAND.encode() + b"'\ntR."


def _memo_length_after_overwrites() -> bytes:
    """MEMOIZE stores at the memo's length (entries set so far), which PUTs at chosen indexes and
    overwrites make differ from the number of MEMOIZEs or the largest index plus one."""
    return b"\x80\x04" + (
        _sbu("collections") + b"q\x01"  # memo {1}: length 1
        + _sbu("posix") + b"\x94"  # stored at 1: overwrites "collections"
        + _sbu("OrderedDict") + b"q\x03"  # memo {1, 3}: length 2
        + _sbu("system") + b"\x94"  # stored at 2
        + b"h\x01h\x02\x93" + _call_tail()
    )  # fmt: skip


def _legacy_magic_then_code() -> bytes:
    """torch's magic number pickled with FRAME (which torch's weights_only unpickler refuses, so it
    is no legacy stream to tieaudit's torch reader), then a pickle calling os.system: torch.load
    reads the magic number and unpickles the next pickle as the protocol version."""
    return pickle.dumps(MAGIC_NUMBER, protocol=4) + pickle.dumps(_System(), protocol=4)


ATTACKS: dict[str, tuple[str, bytes]] = {
    "pickle_dump_protocol_0_as_model_pt": ("model.pt", pickle.dumps(_System(), protocol=0)),
    "pickle_dump_protocol_1_as_weights_pkl": ("weights.pkl", pickle.dumps(_System(), protocol=1)),
    "pickle_dump_protocol_2_without_suffix": ("checkpoint", pickle.dumps(_System(), protocol=2)),
    "pickle_dump_protocol_4_as_optimizer_bin": ("optimizer.bin", pickle.dumps(_System(), protocol=4)),
    "pickle_dump_protocol_5_as_flax_msgpack": ("flax_model.msgpack", pickle.dumps(_System(), protocol=5)),
    "stack_global_memoized_operands": ("pytorch_model", _memoized_operands()),
    "stack_global_long_binget_operands": ("model.ckpt", _long_binget_operands()),
    "stack_global_text_put_get_operands": ("tokenizer.model", _text_put_get_operands()),
    "memo_length_after_overwrites": ("state.pth", _memo_length_after_overwrites()),
    "inst_instantiates_os_system": ("training_state", b"(S'" + COMMAND.encode() + b"'\niposix\nsystem\n."),
    "obj_instantiates_os_system": ("rng.pkl", b"(cposix\nsystem\nS'" + COMMAND.encode() + b"'\no."),
    "legacy_magic_then_code": ("last.pth", _legacy_magic_then_code()),
    "truncated_after_the_call": ("partial.pkl", pickle.dumps(_System(), protocol=2)[:-1] + b"\xff" * 10),
}
"""Attack -> (file name, bytes): each runs os.system under torch.load(weights_only=False)."""

FRAME_STRADDLE = (
    b"\x80\x04" + _frame(b"N0" * 40_000 + b"c-") + b"posix\nsystem\n(S'" + COMMAND.encode() + b"'\ntR."
)
"""A frame ending inside a GLOBAL's module line: read on flat (as a scanner reads a file), the module
is "-posix", which no import finds; the C unpickler, having read the 80 KB frame whole, reads the line
from the file after the frame instead: posix, and runs os.system."""


def _one_file_folders(root: Path, files: dict[str, tuple[str, bytes]]) -> dict[str, Path]:
    folders = {}
    for slug, (name, data) in files.items():
        folder = root / slug
        folder.mkdir(parents=True)
        (folder / name).write_bytes(data)
        folders[slug] = folder
    return folders


def _check(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tie010(document: dict[str, object]) -> dict[str, list[str]]:
    reports = document["reports"]
    assert isinstance(reports, list)
    return {
        Path(r["path"]).name: [n for f in r["findings"] if f["rule"] == "TIE010" for n in f["names"]]
        for r in reports
    }


# --- proof: each attack runs code under torch.load(weights_only=False) ----------------------------


def test_every_attack_runs_code_under_torch_load_and_weights_only_refuses_it(tmp_path: Path) -> None:
    attacks = {**ATTACKS, "frame_straddle_hides_global": ("model.pkl", FRAME_STRADDLE)}
    wide = _one_file_folders(tmp_path / "wide", attacks)
    strict = _one_file_folders(tmp_path / "strict", attacks)
    torch_load(list(wide.values()), weights_only=False)
    ran = {slug for slug, folder in wide.items() if (folder / MARKER).exists()}
    assert ran == set(attacks), "an attack did not run: it proves nothing"
    refused = torch_load(list(strict.values()), weights_only=True)
    assert set(refused.values()) == {"UnpicklingError"}, refused
    assert not any((folder / MARKER).exists() for folder in strict.values())


# --- check fails each attack, beside a clean checkpoint, running nothing --------------------------


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_check_fails_a_bare_pickle_that_runs_code(
    attack: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, data = ATTACKS[attack]
    (tmp_path / "clean.pt").write_bytes(builders.valid_torch_zip())
    (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)  # the payload's relative marker would land here if anything ran it
    code, out, err = _check([str(tmp_path), "--format", "json"], capsys)
    assert code == 1, (out, err)
    named = _tie010(json.loads(out))
    assert named == {"clean.pt": [], name: [NAMED]}, named
    assert not (tmp_path / MARKER).exists()


def test_check_text_output_names_the_global_and_what_loading_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "weights.pkl").write_bytes(pickle.dumps(_System(), protocol=5))
    code, out, err = _check([str(tmp_path)], capsys)
    assert code == 1, err
    assert f"FAIL {tmp_path / 'weights.pkl'}  (pickle, 0 tensors" in out
    assert "TIE010" in out and f"{NAMED} (imported, called)" in out, out


def test_a_frame_read_across_its_end_is_refused_as_ambiguous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = b"\x80\x04" + _frame(b"c-") + b"posix\nsystem\n(S'" + COMMAND.encode() + b"'\ntR."
    for name, data in (("model.pkl", FRAME_STRADDLE), ("small.pkl", small)):
        (tmp_path / name).write_bytes(data)
        code, _, err = _check([str(tmp_path / name)], capsys)
        assert code == 2 and "reads across the end of a FRAME" in err, err
        assert len(err.strip().splitlines()) == 1, err
        code, _, err = _check([str(tmp_path)], capsys)  # found by content in a folder too
        assert code == 2 and "reads across the end of a FRAME" in err, err
        (tmp_path / name).unlink()


def test_a_trainer_folder_with_a_bare_pickle_training_args_fails_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder reader listed training_args.bin as "not read" (no torch.save data) and passed.
    (rng_state.pth goes: its numpy globals are TIE010 of their own.)"""
    folder = tmp_path / "checkpoint-2"
    shutil.copytree(TRAINER, folder)
    (folder / "rng_state.pth").unlink()
    (folder / "training_args.bin").write_bytes(pickle.dumps(_System(), protocol=4))
    code, out, err = _check([str(folder), "--format", "json"], capsys)
    assert code == 1, err
    findings = json.loads(out)["findings"]
    assert [(f["names"], f["details"]["file"]) for f in findings if f["rule"] == "TIE010"] == [
        ([NAMED], "training_args.bin")
    ]


def test_inspect_shows_it_and_other_commands_refuse_it_naming_the_global(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(pickle.dumps(_System(), protocol=4))
    assert main(["inspect", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "pickle" and report["tensors"] == []
    assert [g["name"] for g in report["pickle_globals"]] == [NAMED]
    for command in (
        ["retie", str(path), str(tmp_path / "out.pt")],
        ["convert", str(path), str(tmp_path / "o.safetensors")],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "is a pickle, not torch.save data" in err and NAMED in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_names_from_the_pickle_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hidden = "system\x1b[2J\u202e"
    data = b"\x80\x04" + _sbu("posix") + _sbu(hidden) + b"\x93" + _call_tail()
    (tmp_path / "weights.pkl").write_bytes(data)
    code, out, _ = _check([str(tmp_path)], capsys)
    assert code == 1 and "TIE010" in out
    assert "\x1b" not in out and "\u202e" not in out, out


def test_a_stack_global_the_walk_cannot_resolve_is_named_unresolved_not_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operands the walk did not keep (a string longer than it decodes, a memo past its budget) may
    be any name: the STACK_GLOBAL is reported as runs-code, never resolved to a guess or dropped."""
    from tieaudit.formats import pickle_walk_state
    from tieaudit.formats.pickle_walk import UNRESOLVED

    long_name = (
        b"\x80\x04" + _sbu("posix") + b"\x8d" + struct.pack("<Q", 5000) + b"s" * 5000 + b"\x93" + _call_tail()
    )
    (tmp_path / "long.pkl").write_bytes(long_name)
    code, out, err = _check([str(tmp_path / "long.pkl"), "--format", "json"], capsys)
    assert code == 1, err
    assert [f["names"] for f in json.loads(out)["findings"]] == [[UNRESOLVED]]
    (tmp_path / "long.pkl").unlink()

    monkeypatch.setattr(pickle_walk_state, "MAX_MEMO_ENTRIES", 8)
    decoys = b"".join(_sbu(f"d{i}") + b"\x94" + b"0" for i in range(10))  # past the budget: memo lost
    lost = b"\x80\x04" + _sbu("posix") + b"\x94" + _sbu("system") + b"\x94" + decoys
    (tmp_path / "memo.pkl").write_bytes(lost + b"h\x00h\x01\x93" + _call_tail())
    code, out, err = _check([str(tmp_path / "memo.pkl"), "--format", "json"], capsys)
    assert code == 1, err
    assert [f["names"] for f in json.loads(out)["findings"]] == [[UNRESOLVED]]


# --- what stays skipped -----------------------------------------------------------------------------


PLAIN = {
    **{
        f"vocab_{p}.pkl": pickle.dumps({"a": [1, 2], "b": ("x", 1.5, None, True, b"raw")}, protocol=p)
        for p in range(6)
    },
    "ordered.pkl": pickle.dumps(__import__("collections").OrderedDict(a=1), protocol=5),  # allowed by torch
    "tokens": pickle.dumps([f"token{i}" for i in range(50_000)], protocol=5),  # ~600 KB, memoised strings
}
"""Pickles that name nothing outside torch's allowlist: plain data (torch.load refuses them)."""
TEXT = {
    "README.md": b"# model\n",
    "default_config.yaml": b"compute_environment: LOCAL_MACHINE\ndeepspeed_config: {}\n",
    "modeling.py": b"class Model:\n    pass\n",
    "LICENSE": b"License text\n",
    "NOTICE": b"Notice\n",
}
"""Text that starts with pickle opcodes ('c' GLOBAL, 'L' LONG, 'N' NONE): not a pickle."""


def test_plain_data_pickles_and_text_stay_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tieaudit.formats.bare_pickle import PLAIN_DATA
    from tieaudit.gate.discover import discover

    (tmp_path / "clean.pt").write_bytes(builders.valid_torch_zip())
    for name, data in {**PLAIN, **TEXT}.items():
        (tmp_path / name).write_bytes(data)
    reasons = {Path(f.path).name: f.reason for f in discover([str(tmp_path)]).files if f.verdict == "skipped"}
    assert reasons == {**dict.fromkeys(PLAIN, PLAIN_DATA), **dict.fromkeys(TEXT, "not a checkpoint format")}
    code, out, err = _check([str(tmp_path)], capsys)
    assert code == 0, (out, err)
    code = main(["inspect", str(tmp_path / "vocab_5.pkl")])
    assert code == 2 and capsys.readouterr().err.strip().endswith(PLAIN_DATA)


def test_junk_that_starts_like_a_protocol_5_pickle_is_skipped_from_its_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 MB of junk after PROTO 5: the walk fails within the 64 bytes already read, so the file is
    never mapped."""
    from tieaudit.formats import bare_pickle
    from tieaudit.gate.discover import discover

    junk = random.Random(23).randbytes(10 << 20)
    (tmp_path / "blob").write_bytes(b"\x80\x05" + b"\x00" + junk)
    (tmp_path / "blob2").write_bytes(b"\x80\x05" + junk)
    mapped: list[str] = []
    real = bare_pickle.walk_file  # formats.walked's, as bare_pickle calls it

    def counted(path: str, *, limit: int, until_code: bool) -> object:
        mapped.append(path)
        return real(path, limit=limit, until_code=until_code)

    monkeypatch.setattr(bare_pickle, "walk_file", counted)
    found = discover([str(tmp_path)])
    assert [(Path(f.path).name, f.verdict, f.reason) for f in found.files] == [
        ("blob", "skipped", "not a checkpoint format"),
        ("blob2", "skipped", "not a checkpoint format"),
    ]
    assert mapped == []


def test_a_pickle_longer_than_the_scan_bound_is_refused_unless_it_names_code_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tieaudit.formats import bare_pickle

    monkeypatch.setattr(bare_pickle, "MAX_SCAN_BYTES", 64 << 10)
    (tmp_path / "data.pkl").write_bytes(pickle.dumps(list(range(100_000)), protocol=4))  # ~500 KB
    code, _, err = _check([str(tmp_path)], capsys)
    assert code == 2 and "cannot walk to its end" in err, err
    (tmp_path / "data.pkl").write_bytes(pickle.dumps([_System(), list(range(100_000))], protocol=4))
    code, out, err = _check([str(tmp_path)], capsys)
    assert code == 1 and NAMED in out, (out, err)


# --- the walker against CPython's unpickler -----------------------------------------------------------

REFERENCE = """
import io, json, pickle, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

class Anything:
    def __new__(cls, *a, **k): return object.__new__(cls)
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return Anything()
    def __setstate__(self, state): pass
    def extend(self, items): pass
    def append(self, item): pass
    def add(self, item): pass
    def __setitem__(self, key, value): pass

def named(data, path):
    seen = []
    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.append([module, name])
            if not all(part.isidentifier() for part in module.split(".")):
                raise ModuleNotFoundError(module)  # no installed module has such a name
            return Anything
    for memory in (True, False):  # BytesIO (no peek), and a real file (buffered, with peek)
        try:
            if memory:
                Recording(io.BytesIO(data), encoding="utf-8").load()
            else:
                with open(path, "wb") as handle:
                    handle.write(data)
                with open(path, "rb") as handle:
                    Recording(handle, encoding="utf-8").load()
        except BaseException:
            pass
    return seen

cases = json.load(sys.stdin)
print(json.dumps([named(bytes.fromhex(case), sys.argv[1]) for case in cases]))
"""
"""Every global CPython's unpickler asks find_class for, in memory and from a file (a recording
unpickler hands out an object that takes any call, so it reads on as far as it can)."""


def _mutated(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out) + 1)
        kind = rng.random()
        if kind < 0.3 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif kind < 0.5:
            out[at:at] = bytes(
                [rng.choice(b"(.0123FIJKLMNPQRSTUVXabcdeghijlopqrstu}])\x80\x81\x85\x88\x8a\x8c\x93\x94\x95")]
            )
        elif kind < 0.7 and out:
            del out[at : at + rng.randint(1, 4)]
        else:
            other = rng.choice(pool)
            start = rng.randrange(len(other))
            out[at:at] = other[start : start + rng.randint(1, 30)]
    return bytes(out)


def test_the_walk_names_every_global_the_unpickler_imports(tmp_path: Path) -> None:
    """Seeded opcode-level mutations of the attacks and of plain pickles, and every first byte before
    a GLOBAL: each global CPython's unpickler reaches is named by the walk (or the walk names an
    unresolved one, or refuses the file as ambiguous); a file whose first byte rules out a pickle
    makes the unpickler import nothing."""
    from tieaudit.formats.bare_pickle import starts_like_pickle
    from tieaudit.formats.pickle_walk import walk_pickles
    from tieaudit.formats.torch_allowlist import torch_allowlist

    rng = random.Random(2023)
    pool = [data for _, data in ATTACKS.values()] + list(PLAIN.values())[:-1]
    pool += [
        pickle.dumps([{"k": _System()}, {1, 2}, frozenset({3}), bytearray(b"x"), 2**70], protocol=p)
        for p in range(6)
    ]
    cases = pool + [_mutated(rng, rng.choice(pool), pool) for _ in range(3000)]
    cases += [bytes([first]) + b"cposix\nsystem\n(S'x'\ntR." for first in range(256)]
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, str(tmp_path / "case.pkl")],
        input=json.dumps([case.hex() for case in cases]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reached: list[list[list[str]]] = json.loads(done.stdout)
    spelled = torch_allowlist().spelled
    missed = []
    for data, seen in zip(cases, reached, strict=True):
        walk = walk_pickles(data, len(data), len(data))
        covered = walk.ending == "ambiguous" or any(name.startswith("<unresolved") for name in walk.named)
        for module, name in seen:
            if not all(part.isidentifier() for part in module.split(".")):
                continue  # the import fails: nothing of it runs (the walk stops there too)
            if (
                not covered
                and f"{module}.{name}" not in walk.named
                and ".".join(spelled(module, name)) not in walk.named
            ):
                missed.append((data[:80], module, name))
        if not starts_like_pickle(data[:2]):
            assert seen == [], data[:20]
    assert not missed, missed[:5]
    assert sum(1 for seen in reached if seen) > 1000  # the unpickler reached globals in many cases
