"""Pieces every command shares: one-line errors, --format/--output, writing reports."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from tieaudit.core.errors import OUT_OF_MEMORY, TieauditError
from tieaudit.core.escape import printable
from tieaudit.core.exit_codes import ExitCode
from tieaudit.core.interrupts import Interrupted, exit_status, interrupted_line, process_signal
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


DEBUG = "tieaudit.debug"
"""ctx.meta key --debug sets (meta is shared by the group's context and the command's)."""


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[DEBUG] = True


def debug_option() -> click.Option:
    """--debug, accepted before the command (on the group) and after it (on every command)."""
    return click.Option(
        ["--debug"],
        is_flag=True,
        expose_value=False,
        callback=_set_debug,
        help="Show tracebacks for errors (for bug reports); before or after the command.",
    )


class TieauditGroup(click.Group):
    """The command group: global options (--debug) are accepted after the command too, and a bare
    ``tieaudit`` is a one-line usage error (exit 2, like click's own no-command case) rather than
    the whole help printed as an error."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Register cmd with the group's global options added to it (once, however often it is
        registered: a command object may be added again, by a test or a reload)."""
        if not any(param.name == "debug" for param in cmd.params):
            cmd.params.append(debug_option())
        super().add_command(cmd, name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Refuse an empty command line in one line, naming the commands."""
        if not args and not ctx.resilient_parsing:
            raise click.UsageError(f"missing command: one of {', '.join(self.list_commands(ctx))}", ctx)
        return super().parse_args(ctx, args)


def debugging() -> bool:
    """Whether --debug was given (anywhere on the command line) or TIEAUDIT_DEBUG is set."""
    ctx = click.get_current_context(silent=True)
    return bool(os.environ.get("TIEAUDIT_DEBUG")) or (ctx is not None and bool(ctx.meta.get(DEBUG)))


