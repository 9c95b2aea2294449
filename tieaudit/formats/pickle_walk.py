"""The globals a pickle makes ``pickle.load`` import, found by walking its opcodes; nothing runs.

torch.load(weights_only=False) hands any file that is not a zip to ``pickle.load`` (CPython's C
unpickler), and only then compares the value with torch's magic number: a bare ``pickle.dump``
output imports and calls whatever it names before torch.load fails. tieaudit's pickle VM refuses
what torch's weights_only unpickler refuses (FRAME, STACK_GLOBAL, MEMOIZE: every pickle
``pickle.dump`` writes by default), so it cannot say what such a file does. This walker can: it
follows every opcode of protocols 0 to 5 with the C unpickler's stack rules (marks and fences,
underflow, the memo and its length), keeps only what decides a global (strings, the magic number,
which values are globals or made from them), and records each GLOBAL, INST and STACK_GLOBAL the
unpickler would reach, with torch's verdict (``pickle_globals.classify``) and what loading does
with it.

It stops where the unpickler stops (an unknown opcode, a stack underflow, a malformed argument, a
missing memo entry, the end of the file) and goes on wherever it cannot be sure the unpickler
stops, so it may name more than loading reaches, never less. A STACK_GLOBAL whose operands are not
known strings is named ``<unresolved STACK_GLOBAL>`` (runs-code), never passed over. A module
that is not a dotted Python identifier is no module an installed package provides: its import
fails, and the walk stops there (a file of that very name on ``sys.path`` is out of its sight).

When the first pickle's value is torch's magic number, torch.load reads the legacy stream on with
the same unpickler (protocol version, system info, the object pickle with persistent ids, the
storage keys), so those four pickles are walked too.
"""

from __future__ import annotations

import mmap

from tieaudit.formats.pickle_walk_state import (
    HIGHEST_PROTOCOL,
    LEGACY_PICKLES,
    MAGIC,
    MAX_STACK_ITEMS,
    OBJECT_PICKLE,
    UNKNOWN,
    UNRESOLVED,
    UNRESOLVED_LINE,
    End,
    Ending,
    Walk,
    WalkState,
)

__all__ = ["UNRESOLVED", "UNRESOLVED_LINE", "Ending", "Walk", "walk_pickle", "walk_pickles"]


