"""The records passed between stages: what a reader found in a checkpoint.

Readers build these from metadata alone; they hold no open file and pickle cleanly. Tensor bytes
are reached through ``core.bytestore.OpenCheckpoint``, which owns the memory maps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from tieaudit.core.dtypes import itemsize
from tieaudit.core.errors import InputError
from tieaudit.core.escape import quoted
from tieaudit.core.limits import NPY_INTP_MAX, bounded_product, shown_dims
from tieaudit.core.training import TrainingLayout

Format = Literal["torch", "torchscript", "safetensors", "onnx", "hf-dir", "gguf", "pickle"]
DeclaredBy = Literal["config", "metadata", "index", "policy", "loader"]
ConsumerRole = Literal["embedding", "head", "alias", "other"]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements, of a tensor stored densely."""
    strides: list[int] = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


@dataclass(frozen=True, kw_only=True)
class StorageInfo:
    """One run of bytes that one or more tensors view."""

    storage_id: str
    """Identifier unique within the checkpoint (torch record key, safetensors name, ...)."""
    file: str
    """File holding the bytes, relative to the checkpoint path's folder."""
    file_offset: int
    """Offset of the storage's first byte in that file (-1 when held in memory)."""
    nbytes: int
    """Size of the storage in bytes."""
    dtype: str
    """Canonical dtype of the storage elements."""
    location: str = ""
    """Where a torch file records the storage was saved from (``cpu``, ``cuda:0``), which
    ``torch.load`` restores it to; "" for formats that record none."""


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """A named tensor as stored: a strided view into one storage."""

    name: str
    """Key as stored (state-dict key, safetensors key, ONNX initializer name)."""
    dtype: str
    """Canonical dtype name (torch spelling: float32, bfloat16, ...)."""
    shape: tuple[int, ...]
    """Shape in elements."""
    strides: tuple[int, ...]
    """Strides in elements, as torch reports them."""
    storage_id: str
    """The storage this tensor views."""
    byte_offset: int
    """Offset of element 0 from the start of the storage, in bytes."""
    file: str
    """File holding the storage, relative to the checkpoint path's folder."""

    @property
    def numel(self) -> int:
        """Number of elements. Readers refuse shapes no numpy view can hold (formats.viewable), so
        this is at most 2**63 - 1; the bound is checked before each multiplication all the same."""
        count = bounded_product(self.shape, NPY_INTP_MAX)
        if count is None:
            shown = shown_dims(self.shape)
            raise InputError(f"tensor {quoted(self.name)}: shape {shown} is too large to count", self.file)
        return count

    @property
    def nbytes(self) -> int:
        """Bytes the tensor's elements occupy."""
        return self.numel * itemsize(self.dtype)

    def byte_span(self) -> tuple[int, int]:
        """[start, end) of the bytes this view touches within its storage."""
        if self.numel == 0:
            return (self.byte_offset, self.byte_offset)
        # Readers reject negative strides, so the last element is the furthest one.
        last = sum((dim - 1) * stride for dim, stride in zip(self.shape, self.strides, strict=True))
        return (self.byte_offset, self.byte_offset + (last + 1) * itemsize(self.dtype))


@dataclass(frozen=True, kw_only=True)
class DeclaredTie:
    """A statement, somewhere outside the tensor bytes, that dropped is kept: a loader restores
    dropped from kept (transformers ties target to source; the JSON report keeps those names)."""

    dropped: str
    """The name a loader restores from kept, discarding any bytes stored under it (usually the
    output head; transformers' tie target)."""
    kept: str
    """The name that holds the parameter (usually the input embedding; transformers' tie source)."""
    declared_by: DeclaredBy
    """Who says so: config.json, safetensors metadata, the shard index, the policy, or the loader
    (llama.cpp's, for a GGUF file without ``output.weight``: ``formats.gguf_heads``)."""
    where: str
    """The file (and key) where the declaration was found."""
    relation: str = "equal"
    """equal; or, in tieaudit's own ``tieaudit.ties`` record, transposed or cast."""
    dtype: str | None = None
    """For a cast: dropped's dtype (kept cast to it gives dropped)."""


