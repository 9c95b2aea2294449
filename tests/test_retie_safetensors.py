"""retie of safetensors files and Hugging Face folders: round trips through the loaders people use,
bytes saved, records written, and the input untouched when anything fails (a raise or a SIGKILL)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from producers_torch import HIDDEN, VOCAB, ToyLM  # type: ignore[import-not-found]
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file

import tieaudit.repair.retie as retie_module
from tieaudit import load_tied
from tieaudit.cli.main import main
from tieaudit.core.errors import OutputError, UnsafeInputError, UsageError
from tieaudit.repair import BACKUP_SUFFIX
from tieaudit.repair.retie import retie
from tieaudit.repair.st_stream import byte_chunks, header_bytes

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

ALL = frozenset({"equal", "transposed", "cast"})
HEADER_SLACK = 4096
IDS = torch.arange(VOCAB).reshape(4, 64) % VOCAB


def toy_logits(path: Path, tied: bool) -> torch.Tensor:
    model = ToyLM(tied)
    load_model(model, str(path))
    with torch.no_grad():
        return model(IDS)


def hf_model(folder: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder))


def hf_logits(folder: Path) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(folder)(IDS[:, :16]).logits


def digest(path: Path) -> str:
    """sha256 of a file's content, or over a folder's relative paths and contents."""
    if not path.is_dir():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    hasher = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        hasher.update(str(file.relative_to(path)).encode())
        hasher.update(file.read_bytes())
    return hasher.hexdigest()


def size(path: Path) -> int:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )


def rules(path: Path, tmp_path: Path) -> list[str]:
    """The rule ids `tieaudit check PATH` reports."""
    report = tmp_path / "check.json"
    code = main(["check", str(path), "--format", "json", "--output", str(report), "--exit-zero"])
    assert code == 0
    return [f["rule"] for f in json.loads(report.read_text())["findings"]]


def metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def assert_same_values(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name, value in left.items():
        assert value.dtype == right[name].dtype and value.shape == right[name].shape, name
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
        assert torch.equal(value.contiguous().view(bits), right[name].contiguous().view(bits)), name


# --- single safetensors files ---------------------------------------------------------------


def test_cloned_head_becomes_one_tensor(corpus: Any, tmp_path: Path) -> None:
    source, out = corpus.path("st_cloned_head"), tmp_path / "out.safetensors"
    result = retie(str(source), str(out), all_equal=True)  # no record: the loader rule needs the opt-in
    assert [d.dropped for d in result.plan.applied] == ["head.weight"]
    assert torch.equal(toy_logits(source, tied=False), toy_logits(out, tied=True))
    assert sorted(load_file(str(out))) == ["emb.weight", "norm.bias", "norm.weight"]
    assert metadata(out) == {"head.weight": "emb.weight"}
    saved = size(source) - size(out)
    assert abs(saved - VOCAB * HIDDEN * 4) < HEADER_SLACK and result.output_bytes == size(out)
    assert "TIE001" in rules(source, tmp_path) and "TIE001" not in rules(out, tmp_path)
    state = load_tied(str(out))
    assert state["head.weight"] is state["emb.weight"]


@pytest.mark.parametrize("fixture", ["st_save_model_tied", "st_untied_lm"])
def test_nothing_to_retie_writes_nothing(corpus: Any, tmp_path: Path, fixture: str) -> None:
    """Already tied, or no copy at all: no OUT (the input is the answer as it is)."""
    source, out = corpus.path(fixture), tmp_path / "out.safetensors"
    result = retie(str(source), str(out))
    assert result.plan.applied == () and result.nothing_to_retie and result.written is None
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("fixture", "dropped", "saved"),
    [("st_transposed_copy", "proj", 256 * 32 * 4), ("st_cast_copy", "emb_bf16", 256 * 32 * 2)],
)
def test_transposed_and_cast_left_by_default_applied_on_request(
    corpus: Any, tmp_path: Path, fixture: str, dropped: str, saved: int
) -> None:
    source = corpus.path(fixture)
    left = retie(str(source), str(tmp_path / "default.safetensors"))
    assert [d.applied for d in left.plan.decisions] == [False]
    assert "load_tied" in left.plan.decisions[0].reason
    assert left.written is None and os.listdir(tmp_path) == []  # nothing to re-tie: nothing written

    out = tmp_path / "all.safetensors"
    result = retie(str(source), str(out), relations=ALL)
    assert [d.dropped for d in result.plan.applied] == [dropped]
    assert dropped not in load_file(str(out))
    record = json.loads(metadata(out)["tieaudit.ties"])
    assert record[dropped]["source"] == "emb" and dropped not in metadata(out)
    assert abs(size(source) - size(out) - saved) < HEADER_SLACK
    assert "TIE001" not in rules(out, tmp_path)
    assert_same_values(load_file(str(source)), load_tied(str(out)))


def test_transposed_cast_is_refused_not_miswritten(tmp_path: Path) -> None:
    base = torch.randn(64, 48)
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    # "a" (first stored) is kept by default; keeping "zb" makes c a transposed cast of it.
    save_file({"zb": base, "a": base.t().contiguous(), "c": base.t().contiguous().half()}, str(source))
    with pytest.raises(UsageError, match="transposed cast"):
        retie(str(source), str(out), relations=ALL, keep="zb")
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]


def test_byte_chunks_bounded_strided_and_extended_dtypes() -> None:
    strided = np.arange(35 * 17, dtype=np.float32).reshape(35, 17).T
    chunks = list(byte_chunks(strided, chunk_bytes=64))
    assert b"".join(bytes(c) for c in chunks) == np.ascontiguousarray(strided).tobytes()
    assert max(len(c) for c in chunks) <= 35 * 4 * 1  # one row of the transposed view per block
    bf16 = np.linspace(-3, 3, 101, dtype=np.float32).astype(ml_dtypes.bfloat16)
    chunks = list(byte_chunks(bf16, chunk_bytes=30))
    assert max(len(c) for c in chunks) == 30 and b"".join(bytes(c) for c in chunks) == bf16.tobytes()


def test_header_is_padded_to_eight_bytes(corpus: Any) -> None:
    from tieaudit.formats import open_checkpoint

    with open_checkpoint(str(corpus.path("st_cloned_head"))) as opened:
        for count in range(1, 5):
            header = header_bytes(opened.checkpoint.tensors[:count], {"format": "pt"})
            assert len(header) % 8 == 0 and int.from_bytes(header[:8], "little") == len(header) - 8


# --- Hugging Face folders ----------------------------------------------------------------------


def test_hf_cloned_head_retied_in_config(corpus: Any, tmp_path: Path) -> None:
    source, out = corpus.path("hf_llama_cloned_head"), tmp_path / "out"
    result = retie(str(source), str(out))
    assert [(d.kept, d.dropped) for d in result.plan.applied] == [
        ("model.embed_tokens.weight", "lm_head.weight")
    ]
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert json.loads((source / "config.json").read_text())["tie_word_embeddings"] is False
    model = hf_model(out)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(hf_logits(source), hf_logits(out))
    assert (out / "generation_config.json").read_bytes() == (source / "generation_config.json").read_bytes()
    assert abs(size(source) - size(out) - VOCAB * HIDDEN * 4) < HEADER_SLACK
    assert "TIE001" not in rules(out, tmp_path)


def test_hf_sharded_cloned_head(corpus: Any, tmp_path: Path) -> None:
    source, out = tmp_path / "sharded", tmp_path / "out"
    hf_model(corpus.path("hf_llama_cloned_head")).save_pretrained(source, max_shard_size="20KB")
    index = json.loads((source / "model.safetensors.index.json").read_text())
    lm_head_shard = index["weight_map"]["lm_head.weight"]
    retie(str(source), str(out))
    written = json.loads((out / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in written["weight_map"]
    assert written["metadata"]["lm_head.weight"] == "model.embed_tokens.weight"
    assert written["metadata"]["total_size"] == index["metadata"]["total_size"] - VOCAB * HIDDEN * 4
    assert written["metadata"]["total_parameters"] == index["metadata"]["total_parameters"] - VOCAB * HIDDEN
    if lm_head_shard not in written["weight_map"].values():  # a shard holding only the copy is gone
        assert not (out / lm_head_shard).exists()
    assert set(written["weight_map"].values()) == {p.name for p in out.glob("*.safetensors")}
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert torch.equal(hf_logits(source), hf_logits(out))
    assert abs(size(source) - size(out) - VOCAB * HIDDEN * 4) < HEADER_SLACK
    assert "TIE001" not in rules(out, tmp_path)


@pytest.mark.parametrize(
    "fixture", ["hf_gpt2", "hf_gpt2_sharded", "hub_sharded_tied", "hf_t5", "hf_bert_mlm"]
)
def test_hf_folder_without_copies_writes_nothing(corpus: Any, tmp_path: Path, fixture: str) -> None:
    source, out = corpus.path(fixture), tmp_path / "out"
    before = digest(source)
    result = retie(str(source), str(out))
    assert result.plan.applied == () and result.written is None
    assert os.listdir(tmp_path) == [] and digest(source) == before


def test_hf_config_flag_refused_when_it_would_tie_unequal_values(tmp_path: Path) -> None:
    """BERT's flag ties the decoder bias too: setting it for the weight must not tie differing biases."""
    source = tmp_path / "bert"
    source.mkdir()
    words = torch.randn(VOCAB, HIDDEN)
    state = {
        "bert.embeddings.word_embeddings.weight": words,
        "cls.predictions.decoder.weight": words.clone(),
        "cls.predictions.bias": torch.randn(VOCAB),
        "cls.predictions.decoder.bias": torch.randn(VOCAB),
    }
    save_file(state, str(source / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "tie_word_embeddings": False}
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="cls.predictions.decoder.bias"):
        retie(str(source), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_hf_copy_the_class_does_not_tie_is_left_with_a_reason(corpus: Any, tmp_path: Path) -> None:
    """Dropping k_proj (equal to q_proj) would leave transformers to initialise it randomly: the plan
    leaves that copy, says why, and still re-ties what from_pretrained restores."""
    source = tmp_path / "llama"
    shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
    state = load_file(str(source / "model.safetensors"))
    attention = "model.layers.0.self_attn"
    state[f"{attention}.k_proj.weight"] = state[f"{attention}.q_proj.weight"].clone()
    save_file(state, str(source / "model.safetensors"), metadata={"format": "pt"})
    result = retie(str(source), str(tmp_path / "out"))
    by_dropped = {d.dropped: d for d in result.plan.decisions}
    assert by_dropped["lm_head.weight"].applied
    (left,) = [d for d in result.plan.decisions if d.dropped.startswith(attention)]
    assert {left.kept, left.dropped} == {f"{attention}.k_proj.weight", f"{attention}.q_proj.weight"}
    assert not left.applied and "randomly initialised" in left.reason
    out_state = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert {left.kept, left.dropped} <= set(out_state) and "lm_head.weight" not in out_state


def test_hf_bin_folder_already_tied_writes_nothing(corpus: Any, tmp_path: Path) -> None:
    """A tied pytorch_model.bin folder has nothing to re-tie: no OUT
    (tests/test_retie_bin.py covers copies in .bin folders)."""
    result = retie(str(corpus.path("hf_gpt2_bin")), str(tmp_path / "out"))
    assert not result.plan.applied and result.written is None
    assert os.listdir(tmp_path) == []


def test_hf_side_files_copied_as_content_links_confined(corpus: Any, tmp_path: Path) -> None:
    source = tmp_path / "model"
    shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
    (source / "README.md").write_text("# model card\n")
    (source / "tokenizer").mkdir()
    (source / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    (source / "CARD.md").symlink_to("README.md")
    retie(str(source), str(tmp_path / "out"))
    card = tmp_path / "out" / "CARD.md"
    assert not card.is_symlink() and card.read_text() == "# model card\n"
    assert (tmp_path / "out" / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"

    (tmp_path / "secret.txt").write_text("outside")
    (source / "LEAK.md").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(UnsafeInputError, match="LEAK.md"):
        retie(str(source), str(tmp_path / "out2"))
    assert not (tmp_path / "out2").exists()


# --- failure leaves IN untouched and no OUT -------------------------------------------------------


@pytest.mark.parametrize("fixture", ["st_cloned_head", "hf_llama_cloned_head"])
def test_fault_before_rename(
    corpus: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: str
) -> None:
    source = tmp_path / "in"
    copy = shutil.copytree if corpus.path(fixture).is_dir() else shutil.copyfile
    copy(corpus.path(fixture), source)
    before = digest(source)

    def fail(staged: str) -> None:
        assert os.path.exists(staged)
        raise OSError("injected fault between write and rename")

    monkeypatch.setattr(retie_module, "before_rename", fail)
    out = tmp_path / ("out" if source.is_dir() else "out.safetensors")
    with pytest.raises(OutputError, match="injected") as raised:  # one line on the CLI, not a traceback
        retie(str(source), str(out), all_equal=True)
    assert isinstance(raised.value.__cause__, OSError)
    assert digest(source) == before
    assert os.listdir(tmp_path) == ["in"]  # no OUT, no staging folder


CHILD = textwrap.dedent(
    """
    import sys, time
    import tieaudit.repair.st_stream as st

    real = st.write_tensor
    def slow(fd, offset, opened, *, tensor):
        written = real(fd, offset, opened, tensor=tensor)
        print("wrote", tensor.name, flush=True)
        time.sleep(60)
        return written
    st.write_tensor = slow

    from tieaudit.repair.retie import retie
    retie(sys.argv[1], sys.argv[2], all_equal=True)
    """
)


def test_sigkill_while_writing(corpus: Any, tmp_path: Path) -> None:
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    shutil.copyfile(corpus.path("st_cloned_head"), source)
    before = digest(source)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(source), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith("wrote")  # first tensor written, the rest not
        stages = [p for p in tmp_path.iterdir() if ".tieaudit-stage-" in p.name]
        assert len(stages) == 1 and any(stages[0].iterdir())
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert digest(source) == before
    assert not out.exists()


@pytest.mark.parametrize("fixture", ["st_cloned_head", "hf_llama_cloned_head"])
def test_out_equal_to_in_needs_in_place(corpus: Any, tmp_path: Path, fixture: str) -> None:
    source = tmp_path / "model"
    copy = shutil.copytree if corpus.path(fixture).is_dir() else shutil.copyfile
    copy(corpus.path(fixture), source)
    before = digest(source)
    with pytest.raises(UsageError, match="in-place"):
        retie(str(source), str(source))
    assert digest(source) == before and os.listdir(tmp_path) == ["model"]

    result = retie(str(source), None, in_place=True, all_equal=True)
    backup = tmp_path / f"model{BACKUP_SUFFIX}"
    assert result.backup == str(backup) and digest(backup) == before
    assert sorted(os.listdir(tmp_path)) == ["model", backup.name]
    assert size(backup) - size(source) > VOCAB * HIDDEN * 4 - HEADER_SLACK
    assert_same_values(load_tied(str(backup)), load_tied(str(source)))


def test_dry_run_writes_nothing(corpus: Any, tmp_path: Path) -> None:
    result = retie(
        str(corpus.path("st_cloned_head")), str(tmp_path / "out.safetensors"), dry_run=True, all_equal=True
    )
    assert result.written is None and result.plan.saved_bytes == VOCAB * HIDDEN * 4
    assert os.listdir(tmp_path) == []
