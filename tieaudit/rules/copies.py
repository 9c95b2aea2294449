"""TIE001 untied-copy: tensors stored apart whose bytes are equal, transposed or a cast of each other.

Stored apart means in separate storages: names viewing one storage (an LSTM's flattened weights,
a fused qkv sliced in three) are views of one buffer, and equal values there are never a finding.
Wasted bytes are what a rewrite saves, storage by storage (``graph.storage_use``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tieaudit.core.components import Components
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint, Format
from tieaudit.core.shell import Advice, advice, tieaudit_command
from tieaudit.core.units import human_bytes
from tieaudit.formats.capabilities import DEFAULT_RELATIONS, REPRESENTABLE, retied_name
from tieaudit.formats.hf.variants import weights_label, weights_target
from tieaudit.formats.hf_cache import in_hub_cache, snapshot_of
from tieaudit.formats.layer_names import layer_template
from tieaudit.graph.detect import CopyGroup
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.gguf_head import quantized_findings
from tieaudit.rules.texts import TIE001

if TYPE_CHECKING:
    from tieaudit.formats.family import Family

# The format knowledge below (the class table, loaders' rules, layouts, TorchScript, GGUF) is
# imported where a copy was found and needs it: an audit that finds none never loads it.


def retied_path(path: str, format: Format) -> str:
    """Where the suggested retie writes: beside the checkpoint, as NAME-retied with a suffix retie
    accepts for the format (``formats.capabilities.retied_name``); a folder's variant named by its
    shard index as the folder beside it, FOLDER-VARIANT-retied; for a checkpoint in a Hugging Face
    cache, the current folder instead (the cache is huggingface_hub's, and its files are links into
    shared blobs), or OUT when the current folder is in a cache too."""
    trimmed = path.rstrip("/") or path
    variant = ""
    if format == "hf-dir" and weights_target(trimmed):
        variant = "-" + weights_label(trimmed) if weights_label(trimmed) else ""
        trimmed = os.path.dirname(trimmed) or os.curdir
    own = os.path.basename(os.path.abspath(trimmed)) if trimmed in (os.curdir, os.pardir) else None
    parent = os.path.normpath(os.path.join(trimmed, os.pardir)) if own else os.path.dirname(trimmed)
    beside = os.path.join(parent, retied_name((own or os.path.basename(trimmed)) + variant, format))
    if not in_hub_cache(trimmed) and not in_hub_cache(beside):
        return beside
    if in_hub_cache(os.curdir):
        return "OUT"
    name = os.path.basename(beside)
    snapshot = snapshot_of(trimmed)
    if snapshot is not None and os.path.realpath(trimmed) == os.path.realpath(snapshot.folder):
        name = retied_name(snapshot.repo_id.rsplit("/", 1)[-1] + variant, format)  # named by its repository
    return os.path.join(os.curdir, name)


def _fix(ckpt: Checkpoint, relations: set[str], *, restored: bool, locked: str) -> Advice:
    """The retie command for these copies, with --relations only where the format needs it, and
    --all-equal where the format's loader would not restore them (restored false; locked: why the
    tie flag may not be set, which makes the advice to keep them instead)."""
    if ckpt.format == "gguf":
        from tieaudit.formats.gguf_heads import RECONVERT

        return advice(RECONVERT)
    if ckpt.format == "torchscript":  # tieaudit does not write TorchScript
        from tieaudit.formats.torchscript import REEXPORT

        return advice(REEXPORT)
    missing = sorted(relations - REPRESENTABLE[ckpt.format])
    if missing:
        return advice(
            f"a {ckpt.format} file cannot record a {' or '.join(missing)} copy; "
            "derive it from the wider tensor on load"
        )
    out = retied_path(ckpt.path, ckpt.format)
    extra = sorted(relations - DEFAULT_RELATIONS[ckpt.format])
    relations_option = ",".join(sorted(set(DEFAULT_RELATIONS[ckpt.format]) | set(extra)))
    options = ("--relations", relations_option) if extra else ()
    if any(g.verdict != "allowed" for g in ckpt.pickle_globals):
        command = tieaudit_command("retie", ckpt.path, out, options=options)
        return advice("save the tensors without the pickled objects (see pickle_globals), then ", command)
    if not restored and locked:
        return advice(f"keep them: {locked}")
    all_equal = () if restored else ("--all-equal",)
    from tieaudit.formats.hf.layouts import unit_loading

    if ckpt.format == "hf-dir" and unit_loading(ckpt.path) is not None:
        # its unit (modules.json, model_index.json) loads it from its place: a copy beside is never
        # loaded, so it is re-tied there, the original kept beside as a backup discovery skips
        return advice(tieaudit_command("retie", ckpt.path, options=(*options, *all_equal, "--in-place")))
    return advice(tieaudit_command("retie", ckpt.path, out, options=(*options, *all_equal)))


ON_LOAD = (
    "the adapter was made with ensure_weight_tying, which stores both and asks PEFT to tie them when it "
    "loads it; whether it does depends on PEFT recognising the base model's tie (check that the loaded "
    "model's embedding and head are one tensor)."
)
"""A copy a PEFT adapter made with ensure_weight_tying stores on purpose (``LoaderRule.ties_on_load``)."""

DECLARED = (
    "the config declares them tied, so the loader ties them again when it loads the folder: the copy "
    "costs the file's bytes, not a lost tie."
)
"""What a copy of a pair the folder's config declares tied is (from_pretrained restores the tie)."""

