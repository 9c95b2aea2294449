"""A bare file knows its family (issue 24, point 2): the model class from the tensor names alone.

A lone safetensors or .pt file names no class. tieaudit recognises it from its tensor names
(tieaudit/formats/tie_names.json, every class of the tie table) and applies what the class ties:

- equal copies the class ties under no setting (Mamba's ``A_log`` in every layer, Marian's
  sinusoidal position tables) are TIE001 notes, and retie leaves them;
- a copy the class ties by default (GPT-2's head cloned from the embedding) is a warning whose fix
  is the plain retie, and that output loads with ``safetensors.torch.load_model`` into the class
  built from its config class, and with ``from_pretrained`` next to its config.

Models are built tiny with random init (the sweep's tiny configs, tests/sweep/models.py); truth is
the class built, and what transformers and safetensors load.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from conftest import Corpus
from safetensors.torch import load_file, load_model, save_file, save_model

from tests.sweep import models
from tieaudit.cli.main import main
from tieaudit.repair.retie import retie

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

NOT_A_TIE = "equal by construction is not a tie; --all-equal re-ties it"
RECOGNISED = [
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "MambaForCausalLM",
    "PegasusForConditionalGeneration",
    "BertForMaskedLM",
    "T5ForConditionalGeneration",
]
DOCS = (Path(__file__).resolve().parent.parent / "docs" / "index.md").read_text()


def tiny(name: str, setting: str | None = None) -> Any:
    """The class built tiny on CPU with random init (the sweep's config, its first setting)."""
    subject = models.subjects()[name]
    return models.build(subject, setting or subject.settings[0])


def tiny_config(name: str) -> Any:
    subject = models.subjects()[name]
    return models.tiny_config(subject, subject.settings[0])


def bare_pretrained(model: Any, where: Path) -> Path:
    """save_pretrained's model.safetensors, alone in a folder of its own (no config.json)."""
    model.save_pretrained(where / "saved")
    path = where / "bare" / "model.safetensors"
    path.parent.mkdir(parents=True)
    shutil.move(str(where / "saved" / "model.safetensors"), path)
    return path


def check(path: Path, tmp_path: Path) -> tuple[int, list[dict[str, Any]]]:
    out = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    code = main(["check", str(path), "--format", "json", "--output", str(out)])
    return code, json.loads(out.read_text())["findings"]


def inspected(path: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "inspect.json"
    assert main(["inspect", str(path), "--format", "json", "--output", str(out)]) in (0, 1)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


# --- recognition ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RECOGNISED)
def test_a_save_pretrained_file_alone_is_recognised(name: str, tmp_path: Path) -> None:
    path = bare_pretrained(tiny(name), tmp_path)
    report = inspected(path, tmp_path).get("family")
    # Several classes can write exactly these names (GPT2LMHeadModel and GPTBigCodeForCausalLM):
    # the right one is among them, and only the ties they all agree on are used.
    assert report is not None and report["recognised"], report
    assert report["confidence"] == "exact" and name in report["classes"], report
    assert [c["class"] for c in report["candidates"]] == report["classes"]
    assert {c["names_as"] for c in report["candidates"]} <= {"save_pretrained", "state_dict"}


def test_names_under_a_peft_prefix_are_recognised_and_tied_with_it(tmp_path: Path) -> None:
    model = tiny("GPT2LMHeadModel", "off")
    with torch.no_grad():
        model.lm_head.weight.copy_(model.transformer.wte.weight)
    state = {f"base_model.model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / "adapter_merged.safetensors"
    save_file(state, str(path))
    report = inspected(path, tmp_path).get("family", {})
    assert report.get("prefix") == "base_model.model." and "GPT2LMHeadModel" in report["classes"]
    plan = retie(str(path), str(tmp_path / "out.safetensors"), dry_run=True).plan
    assert [(d.dropped, d.kept) for d in plan.applied] == [
        ("base_model.model.lm_head.weight", "base_model.model.transformer.wte.weight")
    ]


def test_names_of_no_class_are_not_recognised_and_the_advice_says_what_each_loader_does(
    tmp_path: Path,
) -> None:
    head = torch.randn(64, 32)
    path = tmp_path / "toy.safetensors"
    save_file({"emb.weight": head, "head.weight": head.clone()}, str(path))
    assert inspected(path, tmp_path).get("family", {}).get("recognised") is False
    code, (finding,) = check(path, tmp_path)
    assert code == 1 and finding["severity"] == "warning" and finding["fix"].endswith("--all-equal")
    assert "No model class is recognised from the tensor names" in finding["message"]
    assert "equal by construction" not in finding["message"]
    (left,) = retie(str(path), str(tmp_path / "out.safetensors"), dry_run=True).plan.decisions
    assert not left.applied and "no model class is recognised from the tensor names" in left.reason
    assert "equal by construction" not in left.reason
    assert "load_model(strict=True) loads the output only into a model that shares them" in left.reason
    assert "from_pretrained restores a dropped name only through the model class's ties" in left.reason


# --- equal by construction: notes, left by retie ------------------------------------------------


def _mamba_pretrained(tmp_path: Path) -> Path:
    return bare_pretrained(tiny("MambaForCausalLM"), tmp_path)


def _marian_save_model(tmp_path: Path) -> Path:
    path = tmp_path / "marian.safetensors"
    save_model(tiny("MarianMTModel"), str(path))  # in-memory names: the sinusoidal positions stored
    return path


def _pegasus_save_model(tmp_path: Path) -> Path:
    path = tmp_path / "pegasus.safetensors"
    save_model(tiny("PegasusForConditionalGeneration"), str(path))
    return path


def _mamba_torch_save(tmp_path: Path) -> Path:
    path = tmp_path / "mamba.pt"
    torch.save(tiny("MambaForCausalLM").state_dict(), path)
    return path


BY_CONSTRUCTION = {
    "mamba-save_pretrained": (_mamba_pretrained, "A_log"),
    "marian-save_model": (_marian_save_model, "embed_positions"),
    "pegasus-save_model": (_pegasus_save_model, "embed_positions"),
    "mamba-torch.save": (_mamba_torch_save, "A_log"),
}


@pytest.mark.parametrize("key", sorted(BY_CONSTRUCTION))
def test_copies_equal_by_construction_are_notes_and_check_passes(key: str, tmp_path: Path) -> None:
    write, equal = BY_CONSTRUCTION[key]
    path = write(tmp_path)
    code, findings = check(path, tmp_path)
    copies = [f for f in findings if f["rule"] == "TIE001"]
    assert copies and all(any(equal in n for n in f["names"]) for f in copies), copies
    assert code == 0 and {f["severity"] for f in copies} == {"note"}
    assert all("equal by construction" in f["message"] for f in copies)


@pytest.mark.parametrize("key", ["mamba-save_pretrained", "marian-save_model", "pegasus-save_model"])
def test_retie_leaves_them_and_its_output_loads_into_the_class(key: str, tmp_path: Path) -> None:
    write, equal = BY_CONSTRUCTION[key]
    path = write(tmp_path)
    result = retie(str(path), str(tmp_path / "out.safetensors"))
    left = [d for d in result.plan.decisions if equal in d.dropped]
    assert left and not any(d.applied for d in left)
    assert all(d.reason.startswith(NOT_A_TIE) for d in left)
    assert all("recognised from the tensor names" in d.reason for d in left)
    written = Path(result.written) if result.written else path
    classes = {
        "mamba": "MambaForCausalLM",
        "marian": "MarianMTModel",
        "pegasus": "PegasusForConditionalGeneration",
    }
    cls = classes[key.split("-")[0]]
    fresh = getattr(transformers, cls)(tiny_config(cls))
    missing, unexpected = load_model(fresh, str(written), strict=False)
    assert not [m for m in missing if equal in m] and not unexpected


# --- a copy the class ties: the plain fix, which loads --------------------------------------------


def _gpt2_with_cloned_head(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    model = tiny("GPT2LMHeadModel", "off")  # untied: the head is a parameter of its own
    with torch.no_grad():
        model.lm_head.weight.copy_(model.transformer.wte.weight)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / "in" / "gpt2.safetensors"
    path.parent.mkdir()
    save_file(state, str(path))
    return path, state


def test_a_head_cloned_from_the_embedding_fails_check_and_its_fix_loads(tmp_path: Path) -> None:
    path, state = _gpt2_with_cloned_head(tmp_path)
    code, findings = check(path, tmp_path)
    (finding,) = [f for f in findings if f["rule"] == "TIE001"]
    assert code == 1 and finding["severity"] == "warning"
    assert set(finding["names"]) == {"lm_head.weight", "transformer.wte.weight"}
    assert "--all-equal" not in finding["fix"] and "equal by construction" not in finding["message"]
    argv = shlex.split(finding["fix"])
    assert argv[:2] == ["tieaudit", "retie"] and len(argv) == 4  # retie IN OUT, as written
    assert main(argv[1:]) == 0
    out = Path(argv[3])
    assert "lm_head.weight" not in load_file(str(out))

    config = tiny_config("GPT2LMHeadModel")  # the config class's default ties the head
    fresh = transformers.GPT2LMHeadModel(config)
    missing, unexpected = load_model(fresh, str(out), strict=True)
    assert not missing and not unexpected
    for name, tensor in state.items():
        assert torch.equal(fresh.state_dict()[name], tensor), name

    folder = tmp_path / "folder"
    config.save_pretrained(folder)
    shutil.copy(out, folder / "model.safetensors")
    found: Any = transformers.GPT2LMHeadModel.from_pretrained(str(folder), output_loading_info=True)
    loaded, info = found
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"])
    assert main(["check", str(out)]) == 0


def test_plain_retie_reties_what_check_flags(tmp_path: Path) -> None:
    path, _ = _gpt2_with_cloned_head(tmp_path)
    plan = retie(str(path), str(tmp_path / "out.safetensors"), dry_run=True).plan
    assert [(d.dropped, d.kept) for d in plan.applied] == [("lm_head.weight", "transformer.wte.weight")]
    assert not [d for d in plan.decisions if not d.applied]


def test_a_pair_the_class_ties_only_with_its_switch_on_is_not_called_equal_by_construction(
    tmp_path: Path,
) -> None:
    model = tiny("LlamaForCausalLM", "off")  # LlamaConfig does not tie by default
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    path = tmp_path / "llama.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    code, (finding,) = check(path, tmp_path)
    assert code == 1 and finding["severity"] == "warning" and finding["fix"].endswith("--all-equal")
    assert "equal by construction" not in finding["message"]
    (left,) = retie(str(path), str(tmp_path / "out.safetensors"), dry_run=True).plan.decisions
    assert not left.applied and "by default" in left.reason and "equal by construction" not in left.reason


def test_the_readme_retie_dry_run_example_shows_the_planned_tie(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/index.md's usage runs `tieaudit retie model.safetensors --dry-run` on a bare GPT-2 file with
    a cloned head (tests/test_readme_commands.py puts the corpus's st_gpt2_cloned_head there)."""
    (line,) = [x for x in DOCS.splitlines() if x.startswith("tieaudit retie model.safetensors --dry-run")]
    shutil.copy(corpus.path("st_gpt2_cloned_head"), tmp_path / "model.safetensors")
    argv = shlex.split(line.split("#")[0])
    assert main([*argv[1:2], str(tmp_path / argv[2]), *argv[3:]]) == 0
    shown = capsys.readouterr().out
    assert "tie  lm_head.weight = transformer.wte.weight" in shown and "saves" in shown
