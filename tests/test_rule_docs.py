"""docs/rules.md is what scripts/gen_rules_doc.py renders from the rules' texts now (no drift); every
rule id the code, the README or the docs name is a rule of the registry; each rule's text is defined
once and its help address is the Documentation URL pyproject.toml declares, at the rule's anchor."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tieaudit.cli.main import cli
from tieaudit.report.rules_doc import rules_doc
from tieaudit.rules import text_record
from tieaudit.rules.registry import RULES
from tieaudit.rules.text_record import DOCS_URL, docs_url, help_url
from tieaudit.rules.texts import RULE_TEXTS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "rules.md"
RULE_ID = re.compile(r"\bTIE\d{3}\b")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_the_committed_page_is_what_the_generator_writes_now() -> None:
    assert PAGE.read_text(encoding="utf-8") == rules_doc(), "docs/rules.md is stale: run make rules-doc"


def test_the_generator_script_says_when_the_page_is_stale(tmp_path: Path) -> None:
    page = tmp_path / "rules.md"
    script = [sys.executable, str(ROOT / "scripts" / "gen_rules_doc.py"), "--output", str(page)]
    assert subprocess.run([*script, "--check"], capture_output=True, check=False).returncode == 1
    assert subprocess.run(script, capture_output=True, check=False).returncode == 0
    assert page.read_text(encoding="utf-8") == rules_doc()
    assert subprocess.run([*script, "--check"], capture_output=True, check=False).returncode == 0


def mentioned_ids() -> dict[str, set[str]]:
    """Rule ids named anywhere in the package's code and data, the README and docs/, by file."""
    files = [*(ROOT / "tieaudit").rglob("*.py"), *(ROOT / "tieaudit").rglob("*.json"), ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    found = {str(f.relative_to(ROOT)): set(RULE_ID.findall(f.read_text(encoding="utf-8"))) for f in files}
    return {name: ids for name, ids in found.items() if ids}


def test_every_rule_id_the_code_readme_or_docs_name_is_a_registered_rule() -> None:
    mentioned = mentioned_ids()
    assert "tieaudit/rules/copies.py" in mentioned or "tieaudit/rules/waste.py" in mentioned
    unknown = {name: sorted(ids - set(RULES)) for name, ids in mentioned.items() if ids - set(RULES)}
    assert not unknown, unknown
    assert set().union(*mentioned.values()) == set(RULES)  # and every rule is documented somewhere


def test_every_rule_has_one_text_and_the_registry_uses_it() -> None:
    assert list(RULE_TEXTS) == list(RULES) == sorted(RULES)
    for rule_id, rule in RULES.items():
        assert rule.text is RULE_TEXTS[rule_id]
        assert (rule.id, rule.kind, rule.severity, rule.summary) == (
            rule_id,
            RULE_TEXTS[rule_id].kind,
            RULE_TEXTS[rule_id].severity,
            RULE_TEXTS[rule_id].summary,
        )


@pytest.mark.parametrize("rule_id", sorted(RULE_TEXTS))
def test_each_text_is_whole(rule_id: str) -> None:
    text = RULE_TEXTS[rule_id]
    assert re.fullmatch(r"[a-z]+(-[a-z]+)+", text.kind)
    assert text.summary.endswith(".") and text.summary.count(". ") == 0  # one sentence
    assert 2 <= len(re.findall(r"\.( |$)", text.description)) <= 5, text.description  # 2-5 sentences
    first = text.example_output.splitlines()[0]
    assert first.startswith(f"  {rule_id} {text.severity} "), first  # the example is at the default
    assert text.example_command.startswith("tieaudit check ")
    for command in text.fix_commands:  # real commands of this tieaudit
        assert command.split()[0] == "tieaudit" and command.split()[1] in cli.commands, command
    assert f"--ignore {rule_id}" in text.ignore and text.fix


def test_the_page_has_a_section_at_each_help_address() -> None:
    page = PAGE.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", page, flags=re.MULTILINE)
    assert headings == list(RULE_TEXTS)  # GitHub's anchor of "## TIE001" is #tie001
    for text in RULE_TEXTS.values():
        assert help_url(text).endswith(f"/rules.md#{text.id.lower()}")
        assert f"| [{text.id}](#{text.id.lower()}) | {text.severity} | `{text.kind}` |" in page


def test_the_help_address_is_pyprojects_documentation_url() -> None:
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Homepage"] == "https://github.com/OWNER/tieaudit"
    assert urls["Documentation"] == DOCS_URL == urls["Homepage"] + "/blob/main/docs"
    assert help_url(RULE_TEXTS["TIE001"]) == f"{DOCS_URL}/rules.md#tie001"


def _metadata(*urls: str) -> SimpleNamespace:
    return SimpleNamespace(get_all=lambda key: list(urls) if key == "Project-URL" else None)


def test_the_installed_metadata_gives_the_address_when_it_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def missing(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    cases = [
        (
            _metadata("Homepage, https://h.example", "Documentation, https://d.example/docs/"),
            "https://d.example/docs",
        ),
        (_metadata("Homepage, https://h.example"), DOCS_URL),  # an install from an older pyproject
    ]
    try:
        for found, expected in cases:
            docs_url.cache_clear()
            monkeypatch.setattr(metadata, "metadata", lambda name, found=found: found)
            assert docs_url() == expected
        docs_url.cache_clear()
        monkeypatch.setattr(metadata, "metadata", missing)  # not installed: run from a checkout
        assert text_record.docs_url() == DOCS_URL
    finally:
        docs_url.cache_clear()


def test_the_texts_import_nothing_of_the_audit() -> None:
    """check --help lists the rules from them: no numpy, no reader, no importlib.metadata read."""
    probe = (
        "import sys\nimport tieaudit.rules.texts\n"
        "print(sorted(m for m in ('numpy', 'tieaudit.formats', 'tieaudit.graph', 'importlib.metadata')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stdout


def test_every_policy_block_on_the_page_is_a_valid_policy(tmp_path: Path) -> None:
    from tieaudit.rules.policy import load_policy

    blocks = re.findall(r"```toml\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) == len(RULE_TEXTS)
    for block, rule_id in zip(blocks, RULE_TEXTS, strict=True):
        (tmp_path / "tieaudit.toml").write_text(block)
        assert load_policy(str(tmp_path / "tieaudit.toml")).ignore == {rule_id}
        uncommented = re.sub(r"^# (?=\[|TIE)", "", block, flags=re.MULTILINE)  # the alternative
        (tmp_path / "tieaudit.toml").write_text(uncommented)
        other = load_policy(str(tmp_path / "tieaudit.toml"))
        assert other.severity[rule_id] == ("error" if RULE_TEXTS[rule_id].severity == "note" else "note")
