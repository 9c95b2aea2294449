"""A Hugging Face repository as people publish it: discovery audits everything in it, names what it
skips and why, and the messages users meet (LFS pointers, a truncated shard, ONNX external data)
say what is wrong and where.

The repository is built once from real producers: ``save_pretrained`` of a tied tiny GPT-2, an
``onnx/model.onnx`` exported from it by the TorchScript exporter (which stores a transposed copy of
the embedding) with its external data, a ``model.fp16.safetensors`` variant whose head is a clone
(``safetensors.torch.save_file``), a Lightning-style ``last.ckpt`` and a ``model_best.pth.tar``
(``torch.save``), a tied GGUF file (``gguf.GGUFWriter``, no ``output.weight``), a Git LFS pointer,
a README and a ``.gitattributes``. Every command
runs through the real CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import Corpus
from onnx import numpy_helper
from test_discover import hub_snapshot

from tieaudit.cli.main import main
from tieaudit.formats.hf_covered import covered_files
from tieaudit.formats.torch_tar_walk import NO_STORAGES
from tieaudit.gate.discover import discover
from tieaudit.gate.files import HIDDEN, OUTSIDE_FOLDER
from tieaudit.gate.hidden import searched_folder

VOCAB, WIDTH = 100, 32
LFS_TEXT = f"version https://git-lfs.github.com/spec/v1\noid sha256:{'ab' * 32}\nsize 123456\n"
LFS = "Git LFS pointer, not the weights: run `git lfs pull`"


def tiny_gpt2() -> Any:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=1, n_head=2, n_positions=16)
    return transformers.GPT2LMHeadModel(config).eval()


def export_onnx(model: Any, path: Path, location: str) -> None:
    """torch.onnx.export(dynamo=False) of the model's logits, external data saved to location."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids).logits

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        ids = torch.zeros((1, 8), dtype=torch.int64)
        torch.onnx.export(
            Logits(), (ids,), str(path), dynamo=False, input_names=["ids"], output_names=["logits"]
        )
    proto = onnx.load(str(path))
    onnx.save_model(proto, str(path), save_as_external_data=True, location=location, size_threshold=0)