NOT_A_TIE_YET = "values that are equal are not a tie; each copy trains and loads as its own parameter."
"""What an equal copy is, in every TIE001 message but a PEFT adapter's stored-on-purpose pair."""

_WHAT = {"equal": "the same bytes as", "transposed": "the transpose of", "cast": "a lower-precision cast of"}


def group_relation(group: CopyGroup) -> str:
    """The group's relation: the members' one when they agree, else ``mixed`` (details say each)."""
    relations = {m.relation for m in group.members}
    return relations.pop() if len(relations) == 1 else "mixed"


def _by_construction(component: dict[str, int] | None, group: CopyGroup) -> bool:
    """Whether the model class is known (component: its tie components) and ties no two names of
    the group: equal by construction (deterministic initialisation, fixed tables), not a lost tie."""
    if component is None:
        return False
    found = [component[name] for name in group.names if name in component]
    return len(found) == len(set(found))


def _storage_note(group: CopyGroup) -> str:
    """What the message says of members whose storage is written anyway (another tensor views it)."""
    stays = [m.name for m in group.members if m.stays]
    if not stays:
        return ""
    if len(stays) == len(group.members):
        return (
            " No rewrite saves a byte of them: each copy is a slice of a storage that other tensors view "
            "too, and a storage is written whole (as torch.save writes an LSTM's flattened weights), so "
            "retie leaves them."
        )
    verb = "is a slice" if len(stays) == 1 else "are slices"
    return (
        f" {printable(', '.join(stays))} {verb} of storages that other tensors view too, written whole "
        "whatever happens to them: not counted as wasted, and retie leaves them."
    )


def _bare_note(family: Family | None, group: CopyGroup, *, format: Format, restored: bool) -> str:
    """What a bare file's class (recognised from its names, or not) says of a copy group."""
    from tieaudit.formats.family import LOADER

    if family is not None and family.by_construction(group.names):
        then = (
            "retie stores them once all the same: torch.load gives a dropped name back as a view, and "
            "load_state_dict copies it into each parameter."
            if format == "torch"
            else "retie leaves them; with --all-equal it drops all but one, which "
            "safetensors.torch.load_model(strict=True) then refuses to load into the class."
        )
        return (
            f" {family.none_ties('them')}: equal by construction (deterministic "
            f"initialisation, fixed tables), not a lost tie. {then}"
        )
    if family is not None and format == "safetensors" and family.accepts_any(group.names):
        return (
            f" {family.all_tie('them')}: retie re-ties them, and safetensors.torch.load_model restores "
            "the dropped name into the class built from its config."
        )
    if restored or format != "safetensors" or not any(m.relation == "equal" for m in group.members):
        return ""  # the loader restores it, or --all-equal does not apply (it re-ties equal copies)
    if family is not None and family.recognised:
        why = family.why_not(group.kept, group.members[0].name)
        return f" Not re-tied by default: {why}; with --all-equal, {LOADER}."
    near = family.closest_text() if family is not None else ""
    return (
        f" No model class is recognised from the tensor names{near}, so nothing says the model ties them: "
        f"with --all-equal, {LOADER}."
    )


