"""Differential test: every .pt/.pth/.bin file, read by tieaudit and by torch.load, must agree.

The files: everything in the generated corpus (HF folders included) and in the hostile corpus
(built with make_hostile.prepare). The reference: ``torch.load(path, weights_only=True,
map_location="cpu")`` in a forked child of a server that imports torch once, under an address-
space cap and a timeout (torch itself segfaults or runs for minutes on some hostile files: that
is the reference refusing). tieaudit reads each file in this process with its torch reader.

- both accept: the flattened leaf names agree; for every tensor the dtype, shape, strides,
  storage offset, storage size, storage sharing and logical bytes agree;
- torch's weights_only refuses only a global outside its allowlist (tieaudit reads such files with
  inert placeholders): torch.load(weights_only=False) with a pickle module whose unpickler hands
  out the test's own inert classes for those names (nothing from the file is imported or called)
  is the reference, compared as above;
- torch refuses: tieaudit refuses too, unless the file is in DELIBERATE with the reason;
- tieaudit refuses what torch accepts: allowed (tieaudit refuses whatever it cannot read exactly
  as torch does), and listed in the report this test prints with -s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import GENERATED, ROOT, Corpus
from inert_pickle import Inert, inert_parts, load_like_torch

HOSTILE = ROOT / "fixtures" / "hostile"
SUFFIXES = (".pt", ".pth", ".bin")
TIMEOUT = 10.0
"""Seconds torch.load may take on one file before it counts as refusing (a hang). Every file torch
reads loads in well under a second; the hostile ones it never finishes held a child this long."""
PARALLEL = 2
"""Children at once: the CPUs CI has."""
EXTRA_ADDRESS_SPACE = 3 << 30
"""Address space a torch.load child may add to the server's (torch's libraries are mapped already)."""
DELIBERATE: dict[str, str] = {}
"""Files torch refuses and tieaudit reads, with the reason (none: every such file is a failure)."""


# ------------------------------------------------------------------ the torch side (a fork server)


def _torch_flatten(torch: Any, value: Any, name: str, out: list[dict[str, Any]]) -> bool:
    """Leaves under tieaudit's dotted names: dicts and lists/tuples are walked, torch.Size is a leaf;
    an inert object's parts are walked, and it is one leaf when no tensor is among them. Returns
    whether a tensor was found."""
    from tieaudit.formats.torch_file import ROOT_NAME, key_name

    if isinstance(value, (dict, list, tuple, Inert)) and not isinstance(value, torch.Size):
        if isinstance(value, Inert):
            items = inert_parts(value)
        elif isinstance(value, dict):
            items = [(key_name(key), item) for key, item in value.items()]
        else:
            items = [(str(index), item) for index, item in enumerate(value)]
        first, found = len(out), False
        for part, item in items:
            empty = isinstance(item, (dict, list, tuple)) and not isinstance(item, torch.Size) and not item
            if not empty:
                found = _torch_flatten(torch, item, f"{name}.{part}" if name else part, out) or found
        if isinstance(value, Inert) and not found:
            del out[first:]
            out.append({"name": name or ROOT_NAME, "tensor": False, "type": "inert"})
        return found
    if isinstance(value, torch.Tensor):
        leaf: dict[str, Any] = {"name": name or ROOT_NAME, "tensor": True, "device": value.device.type}
        plain = value.layout == torch.strided and not value.is_quantized and not value.is_nested
        if plain and value.device.type != "meta" and not value.is_conj() and not value.is_neg():
            storage = value.untyped_storage()
            raw = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            leaf.update(
                dtype=str(value.dtype).removeprefix("torch."),
                shape=list(value.shape),
                stride=list(value.stride()),
                offset=value.storage_offset() * value.element_size(),
                storage=storage.data_ptr(),
                storage_nbytes=storage.nbytes(),
                sha256=hashlib.sha256(raw).hexdigest(),
            )
        out.append(leaf)
        return True
    out.append({"name": name or ROOT_NAME, "tensor": False, "type": type(value).__name__})
    return False


def _torch_load(torch: Any, path: str) -> dict[str, Any]:
    """torch.load path: what it returned, or its error (any failure is torch refusing the file).

    A file weights_only refuses only for a global outside its allowlist is loaded again with
    weights_only=False and the inert pickle module: torch itself then finds every tensor (mode
    "inert"), with nothing from the file imported or called."""
    try:
        loaded, mode = load_like_torch(torch, path)
        leaves: list[dict[str, Any]] = []
        _torch_flatten(torch, loaded, "", leaves)
        return {"accepted": True, "leaves": leaves, "mode": mode}
    except BaseException as exc:
        return {"accepted": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 4 << 30


def _fork(work: Callable[[], dict[str, Any]], result: str, limit: int) -> int:
    """work() in a forked child under an address-space cap; its answer is written to result."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.alarm(int(TIMEOUT) + 5)
            Path(result).write_text(json.dumps(work()))
        except BaseException:
            code = 1
        os._exit(code)
    return pid


