"""The PyTorch reader, checked against real torch.save files and hand-made hostile ones.

The truth for every real checkpoint is ``torch.load(weights_only=True)``: names sharing an
``untyped_storage().data_ptr()`` must share a storage id, and every array must equal the loaded
tensor bit for bit. Hostile inputs are built with the pickle module and zipfile directly.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import subprocess
import sys
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UnsafeInputError, UnsupportedFormatError
from tieaudit.core.records import Checkpoint
from tieaudit.formats.torch_file import MAX_DEPTH, ROOT_NAME, TorchReader

torch.manual_seed(0)


# ---------------------------------------------------------------- real checkpoints


class Pair(torch.nn.Module):
    """Two linear layers; ``tied`` makes b.weight the same parameter as a.weight."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)
        if tied:
            self.b.weight = self.a.weight


def training_checkpoint() -> dict[str, Any]:
    model = Pair(tied=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.b(model.a(torch.randn(2, 6))).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}


def dtypes_checkpoint() -> dict[str, Any]:
    x = torch.randn(4, 5)
    f8 = x.to(torch.float8_e4m3fn)
    return {
        "bf16": x.bfloat16(),
        "f16": x.half(),
        "f8": f8,
        "f8_e5m2": x.to(torch.float8_e5m2),
        "f8_view": f8[1:3].t(),
        "u16": (x * 100).abs().to(torch.uint16),
        "i64": (x * 100).long(),
        "bool": x > 0,
        "c64": torch.complex(x, -x),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }


def views_checkpoint() -> dict[str, Any]:
    x = torch.randn(6, 4)
    return {"w": x, "wt": x.t(), "a": x, "s": x[2:5], "col": x[:, 1], "expanded": x[0:1].expand(3, 4)}


REAL: dict[str, Callable[[], Any]] = {
    "tied": lambda: Pair(tied=True).state_dict(),
    "untied": lambda: Pair(tied=False).state_dict(),
    "transposed": lambda: (lambda x: {"w": x, "wt": x.t()})(torch.randn(3, 7)),
    "slice": lambda: (lambda x: {"a": x, "s": x[2:5]})(torch.randn(8, 3)),
    "views": views_checkpoint,
    "dtypes": dtypes_checkpoint,
    "training": training_checkpoint,
    "nested-list": lambda: {"layers": [Pair(tied=False).state_dict(), (torch.ones(2),)], "note": "hi"},
    "single-tensor": lambda: torch.arange(10.0),
}


