"""Records of a training checkpoint's layout: which subtree is the model, which the optimizer state.

A reader fills these from the unpickled structure (``formats.training``) without reading bytes;
``graph.optimizer_map`` maps optimizer state to model parameters from them, and TIE007 checks the
result against the model's ties. Tensor names stay the stored dotted paths everywhere; these
records only say what each part is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ParamKey = int | str
"""How an optimizer state dict names a parameter: its position (torch's ``Optimizer.state_dict``)
or its fully qualified name (``torch.distributed.checkpoint``'s and FSDP's optimizer state dicts)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerGroup:
    """One entry of an optimizer state dict's ``param_groups``."""

    params: tuple[ParamKey, ...]
    """The group's parameters, as the state dict names them."""
    param_names: tuple[str, ...] | None = None
    """The group's ``param_names`` (torch >= 2.6, optimizer built from ``named_parameters()``), or
    names another record of the checkpoint gives for the group (DeepSpeed's ``param_shapes``)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerSlot:
    """The state one parameter has in an optimizer (``state[key]``)."""

    key: ParamKey
    """The parameter's key in ``state``."""
    tensors: Mapping[str, str]
    """State entry (``exp_avg``, ``exp_avg_sq``, ``step``, ...) -> stored tensor name."""
    shape: tuple[int, ...] | None = None
    """The parameter's shape as an element-wise state entry gives it (None: no such entry)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerRecord:
    """One optimizer state dict found in the checkpoint."""

    path: str
    """Its dotted path (``optimizer``, ``optimizer_states.0``; ``optimizer`` for a Trainer folder's
    optimizer.pt)."""
    groups: tuple[OptimizerGroup, ...]
    """``param_groups`` in order."""
    slots: tuple[OptimizerSlot, ...]
    """``state`` entries in stored order."""
    file: str = ""
    """The file holding it, relative to the checkpoint's folder."""

    @property
    def keys(self) -> tuple[ParamKey, ...]:
        """Every parameter of every group, in order (ids are positions in this sequence)."""
        return tuple(key for group in self.groups for key in group.params)


@dataclass(frozen=True, kw_only=True)
class TrainingPart:
    """One recognised part of a training checkpoint, for the report."""

    path: str
    """Dotted path of the subtree, or the file of a Trainer folder."""
    role: str
    """model, optimizer, lr-scheduler, rng-state, training-args, trainer-state, ..."""
    status: str = "read"
    """``read``, or why it was not read (one line)."""


@dataclass(frozen=True, kw_only=True)
class TrainingLayout:
    """What a training checkpoint holds besides tensors: the model part and its optimizer states."""

    kind: str
    """Whose layout it is: ``model+optimizer dict``, ``checkpoint dict`` (a model key, no optimizer),
    ``lightning``, ``deepspeed``, ``trainer folder``, ``optimizer state``."""
    model_prefix: str | None
    """Dotted prefix of the model's state dict (``model``, ``state_dict``, ``module``; ``""`` when
    the model's names are stored unprefixed); None when no single model part is recognised."""
    model_names: tuple[str, ...] = ()
    """The model part's stored tensor names, in stored order."""
    ordered: bool = False
    """The stored order is the model's ``state_dict()`` order (a torch pickle; not safetensors,
    whose header is sorted)."""
    buffers: frozenset[str] = frozenset()
    """Model names the checkpoint itself records as buffers (DeepSpeed's ``buffer_names``)."""
    optimizers: tuple[OptimizerRecord, ...] = ()
    """Every optimizer state dict found."""
    parts: tuple[TrainingPart, ...] = ()
    """The recognised parts, for the report."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What could not be recognised (several model-like subtrees, ...), one line each."""

    def param_name(self, stored: str) -> str:
        """A stored model name as the model's own ``named_parameters()`` spells it."""
        prefix = f"{self.model_prefix}." if self.model_prefix else ""
        return stored[len(prefix) :] if prefix and stored.startswith(prefix) else stored

    def stored_name(self, param: str) -> str:
        """The stored name of a parameter name (the inverse of ``param_name``)."""
        return f"{self.model_prefix}.{param}" if self.model_prefix else param