Job = tuple[Callable[[], dict[str, Any]], str]
"""Work for one child, and the file its answer goes to."""


def _run_children(jobs: list[Job], limit: int) -> list[dict[str, Any] | None]:
    """Each job in a forked child, PARALLEL at a time, each killed after TIMEOUT; None for one that
    died or hung. Two files torch.load never finishes (a pickle bomb, a shared fan-out) cost TIMEOUT
    each: side by side with the rest they no longer add up."""
    running: dict[int, tuple[int, float]] = {}
    answers: list[dict[str, Any] | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    while pending or running:
        while pending and len(running) < PARALLEL:
            index = pending.pop(0)
            running[_fork(jobs[index][0], jobs[index][1], limit)] = (index, time.monotonic())
        for pid, (index, began) in list(running.items()):
            done = os.waitpid(pid, os.WNOHANG)[0]
            if not done and time.monotonic() - began > TIMEOUT:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
            elif done:
                del running[pid]
                result = Path(jobs[index][1])
                answers[index] = json.loads(result.read_text()) if result.exists() else None
        time.sleep(0.005)
    return answers


def _serve(spec_path: str) -> int:
    """``python test_differential_torch.py SPEC``: each file of SPEC through torch.load and through
    tieaudit, each in its own forked child (torch is imported once, here)."""
    import torch

    torch.set_num_threads(1)
    # Import and warm up both readers here, once: each forked child then starts with them loaded
    # (importing in every child cost about half a second per file, most of the test's time).
    import io

    import tieaudit.formats.torch_file  # noqa: F401

    warm = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, warm)
    warm.seek(0)
    torch.load(warm, weights_only=True)
    spec = json.loads(Path(spec_path).read_text())
    limit = _address_space() + EXTRA_ADDRESS_SPACE
    jobs: list[Job] = []
    for index, path in enumerate(spec["files"]):
        jobs.append((functools.partial(_torch_load, torch, path), f"{spec_path}.{index}.torch.json"))
        jobs.append((functools.partial(_tieaudit, Path(path)), f"{spec_path}.{index}.tieaudit.json"))
    results = _run_children(jobs, limit)
    answers: dict[str, Any] = {}
    for index, path in enumerate(spec["files"]):
        theirs, ours = results[2 * index], results[2 * index + 1]
        answers[path] = {
            "torch": theirs or {"accepted": False, "error": "torch.load died or hung"},
            "tieaudit": ours or vars(Reading(False, "tieaudit died or hung", {}, {}, crashed=True)),
        }
    Path(spec_path + ".out").write_text(json.dumps(answers))
    return 0


# ------------------------------------------------------------------ the tieaudit side


@dataclass(frozen=True)
class Reading:
    """What tieaudit's torch reader made of one file."""

    accepted: bool
    """False when it refused the file (with error)."""
    error: str
    """The one-line refusal."""
    leaves: dict[str, dict[str, Any]]
    """Leaf name -> description (tensors as the torch side describes them)."""
    storages: dict[str, str]
    """Tensor name -> storage id."""
    more: int = 0
    """Non-tensor leaves tieaudit counted without keeping their names (beyond MAX_KEPT_SKIPPED)."""
    crashed: bool = False
    """True when reading raised something other than InputError, or died: a tieaudit bug."""


