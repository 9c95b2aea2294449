"""The state of a pickle walk (``pickle_walk``): its stack values, memo and findings, and the
opcode arguments it parses, each as CPython's C unpickler parses it, or more leniently.

Values are kept only as far as they decide a global: strings (STACK_GLOBAL operands), torch's
magic number (whether torch.load reads on), globals and what calling them makes (``Ref``), and
``UNKNOWN`` for what the walk did not keep; ``None`` is any other value (numbers, bytes,
containers), which no unpickler opcode can call or import through.
"""

from __future__ import annotations

import codecs
import mmap
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from tieaudit.formats.pickle_globals import Named, Use, Verdict, classify
from tieaudit.formats.torch_allowlist import torch_allowlist

MAX_STACK_ITEMS = 1 << 22
"""Values and marks the walk keeps on its stack (8 bytes each); a real pickle batches appends
and setitems by the thousand and stays far below."""
MAX_MEMO_ENTRIES = 1 << 20
"""Memo entries whose value is tracked (strings, globals, the magic number) or whose index is out
of order; past it every memo read is unknown (a STACK_GLOBAL it feeds is then unresolved)."""
MAX_MEMO_CHARS = 16 << 20
"""Characters of the strings the memo keeps; later strings are memoised as unknown."""
MAX_TRACKED_STR = 4096
"""Longest string (in bytes) the walk decodes and keeps; a longer one is unknown."""
MAX_LINE_COPY = 64 << 10
"""Longest text argument (INT, STRING, GLOBAL lines) the walk copies out of the file to parse."""
MAX_NAMED = 4096
"""Distinct globals recorded; the walk ends there (torch's allowlist is far smaller, so the
ones recorded already hold code)."""
LEGACY_PICKLES = 5
"""Pickles torch.load reads in a row from a legacy stream (magic number, protocol version, system
info, the object, the storage keys)."""
OBJECT_PICKLE = 3
"""The legacy stream's object pickle: the only one torch gives a persistent_load."""
HIGHEST_PROTOCOL = 5
UNRESOLVED = "<unresolved STACK_GLOBAL>"
"""The name recorded for a STACK_GLOBAL whose module or name is not a known string."""
UNRESOLVED_LINE = "<unresolved GLOBAL>"
"""The name recorded for a GLOBAL or INST whose module or name line is too long to copy."""
MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
"""torch's legacy magic number (``torch_legacy.MAGIC_NUMBER``; repeated here to keep imports light)."""

Ending = Literal["stop", "broken", "unscanned", "ambiguous"]
"""How the walk ended: the pickles torch.load reads ended with STOP; the unpickler fails at some
point (a malformed or truncated file); a tieaudit limit ended it before either; or an opcode reads
across the end of a FRAME, which the C unpickler reads on from the frame's bytes or from the file
after the frame depending on how the file is buffered (``pickle.dump`` never writes that)."""


class _Unknown:
    """A value the walk does not know (a string it did not keep, a memo entry past its budget)."""


class _Magic:
    """The integer torch's legacy stream starts with."""


UNKNOWN = _Unknown()
MAGIC = _Magic()


@dataclass(frozen=True)
class Ref:
    """A global (``made`` False) or a value made by calling or instantiating one."""

    name: str
    made: bool


