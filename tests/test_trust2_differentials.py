"""Issue 23, point 6: where tieaudit and the reference loaders disagreed. The attacks here are
built at test time (hard links cannot be committed; folders are searched by ``check``, which
the hostile corpus's inspect-and-check runs cannot express); the committed ones are in
fixtures/hostile/cases_trust2_differentials.py.

- ONNX external data reached through a hard link: onnx.load refuses a data file with more than one
  link (onnx/checker.cc, "multiple hard links"), since a link made inside the model's folder can
  reach any file on the same file system. tieaudit took such a file for the model's own: ``check``
  passed and ``retie`` copied the outside file's bytes into OUT.data. A link made after tieaudit
  checked the file, or a file swapped in, must not be read either.
- torch.save data under another name (``.pkl``, ``.pth.zip``, ``.model``, ``.npz``, ``.msgpack``,
  none): torch.load never looks at the name, ``check DIR`` skipped them as "not a checkpoint
  format" (or as NumPy or Flax files), a TIE010 pickle among them included. The reference is torch
  itself, in a child process: every file it takes is audited, every other one skipped as before.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tieaudit.cli.main import main
from tieaudit.core.errors import UnsafeInputError
from tieaudit.formats.bare_pickle import PLAIN_DATA
from tieaudit.formats.onnx_model import OnnxReader
from tieaudit.gate.discover import discover

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures" / "hostile"))
import builders  # type: ignore[import-not-found]  # noqa: E402  (the hostile corpus's pickle and zip assemblers)

SIDE = 32
SECRET = np.arange(SIDE * SIDE, dtype=np.float32).tobytes() * 2
"""The outside file's bytes: two equal 4 KiB halves, read as two equal [32, 32] copies (above
the default --min-size, so retie re-ties them and writes one to OUT.data)."""
HALF = len(SECRET) // 2


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _external(name: str, offset: int) -> onnx.TensorProto:
    proto = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=[SIDE, SIDE])
    proto.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", str(offset)), ("length", str(HALF))):
        proto.external_data.add(key=key, value=value)
    return proto


def _save(folder: Path, initializers: list[onnx.TensorProto], **graph_fields: object) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("MatMul", ["h", "H"], ["o"])],
        "g",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [2, SIDE])],
        initializers,
        **graph_fields,  # type: ignore[arg-type]
    )
    path = folder / "model.onnx"
    path.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    return path


def _model_with_two_copies(folder: Path) -> Path:
    """model.onnx in folder: E and H, equal [32, 32] copies in the two halves of w.bin (retie
    keeps one and writes it to OUT.data)."""
    return _save(folder, [_external("E", 0), _external("H", HALF)])


def _model_with_sparse_external(folder: Path) -> Path:
    """model.onnx in folder whose only external data (w.bin) holds a sparse initializer's values."""
    count = SIDE * SIDE
    indices = helper.make_tensor("S_indices", onnx.TensorProto.INT64, [count], np.arange(count))
    sparse = helper.make_sparse_tensor(_external("S", 0), indices, [count * 4])
    ones = np.ones(count, np.float32)
    embedded = [helper.make_tensor(name, onnx.TensorProto.FLOAT, [SIDE, SIDE], ones) for name in "EH"]
    return _save(folder, embedded, sparse_initializer=[sparse])


