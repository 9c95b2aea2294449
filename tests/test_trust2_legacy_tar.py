"""torch's pre-0.4 tar format: torch.load(weights_only=False) unpickles its members; tieaudit must see it.

torch 2.13's ``torch.load`` opens any file that is no zip with ``tarfile.open(mode="r:")`` first
(``_legacy_load`` -> ``legacy_load``). When that succeeds, ``weights_only=True`` refuses the file
(RuntimeError: "Cannot use weights_only=True with files saved in the legacy .tar format"), and
``weights_only=False`` unpickles, with the full unpickler, the members ``storages`` (a count, per
storage a record and its bytes, the views), ``tensors`` (a count, per tensor a record and its
sizes) and ``pickle`` (the object); ``sys_info`` is never unpickled. tieaudit listed such a file as
"not read" in a Trainer folder (exit 0), skipped it in ``check DIR`` and, named directly, called it
no checkpoint. Each attack below is proven live (a child's ``torch.load(weights_only=False)``
creates the marker file), and ``check`` must fail it with TIE010 naming ``posix.system`` under any
name and in any folder, running nothing. A tar naming no code is refused in one line (skipped in a
folder); an archive tieaudit does not list is refused in one line, names escaped.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from torch_child import torch_load

from tieaudit.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
import builders  # type: ignore[import-not-found]  # noqa: E402  (the hostile corpus's assemblers)
import cases_trust2_tar as tars  # type: ignore[import-not-found]  # noqa: E402  (the tar builders)

GENERATED = ROOT / "fixtures" / "generated"
MARKER = "MARKER"
COMMAND = f"touch {MARKER}"
SYSTEM = "posix.system"
"""os.system as pickles spell it (its ``__module__``)."""
TENSOR = object()
"""Stands for the tensor the object pickle refers to by persistent id, as torch < 0.4 wrote it."""


class _System:
    """Pickles as a call of os.system (building the bytes calls nothing)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (COMMAND,))


class _TorchPickler(pickle.Pickler):
    """torch < 0.4's object pickler: tensors and storages become persistent ids (their key)."""

    def persistent_id(self, obj: object) -> str | None:
        return "2" if obj is TENSOR else None


def _object(value: object) -> bytes:
    out = io.BytesIO()
    _TorchPickler(out, protocol=2).dump(value)
    return out.getvalue()


def _dumped(value: object) -> bytes:
    return pickle.dumps(value, protocol=2)


PLACES: dict[str, dict[str, bytes]] = {
    "pickle": {"obj": _object({"w": TENSOR, "payload": _System()})},
    "storages": {"storages": tars.storages_member(head=_dumped(_System()))},
    "tensors": {"tensors": tars.tensors_member(head=_dumped(_System()))},
}
"""Where the payload sits, as legacy_tar's keyword arguments: each member torch unpickles."""
SYS_INFO_ONLY = tars.legacy_tar(sys_info=_dumped(_System()))
"""The payload in sys_info, which torch never unpickles."""
CLEAN = tars.legacy_tar(obj=_object({"w": TENSOR}))


def _evil(place: str = "pickle") -> bytes:
    data: bytes = tars.legacy_tar(**PLACES[place])
    return data


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tie010(document: dict[str, object]) -> dict[str, list[str]]:
    """File (as the finding names it) -> the globals TIE010 names there."""
    reports = document["reports"] if "reports" in document else [document]
    assert isinstance(reports, list)
    return {f["details"]["file"]: f["names"] for r in reports for f in r["findings"] if f["rule"] == "TIE010"}


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --- proof: what torch.load does with a tar -------------------------------------------------------


def test_torch_load_unpickles_storages_tensors_and_pickle_but_not_sys_info(tmp_path: Path) -> None:
    files = {f"in_{place}": _evil(place) for place in PLACES} | {"in_sys_info": SYS_INFO_ONLY, "clean": CLEAN}
    wide: dict[str, Path] = {}
    strict: dict[str, Path] = {}
    for slug, data in files.items():
        for side, folders in (("wide", wide), ("strict", strict)):
            folder = tmp_path / side / slug
            folder.mkdir(parents=True)
            (folder / "model.pt").write_bytes(data)
            folders[slug] = folder
    loaded = torch_load(list(wide.values()), weights_only=False)
    ran = {slug for slug, folder in wide.items() if (folder / MARKER).exists()}
    assert ran == {"in_pickle", "in_storages", "in_tensors"}, ran
    assert loaded[str(wide["clean"])] == "loaded ['w'] [0.0, 1.0, 2.0, 3.0]", loaded  # the format is torch's
    refused = torch_load(list(strict.values()), weights_only=True)
    assert set(refused.values()) == {"RuntimeError"}, refused  # "Cannot use weights_only=True with ... .tar"
    assert not any((folder / MARKER).exists() for folder in strict.values())