class End(Exception):
    """The walk ends here (``ending`` says how)."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending)
        self.ending = ending


_INT = re.compile(rb"\s*[+-]?(?:0[xXoObB])?[0-9a-fA-F_]+L?\s*")
"""A superset of what INT and LONG accept (strtol base 0, then Python's int base 0)."""
_FLOAT = re.compile(rb"\s*[+-]?(?:[0-9_.]+(?:[eE][+-]?[0-9_]+)?|inf(?:inity)?|nan)\s*", re.IGNORECASE)
"""A superset of what FLOAT accepts (PyOS_string_to_double)."""


@dataclass
class Walk:
    """What a walk found: every global named, with its verdict and use, and how it ended."""

    named: dict[str, Named] = field(default_factory=dict)
    ending: Ending = "broken"
    pickles: int = 0
    """Pickles that reached STOP."""

    @property
    def runs_code(self) -> list[str]:
        """The globals torch's weights_only allowlist does not hold, in the order named."""
        return [name for name, found in self.named.items() if found.verdict == "runs-code"]


def _identifier_path(module: str) -> bool:
    return all(part.isidentifier() for part in module.split("."))


class WalkState:
    """What one file's walk keeps between opcodes, and how it reads their arguments."""

    def __init__(
        self, data: bytes | mmap.mmap, end: int, size: int, *, walk: Walk, until_code: bool = False
    ) -> None:
        self.data = data
        self.until_code = until_code
        """End the walk at the first runs-code global (whether there is one is all the caller asks)."""
        self.end = end
        """Bytes of data the walk may read."""
        self.size = size
        """The file's size: reading past end short of it is a tieaudit limit, past it the unpickler's end."""
        self.walk = walk
        self.refs: dict[tuple[str, bool], Ref] = {}
        self.proto = 0
        self.memo: dict[int, object] = {}
        self.dense = 0
        """Memo indexes 0..dense-1 are all set."""
        self.sparse: set[int] = set()
        """Set memo indexes past dense."""
        self.memo_chars = 0
        self.frame_end = -1
        """Where the last FRAME's bytes end (reading across it is ambiguous)."""
        self.memo_lost = False

    # ------------------------------------------------------------------ helpers

    def _need(self, pos: int, count: int) -> None:
        """The next count bytes at pos are in the file (else the unpickler fails) and within the
        bytes the walk may read (else a tieaudit limit ends it)."""
        if pos < self.frame_end < pos + count:
            raise End("ambiguous")
        if pos + count > self.end:
            raise End("broken" if pos + count > self.size else "unscanned")

    def _skip(self, pos: int, count: int) -> None:
        """Bytes the walk never reads (a long string, bytes, a frame): only their end must be in the file."""
        if pos < self.frame_end < pos + count:
            raise End("ambiguous")
        if pos + count > self.size:
            raise End("broken")

    def _line(self, pos: int) -> tuple[int, int]:
        """(start, stop) of the text argument at pos (stop at its newline)."""
        newline = self.data.find(b"\n", pos, self.end)
        if newline < 0:
            raise End("broken" if self.end >= self.size else "unscanned")
        if pos < self.frame_end <= newline:
            raise End("ambiguous")
        return pos, newline

    def _text(self, start: int, stop: int) -> bytes | None:
        """The line's bytes up to a NUL (what C's string functions see), or None when too long."""
        if stop - start > MAX_LINE_COPY:
            return None
        text = self.data[start:stop]  # bytes, from bytes or a map
        return text.split(b"\0", 1)[0] if b"\0" in text else text

    def _string(self, start: int, size: int, encoding: str, *, errors: str = "strict") -> object:
        """A counted string: decoded as the unpickler decodes it, or unknown when too long to keep
        (then never read: only its end must be in the file)."""
        if size > MAX_TRACKED_STR:
            self._skip(start, size)
            return UNKNOWN
        self._need(start, size)
        try:
            return str(self.data[start : start + size], encoding, errors)
        except UnicodeDecodeError:
            raise End("broken") from None

    def _ref(self, name: str, *, made: bool) -> Ref:
        key = (name, made)
        found = self.refs.get(key)
        if found is None:
            found = self.refs[key] = Ref(name, made)
        return found

    def _use(self, value: object, use: Use) -> None:
        if isinstance(value, Ref):
            self.walk.named[value.name].uses.add(use)

    def _global(self, module: str, name: str) -> Ref:
        """find_class(module, name): the import (and the verdict on it), or the end of the walk."""
        if self.proto < 3:  # the unpickler's fix_imports, as torch's allowlist spells it
            module, name = torch_allowlist().spelled(module, name)
        if not _identifier_path(module):
            raise End("broken")  # no installed module has this name: the import fails here
        return self._record(f"{module}.{name}", lambda: classify(module, name))

    def _record(self, full: str, verdict: Callable[[], Verdict]) -> Ref:
        named = self.walk.named
        if full not in named:
            if len(named) >= MAX_NAMED:
                raise End("unscanned")
            found = named[full] = Named(verdict())
            if self.until_code and found.verdict == "runs-code":
                raise End("unscanned")
        return self._ref(full, made=False)

    def _unresolved(self, label: str) -> Ref:
        """A global the walk cannot name: runs-code, since it may be anything."""
        return self._record(label, lambda: "runs-code")

    def _made(self, target: object, use: Use) -> object:
        """What calling or instantiating target gives; the end of the walk when it cannot be called."""
        if isinstance(target, Ref):
            if not target.made:
                self._use(target, use)
            return self._ref(target.name, made=True)
        if target is UNKNOWN:
            return UNKNOWN
        raise End("broken")  # a string, number or container: nothing the unpickler can call

    def _long(self, pos: int, size: int) -> object:
        """LONG1 or LONG4: torch's magic number, unknown when too long to compare, or another number."""
        if size > MAX_TRACKED_STR:
            self._skip(pos, size)
            return UNKNOWN
        self._need(pos, size)
        number = int.from_bytes(self.data[pos : pos + size], "little", signed=True)
        return MAGIC if number == MAGIC_NUMBER else None

    def _put(self, index: int, value: object) -> None:
        if self.memo_lost:
            return
        if index >= self.dense and index not in self.sparse:
            if index == self.dense:
                self.dense += 1
                while self.dense in self.sparse:
                    self.sparse.discard(self.dense)
                    self.dense += 1
            else:
                self.sparse.add(index)
        if type(value) is str:
            if self.memo_chars + len(value) > MAX_MEMO_CHARS:
                value = UNKNOWN
            else:
                self.memo_chars += len(value)
        if value is None:
            self.memo.pop(index, None)
        else:
            self.memo[index] = value
        if len(self.memo) + len(self.sparse) > MAX_MEMO_ENTRIES:
            self.memo_lost = True
            self.memo.clear()
            self.sparse.clear()

    def _get(self, index: int) -> object:
        if self.memo_lost:
            return UNKNOWN
        if index < self.dense or index in self.sparse:
            return self.memo.get(index)
        raise End("broken")  # "Memo value not found"

    def _text_op(
        self, op: int, pos: int, stack: list[object], *, fence: int, persistent: bool
    ) -> tuple[object, int]:
        """INT, LONG, FLOAT, STRING, UNICODE, GET, PUT, PERSID: (value pushed, position after)."""
        start, stop = self._line(pos)
        pos = stop + 1
        text = self._text(start, stop)
        if op == 0x53:  # STRING: quoted, escapes decoded, then utf-8 (torch's encoding)
            data = self.data
            if stop - start < 2 or data[start] != data[stop - 1] or data[start] not in b"'\"":
                raise End("broken")
            if text is None or len(text) - 2 > MAX_TRACKED_STR or len(text) != stop - start:
                return UNKNOWN, pos
            try:
                with warnings.catch_warnings():  # "invalid escape sequence": kept as they are
                    warnings.simplefilter("ignore", DeprecationWarning)
                    return codecs.escape_decode(text[1:-1])[0].decode("utf-8"), pos
            except (ValueError, UnicodeDecodeError):
                raise End("broken") from None
        if op == 0x56:  # UNICODE
            if text is None or stop - start > MAX_TRACKED_STR:
                return UNKNOWN, pos
            try:
                return codecs.raw_unicode_escape_decode(bytes(self.data[start:stop]))[0], pos
            except UnicodeDecodeError:
                raise End("broken") from None
        if op == 0x50:  # PERSID
            if not persistent or (text is not None and not text.isascii()):
                raise End("broken")
            return UNKNOWN, pos
        if op == 0x49 and text == b"" and stop > start:
            return None, pos  # a NUL first: C's strtol reads nothing and stops at it, which INT takes
        if stop == start or (text is not None and not text.strip()):
            raise End("broken")  # an empty line
        if text is None:
            return None, pos  # a number longer than the walk parses: assume it parses
        if op == 0x46:  # FLOAT
            if not _FLOAT.fullmatch(text):
                raise End("broken")
            return None, pos
        if op == 0x49 or op == 0x4C:  # INT, LONG
            if not _INT.fullmatch(text):
                raise End("broken")
            try:
                number = int(text.rstrip().removesuffix(b"L"), 0)
            except ValueError:
                number = None
            return (MAGIC if number == MAGIC_NUMBER else None), pos
        try:  # GET, PUT: a decimal index
            index = int(text, 10)
        except ValueError:
            raise End("broken") from None
        if op == 0x67:
            return self._get(index), pos
        if len(stack) <= fence or index < 0:
            raise End("broken")
        self._put(index, stack[-1])
        return None, pos

    def _global_lines(self, pos: int, encoding: str) -> tuple[tuple[str, str] | None, int]:
        """The module and name lines of GLOBAL or INST (None: too long to copy), and the position after."""
        names: list[str] = []
        for _ in range(2):
            start, stop = self._line(pos)
            if stop == start:
                raise End("broken")  # an empty line: "pickle data was truncated"
            if stop - start <= MAX_LINE_COPY:
                try:
                    names.append(str(self.data[start:stop], encoding))
                except UnicodeDecodeError:
                    raise End("broken") from None
            pos = stop + 1
        return (names[0], names[1]) if len(names) == 2 else None, pos

    def _stack_global(self, module: object, name: object) -> Ref:
        if type(module) is str and type(name) is str:
            return self._global(module, name)
        known = (str, type(None), _Magic)
        if isinstance(module, known) and isinstance(name, known):
            raise End("broken")  # "STACK_GLOBAL requires str": a number or a container
        return self._unresolved(UNRESOLVED)
