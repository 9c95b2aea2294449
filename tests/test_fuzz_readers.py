"""Mutation fuzzing of every reader, bounded: real small files (the generated corpus, hand-built
valid files, the hostile corpus) go through byte edits (flips, truncations, insertions) and
structured ones (safetensors header JSON edits, pickle opcode edits, zip member edits, ONNX
initializer and node edits, config and index edits in model folders).

The contract (fuzz/harness.py): only TieauditError subclasses escape a reader, and the
OpenCheckpoint it returns has every tensor inside its storage, viewable with ``opened.array``.
``make fuzz`` runs the same mutators for as long as asked.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import Corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fuzz import harness  # noqa: E402

EXAMPLES = 200
SLOW_SEEDS = ("pt_zip_shared_fanout.pt", "pt_zip_deep_nesting.pt")
"""Hostile seeds that take seconds each by design (a million visits, a 100000-deep pickle)."""


@pytest.fixture(scope="module")
def seed_files(corpus: Corpus) -> dict[str, list[bytes]]:
    found = harness.seeds(corpus.root)
    slow = {(harness.HOSTILE / name).read_bytes() for name in SLOW_SEEDS if (harness.HOSTILE / name).exists()}
    for kind, extra in harness.hostile_seeds().items():
        found[kind].extend(data for data in extra if data not in slow)
    return found


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("fuzz")


@pytest.mark.parametrize("kind", harness.KINDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), data=st.data())
def test_reader_survives_mutations(
    kind: str, seed_files: dict[str, list[bytes]], scratch: Path, rng: random.Random, data: st.DataObject
) -> None:
    seed = data.draw(st.sampled_from(seed_files[kind]), label="seed")
    mutated = harness.mutate(kind, seed, rng, rounds=data.draw(st.integers(1, 4), label="rounds"))
    outcome = harness.run_one(kind, mutated, scratch, seconds=10.0)
    assert outcome.label in ("accepted", "rejected", "blocked-exec")


@pytest.mark.parametrize("kind", harness.KINDS)
def test_unmutated_seeds_are_accepted(kind: str, corpus: Corpus, scratch: Path) -> None:
    """The valid seeds read cleanly, so mutations start from inputs that reach deep into each reader."""
    valid = harness.seeds(corpus.root)[kind]
    assert len(valid) >= 1
    assert [harness.run_one(kind, seed, scratch).label for seed in valid] == ["accepted"] * len(valid)


def test_hostile_seeds_are_refused_and_exec_attempts_counted(scratch: Path) -> None:
    slow = {(harness.HOSTILE / name).read_bytes() for name in SLOW_SEEDS if (harness.HOSTILE / name).exists()}
    labels = [
        harness.run_one(kind, data, scratch).label
        for kind, files in harness.hostile_seeds().items()
        for data in files
        if data not in slow
    ]
    assert "accepted" not in labels
    assert labels.count("blocked-exec") >= 10


def test_the_contract_check_catches_a_view_outside_its_storage(scratch: Path) -> None:
    """The invariant check itself: a tensor reaching past its storage is a crash, not a pass."""
    import dataclasses

    from tieaudit.core.bytestore import OpenCheckpoint
    from tieaudit.formats.safetensors import SafetensorsReader

    path = harness.materialize("safetensors", harness.mh.valid_safetensors(), scratch)
    with SafetensorsReader().read(str(path)) as opened:
        first = opened.checkpoint.tensors[0]
        records = dataclasses.replace(opened.checkpoint, tensors=(dataclasses.replace(first, byte_offset=4),))
        broken = OpenCheckpoint(records, opened.store)
        with pytest.raises(harness.Crash, match="spans bytes"):
            harness.check_checkpoint(broken)
        assert np.array_equal(opened.array(first).reshape(-1)[:4], [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("spelled", "primitive"),
    [
        ("posix.system", True),
        ("builtins.eval", True),
        ("builtins.getattr", True),
        ("subprocess.check_call", True),
        ("torch._utils._rebuild_tensor_v2.__globals__", True),
        ("__main__.TinyModel", False),
        ("collections.defaultdict", False),
    ],
)
def test_execution_primitives_are_recognised(spelled: str, primitive: bool) -> None:
    assert harness.is_exec_primitive(spelled) is primitive


def test_time_limit_turns_a_hang_into_a_crash() -> None:
    with pytest.raises(harness.Hang), harness.time_limit(0.05):
        while True:
            pass