def _tieaudit(path: Path) -> dict[str, Any]:
    """tieaudit's torch reader on path, as a JSON-able Reading."""
    from tieaudit.core.errors import InputError
    from tieaudit.formats.torch_file import TorchReader

    reader = TorchReader()
    try:
        head = path.read_bytes()[:64] if path.is_file() else b""
        if not reader.sniff(str(path), head):
            return vars(Reading(False, "not sniffed as a torch file", {}, {}))
        with reader.read(str(path)) as opened:
            ckpt = opened.checkpoint
            if ckpt.format == "pickle":  # refused as torch data; its pickles name code (formats.walked)
                names = ", ".join(g.name for g in ckpt.pickle_globals if g.verdict == "runs-code")
                refused = f"{path}: no tensors read; its pickles name {names} (TIE010)"
                return vars(Reading(False, refused, {}, {}))
            leaves: dict[str, dict[str, Any]] = {}
            for info in ckpt.tensors:
                array = np.ascontiguousarray(opened.array(info))
                leaves[info.name] = {
                    "tensor": True,
                    "dtype": info.dtype,
                    "shape": list(info.shape),
                    "stride": list(info.strides),
                    "offset": info.byte_offset,
                    "storage_nbytes": ckpt.storages[info.storage_id].nbytes,
                    "sha256": hashlib.sha256(array.tobytes()).hexdigest(),
                }
            for skipped in ckpt.skipped:
                leaves[skipped.name] = {"tensor": False}
            for unread in ckpt.unread:  # tensors listed, not read as values: quantized, sparse, meta, ...
                leaves[unread.name] = {"tensor": True}
            storages = {t.name: t.storage_id for t in ckpt.tensors}
            return vars(Reading(True, "", leaves, storages, more=ckpt.skipped_more))
    except (InputError, OSError) as exc:
        return vars(Reading(False, str(exc), {}, {}))
    except Exception as exc:
        return vars(Reading(False, f"{type(exc).__name__}: {exc}", {}, {}, crashed=True))


# ------------------------------------------------------------------ the files


def _hostile_files(work: Path) -> list[Path]:
    sys.path.insert(0, str(HOSTILE))
    import make_hostile  # type: ignore[import-not-found]

    found: list[Path] = []
    for index, case in enumerate(make_hostile.CASES):
        folder = work / f"{index}"
        folder.mkdir()
        target = make_hostile.prepare(case, HOSTILE, folder)
        candidates = [target] if target.suffix in SUFFIXES else []
        if target.is_dir() and not target.is_symlink():
            candidates += sorted(p for p in target.rglob("*") if p.suffix in SUFFIXES)
        found += [p for p in candidates if not p.is_dir()]
    return found