class _Walker(WalkState):
    """Walks the pickles of one file."""

    def run(self, pos: int) -> None:
        walk = self.walk
        try:
            for number in range(LEGACY_PICKLES):
                if number and pos >= self.size:
                    break  # the file ends at a pickle's end: torch.load fails there, unpickling nothing more
                value, pos = self._pickle(pos, persistent=number == OBJECT_PICKLE)
                walk.pickles += 1
                if number == 0 and value is not MAGIC and value is not UNKNOWN:
                    break  # torch.load fails "Invalid magic number": nothing more is unpickled
            walk.ending = "stop"
        except End as end:
            walk.ending = end.ending

    def _pickle(self, pos: int, *, persistent: bool) -> tuple[object, int]:
        data, end = self.data, self.end
        stack: list[object] = []
        push = stack.append
        marks: list[int] = []
        fence = 0
        for count in range(end - pos + 1):  # each opcode takes at least one byte
            if not count & 0xFFFF and len(stack) + len(marks) > MAX_STACK_ITEMS:
                raise End("unscanned")
            if pos >= end:
                raise End("broken" if end >= self.size else "unscanned")
            op = data[pos]
            kind = _KIND[op]
            pos += 1
            if kind <= 8:
                if kind == 1:  # SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
                    width = 1 if op == 0x8C else 4 if op == 0x58 else 8
                    self._need(pos, width)
                    size = int.from_bytes(data[pos : pos + width], "little")
                    pos += width
                    push(self._string(pos, size, "utf-8", errors="surrogatepass"))
                    pos += size
                elif kind == 2:  # MEMOIZE
                    if len(stack) <= fence:
                        raise End("broken")
                    self._put(self.dense + len(self.sparse), stack[-1])
                elif kind == 3:  # BINPUT, LONG_BINPUT
                    width = 1 if op == 0x71 else 4
                    self._need(pos, width)
                    index = int.from_bytes(data[pos : pos + width], "little")
                    pos += width
                    if len(stack) <= fence:
                        raise End("broken")
                    self._put(index, stack[-1])
                elif kind == 4:  # BINGET, LONG_BINGET
                    width = 1 if op == 0x68 else 4
                    self._need(pos, width)
                    push(self._get(int.from_bytes(data[pos : pos + width], "little")))
                    pos += width
                elif kind == 5:  # BININT1, BININT2, BININT, BINFLOAT
                    width = 1 if op == 0x4B else 2 if op == 0x4D else 4 if op == 0x4A else 8
                    self._need(pos, width)
                    pos += width
                    push(None)
                elif kind == 6:  # MARK
                    marks.append(len(stack))
                    fence = len(stack)
                elif kind == 7:  # APPENDS, SETITEMS, ADDITEMS, TUPLE, LIST, DICT, FROZENSET, POP_MARK
                    if not marks:
                        raise End("broken")  # could not find MARK
                    mark = marks.pop()
                    fence = marks[-1] if marks else 0
                    if op in _INTO_BELOW:  # APPENDS, SETITEMS, ADDITEMS: into the value below the mark
                        if mark <= fence or (op == 0x75 and (len(stack) - mark) % 2):
                            raise End("broken")
                    elif op == 0x64 and (len(stack) - mark) % 2:  # DICT
                        raise End("broken")
                    del stack[mark:]
                    if op in _BUILDS:
                        push(None)
                elif kind == 8:  # NONE, NEWTRUE, NEWFALSE, empty containers
                    push(None)
            elif kind <= 16:
                if kind == 9:  # TUPLE1, TUPLE2, TUPLE3
                    items = op - 0x84
                    if len(stack) - items < fence:
                        raise End("broken")
                    del stack[len(stack) - items :]
                    push(None)
                elif kind == 10:  # APPEND, SETITEM
                    items = 1 if op == 0x61 else 2
                    if len(stack) - items <= fence:
                        raise End("broken")
                    del stack[len(stack) - items :]
                elif kind == 11:  # LONG1, LONG4
                    width = 1 if op == 0x8A else 4
                    self._need(pos, width)
                    size = int.from_bytes(data[pos : pos + width], "little", signed=op == 0x8B)
                    if size < 0:
                        raise End("broken")
                    pos += width
                    push(self._long(pos, size))
                    pos += size
                elif kind == 12:  # REDUCE
                    if len(stack) - 2 < fence:
                        raise End("broken")
                    args = stack.pop()
                    del args
                    stack[-1] = self._made(stack[-1], "called")
                elif kind == 13:  # NEWOBJ, NEWOBJ_EX
                    items = 2 if op == 0x81 else 3
                    if len(stack) - items < fence:
                        raise End("broken")
                    del stack[len(stack) - items + 1 :]
                    stack[-1] = self._made(stack[-1], "instantiated")
                elif kind == 14:  # BUILD
                    if len(stack) - 2 < fence:
                        raise End("broken")
                    stack.pop()
                    self._use(stack[-1], "state set")
                elif kind == 15:  # STOP
                    if len(stack) <= fence:
                        raise End("broken")
                    return stack[-1], pos
                elif kind == 16:  # GLOBAL, INST
                    mark = 0
                    if op == 0x69:
                        if not marks:
                            raise End("broken")
                        mark = marks.pop()
                        fence = marks[-1] if marks else 0
                    names, pos = self._global_lines(pos, "utf-8" if op == 0x63 else "ascii")
                    found = self._unresolved(UNRESOLVED_LINE) if names is None else self._global(*names)
                    if op == 0x69:
                        del stack[mark:]
                        push(self._made(found, "instantiated"))
                    else:
                        push(found)
            elif kind <= 24:
                if kind == 17:  # STACK_GLOBAL
                    if len(stack) - 2 < fence:
                        raise End("broken")
                    name_value = stack.pop()
                    module_value = stack.pop()
                    push(self._stack_global(module_value, name_value))
                elif kind == 18:  # OBJ
                    if not marks:
                        raise End("broken")
                    mark = marks.pop()
                    fence = marks[-1] if marks else 0
                    if len(stack) - mark < 1:
                        raise End("broken")
                    target = stack[mark]
                    del stack[mark:]
                    push(self._made(target, "instantiated"))
                elif kind == 19:  # PROTO
                    self._need(pos, 1)
                    if data[pos] > HIGHEST_PROTOCOL:
                        raise End("broken")
                    self.proto = data[pos]
                    pos += 1
                elif kind == 20:  # FRAME: the unpickler reads it whole first
                    if pos <= self.frame_end:
                        raise End("ambiguous")  # a frame inside a frame: pickle.dump writes them in a row
                    self._need(pos, 8)
                    size = int.from_bytes(data[pos : pos + 8], "little")
                    pos += 8
                    self._skip(pos, size)
                    self.frame_end = pos + size
                elif kind == 21:  # BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8, (SHORT_)BINSTRING
                    width = _COUNTED_BYTES[op]
                    self._need(pos, width)
                    size = int.from_bytes(data[pos : pos + width], "little")
                    pos += width
                    if op == 0x54 or op == 0x55:  # BINSTRING, SHORT_BINSTRING: str (torch's encoding utf-8)
                        push(self._string(pos, size, "utf-8"))
                    else:  # bytes, never read: only their end must be in the file
                        self._skip(pos, size)
                        push(None)
                    pos += size
                elif kind == 22:  # DUP
                    if len(stack) <= fence:
                        raise End("broken")
                    push(stack[-1])
                elif kind == 23:  # POP: a mark right at the top goes first
                    if marks and marks[-1] == len(stack):
                        marks.pop()
                        fence = marks[-1] if marks else 0
                    elif len(stack) <= fence:
                        raise End("broken")
                    else:
                        stack.pop()
                elif kind == 24:  # READONLY_BUFFER
                    if len(stack) <= fence:
                        raise End("broken")
            elif kind == 25:  # BINPERSID: only the legacy object pickle has a persistent_load
                if not persistent or len(stack) <= fence:
                    raise End("broken")
                stack[-1] = UNKNOWN
            elif kind == 26:  # INT, LONG, FLOAT, STRING, UNICODE, GET, PUT, PERSID: a text line
                value, pos = self._text_op(op, pos, stack, fence=fence, persistent=persistent)
                if op != 0x70:  # PUT pushes nothing
                    push(value)
            else:  # EXT1/2/4 (copyreg's registry is empty), NEXT_BUFFER (no buffers), unknown bytes
                raise End("broken")
        raise End("broken")  # unreachable: the loop runs out of data first