def user_errors(command: F) -> F:
    """Turn library errors into one line and exit 2 (a traceback only with --debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TieauditError as exc:
            if debugging():
                raise
            raise CliError(str(exc)) from exc
        except MemoryError:
            if debugging():
                raise
            raise CliError(f"{_input_of(kwargs)}: {OUT_OF_MEMORY}") from None

    return wrapper  # type: ignore[return-value]


def _input_of(arguments: dict[str, Any]) -> str:
    """The input a command was given (its first argument: PATH, SOURCE or MODEL), for an error line."""
    for name in ("path", "source", "model", "paths"):
        value = arguments.get(name)
        if value:
            return ", ".join(value) if isinstance(value, tuple) else str(value)
    return "tieaudit"


def from_cache(path: str, *, verb: str = "audited") -> str:
    """PATH, or the Hugging Face cache snapshot it names as a repository id (with a note saying
    which); an id the cache lacks is an InputError."""
    resolved, note = cached_input(path, verb=verb)
    if note is not None:
        echo_note(note)
    return resolved


def cached_input(path: str, *, verb: str) -> tuple[str, str | None]:
    """``from_cache`` without printing: PATH or its cache snapshot, and the note to print, if any."""
    from tieaudit.formats.hf_cache import cache_note, cached_argument

    snapshot = cached_argument(path)
    if snapshot is None:
        return path, None
    return snapshot.folder, cache_note(path, snapshot, verb=verb)


@contextlib.contextmanager
def runs_code_first(path: str, cache_note: str | None) -> Iterator[None]:
    """retie's and convert's run (the block) with what IN's pickle runs when loaded (TIE010) said
    before anything else: as the first line when the run goes on (the cache note, if any, after
    it), at the front of its one error line when it stops (bad input stays one line)."""
    from tieaudit.repair.runs_code import runs_code_warning

    warning = runs_code_warning(path)
    if warning is None:
        if cache_note is not None:
            echo_note(cache_note)
        yield
        return
    try:
        yield
    except TieauditError as exc:
        exc.message = f"{warning}; {exc.message}"
        raise
    except click.UsageError as exc:
        raise click.UsageError(f"{path}: {warning}; {exc.format_message()}", exc.ctx) from None
    echo_warning(f"{path}: {warning}")
    if cache_note is not None:
        echo_note(cache_note)


STDOUT = "-"
"""``-o -``: the report goes to stdout, as without -o."""


def to_terminal(output: str | None) -> bool:
    """Whether the report goes to a terminal (so colour and width may follow it)."""
    return output in (None, STDOUT) and sys.stdout.isatty()


def use_color(output: str | None) -> bool:
    """Whether the report is coloured, decided here for every command: never with NO_COLOR set
    (non-empty, no-color.org; it wins, as in Python's own colour rules) or into an --output file;
    always on stdout with FORCE_COLOR set (non-empty), even a pipe; else only on a terminal."""
    if os.environ.get("NO_COLOR") or output not in (None, STDOUT):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or sys.stdout.isatty()


def report_width(output: str | None) -> int:
    """Columns the text report fits in: COLUMNS when set (also for a pipe or an --output file), else
    the terminal's width when the report goes to one, else DEFAULT_WIDTH; at least MIN_WIDTH."""
    import shutil

    from tieaudit.report.plain import DEFAULT_WIDTH, MIN_WIDTH

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        width = int(columns)
    elif to_terminal(output):
        width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    else:
        width = DEFAULT_WIDTH
    return max(width, MIN_WIDTH)


def beside_errors(output: str | None) -> bool:
    """Whether the report lands where stderr's error lines do (the same terminal, or ``2>&1``): a
    report listing its errors would then show each one twice."""
    if output not in (None, STDOUT):
        return False
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (OSError, ValueError, io.UnsupportedOperation):  # a stream without a descriptor (tests)
        return False


def write_output(text: str, output: str | None) -> None:
    """Write the report to --output (a file atomically, a device or FIFO directly) or stdout."""
    if output is None or output == STDOUT:
        # color=True: use_color decided already (FORCE_COLOR into a pipe); click would strip it
        click.echo(text, nl=False, color=True)
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


class ReportParam(click.ParamType[tuple[str, str]]):
    """FORMAT=FILE: one more report of the same run (check --report), written to FILE."""

    name = "format=file"

    def __init__(self, formats: tuple[str, ...]) -> None:
        self.formats = formats

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        """(format, file); a click usage error (one line, exit 2) naming the formats otherwise."""
        if isinstance(value, tuple):
            return value  # already converted (a default)
        fmt, sep, path = str(value).partition("=")
        if not sep or fmt not in self.formats or not path or path == STDOUT:
            self.fail(
                f"{value!r} is not FORMAT=FILE, FORMAT one of {', '.join(self.formats)} and FILE a "
                "path (stdout is --format's), e.g. sarif=tieaudit.sarif",
                param,
                ctx,
            )
        return fmt, path


def exit_code_of(exc: BaseException) -> int:
    """What main does with an exception a command raised: one line (a traceback for a bug) and the
    exit code. A signal ends the run as interrupted (130, 143), also when a library turned the
    Interrupted it raised into an error of its own (torch: a RuntimeError)."""
    signum = exc.signum if isinstance(exc, Interrupted) else process_signal()
    if signum is not None:
        click.echo(interrupted_line(signum), err=True)
        return exit_status(signum)
    if isinstance(exc, click.UsageError):
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        echo_error(f"{exc.format_message()}{hint}")
        return ExitCode.BAD_INPUT
    if isinstance(exc, click.ClickException):
        exc.show()
        return ExitCode.BAD_INPUT if exc.exit_code == 1 else exc.exit_code  # click's UsageError is 2 already
    if isinstance(exc, click.Abort):
        click.echo("tieaudit: aborted", err=True)
        return ExitCode.BAD_INPUT
    if isinstance(exc, MemoryError):  # outside a command's own handling (click, the report): not a bug
        echo_error(OUT_OF_MEMORY)
        return ExitCode.BAD_INPUT
    import traceback

    traceback.print_exc()  # a TieauditError here was re-raised under --debug, for its traceback
    if isinstance(exc, TieauditError):
        echo_error(str(exc))
        return ExitCode.BAD_INPUT
    click.echo(
        "tieaudit: internal error: this is a bug in tieaudit; please report it with the traceback above",
        err=True,
    )
    return ExitCode.INTERNAL_ERROR
