"""Generate the tensor-name fingerprints of every class in the tie table (offline, by a developer).

    .venv/bin/python scripts/gen_tie_table.py --names-only [--jobs N] [--only NAME ...]
    (``make tie-table`` writes them in the same run as the table)

tieaudit recognises the model class of a bare checkpoint file (no config.json) from its tensor
names alone (``tieaudit/formats/family.py``). This writes what it compares against,
``tieaudit/formats/tie_names.json``: for every class of the committed tie table, the names its
``state_dict`` holds, built on the meta device exactly as the table's entry was (config class
defaults, FIXUPS, layer counts cut to 2 unless the entry says ``sizes: default``) and once more at
the config class's default sizes, each combination of the entry's switches (none stated, all false,
all true) built, each numbered segment's number as ``#`` (``model.layers.#.mlp.up_proj.weight``,
``experts.expert_#.wi.weight``: ``family_names.name_template``).

- ``disk``: the names ``save_pretrained`` writes: ``_keys_to_ignore_on_save`` removed (Marian's
  sinusoidal positions) and
  transformers' weight conversions reverted (``revert_weight_conversion``, as save_pretrained does;
  meta tensors convert like real ones), tied targets included (an untied save writes them);
- ``memory``: the in-memory ``state_dict`` names, when they differ (``safetensors.torch.save_file(
  model.state_dict())`` and ``save_model`` write those; Mixtral's fused experts, LLaVA's
  ``model.language_model``, Marian's ignored keys);
- ``optional`` (per spelling): names a file may lack: tie targets under any setting of the
  switches (save_pretrained drops a tied target), and names some builds have and others not
  (other layer counts, other switch values). Every other name is required.

Names are stored once in a sorted list (``names``); a class holds index runs into it
(``"3-17,20"``), so the file stays small. Deterministic output (sorted; one class per line);
``tests/test_tie_names.py`` regenerates a sample of classes and compares.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gen_tie_table as gen

from tieaudit.formats.family_names import front_decoded

NAMES = gen.ROOT / "tieaudit" / "formats" / "tie_names.json"
SCHEMA = "tieaudit.tie-names/1"
COMMAND = "make tie-table  (.venv/bin/python scripts/gen_tie_table.py --names-only --jobs 2)"
LEGEND = {
    "names": "every name template (numbered segments as '#'), sorted; classes index into it; front "
    "coded: [k, rest] is the previous name's first k characters followed by rest",
    "classes": "class -> {disk, disk_optional, memory?, memory_optional?}: index runs into names "
    "('a-b' inclusive, comma separated); memory only where the in-memory names differ",
    "failed": "classes of the tie table whose names could not be computed, with the reason",
}


def template(name: str) -> str:
    """name with each numbered segment's number as ``#``, as tieaudit matches names."""
    from tieaudit.formats.family_names import name_template

    return name_template(name)


def built_names(model: Any) -> tuple[set[str], set[str]]:
    """(names save_pretrained writes, in-memory state_dict names) of a model built on meta."""
    from transformers.core_model_loading import revert_weight_conversion

    state = model.state_dict()
    memory = set(state)  # what save_file(model.state_dict()) writes: ignored keys too
    for ignored in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(ignored, None)
    with gen.quiet():
        disk = set(revert_weight_conversion(model, dict(state)))
    return disk, memory


def builds(name: str, entry: Mapping[str, Any]) -> list[tuple[set[str], set[str]]]:
    """The names of every build: the entry's sizes and the default sizes, each switch combination."""
    import torch
    from transformers.initialization import no_init_weights

    cls = gen.resolve_class(name, entry["module"])
    switches = [s["path"] for s in entry["switches"]]
    combos = ["-" * len(switches), "0" * len(switches), "1" * len(switches)]
    refused = set(entry.get("refused", []))
    found = []
    errors = []
    for shrunk in [True, False] if entry.get("sizes") != "default" else [False]:
        try:
            full, _, _ = gen.default_dict(cls, shrunk)
        except Exception as exc:
            errors.append(gen.one_line(exc))
            continue
        for combo in dict.fromkeys(combos):
            if combo in refused:
                continue
            data = gen.stated(full, switches, combo)
            try:
                with gen.quiet():
                    config = cls.config_class(**data)  # type: ignore[attr-defined]
                    with torch.device("meta"), no_init_weights():
                        model = cls(config)
                found.append(built_names(model))
            except Exception as exc:  # another size or switch value the class refuses
                errors.append(gen.one_line(exc))
    if not found:
        raise gen.BuildError(errors[0] if errors else "no build")
    return found


