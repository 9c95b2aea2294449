"""Weight sets beside a folder's plain weights (issue 24): a sharded variant (its index), an
unsharded variant (``model.fp16.safetensors``) and a PEFT adapter saved beside its base model are each
one checkpoint, named by their file and read with the folder's configs as their library reads them;
each printed fix writes the folder that library loads, tied."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from test_layouts import _llama_with_a_cloned_head, _peft_adapter, check, counts_agree, report

from tieaudit.cli.main import main


def test_a_sharded_variant_beside_the_plain_weights_is_one_checkpoint_named_by_its_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    model = _llama_with_a_cloned_head()
    model.save_pretrained("both", max_shard_size="8KB")
    model.half().save_pretrained("both", max_shard_size="8KB", variant="fp16")
    index = "both/model.safetensors.index.fp16.json"
    weight_map = json.loads(Path(index).read_text())["weight_map"]
    assert weight_map["lm_head.weight"] != weight_map["model.embed_tokens.weight"]  # in two shards
    capsys.readouterr()
    code, out, _ = check(["both"], capsys)
    assert code == 1 and "TIE012" not in out  # not a copy across files: one checkpoint's copy
    assert re.search(rf"^FAIL {re.escape(index)} ", out, re.M)
    assert not re.search(r"^(ok|FAIL) +both/model[.-]\S*-of-", out, re.M)  # no shard audited alone
    _, document = report(Path("both"), tmp_path, capsys)
    assert [r["path"] for r in document["reports"]] == ["both", index]
    assert [f["rule"] for f in document["reports"][1]["findings"]] == ["TIE001"]
    verdicts = {f["path"]: (f["verdict"], f["target"]) for f in document["files"]}
    assert verdicts[index] == ("audited", index) and verdicts["both/config.json"] == ("covered", "both")
    assert {verdicts[f"both/{shard}"] for shard in weight_map.values()} == {("covered", index)}
    assert counts_agree(Path("both"), tmp_path, capsys) == 0
    fixes = [line.split("fix: ", 1)[1] for line in out.splitlines() if "fix: " in line]
    assert fixes[1] == f"tieaudit retie {index} both-fp16-retied"
    assert main(shlex.split(fixes[1])[1:]) == 0  # the printed fix, as printed
    assert not any(
        p.name.startswith("model-0") for p in Path("both-fp16-retied").iterdir()
    )  # the variant only
    reloaded = AutoModelForCausalLM.from_pretrained("both-fp16-retied", variant="fp16")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert check(["both-fp16-retied"], capsys)[0] == 0
    assert main(["retie", index, "--in-place"]) == 2  # an index names a weight set, not a file to replace
    assert "write the re-tied folder to OUT" in capsys.readouterr().err


def test_an_unsharded_variant_beside_config_json_is_read_with_that_config_not_as_a_bare_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_pretrained(variant="fp16") reads model.fp16.safetensors with the config.json beside it
    (tie_word_embeddings false here): a bare file's class guess once made the fix drop a head that
    then loaded randomly initialised."""
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    model = _llama_with_a_cloned_head()
    model.save_pretrained("two")
    model.half().save_pretrained("two", variant="fp16")
    capsys.readouterr()
    code, out, _ = check(["two"], capsys)
    assert code == 1 and re.search(r"^FAIL two/model\.fp16\.safetensors  \(hf-dir,", out, re.M), out
    _, document = report(Path("two"), tmp_path, capsys)
    verdicts = {f["path"]: (f["verdict"], f["target"]) for f in document["files"]}
    assert verdicts["two/model.fp16.safetensors"] == ("audited", "two/model.fp16.safetensors")
    assert verdicts["two/config.json"] == ("covered", "two")
    assert counts_agree(Path("two"), tmp_path, capsys) == 0
    fixes = [line.split("fix: ", 1)[1] for line in out.splitlines() if "fix: " in line]
    assert fixes[1] == "tieaudit retie two/model.fp16.safetensors two-fp16-retied"
    assert main(shlex.split(fixes[1])[1:]) == 0
    assert sorted(p.name for p in Path("two-fp16-retied").iterdir() if p.suffix != ".json") == [
        "model.fp16.safetensors"
    ]
    reloaded = AutoModelForCausalLM.from_pretrained("two-fp16-retied", variant="fp16")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert check(["two-fp16-retied"], capsys)[0] == 0


