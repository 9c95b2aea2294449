"""Discovery and folder reading under attack: links that loop, lead outside or cannot be followed,
unreadable entries, names that are not UTF-8, trees too deep to recurse, invalid globs, hub caches
whose blobs folder is a link, and metadata files too large or too deep to parse.

Each bad entry is one line and exit 2 for that path while the other paths are still audited; runs
that need real limits (an address-space cap, permissions that hold for root) are real processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import Corpus
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from test_hostile import _limit_child, _permissions_hold
from test_sarif import validate

from tieaudit.cli.main import main
from tieaudit.core.errors import InputError, UnsafeInputError, UsageError
from tieaudit.core.escape import printable
from tieaudit.core.globs import MAX_GLOB_LENGTH, compile_glob, glob_matches
from tieaudit.formats import hf_dir
from tieaudit.formats.hf_dir import load_json
from tieaudit.formats.hf_reader import HfDirReader
from tieaudit.gate.discover import discover
from tieaudit.rules.policy import load_policy

TIMEOUT = 120


def write_model(path: Path, copy: bool = True, seed: int = 0) -> Path:
    """A two-matrix safetensors file; with copy, the head is a byte copy of the embedding (TIE001);
    another seed, another model (one seed twice under one folder is one model twice: TIE012)."""
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((64, 32)).astype(np.float32)
    head = embedding.copy() if copy else rng.standard_normal((64, 32)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": embedding, "lm_head.weight": head}, str(path))
    return path


def run_cli(args: list[str], cwd: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[bytes]:
    """tieaudit in a real process, capped like the hostile corpus runs (2 GiB of address space; as
    root, without the capabilities that bypass file permissions)."""
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", *args],
        cwd=cwd,
        capture_output=True,
        timeout=timeout,
        preexec_fn=_limit_child,
        check=False,
    )


def error_lines(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    stderr = done.stderr.decode("utf-8", "backslashreplace")
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert all(line.startswith("tieaudit: ") for line in lines), stderr
    return lines


def names(paths: list[str], root: Path) -> list[str]:
    return [Path(p).relative_to(root).as_posix() for p in paths]


# --- walking a folder ---------------------------------------------------------------------------


def test_unfollowable_links_are_one_error_each_and_the_rest_is_audited(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root / "good.safetensors")
    (root / "self.pt").symlink_to("self.pt")
    (root / "ping.pt").symlink_to("pong.pt")
    (root / "pong.pt").symlink_to("ping.pt")
    (root / "long.safetensors").symlink_to("x" * 4000)  # ENAMETOOLONG when followed
    (root / "sub").mkdir()
    (root / "sub" / "up").symlink_to("..")  # a folder loop: links to folders are never followed
    found = discover([str(root)])
    assert names([t.path for t in found.targets], root) == ["good.safetensors"]
    errors = {Path(e.path).name: e.message for e in found.errors}
    assert sorted(errors) == ["long.safetensors", "ping.pt", "pong.pt", "self.pt"]
    assert "File name too long" in errors["long.safetensors"]
    assert all("link that cannot be followed" in message for message in errors.values())

    done = run_cli(["check", "models", "--jobs", "1", "--format", "json", "-o", "r.json"], tmp_path)
    assert done.returncode == 2
    *lines, closing = error_lines(done)  # the closing line last, with -o and json too
    assert len(lines) == 4 and all(line.startswith("tieaudit: error: models/") for line in lines)
    assert closing.startswith("tieaudit: 1 checkpoint, 1 failing, 4 errors, ")
    document = json.loads((tmp_path / "r.json").read_text())
    assert [r["path"] for r in document["reports"]] == ["models/good.safetensors"]
    assert len(document["errors"]) == 4


def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path: Path) -> None:
    model = write_model(tmp_path / "model.safetensors").read_bytes()
    root = tmp_path / "deep"
    root.mkdir()
    depth = 1500  # 3000 characters of path: under PATH_MAX, past Python's recursion limit
    folders = [os.path.join(str(root), *["d"] * level) for level in range(1, depth + 1)]
    bottom = os.path.join(folders[-1], "bottom.safetensors")
    try:
        for folder in folders:
            os.mkdir(folder)
        with open(bottom, "wb") as handle:
            handle.write(model)
        found = discover([str(root)])
        assert not found.errors
        assert [t.path for t in found.targets] == [bottom]
    finally:  # pytest's own clean-up recurses once per level: remove the tree here
        if os.path.exists(bottom):
            os.unlink(bottom)
        for folder in reversed(folders):
            if os.path.isdir(folder):
                os.rmdir(folder)


def test_links_to_files_outside_the_folder_searched_are_errors(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root / ".store" / "kept.safetensors")  # a hidden folder: found only through the link
    (root / "inside.safetensors").symlink_to(".store/kept.safetensors")
    write_model(tmp_path / "elsewhere" / "secret.safetensors")
    (root / "escape.safetensors").symlink_to("../elsewhere/secret.safetensors")
    found = discover([str(root)])
    assert names([t.path for t in found.targets], root) == ["inside.safetensors"]
    assert [(Path(e.path).name, e.message) for e in found.errors] == [
        ("escape.safetensors", "is a link to a file outside the folder searched; name it on the command "
         "line to audit it"),
    ]  # fmt: skip
    named = discover([str(root / "escape.safetensors")])  # named on the command line: audited
    assert [t.path for t in named.targets] == [str(root / "escape.safetensors")] and not named.errors


def test_unreadable_entries_are_one_error_each(tmp_path: Path) -> None:
    if not _permissions_hold():
        pytest.skip("running as root without CAP_SETPCAP: chmod 000 cannot stop this root's reads")
    root = tmp_path / "models"
    write_model(root / "good.safetensors")
    write_model(root / "locked" / "a.safetensors")
    write_model(root / "unsearchable" / "b.safetensors")
    (root / "unsearchable" / "c.safetensors").symlink_to("b.safetensors")
    (root / "locked").chmod(0)
    (root / "unsearchable").chmod(0o644)  # names listed, entries not reachable
    try:
        done = run_cli(["check", "models", "--jobs", "1", "--format", "json", "-o", "r.json"], tmp_path)
    finally:
        (root / "locked").chmod(0o755)
        (root / "unsearchable").chmod(0o755)
    assert done.returncode == 2
    *lines, closing = error_lines(done)
    assert closing.startswith("tieaudit: 1 checkpoint, 1 failing, 3 errors, ")
    assert sorted(lines) == [
        "tieaudit: error: models/locked: cannot list folder: Permission denied",
        "tieaudit: error: models/unsearchable/b.safetensors: cannot read: Permission denied",
        "tieaudit: error: models/unsearchable/c.safetensors: a link that cannot be followed: "
        "Permission denied",
    ]
    document = json.loads((tmp_path / "r.json").read_text())
    assert [r["path"] for r in document["reports"]] == ["models/good.safetensors"]


NOT_UTF8 = os.fsdecode(b"\xff\x1b[31mbad\n.safetensors")
"""A file name with a byte that is not UTF-8, an escape sequence and a newline."""


def test_names_that_are_not_utf8_are_audited_baselined_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_model(root / NOT_UTF8)
    write_model(root / "plain.safetensors", copy=False, seed=1)
    args = ["check", "models", "--jobs", "1"]
    done = run_cli([*args, "--format", "json", "-o", "r.json", "--write-baseline", "b.json"], tmp_path)
    assert done.returncode == 0, done.stderr
    error_lines(done)
    report = json.loads((tmp_path / "r.json").read_bytes().decode("utf-8"))
    assert [r["path"] for r in report["reports"]] == ["models/plain.safetensors", f"models/{NOT_UTF8}"]
    assert [f["rule"] for f in report["reports"][1]["findings"]] == ["TIE001"]
    baseline = json.loads((tmp_path / "b.json").read_bytes().decode("utf-8"))  # strict UTF-8 text
    assert [f["path"] for f in baseline["findings"]] == [f"models/{NOT_UTF8}"]
    accepted = run_cli([*args, "--baseline", "b.json", "--format", "json", "-o", "r2.json"], tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads((tmp_path / "r2.json").read_text())["summary"]["baselined"] == 1

    sarif = run_cli([*args, "--format", "sarif", "-o", "s.sarif"], tmp_path)
    assert sarif.returncode == 1, sarif.stderr
    document = json.loads((tmp_path / "s.sarif").read_bytes().decode("utf-8"))
    validate(document)
    (result,) = document["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "models/%FF%1B%5B31mbad%0A.safetensors", "uriBaseId": "%SRCROOT%"}
    assert result["properties"]["checkpoint"] == printable(f"models/{NOT_UTF8}")


# --- globs --------------------------------------------------------------------------------------


def test_an_invalid_exclude_glob_is_one_usage_line_before_any_walk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "models"
    write_model(root / "a.safetensors")
    (root / "loop.pt").symlink_to("loop.pt")  # would be an error line if the folder were walked
    assert main(["check", str(root), "--exclude", "*.onnx", "--exclude", "[z-a]"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "tieaudit: error: --exclude: invalid glob '[z-a]': range z-a is reversed "
        "(write the lower end first)\n"
    )
    with pytest.raises(UsageError, match="longer than"):
        discover([str(root)], ["*" * (MAX_GLOB_LENGTH + 1)])


def test_an_invalid_policy_glob_is_refused_when_the_policy_is_read(tmp_path: Path) -> None:
    policy = tmp_path / "tieaudit.toml"
    policy.write_text('[[path]]\nglob = "*.pt"\n[[path]]\nglob = "models/[z-a]/*"\nfail-on = "error"\n')
    with pytest.raises(UsageError, match=re.escape("[[path]] #2: invalid glob 'models/[z-a]/*'")):
        load_policy(str(policy))


@pytest.mark.parametrize("pattern", ["a[--]", "[a&&b]", "[x||y]", "[~~]", "[[:alpha:]]", "[\\-a]", "[!]"])
def test_no_pattern_makes_a_regex_error_or_warning(pattern: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re's FutureWarning on nested sets would reach stderr
        compile_glob(pattern)


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("[]]x", "]x", True),  # a ']' first in a class is a member
        ("[!]]x", "]x", False),
        ("[!]]x", "ax", True),
        ("[!]", "[!]", True),  # no closing bracket: literal
        ("a[--]", "a-", True),
        ("[a&&b]", "&", True),
        ("[+--]", ",", True),  # the range + to -
    ],
)
def test_edge_classes(pattern: str, path: str, matches: bool) -> None:
    assert glob_matches(pattern, path) is matches


def _old_glob_regex(pattern: str) -> re.Pattern[str] | None:
    """The translation tieaudit used before classes were rebuilt member by member (None: it failed,
    warned, or mis-read a class whose first member is ']')."""
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            members = (body[1:] if negate else body).replace("\\", "\\\\").replace("[", "\\[")
            if not members:
                return None
            parts.append("[" + ("^" if negate else "") + members + "]")
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return re.compile("".join(parts) + r"\Z")
    except (re.error, FutureWarning):
        return None


@settings(max_examples=400, deadline=None)
@given(
    pattern=st.text(alphabet="ab/*?[]!^-z\\.", min_size=1, max_size=12),
    paths=st.lists(st.text(alphabet="ab/z-.]![\\^", max_size=10), min_size=1, max_size=8),
)
def test_valid_patterns_keep_their_meaning(pattern: str, paths: list[str]) -> None:
    old = _old_glob_regex(pattern.rstrip("/"))
    assume(old is not None)
    assert old is not None
    for path in paths:
        expected = bool(old.match(path) or old.match(path.rsplit("/", 1)[-1]))
        assert glob_matches(pattern, path) is expected, (pattern, path)


# --- policy and baseline files, in capped processes -----------------------------------------------


def test_a_huge_sparse_policy_or_baseline_is_refused_before_reading(tmp_path: Path) -> None:
    write_model(tmp_path / "m.safetensors")
    for name in ("policy.toml", "baseline.json"):
        with open(tmp_path / name, "wb") as handle:
            handle.truncate(3 << 29)  # 1.5 GiB, no disk used
    policy = run_cli(["check", "m.safetensors", "--policy", "policy.toml"], tmp_path)
    assert policy.returncode == 2
    assert error_lines(policy) == [
        "tieaudit: error: policy.toml: cannot read policy: policy.toml is 1.5 GiB, over the 4.0 MiB "
        "limit (MAX_POLICY_BYTES)"
    ]
    baseline = run_cli(["check", "m.safetensors", "--baseline", "baseline.json"], tmp_path)
    assert baseline.returncode == 2
    assert error_lines(baseline) == [
        "tieaudit: error: baseline.json: cannot read baseline: baseline.json is 1.5 GiB, over the 256.0 MiB "
        "limit (MAX_BASELINE_BYTES)"
    ]


def test_a_fifo_as_policy_or_baseline_is_refused_without_blocking(tmp_path: Path) -> None:
    write_model(tmp_path / "m.safetensors")
    os.mkfifo(tmp_path / "fifo")
    for option in ("--policy", "--baseline"):
        done = run_cli(["check", "m.safetensors", option, "fifo"], tmp_path, timeout=60)
        assert done.returncode == 2
        (line,) = error_lines(done)
        assert line.startswith("tieaudit: error: fifo: cannot read ") and line.endswith("not a regular file")


# --- Hugging Face folders: hub caches and metadata files ------------------------------------------


def hub_snapshot(corpus: Corpus, tmp_path: Path) -> Path:
    """A hub cache layout of hf_llama_tied: snapshot files are links into the repository's blobs."""
    repo = tmp_path / "hub" / "models--x--y"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for source in corpus.path("hf_llama_tied").iterdir():
        shutil.copy(source, blobs / f"sha-{source.name}")
        (snapshot / source.name).symlink_to(Path("../../blobs") / f"sha-{source.name}")
    return snapshot