@pytest.fixture(scope="module")
def compared(
    corpus: Corpus, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[dict[str, Any], Reading]]:
    work = tmp_path_factory.mktemp("differential")
    files = sorted(p for p in GENERATED.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    files += _hostile_files(work)
    spec = work / "spec.json"
    spec.write_text(json.dumps({"files": [str(p) for p in files]}))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    server = subprocess.run(
        [sys.executable, __file__, str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert server.returncode == 0, server.stderr[-4000:]
    answers = json.loads(Path(str(spec) + ".out").read_text())
    return {
        str(path): (answers[str(path)]["torch"], Reading(**answers[str(path)]["tieaudit"])) for path in files
    }


def _label(path: str) -> str:
    return str(Path(path).relative_to(Path(path).parents[1]))


def _mismatches(torch_answer: dict[str, Any], ours: Reading) -> list[str]:
    """Where two acceptances disagree (empty when they agree)."""
    theirs = {leaf["name"]: leaf for leaf in torch_answer["leaves"]}
    problems = []
    unnamed = set(theirs) - set(ours.leaves)
    if ours.more and not set(ours.leaves) - set(theirs):  # names beyond the kept ones are counted
        if any(theirs[name]["tensor"] for name in unnamed) or len(unnamed) > ours.more:
            problems.append(f"{len(unnamed)} leaves unnamed, {ours.more} counted, tensors among them")
    elif set(theirs) != set(ours.leaves):
        problems.append(f"leaf names differ: torch only {sorted(set(theirs) - set(ours.leaves))[:5]}, "
                        f"tieaudit only {sorted(set(ours.leaves) - set(theirs))[:5]}")  # fmt: skip
    sharing_torch: dict[int, set[str]] = defaultdict(set)
    sharing_ours: dict[str, set[str]] = defaultdict(set)
    for name, leaf in theirs.items():
        mine = ours.leaves.get(name)
        if mine is None:
            continue
        if leaf["tensor"] != mine["tensor"]:
            problems.append(f"{name}: a tensor in one reading only")
        elif leaf["tensor"] and "sha256" in mine:
            fields = ("dtype", "shape", "stride", "offset", "storage_nbytes", "sha256")
            problems += [
                f"{name}: {field} {leaf.get(field)!r} (torch) != {mine[field]!r}"
                for field in fields
                if leaf.get(field) != mine[field]
            ]
            if leaf.get("storage_nbytes"):
                sharing_torch[leaf["storage"]].add(name)
                sharing_ours[ours.storages[name]].add(name)
    if {frozenset(s) for s in sharing_torch.values()} != {frozenset(s) for s in sharing_ours.values()}:
        problems.append("names share storages differently")
    return problems


def test_every_torch_file_reads_as_torch_reads_it(
    compared: dict[str, tuple[dict[str, Any], Reading]],
) -> None:
    failures, refused_more = [], []
    for path, (theirs, ours) in compared.items():
        label = _label(path)
        if ours.crashed:
            failures.append(f"{label}: tieaudit crashed ({ours.error[:200]})")
        elif theirs["accepted"] and ours.accepted:
            failures += [f"{label}: {problem}" for problem in _mismatches(theirs, ours)]
        elif ours.accepted and Path(path).name not in DELIBERATE:
            failures.append(f"{label}: torch refuses ({theirs['error'][:160]}) but tieaudit reads it")
        elif theirs["accepted"] and not ours.accepted:
            refused_more.append(f"{label}: {ours.error.split(': ', 1)[-1][:120]}")
    print(f"\n{len(compared)} files; tieaudit refuses {len(refused_more)} that torch reads:")
    print("\n".join(f"  {line}" for line in refused_more))
    assert not failures, "\n".join(failures)


def test_the_comparison_covers_the_corpus_and_the_hostile_files(
    compared: dict[str, tuple[dict[str, Any], Reading]],
) -> None:
    names = {Path(path).name for path in compared}
    assert {"tied_lm.pt", "legacy_tied.pt", "train_ckpt.pt", "pytorch_model.bin"} <= names
    assert {
        "pt_zip_case_pickle.pt",
        "pt_zip_glued.pt",
        "pt_zip_deep_tuple_key.pt",
        "pt_legacy_tar_header.pt",
    } <= names
    both = [path for path, (theirs, ours) in compared.items() if theirs["accepted"] and ours.accepted]
    tensors = sum(len(compared[path][1].storages) for path in both)
    assert len(both) >= 12 and tensors >= 50, (len(both), tensors)
    inert = {Path(path).name for path in both if compared[path][0]["mode"] == "inert"}
    assert {
        "pt_zip_reduce_os_system.pt",
        "pt_legacy_reduce_eval.pt",
        "pt_zip_global_not_allowlisted.pt",
    } <= inert


def test_a_planted_difference_is_caught(compared: dict[str, tuple[dict[str, Any], Reading]]) -> None:
    """The comparison itself can fail: a changed byte, shape or sharing is reported."""
    path, (theirs, ours) = next((p, pair) for p, pair in compared.items() if Path(p).name == "tied_lm.pt")
    assert _mismatches(theirs, ours) == []
    name = next(name for name, leaf in ours.leaves.items() if leaf["tensor"])
    for field, value in (("sha256", "0" * 64), ("shape", [1]), ("dtype", "int8")):
        changed = {**ours.leaves, name: {**ours.leaves[name], field: value}}
        assert any(field in p for p in _mismatches(theirs, Reading(True, "", changed, ours.storages)))
    split = {n: f"alone-{n}" for n in ours.storages}
    assert "names share storages differently" in _mismatches(theirs, Reading(True, "", ours.leaves, split))


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1]))
