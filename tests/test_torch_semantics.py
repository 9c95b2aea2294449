"""tieaudit's pickle VM against torch's weights_only unpickler, opcode by opcode and name by name.

The constants that copy torch's rules (allowlist, dtypes that may require gradients, tensor
attributes a pickled state must not set, layouts, device types) are checked against the installed
torch, so a torch upgrade that changes them fails here rather than silently. The VM's own limits
(depth, integer width, opcode count, dict keys, truncation) are exercised one by one.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tieaudit.core.errors import InputError
from tieaudit.formats import pickle_vm
from tieaudit.formats.pickle_vm import PickleError, Truncated, run_pickle
from tieaudit.formats.torch_globals import (
    ALLOWLIST,
    DEVICE_TYPES,
    GRAD_DTYPES,
    LAYOUTS,
    NOT_READ,
    TENSOR_ATTRIBUTES,
)
from tieaudit.formats.torch_pickle import Referenced, TorchHooks, load_pickle, refuse_unknown
from tieaudit.formats.torch_records import Placeholder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / "hostile"))
from builders import call, dct, glob, integer, pickle_of, text, tup  # type: ignore[import-not-found]

REFUSED_BY_TORCH = "Unsupported operand"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's warnings on odd dtypes, protocols


def torch_allowed() -> dict[str, object]:
    """What torch.load(weights_only=True) loads by default: its allowlist and what `import torch`
    registers with add_safe_globals (nested jagged tensors, device-mesh layouts)."""
    from torch._weights_only_unpickler import _get_allowed_globals, _get_user_allowed_globals

    return {**_get_allowed_globals(), **_get_user_allowed_globals()}


def torch_outcome(data: bytes) -> str:
    """'unsupported' when torch's weights_only unpickler refuses the first opcode, else 'other'."""
    from torch._weights_only_unpickler import Unpickler

    try:
        Unpickler(io.BytesIO(data), encoding="utf-8").load()
    except Exception as exc:
        return "unsupported" if str(exc).startswith(REFUSED_BY_TORCH) else "other"
    return "other"


def our_outcome(data: bytes) -> str:
    try:
        run_pickle(data, 0, TorchHooks("x.pt", "zip"))
    except PickleError as exc:
        return "unsupported" if "torch.load(weights_only=True) refuses" in str(exc) else "other"
    except InputError:
        return "other"  # a global refused by name: the opcode itself was interpreted
    return "other"


@pytest.mark.parametrize("op", range(256), ids=lambda op: f"0x{op:02x}")
def test_the_vm_interprets_exactly_the_opcodes_torch_does(op: int) -> None:
    # The opcode after PROTO 2, then bytes any argument can be read from, then STOP.
    data = b"\x80\x02" + bytes([op]) + b"N" * 16 + b"\n" * 2 + b"."
    if op == 0x63 or op == 0x69:  # GLOBAL, INST: two text lines
        data = b"\x80\x02" + bytes([op]) + b"torch\nfloat32\n."
    assert our_outcome(data) == torch_outcome(data)


def test_torch_interprets_34_opcodes() -> None:
    names = {opcode.name for opcode in pickletools.opcodes}
    interpreted = {
        opcode.name
        for opcode in pickletools.opcodes
        if torch_outcome(b"\x80\x02" + opcode.code.encode("latin-1") + b"N" * 16 + b".") == "other"
    }
    assert len(interpreted) == 34 and interpreted < names
    assert {"LONG4", "INT", "LONG", "FRAME", "STACK_GLOBAL", "POP", "DUP", "EXT1", "BINBYTES"}.isdisjoint(
        interpreted
    )


def test_every_allowlisted_name_is_allowed_by_torch() -> None:
    allowed = torch_allowed()
    assert set(ALLOWLIST) <= set(allowed), sorted(set(ALLOWLIST) - set(allowed))
    assert set(NOT_READ) <= set(allowed)


