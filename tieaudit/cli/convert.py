"""The ``convert`` command: a torch checkpoint to safetensors (registered on the main group)."""

from __future__ import annotations

import click

from tieaudit.cli.common import cached_input, runs_code_first, user_errors


@click.command()
@click.argument("source", metavar="IN", type=click.Path())
@click.argument("out", metavar="[OUT]", type=click.Path(), required=False)
@click.option("--dry-run", is_flag=True, help="Print the plan (names kept, dropped, bytes); write nothing.")
@user_errors
def convert(source: str, out: str | None, dry_run: bool) -> None:
    """Convert a .pt/.bin file, or a model folder of pytorch_model*.bin, to safetensors
    (and a safetensors file back to .pt).

    \b
    No code in the pickle runs and torch is not needed: tieaudit's own reader reads it
    (a pickle naming globals torch.load(weights_only=True) refuses is refused, exit 2),
    and each tensor's bytes are copied from the mapped input one tensor at a time.
    - Names viewing one storage the same way become one stored tensor plus a
      {dropped: kept} record. In a folder the kept name is one every class of the
      config's model type loads (the tie table: T5EncoderModel and
      T5ForConditionalGeneration both find shared.weight; RoBERTa's masked-LM head is
      tied again); a name the class does not tie is stored as its own copy. A single
      file has no config: the input-embedding side is kept.
    - A view of part of a storage (a fused qkv sliced in three) is written with its
      own bytes, never grown to the whole storage.
    - A folder keeps its layout: pytorch_model.bin -> model.safetensors, shards ->
      model-0000k-of-0000n.safetensors and model.safetensors.index.json (records in
      its metadata); the other files are copied.
    The output is written beside OUT, read back and compared with the input name by
    name, bit for bit, fsynced, then renamed into place; IN is never modified (it may be
    a repository id in the local Hugging Face cache, as for check). Exit 0
    written and verified (or a dry-run plan); 2 otherwise, with OUT not created.

    \b
    The reverse: a .safetensors IN with an OUT ending in .pt, .bin (...) is written with
    torch.save (torch extra), every {dropped: kept} name the kept tensor itself again
    (one storage, as retie writes .pt), verified the same way.

    \b
    Examples:
      tieaudit convert pytorch_model.bin model.safetensors
      tieaudit convert ./t5-small-bin ./t5-small-safetensors
      tieaudit convert ./t5-small-bin --dry-run
      tieaudit convert model.safetensors model.pt
    """
    from tieaudit.load import convert_checkpoint
    from tieaudit.report.convert_text import render_convert

    source, cache_note = cached_input(source, verb="read")
    with runs_code_first(source, cache_note):  # whoever has IN may load it another way: said first
        result = convert_checkpoint(source, out, dry_run=dry_run)
    for note in result.notes:
        click.echo(f"tieaudit: note: {note}", err=True)
    click.echo(render_convert(result), nl=False, err=not dry_run)
