"""Which model parameter each optimizer state belongs to, from the records alone (no torch).

torch names a parameter in ``Optimizer.state_dict()`` by its position in the concatenation of the
param groups; the parameters themselves are not in the file. What can be relied on, measured on
torch 2.13 and transformers 5.24 (tests/test_optimizer_map.py):

- ``param_names`` (torch >= 2.6, optimizer built from ``named_parameters()``), a name-keyed state
  dict (``torch.distributed.checkpoint``, FSDP) or DeepSpeed's ``param_shapes``: exact.
- Otherwise, by order, only where the file keeps the model's ``state_dict()`` order (a torch
  pickle): ``parameters()`` is that order with buffers and tied duplicates (an identical view of
  an earlier name's storage) removed. Buffers are not marked in a state dict, so non-float tensors
  are dropped and every other candidate is placed by shape: each element-wise state (``exp_avg``,
  ``momentum_buffer``, ...) has its parameter's shape. The groups' concatenation is fitted into
  the candidates as a subsequence; the mapping is taken only when exactly one fit exists. Groups
  that interleave (transformers' Trainer: weights with decay, then biases and norms) are fitted
  group by group when every candidate is a parameter and each step leaves one choice.
- A safetensors model (a Trainer folder's model.safetensors) is stored sorted by name: only
  states whose shape no other parameter has are mapped.

A mapping that is not unique is reported as such, never guessed.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tieaudit.core.dtypes import FLOATS
from tieaudit.core.records import Checkpoint
from tieaudit.core.training import OptimizerRecord, ParamKey, TrainingLayout

Method = Literal["names", "order", "shape", "none"]
Shape = tuple[int, ...]
MAX_ORDER_CELLS = 1_000_000
"""Cells of the table fitting states to parameters by order, (states + 1) x (float buffers + 1): a
100 000-parameter model with 8 float buffers fits, as does a 10 000-parameter one with 98; the
table costs about 2.5 s of Python at the limit, so past it the order is not fitted."""
_PARAM_DTYPES = FLOATS | {"complex64", "complex128"}


@dataclass(frozen=True, kw_only=True)
class ModelParam:
    """A tensor of the model part that can be a parameter: one per storage view."""

    names: tuple[str, ...]
    """Stored names: the first, then identical views of its bytes (tied names, one parameter)."""
    shape: Shape
    """Its shape."""


@dataclass(frozen=True, kw_only=True)
class OptimizerMap:
    """One optimizer's states matched to the model's parameter candidates."""

    optimizer: OptimizerRecord
    """The optimizer state dict."""
    params: tuple[ModelParam, ...]
    """The model's candidates, in ``parameters()`` order when the file keeps it."""
    method: Method
    """How keys were matched: names, order, shape (unique shapes only) or none."""
    owner: Mapping[ParamKey, int] = field(default_factory=dict)
    """Parameter key -> index into params, for every key matched."""
    problem: str = ""
    """Why some keys are not matched (empty when all are)."""

    def shape_of(self, key: ParamKey) -> Shape | None:
        """The shape a key's element-wise state has (None: no such state)."""
        return self._shapes.get(key)

    @functools.cached_property
    def _shapes(self) -> dict[ParamKey, Shape | None]:
        """Each key's first element-wise state's shape: looked up once per key by the rules, so a
        scan of the slots per lookup was quadratic (18 s for 25 000 parameters with Adam state)."""
        shapes: dict[ParamKey, Shape | None] = {}
        for slot in self.optimizer.slots:
            shapes.setdefault(slot.key, slot.shape)
        return shapes


def model_params(ckpt: Checkpoint, layout: TrainingLayout) -> tuple[ModelParam, ...]:
    """The model part's tensors that can be parameters, identical views merged, in stored order."""
    views: dict[tuple[str, int, Shape, tuple[int, ...]], list[str]] = {}
    for name in layout.model_names:
        tensor = ckpt.tensor(name)
        if tensor.dtype not in _PARAM_DTYPES or name in layout.buffers:
            continue
        view = (tensor.storage_id, tensor.byte_offset, tensor.shape, tensor.strides)
        views.setdefault(view, []).append(name)
    return tuple(ModelParam(names=tuple(names), shape=view[2]) for view, names in views.items())


def _by_names(record: OptimizerRecord, layout: TrainingLayout, params: Sequence[ModelParam]) -> OptimizerMap:
    index = {name: i for i, p in enumerate(params) for name in p.names}
    owner: dict[ParamKey, int] = {}
    unknown: list[str] = []
    for group in record.groups:
        names = group.param_names or tuple(str(k) for k in group.params)
        for key, name in zip(group.params, names, strict=True):
            found = index.get(layout.stored_name(name))
            if found is None:
                unknown.append(name)
            else:
                owner[key] = found
    problem = (
        f"{len(unknown)} named parameters are not in the model part (e.g. {unknown[0]})" if unknown else ""
    )
    return OptimizerMap(optimizer=record, params=tuple(params), method="names", owner=owner, problem=problem)


def _fits(shape: Shape | None, param: ModelParam) -> bool:
    return shape is None or shape == param.shape


