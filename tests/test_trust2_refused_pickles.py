"""A torch file tieaudit's reader refuses, but whose pickle names code, is TIE010 (exit 1), not exit 2.

The torch reader refuses what torch's weights_only refuses (INST, OBJ, STACK_GLOBAL, POP, a storage
id torch reads but weights_only's rules do not take) and stopped there: the refusal named only the
globals the VM had met before it ("its pickle also names X"), so a data.pkl starting with INST, or
naming a global after the refused opcode, was exit 2 with no name, and a Trainer folder listed it as
"not read" and passed. ``torch.load(weights_only=False)`` reads on past that point. Each attack here
is proven live (a child's ``torch.load(weights_only=False)`` creates the marker file; one that torch
never gets as far as the global is marked so), and ``check`` must fail it with TIE010 naming the
global and keeping the reader's refusal as the reason, running nothing. A refusal whose pickle names
no code keeps its one line; one whose pickle cannot be walked to its end is never passed.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch_child import torch_load

from tieaudit.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
import builders  # type: ignore[import-not-found]  # noqa: E402  (the hostile corpus's assemblers)

MARKER = "MARKER"
COMMAND = f"touch {MARKER}"
SYSTEM = "posix.system"
"""os.system as pickles spell it (its ``__module__``)."""
TRAINER = ROOT / "fixtures" / "generated" / "training" / "checkpoint-2"


def _call_system() -> bytes:
    """posix.system(COMMAND) through GLOBAL and REDUCE."""
    return builders.call(builders.glob("posix", "system"), builders.text(COMMAND))


def _state_dict_then(payload: bytes, *, pid: bytes | None = None) -> bytes:
    """A state dict of one tensor (storage id pid, or a valid one), then a 'payload' entry."""
    storage = pid or builders.storage_pid("0", 4)
    tensor = builders.call(
        builders.glob("torch._utils", "_rebuild_tensor_v2"),
        storage,
        builders.integer(0),
        builders.tup(builders.integer(4)),
        builders.tup(builders.integer(1)),
        builders.false(),
        builders.call(builders.glob("collections", "OrderedDict")),
    )
    return builders.pickle_of(builders.state_dict(("w", tensor), ("payload", payload)))


def _zip(data_pkl: bytes) -> bytes:
    return builders.torch_zip(data_pkl, {"0": builders.weights(4)})


def _int_key_pid() -> bytes:
    """('storage', torch.FloatStorage, 0, 'cpu', 4): torch reads record data/0 for the int key;
    tieaudit's reader takes only string keys, as torch.save writes them."""
    fields = [builders.text("storage"), builders.glob("torch", "FloatStorage"), builders.integer(0)]
    return builders.tup(*fields, builders.text("cpu"), builders.integer(4)) + b"Q"


def _six_field_pid() -> bytes:
    """A legacy stream's six-field storage id in a zip: torch's persistent_load fails to unpack it."""
    fields = [builders.text("storage"), builders.glob("torch", "FloatStorage"), builders.text("0")]
    return builders.tup(*fields, builders.text("cpu"), builders.integer(4), b"N") + b"Q"


@dataclass(frozen=True)
class Attack:
    name: str
    """The file's name."""
    data: bytes
    named: str
    """The global TIE010 must name."""
    refusal: str
    """A fragment of the reader's refusal, kept as the finding's reason."""
    runs: bool = True
    """torch.load(weights_only=False) gets as far as the global (and creates the marker)."""


ATTACKS = {
    "inst_first": Attack(
        "model.pt",
        _zip(b"(" + builders.text(COMMAND) + b"iposix\nsystem\n."),
        SYSTEM,
        "INST (0x69)",
    ),
    "obj": Attack(
        "pytorch_model.bin",
        _zip(b"(cposix\nsystem\n" + builders.text(COMMAND) + b"o."),
        SYSTEM,
        "OBJ (0x6f)",
    ),
    "stack_global_after_pop": Attack(
        "weights.pth",
        _zip(
            builders.proto(2)
            + b"N0"  # NONE, POP: the reader refuses POP and stops here
            + builders.stack_glob("posix", "system")
            + builders.tup(builders.text(COMMAND))
            + b"R."
        ),
        SYSTEM,
        "POP",
    ),
    "global_after_int_storage_key": Attack(
        "checkpoint",
        _zip(_state_dict_then(_call_system(), pid=_int_key_pid())),
        SYSTEM,
        "malformed storage id",
    ),
    "global_after_six_field_storage_id": Attack(
        "last.ckpt",
        _zip(_state_dict_then(_call_system(), pid=_six_field_pid())),
        SYSTEM,
        "storage id of 6 fields",
        runs=False,  # torch's persistent_load fails to unpack the id before the call
    ),
    "legacy_stack_global": Attack(
        "legacy.pt",
        builders.legacy_file(
            builders.pickle_of(
                builders.state_dict(
                    ("payload", builders.call(builders.stack_glob("posix", "system"), builders.text(COMMAND)))
                )
            ),
            [],
            [],
        ),
        SYSTEM,
        "STACK_GLOBAL (0x93)",
    ),
}