_OPCODES: tuple[bytes, ...] = (
    b"\x8cX\x8d",  # 1 strings
    b"\x94",  # 2 MEMOIZE
    b"qr",  # 3 BINPUT, LONG_BINPUT
    b"hj",  # 4 BINGET, LONG_BINGET
    b"KMJG",  # 5 fixed-size numbers
    b"(",  # 6 MARK
    b"eu\x90tld\x911",  # 7 to the mark
    b"N\x88\x89])}\x8f",  # 8 constants
    b"\x85\x86\x87",  # 9 TUPLE1-3
    b"as",  # 10 APPEND, SETITEM
    b"\x8a\x8b",  # 11 LONG1, LONG4
    b"R",  # 12 REDUCE
    b"\x81\x92",  # 13 NEWOBJ, NEWOBJ_EX
    b"b",  # 14 BUILD
    b".",  # 15 STOP
    b"ci",  # 16 GLOBAL, INST
    b"\x93",  # 17 STACK_GLOBAL
    b"o",  # 18 OBJ
    b"\x80",  # 19 PROTO
    b"\x95",  # 20 FRAME
    b"BC\x8e\x96TU",  # 21 counted bytes and byte strings
    b"2",  # 22 DUP
    b"0",  # 23 POP
    b"\x98",  # 24 READONLY_BUFFER
    b"Q",  # 25 BINPERSID
    b"ILFSVgpP",  # 26 text arguments
)
"""The opcodes the walk follows, by kind (its position, from 1): the loop tests at most about a
dozen kinds for any opcode (in groups of eight, the commonest first), so no opcode is slow."""
_REFUSED = len(_OPCODES) + 1
_KIND = bytes(next((k for k, ops in enumerate(_OPCODES, 1) if op in ops), _REFUSED) for op in range(256))
"""Each byte's kind; _REFUSED for the bytes the unpickler refuses (EXT1/2/4, NEXT_BUFFER, unknown)."""
_INTO_BELOW = frozenset(b"eu\x90")
_BUILDS = frozenset(b"tld\x91")
_COUNTED_BYTES = {0x42: 4, 0x43: 1, 0x8E: 8, 0x96: 8, 0x54: 4, 0x55: 1}


def walk_pickles(data: bytes | mmap.mmap, end: int, size: int, *, until_code: bool = False) -> Walk:
    """Walk the pickle(s) torch.load(weights_only=False) unpickles from a file whose first end bytes
    are data (size: the file's size). Nothing is imported or called. ``until_code``: end at the
    first global outside torch's allowlist (ending ``unscanned``)."""
    walk = Walk()
    _Walker(data, end, size, walk=walk, until_code=until_code).run(0)
    return walk


def walk_pickle(
    data: bytes | mmap.mmap, start: int, end: int, *, size: int, walk: Walk, persistent: bool = False
) -> int:
    """Walk the one pickle a fresh unpickler (its own memo) reads at data[start:], adding what it
    names to walk: the position after its STOP, or -1 when the walk ended before (walk.ending says
    how). end: where the walk may read to; size: where the unpickler's input ends (an archive
    member's end). ``persistent``: the unpickler has a persistent_load (torch's object pickles)."""
    try:
        _value, pos = _Walker(data, end, size, walk=walk)._pickle(start, persistent=persistent)
    except End as ended:
        walk.ending = ended.ending
        return -1
    walk.pickles += 1
    walk.ending = "stop"
    return pos

