"""Every rule's example (``rules/texts.py``, shown by ``tieaudit rule`` and docs/rules.md) is what
tieaudit prints: each situation is built here from the corpus (or, for the PEFT adapter, by PEFT
itself), the example's command is run in it, and the example's lines are lines of the report."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Corpus

from tieaudit.cli.main import main
from tieaudit.rules.texts import RULE_TEXTS


def _copy(corpus: Corpus, fixture: str, name: str) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        source = corpus.path(fixture)
        if source.is_dir():
            shutil.copytree(source, folder / name)
        else:
            shutil.copy(source, folder / name)

    return build


def _with_policy(build: Callable[[Path], None], policy: str) -> Callable[[Path], None]:
    def with_policy(folder: Path) -> None:
        build(folder)
        (folder / "tieaudit.toml").write_text(policy)

    return with_policy


def _two_formats(corpus: Corpus) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        (folder / "repo").mkdir()
        shutil.copy(corpus.path("torch_untied_lm"), folder / "repo" / "model.pt")
        assert main(["convert", "repo/model.pt", "repo/model.safetensors"]) == 0

    return build


def _peft_adapter(folder: Path) -> None:
    """What PEFT saves for a GPT-2 model with modules_to_save=["lm_head"] (the example's words)."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=128, n_positions=32)
    base = transformers.GPT2LMHeadModel(config)
    lora = peft.LoraConfig(r=4, target_modules=["c_attn"], modules_to_save=["lm_head"])
    peft.get_peft_model(base, lora).save_pretrained(str(folder / "adapter"))


def situations(corpus: Corpus) -> dict[str, Callable[[Path], None]]:
    """How to build each rule's example situation in an empty folder."""
    cloned = _copy(corpus, "torch_cloned_head", "model.pt")
    namespace = _copy(corpus, "pickle_namespace_ckpt", "checkpoint.pt")
    return {
        "TIE001": cloned,
        "TIE002": _copy(corpus, "hf_llama_diverged_head", "llama"),
        "TIE003": _copy(corpus, "hf_llama_lm_head_only", "llama"),
        "TIE004": _copy(corpus, "hf_llama_vocab_misaligned", "llama"),
        "TIE005": _copy(corpus, "onnx_helper_shared", "model.onnx"),
        "TIE006": _copy(corpus, "torch_overlapping_views", "views.pt"),
        "TIE007": _copy(corpus, "torch_train_split", "train.pt"),
        "TIE008": _with_policy(cloned, '[[expect-tie]]\ntarget = "head.weight"\nsource = "emb.weight"\n'),
        "TIE009": _with_policy(cloned, 'max-wasted-bytes = "16KiB"\n'),
        "TIE010": namespace,
        "TIE011": _with_policy(namespace, 'safe-globals = ["argparse.Namespace"]\n'),
        "TIE012": _two_formats(corpus),
        "TIE013": _peft_adapter,
    }


def test_every_rule_has_a_situation_here(corpus: Corpus) -> None:
    assert set(situations(corpus)) == set(RULE_TEXTS)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("rule_id", sorted(RULE_TEXTS))
def test_the_example_is_what_tieaudit_prints(
    rule_id: str,
    corpus: Corpus,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = RULE_TEXTS[rule_id]
    if rule_id == "TIE005":
        pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")  # the width the examples are shown at (tieaudit rule, docs)
    situations(corpus)[rule_id](tmp_path)
    capsys.readouterr()
    argv = shlex.split(text.example_command)
    assert argv[:2] == ["tieaudit", "check"]
    main([*argv[1:], "--jobs", "1"])
    printed = capsys.readouterr().out.splitlines()
    for line in text.example_output.splitlines():
        assert line in printed, f"{rule_id}'s example is not what tieaudit prints:\n" + "\n".join(printed)
