"""The ONNX commands: ``runtime`` (does ONNX Runtime copy a shared initializer?) and ``export``.

Registered on the main group with ``cli.add_command(runtime)`` and ``cli.add_command(export)``.
Heavy imports (onnxruntime, torch) happen in the library, and onnxruntime only in subprocesses;
a missing extra is one line before any work (``tieaudit.core.extras.require``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tieaudit.cli.common import (
    SizeParam,
    beside_errors,
    echo_error,
    output_options,
    report_width,
    user_errors,
    write_output,
)
from tieaudit.core.exit_codes import ExitCode

if TYPE_CHECKING:
    from tieaudit.rules.finding import Severity

F = TypeVar("F", bound=Callable[..., Any])


_CONFIG_NAMES = (
    "default",
    "disable_all",
    "no_constant_folding",
    "no_prepacking",
    "both_off",
    "fold_size_limit",
)


def _dims(values: tuple[str, ...]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for value in values:
        name, sep, size = value.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            message = f"use NAME=SIZE with a positive integer size (not {value!r})"
            raise click.BadParameter(message, param_hint="--dim")
        if name.strip() in dims:  # the last would win without a word
            raise click.BadParameter(f"{name.strip()!r} is given twice", param_hint="--dim")
        dims[name.strip()] = int(size)
    return dims


RUNTIME_DIM_HELP = (
    "Size of a symbolic input dimension (repeatable). Names containing batch default to "
    "--dim batch=N (1), names containing seq or len to --dim sequence=N (8), others to 1."
)
EXPORT_DIM_HELP = (
    "Example input size for a Hugging Face folder: --dim batch=N (1), --dim sequence=N (8), "
    "--dim decoder_sequence=N (4, seq2seq); all stay dynamic in the export. A module:function "
    "brings its own inputs. Any other name is a usage error."
)


def dim_option(help_text: str) -> Callable[[F], F]:
    """--dim NAME=SIZE (repeatable), shared by runtime and export."""
    return click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", help=help_text)


@click.command()
@click.argument("model", type=click.Path())
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=click.Choice(_CONFIG_NAMES),
    help="Session configuration to measure (repeatable). [default: all six]",
)
@dim_option(RUNTIME_DIM_HELP)
@click.option(
    "--runs", type=click.IntRange(min=1), default=10, show_default=True, help="Timed runs per configuration."
)
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds one configuration may take (session creation, runs, optimized model) before it is killed.",
)
@click.option(
    "--fold-limit",
    type=SizeParam(minimum=1),
    default=None,
    metavar="SIZE",
    help="fold_size_limit's optimization.constant_folding_max_output_size_in_bytes (bytes, 512KiB, "
    "1MB). [default: 1 MiB, "
    "or half the largest shared initializer when smaller, so that its transpose is not folded]",
)
@click.option(
    "--embed-weights",
    is_flag=True,
    help="Load external data into the session from memory, so RssAnon counts the weights.",
)
@click.option(
    "--memory-limit",
    type=SizeParam(),
    default=None,
    metavar="SIZE",
    envvar="TIEAUDIT_RUNTIME_MEMORY_LIMIT",
    show_envvar=True,
    help="Memory each probe may use (4GiB, 512MB, bytes); an allocation past it fails that configuration. "
    "[default: 512 MiB + 16 MiB per CPU + 8x the model's bytes]",
)
@click.option(
    "--fail-on",
    type=click.Choice(["error", "warning", "note"]),
    default="warning",
    show_default=True,
    help="Exit 1 when a TIE005 finding at or above this severity exists.",
)
@click.option("--exit-zero", is_flag=True, help="Report only: exit 0 with findings (errors still exit 2).")
@output_options(("text", "json"))
@user_errors
def runtime(
    model: str,
    configs: tuple[str, ...],
    dims: tuple[str, ...],
    *,
    runs: int,
    timeout: float,
    fold_limit: int | None,
    embed_weights: bool,
    memory_limit: int | None,
    fail_on: Severity,
    exit_zero: bool,
    fmt: str,
    output: str | None,
) -> None:
    """Does ONNX Runtime copy a shared initializer? Which session options stop it, at what cost?

    Each configuration runs in a fresh subprocess with a timeout: anonymous memory (RssAnon)
    after session creation and after --runs inferences on synthetic inputs, the peak (VmHWM),
    median latency. The optimized model ORT saves for each configuration is searched with
    tieaudit's detector: an initializer ORT created that holds the values of one of the input's
    (constant folding of Transpose(E)) is named, and a matrix prepacked for a MatMul while a
    Gather still reads it is predicted (TIE005).

    \b
    Configurations:
      default              ORT_ENABLE_ALL
      disable_all          ORT_DISABLE_ALL
      no_constant_folding  optimization.disable_specified_optimizers=ConstantFolding
      no_prepacking        session.disable_prepacking=1
      both_off             the two above together
      fold_size_limit      constant_folding_max_output_size_in_bytes=--fold-limit, prepacking off

    The recommendation is the configuration holding one copy with the lowest latency, with the
    Python lines that create it. With external data ORT memory-maps the weights (RssFile), so
    RSS under-reports them: RssAnon is measured, and the report says so.

    Each probe runs under --memory-limit (its writable memory, RLIMIT_DATA), and the synthetic
    inputs are built only up to 256 MiB each and 1 GiB together (symbolic sizes from --dim), so
    a model that asks for gigabytes fails in one line instead of exhausting the machine.

    Findings are the copies under default (or, when --config leaves default out, under the
    configurations given). Exit codes: 0 none at or above --fail-on; 1 findings; 2 a
    configuration crashed, timed out, failed or exceeded the memory limit, an input is over
    the size limit, or the model is unreadable.

    \b
    Examples:
      tieaudit runtime model.onnx
      tieaudit runtime model.onnx --config default --config both_off --dim sequence=128
      tieaudit runtime model.onnx --format json -o runtime.json
    """
    from tieaudit.report.runtime_report import render_runtime_json, render_runtime_text
    from tieaudit.runtime.measure import measure_runtime
    from tieaudit.runtime.memory import checked_memory_limit

    report = measure_runtime(
        model,
        configs=list(configs) or None,
        dims=_dims(dims),
        runs=runs,
        timeout=timeout,
        fold_limit=fold_limit,
        embed_weights=embed_weights,
        memory_limit=None if memory_limit is None else checked_memory_limit(memory_limit, "--memory-limit"),
    )
    errors = not beside_errors(output)  # each error once: stderr shows them beside the report
    write_output(
        render_runtime_json(report)
        if fmt == "json"
        else render_runtime_text(report, errors=errors, width=report_width(output)),
        output,
    )
    for result in report.errors:
        echo_error(f"{model}: config {result.config.name}: {result.error}")
    code = report.exit_code(fail_on, exit_zero=exit_zero)
    if code:
        raise click.exceptions.Exit(code)


@click.command()
@click.argument("source")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option(
    "--opset", type=click.IntRange(min=7), default=None, help="ONNX opset [default: the exporter's]."
)
@dim_option(EXPORT_DIM_HELP)
@click.option(
    "--atol",
    type=float,
    default=1e-4,
    show_default=True,
    help="Largest |ONNX Runtime - torch| accepted on the example inputs.",
)
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds the runtime check's ONNX Runtime subprocess may take.",
)
@user_errors
def export(
    source: str, out: str, opset: int | None, *, dims: tuple[str, ...], atol: float, timeout: float
) -> None:
    """Export a torch model to ONNX with its tie kept, and check it end to end.

    SOURCE is a Hugging Face model folder or module:function, imported from the current
    folder, returning (module, example_inputs) or (module, example_inputs, dynamic_shapes).
    A folder's class is the first of config.json's architectures that is a causal LM
    (input_ids -> logits), masked LM (input_ids, attention_mask -> logits) or seq2seq LM;
    other classes are refused. A seq2seq LM is two files, as optimum names them, in the
    folder OUT: encoder_model.onnx and decoder_model.onnx (without past key values), each
    checked alone. Batch and sequence stay dynamic (example sizes from --dim). Needs the
    export extra: pip install 'tieaudit[export]'.

    Steps: torch.onnx.export(dynamo=True) into a staging folder beside OUT; tieaudit's
    detector on the result; any copy re-tied with the ONNX retie writer (the exporter folds
    Transpose(E) into a copy for small matrices); parity against torch with ONNX Runtime (CPU);
    the static runtime check (TIE005 under ORT's default session options, reported, not
    failed). One summary on stderr at the end.

    Exit codes: 0 exported, parity within --atol and no copy left; 2 otherwise, with OUT
    (and OUT.data) not written.

    \b
    Examples:
      tieaudit export ./my-gpt2 model.onnx
      tieaudit export ./my-t5 t5-onnx
      tieaudit export mymodels:build tiny.onnx --atol 1e-5
    """
    from tieaudit.report.runtime_report import render_export_summary
    from tieaudit.runtime.export import export_model

    result = export_model(source, out, opset=opset, dims=_dims(dims), atol=atol, runtime_timeout=timeout)
    click.echo(render_export_summary(result), nl=False, err=True)
    if not result.written:
        raise click.exceptions.Exit(ExitCode.BAD_INPUT)
