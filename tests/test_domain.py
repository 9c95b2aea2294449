"""The small domain functions, each alone, on hand-made inputs (no reader, no producer).

A checkpoint here is built from numpy arrays held in memory (``ByteStore.hold``), so every view,
offset and byte is chosen by the test: a disjoint slice of a fused matrix, a transposed view, a
three-member copy group, NaN payloads and signed zeros.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tieaudit.core.bytestore import ByteStore, OpenCheckpoint
from tieaudit.core.records import Checkpoint, DeclaredTie, ModelConfig, StorageInfo, TensorInfo
from tieaudit.graph.alias import build_graph, relate
from tieaudit.graph.compare import BlockComparer, is_constant, sample_positions
from tieaudit.graph.detect import find_copies, keep_rank
from tieaudit.rules.expected import expected_findings
from tieaudit.rules.finding import Audited
from tieaudit.rules.policy import Policy
from tieaudit.rules.vocab import vocab_findings

DTYPE = {"float32": np.float32, "float16": np.float16, "int64": np.int64}


def view(
    name: str, storage: str, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0
):
    """A TensorInfo with byte offset given in elements of dtype (like torch's storage_offset)."""
    size = np.dtype(DTYPE[dtype]).itemsize
    return TensorInfo(
        name=name,
        dtype=dtype,
        shape=shape,
        strides=strides,
        storage_id=storage,
        byte_offset=offset * size,
        file="mem",
    )


def dense(name: str, storage: str, dtype: str, shape: tuple[int, ...]) -> TensorInfo:
    strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    return view(name, storage, dtype, shape, strides)


def opened(
    storages: dict[str, np.ndarray],
    tensors: list[TensorInfo],
    *,
    ties: tuple[DeclaredTie, ...] = (),
    config: ModelConfig | None = None,
) -> OpenCheckpoint:
    """An OpenCheckpoint whose storages are the given arrays' bytes, held in memory."""
    store = ByteStore("/nonexistent")
    infos = {}
    for storage_id, array in storages.items():
        data = np.ascontiguousarray(array).tobytes()
        store.hold(storage_id, data)
        infos[storage_id] = StorageInfo(
            storage_id=storage_id, file="mem", file_offset=-1, nbytes=len(data), dtype=str(array.dtype)
        )
    checkpoint = Checkpoint(
        path="mem.pt",
        format="torch",
        tensors=tuple(tensors),
        storages=infos,
        declared_ties=ties,
        config=config,
    )
    return OpenCheckpoint(checkpoint, store)


# relate: how two views of one storage relate ---------------------------------------------------


def test_relate_identical_views() -> None:
    a = dense("a", "s", "float32", (4, 3))
    assert relate(a, dense("b", "s", "float32", (4, 3))) == "identical"


def test_relate_transposed_view() -> None:
    a = view("a", "s", "float32", (4, 3), (3, 1))
    assert relate(a, view("t", "s", "float32", (3, 4), (1, 3))) == "transposed"


def test_relate_disjoint_slices_of_a_fused_matrix() -> None:
    q = view("q", "s", "float32", (2, 4), (4, 1), offset=0)
    k = view("k", "s", "float32", (2, 4), (4, 1), offset=8)
    assert relate(q, k) == "disjoint" and relate(k, q) == "disjoint"


def test_relate_adjacent_views_touch_without_overlapping() -> None:
    first = view("a", "s", "float32", (4,), (1,), offset=0)
    second = view("b", "s", "float32", (4,), (1,), offset=4)  # starts where a ends
    assert relate(first, second) == "disjoint"


def test_relate_partial_overlap() -> None:
    first = view("a", "s", "float32", (4,), (1,), offset=0)
    second = view("b", "s", "float32", (4,), (1,), offset=2)
    assert relate(first, second) == "overlapping"


def test_relate_same_start_other_dtype_is_not_identical() -> None:
    first = view("a", "s", "float32", (4,), (1,))
    second = TensorInfo(
        name="b", dtype="float16", shape=(8,), strides=(1,), storage_id="s", byte_offset=0, file="mem"
    )
    assert relate(first, second) == "overlapping"


def test_relate_empty_view_touches_nothing() -> None:
    first = view("a", "s", "float32", (4,), (1,))
    empty = view("e", "s", "float32", (0,), (1,), offset=1)
    assert relate(first, empty) == "disjoint"


# build_graph ------------------------------------------------------------------------------------


def test_build_graph_groups_names_by_storage_and_places_declared_ties() -> None:
    tensors = [
        dense("wte", "s0", "float32", (4, 3)),
        dense("lm_head", "s0", "float32", (4, 3)),
        view("q", "s1", "float32", (2, 2), (2, 1), offset=0),
        view("k", "s1", "float32", (2, 2), (2, 1), offset=4),
        dense("alone", "s2", "float32", (3,)),
    ]
    ties = (
        DeclaredTie(dropped="lm_head", kept="wte", declared_by="config", where="config.json"),
        DeclaredTie(dropped="head2", kept="alone", declared_by="config", where="config.json"),
    )
    arrays = {"s0": np.zeros(12, np.float32), "s1": np.zeros(8, np.float32), "s2": np.zeros(3, np.float32)}
    graph = build_graph(opened(arrays, tensors, ties=ties).checkpoint)
    by_storage = {g.storage_id: g for g in graph.groups}
    assert set(by_storage) == {"s0", "s1"}  # s2 has one name: no group
    assert by_storage["s0"].relation == "identical" and by_storage["s0"].names == ("wte", "lm_head")
    assert by_storage["s1"].relation == "disjoint" and by_storage["s1"].pairs == ()
    assert by_storage["s0"].nbytes == 48
    shared, orphan = graph.ties
    assert (shared.dropped_stored, shared.kept_stored, shared.shared_storage) == (True, True, True)
    assert (orphan.dropped_stored, orphan.kept_stored, orphan.shared_storage) == (False, True, False)
    assert graph.stored_bytes == 48 + 32 + 12


def test_build_graph_labels_a_mixed_group_by_its_most_significant_relation() -> None:
    tensors = [
        view("w", "s", "float32", (2, 3), (3, 1)),
        view("w_same", "s", "float32", (2, 3), (3, 1)),
        view("w_t", "s", "float32", (3, 2), (1, 3)),
        view("tail", "s", "float32", (3,), (1,), offset=4),
    ]
    graph = build_graph(opened({"s": np.zeros(8, np.float32)}, tensors).checkpoint)
    (group,) = graph.groups
    assert group.relation == "overlapping"
    relations = {(p.first, p.second): p.relation for p in group.pairs}
    assert relations[("w", "w_same")] == "identical"
    assert relations[("w", "w_t")] == "transposed"
    assert "overlapping" in relations.values()


# BlockComparer: byte equality, not value equality ----------------------------------------------


def test_block_comparer_is_byte_equality() -> None:
    comparer = BlockComparer()
    zeros = np.zeros(4, np.float32)
    negative = zeros.copy()
    negative[2] = -0.0
    assert comparer.same(zeros, zeros.copy())
    assert not comparer.same(zeros, negative)  # +0.0 == -0.0 in value, not in bytes


def test_block_comparer_nan_payloads_must_match() -> None:
    comparer = BlockComparer()
    quiet = np.array([np.nan, 1.0], np.float32)
    payload = quiet.copy()
    payload.view(np.uint32)[0] = 0x7FC00001  # another NaN
    assert math.isnan(float(payload[0]))
    assert comparer.same(quiet, quiet.copy())
    assert not comparer.same(quiet, payload)


def test_block_comparer_strided_blocks_and_shape_mismatch() -> None:
    comparer = BlockComparer()
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert comparer.same(matrix.T, np.ascontiguousarray(matrix.T))  # through the copy buffers
    assert not comparer.same(matrix, matrix.reshape(4, 3))
    assert not comparer.same(matrix, matrix.astype(np.float64))  # item size differs
    assert comparer.same(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))


