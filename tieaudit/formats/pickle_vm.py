"""A pickle virtual machine that runs exactly the opcodes ``torch.load(weights_only=True)`` runs.

torch's weights_only unpickler (``torch/_weights_only_unpickler.py``) interprets 34 opcodes and
refuses every other one; this loop interprets the same 34 with the same stack semantics, so a
pickle either means the same thing here as in torch or is refused. What a global, a call
(REDUCE/NEWOBJ), a BUILD or a persistent id becomes is decided by a ``Hooks`` object (for torch
files: ``torch_pickle.TorchHooks``); nothing from the pickle is ever imported or called.

Unlike CPython's C unpickler, every size, depth and count is bounded while values are built:
opcodes, nesting (MARK and containers), integer width, string and global lengths. Dict keys are
limited to values whose hashing is cheap and cannot recurse without bound.
"""

from __future__ import annotations

import struct
from typing import Protocol

from tieaudit.formats.pickle_names import opcode_name
from tieaudit.formats.torch_allowlist import torch_allowlist

MAX_OPCODES = 100_000_000
"""Opcodes one pickle may run: a 50k-tensor state dict runs 1.5 million, so a 1 TB model's
metadata (a few million tensors with optimizer state) stays well under."""
MAX_DEPTH = 200
"""Containers (and MARKs) nested deeper than this are refused; real checkpoints nest below 20."""
MAX_INT_BYTES = 64
"""Width of a LONG1 integer: torch's metadata are int64 and no real value needs 512 bits.
(LONG4 and the text INT/LONG opcodes, which carry unbounded integers, torch refuses too.)"""
MAX_GLOBAL_BYTES = 512
"""Length of a GLOBAL's module or name line; every allowlisted name is far shorter."""

Hashable = (str, int, float, bool, type(None), bytes)
"""Dict keys accepted as they are (tuples of these are accepted too, see ``PickleVM._keyable``)."""

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_F64 = struct.Struct(">d").unpack_from
_TRUNCATED = "the pickle ends before its STOP opcode"
_LONGEST_FIXED_ARGUMENT = 9
"""An opcode byte and the longest fixed-size argument any interpreted opcode has (BINFLOAT)."""


class PickleError(Exception):
    """The pickle is malformed or uses something torch.load(weights_only=True) refuses."""


class Truncated(PickleError):
    """The data ended inside the pickle (the caller may retry with more of the file)."""


class Hooks(Protocol):
    """What the loader decides: globals, calls, BUILD and persistent ids."""

    key_types: tuple[type, ...]
    """Stand-in types (besides plain scalars) that may be dict keys."""
    container_types: tuple[type, ...]
    """The dict subclasses the hooks' calls return (OrderedDict, Counter stand-ins)."""

    def find_global(self, module: str, name: str) -> object:
        """The stand-in for GLOBAL module.name (after torch's Python 2 renaming)."""

    def reduce(self, func: object, args: tuple[object, ...]) -> object:
        """REDUCE: func(*args)."""

    def newobj(self, cls: object, args: tuple[object, ...]) -> object:
        """NEWOBJ: cls.__new__(cls, *args)."""

    def build(self, inst: object, state: object) -> None:
        """BUILD: set state on inst (refuse where it would change what inst is)."""

    def items_of(self, target: object, kind: type) -> object:
        """Where SETITEM(S) (kind dict) or APPEND(S) (kind list) on target put their items: target
        itself, or a plain container a stand-in keeps them in."""

    def persistent_load(self, pid: object) -> object:
        """BINPERSID: what a persistent id stands for."""