def _write(folder: Path, attack: Attack) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / attack.name
    path.write_bytes(attack.data)
    return path


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tie010(document: dict[str, object]) -> list[tuple[list[str], dict[str, str]]]:
    reports = document["reports"] if "reports" in document else [document]
    assert isinstance(reports, list)
    return [(f["names"], f["details"]) for r in reports for f in r["findings"] if f["rule"] == "TIE010"]


# --- proof: torch.load(weights_only=False) runs each (where it gets that far) ---------------------


def test_each_attack_runs_code_under_torch_load_and_weights_only_refuses_it(tmp_path: Path) -> None:
    wide = {slug: _write(tmp_path / "wide" / slug, a).parent for slug, a in ATTACKS.items()}
    strict = {slug: _write(tmp_path / "strict" / slug, a).parent for slug, a in ATTACKS.items()}
    torch_load(list(wide.values()), weights_only=False)
    ran = {slug for slug, folder in wide.items() if (folder / MARKER).exists()}
    assert ran == {slug for slug, a in ATTACKS.items() if a.runs}, ran
    refused = torch_load(list(strict.values()), weights_only=True)
    expected = {str(folder): "UnpicklingError" for folder in strict.values()}
    expected[str(strict["global_after_six_field_storage_id"])] = "ValueError"  # fails unpacking the id
    assert refused == expected, refused
    assert not any((folder / MARKER).exists() for folder in strict.values())


# --- check: TIE010 naming the global, with the reader's refusal as the reason ---------------------


@pytest.mark.parametrize("slug", sorted(ATTACKS))
def test_check_reports_tie010_naming_the_global_and_the_refusal(
    slug: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    attack = ATTACKS[slug]
    path = _write(tmp_path, attack)
    monkeypatch.chdir(tmp_path)  # the payload's relative marker would land here if anything ran it
    code, out, err = _cli(["check", str(path), "--format", "json"], capsys)
    assert code == 1, (out, err)
    ((names, details),) = _tie010(json.loads(out))
    assert attack.named in names, names
    assert details["file"] == attack.name
    assert "the torch reader refuses it" in details["refused"], details
    assert attack.refusal in details["refused"], details
    assert not (tmp_path / MARKER).exists()


def test_check_text_says_no_tensors_were_read_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, ATTACKS["inst_first"])
    code, out, _ = _cli(["check", str(path)], capsys)
    assert code == 1
    joined = " ".join(out.split())  # lines wrap to the width
    assert f"FAIL {path} (pickle, 0 tensors" in joined, out
    assert f"{SYSTEM} (imported, instantiated)" in joined, out
    assert "tieaudit read no tensors from it (the torch reader refuses it:" in joined, out


def test_each_attack_renamed_in_a_folder_beside_a_clean_checkpoint_fails_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "clean.pt").write_bytes(builders.valid_torch_zip())
    for slug, attack in ATTACKS.items():
        (tmp_path / f"{slug}.{attack.name}").write_bytes(attack.data)
    code, out, err = _cli(["check", str(tmp_path), "--format", "json"], capsys)
    assert code == 1, err
    reports = json.loads(out)["reports"]
    failed = {Path(r["path"]).name for r in reports if any(f["rule"] == "TIE010" for f in r["findings"])}
    assert failed == {f"{slug}.{a.name}" for slug, a in ATTACKS.items()}, failed