@dataclass(frozen=True, kw_only=True)
class Consumer:
    """One use of an ONNX initializer as a node input."""

    node: str
    """Node name (or ``#index`` when the node is unnamed)."""
    op_type: str
    """ONNX operator type, e.g. Gather, MatMul, Transpose."""
    slot: int
    """Input position of the initializer in that node."""
    graph: str
    """Name of the (sub)graph holding the node; ``main`` for the top graph."""
    role: ConsumerRole = "other"
    """What the node uses the tensor as: ``embedding`` (the data input of a Gather, a lookup
    table), ``head`` (input A or B of a MatMul or Gemm, directly or through the Transpose and
    Identity nodes listed in reaches), ``alias`` (an Identity: its output is another name for the
    tensor, whose readers are consumers in their own right), ``other``."""
    reaches: tuple[Consumer, ...] = ()
    """For a Transpose (or Identity) reading the tensor: the MatMul and Gemm inputs its output
    feeds, through further Transpose and Identity nodes."""


MAX_KEPT_SKIPPED = 10_000
"""Non-tensor entries a reader keeps by name; the rest are counted. A 64 KB pickle can hold
hundreds of thousands of integer leaves: an object for each costs more than the read itself."""


@dataclass(frozen=True)
class Skipped:
    """An entry the reader saw but did not treat as a tensor."""

    name: str
    """Dotted name of the entry."""
    reason: str
    """Why it was not read as a tensor, e.g. ``int leaf``."""
    file: str = ""
    """The file holding it, relative to the checkpoint folder ("" for notes on no file's entry)."""


@dataclass(frozen=True, kw_only=True)
class UnreadTensor:
    """A tensor the file holds that tieaudit lists but does not read as stored values: quantized,
    sparse, nested, meta, of a dtype numpy has no view for (complex32, bits8, int4, ...), with the
    conj or neg bit set, a wrapper subclass. Never audited; convert refuses it, retie carries it
    unchanged (torch writes it back) and verifies it with the reference loader."""

    name: str
    """Dotted name of the entry."""
    kind: str
    """What it is, e.g. ``quantized (per_tensor_affine)``, ``sparse (sparse_coo)``, ``conj bit``."""
    dtype: str
    """torch dtype name of its elements."""
    shape: tuple[int, ...] | None
    """Size per dimension (None: a nested tensor's ragged dims)."""
    file: str
    """File holding it, relative to the checkpoint path's folder."""

    def describe(self) -> str:
        """``kind, dtype [d0, d1]`` for one-line messages (names escaped by the caller)."""
        shape = "" if self.shape is None else f" {list(self.shape)}"
        return f"{self.kind}, {self.dtype}{shape}"


@dataclass(frozen=True, kw_only=True)
class PickleGlobal:
    """A global a pickle names (a class or function it would import), never imported by tieaudit."""

    name: str
    """Dotted name, e.g. ``argparse.Namespace``."""
    verdict: str
    """torch's verdict: ``allowed`` (on its default weights_only allowlist, read for real) or
    ``runs-code`` (anything else: an inert placeholder here, imported and used by a full unpickle)."""
    file: str
    """The file whose pickle names it, relative to the checkpoint folder."""
    use: str = "imported"
    """What a full unpickle would do with it, in order: ``imported``, ``called``, ``instantiated``,
    ``state set`` (comma-separated)."""
    refused: str = ""
    """Why tieaudit read no tensors from the file ("" when it read the file): a pickle that is no
    torch.save data, a torch file its reader refuses, a pre-0.4 tar checkpoint. The name then comes
    from walking the file's pickles opcode by opcode (``formats.pickle_walk``)."""


@dataclass(frozen=True, kw_only=True)
class VocabRoles:
    """The tensors one model class uses as its vocabulary matrices, from the tie table, spelled as
    the files store them (a dropped tie target: its source; see ``formats.hf_ties.class_roles``)."""

    architecture: str
    """The model class (``architectures`` names exactly this one)."""
    input_embedding: str | None
    """The input embedding's weight (None: the class has none)."""
    output_embedding: str | None
    """The output projection's weight (None: the class has no vocabulary head)."""
    output_bias: str | None
    """The output projection's bias (None: the head has no bias)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Facts from a Hugging Face config.json that tie rules use."""

    architectures: tuple[str, ...] = ()
    """Model classes named in ``architectures``."""
    tie_word_embeddings: bool | None = None
    """The config's word-embedding tie flag (None when not stated)."""
    vocab_size: int | None = None
    """Declared vocabulary size."""
    tokenizer_vocab_size: int | None = None
    """Vocabulary size of tokenizer.json, where present."""
    file: str = "config.json"
    """Where these facts came from."""
    roles: VocabRoles | None = None
    """The class's vocabulary tensors; None when ``architectures`` names no class, several, or one
    the tie table does not answer for (then only tensors whose role is unambiguous are used)."""
    class_ties: tuple[tuple[str, str], ...] | None = None
    """``(target, source)`` pairs the class ties under some setting of its switches, spelled as
    stored; None when the class is not known (as for ``roles``). Equal tensors outside these are
    equal by construction, not a tie the loader restores."""
    layer_templates: frozenset[str] | None = None
    """When the table gives only the class's ties outside numbered layers for this config (other
    layer counts): the names its ties use, numbers replaced by ``#`` (``model.layers.#.x.weight``);
    an equal copy none of whose names matches one is equal by construction. None otherwise."""