def flatten_loaded(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of what torch.load returned, under the reader's dotted names."""
    if isinstance(obj, torch.Tensor):
        return {prefix or ROOT_NAME: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list | tuple) else []
    found: dict[str, torch.Tensor] = {}
    for key, value in items:
        found.update(flatten_loaded(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def partition(groups: dict[str, object]) -> set[frozenset[str]]:
    """Names grouped by the value they map to."""
    by_value: dict[object, set[str]] = {}
    for name, value in groups.items():
        by_value.setdefault(value, set()).add(name)
    return {frozenset(names) for names in by_value.values()}


def logical_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def assert_matches_torch(path: Path) -> OpenCheckpoint:
    truth = flatten_loaded(torch.load(path, weights_only=True))
    opened = TorchReader().read(str(path))
    ckpt = opened.checkpoint
    assert [t.name for t in ckpt.tensors] == list(truth)
    stored = {n: t for n, t in truth.items() if t.untyped_storage().nbytes() > 0}
    assert partition({n: ckpt.tensor(n).storage_id for n in stored}) == partition(
        {n: t.untyped_storage().data_ptr() for n, t in stored.items()}
    )
    for info in ckpt.tensors:
        tensor = truth[info.name]
        array = opened.array(info)
        assert info.dtype == str(tensor.dtype).removeprefix("torch.")
        assert array.shape == tuple(tensor.shape)
        assert info.strides == tuple(tensor.stride())
        assert array.flags.writeable is False
        assert np.ascontiguousarray(array).tobytes() == logical_bytes(tensor)
        assert ckpt.storages[info.storage_id].nbytes == tensor.untyped_storage().nbytes()
    return opened


def metadata(path: Path) -> Checkpoint:
    """What the reader found in path (records only; the file is closed again)."""
    with TorchReader().read(str(path)) as opened:
        return opened.checkpoint


# torch 2.13 writes these through UntypedStorage, which its own legacy loader cannot load back.
UNTYPED_DTYPES = ("f8", "f8_e5m2", "f8_view", "u16")


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("builder", list(REAL), ids=list(REAL))
def test_real_checkpoints_match_torch_load(tmp_path: Path, builder: str, legacy: bool) -> None:
    path = tmp_path / "ckpt.pt"
    obj = REAL[builder]()
    if legacy and builder == "dtypes":
        obj = {name: tensor for name, tensor in obj.items() if name not in UNTYPED_DTYPES}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    with assert_matches_torch(path) as opened:
        ckpt = opened.checkpoint
        assert ckpt.format == "torch" and ckpt.files == ("ckpt.pt",)


def test_legacy_untyped_storages_are_refused_as_torch_cannot_load_them(tmp_path: Path) -> None:
    saved = {name: tensor for name, tensor in dtypes_checkpoint().items() if name in UNTYPED_DTYPES}
    path = tmp_path / "legacy.pt"
    torch.save(saved, path, _use_new_zipfile_serialization=False)
    with pytest.raises(AttributeError):
        torch.load(path, weights_only=True)
    assert "untyped storage in a legacy stream" in str(read_error(path))


def test_tied_names_share_a_storage_and_untied_do_not(tmp_path: Path) -> None:
    torch.save(Pair(tied=True).state_dict(), tmp_path / "tied.pt")
    torch.save(Pair(tied=False).state_dict(), tmp_path / "untied.pt")
    tied = metadata(tmp_path / "tied.pt")
    untied = metadata(tmp_path / "untied.pt")
    assert tied.tensor("a.weight").storage_id == tied.tensor("b.weight").storage_id
    assert untied.tensor("a.weight").storage_id != untied.tensor("b.weight").storage_id


def test_views_keep_offsets_and_strides(tmp_path: Path) -> None:
    torch.save(views_checkpoint(), tmp_path / "v.pt")
    ckpt = metadata(tmp_path / "v.pt")
    assert ckpt.tensor("wt").strides == (1, 4) and ckpt.tensor("wt").byte_offset == 0
    assert ckpt.tensor("s").byte_offset == 2 * 4 * 4
    assert ckpt.tensor("expanded").strides == (0, 1)


def test_training_checkpoint_flattens_and_skips_non_tensors(tmp_path: Path) -> None:
    torch.save(training_checkpoint(), tmp_path / "train.pt")
    ckpt = metadata(tmp_path / "train.pt")
    assert {"model.a.weight", "optimizer.state.0.exp_avg", "optimizer.state.0.step"} <= ckpt.names
    skipped = {s.name: s.reason for s in ckpt.skipped}
    assert skipped["epoch"] == "int leaf"
    assert skipped["optimizer.param_groups.0.lr"] == "float leaf"
    assert skipped["optimizer.param_groups.0.params.0"] == "int leaf"
    assert skipped["optimizer.param_groups.0.fused"] == "None leaf"


def test_odd_leaves_are_skipped_with_a_reason(tmp_path: Path) -> None:
    x = torch.randn(3)
    x.note = "attribute"  # type: ignore[attr-defined]  # saved through torch._tensor._rebuild_from_type_v2
    param = torch.nn.Parameter(torch.randn(2))
    param.tag = 1  # type: ignore[attr-defined]  # saved through _rebuild_parameter_with_state
    leaves = {
        "x": x, "p": param, "conj": torch.randn(2, dtype=torch.complex64).conj(),
        "size": torch.Size([2, 3]), "device": torch.device("cpu"), "dtype": torch.bfloat16,
        "bytes": b"ab", "set": {1, 2}, "complex": 1 + 2j,
        "meta": torch.empty(2, device="meta"), "e8m0": torch.ones(2).to(torch.float8_e8m0fnu),
    }  # fmt: skip
    torch.save(leaves, tmp_path / "odd.pt")
    ckpt = metadata(tmp_path / "odd.pt")
    assert ckpt.names == {"x", "p"}
    reasons = {s.name: s.reason for s in ckpt.skipped}
    assert reasons["size"] == "torch.Size leaf" and reasons["device"] == "torch.device leaf"
    assert reasons["dtype"] == "torch.dtype leaf" and reasons["complex"] == "complex leaf"
    assert reasons["bytes"] == "bytes leaf" and reasons["set"] == "set leaf"
    # Tensors tieaudit does not read as values are listed as tensors, not skipped as leaves.
    assert {"meta", "conj", "e8m0"}.isdisjoint(reasons)
    unread = {u.name: (u.kind, u.dtype, u.shape) for u in ckpt.unread}
    assert unread == {
        "meta": ("meta (no data)", "float32", (2,)),
        "conj": ("conj bit set", "complex64", (2,)),
        "e8m0": ("dtype numpy cannot view", "float8_e8m0fnu", (2,)),
    }


def test_numpy_values_are_read_as_placeholders_where_torch_refuses_them(tmp_path: Path) -> None:
    # torch.load(weights_only=True) refuses numpy globals unless a user allowlists them; tieaudit
    # reads the file with inert placeholders, finds every tensor and names the globals.
    torch.save({"w": torch.ones(2), "np": np.float64(1.5)}, tmp_path / "np.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "np.pt", weights_only=True)
    ckpt = metadata(tmp_path / "np.pt")
    assert ckpt.names == {"w"}
    assert {s.name: s.reason.split(" ")[0] for s in ckpt.skipped} == {"np": "numpy._core.multiarray.scalar"}
    verdicts = {g.name: g.verdict for g in ckpt.pickle_globals}
    assert verdicts["numpy._core.multiarray.scalar"] == "runs-code" and verdicts["numpy.dtype"] == "runs-code"


def test_sniff_by_content(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "weights.bin")
    torch.save({"w": torch.ones(2)}, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("x/readme.txt", "not a checkpoint")
    reader = TorchReader()
    for name, expected in [("weights.bin", True), ("old.bin", True), ("other.zip", False)]:
        path = tmp_path / name
        assert reader.sniff(str(path), path.read_bytes()[:64]) is expected
    assert reader.sniff("x.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{}") is False


def test_reading_never_imports_torch(tmp_path: Path) -> None:
    torch.save(training_checkpoint(), tmp_path / "a.pt")
    torch.save(views_checkpoint(), tmp_path / "b.pt", _use_new_zipfile_serialization=False)
    script = (
        "import sys\n"
        "from tieaudit.formats.torch_file import TorchReader\n"
        "for path in sys.argv[1:]:\n"
        "    with TorchReader().read(path) as opened:\n"
        "        [opened.array(t).sum() for t in opened.checkpoint.tensors if t.dtype == 'float32']\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "a.pt"), str(tmp_path / "b.pt")],
        capture_output=True, text=True, cwd=Path(__file__).parent.parent, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- code in the pickle


class Payload:
    """An object whose unpickling calls func(*args): what an attacker puts in a checkpoint."""

    def __init__(self, func: Callable[..., Any], *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def payloads(marker: Path) -> dict[str, tuple[Payload, tuple[str, ...]]]:
    touch = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": (Payload(os.system, f"touch {marker}"), ("os.system", "posix.system")),
        "eval": (Payload(builtins.eval, touch), ("builtins.eval",)),
        "exec": (Payload(builtins.exec, touch), ("builtins.exec",)),
        "getattr": (Payload(builtins.getattr, "text", "upper"), ("builtins.getattr",)),
    }


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("attack", ["os.system", "eval", "exec", "getattr"])
def test_code_in_the_pickle_is_named_and_never_run(tmp_path: Path, attack: str, legacy: bool) -> None:
    marker = tmp_path / "MARKER"
    payload, names = payloads(marker)[attack]
    path = tmp_path / "evil.pt"
    torch.save(
        {"model": Pair(tied=True).state_dict(), "x": payload}, path, _use_new_zipfile_serialization=not legacy
    )
    ckpt = metadata(path)
    assert ckpt.names == {f"model.{key}" for key in Pair(tied=True).state_dict()}  # read past the payload
    runs = {g.name for g in ckpt.pickle_globals if g.verdict == "runs-code"}
    assert any(name in runs for name in names), ckpt.pickle_globals
    assert not marker.exists()


def test_legacy_header_pickles_are_restricted_too(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pt"
    path.write_bytes(
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
        + pickle.dumps(1001, protocol=2)
        + pickle.dumps(Payload(os.system, f"touch {marker}"), protocol=2)
    )
    with TorchReader().read(str(path)) as opened:  # refused as torch data, its walk names the call
        ckpt = opened.checkpoint
    assert ckpt.format == "pickle" and not ckpt.tensors
    named = {g.name: g for g in ckpt.pickle_globals if g.verdict == "runs-code"}
    assert {"posix.system", "os.system"} & named.keys(), ckpt.pickle_globals
    assert all("the torch reader refuses it" in g.refused for g in named.values())
    assert not marker.exists()


# ---------------------------------------------------------------- hand-made malformed files


class FakeStorage:
    """Pickled as torch's persistent id ('storage', type, key, location, numel)."""

    def __init__(self, key: str, numel: int, storage_type: Any = torch.FloatStorage) -> None:
        self.key, self.numel, self.storage_type = key, numel, storage_type


class FakeTensor:
    """Pickled as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""

    def __init__(
        self, storage: FakeStorage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> None:
        hooks: OrderedDict[str, Any] = OrderedDict()
        self.args = (storage, offset, size, stride, False, hooks)

    def __reduce__(self) -> tuple[Any, ...]:
        return (torch._utils._rebuild_tensor_v2, self.args)


class FakePickler(pickle.Pickler):
    legacy = False
    """Legacy streams' storage ids carry a sixth field (a view, None)."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, FakeStorage):
            return ("storage", obj.storage_type, obj.key, "cpu", obj.numel, *([None] if self.legacy else []))
        return None


def fake_pickle(root: object, legacy: bool = False) -> bytes:
    buffer = io.BytesIO()
    pickler = FakePickler(buffer, protocol=2)
    pickler.legacy = legacy
    pickler.dump(root)
    return buffer.getvalue()


def write_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    """A zip of members; torch requires a version record, added unless members name one."""
    if not any(name.endswith("version") for name in members):
        members = {**members, "archive/version": b"3\n"}
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", compression) as archive:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names some tests write
        for name, data in members.items():
            archive.writestr(name.split("#")[0], data)
    return path


def fake_zip(path: Path, root: object, storages: dict[str, bytes]) -> Path:
    members = {"archive/data.pkl": fake_pickle(root)}
    members.update({f"archive/data/{key}": data for key, data in storages.items()})
    return write_zip(path, members)


def read_error(path: Path) -> InputError:
    with pytest.raises(InputError) as caught:
        TorchReader().read(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return caught.value


def test_hand_made_zip_reads(tmp_path: Path) -> None:
    storage = FakeStorage("0", 6)
    data = np.arange(6, dtype="<f4").tobytes()
    path = fake_zip(tmp_path / "ok.pt", {"w": FakeTensor(storage, 0, (2, 3), (3, 1))}, {"0": data})
    with TorchReader().read(str(path)) as opened:
        assert opened.array(opened.checkpoint.tensor("w")).tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    ("offset", "size", "stride", "message"),
    [
        (0, (2, 4), (4, 1), "reaches byte 32 of storage '0', which holds 24"),
        (5, (2,), (1,), "reaches byte 28"),
        (-1, (2,), (1,), "storage offset is negative"),
        (0, (2, 2), (-1, 1), "tensor stride is negative"),
        (0, (2,), (1, 1), "1 sizes but 2 strides"),
        (7, (0,), (1,), "reaches byte 28"),
    ],
)
def test_views_outside_their_storage_are_refused(
    tmp_path: Path, offset: int, size: tuple[int, ...], stride: tuple[int, ...], message: str
) -> None:
    storage = FakeStorage("0", 6)
    path = fake_zip(tmp_path / "bad.pt", {"w": FakeTensor(storage, offset, size, stride)}, {"0": bytes(24)})
    assert message in str(read_error(path))


def test_deep_nesting_is_an_input_error(tmp_path: Path) -> None:
    depth = 100_000
    nested = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."  # EMPTY_LIST..., APPEND...
    path = write_zip(tmp_path / "deep.pt", {"archive/data.pkl": nested})
    assert f"deeper than {MAX_DEPTH}" in str(read_error(path))


def test_shared_containers_cannot_blow_up_the_walk(tmp_path: Path) -> None:
    laughs: list[object] = []
    for _ in range(64):
        laughs = [laughs, laughs]  # a few hundred pickle bytes, 2**64 paths
    assert "more than" in str(read_error(fake_zip(tmp_path / "laughs.pt", {"x": laughs}, {})))


def test_a_container_holding_itself_is_an_input_error(tmp_path: Path) -> None:
    loop: list[object] = []
    loop.append(loop)
    assert "contains itself" in str(read_error(fake_zip(tmp_path / "loop.pt", {"x": loop}, {})))


def test_garbage_pickle_is_an_input_error(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "junk.pt", {"archive/data.pkl": b"\x80\x02this is not a pickle"})
    assert "data.pkl is not a valid torch pickle" in str(read_error(path))


def test_zip_structure_errors(tmp_path: Path) -> None:
    storage = FakeStorage("0", 6)
    root = {"w": FakeTensor(storage, 0, (6,), (1,))}
    missing = fake_zip(tmp_path / "missing.pt", root, {})
    assert "has no zip member 'archive/data/0'" in str(read_error(missing))
    short = fake_zip(tmp_path / "short.pt", root, {"0": bytes(20)})
    assert "holds 20 bytes, its storage needs 24" in str(read_error(short))
    no_pickle = write_zip(tmp_path / "nopkl.pt", {"archive/data/0": bytes(24)})
    assert "has no archive/data.pkl record" in str(read_error(no_pickle))
    pickle_bytes = fake_pickle(root)
    twice = write_zip(
        tmp_path / "dup.pt", {"archive/data.pkl": pickle_bytes, "archive/data.pkl#2": pickle_bytes}
    )
    assert "appears more than once" in str(read_error(twice))


@pytest.mark.parametrize("name", ["archive/../../etc/passwd", "/archive/data/1", "archive/data/..", "C:/x"])
def test_member_names_leaving_the_archive_are_unsafe(tmp_path: Path, name: str) -> None:
    path = fake_zip(
        tmp_path / "escape.pt", {"w": FakeTensor(FakeStorage("0", 1), 0, (1,), (1,))}, {"0": bytes(4)}
    )
    with zipfile.ZipFile(path, "a") as archive:
        info = zipfile.ZipInfo("placeholder")
        info.filename = name  # ZipInfo() would sanitise the name; a hostile writer need not
        archive.writestr(info, b"x")
    with pytest.raises(UnsafeInputError, match="leaves the archive"):
        TorchReader().read(str(path))


def test_compressed_storage_member_is_an_input_error(tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(100)}, tmp_path / "real.pt")
    with zipfile.ZipFile(tmp_path / "real.pt") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    path = write_zip(tmp_path / "deflated.pt", members, zipfile.ZIP_DEFLATED)
    assert "compressed" in str(read_error(path))


def test_truncated_zip_is_an_input_error(tmp_path: Path) -> None:
    torch.save(training_checkpoint(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 40):
        path = tmp_path / f"cut{cut}.pt"
        path.write_bytes(data[:cut])
        read_error(path)


def test_truncated_legacy_file_is_an_input_error(tmp_path: Path) -> None:
    torch.save(training_checkpoint(), tmp_path / "full.pt", _use_new_zipfile_serialization=False)
    data = (tmp_path / "full.pt").read_bytes()
    for cut in range(1, len(data), max(1, len(data) // 97)):
        path = tmp_path / "cut.pt"
        path.write_bytes(data[:cut])
        read_error(path)


def test_legacy_sizes_past_the_end_are_input_errors(tmp_path: Path) -> None:
    storage = FakeStorage("k", 10**12)
    path = tmp_path / "huge.pt"
    path.write_bytes(
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
        + pickle.dumps(1001, protocol=2)
        + pickle.dumps({"protocol_version": 1001, "little_endian": True}, protocol=2)
        + fake_pickle({"w": FakeTensor(storage, 0, (10**12,), (1,))}, legacy=True)
        + pickle.dumps(["k"], protocol=2)
        + (10**12).to_bytes(8, "little")
        + bytes(64)
    )
    assert "truncated" in str(read_error(path))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_archive_is_read_as_such_unless_only_torch_save_data_is_wanted(tmp_path: Path) -> None:
    """A TorchScript archive is read by its own reader (tests/test_torchscript.py); a caller reading
    what torch.load(weights_only=True) loads (a model folder's weights) refuses it, naming it."""
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(tmp_path / "scripted.pt"))
    with TorchReader().read(str(tmp_path / "scripted.pt")) as opened:
        assert opened.checkpoint.format == "torchscript"
        assert opened.checkpoint.names == {"weight", "bias"}
    with pytest.raises(UnsupportedFormatError, match="TorchScript"):
        TorchReader(torchscript=False).read(str(tmp_path / "scripted.pt"))


# ---------------------------------------------------------------- fuzzing


def _real_members() -> dict[str, bytes]:
    buffer = io.BytesIO()
    torch.save(training_checkpoint() | {"views": views_checkpoint(), "misc": [1, "a", None, 2.0]}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


REAL_MEMBERS = _real_members()
REAL_PICKLE = REAL_MEMBERS["archive/data.pkl"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(REAL_PICKLE) - 1), st.integers(0, 255)), min_size=1, max_size=4
    )
)
def test_mutated_pickles_never_escape_as_crashes(tmp_path: Path, edits: list[tuple[int, int]]) -> None:
    mutated = bytearray(REAL_PICKLE)
    for position, value in edits:
        mutated[position] = value
    path = write_zip(tmp_path / "fuzz.pt", REAL_MEMBERS | {"archive/data.pkl": bytes(mutated)})
    try:
        with TorchReader().read(str(path)) as opened:
            for info in opened.checkpoint.tensors:
                opened.array(info)
    except InputError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("method", [zipfile.ZIP_LZMA, zipfile.ZIP_BZIP2])
def test_pickle_member_in_lzma_or_bzip2_is_refused_before_decompressing(tmp_path: Path, method: int) -> None:
    # lzma's decompressor allocates what the member's header asks for (a MemoryError in fuzzing).
    torch.save({"w": torch.zeros(100)}, tmp_path / "real.pt")
    with zipfile.ZipFile(tmp_path / "real.pt") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    path = write_zip(tmp_path / "packed.pt", members, method)
    assert f"compression method {method}" in str(read_error(path))


# ---------------------------------------------------------------- many non-tensor leaves


def test_non_tensor_leaves_beyond_the_kept_ones_are_counted(tmp_path: Path) -> None:
    """A state dict with 30,000 integer leaves: the first MAX_KEPT_SKIPPED are kept by name, the
    rest counted, and the reports say how many there were in all."""
    import json

    from tieaudit.core.records import MAX_KEPT_SKIPPED

    path = tmp_path / "steps.pt"
    torch.save({"w": torch.zeros(4, 4), "steps": list(range(30_000))}, path)
    with TorchReader().read(str(path)) as opened:
        ckpt = opened.checkpoint
        assert [t.name for t in ckpt.tensors] == ["w"]
        assert len(ckpt.skipped) == MAX_KEPT_SKIPPED and ckpt.skipped_total == 30_000
        assert ckpt.skipped[-1].name == f"steps.{MAX_KEPT_SKIPPED - 1}"
    run = subprocess.run(
        [sys.executable, "-m", "tieaudit", "inspect", str(path), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(run.stdout)
    assert len(report["skipped"]) == MAX_KEPT_SKIPPED and report["skipped_total"] == 30_000
    text = subprocess.run(
        [sys.executable, "-m", "tieaudit", "inspect", str(path)], capture_output=True, text=True, check=True
    )
    assert "30000 non-tensor entries skipped" in text.stdout