# is_constant -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (np.ones(6, np.float32), True),
        (np.zeros((2, 3), np.float32), True),
        (np.array([0.0, -0.0, 0.0], np.float32), False),  # equal values, different bytes
        (np.array([1.0, 1.0, 2.0], np.float32), False),
        (np.full(3, np.nan, np.float32), True),  # one NaN payload throughout
    ],
)
def test_is_constant(values: np.ndarray, expected: bool) -> None:
    tensor = dense("t", "s", "float32", values.shape)
    with opened({"s": values}, [tensor]) as ckpt:
        assert is_constant(ckpt, tensor) is expected


def test_is_constant_reads_only_the_view() -> None:
    storage = np.array([1, 1, 1, 2], np.float32)
    head = view("head", "s", "float32", (3,), (1,))
    strided = view("odd", "s", "float32", (2,), (3,))  # elements 0 and 3
    with opened({"s": storage}, [head, strided]) as ckpt:
        assert is_constant(ckpt, head)
        assert not is_constant(ckpt, strided)


def test_is_constant_of_an_empty_tensor() -> None:
    tensor = dense("e", "s", "float32", (0, 4))
    with opened({"s": np.zeros(0, np.float32)}, [tensor]) as ckpt:
        assert is_constant(ckpt, tensor)


# sample_positions --------------------------------------------------------------------------------