def copy_findings(audited: Audited) -> Iterator[Finding]:
    """TIE001: one finding per copy group (names viewing one storage are views, never copies); its
    wasted bytes are the storages a rewrite would no longer write, each counted once. A group the
    known model class does not tie is a note: equal by construction, and retie leaves it; so is a
    group whose copies all sit in storages other tensors keep (nothing to save)."""
    ckpt, groups = audited.graph.checkpoint, audited.copies
    declared = {frozenset((s.tie.dropped, s.tie.kept)) for s in audited.graph.ties}
    class_ties = ckpt.config.class_ties if ckpt.config is not None else None
    component = Components(class_ties).numbered() if class_ties is not None else None
    templates = ckpt.config.layer_templates if ckpt.config is not None else None
    rule, family = None, None
    if groups:
        from tieaudit.formats.family import bare_family
        from tieaudit.formats.loaders import loader_rule

        rule = loader_rule(ckpt)  # retie's default, to say when it needs --all-equal
        family = bare_family(ckpt)  # a bare file's class, from its names
    for group in groups:
        relation = group_relation(group)
        parts = []
        for kind in ("equal", "transposed", "cast"):
            copies = [m.name for m in group.members if m.relation == kind]
            if copies:
                verb = "holds" if len(copies) == 1 else "hold"
                parts.append(f"{', '.join(copies)} {verb} {_WHAT[kind]} {group.kept}")
        by_construction = _by_construction(component, group) or (
            templates is not None and not any(layer_template(n) in templates for n in group.names)
        )
        lead = NOT_A_TIE_YET
        if by_construction:
            architecture = ckpt.config.architectures[0] if ckpt.config and ckpt.config.architectures else "?"
            note = (
                f" The model class {architecture} does not tie them: equal by construction (deterministic "
                "initialisation, fixed tables), not a lost tie. retie leaves them; with --all-equal it "
                "drops all but one, which from_pretrained would then initialise randomly."
            )
        elif any(pair <= frozenset(group.names) for pair in declared):  # a declared pair, both here
            note = ""
            lead = DECLARED
        else:
            note = ""
        on_load = rule is not None and any(pair <= frozenset(group.names) for pair in rule.ties_on_load)
        restored = rule is None or rule.accepts_any(group.names)
        if ckpt.config is None and not note:
            note = _bare_note(family, group, format=ckpt.format, restored=restored)
            by_construction = family is not None and family.by_construction(group.names)
        locked = rule.flag_locked if rule is not None else ""
        nothing_saved = all(m.stays for m in group.members)
        if on_load:
            fix = None
        elif nothing_saved:
            fix = advice("nothing to re-tie; if they should be one parameter, tie them in the model")
        else:
            fix = _fix(ckpt, {m.relation for m in group.members}, restored=restored, locked=locked)
        details: dict[str, object] = {
            "kept": group.kept,
            "relations": {m.name: m.relation for m in group.members},
        }
        if not nothing_saved and any(m.stays for m in group.members):
            details["stays"] = [m.name for m in group.members if m.stays]
        yield UNTIED_COPY.finding(
            group.names,
            f"{'; '.join(parts)} in separate storage ({human_bytes(group.wasted_bytes)} wasted): "
            f"{ON_LOAD if on_load else lead}" + _storage_note(group) + note,
            severity="note" if by_construction or nothing_saved or on_load else "warning",
            relation=relation,
            wasted_bytes=group.wasted_bytes,
            fix=fix,
            details=details,
        )
    yield from quantized_findings(audited, UNTIED_COPY)


UNTIED_COPY = Rule(text=TIE001, check=copy_findings)
