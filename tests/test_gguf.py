"""GGUF files written by llama.cpp's own writer (``gguf.GGUFWriter``): the head against
``token_embd.weight`` and llama.cpp's loader table, through the real CLI.

- tied (no ``output.weight``, an architecture whose loader falls back): no finding, and inspect
  shows the loader's tie;
- an untied equal copy (same GGML type, equal bytes): TIE001 with the head's bytes wasted;
- head and embedding of different GGML types: a TIE001 note, relation ``quantized``;
- no head for an architecture whose loader requires it: TIE003, an error;
- check finds ``.gguf`` files in a folder; auditing imports neither torch nor transformers;
- a malformed header is one line and exit 2, huge counts refused before anything is allocated.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from tieaudit.cli.main import main
from tieaudit.core.dtypes import GGML_BLOCK_TYPES
from tieaudit.formats.gguf_header import MAX_GGUF_KEYS, MAX_GGUF_TENSORS
from tieaudit.formats.gguf_heads import head_table

VOCAB, WIDTH = 96, 64
"""Rows (the vocabulary) and row length: not square, so the orientation shows."""
GUARD = Path(__file__).resolve().parent / "guarded_cli.py"
ROOT = Path(__file__).resolve().parent.parent


def embedding_values() -> np.ndarray:
    """The embedding every file here stores (a head given these values is an equal copy)."""
    return np.random.default_rng(0).standard_normal((VOCAB, WIDTH)).astype(np.float32)


def write_gguf(
    path: Path,
    arch: str,
    *,
    head: np.ndarray | None = None,
    head_type: GGMLQuantizationType | None = None,
    embedding_type: GGMLQuantizationType | None = None,
) -> np.ndarray:
    """A tiny model's GGUF as llama.cpp's converter writes it: the embedding, a norm, a head only
    when given; tensors quantized by gguf's own quantizer when a type is given. The embedding."""
    embedding = embedding_values()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])

    def add(name: str, values: np.ndarray, kind: GGMLQuantizationType | None) -> None:
        if kind is None:
            writer.add_tensor(name, values)
        else:
            packed = quantize(values, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)

    add("token_embd.weight", embedding, embedding_type)
    add("output_norm.weight", np.ones(WIDTH, np.float32), None)
    if head is not None:
        add("output.weight", head, head_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embedding


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def inspected(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = cli(["inspect", str(path), "--format", "json"], capsys)
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_the_loader_table_is_llama_cpps_with_its_commit() -> None:
    table = head_table()
    assert len(table.llama_cpp) >= 40 and table.llama_cpp[:40].isalnum()  # a commit, as read
    # Spot checks against the source read (src/models/*.cpp at that commit).
    assert table.heads["llama"] == "falls-back"
    assert table.heads["qwen2"] == "falls-back"
    assert table.heads["phi2"] == "required"
    assert table.heads["gemma"] == "embedding"
    assert table.heads["bert"] == "none"
    assert len(table.heads) > 100


def test_block_types_are_ggufs_quantized_types() -> None:
    quantized = {t.name for t in GGMLQuantizationType if gguf.GGML_QUANT_SIZES[t][0] > 1}
    assert quantized == GGML_BLOCK_TYPES


def test_tied_llama_has_no_finding_and_shows_the_loaders_tie(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tied.gguf"
    write_gguf(path, "llama")
    report = inspected(path, capsys)
    assert report["format"] == "gguf" and report["findings"] == []
    (tie,) = report["declared_ties"]
    assert (tie["target"], tie["source"], tie["declared_by"]) == (
        "output.weight",
        "token_embd.weight",
        "loader",
    )
    assert "llama.cpp loader (arch llama" in tie["where"]
    assert report["gguf"]["architecture"] == "llama" and report["gguf"]["head"] == "falls-back"
    assert report["gguf"]["llama_cpp"] == head_table().llama_cpp
    assert report["gguf"]["tokenizer"] == "gpt2"
    assert report["gguf"]["pair"] == {"token_embd.weight": {"ggml_type": "F32", "shape": [VOCAB, WIDTH]}}
    (embedding,) = [t for t in report["tensors"] if t["name"] == "token_embd.weight"]
    assert embedding["shape"] == [VOCAB, WIDTH] and embedding["dtype"] == "float32"
    assert report["config"]["vocab_size"] == VOCAB and report["config"]["tokenizer_vocab_size"] == VOCAB
    code, out, _ = cli(["inspect", str(path)], capsys)
    assert code == 0 and "llama.cpp loader" in out and "Declared ties" in out
    code, out, _ = cli(["check", str(path)], capsys)
    assert code == 0 and out.startswith(f"ok   {path}  (gguf, 2 tensors")


@pytest.mark.parametrize("kind", [None, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0])
def test_an_untied_equal_copy_is_tie001_with_the_heads_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: GGMLQuantizationType | None
) -> None:
    path = tmp_path / "copy.gguf"
    write_gguf(path, "llama", head=embedding_values(), head_type=kind, embedding_type=kind)
    report = inspected(path, capsys)
    (finding,) = report["findings"]
    head = next(t for t in report["tensors"] if t["name"] == "output.weight")
    assert (finding["rule"], finding["severity"], finding["relation"]) == ("TIE001", "warning", "equal")
    assert finding["names"] == ["token_embd.weight", "output.weight"]
    assert finding["wasted_bytes"] == head["nbytes"]
    block, size = gguf.GGML_QUANT_SIZES[kind or GGMLQuantizationType.F32]
    assert head["nbytes"] == VOCAB * WIDTH // block * size
    assert report["declared_ties"] == [] and report["gguf"]["head"] == "stored"
    assert "convert the tied model again" in finding["fix"]
    code, out, _ = cli(["check", str(path)], capsys)
    assert code == 1 and "TIE001 warning  untied-copy (equal)" in out
    assert "output.weight holds the same bytes as token_embd.weight" in " ".join(out.split())  # wrapped


def test_different_quant_types_are_a_quantized_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.gguf"
    head = embedding_values()
    write_gguf(
        path, "llama", head=head, head_type=GGMLQuantizationType.Q8_0, embedding_type=GGMLQuantizationType.F16
    )
    report = inspected(path, capsys)
    (finding,) = report["findings"]
    assert (finding["rule"], finding["severity"], finding["relation"]) == ("TIE001", "note", "quantized")
    assert finding["details"]["types"] == {"output.weight": "Q8_0", "token_embd.weight": "F16"}
    q8 = next(t for t in report["tensors"] if t["name"] == "output.weight")
    assert q8["dtype"] == "Q8_0" and q8["shape"] == [VOCAB, WIDTH // 32 * 34]  # bytes per row
    assert finding["details"]["head_bytes"] == q8["nbytes"] == VOCAB * WIDTH // 32 * 34
    assert report["gguf"]["pair"]["output.weight"] == {"ggml_type": "Q8_0", "shape": [VOCAB, WIDTH]}
    code, out, _ = cli(["check", str(path)], capsys)
    assert code == 0 and "TIE001 note  untied-copy (quantized)" in out
    assert "output.weight (Q8_0) and token_embd.weight (F16)" in " ".join(out.split())  # wrapped


def test_a_head_the_loader_requires_missing_is_tie003(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert head_table().heads["phi2"] == "required"
    path = tmp_path / "phi2.gguf"
    write_gguf(path, "phi2")
    code, out, err = cli(["check", str(path), "--format", "json"], capsys)
    assert code == 1, err
    (finding,) = json.loads(out)["findings"]
    assert (finding["rule"], finding["kind"], finding["severity"]) == (
        "TIE003",
        "declared-tie-orphan",
        "error",
    )
    assert "llama.cpp's loader for architecture phi2" in finding["message"]
    assert "missing tensor 'output.weight'" in finding["message"]
    assert finding["details"]["llama_cpp"] == head_table().llama_cpp
    assert inspected(path, capsys)["declared_ties"] == []


def test_an_architecture_not_in_the_table_is_a_note_never_a_silent_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "unknown.gguf"
    write_gguf(path, "not-an-architecture")
    (finding,) = inspected(path, capsys)["findings"]
    assert (finding["rule"], finding["severity"]) == ("TIE003", "note")
    assert "is not in tieaudit's table" in finding["message"]


def test_check_discovers_gguf_files_in_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    write_gguf(folder / "tied.gguf", "llama")
    write_gguf(folder / "phi2.gguf", "phi2")
    write_gguf(folder / "weights.bin", "llama")  # a GGUF under another name: told by its magic
    code, out, err = cli(["check", str(folder), "--jobs", "1"], capsys)
    assert code == 1, err
    status = sorted(line.split("  (")[0] for line in out.splitlines() if not line.startswith(" "))
    assert status == [
        f"FAIL {folder / 'phi2.gguf'}",
        f"ok   {folder / 'tied.gguf'}",
        f"ok   {folder / 'weights.bin'}",
    ]


def test_auditing_gguf_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    paths = {name: tmp_path / f"{name}.gguf" for name in ("tied", "copy")}
    write_gguf(paths["tied"], "llama")
    write_gguf(paths["copy"], "llama", head=np.zeros((VOCAB, WIDTH), np.float32) + 1)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spec, result = scratch / "spec.json", scratch / "result.json"
    runs = [[command, str(p), "--format", "json"] for p in paths.values() for command in ("inspect", "check")]
    spec.write_text(json.dumps({"runs": runs, "result": str(result)}))
    done = subprocess.run(
        [sys.executable, str(GUARD), str(spec)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(result.read_text())
    assert report["import_attempts"] == [] and report["loaded"] == []
    assert [run["code"] for run in report["runs"]] == [0, 0, 0, 0]


def _header(tensors: int, keys: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, keys)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


HOSTILE = {
    "truncated-magic": (b"GGU", "not a checkpoint tieaudit reads"),
    "truncated-counts": (b"GGUF" + struct.pack("<I", 3) + b"\0" * 4, "truncated: the tensor count"),
    "version-1": (_header(0, 0, version=1), "GGUF version 1"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "a big-endian GGUF file"),
    "huge-tensor-count": (_header(2**63, 0), f"more than the {MAX_GGUF_TENSORS} tieaudit reads"),
    "huge-key-count": (_header(0, 2**40), f"more than the {MAX_GGUF_KEYS} tieaudit reads"),
    "tensor-count-past-end": (_header(1000, 0), "1000 tensor infos at byte 24 runs past the end"),
    "key-length-past-end": (_header(0, 1) + struct.pack("<Q", 2**62), "key 0 at byte 32 runs past the end"),
    "array-count-past-end": (
        _header(0, 1) + _string(b"a") + struct.pack("<IIQ", 9, 8, 2**50),
        "the value of 'a' (1125899906842624 elements)",
    ),
    "nested-arrays": (
        _header(0, 1) + _string(b"a") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 20,
        "nests arrays deeper than 8",
    ),
    "unknown-value-type": (_header(0, 1) + _string(b"a") + struct.pack("<I", 99), "unknown value type 99"),
    "too-many-dims": (
        _header(1, 0)
        + _string(b"t")
        + struct.pack("<I", 5)
        + struct.pack("<Q", 1) * 5
        + struct.pack("<IQ", 0, 0),
        "has 5 dimensions; ggml allows 4",
    ),
    "unknown-ggml-type": (
        _header(1, 0) + _string(b"t") + struct.pack("<IQIQ", 1, 4, 77, 0),
        "has GGML type 77, unknown to gguf",
    ),
    "partial-block": (
        _header(1, 0) + _string(b"t") + struct.pack("<IQIQ", 1, 33, 8, 0),
        "a row of 33 elements is not whole Q8_0 blocks of 32",
    ),
    "tensor-past-end": (
        _header(1, 0) + _string(b"t") + struct.pack("<IQIQ", 1, 1 << 40, 0, 0),
        "truncated: tensor 't' needs bytes",
    ),
    "misaligned": (_header(1, 0) + _string(b"t") + struct.pack("<IQIQ", 1, 1, 0, 4), "not a multiple of 32"),
    "duplicate-tensor": (
        _header(2, 0) + (_string(b"t") + struct.pack("<IQIQ", 1, 1, 0, 0)) * 2 + b"\0" * 64,
        "tensor 't' appears twice",
    ),
    "duplicate-key": (
        _header(0, 2) + (_string(b"k") + struct.pack("<IB", 0, 1)) * 2,
        "key 'k' appears twice",
    ),
}
"""Malformed headers, each with what its one-line error says."""


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_malformed_gguf_is_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, said = HOSTILE[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    for command in ("inspect", "check"):
        code, out, err = cli([command, str(path)], capsys)
        assert code == 2 and out == "", (command, err)
        assert err.startswith(f"tieaudit: error: {path}: ") and err.count("\n") == 1, err
        assert said in err, err


def test_retie_refuses_gguf_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "copy.gguf"
    write_gguf(path, "llama", head=np.ones((VOCAB, WIDTH), np.float32) * 2)
    code, out, err = cli(["retie", str(path), str(tmp_path / "out.gguf")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "retie does not write GGUF" in err and not (tmp_path / "out.gguf").exists()


def test_the_generator_classifies_llama_cpps_loaders(tmp_path: Path) -> None:
    """scripts/gen_gguf_heads.py on a source tree in llama.cpp's layout, one loader of each kind."""
    src = tmp_path / "src"
    (src / "models").mkdir(parents=True)
    (src / "llama-arch.cpp").write_text(
        "".join(f'    {{ LLM_ARCH_{n.upper()}, "{n}" }},\n' for n in ("a", "b", "c", "d", "e"))
    )
    (src / "llama-model.cpp").write_text(
        "switch (arch) {\n"
        + "".join(
            f"    case LLM_ARCH_{n.upper()}:\n        return new llama_model_{n}(params);\n" for n in "abc"
        )
        + "    case LLM_ARCH_D:\n    case LLM_ARCH_E:\n        return new llama_model_d(params);\n}\n"
    )
    (src / "models" / "models.h").write_text("struct llama_model_d : public llama_model_a {\n};\n")
    head = 'create_tensor(tn(LLM_TENSOR_OUTPUT, "weight"), {n_embd, n_vocab}, FLAG);'
    fallback = (
        'output = create_tensor(tn(LLM_TENSOR_TOKEN_EMBD, "weight"), {n_embd, n_vocab}, TENSOR_DUPLICATED);'
    )
    bodies = {
        "a": f"output = {head.replace('FLAG', 'TENSOR_NOT_REQUIRED')}\n if (output == NULL) {{ {fallback} }}",
        "b": f"output = {head.replace('FLAG', '0')}",
        "c": fallback,
    }
    (src / "models" / "all.cpp").write_text(
        "".join(
            f"void llama_model_{n}::load_arch_tensors(llama_model_loader &) {{\n    {body}\n    {{ }}\n}}\n"
            for n, body in bodies.items()
        )
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_gguf_heads.py"), str(src), "--version", "abc123"],
        capture_output=True,
        text=True,
        check=True,
    )
    table = json.loads(done.stdout)
    assert table["llama_cpp"] == "abc123"
    # d has no loader of its own: it reuses a's (models.h), for both architectures it serves
    assert table["heads"] == {
        "a": "falls-back",
        "b": "required",
        "c": "embedding",
        "d": "falls-back",
        "e": "falls-back",
    }
