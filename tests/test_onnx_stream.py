"""repair.onnx_stream: a skeleton serialized by protobuf, with its weights put back from the file,
is the model onnx itself serializes, over every ONNX file of the corpora that has a skeleton."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from conftest import GENERATED, ROOT

from tieaudit.formats.onnx_model import load_skeleton
from tieaudit.repair.onnx_stream import FileRange, inflated, write_inflated

FILES = sorted([*GENERATED.glob("onnx/**/*.onnx"), *(ROOT / "fixtures" / "hostile").glob("onnx_ok*.onnx")])


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_the_inflated_skeleton_is_what_onnx_serializes(path: Path, tmp_path: Path) -> None:
    model, found = load_skeleton(str(path))
    if found is None:  # a spelling the walker leaves to the whole parse: retie writes it as onnx does
        assert GENERATED not in path.parents, f"{path.name}: an exporter's model has no skeleton"
        return
    pieces, size = inflated(model.SerializeToString(), found.locate)
    out = tmp_path / "out.onnx"
    write_inflated(str(out), pieces, source=str(path))
    expected = onnx.load(str(path), load_external_data=False).SerializeToString()
    assert out.stat().st_size == size
    assert out.read_bytes() == expected
    # every byte copied is a raw_data of the file (a tensor holding two keeps the last, as parsed)
    table = set(zip(found.offsets, found.lengths, strict=True))
    assert {(p.offset, p.length) for p in pieces if isinstance(p, FileRange)} <= table


def test_the_corpus_has_embedded_weights_to_copy() -> None:
    assert len(FILES) >= 6
    copied = [
        p for p in FILES if (found := load_skeleton(str(p))[1]) is not None and sum(found.lengths) > 1 << 16
    ]
    assert copied, "no file of the corpus puts more than 64 KiB back"


def test_out_must_not_exist(tmp_path: Path) -> None:
    (tmp_path / "taken.onnx").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        write_inflated(str(tmp_path / "taken.onnx"), [b"x"], source=str(FILES[0]))
    assert (tmp_path / "taken.onnx").read_bytes() == b"mine"
