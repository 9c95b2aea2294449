"""Command line: parse options, call the library, map the outcome to an exit code. Nothing else."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from tieaudit.core.choices import CheckFormat, InspectFormat
    from tieaudit.rules.finding import Severity

from tieaudit.cli.check_output import report_failures, show_check
from tieaudit.cli.common import (
    STDOUT,
    ReportParam,
    SizeParam,
    TieauditGroup,
    debug_option,
    echo_error,
    echo_note,
    echo_warning,
    exit_code_of,
    from_cache,
    output_options,
    report_width,
    use_color,
    user_errors,
    write_output,
)
from tieaudit.cli.rule import ListsRules
from tieaudit.core.choices import CHECK_FORMATS, INSPECT_FORMATS
from tieaudit.core.exit_codes import ExitCode
from tieaudit.core.interrupts import Interrupted, process_signal
from tieaudit.core.shell import tieaudit_command
from tieaudit.core.units import agree, plural
from tieaudit.core.version import __version__
from tieaudit.gate import CONNECT_TIMEOUT_S
from tieaudit.graph import DEFAULT_MIN_BYTES


@click.group(
    cls=TieauditGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="tieaudit")
def cli() -> None:
    """Audit machine-learning checkpoints for weight tying.

    A tie is one parameter used in two places (input embedding and output projection).
    Formats, converters and runtimes silently turn it into two copies; tieaudit finds
    the copies, fixes them and fails a release that gets it wrong.

    Exit codes: 0 clean, 1 findings at or above --fail-on (check, runtime), 2 usage error
    or unreadable, unsafe or unsupported input, 3 a bug in tieaudit (please report it).

    Shell completion: eval "$(_TIEAUDIT_COMPLETE=bash_source tieaudit)" (zsh_source, fish_source).
    """


cli.params.append(debug_option())


@cli.command()
@click.argument("path", type=click.Path())
@output_options(INSPECT_FORMATS)
@user_errors
def inspect(path: str, fmt: InspectFormat, output: str | None) -> None:
    """Show which names share one storage, which ties are declared, and the tensors.

    PATH is a PyTorch .pt/.pth/.bin file, a .safetensors file, an .onnx model or a
    Hugging Face model folder, or a repository id in the local Hugging Face cache
    (org/name[@revision], read offline); the format is found from the content. Tensor bytes are
    not read to build the alias graph; pickles are parsed, never run. A folder that is
    not one model is refused with the list of checkpoints `check` audits in it.

    \b
    Examples:
      tieaudit inspect model.pt
      tieaudit inspect ./my-llama --format json -o report.json
      tieaudit inspect model.onnx --format dot | dot -Tsvg > ties.svg
    """
    from tieaudit.audit import audit_path
    from tieaudit.report import render

    given, path = path, from_cache(path)
    others: tuple[str, ...] = ()
    if os.path.isdir(path):
        from tieaudit.gate.discover import folder_checkpoints

        one_model, others = folder_checkpoints(path)
        if not one_model:
            _not_one_model(path, others, given=given)
    audit = audit_path(path).as_given(path, given)
    write_output(render(audit, fmt, color=use_color(output), width=report_width(output)), output)
    if others:
        count = plural(len(others), "other checkpoint")
        command = tieaudit_command("check", given)
        echo_note(f"{count} in {path} {agree(len(others), 'is')} audited by `{command}`")


def _not_one_model(path: str, checkpoints: tuple[str, ...], *, given: str) -> None:
    """inspect of a folder that is not one model (given: as typed, a cache's repository id for
    its snapshot): what `check` would audit in it instead; exit 2."""
    why = "no config.json or shard index beside weights"
    if not checkpoints:
        echo_error(f"{path}: no weights found: not one model ({why}), and no checkpoint under it")
    else:
        count = plural(len(checkpoints), "checkpoint")
        command = tieaudit_command("check", given)
        echo_error(f"{path}: not one model ({why}); `{command}` audits the {count} under it:")
        for checkpoint in checkpoints:
            echo_note(f"  {checkpoint}")
    raise click.exceptions.Exit(ExitCode.BAD_INPUT)


@cli.command(cls=ListsRules)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Policy file: tieaudit.toml, or pyproject.toml with [tool.tieaudit]. Default: the first "
    "folder from the current one up to the repository root (.git) holding either (both: an error).",
)
@click.option(
    "--fail-on",
    type=click.Choice(["error", "warning", "note"]),
    default=None,
    help="Exit 1 when a finding at or above this severity exists. [default: policy, else warning]",
)
@click.option(
    "--min-size",
    type=SizeParam(),
    default=None,
    metavar="SIZE",
    help="Tensors smaller than this are never copy candidates: bytes, or 1MB (10^6), 1MiB (2^20). "
    f"[default: policy, else {DEFAULT_MIN_BYTES}]",
)
@click.option(
    "--ignore",
    "ignored",
    multiple=True,
    metavar="RULE",
    help="Do not report this rule id, in any letter case (repeatable), e.g. --ignore TIE004.",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Skip what a folder argument holds whose path or name matches (repeatable; ** spans "
    "folders). Relative to the policy file's folder, else the current folder, as [[path]] globs; "
    "a pattern matching nothing is a warning. Paths named on the command line are always checked.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    help="Checkpoints audited at once, each in a process of its own (1: in this one). [default: CPU count]",
)
@click.option(
    "--executor",
    default="local",
    show_default=True,
    metavar="URL",
    help="Where the audits run: local (this machine, --jobs processes), or dask://HOST:PORT, the "
    "workers of a running Dask scheduler (one task per checkpoint; needs the dask extra here and "
    "tieaudit on every worker, which reads each PATH at its absolute path: a shared filesystem). "
    "The report and the exit code are the same; --jobs is ignored with a warning.",
)
@click.option(
    "--connect-timeout",
    type=float,
    default=CONNECT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="With --executor dask://, how long reaching the scheduler may take before exit 2.",
)
@click.option(
    "--baseline",
    "baseline_path",
    type=click.Path(dir_okay=False),
    help="Accept the findings this baseline file lists: reported as baselined, never failing.",
)
@click.option(
    "--write-baseline",
    "write_baseline_path",
    type=click.Path(dir_okay=False),
    help="Write every current finding to this baseline file; exit 0 (2 if a path is unreadable).",
)
@click.option(
    "--runtime",
    is_flag=True,
    help="For ONNX models, also run ONNX Runtime's optimizer (default session options) and report "
    "initializers it duplicates (TIE005). Needs the runtime extra. ONNX Runtime runs under a memory "
    "limit derived from the model's size; TIEAUDIT_RUNTIME_MEMORY_LIMIT=SIZE (4GiB, 512MB) sets it.",
)
@click.option("--exit-zero", is_flag=True, help="Always exit 0 unless the audit itself failed.")
@click.option(
    "--show-files",
    is_flag=True,
    help="After the text report, list every file under the PATHs with its verdict: audited, covered "
    "(read with a model folder or as an ONNX model's external data), skipped (with the reason) or "
    "error. --format json always lists them, as files.",
)
@click.option(
    "--show-settings",
    is_flag=True,
    help="Print the settings in force (policy file found, every key with its value and where it "
    "came from: the file, the command line or the default) and exit 0 without auditing.",
)
@click.option(
    "--skip-lfs-pointers",
    is_flag=True,
    help="A Git LFS pointer named as a PATH (or a model folder holding one) is skipped with a note "
    "instead of being an error (the pre-commit hook sets it).",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Only failures: the report keeps FAIL checkpoints and errors (json and sarif stay whole), "
    "no notes on stderr, and the closing line only when something failed or could not be read.",
)
@click.option(
    "--report",
    "reports",
    multiple=True,
    type=ReportParam(CHECK_FORMATS),
    help="Also write the report in FORMAT to FILE, from the same audit (repeatable), e.g. "
    '--format github --report sarif=tieaudit.sarif --report markdown="$GITHUB_STEP_SUMMARY".',
)
@output_options(CHECK_FORMATS)
@user_errors
@report_failures
def check(
    paths: tuple[str, ...],
    policy_path: str | None,
    fail_on: Severity | None,
    *,
    min_size: int | None,
    ignored: tuple[str, ...],
    exclude: tuple[str, ...],
    jobs: int | None,
    executor: str,
    connect_timeout: float,
    baseline_path: str | None,
    write_baseline_path: str | None,
    runtime: bool,
    exit_zero: bool,
    show_files: bool,
    show_settings: bool,
    skip_lfs_pointers: bool,
    quiet: bool,
    reports: tuple[tuple[CheckFormat, str], ...],
    fmt: CheckFormat,
    output: str | None,
) -> None:
    """Gate a release: exit 1 when findings reach --fail-on.

    PATH is a checkpoint file, a Hugging Face model folder (one model), or any other
    folder, searched for .pt/.pth/.bin/.ckpt/.pth.tar/.safetensors/.onnx/.gguf files, for
    files torch.load would take under any name (found by content: .pkl, .pth.zip, none),
    and model folders (hidden folders skipped); in a model folder, every file its reader does not
    read (an onnx/ export, a variant safetensors, a .ckpt) is audited on its own. Every
    other file is skipped with a reason, counted in the closing line (--show-files lists
    them). Checkpoints are audited in parallel, in --jobs processes, or on the workers of
    a Dask cluster (--executor dask://HOST:PORT). A PATH that does not exist and reads
    as a repository id (org/name[@revision]) is its snapshot in the local Hugging Face
    cache ($HF_HUB_CACHE, else $HF_HOME/hub), read offline, never downloaded; a note
    names the snapshot audited.

    Each finding names the rule it breaks; every rule is listed under Rules at the end,
    and `tieaudit rule ID` explains one (when it fires, the fix, how to silence it).

    Equality is byte equality: +0.0 and -0.0 differ, NaNs must have the same payload,
    and no tolerance applies (a head one optimizer step away differs by ~2e-5 and is
    not a tie). Constant tensors (LayerNorm ones, zero biases) and tensors under
    --min-size are never copy candidates.

    Exit codes: 0 nothing at or above --fail-on (baselined findings do not count);
    1 findings; 2 usage error, nothing found to check, or any path unreadable, unsafe
    or unsupported (the audit is incomplete); 3 a bug in tieaudit.

    \b
    Examples:
      tieaudit check model.safetensors
      tieaudit check ./release-llama --fail-on error --format json -o audit.json
      tieaudit check models/ --exclude 'models/legacy/**' --jobs 4 --policy tieaudit.toml
      tieaudit check /shared/models --executor dask://scheduler:8786 --format json -o audit.json
      tieaudit check models/ --format sarif -o tieaudit.sarif
      tieaudit check models/ --format markdown >> "$GITHUB_STEP_SUMMARY"
      tieaudit check models/ --format github --quiet
      tieaudit check models/ --write-baseline tieaudit-baseline.json
      tieaudit check models/ --baseline tieaudit-baseline.json
      tieaudit check model.onnx --runtime
      tieaudit check ./hf-repo --show-files
      tieaudit check meta-llama/Llama-3.2-1B@main
      tieaudit check --show-settings
    """
    import dataclasses

    from tieaudit.core.atomic import require_writable
    from tieaudit.gate.baseline import fingerprint_root, load_baseline, write_baseline
    from tieaudit.gate.check import run_check
    from tieaudit.rules.policy import load_policy

    policy = load_policy(policy_path).overridden(fail_on, min_size, ignored)
    if runtime:
        policy = dataclasses.replace(policy, runtime=True)
    if show_settings:
        from tieaudit.report.settings import render_settings

        write_output(render_settings(policy, exclude=exclude), output)
        return
    if not paths:
        raise click.UsageError("Missing argument 'PATHS...' (only --show-settings runs without one)")
    for written in (write_baseline_path, output, *(path for _, path in reports)):  # said before any audit
        if written is not None and written != STDOUT:
            require_writable(written)
    baseline = load_baseline(baseline_path) if baseline_path else None
    root = fingerprint_root(baseline, write_baseline_path)
    result = run_check(
        paths,
        policy,
        exclude=exclude,
        jobs=jobs,
        executor=executor,
        connect_timeout=connect_timeout,
        baseline=baseline,
        fingerprint_root=root,
        progress=sys.stderr.isatty() and not quiet,
        skip_lfs_pointers=skip_lfs_pointers,
    )
    for warning in result.warnings:
        echo_warning(warning)
    show_check(result, fmt, output, quiet=quiet, show_files=show_files, reports=reports)
    code = result.exit_code(writing_baseline=write_baseline_path is not None, exit_zero=exit_zero)
    if write_baseline_path and code != ExitCode.BAD_INPUT:
        count = write_baseline(write_baseline_path, result.audits)
        echo_note(f"wrote {plural(count, 'finding')} to {write_baseline_path}")
    if code:
        raise click.exceptions.Exit(code)


def _register_commands() -> None:
    # Defined in their own modules (ONNX Runtime and torch stay lazy imports inside the commands).
    from tieaudit.cli.convert import convert
    from tieaudit.cli.onnx import export, runtime
    from tieaudit.cli.retie import retie
    from tieaudit.cli.rule import rule

    cli.add_command(retie)
    cli.add_command(convert)
    cli.add_command(runtime)
    cli.add_command(export)
    cli.add_command(rule)


_register_commands()


def _quiet_warnings(argv: list[str] | None) -> None:
    """No Python warnings on stderr (a CI log reads one line per problem) unless debugging."""
    import os
    import warnings

    args = sys.argv[1:] if argv is None else argv
    if "--debug" not in args and not os.environ.get("TIEAUDIT_DEBUG"):
        warnings.simplefilter("ignore")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (cli.launch guards signals first)."""
    _quiet_warnings(argv)
    try:
        # standalone_mode=False: click returns an Exit's code instead of calling sys.exit.
        code = cli.main(args=argv, prog_name="tieaudit", standalone_mode=False)
        code = code if isinstance(code, int) else ExitCode.OK
    except click.exceptions.Exit as exc:
        code = int(exc.exit_code)
    except (Exception, Interrupted) as exc:
        return exit_code_of(exc)
    signum = process_signal()  # caught, and swallowed on the way by a library: the run was interrupted
    return code if signum is None else exit_code_of(Interrupted(signum))


if __name__ == "__main__":  # python -m tieaudit.cli.main: as cli.launch, once the imports are done
    from tieaudit.core.interrupts import guard_process

    guard_process()
    sys.exit(main())
