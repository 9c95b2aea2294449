"""The first bytes each format starts with: what a cheap look at a file's head can tell.

Readers check more (``Reader.sniff``); this is for callers that must not read further, such as
discovery telling a PyTorch ``.bin`` from raw bytes (ONNX external data) without opening it twice.
"""

from __future__ import annotations

from tieaudit.formats.zip_archive import LOCAL_MAGIC as ZIP_MAGIC

__all__ = ["PICKLE_PROTO", "ZIP_MAGIC", "might_be_torch"]

PICKLE_PROTO = 0x80
"""The PROTO opcode: a pickle of protocol 2 or later starts with it (torch's legacy format). A zip
(ZIP_MAGIC, a local file header) is torch.save's format since torch 1.6."""


def might_be_torch(head: bytes) -> bool:
    """head (4 bytes suffice) starts like a torch.save file: a zip, or a protocol 2-5 pickle."""
    return head.startswith(ZIP_MAGIC) or (len(head) >= 2 and head[0] == PICKLE_PROTO and 2 <= head[1] <= 5)
