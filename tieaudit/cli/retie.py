"""The ``retie`` command: copies back into one stored tensor (registered on the main group)."""

from __future__ import annotations

import click

from tieaudit.cli.common import SizeParam, cached_input, runs_code_first, user_errors
from tieaudit.graph import DEFAULT_MIN_BYTES
from tieaudit.repair import BACKUP_SUFFIX


def _relations(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    chosen = frozenset(part.strip() for part in value.split(",") if part.strip())
    unknown = chosen - {"equal", "transposed", "cast"}
    if unknown or not chosen:
        raise click.BadParameter(f"use a comma-separated subset of equal,transposed,cast (not {value!r})")
    return chosen


@click.command()
@click.argument("source", metavar="IN", type=click.Path())
@click.argument("out", metavar="[OUT]", type=click.Path(), required=False)
@click.option("--dry-run", is_flag=True, help="Print the plan and the bytes saved; write nothing.")
@click.option(
    "--keep",
    metavar="NAME",
    default=None,
    help="Keep this name's bytes (default: the widest dtype, then the input-embedding side: "
    "embed_tokens, wte, shared, word_embeddings, the ONNX Gather input).",
)
@click.option(
    "--relations",
    metavar="LIST",
    default=None,
    help="Copies to re-tie: a subset of equal,transposed,cast. [default: what the format's "
    "own loaders restore: equal (in safetensors and folders only the pairs the loader restores, "
    "see --all-equal), plus transposed in .pt and ONNX]",
)
@click.option(
    "--all-equal",
    is_flag=True,
    help="Also re-tie equal copies the format's loader does not restore by itself (safetensors "
    "files: pairs no {dropped: kept} record names and the class recognised from the tensor names "
    "does not tie by default; folders: pairs the model class does not tie). "
    "The plan prints each consequence. --relations alone never does this.",
)
@click.option(
    "--in-place",
    is_flag=True,
    help=f"Replace IN (OUT left out, or IN itself); the original is kept as IN{BACKUP_SUFFIX}, "
    "a name check skips.",
)
@click.option(
    "--force-format",
    is_flag=True,
    help="Accept OUT's name as it is, even when its suffix is not the input format's "
    "(.safetensors; .pt, .pth, .bin, .ckpt or .tar; .onnx; no checkpoint suffix for a folder). "
    "The output is still written in the input's format.",
)
@click.option(
    "--min-size",
    type=SizeParam(),
    default=DEFAULT_MIN_BYTES,
    show_default=True,
    metavar="SIZE",
    help="Tensors smaller than this are never copy candidates: bytes, or 1MB (10^6), 1MiB (2^20).",
)
@user_errors
def retie(
    source: str,
    out: str | None,
    dry_run: bool,
    *,
    keep: str | None,
    relations: str | None,
    all_equal: bool,
    in_place: bool,
    force_format: bool,
    min_size: int,
) -> None:
    """Turn copies back into one stored tensor, verified bit for bit, written atomically.

    \b
    By default the output is what the format's usual loader accepts:
    - safetensors file: an equal copy is re-tied only when a {dropped: kept} record
      already names the pair, or the model class recognised from the tensor names
      ties it by default (safetensors.torch.load_model restores a name only when the
      live model shares it, and ignores records).
    - Hugging Face folder: only pairs the model class ties (from_pretrained restores
      nothing else), plus the class's other pairs that setting tie_word_embeddings
      ties, when their stored bytes are equal (a masked-LM head's bias).
    - .pt and ONNX: every copy of the chosen relations.
    Tensors equal by construction (Mamba's A_log in every layer, sinusoidal position
    tables, shared experts) are not ties: the plan lists them as left. --all-equal
    re-ties every equal copy and prints what the loader will then do with it;
    --relations equal does not override the loader rule.

    Each re-tied copy keeps one stored tensor; the others are recorded so that loaders
    restore them:

    \b
    - safetensors: dropped names as {dropped: kept} in __metadata__ (the convention of
      safetensors.torch.save_model); transposed and cast copies under the tieaudit.ties
      key, restored only by tieaudit.load_tied, so they need --relations.
    - Hugging Face folders: shards and index rewritten; config.json tie_word_embeddings
      set true when the word-embedding pair is re-tied.
    - .pt: dropped names reference the kept tensor (a transposed copy becomes its .t()
      view), so torch.load returns one storage; everything else is preserved
      (non-tensor entries in their order, dtypes, strides, each storage's recorded
      location: cuda:0 stays cuda:0, though no GPU is needed).
    - ONNX: consumers re-pointed to the kept initializer; a transposed copy becomes a
      Transpose node (MatMul->Gemm would need 2-D inputs). The file stores the matrix
      once; ONNX Runtime's constant folding may materialise the transpose again at
      session creation (tieaudit runtime measures it). External data goes to OUT.data.

    IN may be a repository id in the local Hugging Face cache (org/name[@revision], as
    for check); --in-place is then refused.

    Say where the output goes: OUT, --in-place (OUT left out; the original is kept as
    IN.tieaudit-backup, which check skips) or --dry-run. OUT is written in IN's format,
    so its name must end in that format's suffix (.safetensors; .pt, .pth, .bin, .ckpt,
    .tar; .onnx; a folder's OUT has none) unless --force-format.

    The output is written beside OUT, read back and compared with the input name by
    name, fsynced, then renamed into place. IN is never modified (with --in-place it
    becomes IN.tieaudit-backup). When the plan re-ties nothing, nothing is written (no
    OUT, no backup) and retie says "nothing to re-tie", exit 0. Exit 0 written and
    verified (or a dry-run plan); 2 otherwise, with OUT not created.

    \b
    Examples:
      tieaudit retie model.safetensors --dry-run
      tieaudit retie ./llama ./llama-tied
      tieaudit retie model.safetensors --in-place
      tieaudit retie model.onnx model-tied.onnx
      tieaudit retie ckpt.safetensors out.safetensors --relations equal,transposed,cast
      tieaudit retie merged.safetensors out.safetensors --all-equal
    """
    from tieaudit.repair.retie import retie as run_retie
    from tieaudit.report.plan import render_plan

    given, (source, cache_note) = source, cached_input(source, verb="read")
    with runs_code_first(source, cache_note):  # whoever has IN may load it another way: said first
        if in_place and source != given:
            raise click.UsageError(
                f"--in-place would rewrite the Hugging Face cache's {given}; give an OUT outside it"
            )
        result = run_retie(
            source,
            out,
            relations=_relations(relations),
            keep=keep,
            dry_run=dry_run,
            in_place=in_place,
            min_bytes=min_size,
            all_equal=all_equal,
            force_format=force_format,
        )
    for note in result.notes:
        click.echo(f"tieaudit: note: {note}", err=True)
    click.echo(render_plan(result), nl=False, err=not dry_run)
    if dry_run:
        return
