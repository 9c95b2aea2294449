"""Helpers shared by the benchmarks in bench/: synthetic checkpoints and subprocess measurement.

Nothing here imports torch or tieaudit (and numpy only to generate files): a benchmark measures
those in child processes, so their import cost is part of what is measured, never of the harness;
and a small harness keeps the os.wait4 fallback's RSS floor low (see run_measured).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
OUT_DIR = os.path.join(BENCH_DIR, "out")
MIB = 1 << 20

GENERATOR_VERSION = 1
"""Bump when the bytes a spec produces change, so cached files are rebuilt."""

BF16_ONE = 0x3F80
CHUNK_ELEMENTS = 1 << 22
"""Elements generated per step (16 MiB of float32): bounds the generator's memory."""


# --------------------------------------------------------------------------- synthetic files


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a synthetic bf16 safetensors file."""

    name: str
    shape: tuple[int, ...]
    fill: str = "normal"
    """normal (N(0, 0.02) truncated to bf16), ones or zeros."""
    stream: str | None = None
    """Name whose random stream to reuse: the same stream gives byte-identical values."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return 2 * self.numel


def llama_specs(
    layers: int = 17,
    hidden: int = 2048,
    intermediate: int = 5632,
    vocab: int = 32000,
    untied_head: bool = True,
    kv_hidden: int | None = None,
) -> list[TensorSpec]:
    """A Llama-shaped state dict (TinyLlama-like widths); lm_head is a byte copy of the embedding.

    kv_hidden: rows of k_proj and v_proj (kv heads x head dim, grouped-query attention); hidden
    when None (one kv head per query head).
    """
    kv = hidden if kv_hidden is None else kv_hidden
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        specs += [
            TensorSpec(f"{p}self_attn.{proj}_proj.weight", (kv if proj in "kv" else hidden, hidden))
            for proj in "qkvo"
        ]
        specs += [
            TensorSpec(f"{p}mlp.gate_proj.weight", (intermediate, hidden)),
            TensorSpec(f"{p}mlp.up_proj.weight", (intermediate, hidden)),
            TensorSpec(f"{p}mlp.down_proj.weight", (hidden, intermediate)),
            TensorSpec(f"{p}input_layernorm.weight", (hidden,), fill="ones"),
            TensorSpec(f"{p}post_attention_layernorm.weight", (hidden,), fill="ones"),
        ]
    specs.append(TensorSpec("model.norm.weight", (hidden,), fill="ones"))
    if untied_head:
        specs.append(TensorSpec("lm_head.weight", (vocab, hidden), stream="model.embed_tokens.weight"))
    return specs


