"""Write an edited ONNX skeleton with its weights' bytes copied back in from the input file.

retie edits the model as its skeleton (``formats.onnx_wire``: every ``raw_data`` a placeholder for
where its bytes lie in the input), serializes it, and ``write_inflated`` writes the real model:
it walks the serialized skeleton through the same schema, puts each placeholder's bytes back
(copied file to file inside the kernel where it can, else in bounded chunks) and recomputes every
enclosing length. The weights are never held in memory, only the skeleton: a 2 GB embedded model
is written with the memory of its graph.

The serialized skeleton comes from protobuf itself, so it is well formed: any wire type but the
four protobuf writes, or a placeholder that is not one, is a bug here (AssertionError / ValueError),
never a property of the input.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from tieaudit.formats.onnx_wire import MAX_ONNX_DEPTH, MODEL, RAW_DATA, SCHEMA, TENSOR, encode_varint
from tieaudit.repair.st_stream import pwrite_all, start_writeback

CHUNK_BYTES = 16 << 20
"""Bytes copied per step when the kernel cannot copy file to file."""

Locate = Callable[[bytes], tuple[int, int]]
"""A placeholder -> (file offset, length) of the bytes it stands for."""


@dataclass(frozen=True)
class FileRange:
    offset: int
    length: int


Piece = bytes | FileRange


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


class _Inflate:
    def __init__(self, data: bytes, locate: Locate) -> None:
        self.data = data
        self.locate = locate

    def message(self, kind: str, start: int, end: int, *, depth: int) -> tuple[list[Piece], int]:
        """The pieces of the message of type kind in data[start:end], and their total size."""
        assert depth <= MAX_ONNX_DEPTH, "the skeleton nests deeper than the walk that made it"
        data, children = self.data, SCHEMA[kind]
        pieces: list[Piece] = []
        size, copied_from, pos = 0, start, start
        while pos < end:
            tag_at = pos
            tag, pos = _varint(data, pos)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                pos = _varint(data, pos)[1]
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            elif wire == 2:
                length, body = _varint(data, pos)
                stop = body + length
                if (kind == TENSOR and field == RAW_DATA) or field in children:
                    if tag_at > copied_from:
                        pieces.append(data[copied_from:tag_at])
                        size += tag_at - copied_from
                    if kind == TENSOR and field == RAW_DATA:
                        offset, real = self.locate(data[body:stop])
                        inner: list[Piece] = [FileRange(offset, real)] if real else []
                    else:
                        inner, real = self.message(children[field], body, stop, depth=depth + 1)
                    head = data[tag_at:pos] + encode_varint(real)
                    pieces.append(head)
                    pieces.extend(inner)
                    size += len(head) + real
                    copied_from = stop
                pos = stop
            else:
                raise AssertionError(f"wire type {wire} in a skeleton protobuf serialized")
        if end > copied_from:
            pieces.append(data[copied_from:end])
            size += end - copied_from
        return pieces, size


def inflated(serialized: bytes, locate: Locate) -> tuple[list[Piece], int]:
    """The pieces of the real model a serialized skeleton stands for, and its size in bytes."""
    return _Inflate(serialized, locate).message(MODEL, 0, len(serialized), depth=1)


def _copy_range(source_fd: int, out_fd: int, piece: FileRange, *, out_offset: int) -> None:
    position, remaining, at = piece.offset, piece.length, out_offset
    if hasattr(os, "copy_file_range"):
        try:
            while remaining:
                copied = os.copy_file_range(source_fd, out_fd, remaining, position, at)
                if copied == 0:
                    raise OSError(f"the input ends before byte {position + remaining}")
                position, at, remaining = position + copied, at + copied, remaining - copied
        except OSError:
            if remaining != piece.length:
                raise  # part was copied: a real I/O error
    while remaining:  # file systems that refuse copy_file_range: bounded chunks
        chunk = os.pread(source_fd, min(CHUNK_BYTES, remaining), position)
        if not chunk:
            raise OSError(f"the input ends before byte {position + remaining}")
        pwrite_all(out_fd, chunk, at)
        position, at, remaining = position + len(chunk), at + len(chunk), remaining - len(chunk)


def write_inflated(out: str, pieces: list[Piece], *, source: str) -> None:
    """Create out (it must not exist) from pieces, file ranges copied from source."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        source_fd = os.open(source, os.O_RDONLY)
        try:
            offset = 0
            for piece in pieces:
                if isinstance(piece, FileRange):
                    _copy_range(source_fd, fd, piece, out_offset=offset)
                    start_writeback(fd, offset, piece.length)
                    offset += piece.length
                else:
                    pwrite_all(fd, piece, offset)
                    offset += len(piece)
            os.ftruncate(fd, offset)
        finally:
            os.close(source_fd)
    finally:
        os.close(fd)
