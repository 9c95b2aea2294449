"""A pickle virtual machine that runs exactly the opcodes ``torch.load(weights_only=True)`` runs.

torch's weights_only unpickler (``torch/_weights_only_unpickler.py``) interprets 34 opcodes and
refuses every other one; this loop interprets the same 34 with the same stack semantics, so a
pickle either means the same thing here as in torch or is refused. What a global, a call
(REDUCE/NEWOBJ), a BUILD or a persistent id becomes is decided by a ``Hooks`` object (for torch
files: ``torch_pickle.TorchHooks``); nothing from the pickle is ever imported or called.

Unlike CPython's C unpickler, every size, depth and count is bounded while values are built:
opcodes, nesting (MARK and containers), integer width, string and global lengths; and what they
cost is charged to the file's ``PickleBudget`` (``pickle_budget``) as it is spent: every object
built, every element an allowed call may copy, scan or hash (a memo'd container handed to
``OrderedDict`` a million times is a million copies), every memo entry and every opcode. Dict keys
are scalars or tuples of them, hashing a tuple is charged by its size as a tree (so a tuple whose
halves are shared cannot cost 2**depth), and keys chosen to share one hash are refused past
``MAX_KEY_COLLISIONS``.
"""

from __future__ import annotations

import struct
import sys
from typing import Protocol

from tieaudit.formats.pickle_budget import (
    CONTAINER_UNITS,
    ENTRY_UNITS,
    LEAF_UNITS,
    MEMO_UNITS,
    OBJECT_UNITS,
    OPCODE_UNITS,
    REGISTER_UNITS,
    SET_UNITS,
    PickleBudget,
)
from tieaudit.formats.pickle_ledger import MAX_DEPTH, Ledger, PickleError
from tieaudit.formats.pickle_names import opcode_name
from tieaudit.formats.torch_allowlist import torch_allowlist

__all__ = ["MAX_DEPTH", "MAX_GLOBAL_BYTES", "MAX_INT_BYTES", "MAX_OPCODES", "Hashable", "Hooks"]
__all__ += ["PickleError", "PickleVM", "Truncated", "run_pickle"]

MAX_OPCODES = 100_000_000
"""Opcodes one pickle may run: a 50k-tensor state dict runs 1.5 million, so a 1 TB model's
metadata (a few million tensors with optimizer state) stays well under."""
MAX_INT_BYTES = 64
"""Width of a LONG1 integer: torch's metadata are int64 and no real value needs 512 bits.
(LONG4 and the text INT/LONG opcodes, which carry unbounded integers, torch refuses too.)"""
MAX_GLOBAL_BYTES = 512
"""Length of a GLOBAL's module or name line; every allowlisted name is far shorter."""