def write_tied_gguf(path: Path, embedding: np.ndarray) -> None:
    """A GPT-2 GGUF as llama.cpp's converter writes a tied model: no output.weight."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_vocab_size(VOCAB)
    writer.add_tensor("token_embd.weight", embedding)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("hub") / "repo"
    model = tiny_gpt2()
    model.save_pretrained(root)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    save_file({name: tensor.half() for name, tensor in state.items()}, str(root / "model.fp16.safetensors"))
    (root / "onnx").mkdir()
    export_onnx(model, root / "onnx" / "model.onnx", "model.onnx_data")
    torch.save({"state_dict": model.state_dict(), "epoch": 3, "global_step": 30}, root / "last.ckpt")
    torch.save(model.state_dict(), root / "model_best.pth.tar")
    write_tied_gguf(root / "model.gguf", state["transformer.wte.weight"].numpy())
    (root / "model.bf16.safetensors").write_text(LFS_TEXT)  # a variant never pulled
    (root / "README.md").write_text("# tiny\n")
    (root / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    return root


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def transposed_copy(onnx_path: Path) -> list[str]:
    """The embedding and the initializer the TorchScript exporter stored as its transpose, found here."""
    proto = onnx.load(str(onnx_path))
    arrays = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    ((name, embedding),) = [(n, a) for n, a in arrays.items() if n.endswith("transformer.wte.weight")]
    (copy,) = [n for n, a in arrays.items() if a.shape == (WIDTH, VOCAB) and np.array_equal(a, embedding.T)]
    return sorted([name, copy])


# --- check of the repository ------------------------------------------------------------------


def test_check_audits_the_onnx_export_and_the_variant_beside_the_model(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.parent)
    code, out, err = cli(["check", "repo", "--jobs", "1", "--format", "json", "-o", "r.json"], capsys)
    assert code == 1, err
    document = json.loads((repo.parent / "r.json").read_text())
    findings = {
        r["path"]: [
            (f["rule"], sorted(f["names"]), f["relation"]) for f in r["findings"] if f["rule"] != "TIE012"
        ]
        for r in document["reports"]
    }
    across = {  # the one model again, in every other format: each names the file first holding it
        r["path"]: f["details"]["copy_of"]
        for r in document["reports"]
        for f in r["findings"]
        if f["rule"] == "TIE012"
    }
    assert across == {
        "repo/last.ckpt": "repo/model.safetensors",
        "repo/model.gguf": "repo/model.safetensors",
        "repo/model_best.pth.tar": "repo/model.safetensors",
        "repo/onnx/model.onnx": "repo/model.safetensors",
    }
    assert findings == {
        "repo": [],
        "repo/last.ckpt": [],
        "repo/model.fp16.safetensors": [("TIE001", ["lm_head.weight", "transformer.wte.weight"], "equal")],
        "repo/model.gguf": [],
        "repo/model_best.pth.tar": [],
        "repo/onnx/model.onnx": [
            (
                "TIE001",
                transposed_copy(repo / "onnx" / "model.onnx"),
                "transposed",
            )
        ],
    }
    wasted = {
        r["path"]: sum(f["wasted_bytes"] for f in r["findings"] if f["rule"] != "TIE012")
        for r in document["reports"]
    }
    assert wasted["repo/model.fp16.safetensors"] == VOCAB * WIDTH * 2  # float16
    assert wasted["repo/onnx/model.onnx"] == VOCAB * WIDTH * 4
    assert document["errors"] == []


def test_the_closing_line_counts_skipped_files_by_reason(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.parent)
    code, out, err = cli(["check", "repo", "--jobs", "1"], capsys)
    assert code == 1
    status = [line.split("  (")[0] for line in out.splitlines() if not line.startswith(" ")]
    assert status == [
        "ok   repo",
        "ok   repo/last.ckpt",
        "FAIL repo/model.fp16.safetensors",
        "ok   repo/model.gguf",
        "ok   repo/model_best.pth.tar",
        "FAIL repo/onnx/model.onnx",
    ]
    assert "ok   repo  (hf-dir, 16 tensors, 64.4 KiB; covers config.json, model.safetensors)" in out
    assert "; covers model.onnx_data)" in out  # the ONNX line names its external data
    assert err.splitlines() == [
        "tieaudit: 6 checkpoints, 2 failing, 0 errors, 218.8 KiB wasted; 4 files skipped "
        f"(2 not a checkpoint format; 1 {LFS}; 1 hidden (its name starts with '.'))"
    ]


EXPECTED_FILES = [
    ("repo/.gitattributes", "skipped", "hidden (its name starts with '.')", None),
    ("repo/README.md", "skipped", "not a checkpoint format", None),
    ("repo/config.json", "covered", "read with the model folder repo", "repo"),
    ("repo/generation_config.json", "skipped", "not a checkpoint format", None),
    ("repo/last.ckpt", "audited", None, "repo/last.ckpt"),
    ("repo/model.bf16.safetensors", "skipped", LFS, None),
    ("repo/model.fp16.safetensors", "audited", None, "repo/model.fp16.safetensors"),
    ("repo/model.gguf", "audited", None, "repo/model.gguf"),
    ("repo/model.safetensors", "covered", "read with the model folder repo", "repo"),
    ("repo/model_best.pth.tar", "audited", None, "repo/model_best.pth.tar"),
    ("repo/onnx/model.onnx", "audited", None, "repo/onnx/model.onnx"),
    (
        "repo/onnx/model.onnx_data",
        "covered",
        "ONNX external data of repo/onnx/model.onnx",
        "repo/onnx/model.onnx",
    ),
]
"""Every file of the repository with its verdict, reason and target, in walk order (by name)."""


def test_show_files_lists_every_file_with_its_verdict(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.parent)
    on_disk = sorted(p.relative_to(repo.parent).as_posix() for p in repo.rglob("*") if p.is_file())
    assert on_disk == sorted(path for path, *_ in EXPECTED_FILES)  # nothing left out
    code, out, _ = cli(["check", "repo", "--jobs", "1", "--show-files"], capsys)
    assert code == 1
    listing = out.split("\nfiles: ", 1)[1].splitlines()
    assert listing[0] == "5 audited, 3 covered, 4 skipped, 0 errors"
    expected = [
        f"{verdict:<8} {path}" + (f"  ({reason})" if reason and verdict != "audited" else "")
        for path, verdict, reason, _ in EXPECTED_FILES
    ]
    assert listing[1:] == expected


def test_json_files_field(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.parent)
    code, out, _ = cli(["check", "repo", "--jobs", "2", "--format", "json"], capsys)
    assert code == 1
    files = json.loads(out)["files"]
    assert [(f["path"], f["verdict"], f["reason"], f["target"]) for f in files] == EXPECTED_FILES
    code, out, _ = cli(["check", "repo/model.fp16.safetensors", "--format", "json"], capsys)
    report = json.loads(out)  # one file: the report/1 shape, with the field added
    assert report["schema"] == "tieaudit.report/1"
    assert report["files"] == [  # a variant beside config.json is read with it, as from_pretrained does
        {
            "path": "repo/model.fp16.safetensors",
            "verdict": "audited",
            "reason": None,
            "target": "repo/model.fp16.safetensors",
        },
        {
            "path": "repo/config.json",
            "verdict": "covered",
            "reason": "read with repo/model.fp16.safetensors",
            "target": "repo/model.fp16.safetensors",
        },
    ]


def test_covered_files_follow_the_readers_choice(repo: Path, tmp_path: Path) -> None:
    assert covered_files(str(repo)) == {"config.json", "model.safetensors"}  # not the variants
    sharded = tmp_path / "sharded"
    tiny_gpt2().save_pretrained(sharded, max_shard_size="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    assert covered_files(str(sharded)) == {"config.json", "model.safetensors.index.json", *shards}
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(sharded / "tokenizer.json"))
    assert covered_files(str(sharded)) == {
        "config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        *shards,
    }


# --- inspect of folders -------------------------------------------------------------------------


def test_inspect_of_a_folder_of_checkpoints_lists_what_check_audits(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    (plain / "old").mkdir(parents=True)
    for name in ("last.ckpt", "model_best.pth.tar", "model.fp16.safetensors", "README.md"):
        shutil.copy(repo / name, plain / name)
    shutil.copy(repo / "last.ckpt", plain / "old" / "epoch-1.ckpt")
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["inspect", "plain"], capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "tieaudit: error: plain: not one model (no config.json or shard index beside weights); "
        "`tieaudit check plain` audits the 4 checkpoints under it:",
        "tieaudit:   plain/last.ckpt",
        "tieaudit:   plain/model.fp16.safetensors",
        "tieaudit:   plain/model_best.pth.tar",
        "tieaudit:   plain/old/epoch-1.ckpt",
    ]
    (tmp_path / "empty").mkdir()
    code, _, err = cli(["inspect", "empty"], capsys)
    assert code == 2
    assert err == (
        "tieaudit: error: empty: no weights found: not one model (no config.json or shard index beside "
        "weights), and no checkpoint under it\n"
    )


def test_inspect_of_the_model_folder_says_what_else_check_audits(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.parent)
    code, out, err = cli(["inspect", "repo"], capsys)
    assert code == 0
    assert out.startswith("repo  format hf-dir  16 tensors")
    assert err == "tieaudit: 5 other checkpoints in repo are audited by `tieaudit check repo`\n"


# --- messages -----------------------------------------------------------------------------------


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tieaudit", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, check=False)


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_an_lfs_pointer_named_is_one_line_and_exit_2(repo: Path, command: str) -> None:
    done = run([command, "repo/model.bf16.safetensors"], repo.parent)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"tieaudit: error: repo/model.bf16.safetensors: {LFS}\n"


def test_a_tied_gguf_file_is_audited_with_the_loaders_tie(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(["inspect", str(repo / "model.gguf"), "--format", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["findings"] == [] and report["gguf"]["head"] == "falls-back"
    assert [(t["target"], t["source"], t["declared_by"]) for t in report["declared_ties"]] == [
        ("output.weight", "token_embd.weight", "loader")
    ]


def test_a_folder_of_lfs_pointers_is_nothing_scanned_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("a.safetensors", "b.pt"):
        (clone / name).write_text(LFS_TEXT)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(["check", "clone"], capsys)
    assert code == 2
    assert err == f"tieaudit: error: nothing scanned: no checkpoints under clone (2 files are {LFS})\n"


def sharded_folder(tmp_path: Path) -> tuple[Path, str]:
    """save_pretrained with small shards; the second shard's name, read from the index."""
    folder = tmp_path / "sharded"
    tiny_gpt2().save_pretrained(folder, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    return folder, shard


def test_a_truncated_shard_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, shard = sharded_folder(tmp_path)
    data = (folder / shard).read_bytes()
    (folder / shard).write_bytes(data[: len(data) - 100])
    monkeypatch.chdir(tmp_path)
    for command in ("check", "inspect"):
        code, out, err = cli([command, "sharded"], capsys)
        assert code == 2 and out == ""
        (line,) = [line for line in err.splitlines() if line.startswith("tieaudit: error: ")]
        separator = ": " if command == "check" else "/"  # check: the folder, then the shard in it
        assert line.startswith(f"tieaudit: error: sharded{separator}{shard}: truncated"), line


def test_an_lfs_pointer_shard_fails_the_folder_or_is_skipped_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, shard = sharded_folder(tmp_path)
    (folder / shard).write_text(LFS_TEXT)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(["check", "sharded"], capsys)
    assert code == 2
    assert f"tieaudit: error: sharded: {shard}: {LFS}" in err.splitlines()
    code, out, err = cli(["check", "sharded", "--skip-lfs-pointers"], capsys)
    assert code == 0 and out == ""
    assert err.splitlines()[0] == f"tieaudit: note: sharded: {shard}: {LFS} (skipped: --skip-lfs-pointers)"


@pytest.fixture(scope="module")
def onnx_bin(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's ONNX export re-saved as optimum-style exporters do, with its bytes in
    ``weights.bin`` beside it, and once more with them in ``data/weights.bin`` below it."""
    root = tmp_path_factory.mktemp("onnx-bin")
    (root / "nested" / "data").mkdir(parents=True)
    for path, location in (("model.onnx", "weights.bin"), ("nested/model.onnx", "data/weights.bin")):
        proto = onnx.load(str(repo / "onnx" / "model.onnx"))  # saving moves the bytes out: a fresh copy each
        onnx.save_model(proto, str(root / path), save_as_external_data=True, location=location)
    return root


def test_an_onnx_external_data_bin_named_is_explained(onnx_bin: Path) -> None:
    beside = run(["check", "weights.bin"], onnx_bin)
    assert beside.returncode == 2
    assert beside.stderr == (
        "tieaudit: error: weights.bin: is external data of model.onnx (referenced by its initializers); "
        "audit model.onnx\n"
    )
    below = run(["inspect", "nested/data/weights.bin"], onnx_bin)
    assert below.returncode == 2
    assert below.stderr == (
        "tieaudit: error: nested/data/weights.bin: is external data of nested/model.onnx (referenced by its "
        "initializers); audit nested/model.onnx\n"
    )


def test_external_data_named_with_its_model_is_covered(onnx_bin: Path) -> None:
    done = run(["check", "model.onnx", "weights.bin", "--show-files", "--jobs", "1"], onnx_bin)
    assert done.returncode == 1, done.stderr  # the transposed copy, and no error for weights.bin
    assert "audited  model.onnx" in done.stdout.splitlines()
    assert "covered  weights.bin  (ONNX external data of model.onnx)" in done.stdout.splitlines()
    walked = run(["check", ".", "--show-files", "--jobs", "1"], onnx_bin)
    assert walked.returncode == 1, walked.stderr
    assert (
        "covered  nested/data/weights.bin  (ONNX external data of nested/model.onnx)"
        in walked.stdout.splitlines()
    )


def test_a_hub_snapshots_other_files_link_into_its_blobs_and_are_audited(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = hub_snapshot(corpus, tmp_path)  # every file a link into the repository's blobs
    blobs = snapshot.parent.parent / "blobs"
    shutil.copy(corpus.path("st_cloned_head"), blobs / "sha-variant")
    (snapshot / "model.fp16.safetensors").symlink_to("../../blobs/sha-variant")
    code, out, err = cli(["check", str(snapshot), "--jobs", "1", "--format", "json"], capsys)
    assert code == 0, err  # no link is an error; the variant is read with config.json, which ties
    document = json.loads(out)  # its copy on load (a copy of a declared tie costs bytes, no tie)
    assert document["errors"] == [] and document["reports"][1]["findings"][0]["rule"] == "TIE001"
    assert [r["path"] for r in document["reports"]] == [
        str(snapshot),
        str(snapshot / "model.fp16.safetensors"),
    ]
    verdicts = {Path(f["path"]).name: f["verdict"] for f in document["files"]}
    assert verdicts == {
        "config.json": "covered",
        "generation_config.json": "skipped",
        "model.fp16.safetensors": "audited",
        "model.safetensors": "covered",
    }


def test_every_file_not_audited_gets_its_reason(tmp_path: Path) -> None:
    import tarfile

    from safetensors.numpy import save_file

    tree = tmp_path / "tree"
    (tree / ".cache").mkdir(parents=True)
    (tree / "legacy").mkdir()
    weights = {"a": np.arange(512, dtype=np.float32)}
    save_file(weights, str(tree / "model.safetensors"))
    save_file(weights, str(tree / ".cache" / "hidden.safetensors"))
    save_file(weights, str(tree / "legacy" / "old.safetensors"))
    np.save(tree / "weights.npy", weights["a"])
    np.savez(tree / "arrays.npz", a=weights["a"])
    with tarfile.open(tree / "data.tar", "w") as archive:
        archive.add(tree / "weights.npy", arcname="weights.npy")
    (tmp_path / "elsewhere.json").write_text("{}")
    (tree / "outside.json").symlink_to("../elsewhere.json")
    (tree / "up").symlink_to("..", target_is_directory=True)
    found = discover([str(tree)], ["legacy/**"])
    assert [Path(t.path).name for t in found.targets] == ["model.safetensors"] and not found.errors
    listed = [
        (
            Path(f.path).relative_to(tree).as_posix() + ("/" if f.path.endswith("/") else ""),
            f.verdict,
            f.reason,
        )
        for f in found.files
    ]
    assert listed == [
        (".cache/", "skipped", searched_folder(HIDDEN)),  # searched for code only: none found
        ("arrays.npz", "skipped", "NumPy .npz archive: recognised, not supported yet"),
        ("data.tar", "skipped", NO_STORAGES),  # a .tar (PAX, as tarfile writes) holding no torch.save data
        ("legacy/old.safetensors", "skipped", "excluded by --exclude legacy/**"),  # the folder is entered
        ("model.safetensors", "audited", ""),
        ("outside.json", "skipped", "a link to a file outside the folder searched"),
        ("up/", "skipped", searched_folder(OUTSIDE_FOLDER)),  # leads outside: searched for code
        ("weights.npy", "skipped", "NumPy .npy array: recognised, not supported yet"),
    ]