# --- check: TIE010 under any name ----------------------------------------------------------------


def test_python_m_tieaudit_check_exits_1_naming_posix_system(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(_evil())
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "TIE010" in done.stdout and f"{SYSTEM} (imported, called)" in done.stdout, done.stdout
    assert "pre-0.4 tar checkpoint" in done.stdout, done.stdout
    assert not (tmp_path / MARKER).exists()


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("name", ["model.pt", "pytorch_model.bin", "checkpoint", "weights.pth.tar"])
def test_check_reports_tie010_whatever_the_name_and_the_member(
    name: str, place: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / name).write_bytes(_evil(place))
    monkeypatch.chdir(tmp_path)  # the payload's relative marker would land here if anything ran it
    code, out, err = _cli(["check", str(tmp_path / name), "--format", "json"], capsys)
    assert code == 1, err
    document = json.loads(out)
    assert document["format"] == "pickle" and document["tensors"] == []
    assert _tie010(document) == {name: [SYSTEM]}
    (finding,) = [f for f in document["findings"] if f["rule"] == "TIE010"]
    assert "pre-0.4 tar checkpoint" in finding["details"]["refused"], finding
    assert not (tmp_path / MARKER).exists()


def test_in_a_folder_tars_naming_code_fail_and_tars_naming_none_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "clean.pt").write_bytes(builders.valid_torch_zip())
    evil = {"pickle": "weights", "storages": "optimizer.bin", "tensors": "model.pt"}
    for place, name in evil.items():
        (tmp_path / name).write_bytes(_evil(place))
    (tmp_path / "old_weights").write_bytes(CLEAN)
    (tmp_path / "backup.tar").write_bytes(CLEAN)
    code, out, err = _cli(["check", str(tmp_path), "--format", "json"], capsys)
    assert code == 1, err
    document = json.loads(out)
    assert _tie010(document) == {name: [SYSTEM] for name in evil.values()}
    verdicts = {Path(f["path"]).name: (f["verdict"], f["reason"] or "") for f in document["files"]}
    for clean in ("old_weights", "backup.tar"):
        verdict, reason = verdicts[clean]
        assert verdict == "skipped" and "pre-0.4 torch tar checkpoint" in reason, verdicts
    assert verdicts["clean.pt"][0] == "audited"


