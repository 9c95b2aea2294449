"""Loading retie's output the way people load each form, compared with loading its input.

Folders: ``from_pretrained`` of the class and of every class of its family that loads the input
cleanly (no missing or mismatched keys). ``.pt``: ``torch.load(weights_only=True)`` and
``load_state_dict(strict=True)``. safetensors files: ``safetensors.torch.load_model(strict=True)``
and ``load_file``. Every tensor is compared bit for bit, the model's ties (storage sharing) and its
logits too; transformers' warnings are captured, and any the output adds to the input's is reported.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.sweep.expect import Disagreement
from tests.sweep.truth import digest, read_tensors, shared_groups, storage_key


@dataclass
class Loaded:
    """One model as a loader made it."""

    error: str = ""
    digests: dict[str, str] = field(default_factory=dict)
    shared: list[frozenset[str]] = field(default_factory=list)
    missing: frozenset[str] = frozenset()
    unexpected: frozenset[str] = frozenset()
    mismatched: frozenset[str] = frozenset()
    warnings: frozenset[str] = frozenset()
    logits: str | None = None
    logits_note: str = ""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def captured(path: str) -> Iterator[list[str]]:
    """transformers' log warnings and Python warnings, with path spelled <path>."""
    handler = _Capture()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    out: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield out
    finally:
        logger.removeHandler(handler)
    texts = handler.messages + [str(w.message) for w in caught]
    out.extend(
        re.sub(r"\s+", " ", t.replace(os.path.abspath(path), "<path>").replace(path, "<path>")) for t in texts
    )


def model_facts(model: Any, loaded: Loaded) -> Loaded:
    import torch

    state = model.state_dict()
    loaded.digests = {name: digest(t) for name, t in state.items()}
    loaded.shared = shared_groups(state)
    vocab = getattr(model.config.get_text_config(decoder=True), "vocab_size", None) or 64
    ids = (torch.arange(8).reshape(1, 8) * 7 + 3) % min(int(vocab), 64)
    attempts: list[dict[str, Any]] = [{"input_ids": ids}, {"input_ids": ids, "decoder_input_ids": ids}]
    errors = []
    for kwargs in attempts:
        try:
            with torch.no_grad():
                out = model(**kwargs)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            continue
        value = getattr(out, "logits", None)
        if value is None:
            value = next(
                (v for v in (out.values() if hasattr(out, "values") else out) if torch.is_tensor(v)), None
            )
        if value is not None:
            loaded.logits = digest(value)
            return loaded
        errors.append("no tensor output")
    loaded.logits_note = "not run: " + errors[-1]
    return loaded


def load_hf(class_name: str, folder: str) -> Loaded:
    import transformers

    loaded = Loaded()
    try:
        with captured(folder) as messages:
            model, info = getattr(transformers, class_name).from_pretrained(folder, output_loading_info=True)
    except Exception as exc:
        loaded.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        return loaded
    loaded.missing = frozenset(info["missing_keys"])
    loaded.unexpected = frozenset(info["unexpected_keys"])
    loaded.mismatched = frozenset(k[0] for k in info["mismatched_keys"])
    loaded.warnings = frozenset(m for m in messages if "LOAD REPORT" not in m)
    return model_facts(model.eval(), loaded)


def clean(loaded: Loaded) -> bool:
    """A load with no error, no missing and no mismatched key: the loader accepts the input."""
    return not loaded.error and not loaded.missing and not loaded.mismatched


