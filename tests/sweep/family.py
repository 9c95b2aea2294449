"""Measure bare-file class recognition over the sweep's classes (issue 24).

    python -m tests.sweep.family [--classes A,B ...] [--jobs N] [--timeout S] [--out F.json]

Each class the sweep covers (tests/sweep/models.py: every class of the tie table with a tie,
plus the base and encoder classes of the same model types) is built tiny on CPU with random init
(models.build, its first setting: switches on, or fixed), written by ``save_pretrained`` (the
folder's model.safetensors, tied names dropped as transformers drops them) and by
``safetensors.torch.save_model`` (in-memory names, ``{dropped: kept}`` records), and each file is
given to tieaudit alone, without its config.json: ``formats.family.bare_family`` says which
classes its names match. Each file is then one of

- ``exact``: one class, the right one, from an exact match;
- ``ambiguous``: several candidates (exact or partial), the right one among them (counted apart:
  those whose candidates all tie the same pairs, by default and under every setting, so that the
  ambiguity changes nothing tieaudit applies);
- ``partial``: one class, the right one, from a partial match;
- ``wrong``: candidates that do not include the right class (a wrong class would apply wrong ties);
- ``none``: not recognised;
- ``cannot-build``: the class does not build tiny (as in the sweep).

Prints the shares; --out writes every class's result as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tests.sweep import models

KINDS = ("exact", "ambiguous", "partial", "wrong", "none")
FORMS = ("save_pretrained", "save_model")
MEMORY = 4 << 30


def verdict(truth: str, classes: list[str], confidence: str) -> str:
    """Where one recognition falls (KINDS)."""
    if not classes:
        return "none"
    if truth not in classes:
        return "wrong"
    if len(classes) > 1:
        return "ambiguous"
    return "exact" if confidence == "exact" else "partial"


def agree(classes: list[str]) -> bool:
    """Whether the candidate classes tie the same pairs, by default and under every setting (the
    table's in-memory names): then an ambiguous answer decides as much as an exact one."""
    from tieaudit.formats.tie_table import tie_table

    seen = set()
    for name in classes:
        entry = tie_table().entry(name)
        if entry is None or "unresolved" in entry.raw or entry.raw.get("size_dependent"):
            return False
        nothing = "-" * len(entry.switches)
        default = frozenset(p for g in entry.raw["groups"] if nothing in g["on"] for p in g["ties"].items())
        every = frozenset(p for g in entry.raw["groups"] for p in g["ties"].items())
        seen.add((default, every))
    return len(seen) == 1


def recognised(path: str, truth: str) -> dict[str, Any]:
    from tieaudit.formats import open_checkpoint
    from tieaudit.formats.family import bare_family
    from tieaudit.formats.family_names import name_template

    with open_checkpoint(path) as opened:
        ckpt = opened.checkpoint
    family = bare_family(ckpt)
    assert family is not None
    found = family.recognition
    classes = list(found.classes)
    stored = ckpt.names | {t.dropped for t in ckpt.declared_ties}
    return {
        "names": sorted({name_template(n) for n in stored}),
        "agree": bool(classes) and agree(classes),
        "verdict": verdict(truth, classes, found.confidence),
        "confidence": found.confidence,
        "classes": classes,
        "share": found.share,
        "closest": None if found.closest is None else [found.closest.name, found.closest.share],
    }


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("timed out")


@functools.cache
def _subjects() -> dict[str, models.Subject]:
    return models.subjects()


def one(name: str, timeout: float) -> dict[str, Any]:
    """Build, save both ways, recognise each file (in a worker process)."""
    import torch
    from safetensors.torch import save_model

    began = time.monotonic()
    subject = _subjects()[name]
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(timeout))
    try:
        try:
            model = models.build(subject, subject.settings[0])
        except Exception as exc:
            return {"class": name, "cannot_build": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out: dict[str, Any] = {"class": name}
        with tempfile.TemporaryDirectory(prefix="tieaudit-family-") as work:
            try:
                with torch.no_grad():
                    model.save_pretrained(os.path.join(work, "folder"))
                path = os.path.join(work, "folder", "model.safetensors")
                out["save_pretrained"] = (
                    recognised(path, name) if os.path.exists(path) else {"verdict": "n/a", "why": "sharded"}
                )
            except Exception as exc:
                out["save_pretrained"] = {"verdict": "n/a", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
            try:
                single = os.path.join(work, "model.safetensors")
                save_model(model, single)
                out["save_model"] = recognised(single, name)
            except Exception as exc:
                out["save_model"] = {"verdict": "n/a", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out["seconds"] = round(time.monotonic() - began, 2)
        return out
    except TimeoutError:
        return {"class": name, "cannot_build": f"timed out after {timeout} s"}
    finally:
        signal.alarm(0)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def measure(names: list[str], jobs: int, timeout: float) -> list[dict[str, Any]]:
    """Every class's result; a worker that dies (memory cap) costs only the classes it held."""
    results: dict[str, dict[str, Any]] = {}
    pending = list(names)
    while pending:
        with ProcessPoolExecutor(jobs, initializer=_limit) as pool:
            futures = {name: pool.submit(one, name, timeout) for name in pending}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except BrokenProcessPool:
                    break
                except Exception as exc:
                    results[name] = {"class": name, "cannot_build": f"{type(exc).__name__}: {exc}"}
                seconds = results[name].get("seconds", "-")
                print(f"  {name}: {_brief(results[name])} ({seconds} s)", file=sys.stderr, flush=True)
        died = [n for n in pending if n not in results]
        if died:  # the first unfinished class killed its worker: recorded, the rest run again
            results[died[0]] = {"class": died[0], "cannot_build": "its worker died (memory cap or crash)"}
        pending = [n for n in pending if n not in results]
    return [results[n] for n in names]


def _brief(result: dict[str, Any]) -> str:
    if "cannot_build" in result:
        return "cannot-build"
    return ", ".join(f"{form} {result[form]['verdict']}" for form in FORMS if form in result)


def shares(results: list[dict[str, Any]], form: str) -> dict[str, Any]:
    """Counts and shares of each verdict among the files written (classes that build)."""
    files = [r[form] for r in results if form in r and r[form]["verdict"] != "n/a"]
    counted = Counter(f["verdict"] for f in files)
    total = len(files)
    agreeing = sum(1 for f in files if f["verdict"] == "ambiguous" and f["agree"])
    return {
        "files": total,
        "counts": {k: counted.get(k, 0) for k in KINDS},
        "shares": {k: round(counted.get(k, 0) / total, 4) if total else 0.0 for k in KINDS},
        "ambiguous_candidates_tie_alike": agreeing,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sweep.family", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--classes", nargs="*", help="class names (comma or space separated); default all")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per class")
    parser.add_argument("--out", help="write every class's result here (JSON)")
    args = parser.parse_args(argv)
    subjects = models.subjects()
    names = [n for arg in args.classes or [] for n in arg.split(",") if n] or list(subjects)
    began = time.monotonic()
    results = measure(names, args.jobs, args.timeout)
    built = [r for r in results if "cannot_build" not in r]
    summary = {
        "classes": len(results),
        "cannot_build": len(results) - len(built),
        **{form: shares(built, form) for form in FORMS},
        "seconds": round(time.monotonic() - began, 1),
    }
    print(json.dumps(summary, indent=2))
    for form in FORMS:
        wrong = [r["class"] for r in built if r.get(form, {}).get("verdict") == "wrong"]
        if wrong:
            print(f"{form}: wrong for {', '.join(wrong)}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"summary": summary, "results": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