def test_dtype_tokens_name_torch_dtypes() -> None:
    allowed = torch_allowed()
    for name, stand_in in ALLOWLIST.items():
        if type(stand_in).__name__ == "DtypeToken":
            assert isinstance(allowed[name], torch.dtype) and str(allowed[name]) == name


def _can_require_grad(dtype: torch.dtype) -> bool:
    try:
        torch.empty((0,), dtype=dtype, requires_grad=True)
    except Exception:
        return False
    return True


def test_grad_dtypes_are_the_ones_torch_lets_require_gradients() -> None:
    dtypes = {k[len("torch.") :]: v for k, v in torch_allowed().items() if isinstance(v, torch.dtype)}
    can = set()
    for name, dtype in dtypes.items():
        if _can_require_grad(dtype):
            can.add(name)
    assert can == set(GRAD_DTYPES)


def test_tensor_attributes_cover_every_settable_tensor_attribute() -> None:
    settable = {
        name
        for cls in (torch.Tensor, torch.nn.Parameter, torch._C.TensorBase)
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if hasattr(type(value), "__set__")
    }
    assert settable <= TENSOR_ATTRIBUTES, sorted(settable - TENSOR_ATTRIBUTES)


def test_layouts_and_device_types_are_torch_s() -> None:
    from torch.serialization import _get_layout

    _get_layout("torch.strided")  # fills the cache
    assert set(_get_layout.cache) == LAYOUTS  # type: ignore[attr-defined]
    for kind in DEVICE_TYPES:
        torch.device(kind)


# ------------------------------------------------------------------ the VM's limits


def test_nesting_is_refused_past_max_depth() -> None:
    depth = pickle_vm.MAX_DEPTH
    lists = b"\x80\x02" + b"]" * (depth + 2) + b"a" * (depth + 1) + b"."
    marks = b"\x80\x02" + b"(" * (depth + 1) + b"t" * (depth + 1) + b"."
    tuples = b"\x80\x02K\x01" + b"\x85" * (depth + 1) + b"."
    for data in (lists, marks, tuples):
        with pytest.raises(PickleError, match="deeper than"):
            run_pickle(data, 0, TorchHooks("x.pt", "zip"))
    fine = b"\x80\x02K\x01" + b"\x85" * (depth - 1) + b"."
    run_pickle(fine, 0, TorchHooks("x.pt", "zip"))


def test_integers_are_bounded_by_width() -> None:
    wide = pickle_vm.MAX_INT_BYTES
    ok = b"\x80\x02\x8a" + bytes([wide]) + b"\x01" * wide + b"."
    assert run_pickle(ok, 0, TorchHooks("x.pt", "zip"))[0] == int.from_bytes(b"\x01" * wide, "little")
    with pytest.raises(PickleError, match=f"integer of {wide + 1} bytes"):
        run_pickle(
            b"\x80\x02\x8a" + bytes([wide + 1]) + b"\x01" * (wide + 1) + b".", 0, TorchHooks("x.pt", "zip")
        )


def test_opcode_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pickle_vm, "MAX_OPCODES", 100)
    run_pickle(b"\x80\x02" + b"N" * 90 + b".", 0, TorchHooks("x.pt", "zip"))
    with pytest.raises(PickleError, match="more than 100 opcodes"):
        run_pickle(b"\x80\x02" + b"N" * 200 + b".", 0, TorchHooks("x.pt", "zip"))


def test_dict_keys_are_scalars_dtypes_or_tuples_of_them() -> None:
    def keyed(key: bytes) -> bytes:
        return pickle_of(b"}" + key + b"N" + b"s")

    for key in (text("a"), integer(3), b"N", b"\x88", tup(integer(1), text("b")), glob("torch", "float32")):
        run_pickle(keyed(key), 0, TorchHooks("x.pt", "zip"))
    nested = tup(tup(integer(1), tup(integer(2))), text("c"))
    run_pickle(keyed(nested), 0, TorchHooks("x.pt", "zip"))
    for key in (b"]", tup(b"]"), b"}", glob("torch", "Size") + tup(tup()) + b"R"):
        with pytest.raises(PickleError, match="dict key"):
            run_pickle(keyed(key), 0, TorchHooks("x.pt", "zip"))


