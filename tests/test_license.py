"""The license the package declares is the one the repository carries (issue 26): Apache-2.0 as an
SPDX expression (PEP 639, no deprecated ``license = {text = ...}`` table), its text in LICENSE,
shipped in the distribution's metadata."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_declared_license_is_apache_2_and_its_text_is_shipped() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    metadata = importlib.metadata.metadata("tieaudit")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (metadata.get_all("License-File") or [])
