"""The rule registry is the one list: README's rule table, SARIF's driver.rules, --ignore and the
policy accept exactly the rules some code emits (DESIGN.md: a rule is published only when emitted).

Expectations come from the README and DESIGN.md texts, not from ``RULES`` itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tieaudit.cli.main import main
from tieaudit.gate.baseline import fingerprint
from tieaudit.rules.registry import RULES

ROOT = Path(__file__).resolve().parent.parent


def readme_rules() -> dict[str, str]:
    """id -> kind, from the published rule table (docs/rules.md, generated from the registry and held
    to it by tests/test_rule_docs.py)."""
    text = (ROOT / "docs" / "rules.md").read_text()
    rows = re.findall(
        r"^\| \[(TIE\d{3})\]\(#tie\d{3}\) \| [a-z]+ \| `([a-z-]+)` \|", text, flags=re.MULTILINE
    )
    return dict(rows)


def test_the_registry_is_the_published_rule_table() -> None:
    table = readme_rules()
    assert len(table) >= 8
    assert {rule_id: rule.kind for rule_id, rule in RULES.items()} == table


def unpublished_ids() -> list[str]:
    """Ids DESIGN.md reserves (TIE001-TIE011) that the README does not list yet, and one never used."""
    listed = readme_rules()
    return [i for i in (f"TIE{n:03d}" for n in range(1, 12)) if i not in listed] + ["TIE099"]


@pytest.mark.parametrize("rule_id", unpublished_ids())
def test_a_rule_no_code_emits_is_published_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rule_id: str
) -> None:
    assert rule_id not in RULES
    assert main(["check", str(tmp_path), "--ignore", rule_id]) == 2
    assert f"unknown rule id {rule_id}" in capsys.readouterr().err
    policy = tmp_path / "tieaudit.toml"
    policy.write_text(f'ignore = ["{rule_id}"]\n')
    assert main(["check", str(tmp_path), "--policy", str(policy)]) == 2


def test_tie007_is_published_once_the_training_reader_emits_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TIE007 was reserved (refused by --ignore) until formats.training and rules.optimizer emitted it."""
    assert readme_rules()["TIE007"] == "optimizer-state-split" == RULES["TIE007"].kind
    policy = tmp_path / "tieaudit.toml"
    policy.write_text('ignore = ["TIE007"]\n[severity]\nTIE007 = "note"\n')
    model = tmp_path / "m.safetensors"
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.arange(4, dtype=np.float32)}, str(model))
    assert main(["check", str(model), "--ignore", "TIE007", "--policy", str(policy)]) == 0
    assert "unknown rule id" not in capsys.readouterr().err


def test_sarif_publishes_the_readme_rules_in_id_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    values = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    path = tmp_path / "copy.safetensors"
    save_file({"model.embed_tokens.weight": values, "lm_head.weight": values.copy()}, str(path))
    assert main(["check", str(path), "--format", "sarif"]) == 1
    run = json.loads(capsys.readouterr().out)["runs"][0]
    published = [(r["id"], r["name"]) for r in run["tool"]["driver"]["rules"]]
    assert published == sorted(readme_rules().items())
    (result,) = run["results"]
    assert result["ruleId"] == "TIE001"
    assert published[result["ruleIndex"]][0] == "TIE001"


def test_a_fingerprint_is_the_sha256_of_path_rule_and_sorted_names(tmp_path: Path) -> None:
    """The hex digests were computed outside tieaudit (printf ... | sha256sum) from the compact JSON
    array [path relative to the root, rule, sorted names], non-ASCII kept as UTF-8."""
    models = tmp_path / "models"
    assert (
        fingerprint(
            str(models / "a.safetensors"), "TIE001", ("wte.weight", "lm_head.weight"), root=str(tmp_path)
        )
        == "00dcbd4670f4375f848facf404c5dd6100b52543a33b975598d681eee2faf7f7"
    )
    assert (
        fingerprint(str(models / "ä b.safetensors"), "TIE002", ("x",), root=str(tmp_path))
        == "2cb8906d70e17f3b348b2776d2e0d7cfcf6c4f8b445d837380339d2c9132ea1d"
    )
