"""How the pickle VM names opcodes in errors (torch's Python 2 renaming of globals lives in the
committed allowlist: ``torch_allowlist.TorchAllowlist.spelled``)."""

from __future__ import annotations


def opcode_name(op: int) -> str:
    """An opcode's name and value for an error message, e.g. ``STACK_GLOBAL (0x93)``."""
    import pickletools  # only on the error path

    names = {opcode.code: opcode.name for opcode in pickletools.opcodes}
    found = names.get(chr(op))
    return f"{found} (0x{op:02x})" if found else f"0x{op:02x}"