def test_a_bin_variant_index_s_fix_runs_and_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytorch_model.bin.index.fp16.json beside the plain weights (transformers 4 wrote them; 5 writes
    safetensors only, so the shards are written here as it wrote them): its printed fix once failed
    reading its own output back, naming retie's stage folder."""
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    model = _llama_with_a_cloned_head()
    model.save_pretrained("bins")
    state = {k: v.half().clone() for k, v in model.state_dict().items()}
    names = sorted(state)
    shards = {
        "pytorch_model.fp16-00001-of-00002.bin": names[::2],
        "pytorch_model.fp16-00002-of-00002.bin": names[1::2],
    }
    for shard, held in shards.items():
        torch.save({n: state[n] for n in held}, Path("bins") / shard)
    weight_map = {n: shard for shard, held in shards.items() for n in held}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    Path("bins/pytorch_model.bin.index.fp16.json").write_text(json.dumps(index))
    capsys.readouterr()
    code, out, _ = check(["bins"], capsys)
    assert code == 1 and "FAIL bins/pytorch_model.bin.index.fp16.json  (hf-dir," in out, out
    fixes = [line.split("fix: ", 1)[1] for line in out.splitlines() if "fix: " in line]
    assert fixes[1].startswith("tieaudit retie bins/pytorch_model.bin.index.fp16.json bins-fp16-retied")
    assert main(shlex.split(fixes[1])[1:]) == 0, capsys.readouterr().err
    reloaded = AutoModelForCausalLM.from_pretrained("bins-fp16-retied", variant="fp16")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()


@pytest.mark.filterwarnings("ignore")
def test_an_adapter_saved_beside_its_base_is_one_finding_on_the_adapter_not_on_the_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_discover_repo import tiny_gpt2

    folder = _peft_adapter(tmp_path / "beside", gpt2=True, modules=["lm_head"])
    tiny_gpt2().save_pretrained(folder)  # the base, tied, saved into the adapter's folder
    code, document = report(folder, tmp_path, capsys)
    by_path = {r["path"]: [f["rule"] for f in r["findings"]] for r in document["reports"]}
    adapter = str(folder / "adapter_model.safetensors")
    assert code == 1 and by_path[str(folder)] == [] and by_path[adapter].count("TIE013") == 1, by_path
    verdicts = {f["path"]: (f["verdict"], f["target"]) for f in document["files"]}
    assert verdicts[str(folder / "adapter_config.json")] == ("covered", adapter)
    assert counts_agree(folder, tmp_path, capsys) == 0


def test_output_that_cannot_be_read_back_is_named_as_out_never_the_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tieaudit.core.errors import InputError
    from tieaudit.repair import retie as retie_module

    def unreadable(opened: object, staged: str, **_: object) -> list[str]:
        raise InputError("no weights found", staged)

    monkeypatch.chdir(tmp_path)
    _llama_with_a_cloned_head().save_pretrained("m")
    monkeypatch.setattr(retie_module, "verify_output", unreadable)
    capsys.readouterr()
    assert main(["retie", "m", "m-retied"]) == 2
    err = capsys.readouterr().err
    assert "m-retied: the output written cannot be read back (no weights found); nothing was written" in err
    assert "tieaudit-stage" not in err and not Path("m-retied").exists()


@pytest.mark.parametrize(
    ("marker", "document"),
    [
        (
            "modules.json",
            [{"idx": 0, "name": "0", "path": "part", "type": "sentence_transformers.models.Transformer"}],
        ),
        ("model_index.json", {"_class_name": "SomePipeline", "part": ["transformers", "LlamaForCausalLM"]}),
    ],
)
def test_a_module_or_component_is_retied_where_its_unit_loads_it(
    marker: str,
    document: object,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sentence-transformers and diffusers load a module or component from its folder: the fix once
    wrote part-retied beside it, which nothing loads (and the next check counted both)."""
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    _llama_with_a_cloned_head().save_pretrained("unit/part")
    Path("unit", marker).write_text(json.dumps(document))
    capsys.readouterr()
    code, out, _ = check(["unit"], capsys)
    (command,) = [line.split("fix: ", 1)[1] for line in out.splitlines() if "fix: " in line]
    assert code == 1 and command == "tieaudit retie unit/part --in-place", out
    assert main(shlex.split(command)[1:]) == 0
    assert check(["unit"], capsys)[0] == 0  # the backup is skipped as one; no part-retied anywhere
    assert sorted(p.name for p in Path("unit").iterdir()) == sorted([marker, "part", "part.tieaudit-backup"])
    AutoModelForCausalLM.from_pretrained("unit/part")