def test_a_hub_snapshot_whose_blobs_folder_is_a_link_to_root_is_refused(
    corpus: Corpus, tmp_path: Path
) -> None:
    snapshot = hub_snapshot(corpus, tmp_path)
    with HfDirReader().read(str(snapshot)) as opened:  # the real layout reads
        assert "model.embed_tokens.weight" in opened.checkpoint.names
    repo = snapshot.parent.parent
    outside = tmp_path / "outside"
    shutil.move(repo / "blobs", outside)  # the blobs now live outside the repository...
    (repo / "blobs").symlink_to("/", target_is_directory=True)  # ...reached through blobs -> /
    for link in snapshot.iterdir():
        target = outside / Path(os.readlink(link)).name
        link.unlink()
        link.symlink_to("../../blobs" + str(target))
    with pytest.raises(UnsafeInputError, match="outside the model folder"):
        HfDirReader().read(str(snapshot))
    assert main(["inspect", str(snapshot)]) == 2
    out = tmp_path / "retied"
    assert main(["retie", str(snapshot), str(out)]) == 2
    assert not out.exists()


def test_a_snapshot_reached_through_a_link_still_reads_its_blobs(corpus: Corpus, tmp_path: Path) -> None:
    snapshot = hub_snapshot(corpus, tmp_path)
    (tmp_path / "model").symlink_to(snapshot, target_is_directory=True)
    with HfDirReader().read(str(tmp_path / "model")) as opened:
        checkpoint = opened.checkpoint
        assert "model.embed_tokens.weight" in checkpoint.names