def compare_loads(
    loader: str, before: Loaded, after: Loaded, may_gain: list[frozenset[str]] | None = None
) -> list[Disagreement]:
    """The output loaded by loader, against the input loaded by the same loader; ties within
    may_gain may appear (retie turned the class's switch on for copies the switch ties)."""
    out: list[Disagreement] = []
    if after.error:
        return [Disagreement("reload-error", f"{loader}: {after.error}")]
    new_missing = after.missing - before.missing
    if new_missing or after.mismatched - before.mismatched:
        out.append(
            Disagreement(
                "reload-missing", f"{loader}: newly initialized {sorted(new_missing | after.mismatched)}"
            )
        )
    if after.unexpected - before.unexpected:
        out.append(Disagreement("reload-unexpected", f"{loader}: unexpected {sorted(after.unexpected)}"))
    if after.warnings - before.warnings:
        out.append(
            Disagreement("reload-warning", f"{loader}: {sorted(after.warnings - before.warnings)[0][:300]}")
        )
    differ = sorted(
        n
        for n in before.digests.keys() | after.digests.keys()
        if before.digests.get(n) != after.digests.get(n)
    )
    if differ:
        out.append(Disagreement("reload-bytes", f"{loader}: {len(differ)} tensors differ, first {differ[0]}"))
    gone = [sorted(g) for g in set(before.shared) - set(after.shared)]
    extra = [sorted(g) for g in set(after.shared) - set(before.shared) if not _within(g, may_gain or [])]
    if gone or extra:
        out.append(Disagreement("reload-ties", f"{loader}: ties lost {gone}, gained {extra}"))
    if before.logits != after.logits and not after.logits_note:
        out.append(Disagreement("reload-logits", f"{loader}: logits differ"))
    return out


# --- files ---------------------------------------------------------------------------------------


def _load_into(build: Callable[[], Any], load: Callable[[Any], object]) -> Loaded:
    loaded = Loaded()
    model = build()
    try:
        with captured("") as messages:
            load(model)
    except Exception as exc:
        loaded.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        return loaded
    loaded.warnings = frozenset(messages)
    return model_facts(model, loaded)


def compare_pt(source: str, out: str, build: Callable[[], Any]) -> list[Disagreement]:
    """torch.load of both, then load_state_dict(strict=True) into a fresh model."""
    import torch

    result: list[Disagreement] = []
    try:
        before = torch.load(source, weights_only=True)
        after = torch.load(out, weights_only=True)
    except Exception as exc:
        return [Disagreement("reload-error", f"torch.load: {type(exc).__name__}: {str(exc)[:300]}")]
    if set(before) != set(after):
        result.append(
            Disagreement("reload-names", f"torch.load: names {sorted(set(before) ^ set(after))[:4]} differ")
        )
    differ = sorted(n for n in set(before) & set(after) if digest(before[n]) != digest(after[n]))
    if differ:
        result.append(Disagreement("reload-bytes", f"torch.load: {len(differ)} differ, first {differ[0]}"))
    lost = [
        sorted(g)
        for g in shared_groups(before, storage_key)
        if not _within(g, shared_groups(after, storage_key))
    ]
    if lost:
        result.append(Disagreement("reload-ties", f"torch.load: sharing lost {lost}"))
    loaded_before = _load_into(build, lambda m: m.load_state_dict(before, strict=True))
    loaded_after = _load_into(build, lambda m: m.load_state_dict(after, strict=True))
    return result + compare_loads("load_state_dict(strict=True)", loaded_before, loaded_after)


def _within(group: frozenset[str], groups: list[frozenset[str]]) -> bool:
    return any(group <= g for g in groups)


def compare_st(source: str, out: str, build: Callable[[], Any]) -> list[Disagreement]:
    """load_file of both (a dropped name must be a {dropped: kept} record of an equal tensor),
    then load_model(strict=True) into a fresh model."""
    from safetensors.torch import load_model

    result: list[Disagreement] = []
    before, _ = read_tensors(source)
    after, metadata = read_tensors(out)
    records = metadata or {}
    for name in sorted(before):
        kept = name if name in after else records.get(name)
        if kept is None or kept not in after:
            result.append(Disagreement("reload-names", f"load_file: {name} neither stored nor recorded"))
        elif digest(after[kept]) != digest(before[name]):
            result.append(Disagreement("reload-bytes", f"load_file: {name} (as {kept}) differs"))
    loaded_before = _load_into(build, lambda m: load_model(m, source, strict=True))
    loaded_after = _load_into(build, lambda m: load_model(m, out, strict=True))
    return result + compare_loads("load_model(strict=True)", loaded_before, loaded_after)
