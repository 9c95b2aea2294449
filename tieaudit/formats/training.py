"""Training checkpoints in one torch file: which subtree is the model and which the optimizer state.

The layouts people save, recognised by their keys (the tensors keep their stored dotted names):

- a plain dict (PyTorch's tutorial, most training loops): ``{"model": state_dict, "optimizer":
  opt.state_dict(), "epoch": 3}``, or ``model_state_dict`` / ``optimizer_state_dict``;
- Lightning ``.ckpt``: ``state_dict`` (the LightningModule's), ``optimizer_states`` (a list),
  ``lr_schedulers``, ``hyper_parameters``, ``epoch``, ``global_step``, ...;
- DeepSpeed ``mp_rank_00_model_states.pt``: ``module``, ``buffer_names``, ``param_shapes`` (one
  name -> shape dict per optimizer group: DeepSpeed's own map from optimizer ids to names),
  ``optimizer`` (None under ZeRO, whose partitions live in other files), ``ds_version``;
- an optimizer state dict alone (a Trainer folder's ``optimizer.pt``), keyed by position (torch) or
  by parameter name (``torch.distributed.checkpoint``'s ``get_state_dict``, FSDP's
  ``optim_state_dict``: what an FSDP-consolidated checkpoint holds).

An optimizer state dict is any dict with a ``state`` dict and a ``param_groups`` list of dicts with
``params``, found up to MAX_OPTIMIZER_DEPTH levels down (DeepSpeed wraps one in its fp16 optimizer's
``optimizer_state_dict``). Pure data over the unpickled object: nothing is called.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set

from tieaudit.core.training import (
    OptimizerGroup,
    OptimizerRecord,
    OptimizerSlot,
    ParamKey,
    TrainingLayout,
    TrainingPart,
)
from tieaudit.formats.torch_records import TensorRecord, key_name

MODEL_KEYS = ("state_dict", "model", "module", "model_state_dict", "model_state", "net", "network")
"""Top-level keys holding the model's state dict, most specific first."""
SCHEDULER_KEYS = ("lr_schedulers", "lr_scheduler", "scheduler", "scheduler_state_dict")
"""Top-level keys holding learning-rate scheduler state."""
HYPER_KEYS = ("hyper_parameters", "hparams", "args", "config")
"""Top-level keys holding hyper-parameters or run arguments."""
ELEMENTWISE_STATE = frozenset(
    "exp_avg exp_avg_sq max_exp_avg_sq momentum_buffer square_avg grad_avg acc_delta sum exp_inf ax prev "
    "step_size".split()
)
"""State entries of torch's optimizers that have the parameter's shape (Adam/AdamW/NAdam/RAdam,
SGD, RMSprop, Adadelta, Adagrad, Adamax, ASGD, Rprop). Others (``step``, Adafactor's factored
rows) say nothing about it."""
MAX_OPTIMIZER_DEPTH = 3
"""Levels below the root searched for optimizer state dicts (DeepSpeed nests one at
``optimizer.optimizer_state_dict``)."""


def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key_name(key)}" if prefix else key_name(key)


def state_tensor_name(path: str, key: ParamKey, entry: str) -> str:
    """The stored name of one state entry of an optimizer at path (``optimizer.state.0.exp_avg``)."""
    return _join(_join(_join(path, "state"), key), entry)


def is_optimizer_state(value: object) -> bool:
    """Whether value has the shape of ``torch.optim.Optimizer.state_dict()``."""
    if not isinstance(value, dict):
        return False
    groups = value.get("param_groups")
    return (
        isinstance(value.get("state"), dict)
        and isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    )


def _children(value: object) -> Iterator[tuple[object, object]]:
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, (list, tuple)):
        yield from enumerate(value)


def find_optimizers(
    root: object, path: str = "", depth: int = 0
) -> Iterator[tuple[str, dict[object, object]]]:
    """(dotted path, optimizer state dict) for each one within MAX_OPTIMIZER_DEPTH of root."""
    if is_optimizer_state(root):
        assert isinstance(root, dict)
        yield path, root
        return
    if depth >= MAX_OPTIMIZER_DEPTH:
        return
    for key, item in _children(root):
        if isinstance(item, (dict, list, tuple)) and not _is_state_dict(item):
            yield from find_optimizers(item, _join(path, key), depth + 1)


def _is_state_dict(value: object) -> bool:
    """A dict whose values are tensors (a model's state dict): never searched for optimizers."""
    return isinstance(value, dict) and any(isinstance(v, TensorRecord) for v in value.values())


def _param_key(value: object) -> ParamKey | None:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def _slot(path: str, key: ParamKey, state: object, *, tensor_names: Set[str]) -> OptimizerSlot:
    tensors: dict[str, str] = {}
    shape: tuple[int, ...] | None = None
    for entry, value in state.items() if isinstance(state, dict) else ():
        name = state_tensor_name(path, key, key_name(entry))
        if isinstance(value, TensorRecord) and name in tensor_names:
            tensors[key_name(entry)] = name
            if shape is None and entry in ELEMENTWISE_STATE:
                shape = value.shape
    return OptimizerSlot(key=key, tensors=tensors, shape=shape)