def test_sample_positions_are_deterministic_in_range_and_unique() -> None:
    shape = (7, 5, 3)
    first = sample_positions(shape)
    assert len(first) == 3
    for axis, size in zip(first, shape, strict=True):
        assert ((axis >= 0) & (axis < size)).all()
    flat = np.ravel_multi_index(first, shape)
    assert len(set(flat.tolist())) == len(flat)
    assert all((a == b).all() for a, b in zip(first, sample_positions(shape), strict=True))


def test_sample_positions_of_small_and_scalar_shapes() -> None:
    (only,) = sample_positions((3,))
    assert sorted(only.tolist()) == [0, 1, 2]  # fewer elements than samples: each once
    assert sample_positions(()) == ()
    (single,) = sample_positions((1,))
    assert single.tolist() == [0]


# keep_rank ---------------------------------------------------------------------------------------


def test_keep_rank_prefers_width_then_declared_source_then_lookup_then_order() -> None:
    wide = dense("x.lm_head", "a", "float32", (4, 4))
    narrow_embedding = dense("model.embed_tokens", "b", "float16", (4, 4))
    assert keep_rank(wide, 5, frozenset()) < keep_rank(narrow_embedding, 0, frozenset())
    head = dense("lm_head", "a", "float32", (4, 4))
    emb = dense("model.embed_tokens", "b", "float32", (4, 4))
    gathered = dense("onnx::MatMul_7", "c", "float32", (4, 4))
    assert keep_rank(emb, 1, frozenset()) < keep_rank(head, 0, frozenset())  # embedding-like name
    assert keep_rank(gathered, 2, frozenset({"onnx::MatMul_7"})) < keep_rank(head, 0, frozenset())
    assert keep_rank(head, 3, frozenset(), sources=frozenset({"lm_head"})) < keep_rank(emb, 0, frozenset())
    assert keep_rank(head, 0, frozenset()) < keep_rank(dense("other", "d", "float32", (4, 4)), 1, frozenset())


def test_a_three_member_copy_group_keeps_one_and_counts_each_copy_once() -> None:
    values = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    tensors = [
        dense("lm_head.weight", "a", "float32", (64, 8)),
        dense("model.embed_tokens.weight", "b", "float32", (64, 8)),
        dense("extra_head.weight", "c", "float32", (64, 8)),
        dense("other.weight", "d", "float32", (64, 8)),
    ]
    storages = {"a": values, "b": values.copy(), "c": values.copy(), "d": values + 1}
    with opened(storages, tensors) as ckpt:
        (group,) = find_copies(ckpt, min_bytes=0)
    assert group.kept == "model.embed_tokens.weight"
    assert sorted(m.name for m in group.members) == ["extra_head.weight", "lm_head.weight"]
    assert {m.relation for m in group.members} == {"equal"}
    assert group.wasted_bytes == 2 * values.nbytes