def safetensors_header(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """8-byte little-endian length + JSON header padded with spaces to a multiple of 8."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for spec in specs:
        span = [offset, offset + spec.nbytes]
        header[spec.name] = {"dtype": "BF16", "shape": list(spec.shape), "data_offsets": span}
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def file_size(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> int:
    return len(safetensors_header(specs, metadata)) + sum(s.nbytes for s in specs)


def _chunks(spec: TensorSpec, chunk_elements: int = CHUNK_ELEMENTS) -> Iterable[np.ndarray]:
    """The tensor's bf16 bits as uint16 arrays of at most chunk_elements."""
    import numpy as np  # here, so the measuring harness stays small (see run_measured)

    if spec.fill in ("ones", "zeros"):
        value = BF16_ONE if spec.fill == "ones" else 0
        for start in range(0, spec.numel, chunk_elements):
            yield np.full(min(chunk_elements, spec.numel - start), value, dtype=np.uint16)
        return
    if spec.fill != "normal":
        raise ValueError(f"unknown fill {spec.fill!r} for {spec.name}")
    # A stable seed per stream name: a copy (stream=original) replays the original's bits.
    rng = np.random.default_rng(zlib.crc32((spec.stream or spec.name).encode()))
    for start in range(0, spec.numel, chunk_elements):
        values = rng.standard_normal(min(chunk_elements, spec.numel - start), dtype=np.float32)
        values *= np.float32(0.02)
        yield (values.view(np.uint32) >> 16).astype(np.uint16)  # bf16 = upper half of float32


def write_safetensors(
    path: str,
    specs: Sequence[TensorSpec],
    metadata: dict[str, str] | None = None,
    head_bytes: int | None = None,
) -> int:
    """Stream a bf16 safetensors file tensor by tensor (never whole in memory); atomic; returns its size.

    head_bytes: write only the first head_bytes of each random tensor (its usual values) and leave
    the rest a hole (a sparse file of the full apparent size, read as zeros): a checkpoint's
    metadata at full scale on little disk, for the paths that read headers and a few elements.
    Constant tensors (ones, zeros: norms and biases, small) are written in full: cut short, every
    norm would become the same non-constant vector, equal copies of each other.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gen-", suffix=".safetensors", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            header = safetensors_header(specs, metadata)
            handle.write(header)
            offset = len(header)
            for spec in specs:
                sparse = head_bytes is not None and spec.fill == "normal"
                step = max(1, min(CHUNK_ELEMENTS, (head_bytes or 0) // 2)) if sparse else CHUNK_ELEMENTS
                for chunk in _chunks(spec, step):
                    chunk.astype("<u2", copy=False).tofile(handle)
                    if sparse:
                        break  # the first chunk is the head; the rest stays a hole
                offset += spec.nbytes
                handle.seek(offset)
            handle.truncate(offset)  # the apparent size, holes included
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return os.path.getsize(path)


def cached_safetensors(
    path: str, specs: Sequence[TensorSpec], force: bool = False, metadata: dict[str, str] | None = None
) -> tuple[int, bool]:
    """(size, generated): reuse path when its recorded recipe and size match, else (re)generate."""
    recipe = {
        "generator": GENERATOR_VERSION,
        "metadata": metadata,
        "tensors": [[s.name, list(s.shape), s.fill, s.stream] for s in specs],
    }
    stamp = path + ".recipe.json"
    expected = file_size(specs, metadata)
    if not force and os.path.exists(path) and os.path.getsize(path) == expected and os.path.exists(stamp):
        with open(stamp) as handle:
            if json.load(handle) == recipe:
                return expected, False
    size = write_safetensors(path, specs, metadata)
    with open(stamp, "w") as handle:
        json.dump(recipe, handle)
    return size, True


def read_safetensors_header(path: str) -> tuple[int, dict[str, dict[str, object]]]:
    """(offset of the data section, header without __metadata__)."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


# --------------------------------------------------------------------------- measurement


@dataclass
class Run:
    """One execution of a command."""

    wall_s: float
    """Wall time measured by the harness (perf_counter around start .. reap)."""
    max_rss_bytes: int
    """Peak resident set size of the child (ru_maxrss of that process tree as reaped)."""
    returncode: int


@dataclass
class Measurement:
    """Repeated runs of one command."""

    label: str
    argv: list[str]
    runs: list[Run] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    @property
    def min_s(self) -> float:
        return min(r.wall_s for r in self.runs)

    @property
    def max_rss_bytes(self) -> int:
        return max(r.max_rss_bytes for r in self.runs)

    def as_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "argv": self.argv,
            "median_s": self.median_s,
            "min_s": self.min_s,
            "max_rss_bytes": self.max_rss_bytes,
            "runs": [asdict(r) for r in self.runs],
        }


GNU_TIME = "/usr/bin/time"


def _gnu_time_usable() -> bool:
    if not os.access(GNU_TIME, os.X_OK):
        return False
    probe = subprocess.run([GNU_TIME, "--version"], capture_output=True, text=True, check=False)
    return "GNU" in probe.stdout + probe.stderr


USE_GNU_TIME = _gnu_time_usable()


