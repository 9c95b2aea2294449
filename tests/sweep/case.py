"""One case: (class, setting, form) -> write the variant, ask tieaudit, retie, reload, compare.

A worker keeps a Context across the cases of one class: the built models, their truth and the
family classes that load the class's folders are computed once per (class, setting).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from tests.sweep import expect, models, reload, truth, variants
from tests.sweep.expect import Disagreement, Expected


@dataclass
class Context:
    """Per-worker caches, keyed by (class, setting)."""

    work: str
    subjects: dict[str, models.Subject] = field(default_factory=models.subjects)
    built: dict[tuple[str, str], Any] = field(default_factory=dict)
    lives: dict[tuple[str, str], truth.Live] = field(default_factory=dict)
    loaders: dict[tuple[str, str], tuple[list[str], list[str]]] = field(default_factory=dict)

    def model(self, name: str, setting: str) -> Any:
        key = (name, setting)
        if key not in self.built:
            if len(self.built) > 4:  # keep memory flat across classes
                self.built.clear()
            self.built[key] = models.build(self.subjects[name], setting)
        return self.built[key]

    def live(self, name: str, setting: str) -> truth.Live:
        key = (name, setting)
        if key not in self.lives:
            self.lives[key] = truth.live_truth(self.model(name, setting))
        return self.lives[key]

    def family_loaders(self, name: str, setting: str) -> tuple[list[str], list[str]]:
        """The family classes that load this class's save_pretrained folder cleanly, and notes."""
        key = (name, setting)
        if key not in self.loaders:
            folder = os.path.join(self.work, f"family-{name}-{setting}")
            shutil.rmtree(folder, ignore_errors=True)
            self.model(name, setting).save_pretrained(folder)
            ok, notes = [], []
            for candidate in self.subjects[name].family:
                loaded = reload.load_hf(candidate, folder)
                if reload.clean(loaded):
                    ok.append(candidate)
                elif candidate == name:
                    why = loaded.error or f"missing {sorted(loaded.missing | loaded.mismatched)[:3]}"
                    notes.append(f"{name} does not reload its own save_pretrained folder: {why}")
            shutil.rmtree(folder, ignore_errors=True)
            self.loaders[key] = (ok, notes)
        return self.loaders[key]


def cli(*args: str) -> tuple[int, str]:
    """tieaudit's command line, in this process: exit code and stdout."""
    from tieaudit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue()


def ask(path: str) -> tuple[expect.Answer | None, int, list[Disagreement]]:
    """tieaudit's answers for path: the library audit, check's exit code, inspect's JSON."""
    from tieaudit.audit import audit_path

    try:
        answer = expect.answer_of(audit_path(path))
    except Exception as exc:
        return None, -1, [Disagreement("audit-error", f"{type(exc).__name__}: {str(exc)[:300]}")]
    code, _ = cli("check", path)
    problems = []
    icode, text = cli("inspect", path, "--format", "json")
    try:
        report = json.loads(text)
        declared = {(t["target"], t["source"]) for t in report["declared_ties"]}
        findings = sorted((f["rule"], sorted(f["names"])) for f in report["findings"])
        if declared != answer.declared or findings != sorted((r, sorted(n)) for r, n, _ in answer.findings):
            problems.append(
                Disagreement("inspect-json", "inspect --format json differs from the library audit")
            )
    except (ValueError, KeyError) as exc:
        problems.append(Disagreement("inspect-json", f"inspect exit {icode}, output not a report: {exc}"))
    return answer, code, problems


def tied_state(group: frozenset[str], facts: truth.FileFacts) -> str:
    """tied (one name left, or all names in one storage), left (all stored apart) or partial."""
    stored = group & facts.names
    if len(stored) == 1 or any(stored <= alias for alias in facts.alias):
        return "tied"
    if stored == group and not any(len(alias & group) > 1 for alias in facts.alias):
        return "left"
    return "partial"


