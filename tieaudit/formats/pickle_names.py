"""How the pickle VM spells globals and opcodes: torch's Python 2 renaming, opcode names for errors."""

from __future__ import annotations

# torch's Python 2 renaming (torch._utils.IMPORT_MAPPING / NAME_MAPPING) where it can matter: the
# allowlisted builtins, and the builtins the pickle-code rule (TIE010) names; other Python 2 names
# keep their spelling (torch does not rename them either).
IMPORT_MAPPING = {"__builtin__": "builtins", "copy_reg": "copyreg"}
NAME_MAPPING = {
    ("__builtin__", "xrange"): ("builtins", "range"),
    ("__builtin__", "long"): ("builtins", "int"),
}


def opcode_name(op: int) -> str:
    """An opcode's name and value for an error message, e.g. ``STACK_GLOBAL (0x93)``."""
    import pickletools  # only on the error path

    names = {opcode.code: opcode.name for opcode in pickletools.opcodes}
    found = names.get(chr(op))
    return f"{found} (0x{op:02x})" if found else f"0x{op:02x}"
