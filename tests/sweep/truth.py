"""The facts tieaudit is held to, from the live model and from the written files.

Nothing here asks tieaudit or the architecture table: ties come from the built model (storage
sharing, ``get_expanded_tied_weights_keys(all_submodels=True)``), on-disk spellings from
transformers' own conversion (``revert_weight_conversion``, the function ``save_pretrained`` uses),
and what a file holds from ``torch.load(weights_only=True)`` and the safetensors library.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

MIN_COPY_BYTES = 1024
"""tieaudit's documented --min-size default: smaller tensors are never copy candidates."""


@dataclass
class Live:
    """What the built model ties, in its own (in-memory) names."""

    class_ties: dict[str, str]
    """``{target: source}`` from ``get_expanded_tied_weights_keys(all_submodels=True)``."""
    shared: list[frozenset[str]]
    """state_dict names viewing one storage identically (each group >= 2 names)."""
    disk: dict[str, str | None]
    """In-memory name -> the name save_pretrained writes (None: converted, not renamed)."""
    vocab: dict[str, int | None]
    """input_rows, output_rows, output_bias, vocab_size: the live sizes TIE004 is about."""
    notes: list[str] = field(default_factory=list)
    """Where transformers disagrees with itself (a class tie not shared in memory, ...)."""

    def components(self, names: dict[str, str | None] | None = None) -> list[frozenset[str]]:
        """Groups of names tied together (class ties joined with storage sharing); spelled through
        names (in-memory -> file name) when given, names it does not map left out."""
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.setdefault(x, x) != x:
                x = parent[x]
            return x

        for target, source in self.class_ties.items():
            parent[find(target)] = find(source)
        for group in self.shared:
            first, *rest = sorted(group)
            for other in rest:
                parent[find(other)] = find(first)
        groups: dict[str, set[str]] = defaultdict(set)
        for name in parent:
            groups[find(name)].add(name)
        out = [frozenset(str(names[n]) for n in g if names.get(n)) if names is not None else frozenset(g)
               for g in groups.values()]  # fmt: skip
        return sorted((g for g in out if len(g) > 1), key=sorted)


def storage_key(tensor: Any) -> tuple[int, int] | None:
    """The storage a tensor views (None for an empty storage: those are never shared)."""
    storage = tensor.untyped_storage()
    return None if storage.nbytes() == 0 else (storage.data_ptr(), storage.nbytes())


def view_key(tensor: Any) -> tuple[object, ...] | None:
    key = storage_key(tensor)
    if key is None:
        return None
    return (key, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype))


def shared_groups(state: dict[str, Any], by: Any = view_key) -> list[frozenset[str]]:
    groups: dict[object, set[str]] = defaultdict(set)
    for name, tensor in state.items():
        key = by(tensor)
        if key is not None:
            groups[key].add(name)
    return sorted((frozenset(g) for g in groups.values() if len(g) > 1), key=sorted)


def disk_name(model: Any, name: str, tensor: Any) -> str | None:
    """The name save_pretrained writes for one in-memory name (None when it is converted)."""
    from transformers.core_model_loading import revert_weight_conversion

    try:
        out = revert_weight_conversion(model, {name: tensor})
    except Exception:
        return None
    return next(iter(out)) if len(out) == 1 else None


def live_truth(model: Any) -> Live:
    state = model.state_dict()
    class_ties = dict(model.get_expanded_tied_weights_keys(all_submodels=True))
    shared = shared_groups(state)
    disk = {name: disk_name(model, name, tensor) for name, tensor in state.items()}
    notes = []
    for target, source in sorted(class_ties.items()):
        if target not in state or source not in state:
            notes.append(f"class tie {target} -> {source}: a name is not in the state dict")
        elif view_key(state[target]) != view_key(state[source]):
            notes.append(f"class tie {target} -> {source}: not one storage in the live model")
    tied_names = set(class_ties) | set(class_ties.values())
    notes += [f"shared in memory but not a class tie: {sorted(g)}" for g in shared if not g <= tied_names]
    return Live(class_ties, shared, disk, vocab_sizes(model), notes)


def config_ties(class_name: str, config: dict[str, Any]) -> dict[str, str]:
    """The ties of the class built (on the meta device) from a config.json's contents."""
    import torch
    import transformers

    model_class = getattr(transformers, class_name)
    # save_pretrained writes Infinity as {"__float__": "Infinity"}; from_pretrained decodes it on
    # reading the file (from_json_file), from_dict does not.
    decode = getattr(model_class.config_class, "_decode_special_floats", lambda value: value)
    with torch.device("meta"):
        model = model_class(model_class.config_class.from_dict(decode(config)))
    return dict(model.get_expanded_tied_weights_keys(all_submodels=True))