def test_inspect_reports_it_and_other_commands_refuse_it_naming_the_global(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, ATTACKS["stack_global_after_pop"])
    code, out, _ = _cli(["inspect", str(path), "--format", "json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["format"] == "pickle" and report["tensors"] == []
    assert [g["name"] for g in report["pickle_globals"]] == [SYSTEM]
    assert [f["rule"] for f in report["findings"]] == ["TIE010"]
    for command in (
        ["retie", str(path), str(tmp_path / "out.pt")],
        ["convert", str(path), str(tmp_path / "o.safetensors")],
    ):
        code, _, err = _cli(command, capsys)
        assert code == 2 and SYSTEM in err and "the torch reader refuses it" in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# --- folders: never "not read" and passed ---------------------------------------------------------


def test_a_trainer_folder_whose_optimizer_pt_names_code_past_a_refusal_fails_check(
    corpus: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Trainer folder listed optimizer.pt as "not read: ... not a valid torch pickle" and passed."""
    folder = tmp_path / "checkpoint-2"
    shutil.copytree(TRAINER, folder)
    (folder / "rng_state.pth").unlink()  # its numpy globals are TIE010 of their own
    (folder / "optimizer.pt").write_bytes(ATTACKS["inst_first"].data)
    code, out, err = _cli(["check", str(folder), "--format", "json"], capsys)
    assert code == 1, err
    found = {details["file"]: names for names, details in _tie010(json.loads(out))}
    assert found["optimizer.pt"] == [SYSTEM], found


def test_a_refusal_naming_no_code_keeps_its_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(_zip(builders.pickle_of(builders.dct() + b"\x82\x01")))  # EXT1: the unpickler fails too
    code, _, err = _cli(["check", str(path)], capsys)
    assert code == 2 and "is not a valid torch pickle (opcode EXT1 (0x82)" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_refused_pickle_that_cannot_be_walked_to_its_end_is_never_passed(
    corpus: object, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pickle longer than the walk of a refused file may read (MIN_REFUSED_WALK_BYTES, and what
    the file's pickle budget has left: both shrunk here): nothing vouches for the rest, so it is
    refused, in a Trainer folder too (where it used to be "not read")."""
    from tieaudit.formats import torch_file

    monkeypatch.setattr(torch_file, "MIN_REFUSED_WALK_BYTES", 1024)
    monkeypatch.setattr(torch_file, "REFUSED_WALK_UNITS_PER_BYTE", 1 << 40)
    rng = random.Random(5)
    strings = b"".join(builders.text(rng.randbytes(16).hex()) + b"0" for _ in range(4000))
    body = builders.proto(2) + b"N0" + strings + b"N."  # POP: the reader refuses it at once
    data = builders.torch_zip(body)
    (tmp_path / "model.pt").write_bytes(data)
    code, _, err = _cli(["check", str(tmp_path / "model.pt")], capsys)
    assert code == 2 and "cannot walk its pickle to its end" in err, err
    assert len(err.strip().splitlines()) == 1, err
    folder = tmp_path / "checkpoint-2"
    shutil.copytree(TRAINER, folder)
    (folder / "rng_state.pth").unlink()
    (folder / "optimizer.pt").write_bytes(data)
    code, _, err = _cli(["check", str(folder)], capsys)
    assert code == 2 and "optimizer.pt" in err and "cannot walk its pickle to its end" in err, err


def test_a_legacy_stream_refused_by_the_reader_is_walked_from_its_start(tmp_path: Path) -> None:
    """The walk reads the five pickles torch.load reads, the object pickle with persistent ids."""
    from tieaudit.formats.torch_file import TorchReader

    call = builders.call(builders.stack_glob("builtins", "eval"), builders.text("0"))
    obj = builders.state_dict(("w", builders.tensor("0", 2, (2,), legacy=True)), ("x", call))
    path = tmp_path / "old.pt"
    path.write_bytes(builders.legacy_file(builders.pickle_of(obj), ["0"], [(2, builders.weights(2))]))
    with TorchReader().read(str(path)) as opened:
        ckpt = opened.checkpoint
    assert ckpt.format == "pickle" and not ckpt.tensors
    assert [g.name for g in ckpt.pickle_globals if g.verdict == "runs-code"] == ["builtins.eval"]


def test_names_from_the_refused_pickle_are_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hidden = "system\x1b[2J\u202e"
    data = _zip(builders.proto(2) + b"N0" + builders.stack_glob("posix", hidden) + builders.tup() + b"R.")
    (tmp_path / "model.pt").write_bytes(data)
    code, out, _ = _cli(["check", str(tmp_path)], capsys)
    assert code == 1 and "TIE010" in out
    assert "\x1b" not in out and "\u202e" not in out, out


def test_the_walk_reads_data_pkl_with_torchs_persistent_load(tmp_path: Path) -> None:
    """A global after the storage ids of valid tensors is named: data.pkl is walked with a
    persistent_load (a walk without one would stop at the first tensor)."""
    from tieaudit.formats.torch_file import TorchReader

    call = builders.stack_glob("posix", "system") + builders.tup(builders.text(COMMAND)) + b"R"
    (tmp_path / "model.pt").write_bytes(_zip(_state_dict_then(b"N0" + call)))  # POP: the reader stops
    with TorchReader().read(str(tmp_path / "model.pt")) as opened:
        names = [g.name for g in opened.checkpoint.pickle_globals if g.verdict == "runs-code"]
    assert names == [SYSTEM]