def test_a_snapshot_file_linking_into_another_repositorys_blobs_is_refused(
    corpus: Corpus, tmp_path: Path
) -> None:
    snapshot = hub_snapshot(corpus, tmp_path)
    other = tmp_path / "hub" / "models--other" / "blobs"
    other.mkdir(parents=True)
    shutil.copy(corpus.path("hf_llama_tied") / "model.safetensors", other / "sha-x")
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to("../../../models--other/blobs/sha-x")
    with pytest.raises(UnsafeInputError, match="outside the model folder"):
        HfDirReader().read(str(snapshot))


def model_folder(corpus: Corpus, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(corpus.path("hf_llama_tied"), folder)
    return folder


@pytest.mark.parametrize(
    ("name", "limit"),
    [("config.json", "MAX_CONFIG_BYTES"), ("model.safetensors.index.json", "MAX_INDEX_BYTES")],
)
def test_oversized_config_or_index_is_an_error_before_reading(
    corpus: Corpus, tmp_path: Path, name: str, limit: str
) -> None:
    folder = model_folder(corpus, tmp_path)
    with open(folder / name, "wb") as handle:
        handle.truncate(getattr(hf_dir, limit) + 1)
    with pytest.raises(InputError, match=rf"{re.escape(name)} is [\d.]+ MiB, over the .* limit \({limit}\)"):
        load_json(str(folder), name)


def test_oversized_tokenizer_is_a_note(corpus: Corpus, tmp_path: Path) -> None:
    folder = model_folder(corpus, tmp_path)
    with open(folder / "tokenizer.json", "wb") as handle:
        handle.truncate(hf_dir.MAX_TOKENIZER_BYTES + 1)
    with HfDirReader().read(str(folder)) as opened:
        checkpoint = opened.checkpoint
        (note,) = checkpoint.skipped
        assert note.name == "tokenizer.json" and "(MAX_TOKENIZER_BYTES)" in note.reason
        assert checkpoint.config is not None and checkpoint.config.tokenizer_vocab_size is None


def test_json_nested_a_million_deep_is_one_line(corpus: Corpus, tmp_path: Path) -> None:
    folder = model_folder(corpus, tmp_path)
    (folder / "config.json").write_bytes(b"[" * 10**6 + b"]" * 10**6)
    deep = r"config.json is not valid JSON \(arrays or objects nested too deeply\)"
    with pytest.raises(InputError, match=deep):
        load_json(str(folder), "config.json")


def test_json_nested_past_the_depth_limit_is_refused(corpus: Corpus, tmp_path: Path) -> None:
    folder = model_folder(corpus, tmp_path)
    depth = hf_dir.MAX_JSON_DEPTH
    (folder / "config.json").write_text("[" * depth + "]" * depth)
    assert load_json(str(folder), "config.json") == json.loads("[" * depth + "]" * depth)
    (folder / "config.json").write_text("[" * (depth + 1) + "]" * (depth + 1))
    with pytest.raises(InputError, match=f"nests arrays or objects deeper than {depth} levels"):
        load_json(str(folder), "config.json")


@pytest.mark.parametrize("shard", ["x\u0000.safetensors", "\ud800.safetensors"])
def test_index_names_no_file_can_have_are_refused(corpus: Corpus, tmp_path: Path, shard: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    index = {"metadata": {}, "weight_map": {"a": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="is not a valid file name"):
        HfDirReader().read(str(folder))