def compare_output(
    exp: Expected, out_facts: truth.FileFacts, got: expect.Answer, declared: set[tuple[str, str]] | None
) -> list[Disagreement]:
    """retie's output: what it tied and left, and tieaudit's answers on it (declared: the ties the
    output's config declares, for folders)."""
    result: list[Disagreement] = []
    for group in exp.must_tie + exp.must_leave:
        state = tied_state(group, out_facts)
        if group in exp.must_tie and state != "tied":
            result.append(
                Disagreement("retie-left-copy", f"class-tied copies {sorted(group)} {state} by retie")
            )
        if group in exp.must_leave and state != "left":
            result.append(Disagreement("retie-tied-by-construction", f"{sorted(group)} {state} by retie"))
    orphaned = expect.orphans(declared, out_facts.names)
    alias = list(out_facts.alias)
    result += expect.compare_findings(
        out_facts.copies, exp.broken, exp.vocab_misaligned, got, "after-retie:", alias, orphaned
    )
    if declared is not None and got.declared != declared:
        detail = f"declared {sorted(got.declared)}, the output's config ties {sorted(declared)}"
        result.append(Disagreement("after-retie:declared-ties", detail))
    return result


def _out_path(written: variants.Written, base: str) -> str:
    return base + os.path.splitext(written.path)[1] if written.form in ("pt", "st-file") else base


def run_case(ctx: Context, name: str, variant: str, keep: bool = False) -> dict[str, Any]:
    """Run one case; the result is JSON-ready (status agree, disagree, unresolved (a disagreement
    where tieaudit itself notes that config.json's ties are not all resolved), ambiguous (every
    difference reproduced by transformers' own layout, with the evidence), n/a, cannot-build or
    error)."""
    setting, form = variant.split("/")
    started = time.monotonic()
    result: dict[str, Any] = {
        "class": name, "variant": variant, "disagreements": [], "ambiguous": [], "notes": []
    }  # fmt: skip
    base = os.path.join(ctx.work, f"{name}-{setting}-{form}")
    shutil.rmtree(base, ignore_errors=True)
    try:
        try:
            model = ctx.model(name, setting)
            live = ctx.live(name, setting)
            on_live = ctx.live(name, "on") if setting == "off" else None
        except Exception as exc:
            result.update(status="cannot-build", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
            return result
        result["notes"] += live.notes
        os.makedirs(os.path.join(base, "in"))
        try:
            written = variants.write(model, live, on_live, form, os.path.join(base, "in"))
        except variants.NotApplicable as exc:
            result.update(status="n/a", reason=str(exc))
            return result
        found = _run(ctx, name, setting, written, live, on_live, base, result)
        result["disagreements"] = [{"cause": d.cause, "detail": d.detail} for d in found]
        result["status"] = (
            ("unresolved" if result.get("unresolved") else "disagree")
            if found
            else "ambiguous" if result["ambiguous"] else "agree"
        )
    except Exception as exc:  # a harness failure is reported as such, never as agreement
        result.update(
            status="error", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-2000:]
        )
    finally:
        result["seconds"] = round(time.monotonic() - started, 2)
        if keep:
            result["kept"] = base
        else:
            shutil.rmtree(base, ignore_errors=True)
    return result


