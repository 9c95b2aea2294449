"""How a pickle the unpickler does not refuse at once starts: its first byte (and protocol).

Cheap enough for any reader to ask before importing the pickle machinery (``bare_pickle``,
``torch_sniff``): the safetensors reader asks it of every file it reads.
"""

from __future__ import annotations

__all__ = ["FIRST_OPCODES", "PICKLE_PROTO", "starts_like_pickle"]

PICKLE_PROTO = 0x80
"""The PROTO opcode: a pickle of protocol 2 or later starts with it."""
FIRST_OPCODES = frozenset(b"(FIJKLMNSTUVXBCGc])}\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x95\x96")
"""Opcodes a pickle may start with without the unpickler failing on them: MARK, every opcode that
pushes a value from its argument alone (numbers, strings, bytes, empty containers, GLOBAL), and
FRAME; PROTO too, with a protocol up to 5. Every other first byte fails at once (a pop from the
empty stack, a memo read from the empty memo, a persistent id without persistent_load, an
unknown opcode), importing nothing."""
_HIGHEST_PROTOCOL = 5


def starts_like_pickle(head: bytes) -> bool:
    """head (one or two bytes suffice) is how a pickle the unpickler does not refuse at once starts."""
    if not head:
        return False
    if head[0] == PICKLE_PROTO:
        return len(head) < 2 or head[1] <= _HIGHEST_PROTOCOL
    return head[0] in FIRST_OPCODES
