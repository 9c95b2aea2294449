"""Issue 23, point 6: where tieaudit read what the reference loaders refuse. The attacks here are
built at test time (hard links cannot be committed); the committed ones are in
fixtures/hostile/cases_trust2_differentials.py.

ONNX external data reached through a hard link: onnx.load refuses a data file with more than one
link (onnx/checker.cc, "multiple hard links"), since a link made inside the model's folder can
reach any file on the same file system. tieaudit took such a file for the model's own: ``check``
passed and ``retie`` copied the outside file's bytes into OUT.data. A link made after tieaudit
checked the file, or a file swapped in, must not be read either.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tieaudit.cli.main import main
from tieaudit.core.errors import UnsafeInputError
from tieaudit.formats.onnx_model import OnnxReader

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
