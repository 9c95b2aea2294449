"""SARIF 2.1.0 for code scanning: one run, every rule, one result per finding.

Checkpoints are binary, so a location names the file and no region: SARIF forbids line and column
regions in binary artifacts (3.30.1), and code scanning attaches a region-less result to the file.
A finding in a model folder points at the file holding its first stored tensor. A file name that
is not UTF-8 is percent-encoded byte for byte in URIs and escaped (``\\xff``) in text, so the log is
valid UTF-8 whatever the names on disk.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote_from_bytes

from tieaudit.core.escape import printable
from tieaudit.core.version import __version__
from tieaudit.formats.hf.variants import weights_folder
from tieaudit.gate.check import Checked, CheckResult
from tieaudit.report.rules import help_markdown, help_text
from tieaudit.rules.finding import Finding
from tieaudit.rules.registry import RULES
from tieaudit.rules.text_record import help_url

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "tieauditFingerprint/v1"
RULE_INDEX = {rule_id: index for index, rule_id in enumerate(RULES)}


def _information_uri() -> str | None:
    """The project's home page from the installed package metadata, when it declares one."""
    from importlib import metadata

    try:
        meta = metadata.metadata("tieaudit")
    except metadata.PackageNotFoundError:
        return None
    home = meta["Home-page"] if "Home-page" in meta else None
    urls = [u.split(",", 1)[1].strip() for u in meta.get_all("Project-URL") or [] if "," in u]
    return home or (urls[0] if urls else None)


def _path_bytes(path: str) -> bytes:
    """The bytes a path names on disk (undecodable bytes were kept as surrogate escapes)."""
    try:
        return os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate that came from a JSON string, not from a file name
        return path.encode("utf-8", "surrogatepass")


def _text(text: str) -> str:
    """text when it is valid Unicode, else with its undecodable bytes and lone surrogates escaped."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return printable(text)
    return text


def _file_uri(absolute: str) -> str:
    return "file://" + quote_from_bytes(_path_bytes(absolute))


def artifact_location(path: str, root: str) -> dict[str, str]:
    """Relative to %SRCROOT% (the current folder) when inside it, else an absolute file URI."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, root)
    if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir:
        return {"uri": _file_uri(absolute)}
    return {"uri": quote_from_bytes(_path_bytes(relative.replace(os.sep, "/"))), "uriBaseId": SRCROOT}


def finding_file(checked: Checked, finding: Finding) -> str:
    """The file a finding is about: the checkpoint file, or in a folder the file of its first
    stored tensor, else the config, else the first file read."""
    ckpt = checked.audit.graph.checkpoint
    if ckpt.format != "hf-dir":
        return ckpt.path
    stored = [ckpt.tensor(n).file for n in finding.names if n in ckpt.names]
    fallback = [ckpt.config.file] if ckpt.config is not None else list(ckpt.files)
    chosen = (stored or fallback or [""])[0]
    return os.path.join(weights_folder(ckpt.path), chosen) if chosen else ckpt.path


def _rules() -> list[dict[str, Any]]:
    """Every rule with its help, from its record (``rules.texts``): what code scanning shows beside
    an alert, and the page (helpUri) that explains it."""
    return [
        {
            "id": rule.id,
            "name": rule.kind,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.text.description},
            "help": {"text": help_text(rule.text), "markdown": help_markdown(rule.text)},
            "helpUri": help_url(rule.text),
            "defaultConfiguration": {"level": rule.severity},
        }
        for rule in RULES.values()
    ]


def _result(checked: Checked, index: int, root: str, *, baseline_name: str | None) -> dict[str, Any]:
    finding = checked.audit.findings[index]
    ckpt = checked.audit.graph.checkpoint
    # Shown in code scanning's UI and logs: one escaped line, like the terminal gets.
    text = printable(finding.message + (f" Fix: {finding.fix}" if finding.fix else ""))
    location = artifact_location(finding_file(checked, finding), root)
    result: dict[str, Any] = {
        "ruleId": finding.rule,
        "ruleIndex": RULE_INDEX[finding.rule],
        "level": finding.severity,
        "message": {"text": _text(text)},
        "locations": [{"physicalLocation": {"artifactLocation": location}}],
        "partialFingerprints": {FINGERPRINT_KEY: checked.fingerprints[index]},
        "properties": {
            "checkpoint": _text(ckpt.path),
            "format": ckpt.format,
            "names": [_text(name) for name in finding.names],
            "relation": finding.relation,
            "wasted_bytes": finding.wasted_bytes,
        },
    }
    if baseline_name is not None:
        accepted = checked.baselined[index]
        result["baselineState"] = "unchanged" if accepted else "new"
        if accepted:  # code scanning ignores suppressions; a dismissed alert stays so by fingerprint
            result["suppressions"] = [
                {"kind": "external", "status": "accepted", "justification": f"in baseline {baseline_name}"}
            ]
    return result


def sarif_dict(result: CheckResult, root: str | None = None) -> dict[str, Any]:
    """The SARIF log as plain data; root is %SRCROOT% (default: the current folder)."""
    root = os.path.abspath(root or os.getcwd())
    baseline_name = os.path.basename(result.baseline.path) if result.baseline else None
    notifications = [
        {
            "level": "error",
            "message": {"text": printable(f"{error.path}: {error.message}")},
            "locations": [{"physicalLocation": {"artifactLocation": artifact_location(error.path, root)}}],
        }
        for error in result.errors
    ]
    results = [
        _result(checked, index, root, baseline_name=baseline_name)
        for checked in result.checked
        for index in range(len(checked.audit.findings))
    ]
    return _log(root, results, notifications)


def _log(root: str, results: list[dict[str, Any]], notifications: list[dict[str, Any]]) -> dict[str, Any]:
    """One run of tieaudit; executionSuccessful is false when a notification says what failed."""
    driver: dict[str, Any] = {"name": "tieaudit", "version": __version__, "semanticVersion": __version__}
    information = _information_uri()
    if information:
        driver["informationUri"] = information
    driver["rules"] = _rules()
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": driver},
                "originalUriBaseIds": {SRCROOT: {"uri": _file_uri(root).rstrip("/") + "/"}},
                "invocations": [
                    {"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}
                ],
                "results": results,
            }
        ],
    }


def render_sarif(result: CheckResult) -> str:
    """The SARIF log as indented JSON text."""
    return json.dumps(sarif_dict(result), indent=2) + "\n"


def render_sarif_failure(message: str, root: str | None = None) -> str:
    """The log of a run that stopped before auditing anything (nothing scanned, a bad policy file):
    no results, one notification saying why, so an upload step still has a valid file to read."""
    notification = {"level": "error", "message": {"text": _text(printable(message))}}
    return json.dumps(_log(os.path.abspath(root or os.getcwd()), [], [notification]), indent=2) + "\n"