def tie_targets(entry: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(written, in-memory) names of every tie target under any switch setting."""
    memory = {t for group in entry["groups"] for t in group["ties"]}
    renamed = entry.get("disk_names", {})
    disk = {renamed.get(t, t) or t for t in memory}
    return disk, memory


def spelling(variants: Sequence[set[str]], targets: set[str]) -> tuple[list[str], list[str]]:
    """(every template, the optional ones) of one spelling over the builds."""
    sets = [{template(n) for n in names} for names in variants]
    union = set().union(*sets)
    always = set.intersection(*sets)
    optional = (union - always) | ({template(t) for t in targets} & union)
    return sorted(union), sorted(optional)


def class_names(name: str, entry: Mapping[str, Any]) -> dict[str, list[str]]:
    """One class's templates: disk, disk_optional, and memory, memory_optional where they differ."""
    found = builds(name, entry)
    disk_targets, memory_targets = tie_targets(entry)
    disk, disk_optional = spelling([d for d, _ in found], disk_targets)
    memory, memory_optional = spelling([m for _, m in found], memory_targets)
    out = {"disk": disk, "disk_optional": disk_optional}
    if (memory, memory_optional) != (disk, disk_optional):
        out.update({"memory": memory, "memory_optional": memory_optional})
    return out


def worker(batch: list[str], table_path: str = str(gen.TABLE)) -> list[tuple[str, Any, str | None]]:
    gen.isolate_hub()
    classes = gen.committed_classes(table_path)
    results: list[tuple[str, Any, str | None]] = []
    for name in batch:
        began = time.monotonic()
        try:
            results.append((name, class_names(name, classes[name]), None))
        except Exception as exc:
            results.append((name, None, str(exc) if isinstance(exc, gen.BuildError) else gen.one_line(exc)))
        print(f"  names {name} {time.monotonic() - began:.2f}s", file=sys.stderr, flush=True)
    return results


def runs(indices: Iterable[int]) -> str:
    """Sorted indices as runs: ``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    parts: list[str] = []
    ordered = sorted(indices)
    start = prev = None
    for index in [*ordered, None]:
        if start is not None and (index is None or index != prev + 1):  # type: ignore[operator]
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if index is not None and start is None:
            start = index
        prev = index
    return ",".join(parts)


def front_coded(names: Sequence[str]) -> list[str | list[int | str]]:
    """Sorted names, each as [characters shared with the previous one, the rest] (a plain string
    when it shares none): the sorted list repeats long prefixes."""
    coded: list[str | list[int | str]] = []
    previous = ""
    for name in names:
        shared = 0
        while shared < min(len(previous), len(name)) and previous[shared] == name[shared]:
            shared += 1
        coded.append([shared, name[shared:]] if shared else name)
        previous = name
    return coded


def document(names: Mapping[str, Mapping[str, list[str]]], failed: Mapping[str, str]) -> dict[str, Any]:
    """The file: every template once, classes as index runs."""
    import torch
    import transformers

    every = sorted({n for entry in names.values() for spelled in entry.values() for n in spelled})
    index = {n: i for i, n in enumerate(every)}
    classes = {
        name: {key: runs(index[n] for n in spelled) for key, spelled in sorted(entry.items())}
        for name, entry in sorted(names.items())
    }
    return {
        "schema": SCHEMA,
        "generator": "scripts/gen_tie_names.py",
        "command": COMMAND,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "legend": LEGEND,
        "names": front_coded(every),
        "classes": classes,
        "failed": dict(sorted(failed.items())),
    }


def render(doc: Mapping[str, Any]) -> str:
    """Sorted JSON, one class per line (and one name per line)."""
    lines = ["{"]
    keys = sorted(doc)
    for i, key in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        value = doc[key]
        if key in ("classes", "failed", "names"):
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
            opener, closer = ("{", "}") if isinstance(value, dict) else ("[", "]")
            lines.append(f"  {json.dumps(key)}: {opener}")
            for j, (name, item) in enumerate(items):
                inner = "," if j < len(items) - 1 else ""
                if isinstance(value, dict):
                    lines.append(f"    {json.dumps(name)}: {json.dumps(item, sort_keys=True)}{inner}")
                else:  # 26 000 names: no indentation
                    lines.append(json.dumps(item, separators=(",", ":")) + inner)
            lines.append(f"  {closer}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def decoded(doc: Mapping[str, Any], name: str) -> dict[str, list[str]]:
    """One class of a names file as class_names returns it (the test compares the two)."""
    every = front_decoded(doc["names"])
    out = {}
    for key, text in doc["classes"][name].items():
        spelled: list[str] = []
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            spelled += every[int(first) : int(last or first) + 1]
        out[key] = spelled
    return out


def generate(jobs: int, only: list[str] | None, table_path: Path = gen.TABLE) -> dict[str, Any]:
    from concurrent.futures import ProcessPoolExecutor

    gen.isolate_hub()
    classes = gen.committed_classes(str(table_path))
    wanted = sorted(n for n in classes if not only or n in only)
    batches = gen.package_batches({n: classes[n] for n in wanted})
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = [
                r for done in pool.map(worker, batches, [str(table_path)] * len(batches)) for r in done
            ]
    else:
        results = [r for batch in batches for r in worker(batch, str(table_path))]
    names = {n: found for n, found, _ in results if found is not None}
    failed = {n: error or "unknown" for n, found, error in results if found is None}
    return document(names, failed)


def write(jobs: int, only: list[str] | None, output: Path = NAMES, table_path: Path = gen.TABLE) -> int:
    doc = generate(jobs, only, table_path)
    output.write_text(render(doc))
    print(f"{output}: {len(doc['classes'])} classes, {len(doc['names'])} names, "
          f"{len(doc['failed'])} failed", file=sys.stderr)  # fmt: skip
    return 0
