"""SARIF 2.1.0 output: valid against the official schema, and what code scanning needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import numpy as np
import pytest
from conftest import Corpus
from safetensors.numpy import save_file
from test_registry import readme_rules

from tieaudit import __version__
from tieaudit.cli.main import main

SCHEMA_PATH = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"


def _uri(value: object) -> bool:
    return not isinstance(value, str) or (bool(urlsplit(value).scheme) and " " not in value)


def _uri_reference(value: object) -> bool:
    return not isinstance(value, str) or (" " not in value and "\\" not in value)


def validate(document: dict[str, Any]) -> None:
    """The official schema is draft-04; jsonschema has no uri checker without extras, so add one."""
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    checker = jsonschema.FormatChecker()
    checker.checks("uri")(_uri)
    checker.checks("uri-reference")(_uri_reference)
    jsonschema.Draft4Validator(schema, format_checker=checker).validate(document)


def sarif(args: list[str], tmp_path: Path, expected_code: int) -> dict[str, Any]:
    out = tmp_path / "out.sarif"
    assert main(["check", *args, "--format", "sarif", "-o", str(out), "--jobs", "1"]) == expected_code
    document: dict[str, Any] = json.loads(out.read_text())
    validate(document)
    return document


def test_a_small_report_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    embedding = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    (tmp_path / "models").mkdir()
    save_file({"emb": embedding, "head": embedding.copy()}, str(tmp_path / "models" / "m.safetensors"))
    monkeypatch.chdir(tmp_path)
    document = sarif(["models"], tmp_path, 1)
    (run,) = document["runs"]
    published = run["tool"]["driver"]["rules"]
    # Independent of the registry: the README's rule table, and DESIGN.md's default severities.
    assert [(r["id"], r["name"]) for r in published] == sorted(readme_rules().items())
    errors = {"TIE002", "TIE003", "TIE004", "TIE007", "TIE008", "TIE009", "TIE010"}  # TIE013: a warning
    notes = {"TIE011", "TIE012"}  # issue 13: code in a pickle is an error, an unknown class a note
    assert {r["id"]: r["defaultConfiguration"]["level"] for r in published} == {
        rule_id: "error" if rule_id in errors else "note" if rule_id in notes else "warning"
        for rule_id in readme_rules()
    }
    assert all(r["shortDescription"]["text"].endswith(".") for r in published)
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": tmp_path.as_uri() + "/"}}
    assert run["invocations"] == [{"executionSuccessful": True, "toolExecutionNotifications": []}]
    artifact = {"uri": "models/m.safetensors", "uriBaseId": "%SRCROOT%"}
    assert run["results"] == [
        {
            "ruleId": "TIE001",
            "ruleIndex": 0,
            "level": "warning",
            "message": {
                "text": "head holds the same bytes as emb in separate storage (8.0 KiB wasted): values that "
                "are equal are not a tie; each copy trains and loads as its own parameter. No model class is "
                "recognised from the tensor names, so nothing says the model ties them: with --all-equal, "
                "safetensors.torch.load_model(strict=True) loads the output only into a model that shares "
                "them, and from_pretrained restores a dropped name only through the model class's ties. "
                "Fix: tieaudit retie models/m.safetensors models/m-retied.safetensors --all-equal"
            },
            "locations": [{"physicalLocation": {"artifactLocation": artifact}}],
            "partialFingerprints": {
                # printf '%s' '["models/m.safetensors","TIE001",["emb","head"]]' | sha256sum
                "tieauditFingerprint/v1": "dd0c9964d179c00d0672c8dfe1236da498407fd73cd00422e66de16e4bcb7a6d"
            },
            "properties": {
                "checkpoint": "models/m.safetensors",
                "format": "safetensors",
                "names": ["emb", "head"],
                "relation": "equal",
                "wasted_bytes": 8192,
            },
        }
    ]
    assert document["version"] == "2.1.0" and run["tool"]["driver"]["version"] == __version__


def test_every_rule_carries_its_help(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What code scanning shows beside an alert: the summary, the description, the fix and how to
    silence the rule (text and Markdown), and the page that explains it; the log stays valid."""
    from tieaudit.rules.texts import RULE_TEXTS

    save_file({"w": np.zeros((4, 4), np.float32)}, str(tmp_path / "clean.safetensors"))
    monkeypatch.chdir(tmp_path)
    published = sarif(["clean.safetensors"], tmp_path, 0)["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in published] == sorted(readme_rules())
    for rule in published:
        text = RULE_TEXTS[rule["id"]]
        assert rule["shortDescription"] == {"text": text.summary}
        assert rule["fullDescription"] == {"text": text.description}
        assert rule["helpUri"].endswith(f"/docs/rules.md#{rule['id'].lower()}")
        assert urlsplit(rule["helpUri"]).scheme == "https"
        help_text, markdown = rule["help"]["text"], rule["help"]["markdown"]
        assert help_text.startswith(f"Fix: {text.fix}") and f"--ignore {rule['id']}" in help_text
        assert markdown.startswith("**Fix.** ") and f'ignore = ["{rule["id"]}"]' in markdown
        for command in text.fix_commands:
            assert f"$ {command}" in help_text and f"$ {command}" in markdown


def test_the_corpus_with_an_unreadable_path_validates(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(corpus.root, tmp_path / "models", ignore=shutil.ignore_patterns("MANIFEST.json"))
    (tmp_path / "models" / "broken.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{broken}")
    monkeypatch.chdir(tmp_path)
    json_out = tmp_path / "out.json"
    main(["check", "models", "-f", "json", "-o", str(json_out), "--jobs", "1"])
    report = json.loads(json_out.read_text())
    (run,) = sarif(["models"], tmp_path, 2)["runs"]
    findings = [f for r in report["reports"] for f in r["findings"]]
    assert [r["partialFingerprints"]["tieauditFingerprint/v1"] for r in run["results"]] == [
        f["fingerprint"] for f in findings
    ]
    assert {r["ruleId"] for r in run["results"]} == {
        "TIE001",
        "TIE002",
        "TIE003",
        "TIE004",
        "TIE006",
        "TIE007",
        "TIE010",  # pickles torch refuses: a Trainer's training_args.bin and rng_state.pth, an nn.Module
        "TIE012",  # the corpus holds one seeded model in several formats and folders
    }
    for result in run["results"]:
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        assert "region" not in location["physicalLocation"]  # binary files: the file, no lines
        assert artifact["uriBaseId"] == "%SRCROOT%" and (tmp_path / artifact["uri"]).is_file()
        assert result["level"] in {"error", "warning", "note"}
    folder = [r for r in run["results"] if r["properties"]["format"] == "hf-dir"]
    for result in folder:  # a model folder's finding points at a file inside it
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.startswith(result["properties"]["checkpoint"] + "/")
    assert folder
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error" and notification["message"]["text"].startswith(
        "models/broken.safetensors: "
    )


def test_baselined_results_are_marked_and_new_ones_are_new(corpus: Corpus, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(corpus.path("st_cloned_head"), models / "old.safetensors")
    main(["check", str(models), "--write-baseline", str(tmp_path / "baseline.json")])
    shutil.copy(corpus.path("st_transposed_copy"), models / "new.safetensors")
    (run,) = sarif([str(models), "--baseline", str(tmp_path / "baseline.json")], tmp_path, 1)["runs"]
    states = {Path(r["properties"]["checkpoint"]).name: r for r in run["results"]}
    new = states["new.safetensors"]
    assert new["baselineState"] == "new" and "suppressions" not in new
    old = states["old.safetensors"]
    assert old["baselineState"] == "unchanged"
    assert old["suppressions"] == [
        {"kind": "external", "status": "accepted", "justification": "in baseline baseline.json"}
    ]


def test_paths_outside_the_current_folder_are_absolute_uris(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    (run,) = sarif([str(corpus.path("st_cloned_head"))], tmp_path, 1)["runs"]
    artifact = run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": corpus.path("st_cloned_head").resolve().as_uri()}


@pytest.mark.parametrize(
    ("path", "uri"),
    [
        ("m\udcff\n.pt", "m%FF%0A.pt"),  # a file name byte that is not UTF-8: percent-encoded as is
        ("\ud800.safetensors", "%ED%A0%80.safetensors"),  # a lone surrogate from a JSON index name
        ("a b/é#.pt", "a%20b/%C3%A9%23.pt"),
    ],
)
def test_artifact_uris_encode_any_file_name(path: str, uri: str, tmp_path: Path) -> None:
    from tieaudit.report.sarif import artifact_location

    assert artifact_location(str(tmp_path / path), str(tmp_path)) == {"uri": uri, "uriBaseId": "%SRCROOT%"}
    outside = artifact_location(str(tmp_path / path), str(tmp_path / "elsewhere"))
    assert outside == {"uri": f"{tmp_path.as_uri()}/{uri}"}