def test_a_trainer_folder_whose_training_args_bin_is_a_tar_naming_code_fails_check(
    corpus: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder reader listed it as "not read" (no torch.save data) and passed."""
    folder = tmp_path / "checkpoint-1"
    shutil.copytree(GENERATED / "training" / "checkpoint-2", folder)
    (folder / "rng_state.pth").unlink()  # its numpy globals are TIE010 of their own
    (folder / "training_args.bin").write_bytes(_evil("storages"))
    code, out, err = _cli(["check", str(folder), "--format", "json"], capsys)
    assert code == 1, err
    assert _tie010(json.loads(out)) == {"training_args.bin": [SYSTEM]}
    (folder / "training_args.bin").write_bytes(CLEAN)  # naming no code: listed, not read, and why
    code, out, err = _cli(["check", str(folder), "--format", "json"], capsys)
    assert code == 0, err
    parts = {p["path"]: p["status"] for p in json.loads(out)["training"]["parts"]}
    assert parts["training_args.bin"].startswith("not read: a pre-0.4 torch tar checkpoint"), parts


def test_a_model_folder_whose_pytorch_model_bin_is_a_tar_naming_code_fails_check(
    corpus: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "gpt2_bin"
    shutil.copytree(GENERATED / "hf" / "gpt2_bin", folder)
    (folder / "pytorch_model.bin").write_bytes(_evil("tensors"))
    code, out, err = _cli(["check", str(folder), "--format", "json"], capsys)
    assert code == 1, err
    assert _tie010(json.loads(out)) == {"pytorch_model.bin": [SYSTEM]}


def test_inspect_reports_it_and_other_commands_refuse_it_naming_the_global(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(_evil())
    code, out, _ = _cli(["inspect", str(path), "--format", "json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["format"] == "pickle" and report["tensors"] == []
    assert SYSTEM in [g["name"] for g in report["pickle_globals"]]
    for command in (
        ["retie", str(path), str(tmp_path / "out.pt")],
        ["convert", str(path), str(tmp_path / "o.safetensors")],
    ):
        code, _, err = _cli(command, capsys)
        line = _one_line(err)
        assert code == 2 and SYSTEM in line and "pre-0.4 tar checkpoint" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


# --- naming no code -------------------------------------------------------------------------------


def test_a_tar_naming_no_code_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, data in (("model.pt", CLEAN), ("sys_info_only.pt", SYS_INFO_ONLY)):
        (tmp_path / name).write_bytes(data)
        for command in ("check", "inspect"):
            code, _, err = _cli([command, str(tmp_path / name)], capsys)
            line = _one_line(err)
            assert code == 2 and "a pre-0.4 torch tar checkpoint" in line and "name no code" in line, line


def test_a_member_torch_never_reaches_is_not_held_against_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No 'storages' member: torch.load fails (KeyError) before unpickling anything."""
    data = tars.tar_of(tars.tar_member("pickle", _object({"payload": _System()})))
    folder = tmp_path / "wide"
    folder.mkdir()
    (folder / "model.pt").write_bytes(data)
    assert torch_load([folder], weights_only=False) == {str(folder): "KeyError"}
    assert not (folder / MARKER).exists()
    code, _, err = _cli(["check", str(folder / "model.pt")], capsys)
    assert code == 2 and "without torch's 'storages' member" in _one_line(err), err


# --- hostile archives -----------------------------------------------------------------------------


REFUSED = [case for case in tars.cases() if not case.finding]


@pytest.mark.parametrize("case", REFUSED, ids=[case.name for case in REFUSED])
def test_hostile_archives_are_refused_in_one_line(
    case: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / case.name  # type: ignore[attr-defined]
    path.write_bytes(case.build())  # type: ignore[attr-defined]
    code, _, err = _cli(["check", str(path)], capsys)
    line = _one_line(err)
    assert code == 2 and case.expect.lower() in line.lower(), line  # type: ignore[attr-defined]


def test_member_names_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.pt").write_bytes(tars._escaped_name())
    code, _, err = _cli(["check", str(tmp_path / "model.pt")], capsys)
    line = _one_line(err)
    assert code == 2 and "\\x1b]0;owned\\x07" in line and "\\u202e" in line, line
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err


def test_listing_stops_at_its_member_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive of any number of members costs at most MAX_TAR_MEMBERS + 1 header reads (a million
    members is 512 MB of headers; one past the limit shows the same)."""
    from tieaudit.core.errors import InputError
    from tieaudit.formats import torch_tar
    from tieaudit.formats.torch_tar_walk import read_tar

    parsed: list[int] = []
    real = torch_tar._header

    def counted(block: bytes) -> tarfile.TarInfo:
        parsed.append(1)
        return real(block)

    monkeypatch.setattr(torch_tar, "_header", counted)
    path = tmp_path / "many.tar"
    one = tars.tar_member("x", b"")
    path.write_bytes(tars.tar_of(*[one] * (3 * torch_tar.MAX_TAR_MEMBERS)))
    with pytest.raises(InputError, match="more than 4096 members"):
        read_tar(str(path))
    assert len(parsed) == torch_tar.MAX_TAR_MEMBERS + 1


# --- the listing is tarfile's ---------------------------------------------------------------------


def _tarfile_archive(fmt: int, names: list[str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=fmt) as tar:
        for index, name in enumerate(names):
            info = tarfile.TarInfo(name)
            data = bytes([index]) * (index * 300)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _listings() -> dict[str, bytes]:
    long = "d/" * 60 + "pickle"
    plain = _tarfile_archive(tarfile.USTAR_FORMAT, ["sys_info", "pickle", "tensors", "storages", "pickle"])
    return {
        "ustar": plain,
        "ustar_prefix": _tarfile_archive(tarfile.USTAR_FORMAT, [long, "storages"]),
        "gnu_long_names": _tarfile_archive(tarfile.GNU_FORMAT, ["a" * 150, long, "storages"]),
        "v7_folder": tars.tar_of(
            tars.tar_member("folder/", b"", kind=b"\0"), tars.tar_member("pickle", b"x")
        ),
        "zero_block_inside": plain[:1024] + b"\0" * 512 + plain[1024:],
        "junk_block_inside": plain[:1024] + b"junk" * 128 + plain[1024:],
        "cut_in_a_member": plain[:2100],
        "cut_in_a_header": plain[:1024] + plain[1024:1300],
        "link_and_device": tars.tar_of(
            tars.tar_member("l", b"", kind=b"2", linkname=b"pickle"),
            tars.tar_header(b"c", 999, kind=b"3"),  # a device's size is no data for tarfile
            tars.tar_member("pickle", b"x" * 700),
            tars.tar_member("u", b"y" * 10, kind=b"Z"),  # an unknown type's is
        ),
    }


@pytest.mark.parametrize("slug", sorted(_listings()))
def test_the_listing_is_tarfiles(slug: str) -> None:
    from tieaudit.formats.torch_tar import list_members

    data = _listings()[slug]
    listing = list_members(data, len(data), slug)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            theirs = {m.name: (m.offset_data, m.size, m.type) for m in tar.getmembers()}
    except tarfile.ReadError:
        assert listing.failed, listing
        return
    assert not listing.failed, listing.failed
    ours = {name: (m.data, m.size, m.type) for name, m in listing.members.items()}
    assert ours == theirs  # the last member of a name, where tarfile finds it