def _run(
    ctx: Context, name: str, setting: str, written: variants.Written, live: truth.Live,
    on_live: truth.Live | None, base: str, result: dict[str, Any],
) -> list[Disagreement]:  # fmt: skip
    from tieaudit.repair.retie import retie

    facts = truth.file_facts(written.path)
    if written.form in ("pt", "hf-bin"):  # the writer kept the live sharing, or the truth is off
        names = live.disk if written.form == "hf-bin" else {n: n for g in live.shared for n in g}
        spelled = {frozenset(str(names[n]) for n in g) for g in live.shared}
        if set(facts.alias) != spelled:
            result["notes"].append(f"truth: the file shares {facts.alias}, the live model {sorted(spelled)}")
    exp = expect.expected(live, on_live, written, facts)
    result["expected"] = {"copies": [sorted(g) for g in exp.copies], "declared": sorted(exp.declared or [])}
    answer, code, found = ask(written.path)
    if answer is None:
        return found
    if answer.unresolved:  # tieaudit says it does not know: the case can disagree, never agree
        result["unresolved"] = answer.unresolved
    found += expect.compare_input(exp, answer, code)
    out = _out_path(written, os.path.join(base, "out"))
    try:
        done = retie(written.path, out)
    except Exception as exc:
        cause = "retie-unsupported" if type(exc).__name__ == "UnsupportedFormatError" else "retie-error"
        return found + [Disagreement(cause, f"{type(exc).__name__}: {str(exc)[:400]}")]
    if done.written is None:  # nothing to re-tie: retie writes nothing, the input stays the answer
        if os.path.lexists(out):
            return found + [
                Disagreement("retie-wrote-nothing-to-retie", f"{out} exists after 'nothing to re-tie'")
            ]
        out = written.path
    out_answer, _, problems = ask(out)
    if out_answer is None:
        return found + [Disagreement("after-retie:" + p.cause, p.detail) for p in problems]
    out_facts = truth.file_facts(out)
    out_ties = live.class_ties
    if out_facts.config is not None and out_facts.config != facts.config:
        result["notes"].append("retie changed config.json")
        out_ties = truth.config_ties(name, out_facts.config)
    declared = expect.declared_after(live, out_ties) if written.form in variants.FOLDER_FORMS else None
    found += compare_output(exp, out_facts, out_answer, declared)
    if written.form == "pt":
        return found + reload.compare_pt(
            written.path, out, lambda: models.build(ctx.subjects[name], setting, 1)
        )
    if written.form == "st-file":
        return found + reload.compare_st(
            written.path, out, lambda: models.build(ctx.subjects[name], setting, 1)
        )
    loaders, notes = ctx.family_loaders(name, setting)
    result["notes"] += notes
    result["loaders"] = loaders
    # With the switch turned on by retie, transformers' own save_pretrained of the class with it on
    # is the reference layout: a family class that does not load that folder cleanly either (BART's
    # causal-LM sibling finds neither of the names it ties) cannot load the output; its differences
    # are recorded as ambiguous ground truth with that evidence, never as agreement.
    own_on = ctx.family_loaders(name, "on")[0] if setting == "off" and out_ties != live.class_ties else None
    for loader in loaders:
        before = reload.load_hf(loader, written.path)
        if before.error or before.missing:
            result["notes"].append(
                f"{loader} does not load the input cleanly: {before.error or sorted(before.missing)[:3]}"
            )
        # retie may turn the config's switch on: the ties this loader's class then builds may
        # appear (as groups: a BartModel ties shared, encoder and decoder embed_tokens together).
        gained = []
        if out_ties != live.class_ties and out_facts.config is not None:
            ties = truth.config_ties(loader, out_facts.config)
            gained = sorted(expect.components(set(ties.items())), key=sorted)
        after = reload.load_hf(loader, out)
        # transformers may warn about the perturbed tie (stored twice, values differ) on the output
        # only, once retie dropped the equal copies around it: a true statement, not a difference.
        after.warnings = frozenset(
            w for w in after.warnings if not any(all(n in w for n in group) for group in exp.broken)
        )
        problems = reload.compare_loads(loader, before, after, gained)
        if problems and before.digests != reload.load_hf(loader, written.path).digests:
            # No reference: loading the input twice gives different values (Deimv2 from its own
            # save_pretrained folder, where only a tie target is stored).
            result["ambiguous"].append(
                f"{problems[0].detail}; {loader} loads the input twice with different values"
            )
            continue
        same_failure = (after.error, after.missing, after.mismatched) == (
            before.error, before.missing, before.mismatched
        )  # fmt: skip
        if problems and not reload.clean(before) and (reload.clean(after) or same_failure):
            # No reference: transformers itself cannot load the input this variant wrote (ImageGPT's
            # tied head has one row fewer than the embedding it is tied to); the output loads, or
            # fails exactly as the input does.
            why = before.error or sorted(before.missing | before.mismatched)[:3]
            outcome = "fails the same way" if same_failure else "loads cleanly"
            result["ambiguous"].append(
                f"{problems[0].detail}; {loader} does not load the input cleanly ({why}); "
                f"the output {outcome}"
            )
            continue
        if problems and own_on is not None and loader not in own_on:
            result["ambiguous"].append(
                f"{problems[0].detail}; {loader} does not load {name}'s own save_pretrained folder "
                "with tie_word_embeddings on cleanly either"
            )
            continue
        found += problems
    return found
