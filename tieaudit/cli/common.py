"""Pieces every command shares: one-line errors, --format/--output, writing reports."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tieaudit.core.errors import TieauditError
from tieaudit.core.escape import printable
from tieaudit.core.exit_codes import ExitCode
from tieaudit.core.units import parse_size

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A user-facing error: one line on stderr, exit 2."""

    exit_code = ExitCode.BAD_INPUT

    def show(self, file: Any = None) -> None:
        echo_error(self.format_message())


def echo_error(message: str) -> None:
    """``tieaudit: error: <message>`` on stderr, as one line whatever names the message holds."""
    click.echo(f"tieaudit: error: {printable(message)}", err=True)


def echo_warning(message: str) -> None:
    """``tieaudit: warning: <message>`` on stderr: an option did nothing (the exit code is unchanged)."""
    click.echo(f"tieaudit: warning: {printable(message)}", err=True)


def echo_note(message: str) -> None:
    """``tieaudit: <message>`` on stderr (summaries, progress), escaped like errors."""
    click.echo(f"tieaudit: {printable(message)}", err=True)


def user_errors(command: F) -> F:
    """Turn library errors into one line and exit 2 (a traceback only with --debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TieauditError as exc:
            ctx = click.get_current_context(silent=True)
            if ctx is not None and (ctx.find_root().params.get("debug") or os.environ.get("TIEAUDIT_DEBUG")):
                raise
            raise CliError(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def from_cache(path: str, *, verb: str = "audited") -> str:
    """PATH, or the Hugging Face cache snapshot it names as a repository id (with a note saying
    which); an id the cache lacks is an InputError."""
    from tieaudit.formats.hf_cache import cache_note, cached_argument

    snapshot = cached_argument(path)
    if snapshot is None:
        return path
    echo_note(cache_note(path, snapshot, verb=verb))
    return snapshot.folder


STDOUT = "-"
"""``-o -``: the report goes to stdout, as without -o."""


def to_terminal(output: str | None) -> bool:
    """Whether the report goes to a terminal (so colour and width may follow it)."""
    import sys

    return output in (None, STDOUT) and sys.stdout.isatty()


def write_output(text: str, output: str | None) -> None:
    """Write the report to --output (a file atomically, a device or FIFO directly) or stdout."""
    if output is None or output == STDOUT:
        click.echo(text, nl=False)
        return
    from tieaudit.core.atomic import write_text_atomic

    write_text_atomic(output, text)


def output_options(formats: tuple[str, ...]) -> Callable[[F], F]:
    """--format and --output, shared by the commands that write a report."""

    def decorate(command: F) -> F:
        command = click.option(
            "--output",
            "-o",
            type=click.Path(dir_okay=False),
            default=None,
            help="Write the report to this file instead of stdout ('-': stdout). A device or FIFO "
            "(/dev/null, a pipe) is written to directly; a file is replaced atomically.",
        )(command)
        return click.option(
            "--format",
            "-f",
            "fmt",
            type=click.Choice(formats),
            default=formats[0],
            show_default=True,
            help="Report format.",
        )(command)

    return decorate


class SizeParam(click.ParamType[int]):
    """A size in bytes, written 4GiB, 512MB, 1.5MiB or 1048576 (tieaudit.core.units.parse_size): every
    size option reads sizes this one way, as the policy's size keys do."""

    name = "size"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The size in bytes; a click usage error (one line, exit 2) when value is not a size."""
        try:
            size = value if isinstance(value, int) else parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if size < self.minimum:
            self.fail(
                f"{value!r} is less than {self.minimum} byte{'s' if self.minimum != 1 else ''}", param, ctx
            )
        return size