@pytest.fixture
def hard_linked(tmp_path: Path) -> Path:
    """A model whose w.bin is a hard link, made in its folder, to a file outside it."""
    outside = tmp_path / "outside" / "secret.bin"
    outside.parent.mkdir()
    outside.write_bytes(SECRET)
    folder = tmp_path / "model"
    folder.mkdir()
    os.link(outside, folder / "w.bin")
    return _model_with_two_copies(folder)


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_onnx_external_data_hard_linked_outside_is_refused(
    hard_linked: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for target in (hard_linked, hard_linked.parent):  # the model, and the folder holding it
        if command == "inspect" and target.is_dir():
            continue
        code, out, err = _cli([command, str(target)], capsys)
        assert code == 2, (command, out, err)
        assert err.count("\n") == 1 and "tieaudit: error: " in err and "model.onnx" in err, err
        assert "2 hard links" in err and "onnx.load refuses" in err, err


def test_onnx_retie_refuses_external_data_hard_linked_outside(
    hard_linked: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = hard_linked.parent
    before = _listing(folder)
    code, _, err = _cli(["retie", str(hard_linked), str(folder / "out.onnx")], capsys)
    assert code == 2 and err.count("\n") == 1 and "2 hard links" in err, err
    assert _listing(folder) == before  # no out.onnx, and no out.onnx.data holding the outside bytes


def test_onnx_external_data_with_two_links_inside_the_folder_is_refused_as_onnx_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """onnx.load cannot tell a link to a file outside from one inside: it refuses any second link."""
    (tmp_path / "w.bin").write_bytes(SECRET)
    os.link(tmp_path / "w.bin", tmp_path / "w-copy.bin")
    path = _model_with_two_copies(tmp_path)
    with pytest.raises(onnx.checker.ValidationError, match="multiple hard links"):
        onnx.load(str(path))
    code, _, err = _cli(["check", str(path)], capsys)
    assert code == 2 and "2 hard links" in err, err


def test_onnx_sparse_initializer_data_hard_linked_outside_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """onnx.load never opens a sparse initializer's data, ONNX Runtime does: confined all the same."""
    (tmp_path / "secret.bin").write_bytes(SECRET)
    folder = tmp_path / "model"
    folder.mkdir()
    os.link(tmp_path / "secret.bin", folder / "w.bin")
    path = _model_with_sparse_external(folder)
    code, _, err = _cli(["check", str(path)], capsys)
    assert code == 2 and "(values)" in err and "2 hard links" in err, err


def test_onnx_external_data_hard_linked_after_the_check_is_not_read(tmp_path: Path) -> None:
    """Between the check and the read someone links the data file elsewhere (or, the same, links
    it in from elsewhere): the read refuses, as onnx's check after opening does."""
    (tmp_path / "w.bin").write_bytes(SECRET)
    path = _model_with_two_copies(tmp_path)
    with OnnxReader().read(str(path)) as opened:
        os.link(tmp_path / "w.bin", tmp_path / "linked-later.bin")
        with pytest.raises(UnsafeInputError, match="2 hard links"):
            opened.array(opened.checkpoint.tensor("E"))


def test_onnx_external_data_swapped_after_the_check_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(SECRET)
    path = _model_with_two_copies(tmp_path)
    with OnnxReader().read(str(path)) as opened:
        (tmp_path / "other.bin").write_bytes(bytes(len(SECRET)))
        os.replace(tmp_path / "other.bin", tmp_path / "w.bin")  # another file under the checked name
        with pytest.raises(UnsafeInputError, match="was replaced"):
            opened.array(opened.checkpoint.tensor("E"))


# --- torch.save data under any name ------------------------------------------------------------


def _legacy_spelled(prefix: bytes) -> bytes:
    """A valid legacy stream whose magic-number pickle is prefix + LONG1(magic) + STOP (torch writes
    PROTO 2 first; its weights_only unpickler takes any opcodes that leave the magic on top)."""
    stream = builders.valid_torch_legacy()
    assert stream.startswith(b"\x80\x02\x8a\x0a")
    return prefix + stream[2:]


TORCH_FILES: dict[str, bytes] = {
    "weights.pkl": builders.valid_torch_zip(),
    "model.pth.zip": builders.valid_torch_zip(),
    "last.model": builders.valid_torch_legacy(),
    "checkpoint": builders.valid_torch_legacy(),  # no suffix at all
    "arrays.npz": builders.valid_torch_zip(),  # named like NumPy's archive
    "flax_model.msgpack": builders.valid_torch_legacy(),  # starts with 0x80, a msgpack map's byte
    "none_first.bin": _legacy_spelled(b"N"),  # no PROTO: not "a pickle" by its first byte
    "memo_after.ckpt": _legacy_spelled(b"\x80\x02]"),  # an empty list pushed before the magic
    "runs_code.pkl": builders._zip_with_evil(builders.os_system()),  # TIE010 under another name
}
"""torch.save data torch.load takes whatever the name (checked below against torch itself)."""


def _ordinary_files() -> dict[str, bytes]:
    """What a model repository holds besides checkpoints: torch.load refuses each one."""
    import io

    import numpy as np

    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("notes/a.txt", "x")
    npz = io.BytesIO()
    np.savez(npz, a=np.arange(10))
    return {
        "README.md": b"# model\n",
        "LICENSE": b"License text\n",
        "NOTICE": b"Notice\n",
        "tokenizer.json": b'{"model": {}}',
        "vocab.pkl": pickle.dumps({f"w{i}": i for i in range(20_000)}, protocol=3),  # 300 KB, torch's opcodes
        "merges.pkl": pickle.dumps([("a", "b")] * 10, protocol=2),
        "scaler.pkl": pickle.dumps(complex(1, 2), protocol=2),  # a global (builtins.complex), then STOP
        "frame.pkl": pickle.dumps(list(range(1000)), protocol=5),
        "real.npz": npz.getvalue(),
        "data.zip": zipped.getvalue(),
        "logo.png": b"\x89PNG\r\n\x1a\n" + bytes(64),
    }


TORCH_TAKES = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
from inert_pickle import load_like_torch
warnings.simplefilter("ignore")
taken = {}
for path in sys.argv[2:]:
    try:
        taken[path] = load_like_torch(torch, path)[1]
    except Exception as exc:
        taken[path] = ""
print(json.dumps(taken))
"""
"""For each file: how torch.load takes it ("weights_only", or "inert" for a file it refuses only for
globals outside its allowlist: loaded with weights_only=False and an inert unpickler), or ""."""


def _torch_takes(paths: list[Path]) -> dict[str, str]:
    tests = str(ROOT / "tests")
    done = subprocess.run(
        [sys.executable, "-c", TORCH_TAKES, tests, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    taken: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return taken


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("repo")
    for name, data in {**TORCH_FILES, **_ordinary_files()}.items():
        (folder / name).write_bytes(data)
    return folder


def test_check_finds_what_torch_load_takes_whatever_its_name(repo: Path) -> None:
    paths = sorted(repo.iterdir())
    taken = _torch_takes(paths)
    assert {Path(p).name for p, how in taken.items() if how} == set(TORCH_FILES)  # the reference agrees
    found = discover([str(repo)])
    audited = {Path(f.path).name for f in found.files if f.verdict == "audited"}
    assert audited == set(TORCH_FILES)
    reasons = {Path(f.path).name: f.reason for f in found.files if f.verdict == "skipped"}
    pickles = {name for name in _ordinary_files() if name.endswith(".pkl")}  # plain data: named as such
    assert reasons == {
        **{name: PLAIN_DATA if name in pickles else "not a checkpoint format" for name in _ordinary_files()},
        "real.npz": "NumPy .npz archive: recognised, not supported yet",
    }


def test_check_reports_a_pickle_that_runs_code_under_another_name(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(["check", str(repo), "--format", "json"], capsys)
    assert code == 1, err
    reports = {Path(r["path"]).name: r for r in json.loads(out)["reports"]}
    assert set(reports) == set(TORCH_FILES)
    rules = {name: [f["rule"] for f in r["findings"]] for name, r in reports.items()}
    assert rules["runs_code.pkl"] == ["TIE010"]
    assert all(
        not any(rule == "TIE010" for rule in found)
        for name, found in rules.items()
        if name != "runs_code.pkl"
    )


@pytest.mark.parametrize("name", ["arrays.npz", "flax_model.msgpack", "none_first.bin", "memo_after.ckpt"])
def test_a_torch_file_named_on_the_command_line_is_read_as_torch_load_reads_it(
    repo: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "NumPy .npz archive" or "Flax msgpack" (what the name says), nor "not a checkpoint" for a
    magic number spelled otherwise than torch.save spells it: torch.load takes each one."""
    code, out, err = _cli(["inspect", str(repo / name), "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["format"] == "torch"


def test_content_sniffing_reads_at_most_the_legacy_header_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 10 MB pickle of torch's opcodes (a big vocab.pkl) is not read whole to find it is no torch file."""
    from tieaudit.formats import torch_sniff

    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps([f"token{i}" for i in range(800_000)], protocol=3))
    assert path.stat().st_size > 10 << 20
    reads: list[int] = []
    real = torch_sniff.pread

    def counted(fd: int, count: int, offset: int) -> bytes:
        reads.append(count)
        return real(fd, count, offset)

    monkeypatch.setattr(torch_sniff, "pread", counted)
    assert not torch_sniff.is_torch_content(str(path), path.read_bytes()[:64])
    assert reads and max(reads) <= torch_sniff.MAX_HEADER_PICKLE_BYTES


def test_a_cut_legacy_stream_under_another_name_is_an_error_not_a_skip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its first pickle is torch's magic number: torch.load takes it for a legacy stream (and fails
    on the rest), so it is a broken checkpoint, which fails the gate, not a file to pass over."""
    (tmp_path / "model.pkl").write_bytes(builders.pickle_of(builders.integer(builders.LEGACY_MAGIC)))
    code, _, err = _cli(["check", str(tmp_path)], capsys)
    assert code == 2 and "model.pkl: the protocol version is not a valid torch pickle" in err, err


@pytest.mark.parametrize("name", ["training_state.pkl", "model.pth.zip", "pytorch_model"])
def test_a_pickle_that_runs_code_renamed_beside_a_clean_checkpoint_fails_the_gate(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate passed (exit 0): the clean model.pt was audited, the renamed torch zip whose pickle
    calls os.system (which torch.load(weights_only=False) runs) was skipped as not a checkpoint."""
    (tmp_path / "model.pt").write_bytes(builders.valid_torch_zip())
    (tmp_path / name).write_bytes(builders._zip_with_evil(builders.os_system()))
    code, out, err = _cli(["check", str(tmp_path)], capsys)
    assert code == 1, (out, err)
    assert f"FAIL {tmp_path / name}" in out and "TIE010" in out and "posix.system" in out, out
