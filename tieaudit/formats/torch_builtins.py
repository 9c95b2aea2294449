"""Stand-ins for the builtins torch's weights_only unpickler allows: ``_codecs.encode`` (how
protocol 2 spells bytes), ``builtins.set``, ``complex`` and ``bytearray``. Each checks its
arguments and returns a label; nothing is built from what a pickle asks for."""

from __future__ import annotations

from collections.abc import Callable

from tieaudit.formats.torch_records import DtypeToken, Opaque, bad

__all__ = ["BUILTINS", "encode"]


def encode(text: object, encoding: object = "utf-8") -> bytes:
    # Protocol 2 spells bytes as _codecs.encode(str, "latin1"); only that and UTF-8 are accepted.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        bad("_codecs.encode called with unexpected arguments")
    try:
        return text.encode("latin-1" if encoding in ("latin1", "latin-1") else "utf-8")
    except UnicodeEncodeError:
        bad("_codecs.encode of text that does not encode (torch fails too)")


def _labelled(kind: str, check: Callable[..., bool]) -> Callable[..., Opaque]:
    def stand_in(*args: object) -> Opaque:
        # Never builds what the arguments ask for (a range, a sized buffer): only checks them.
        if not check(*args):
            bad(f"{kind} called with arguments tieaudit does not accept")
        return Opaque(kind)

    return stand_in


def _complex(*args: object) -> bool:
    if len(args) > 2 or not all(type(arg) in (int, float, str) for arg in args):
        return False
    try:
        complex(*args)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False
    return True


_SCALARS = frozenset((str, int, float, bool, type(None), bytes, DtypeToken))


def _scalars(*args: object) -> bool:
    if len(args) > 1 or (args and type(args[0]) not in (list, tuple)):
        return False
    # Exact types, checked at C speed (one memo'd list may be handed to set() thousands of times).
    return not args or _SCALARS.issuperset(map(type, args[0]))  # type: ignore[call-overload]


def _bytearray(*args: object) -> bool:
    if len(args) == 2:
        encode(args[0], args[1])
        return True
    return len(args) <= 1 and all(type(arg) is bytes for arg in args)


BUILTINS: dict[str, Callable[..., object]] = {
    "_codecs.encode": encode,
    "builtins.set": _labelled("set", _scalars),
    "builtins.complex": _labelled("complex", _complex),
    "builtins.bytearray": _labelled("bytearray", _bytearray),
}
"""The allowed builtins, by the name a pickle gives them."""