def fit_subsequence(wanted: Sequence[Shape | None], params: Sequence[ModelParam]) -> list[int] | None | str:
    """Indexes into params where wanted fits as a subsequence (None entries fit anything) when
    exactly one fit exists; None when none does; ``"ambiguous"`` or ``"too large"`` otherwise."""
    m, skips = len(wanted), len(params) - len(wanted)
    if skips < 0:
        return None
    if (m + 1) * (skips + 1) > MAX_ORDER_CELLS:
        return "too large"
    # ways[j][s]: fits of wanted[j:] into params[j + s:], counted up to 2 (two means "several").
    ways = [bytearray(skips + 1) for _ in range(m + 1)]
    ways[m] = bytearray([1] * (skips + 1))
    for j in range(m - 1, -1, -1):
        row, below = ways[j], ways[j + 1]
        for s in range(skips, -1, -1):
            count = below[s] if _fits(wanted[j], params[j + s]) else 0
            if s < skips:
                count += row[s + 1]
            row[s] = min(count, 2)
    if ways[0][0] == 0:
        return None
    if ways[0][0] > 1:
        return "ambiguous"
    chosen, s = [], 0
    for j in range(m):
        while not (_fits(wanted[j], params[j + s]) and ways[j + 1][s]):
            s += 1
        chosen.append(j + s)
    return chosen


def fit_groups(
    groups: Sequence[Sequence[Shape | None]], params: Sequence[ModelParam]
) -> list[list[int]] | None:
    """Each group's indexes when the groups interleave into all of params in exactly one forced way
    (at every parameter exactly one group's next state fits); None otherwise."""
    if sum(len(g) for g in groups) != len(params):
        return None
    taken: list[list[int]] = [[] for _ in groups]
    for i, param in enumerate(params):
        nexts = [(g, group[len(taken[g])]) for g, group in enumerate(groups) if len(taken[g]) < len(group)]
        choices = [g for g, wanted in nexts if wanted is not None and _fits(wanted, param)]
        if len(choices) != 1:
            return None
        taken[choices[0]].append(i)
    return taken


def _by_order(
    record: OptimizerRecord, params: Sequence[ModelParam], shape: dict[ParamKey, Shape | None]
) -> OptimizerMap:
    keys = record.keys
    base = OptimizerMap(optimizer=record, params=tuple(params), method="none")
    if len(keys) > len(params):
        return _with(base, f"the optimizer lists {len(keys)} parameters, the model part has {len(params)}")
    fitted = fit_subsequence([shape.get(k) for k in keys], params)
    if isinstance(fitted, list):
        owner = dict(zip(keys, fitted, strict=True))
        return OptimizerMap(optimizer=record, params=tuple(params), method="order", owner=owner)
    if len(record.groups) > 1:
        groups = fit_groups([[shape.get(k) for k in g.params] for g in record.groups], params)
        if groups is not None:
            pairs = (zip(g.params, idx, strict=True) for g, idx in zip(record.groups, groups, strict=True))
            owner = {k: i for pair in pairs for k, i in pair}
            return OptimizerMap(optimizer=record, params=tuple(params), method="order", owner=owner)
    if fitted == "ambiguous":
        return _with(base, "several orders of the model's tensors fit the states (buffers or frozen "
                     "parameters cannot be told apart from the file)")  # fmt: skip
    if fitted == "too large":
        return _with(base, f"too many candidates to fit by order (MAX_ORDER_CELLS = {MAX_ORDER_CELLS})")
    return _with(base, "no order of the model's tensors fits the optimizer's states")


def _by_shape(
    record: OptimizerRecord, params: Sequence[ModelParam], shape: dict[ParamKey, Shape | None]
) -> OptimizerMap:
    counts = Counter(p.shape for p in params)
    state_counts = Counter(s for s in shape.values() if s is not None)
    index = {p.shape: i for i, p in enumerate(params)}
    owner = {
        k: index[s] for k, s in shape.items() if s is not None and counts[s] == 1 and state_counts[s] == 1
    }
    missing = len(record.keys) - len(owner)
    problem = (
        f"the stored order is not the model's, so {missing} of {len(record.keys)} states are matched only "
        "where their shape is the parameter's alone"
        if missing
        else ""
    )
    return OptimizerMap(optimizer=record, params=tuple(params), method="shape", owner=owner, problem=problem)


def _with(base: OptimizerMap, problem: str) -> OptimizerMap:
    return OptimizerMap(optimizer=base.optimizer, params=base.params, method=base.method, problem=problem)


def map_optimizer(ckpt: Checkpoint, layout: TrainingLayout, record: OptimizerRecord) -> OptimizerMap:
    """Match one optimizer's keys to the model part's parameters (see the module docstring)."""
    params = model_params(ckpt, layout)
    named = all(g.param_names is not None or all(isinstance(k, str) for k in g.params) for g in record.groups)
    if named and record.groups:
        return _by_names(record, layout, params)
    shape = dict.fromkeys(record.keys) | {s.key: s.shape for s in record.slots}
    if layout.ordered:
        return _by_order(record, params, shape)
    return _by_shape(record, params, shape)


def optimizer_maps(ckpt: Checkpoint) -> tuple[OptimizerMap, ...]:
    """Every optimizer of a training checkpoint with a recognised model part, matched (else none)."""
    layout = ckpt.training
    if layout is None or layout.model_prefix is None or not layout.model_names:
        return ()
    return tuple(map_optimizer(ckpt, layout, record) for record in layout.optimizers)
