"""Declared ties stored as equal copies that the copy search did not group (below its size
threshold, or constant): one copy group per set of names the declared ties connect.

A declared tie is a pair, but a class may tie three or more names together through several pairs
(Udop's relative-position bias: the encoder's first block, the encoder's and the decoder's bias
modules); the pairs stored apart with equal bytes are merged, so that the gate reports one TIE001
per group and retie keeps one name of it. The kept name is a declared source that no tie of the
group names as a target (the name the model class loads), else the first name.
"""

from __future__ import annotations

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.components import Components
from tieaudit.graph.alias import AliasGraph
from tieaudit.graph.compare import BlockComparer, equal_bytes
from tieaudit.graph.detect import CopyGroup, CopyMember, settle


def declared_copy_groups(
    graph: AliasGraph, opened: OpenCheckpoint, covered: frozenset[str]
) -> list[CopyGroup]:
    """Equal-byte declared pairs stored in separate storage, none of whose names is covered (already
    in a group the search found), merged into connected groups, settled by storage (``settle``)."""
    ckpt = graph.checkpoint
    comparer = BlockComparer()
    joined = Components()
    sources: set[str] = set()
    targets: set[str] = set()
    for state in graph.ties:
        tie = state.tie
        if not (state.dropped_stored and state.kept_stored) or state.shared_storage:
            continue
        if tie.dropped in covered or tie.kept in covered or joined.same(tie.dropped, tie.kept):
            continue  # a copy group already, or joined through other pairs, whose bytes were equal
        if equal_bytes(opened, ckpt.tensor(tie.kept), ckpt.tensor(tie.dropped), comparer=comparer):
            joined.join(tie.dropped, tie.kept)
            sources.add(tie.kept)
            targets.add(tie.dropped)
    groups = []
    for names in joined.groups():
        if len(names) < 2:
            continue
        ordered = sorted(names)
        roots = [n for n in ordered if n in sources and n not in targets]
        kept = (roots or [n for n in ordered if n in sources] or ordered)[0]
        groups.append(
            CopyGroup(
                kept,
                tuple(
                    CopyMember(name=n, relation="equal", transposed=False, nbytes=ckpt.tensor(n).nbytes)
                    for n in ordered
                    if n != kept
                ),
                0,
            )
        )
    return settle(ckpt, sorted(groups, key=lambda g: g.names))