@dataclass(frozen=True, kw_only=True)
class GgufFacts:
    """What a GGUF file says of its model, and what llama.cpp's loader does with its head."""

    version: int
    """GGUF version (2 or 3)."""
    architecture: str
    """``general.architecture`` (empty when absent)."""
    head: str
    """This file's head: ``stored`` (``output.weight`` is in the file), else the loader's policy
    for it (``loader``), or ``none`` when neither head nor embedding is stored."""
    loader: str
    """llama.cpp's loader for the architecture without ``output.weight``: ``falls-back`` (uses
    ``token_embd.weight``), ``required`` (does not load), ``embedding`` (always the embedding),
    ``optional`` (no head), ``none`` (the loader makes no head), ``conditional`` (hyperparameters
    decide), ``unknown`` (not in the table: formats/gguf_heads.json)."""
    llama_cpp: str
    """The llama.cpp commit the loader table was read from."""
    tokenizer: str | None
    """``tokenizer.ggml.model`` (gpt2, llama, ...)."""
    pair: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """``token_embd.weight`` and ``output.weight``, where stored: GGML type and shape in elements
    (numpy order; a block type's TensorInfo shape counts bytes per row instead)."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Everything a reader found: metadata only (the bytes: ``OpenCheckpoint``)."""

    path: str
    """The path the user gave."""
    format: Format
    """Which reader produced this."""
    tensors: tuple[TensorInfo, ...]
    """Every tensor, in stored order."""
    storages: Mapping[str, StorageInfo]
    """Storages by id."""
    declared_ties: tuple[DeclaredTie, ...] = ()
    """Ties stated outside the bytes (config, metadata, index)."""
    consumers: Mapping[str, tuple[Consumer, ...]] = field(default_factory=dict)
    """ONNX: initializer name -> nodes using it."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """ONNX: value names that are another name for an initializer (Identity outputs)."""
    skipped: tuple[Skipped, ...] = ()
    """Entries that are not tensors (epoch counters, strings, ...), at most MAX_KEPT_SKIPPED."""
    skipped_more: int = 0
    """Further non-tensor entries, counted but not kept."""
    config: ModelConfig | None = None
    """Hugging Face config facts, for folders."""
    files: tuple[str, ...] = ()
    """Every file read, relative to the checkpoint folder."""
    pickle_globals: tuple[PickleGlobal, ...] = ()
    """Every global the pickles read name, with its verdict (torch files)."""
    training: TrainingLayout | None = None
    """A training checkpoint's model part and optimizer states (None: not a training checkpoint)."""
    gguf: GgufFacts | None = None
    """A GGUF file's architecture, tokenizer and head policy (None: not GGUF)."""
    unread: tuple[UnreadTensor, ...] = ()
    """Tensors listed but not read (quantized, sparse, meta, ...): every one is kept, never counted
    away like ``skipped``, since convert and retie must account for each."""
    notes: tuple[str, ...] = ()
    """What the reader says of the file beside its tensors, one line each (a TorchScript archive:
    its code, and who runs it); raw text from the file, escaped where printed."""

    def __post_init__(self) -> None:
        # Two tensors under one name would let every later stage keep one of them silently: the
        # readers refuse this with the detail; this is the backstop for every way of building one.
        seen: set[str] = set()
        for name in [t.name for t in self.tensors] + [u.name for u in self.unread]:
            if name in seen:
                message = f"two tensors are named {quoted(name)}; tieaudit does not choose one"
                raise InputError(message, self.path)
            seen.add(name)

    @cached_property
    def _by_name(self) -> dict[str, TensorInfo]:
        # cached_property writes the instance __dict__ directly, which a frozen dataclass allows.
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> TensorInfo:
        """The tensor stored under name (KeyError when absent)."""
        return self._by_name[name]

    @property
    def skipped_total(self) -> int:
        """Every non-tensor entry the reader saw, kept or only counted."""
        return len(self.skipped) + self.skipped_more

    @cached_property
    def names(self) -> frozenset[str]:
        """Every stored tensor name (built once: callers ask per name)."""
        return frozenset(self._by_name)