Hashable = (str, int, float, bool, type(None), bytes)
"""Dict keys accepted as they are (tuples of these are accepted too, see ``Ledger.keyable``)."""

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_F64 = struct.Struct(">d").unpack_from
_TRUNCATED = "the pickle ends before its STOP opcode"
_LONGEST_FIXED_ARGUMENT = 9
"""An opcode byte and the longest fixed-size argument any interpreted opcode has (BINFLOAT)."""
_CHUNK_OPCODES = 1 << 12
"""Opcodes paid for at a time (the unused rest of a chunk is given back at STOP)."""
_GLOBAL_UNITS = 1024
"""A GLOBAL: two lines decoded and looked up, the verdict noted, maybe a placeholder made (about
5 us: units stand for time here)."""
_INT_UNITS = 40
"""An int or float object (28 to 36 bytes) beyond its slot."""
_CALL_ARGUMENTS = "the arguments of a call (what it may read, copy or hash of them)"
_CALL_RESULT = "the result of a call"
_SIZEOF = sys.getsizeof


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

    def __init__(self, data: bytes, start: int, hooks: Hooks, *, budget: PickleBudget | None = None) -> None:
        self.data = data
        self.pos = start
        self.hooks = hooks
        self.budget = budget if budget is not None else PickleBudget(len(data) - start)
        """What the pickle may still cost (shared by a file's pickles and its flattening)."""
        containers = frozenset({list, tuple, dict, set, *hooks.container_types})
        self.ledger = Ledger(self.budget, Hashable + hooks.key_types, containers)
        """Depths, tuple hash costs and dict keys of the values built, and their charges."""

    def _setitem(self, target: object, key: object, value: object) -> None:
        holder = target if isinstance(target, dict) else self.hooks.items_of(target, dict)
        if not isinstance(holder, dict):
            raise PickleError(f"SETITEM(S) on a {type(target).__name__}, not a dict")
        budget, ledger = self.budget, self.ledger
        budget.left -= ENTRY_UNITS if type(holder) is dict else 2 * ENTRY_UNITS
        if budget.left < 0:
            budget.over("SETITEM(S)")
        holder[ledger.key(key)] = value
        ledger.changed(holder)
        ledger.grow(holder, value)
        if holder is not target:
            ledger.grow(target, holder)

    def _append(self, target: object, items: list[object]) -> None:
        holder = target if type(target) is list else self.hooks.items_of(target, list)
        if type(holder) is not list:
            raise PickleError(f"APPEND(S) to a {type(target).__name__}, not a list")
        self.ledger.extend(holder, items)
        if holder is not target:
            self.ledger.grow(target, holder)

    def _call(self, newobj: bool, func: object, args: object) -> object:
        """REDUCE (func(*args)) or NEWOBJ (func.__new__(func, *args)): what the hooks make of it,
        charged for what the call may read of args (before it runs) and for what it returns."""
        if type(args) is not tuple:
            name = "NEWOBJ" if newobj else "REDUCE"
            raise PickleError(f"{name} with arguments of type {type(args).__name__}")
        ledger = self.ledger
        ledger.charge_call(args, _CALL_ARGUMENTS)
        result = self.hooks.newobj(func, args) if newobj else self.hooks.reduce(func, args)
        ledger.charge_result(result, _CALL_RESULT)
        return ledger.made(result, args) if type(result) in ledger.containers else result

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
        """Interpret opcodes until STOP; raise PickleError (or a hook's error) otherwise, and
        OverBudget when the budget runs out first."""
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
        budget, ledger = self.budget, self.ledger
        stack: list[object] = []
        metastack: list[list[object]] = []
        memo: dict[int, object] = {}
        containers = ledger.containers
        pos = self.pos
        ran = 0
        try:
            while ran < MAX_OPCODES:
                # Opcodes are paid for a chunk at a time, ahead (one slot each: what one push holds).
                chunk = min(_CHUNK_OPCODES, MAX_OPCODES - ran, max(budget.left, 0) // OPCODE_UNITS)
                if chunk == 0:
                    budget.over("an opcode")
                budget.left -= chunk * OPCODE_UNITS
                ran += chunk
                # Three groups by opcode value (at most 16 comparisons for any opcode), each ordered
                # by how often torch.save's pickles use its opcodes.
                for count in range(chunk):
                    op = data[pos]
                    pos += 1
                    if op < 0x60:
                        if op == 0x4B:  # K BININT1
                            stack.append(data[pos])
                            pos += 1
                        elif op == 0x28:  # ( MARK
                            if len(metastack) >= MAX_DEPTH:
                                raise PickleError(f"MARKs nested deeper than {MAX_DEPTH} levels")
                            budget.left -= CONTAINER_UNITS
                            metastack.append(stack)
                            stack = []
                        elif op == 0x58:  # X BINUNICODE
                            size = _U32(data, pos)[0]
                            pos += 4
                            if pos + size > end:
                                raise Truncated(_TRUNCATED)
                            text = str(data[pos : pos + size], "utf-8", "surrogatepass")
                            budget.left -= _SIZEOF(text)
                            stack.append(text)
                            pos += size
                        elif op == 0x52:  # R REDUCE
                            args = stack.pop()
                            stack[-1] = self._call(False, stack[-1], args)
                        elif op == 0x51:  # Q BINPERSID
                            pid = stack.pop()
                            ledger.charge_call((pid,) if type(pid) is not tuple else pid, "a persistent id")
                            stack.append(hooks.persistent_load(pid))
                            budget.left -= OBJECT_UNITS
                        elif op == 0x29:  # ) EMPTY_TUPLE
                            stack.append(())
                        elif op == 0x4D:  # M BININT2
                            stack.append(_U16(data, pos)[0])
                            budget.left -= _INT_UNITS
                            pos += 2
                        elif op == 0x4A:  # J BININT
                            stack.append(_I32(data, pos)[0])
                            budget.left -= _INT_UNITS
                            pos += 4
                        elif op == 0x4E:  # N NONE
                            stack.append(None)
                        elif op == 0x5D:  # ] EMPTY_LIST
                            stack.append([])
                            budget.left -= CONTAINER_UNITS
                        elif op == 0x47:  # G BINFLOAT
                            stack.append(_F64(data, pos)[0])
                            budget.left -= _INT_UNITS
                            pos += 8
                        elif op == 0x55:  # U SHORT_BINSTRING (torch.load decodes it as UTF-8)
                            size = data[pos]
                            if pos + 1 + size > end:
                                raise Truncated(_TRUNCATED)
                            text = data[pos + 1 : pos + 1 + size].decode("utf-8")
                            budget.left -= _SIZEOF(text)
                            stack.append(text)
                            pos += 1 + size
                        elif op == 0x2E:  # . STOP
                            budget.left += (chunk - count - 1) * OPCODE_UNITS  # the chunk's unused rest
                            if budget.left < 0:
                                budget.over(f"the opcodes before byte {pos}")
                            # The memo and the ledger's records die with this call: their memory is
                            # free for what the value costs next (flattening, the reports).
                            budget.left += MEMO_UNITS * len(memo) + REGISTER_UNITS * len(ledger.alive)
                            self.pos = pos
                            return stack.pop(), pos
                        else:
                            pos -= 1
                            raise PickleError(self._refused(op, stack, pos))
                    elif op < 0x80:
                        if op == 0x72:  # r LONG_BINPUT
                            index = _U32(data, pos)[0]
                            budget.left -= MEMO_UNITS  # a new entry or a replaced one (never in real pickles)
                            memo[index] = stack[-1]
                            pos += 4
                        elif op == 0x68:  # h BINGET
                            stack.append(memo[data[pos]])
                            pos += 1
                        elif op == 0x74:  # t TUPLE
                            items = stack
                            stack = metastack.pop()
                            stack.append(ledger.make_tuple(items))
                        elif op == 0x71:  # q BINPUT
                            budget.left -= MEMO_UNITS
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
                            budget.left -= CONTAINER_UNITS
                        elif op == 0x6A:  # j LONG_BINGET
                            stack.append(memo[_U32(data, pos)[0]])
                            pos += 4
                        elif op == 0x63:  # c GLOBAL
                            module, name, pos = self._global(data, pos)
                            stack.append(hooks.find_global(module, name))
                            budget.left -= _GLOBAL_UNITS + len(module) + len(name)
                        elif op == 0x62:  # b BUILD
                            state = stack.pop()
                            hooks.build(stack[-1], state)
                            budget.left -= LEAF_UNITS  # a placeholder keeps one more state, flattened later
                            if type(stack[-1]) in containers and not isinstance(stack[-1], dict):
                                ledger.grow(stack[-1], state)  # a stand-in keeping the state
                        else:
                            pos -= 1
                            raise PickleError(self._refused(op, stack, pos))
                    elif op == 0x85:  # TUPLE1
                        stack[-1] = ledger.make_tuple((stack[-1],))
                    elif op == 0x89:  # NEWFALSE
                        stack.append(False)
                    elif op == 0x86:  # TUPLE2
                        stack[-2:] = [ledger.make_tuple((stack[-2], stack[-1]))]
                    elif op == 0x87:  # TUPLE3
                        stack[-3:] = [ledger.make_tuple((stack[-3], stack[-2], stack[-1]))]
                    elif op == 0x88:  # NEWTRUE
                        stack.append(True)
                    elif op == 0x8A:  # LONG1
                        size = data[pos]
                        if size > MAX_INT_BYTES:
                            raise PickleError(
                                f"an integer of {size} bytes (at most {MAX_INT_BYTES} accepted)"
                            )
                        if pos + 1 + size > end:
                            raise Truncated(_TRUNCATED)
                        stack.append(int.from_bytes(data[pos + 1 : pos + 1 + size], "little", signed=True))
                        budget.left -= _INT_UNITS + size
                        pos += 1 + size
                    elif op == 0x81:  # NEWOBJ
                        args = stack.pop()
                        stack[-1] = self._call(True, stack[-1], args)
                    elif op == 0x8F:  # EMPTY_SET
                        stack.append(set())
                        budget.left -= SET_UNITS
                    elif op == 0x80:  # PROTO (torch accepts any number and warns)
                        if pos >= end:
                            raise Truncated(_TRUNCATED)
                        pos += 1
                    else:
                        pos -= 1
                        raise PickleError(self._refused(op, stack, pos))
                # What the opcodes charged inline (at most a few hundred units each, besides strings
                # no longer than the data read) is checked once a chunk; calls check their own.
                if budget.left < 0:
                    budget.over(f"the opcodes before byte {pos}")
        finally:
            self.pos = pos  # where the failing opcode's argument was read (for the handlers)
        raise PickleError(f"more than {MAX_OPCODES} opcodes")

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


def run_pickle(
    data: bytes, start: int, hooks: Hooks, *, budget: PickleBudget | None = None
) -> tuple[object, int]:
    """The value of the pickle at data[start:] and the offset just after its STOP opcode; what it
    costs is charged to budget (by default, a budget of its own for len(data) - start bytes)."""
    return PickleVM(data, start, hooks, budget=budget).run()