class PickleVM:
    """Runs one pickle from ``data[start:]``; ``run`` returns (value, offset after STOP)."""

    def __init__(self, data: bytes, start: int, hooks: Hooks) -> None:
        self.data = data
        self.pos = start
        self.hooks = hooks
        self.depths: dict[int, int] = {}
        """Nesting depth of each container built so far, by id (containers are kept alive)."""
        self.key_tuples: dict[int, bool] = {}
        """Registered tuples already checked as dict keys: whether they may be one."""
        self.alive: list[object] = []
        """Every container built, so ids in ``depths`` and ``key_tuples`` are never reused."""
        self.keyable: tuple[type, ...] = Hashable + hooks.key_types
        """Types accepted as dict keys as they are."""
        self.containers: frozenset[type] = frozenset({list, tuple, dict, set, *hooks.container_types})
        """Types whose values hold other values (the hooks' dict types included)."""

    # ------------------------------------------------------------------ depth and keys

    def _depth(self, value: object) -> int:
        # Containers of depth 1 (most of them) are not registered.
        return self.depths.get(id(value), 1) if type(value) in self.containers else 0

    def _register(self, container: object, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise PickleError(f"containers nested deeper than {MAX_DEPTH} levels")
        self.depths[id(container)] = depth
        self.alive.append(container)

    def _tuple(self, items: list[object] | tuple[object, ...]) -> tuple[object, ...]:
        value = tuple(items)
        depths, containers = self.depths, self.containers
        depth = 1
        for item in value:
            if type(item) in containers:
                inner = depths.get(id(item), 1) + 1
                if inner > depth:
                    depth = inner
        if depth > 1:  # only tuples holding containers; a tuple of scalars holds none
            self._register(value, depth)
        return value

    def _keyable(self, value: object) -> bool:
        """Whether value may be a dict key: a hashable scalar, or tuples of them (at most MAX_DEPTH
        deep, so checking recurses that far at most; the answer is kept per registered tuple)."""
        if isinstance(value, self.keyable):
            return True
        if type(value) is not tuple:
            return False
        known = self.key_tuples.get(id(value))
        if known is not None:
            return known
        answer = all(self._keyable(item) for item in value)
        if id(value) in self.depths:
            self.key_tuples[id(value)] = answer
        return answer

    def _grow(self, container: object, item: object) -> None:
        """container now holds item: its depth is at least item's plus one."""
        kind = type(item)
        if kind is str or kind is int:
            return
        depth = self._depth(item) + 1
        if depth > self.depths.get(id(container), 1):
            self._register(container, depth)

    def _key(self, key: object) -> object:
        if self._keyable(key):
            return key
        raise PickleError(f"a dict key of type {type(key).__name__}, which tieaudit does not accept")

    def _setitem(self, target: object, key: object, value: object) -> None:
        holder = target if isinstance(target, dict) else self.hooks.items_of(target, dict)
        if not isinstance(holder, dict):
            raise PickleError(f"SETITEM(S) on a {type(target).__name__}, not a dict")
        holder[self._key(key)] = value
        self._grow(holder, value)
        if holder is not target:
            self._grow(target, holder)

    # ------------------------------------------------------------------ the loop

    def _global(self, data: bytes, pos: int) -> tuple[str, str, int]:
        parts = []
        for _ in range(2):
            newline = data.find(b"\n", pos, pos + MAX_GLOBAL_BYTES + 1)
            if newline < 0:
                if len(data) - pos <= MAX_GLOBAL_BYTES:
                    raise Truncated(_TRUNCATED)
                raise PickleError(f"a GLOBAL line longer than {MAX_GLOBAL_BYTES} bytes")
            parts.append(data[pos:newline].decode("utf-8"))
            pos = newline + 1
        module, name = torch_allowlist().spelled(parts[0], parts[1])
        return module, name, pos

    def run(self) -> tuple[object, int]:
        """Interpret opcodes until STOP; raise PickleError (or a hook's error) otherwise."""
        try:
            return self._loop()
        except (IndexError, struct.error) as exc:
            # A fixed-size argument (at most 8 bytes) read past the end, or a pop from an empty
            # stack; near the end of the data the first is assumed (a retry with more data
            # then tells the two apart).
            if self.pos + _LONGEST_FIXED_ARGUMENT >= len(self.data):
                raise Truncated(_TRUNCATED) from None
            raise PickleError(f"{type(exc).__name__}: {exc}") from None
        except (KeyError, UnicodeDecodeError, TypeError) as exc:
            raise PickleError(f"{type(exc).__name__}: {exc}") from None
        except RecursionError:  # defensive: nothing here recurses deeper than MAX_DEPTH
            raise PickleError("nesting too deep") from None

    def _loop(self) -> tuple[object, int]:
        data, hooks, end = self.data, self.hooks, len(self.data)
        stack: list[object] = []
        metastack: list[list[object]] = []
        memo: dict[int, object] = {}
        containers = self.containers
        pos = self.pos
        try:
            # Three groups by opcode value (at most 16 comparisons for any opcode), each ordered by
            # how often torch.save's pickles use its opcodes.
            for _ in range(MAX_OPCODES):
                op = data[pos]
                pos += 1
                if op < 0x60:
                    if op == 0x4B:  # K BININT1
                        stack.append(data[pos])
                        pos += 1
                    elif op == 0x28:  # ( MARK
                        if len(metastack) >= MAX_DEPTH:
                            raise PickleError(f"MARKs nested deeper than {MAX_DEPTH} levels")
                        metastack.append(stack)
                        stack = []
                    elif op == 0x58:  # X BINUNICODE
                        size = _U32(data, pos)[0]
                        pos += 4
                        if pos + size > end:
                            raise Truncated(_TRUNCATED)
                        stack.append(str(data[pos : pos + size], "utf-8", "surrogatepass"))
                        pos += size
                    elif op == 0x52:  # R REDUCE
                        args = stack.pop()
                        if type(args) is not tuple:
                            raise PickleError(f"REDUCE with arguments of type {type(args).__name__}")
                        result = hooks.reduce(stack[-1], args)
                        stack[-1] = self._made(result, args) if type(result) in containers else result
                    elif op == 0x51:  # Q BINPERSID
                        stack.append(hooks.persistent_load(stack.pop()))
                    elif op == 0x29:  # ) EMPTY_TUPLE
                        stack.append(())
                    elif op == 0x4D:  # M BININT2
                        stack.append(_U16(data, pos)[0])
                        pos += 2
                    elif op == 0x4A:  # J BININT
                        stack.append(_I32(data, pos)[0])
                        pos += 4
                    elif op == 0x4E:  # N NONE
                        stack.append(None)
                    elif op == 0x5D:  # ] EMPTY_LIST
                        stack.append([])
                    elif op == 0x47:  # G BINFLOAT
                        stack.append(_F64(data, pos)[0])
                        pos += 8
                    elif op == 0x55:  # U SHORT_BINSTRING (torch.load decodes it as UTF-8)
                        size = data[pos]
                        if pos + 1 + size > end:
                            raise Truncated(_TRUNCATED)
                        stack.append(data[pos + 1 : pos + 1 + size].decode("utf-8"))
                        pos += 1 + size
                    elif op == 0x2E:  # . STOP
                        self.pos = pos
                        return stack.pop(), pos
                    else:
                        pos -= 1
                        raise PickleError(self._refused(op, stack, pos))
                elif op < 0x80:
                    if op == 0x72:  # r LONG_BINPUT
                        memo[_U32(data, pos)[0]] = stack[-1]
                        pos += 4
                    elif op == 0x68:  # h BINGET
                        stack.append(memo[data[pos]])
                        pos += 1
                    elif op == 0x74:  # t TUPLE
                        items = stack
                        stack = metastack.pop()
                        stack.append(self._tuple(items))
                    elif op == 0x71:  # q BINPUT
                        memo[data[pos]] = stack[-1]
                        pos += 1
                    elif op == 0x75:  # u SETITEMS
                        items = stack
                        stack = metastack.pop()
                        if len(items) % 2:
                            raise PickleError("SETITEMS with an odd number of items")
                        target = stack[-1]
                        for index in range(0, len(items), 2):
                            self._setitem(target, items[index], items[index + 1])
                    elif op == 0x73:  # s SETITEM
                        value = stack.pop()
                        key = stack.pop()
                        self._setitem(stack[-1], key, value)
                    elif op == 0x61:  # a APPEND
                        item = stack.pop()
                        self._append(stack[-1], [item])
                    elif op == 0x65:  # e APPENDS
                        items = stack
                        stack = metastack.pop()
                        self._append(stack[-1], items)
                    elif op == 0x7D:  # } EMPTY_DICT
                        stack.append({})
                    elif op == 0x6A:  # j LONG_BINGET
                        stack.append(memo[_U32(data, pos)[0]])
                        pos += 4
                    elif op == 0x63:  # c GLOBAL
                        module, name, pos = self._global(data, pos)
                        stack.append(hooks.find_global(module, name))
                    elif op == 0x62:  # b BUILD
                        state = stack.pop()
                        hooks.build(stack[-1], state)
                        if type(stack[-1]) in containers and not isinstance(stack[-1], dict):
                            self._grow(stack[-1], state)  # a stand-in keeping the state
                    else:
                        pos -= 1
                        raise PickleError(self._refused(op, stack, pos))
                elif op == 0x85:  # TUPLE1
                    item = stack[-1]
                    kind = type(item)
                    stack[-1] = (item,) if kind is int or kind is str else self._tuple((item,))
                elif op == 0x89:  # NEWFALSE
                    stack.append(False)
                elif op == 0x86:  # TUPLE2
                    stack[-2:] = [self._tuple((stack[-2], stack[-1]))]
                elif op == 0x87:  # TUPLE3
                    stack[-3:] = [self._tuple((stack[-3], stack[-2], stack[-1]))]
                elif op == 0x88:  # NEWTRUE
                    stack.append(True)
                elif op == 0x8A:  # LONG1
                    size = data[pos]
                    if size > MAX_INT_BYTES:
                        raise PickleError(f"an integer of {size} bytes (at most {MAX_INT_BYTES} accepted)")
                    if pos + 1 + size > end:
                        raise Truncated(_TRUNCATED)
                    stack.append(int.from_bytes(data[pos + 1 : pos + 1 + size], "little", signed=True))
                    pos += 1 + size
                elif op == 0x81:  # NEWOBJ
                    args = stack.pop()
                    cls = stack.pop()
                    if type(args) is not tuple:
                        raise PickleError(f"NEWOBJ with arguments of type {type(args).__name__}")
                    result = hooks.newobj(cls, args)
                    stack.append(self._made(result, args) if type(result) in containers else result)
                elif op == 0x8F:  # EMPTY_SET
                    stack.append(set())
                elif op == 0x80:  # PROTO (torch accepts any number and warns)
                    if pos >= end:
                        raise Truncated(_TRUNCATED)
                    pos += 1
                else:
                    pos -= 1
                    raise PickleError(self._refused(op, stack, pos))
        finally:
            self.pos = pos  # where the failing opcode's argument was read (for the handlers)
        raise PickleError(f"more than {MAX_OPCODES} opcodes")

    def _append(self, target: object, items: list[object]) -> None:
        holder = target if type(target) is list else self.hooks.items_of(target, list)
        if type(holder) is not list:
            raise PickleError(f"APPEND(S) to a {type(target).__name__}, not a list")
        self._extend(holder, items)
        if holder is not target:
            self._grow(target, holder)

    def _extend(self, target: list[object], items: list[object]) -> None:
        containers, depths = self.containers, self.depths
        deepest = 0
        for item in items:
            if type(item) in containers:
                inner = depths.get(id(item), 1)
                if inner > deepest:
                    deepest = inner
        if deepest and deepest + 1 > depths.get(id(target), 1):
            self._register(target, deepest + 1)
        target.extend(items)

    def _made(self, value: object, args: tuple[object, ...]) -> object:
        """Register a container a hook returned (an OrderedDict, a Counter, a stand-in holding args)."""
        if isinstance(value, dict):
            depth = 1 + max((self._depth(item) for item in value.values()), default=0)
            for key in value:
                self._key(key)
        else:  # a stand-in holding the arguments: as deep as a tuple of them
            depth = 1 + max((self._depth(item) for item in args), default=0)
        if depth > 1:
            self._register(value, depth)
        return value

    def _refused(self, op: int, stack: list[object], pos: int) -> str:
        """Why an opcode is refused. STACK_GLOBAL and INST name a global: the hooks see it first, so
        one outside the allowlist is refused by name, as if GLOBAL had named it."""
        name = opcode_name(op)
        named: tuple[str, str] | None = None
        if op == 0x93 and len(stack) >= 2 and isinstance(stack[-2], str) and isinstance(stack[-1], str):
            named = (stack[-2], stack[-1])
        elif op == 0x69:  # INST: module and name lines follow
            try:
                module, attr, _ = self._global(self.data, pos + 1)
                named = (module, attr)
            except (PickleError, UnicodeDecodeError):
                named = None
        if named is None:
            return f"opcode {name}, which torch.load(weights_only=True) refuses"
        self.hooks.find_global(*named)
        return f"{name} of {named[0]}.{named[1]}, an opcode torch.load(weights_only=True) refuses"


def run_pickle(data: bytes, start: int, hooks: Hooks) -> tuple[object, int]:
    """The value of the pickle at data[start:] and the offset just after its STOP opcode."""
    return PickleVM(data, start, hooks).run()
