"""GGUF (llama.cpp): the header (``gguf_header``), its tensors with their GGML types, the model's
architecture and vocabulary, and the tie pair ``token_embd.weight`` / ``output.weight``.

llama.cpp's converter writes ``output.weight`` only for an untied model; whether the loader then
uses ``token_embd.weight`` as the head depends on the architecture (``gguf_heads.json``, generated
by scripts/gen_gguf_heads.py from llama.cpp's own loader source, with the commit it was read from).
Where the loader falls back, the missing head is a realised tie: recorded as a declared tie of the
loader. Tensor bytes are memory-mapped (``ByteStore``) and never dequantized; a block-quantized
tensor is its raw bytes (``core.dtypes.GGML_BLOCK_TYPES``).
"""

from __future__ import annotations

import mmap
import os

from tieaudit.core.bytestore import ByteStore, OpenCheckpoint
from tieaudit.core.errors import InputError
from tieaudit.core.records import (
    Checkpoint,
    DeclaredTie,
    GgufFacts,
    ModelConfig,
    StorageInfo,
    TensorInfo,
    contiguous_strides,
)
from tieaudit.formats.gguf_header import GgufHeader, GgufTensor, parse_header
from tieaudit.formats.gguf_heads import EMBEDDING, HEAD, head_table
from tieaudit.formats.interface import Reader

_GGML_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
}
"""GGML's element types that have a numpy dtype; the others are block types, kept as bytes."""


def _tensor(tensor: GgufTensor, file: str) -> tuple[TensorInfo, StorageInfo]:
    """A GGML tensor as a record: numpy order (GGML's ne reversed); a block type's rows as bytes."""
    outer = tuple(reversed(tensor.dims[1:]))
    inner = tensor.dims[0] if tensor.dims else 1
    dtype = _GGML_DTYPES.get(tensor.ggml_type, tensor.ggml_type)
    shape = (*outer, inner) if dtype != tensor.ggml_type else (*outer, tensor.row_bytes)
    storage = StorageInfo(
        storage_id=tensor.name, file=file, file_offset=tensor.offset, nbytes=tensor.nbytes, dtype=dtype
    )
    info = TensorInfo(
        name=tensor.name,
        dtype=dtype,
        shape=shape if tensor.dims else (),
        strides=contiguous_strides(shape if tensor.dims else ()),
        storage_id=tensor.name,
        byte_offset=0,
        file=file,
    )
    return info, storage


def _text(header: GgufHeader, key: str) -> str | None:
    value = header.values.get(key)
    return value if isinstance(value, str) else None


def _facts(header: GgufHeader, stored: frozenset[str]) -> GgufFacts:
    pair = {
        t.name: (t.ggml_type, tuple(reversed(t.dims))) for t in header.tensors if t.name in (EMBEDDING, HEAD)
    }
    architecture = _text(header, "general.architecture") or ""
    table = head_table()
    head = "stored" if HEAD in stored else table.heads.get(architecture, "unknown")
    if EMBEDDING not in stored and HEAD not in stored:
        head = "none"
    return GgufFacts(
        version=header.version,
        architecture=architecture,
        head=head,
        loader=table.heads.get(architecture, "unknown"),
        llama_cpp=table.llama_cpp,
        tokenizer=_text(header, "tokenizer.ggml.model"),
        pair=pair,
    )


def _config(header: GgufHeader, facts: GgufFacts, file: str) -> ModelConfig:
    vocab = header.values.get(f"{facts.architecture}.vocab_size")
    return ModelConfig(
        architectures=(facts.architecture,) if facts.architecture else (),
        vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None,
        tokenizer_vocab_size=header.array_lengths.get("tokenizer.ggml.tokens"),
        file=file,
    )


def loader_tie(facts: GgufFacts, file: str) -> DeclaredTie:
    """The tie llama.cpp's loader realises for a file without ``output.weight``."""
    return DeclaredTie(
        dropped=HEAD,
        kept=EMBEDDING,
        declared_by="loader",
        where=f"{file}: llama.cpp loader (arch {facts.architecture}, llama.cpp {facts.llama_cpp[:12]})",
    )


def read_gguf(path: str) -> OpenCheckpoint:
    """Read one GGUF file's header into a Checkpoint; its bytes stay mapped in the ByteStore."""
    file = os.path.basename(path)
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                raise InputError("file is empty", path)
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    try:
        header = parse_header(data, path)
    finally:
        data.close()
    records = [_tensor(t, file) for t in header.tensors]
    stored = frozenset(t.name for t in header.tensors)
    facts = _facts(header, stored)
    checkpoint = Checkpoint(
        path=path,
        format="gguf",
        tensors=tuple(info for info, _ in records),
        storages={storage.storage_id: storage for _, storage in records},
        declared_ties=(loader_tie(facts, file),) if facts.head == "falls-back" else (),
        config=_config(header, facts, file),
        files=(file,),
        gguf=facts,
    )
    return OpenCheckpoint(checkpoint, ByteStore(os.path.dirname(os.path.abspath(path))))


class GgufReader(Reader):
    """Single GGUF files (llama.cpp), told by their magic."""

    format = "gguf"

    def sniff(self, path: str, head: bytes) -> bool:
        return head.startswith(b"GGUF")

    def read(self, path: str) -> OpenCheckpoint:
        return read_gguf(path)