def optimizer_record(
    path: str, value: dict[object, object], tensor_names: Set[str]
) -> OptimizerRecord | None:
    """The record of one optimizer state dict; None when a parameter key is neither int nor str."""
    groups: list[OptimizerGroup] = []
    param_groups, state_dict = value["param_groups"], value["state"]
    assert isinstance(param_groups, list) and isinstance(state_dict, dict)  # is_optimizer_state holds
    for group in param_groups:
        keys = [_param_key(p) for p in group["params"]]
        if any(k is None for k in keys):
            return None
        names = group.get("param_names")
        valid = isinstance(names, list) and len(names) == len(keys) and all(isinstance(n, str) for n in names)
        params = tuple(k for k in keys if k is not None)
        groups.append(OptimizerGroup(params=params, param_names=tuple(names) if valid else None))
    slots = []
    for key, state in state_dict.items():
        param = _param_key(key)
        if param is None:
            return None
        slots.append(_slot(path, param, state, tensor_names=tensor_names))
    return OptimizerRecord(path=path, groups=tuple(groups), slots=tuple(slots))


def _with_param_shapes(record: OptimizerRecord, param_shapes: object) -> OptimizerRecord:
    """DeepSpeed's ``param_shapes`` (one name -> shape dict per group) as the groups' names."""
    if not isinstance(param_shapes, list) or len(param_shapes) != len(record.groups):
        return record
    groups = []
    for group, shapes in zip(record.groups, param_shapes, strict=True):
        if not isinstance(shapes, dict) or len(shapes) != len(group.params) or group.param_names:
            return record
        names = tuple(name for name in shapes if isinstance(name, str))
        if len(names) != len(shapes):
            return record
        groups.append(OptimizerGroup(params=group.params, param_names=names))
    return OptimizerRecord(path=record.path, groups=tuple(groups), slots=record.slots, file=record.file)


def _kind(root: Mapping[object, object]) -> str:
    if "pytorch-lightning_version" in root or "optimizer_states" in root:
        return "lightning"
    if "module" in root and ("ds_version" in root or "buffer_names" in root):
        return "deepspeed"
    return "model+optimizer dict"


def _model_part(
    root: Mapping[object, object], tensor_names: Set[str]
) -> tuple[str | None, tuple[str, ...], list[str]]:
    """(prefix, stored names in order, notes): the top-level subtree that is the model's state dict."""
    candidates = [k for k, v in root.items() if isinstance(k, str) and _is_state_dict(v)]
    known = [k for k in MODEL_KEYS if k in candidates]
    notes: list[str] = []
    if known:
        prefix = known[0]
    elif len(candidates) == 1:
        prefix = candidates[0]
    else:
        if candidates:
            notes.append(
                f"several subtrees hold tensors ({', '.join(candidates[:5])}); none is taken as the model"
            )
        return None, (), notes
    value = root[prefix]
    assert isinstance(value, dict)
    stored = (_join(prefix, key) for key, item in value.items() if isinstance(item, TensorRecord))
    return prefix, tuple(name for name in stored if name in tensor_names), notes


def _parts(
    root: Mapping[object, object], model: str | None, optimizers: list[OptimizerRecord]
) -> list[TrainingPart]:
    parts = [TrainingPart(path=model, role="model")] if model is not None else []
    parts += [TrainingPart(path=o.path or "(root)", role="optimizer") for o in optimizers]
    for keys, role in ((SCHEDULER_KEYS, "lr-scheduler"), (HYPER_KEYS, "hyper-parameters")):
        parts += [TrainingPart(path=k, role=role) for k in keys if root.get(k) is not None]
    return parts


def training_layout(root: object, tensor_names: Set[str]) -> TrainingLayout | None:
    """The layout of a torch file's unpickled root; None when it is no training checkpoint (a bare
    state dict, a tensor, a dict with neither a known model key nor an optimizer)."""
    if not isinstance(root, dict):
        return None
    records: list[OptimizerRecord] = []
    notes: list[str] = []
    for path, value in find_optimizers(root):
        record = optimizer_record(path, value, tensor_names)
        if record is None:
            notes.append(f"{path or '(root)'}: a parameter key is neither an int nor a name; not read")
        else:
            records.append(record)
    if is_optimizer_state(root):
        parts = tuple(_parts(root, None, records))
        return TrainingLayout(
            kind="optimizer state",
            model_prefix=None,
            optimizers=tuple(records),
            parts=parts,
            notes=tuple(notes),
        )
    prefix, names, model_notes = _model_part(root, tensor_names)
    if not records and prefix not in MODEL_KEYS:
        return None
    kind = _kind(root) if records or _kind(root) != "model+optimizer dict" else "checkpoint dict"
    buffers: frozenset[str] = frozenset()
    if kind == "deepspeed":
        listed = root.get("buffer_names")
        if isinstance(listed, list):
            buffers = frozenset(_join("module", n) for n in listed if isinstance(n, str))
        records = [_with_param_shapes(r, root.get("param_shapes")) for r in records]
    return TrainingLayout(
        kind=kind,
        model_prefix=prefix,
        model_names=names,
        ordered=True,
        buffers=buffers,
        optimizers=tuple(records),
        parts=tuple(_parts(root, prefix, records)),
        notes=tuple(notes + model_notes),
    )
