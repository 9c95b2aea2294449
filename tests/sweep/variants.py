"""The variants: one live model written the ways checkpoints are written.

``hf-st``       save_pretrained (safetensors, tied names dropped by transformers)
``hf-bin``      config.json + pytorch_model.bin: torch.save of the state dict as save_pretrained
                names it, tied names kept as one storage (transformers 5.24 has no
                ``safe_serialization=False`` any more: save_pretrained ignores it and writes
                safetensors, so the .bin is written the way 4.x wrote it)
``pt``          torch.save(model.state_dict()) as model.pt (in-memory names, sharing kept)
``st-file``     safetensors.torch.save_model (a plain file; ``{dropped: kept}`` metadata)
``hf-clone``    config.json + model.safetensors holding every tied name as a separate equal
                tensor (with the switch off: the head holds a copy of the embedding)
``hf-diverged`` as hf-clone, one tied name perturbed (its first element + 0.5)
``hf-bin-clone`` as hf-clone, written as pytorch_model.bin (retie keeps every name, as views)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tests.sweep.truth import Live

FORMS = ("hf-st", "hf-bin", "pt", "st-file", "hf-clone", "hf-diverged", "hf-bin-clone")
FOLDER_FORMS = ("hf-st", "hf-bin", "hf-clone", "hf-diverged", "hf-bin-clone")


class NotApplicable(Exception):
    """The variant does not exist for this class and setting (the reason is the message)."""


@dataclass
class Written:
    """One variant on disk."""

    path: str
    """What tieaudit is given: the folder, or the file."""
    form: str
    copied: list[tuple[str, str]] = field(default_factory=list)
    """(target, source) in-memory names whose target was written as a separate copy."""
    perturbed: tuple[str, str] | None = None
    """hf-diverged: (target, source) in-memory names, the target perturbed."""


def _save_state(model: Any) -> dict[str, Any]:
    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    return dict(state)


def _to_disk(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(model, state))


def _pairs(live: Live, on_live: Live | None, state: dict[str, Any]) -> dict[str, str]:
    """The pairs a clone copies: the live ties; with the switch off, each group the switch ties,
    restricted to the names this setting has, copied from its source (or its first name)."""
    if live.class_ties or on_live is None:
        return live.class_ties
    pairs = {}
    sources = set(on_live.class_ties.values())
    for group in on_live.components():
        present = sorted(n for n in group if n in state)
        source = next((n for n in present if n in sources), present[0] if present else "")
        for target in present:
            if target != source and state[target].shape == state[source].shape:
                pairs[target] = source
    return pairs


def _perturbed(model: Any, pairs: dict[str, str]) -> tuple[str, str]:
    """The pair whose target is perturbed: the output embedding when it is a tied target."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)
    state = model.state_dict()
    floats = [t for t in sorted(pairs) if state[t].is_floating_point() and state[t].numel() > 1]
    for target in floats:
        if weight is not None and state[target].data_ptr() == weight.data_ptr():
            return target, pairs[target]
    if not floats:
        raise NotApplicable("no floating tied tensor to perturb")
    return floats[0], pairs[floats[0]]


def write(model: Any, live: Live, on_live: Live | None, form: str, dest: str) -> Written:
    """Write one variant of model under dest (a folder that exists and is empty)."""
    import torch
    from safetensors.torch import save_file, save_model

    # save_pretrained records the class in config.json (architectures); the forms written without
    # it record it the same way, whatever case this worker ran before on the same model.
    model.config.architectures = [type(model).__name__]
    if form == "hf-st":
        model.save_pretrained(dest)
        return Written(dest, form)
    if form == "hf-bin":
        model.config.save_pretrained(dest)
        torch.save(_to_disk(model, _save_state(model)), os.path.join(dest, "pytorch_model.bin"))
        return Written(dest, form)
    if form == "pt":
        torch.save(model.state_dict(), os.path.join(dest, "model.pt"))
        return Written(os.path.join(dest, "model.pt"), form)
    if form == "st-file":
        save_model(model, os.path.join(dest, "model.safetensors"))
        return Written(os.path.join(dest, "model.safetensors"), form)
    state = _save_state(model)
    pairs = _pairs(live, on_live, state)
    if not pairs:
        raise NotApplicable("the class ties nothing" + (" under any setting" if on_live is not None else ""))
    if form == "hf-diverged" and not live.class_ties:
        raise NotApplicable("the switch is off: nothing is tied, so nothing can diverge")
    copied = []
    for target, source in sorted(pairs.items()):
        if target not in state or source not in state:
            raise NotApplicable(f"tied name not in the state dict: {target} -> {source}")
        if state[target].shape != state[source].shape or state[target].dtype != state[source].dtype:
            raise NotApplicable(f"{target} and {source} differ in shape or dtype in this setting")
        state[target] = state[source].detach().clone()
        copied.append((target, source))
    perturbed = None
    if form == "hf-diverged":
        perturbed = _perturbed(model, pairs)
        flat = state[perturbed[0]].view(-1)
        flat[0] = flat[0] + 0.5
    disk = {k: v.detach().clone().contiguous() for k, v in _to_disk(model, state).items()}
    model.config.save_pretrained(dest)
    if form == "hf-bin-clone":
        torch.save(disk, os.path.join(dest, "pytorch_model.bin"))
    else:
        save_file(disk, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    return Written(dest, form, copied, perturbed)