# vocab_findings (TIE004) -------------------------------------------------------------------------


def _audited(ckpt: OpenCheckpoint, policy: Policy | None = None) -> Audited:
    return Audited(
        graph=build_graph(ckpt.checkpoint, (policy or Policy()).expected_ties),
        opened=ckpt,
        policy=policy or Policy(),
        copies=(),
    )


def test_vocab_findings_flags_rows_that_disagree_with_the_config() -> None:
    tensors = [
        dense("model.embed_tokens.weight", "a", "float32", (10, 4)),
        dense("lm_head.weight", "b", "float32", (12, 4)),
    ]
    config = ModelConfig(vocab_size=10)
    with opened(
        {"a": np.zeros((10, 4), np.float32), "b": np.zeros((12, 4), np.float32)}, tensors, config=config
    ) as ckpt:
        (finding,) = vocab_findings(_audited(ckpt))
    assert finding.rule == "TIE004" and finding.severity == "error"
    assert finding.names == ("model.embed_tokens.weight", "lm_head.weight")
    assert finding.details["sizes"] == {
        "embedding rows (model.embed_tokens.weight)": 10,
        "output rows (lm_head.weight)": 12,
        "config vocab_size (config.json)": 10,
    }


def test_vocab_findings_quiet_when_sizes_agree_and_for_a_transposed_head_view() -> None:
    embedding = view("model.embed_tokens.weight", "a", "float32", (10, 4), (4, 1))
    head_t = view("lm_head.weight", "a", "float32", (4, 10), (1, 4))  # the embedding's .t()
    with opened(
        {"a": np.zeros(40, np.float32)}, [embedding, head_t], config=ModelConfig(vocab_size=10)
    ) as ckpt:
        assert list(vocab_findings(_audited(ckpt))) == []


def test_vocab_findings_tokenizer_larger_than_the_embedding() -> None:
    tensors = [dense("model.embed_tokens.weight", "a", "float32", (10, 4))]
    config = ModelConfig(vocab_size=10, tokenizer_vocab_size=11)
    with opened({"a": np.zeros((10, 4), np.float32)}, tensors, config=config) as ckpt:
        (finding,) = vocab_findings(_audited(ckpt))
    assert "the tokenizer has 11 tokens but the embedding has 10 rows" in finding.message


def test_vocab_findings_ignore_a_block_output_projection() -> None:
    tensors = [
        dense("model.embed_tokens.weight", "a", "float32", (10, 4)),
        dense("rwkv.blocks.0.attention.output.weight", "b", "float32", (4, 4)),
    ]
    storages = {"a": np.zeros((10, 4), np.float32), "b": np.zeros((4, 4), np.float32)}
    with opened(storages, tensors) as ckpt:
        assert list(vocab_findings(_audited(ckpt))) == []


# expected_findings (TIE008) ----------------------------------------------------------------------


def _policy(*pairs: tuple[str, str]) -> Policy:
    return Policy(
        expected_ties=tuple(
            DeclaredTie(dropped=d, kept=k, declared_by="policy", where="tieaudit.toml") for d, k in pairs
        )
    )


def test_expected_findings_accepts_one_storage_and_a_declared_loader_restored_tie() -> None:
    shared = [dense("wte", "s", "float32", (4, 4)), dense("lm_head", "s", "float32", (4, 4))]
    with opened({"s": np.zeros(16, np.float32)}, shared) as ckpt:
        assert list(expected_findings(_audited(ckpt, _policy(("lm_head", "wte"))))) == []
    declared = (DeclaredTie(dropped="lm_head", kept="wte", declared_by="metadata", where="__metadata__"),)
    only_kept = [dense("wte", "s", "float32", (4, 4))]
    with opened({"s": np.zeros(16, np.float32)}, only_kept, ties=declared) as ckpt:
        assert list(expected_findings(_audited(ckpt, _policy(("lm_head", "wte"))))) == []