def run_measured(
    argv: Sequence[str], stdout: str | None = None, quiet: bool = True, env: dict[str, str] | None = None
) -> Run:
    """Run argv once; wall time from the harness, peak RSS from GNU time (%M) or os.wait4.

    With os.wait4 (no GNU time), Linux carries the spawning process's high-water RSS across
    exec into the child's ru_maxrss, so values near this harness's own RSS are upper bounds.
    GNU time is a small C process, so %M has no such floor.
    stdout: a file to redirect the child's stdout to (default /dev/null). quiet hides stderr.
    """
    out = open(stdout or os.devnull, "wb")
    err = subprocess.DEVNULL if quiet else None
    try:
        if USE_GNU_TIME:
            with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
                command = [GNU_TIME, "-f", "%e %M", "-o", report.name, *argv]
                start = time.perf_counter()
                code = subprocess.run(command, stdout=out, stderr=err, check=False, env=env).returncode
                wall = time.perf_counter() - start
                fields = report.read().split()
            if len(fields) < 2:  # killed by a signal: GNU time writes a "Command terminated" line first
                fields = fields[-2:] if len(fields) >= 2 else ["0", "0"]
            return Run(wall, int(fields[-1]) * 1024, code)
        start = time.perf_counter()
        process = subprocess.Popen(list(argv), stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        return Run(wall, usage.ru_maxrss * 1024, process.returncode)  # Linux: ru_maxrss is in KiB
    finally:
        out.close()


RSS_FIELDS = ("VmHWM", "RssAnon", "RssFile", "RssShmem")


def sample_rss(argv: Sequence[str], interval_s: float = 0.002, stdout: str | None = None) -> dict[str, int]:
    """Peak of each /proc/PID/status RSS field (bytes) of one run, polled every interval_s.

    A diagnostic, not the measurement: polling can miss a short spike, and the peaks of
    different fields need not coincide. It tells private memory (RssAnon) apart from page-cache
    pages of a memory-mapped file (RssFile), which ru_maxrss counts alike.
    """
    peaks = dict.fromkeys(RSS_FIELDS, 0)
    with open(stdout or os.devnull, "wb") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.DEVNULL)
        status = f"/proc/{process.pid}/status"
        while process.poll() is None:
            try:
                with open(status) as handle:
                    for line in handle:
                        key, _, value = line.partition(":")
                        if key in peaks:
                            peaks[key] = max(peaks[key], int(value.split()[0]) * 1024)
            except (OSError, ValueError, IndexError):
                pass  # the process is exiting
            time.sleep(interval_s)
    peaks["returncode"] = process.returncode
    return peaks


def warm_page_cache(path: str, passes: int = 1) -> None:
    """Read the file so every timed run starts with it in the page cache."""
    for _ in range(passes):
        with open(path, "rb") as handle:
            while handle.read(64 * MIB):
                pass


def cat_available() -> bool:
    return shutil.which("cat") is not None


def python() -> str:
    """The project's interpreter (the venv when present), for child processes."""
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return venv if os.access(venv, os.X_OK) else sys.executable


def console_script(name: str) -> list[str]:
    """argv prefix for a console script of the venv, or `python -m` as a fallback."""
    path = os.path.join(ROOT, ".venv", "bin", name)
    if os.access(path, os.X_OK):
        return [path]
    return [python(), "-m", name]  # the package's __main__ (a git worktree has no .venv of its own)


# --------------------------------------------------------------------------- reporting


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table; the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def machine_summary() -> str:
    """One line about where the numbers were taken."""
    cpus = os.cpu_count() or 0
    try:
        with open("/proc/meminfo") as handle:
            total_kib = int(handle.readline().split()[1])
        memory = f"{total_kib / (1 << 20):.1f} GiB RAM"
    except (OSError, ValueError, IndexError):
        memory = "RAM unknown"
    try:
        load = f", load avg {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    rss = "GNU time %M" if USE_GNU_TIME else "os.wait4 ru_maxrss"
    return f"{cpus} CPUs, {memory}{load}; python {sys.version.split()[0]}; peak RSS via {rss}"