def test_every_cut_of_a_real_pickle_is_truncated_or_malformed() -> None:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(3), "opt": {"lr": 0.1, "steps": [1, 2]}}, buffer)
    data = zipfile.ZipFile(buffer).read("archive/data.pkl")
    for cut in range(len(data)):
        with pytest.raises((Truncated, PickleError)):
            run_pickle(data[:cut], 0, TorchHooks("x.pt", "zip"))


def test_a_long_global_line_is_refused() -> None:
    data = b"\x80\x02c" + b"a" * (pickle_vm.MAX_GLOBAL_BYTES + 1) + b"\nb\n."
    with pytest.raises(PickleError, match="GLOBAL line longer"):
        run_pickle(data, 0, TorchHooks("x.pt", "zip"))


def test_unknown_globals_go_through_one_policy() -> None:
    """The reader's policy hands out inert placeholders (calling one makes another, holding the
    arguments); the strict policy refuses by name. Nothing handed out is ever called."""
    data = pickle_of(dct((text("m"), glob("__main__", "Model"))))
    with pytest.raises(InputError, match=r"__main__\.Model, which is not on the allowlist"):
        load_pickle(data, "x.pt", "data.pkl", unknown=refuse_unknown)
    referenced: Referenced = {}
    root, _, _ = load_pickle(data, "x.pt", "data.pkl", referenced=referenced)
    assert isinstance(root, dict) and isinstance(root["m"], Placeholder)
    assert (root["m"].name, root["m"].made) == ("__main__.Model", False)
    assert {k: v.verdict for k, v in referenced.items()} == {"__main__.Model": "runs-code"}
    called = pickle_of(call(glob("posix", "system"), text("touch x")))
    made, _, _ = load_pickle(called, "x.pt", "data.pkl", referenced=referenced)
    assert isinstance(made, Placeholder) and made.made and made.args == ("touch x",)
    assert {k: (v.verdict, v.described()) for k, v in referenced.items()} == {
        "__main__.Model": ("runs-code", "imported"),
        "posix.system": ("runs-code", "imported, called"),
    }


def test_state_dict_pickles_match_pickle_loads_where_both_apply() -> None:
    """For pickles of plain containers, the VM builds what pickle.loads builds."""
    value = {"a": [1, 2.5, "x", None, True, (3, (4,))], "b": {"c": [], "d": {}}, 7: (), "neg": -(2**40)}
    for protocol in (2,):
        data = pickle.dumps(value, protocol=protocol)
        assert run_pickle(data, 0, TorchHooks("x.pt", "zip"))[0] == pickle.loads(data)


def test_placeholders_nest_no_deeper_than_containers() -> None:
    """Objects of unknown classes holding each other count as nesting, as containers do: a chain
    deeper than MAX_DEPTH is refused however it is built (arguments, BUILD state, SETITEMS)."""
    by_args = text("x")
    for _ in range(pickle_vm.MAX_DEPTH + 5):
        by_args = call(glob("m", "C"), by_args)
    with pytest.raises(InputError, match="nested deeper than"):
        load_pickle(pickle_of(by_args), "x.pt", "data.pkl")
    by_state = text("x")
    for _ in range(pickle_vm.MAX_DEPTH + 5):  # C() then BUILD with a dict holding the inner one
        by_state = call(glob("m", "C")) + dct((text("inner"), by_state)) + b"b"
    with pytest.raises(InputError, match="nested deeper than"):
        load_pickle(pickle_of(by_state), "x.pt", "data.pkl")
    shallow = call(glob("m", "C"), call(glob("m", "C"), text("x")))
    root, _, _ = load_pickle(pickle_of(shallow), "x.pt", "data.pkl")
    assert isinstance(root, Placeholder) and isinstance(root.args[0], Placeholder)
    assert root.args[0].args == ("x",)