def vocab_sizes(model: Any) -> dict[str, int | None]:
    """Rows of the input embedding, of the output projection and its bias, and the vocabulary size."""

    def rows(module: Any, attr: str) -> int | None:
        tensor = getattr(module, attr, None) if module is not None else None
        return int(tensor.shape[0]) if tensor is not None and hasattr(tensor, "shape") else None

    try:
        inputs = model.get_input_embeddings()
    except Exception:
        inputs = None
    try:
        outputs = model.get_output_embeddings()
    except Exception:
        outputs = None
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    output_rows, output_bias = rows(outputs, "weight"), rows(outputs, "bias")
    columns = logit_columns(model, vocab if isinstance(vocab, int) else 64)
    if columns is not None and output_rows is not None and output_rows != columns:
        # get_output_embeddings is not the projection the logits come from (non-legacy DeBERTa
        # returns its hidden-to-hidden dense layer and projects with the word embeddings): the
        # logits' width is the head's size.
        output_rows, output_bias = columns, None
    return {
        "input_rows": rows(inputs, "weight"),
        "output_rows": output_rows,
        "output_bias": output_bias,
        "vocab_size": vocab if isinstance(vocab, int) else None,
    }


def logit_columns(model: Any, vocab: int) -> int | None:
    """The last dimension of the model's logits on a few token ids (None: no logits, or it does not run)."""
    import torch

    ids = (torch.arange(8).reshape(1, 8) * 7 + 3) % max(1, min(vocab, 64))
    for kwargs in ({"input_ids": ids}, {"input_ids": ids, "decoder_input_ids": ids}):
        try:
            with torch.no_grad():
                logits = getattr(model(**kwargs), "logits", None)
        except Exception:
            continue
        return int(logits.shape[-1]) if torch.is_tensor(logits) else None
    return None


def sizes_disagree(vocab: dict[str, int | None]) -> bool:
    """Embedding rows, output rows, output bias and vocabulary size, where known, differ."""
    return len({v for v in vocab.values() if v is not None}) > 1


# --- the written files ---------------------------------------------------------------------------


@dataclass
class FileFacts:
    """What a written checkpoint holds, read by torch and safetensors."""

    names: frozenset[str]
    alias: list[frozenset[str]]
    """Names sharing one storage (torch files only)."""
    copies: list[frozenset[str]]
    """Names in separate storages holding equal bytes (same dtype and shape), non-constant,
    at least MIN_COPY_BYTES: what TIE001 is about."""
    nbytes: dict[str, int]
    metadata: dict[str, str] | None
    digests: dict[str, str]
    """sha256 of each name's bytes (dtype and shape included)."""
    config: dict[str, Any] | None


def weight_file(path: str) -> str:
    if not os.path.isdir(path):
        return path
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    raise FileNotFoundError(f"no weights in {path}")


def read_tensors(path: str) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The tensors of a checkpoint as its reference loader gives them, and safetensors metadata."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    file = weight_file(path)
    if file.endswith(".safetensors"):
        with safe_open(file, framework="pt") as handle:
            metadata = handle.metadata()
        return load_file(file), metadata
    return torch.load(file, weights_only=True, map_location="cpu"), None


def tensor_bytes(tensor: Any) -> bytes:
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""


def digest(tensor: Any) -> str:
    head = f"{tensor.dtype}{tuple(tensor.shape)}".encode()
    return hashlib.sha256(head + tensor_bytes(tensor)).hexdigest()


def is_constant(tensor: Any) -> bool:
    data = tensor_bytes(tensor)
    size = tensor.element_size()
    return data == data[:size] * (len(data) // size) if data else True


def file_facts(path: str) -> FileFacts:
    tensors, metadata = read_tensors(path)
    tensors = {k: v for k, v in tensors.items() if hasattr(v, "untyped_storage")}
    alias = shared_groups(tensors, storage_key)
    digests = {name: digest(t) for name, t in tensors.items()}
    nbytes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    by_storage: dict[object, list[str]] = defaultdict(list)
    for name, tensor in tensors.items():
        by_storage[storage_key(tensor) or ("empty", name)].append(name)
    candidates: dict[str, list[str]] = defaultdict(list)  # digest -> one name per storage
    for names in by_storage.values():
        first = sorted(names)[0]
        tensor = tensors[first]
        if nbytes[first] >= MIN_COPY_BYTES and not is_constant(tensor):
            candidates[digests[first]].append(first)
    copies = []
    for firsts in candidates.values():
        if len(firsts) > 1:
            members = {n for f in firsts for names in by_storage.values() if f in names for n in names}
            copies.append(frozenset(members))
    config = None
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as handle:
            config = json.load(handle)
    return FileFacts(frozenset(tensors), alias, sorted(copies, key=sorted), nbytes, metadata, digests, config)