@pytest.mark.parametrize(
    ("stored", "because"),
    [
        (("wte", "lm_head"), "both are stored in separate storage"),
        (("lm_head",), "wte is not stored"),
        (("wte",), "lm_head is not stored and nothing in the files declares it tied"),
    ],
)
def test_expected_findings_says_why_the_tie_is_missing(stored: tuple[str, ...], because: str) -> None:
    tensors = [dense(name, f"s{i}", "float32", (4, 4)) for i, name in enumerate(stored)]
    storages = {f"s{i}": np.zeros(16, np.float32) for i in range(len(stored))}
    with opened(storages, tensors) as ckpt:
        (finding,) = expected_findings(_audited(ckpt, _policy(("lm_head", "wte"))))
    assert finding.rule == "TIE008" and finding.names == ("lm_head", "wte")
    assert because in finding.message
    assert (finding.fix is not None) == (len(stored) == 2)


# records hold no open file ---------------------------------------------------------------------


def test_an_audit_holds_metadata_only_and_pickles(tmp_path: Path) -> None:
    import pickle

    from safetensors.numpy import save_file

    from tieaudit.audit import audit_path

    values = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    path = tmp_path / "m.safetensors"
    save_file({"model.embed_tokens.weight": values, "lm_head.weight": values.copy()}, str(path))
    audit = audit_path(str(path))
    assert not any(isinstance(v, (ByteStore, OpenCheckpoint)) for v in vars(audit.graph.checkpoint).values())
    again = pickle.loads(pickle.dumps(audit))
    assert again.findings == audit.findings and again.summary() == audit.summary()
    assert again.graph.checkpoint.tensors == audit.graph.checkpoint.tensors


def test_same_transposed_compares_bits_in_tiles_including_ragged_edges() -> None:
    """Shapes that are not multiples of the tile, every item size, and a difference in the last
    ragged tile, in the first, and one that is only a sign of zero or a NaN payload."""
    from tieaudit.graph.compare import TILE

    comparer = BlockComparer()
    rng = np.random.default_rng(0)
    for dtype in (np.uint8, np.float16, np.float32, np.float64, np.complex128):
        block = rng.standard_normal((TILE + 37, 2 * TILE + 5)).astype(dtype)
        strip = np.ascontiguousarray(block.T)
        assert comparer.same_transposed(block, strip)
        assert comparer.same_transposed(block, block.T)  # a strided strip (a view of the map)
        for row, column in ((0, 0), (TILE + 36, 2 * TILE + 4), (TILE, 3)):
            changed = strip.copy()
            changed.view(np.uint8).reshape(changed.shape[0], -1)[column, row * changed.itemsize] ^= 1
            assert not comparer.same_transposed(block, changed), (dtype, row, column)
    zeros = np.zeros((3, 300), np.float32)
    negative = zeros.T.copy()
    negative[299, 2] = -0.0
    assert not comparer.same_transposed(zeros, negative)
    quiet = np.full((2, 2), np.nan, np.float32)
    payload = quiet.copy()
    payload.view(np.uint32)[1, 0] = 0x7FC00001
    assert not comparer.same_transposed(quiet, payload)
    assert not comparer.same_transposed(zeros, zeros)  # (3, 300) is not (300, 3)


def test_same_transposed_splits_a_large_block_between_two_threads() -> None:
    """Past SPLIT_BYTES the lower rows go to a second thread: a difference in either half, or on
    the rows where they meet, is found."""
    from tieaudit.graph.compare import SPLIT_BYTES, TILE

    comparer = BlockComparer()
    block = np.random.default_rng(1).standard_normal((4 * TILE + 77, 1100)).astype(np.float32)
    assert block.nbytes >= SPLIT_BYTES
    strip = np.ascontiguousarray(block.T)
    assert comparer.same_transposed(block, strip)
    half = len(block) // 2 // TILE * TILE
    for row in (0, half - 1, half, len(block) - 1):
        changed = strip.copy()
        changed.view(np.uint32)[500, row] ^= 1
        assert not comparer.same_transposed(block, changed), row
