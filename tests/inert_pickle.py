"""The tests' own inert unpickling: torch.load(weights_only=False) with a pickle module that resolves
only the globals torch's weights_only unpickler allows and hands out ``Inert`` classes for every
other name, so torch itself finds every tensor of a file holding arbitrary objects while nothing
from the file is imported or called. The reference for tieaudit's placeholders (DESIGN: read what
the reference loaders read)."""

from __future__ import annotations

from typing import Any


class Inert:
    """The test's own inert stand-in for a global outside torch's weights_only allowlist: a class per
    name (so NEWOBJ accepts it) whose objects keep what the pickle gives them and run nothing."""

    inert_name = ""
    made: bool
    args: tuple[Any, ...]
    states: list[Any]
    dictitems: dict[Any, Any]
    listitems: list[Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:
        obj = super().__new__(cls)
        obj.made, obj.args, obj.states, obj.dictitems, obj.listitems = True, args, [], {}, []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any) -> Inert:  # REDUCE on an object made from a global
        return type(self)(*args)

    def __setstate__(self, state: Any) -> None:
        self.states.append(state)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dictitems[key] = value

    def append(self, item: Any) -> None:
        self.listitems.append(item)

    def extend(self, items: Any) -> None:
        self.listitems.extend(items)


def inert_pickle(torch: Any) -> Any:
    """A pickle module for torch.load(weights_only=False) whose unpickler resolves only the globals
    torch's weights_only unpickler allows; every other name becomes an Inert class, never imported."""
    import pickle
    import types

    allowed = set(torch._weights_only_unpickler._get_allowed_globals())
    classes: dict[str, type] = {}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            full = f"{module}.{name}"
            if full in allowed:
                return super().find_class(module, name)
            return classes.setdefault(full, type("Inert", (Inert,), {"inert_name": full}))

    module = types.ModuleType("inert_pickle")
    module.Unpickler = Unpickler  # type: ignore[attr-defined]
    module.load = lambda f, **kwargs: Unpickler(f, **kwargs).load()  # type: ignore[attr-defined]
    return module


def inert_parts(value: Inert) -> list[tuple[str, Any]]:
    """What an inert object holds, named as tieaudit names a placeholder's parts (DESIGN: items by
    key or index, a dict state or CPython's (dict, slots) pair by attribute, else __state__/__args__)."""
    from tieaudit.formats.torch_file import key_name

    parts = [(key_name(k), v) for k, v in value.dictitems.items()]
    parts += [(str(i), v) for i, v in enumerate(value.listitems)]
    for index, state in enumerate(value.states):
        pairs = state if type(state) is tuple and len(state) == 2 else (state,)
        if all(type(p) is dict or p is None for p in pairs):
            parts += [(key_name(k), v) for p in pairs if p for k, v in p.items()]
        else:
            parts.append(("__state__" if len(value.states) == 1 else f"__state__.{index}", state))
    if value.args:
        parts.append(("__args__", value.args))
    return parts


def load_like_torch(torch: Any, path: Any) -> tuple[Any, str]:
    """(what torch loads, mode): ``torch.load(weights_only=True)``, or, for a file it refuses only
    for a global outside its allowlist ("Unsupported global: GLOBAL x", "unsupported GLOBAL x whose
    module x is blocked"), weights_only=False with the inert unpickler (mode "inert"). Any other
    refusal is raised."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu"), "weights_only"
    except Exception as exc:
        if "unsupported global" not in str(exc).lower():
            raise
    return torch.load(
        path, weights_only=False, map_location="cpu", pickle_module=inert_pickle(torch)
    ), "inert"
