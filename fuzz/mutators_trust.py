"""Mutations that reach the trust issue's attack classes (issue 10), used by harness.py's mutators.

Each one makes the kind of input that once fooled a reader: archives torch and Python's zipfile read
differently (letter-case twins, glued or padded archives, data-descriptor flags, a first entry in
another folder), pickles that exhaust depth or integer size, safetensors headers with duplicate keys
or uncovered bytes, configs that would make transformers run code, and names made to attack a
terminal. None of them builds a valid file on purpose: the readers must refuse or read them right.
"""

from __future__ import annotations

import json
import random
import struct

LOCAL_HEADER = b"PK\x03\x04"
CENTRAL_HEADER = b"PK\x01\x02"

EVIL_NAME_PARTS = ("\n::error file=x::forged", "\x1b[2K\x1b[31m", "\r", "\u202e", "[bold]", "\x00", "\x7f")
"""Fragments spliced into names: each one a control sequence, a log command or rich markup."""


def swap_case(name: str, rng: random.Random) -> str:
    """name with its letters' case changed (a twin that torch's case-insensitive lookup confuses)."""
    flipped = name.swapcase()
    if flipped == name:
        return name + "X"
    if rng.random() < 0.5:
        cut = name.rfind("/") + 1
        return name[:cut] + name[cut:].swapcase()
    return flipped


def mutate_archive_bytes(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """A byte-level edit of a whole zip: glue another archive before or after it, pad it, or set the
    data-descriptor flag (bit 3) of a local or central header."""
    action = rng.randrange(6)
    if action == 0:
        return data + other
    if action == 1:
        return other + data
    if action == 2:
        return rng.randbytes(rng.choice((1, 4, 64))) + data
    if action == 3:
        return data + rng.choice((b"\x00" * 8, b"PK\x05\x06" + b"\x00" * 18, rng.randbytes(16)))
    marker = LOCAL_HEADER if action == 4 else CENTRAL_HEADER
    starts = [i for i in range(len(data)) if data.startswith(marker, i)][:64]
    if not starts:
        return data
    flag_at = rng.choice(starts) + (6 if marker == LOCAL_HEADER else 8)
    (flags,) = struct.unpack_from("<H", data, flag_at)
    return data[:flag_at] + struct.pack("<H", flags | 0x0008) + data[flag_at + 2 :]


DEEP_SNIPPETS = (
    b"N" + b"\x85" * 100_000,  # TUPLE1 a hundred thousand times: a tuple nested 10**5 deep
    b"}" + b"N" + b"\x85" * 1_000_000 + b"Ns",  # that tuple, 10**6 deep, as a dict key (hashed)
    b"]" * 50_000,  # fifty thousand empty lists on the stack
    b"\x8b" + struct.pack("<I", 2500) + b"\x7f" * 2500,  # LONG4: a 6000-digit integer
    b"\x8a\xff" + b"\x7f" * 255,  # LONG1 at its largest
    b"I" + b"9" * 5000 + b"\n",  # protocol-0 INT with 5000 digits
    b"L" + b"9" * 5000 + b"L\n",  # protocol-0 LONG with 5000 digits
)
"""Pickle fragments that cost depth, stack or integer size out of all proportion to their bytes."""


def safetensors_duplicate_key(raw_header: bytes, rng: random.Random) -> bytes:
    """The JSON header with one tensor entry written twice (json keeps the last; Rust refuses)."""
    text = raw_header.decode("utf-8", "replace").rstrip()
    try:
        header = json.loads(text)
    except ValueError:
        return raw_header
    names = [k for k in header if k != "__metadata__"] if isinstance(header, dict) else []
    if not names or not text.endswith("}"):
        return raw_header
    name = rng.choice(names)
    twin = dict(header[name]) if isinstance(header[name], dict) else {}
    if rng.random() < 0.5 and isinstance(twin.get("shape"), list):
        twin["shape"] = [*twin["shape"], 1]
    return (text[:-1] + "," + json.dumps(name) + ":" + json.dumps(twin) + "}").encode()


HUGE_DIMS: tuple[object, ...] = (
    [10**4000 - 1],  # json.dumps cannot write 4300+ digits; DIGITS_5000 below goes in as text
    [10**4000 - 1, 0],
    [0, 10**4000 - 1],
    [2**40] * 64,
    [1] * 100_000,
)
"""Shapes whose size or product is out of all proportion to the header's bytes."""

DIGITS_5000 = "9" * 5000
"""A JSON integer past Python's int-to-str limit, spliced into header text where a number stands."""

CONFIG_ATTACKS: tuple[tuple[str, object], ...] = (
    ("backbone_config", {"model_type": "resnet", "auto_map": {"AutoConfig": "evil.EvilConfig"}}),
    ("auto_map", {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}),
    ("backbone", "microsoft/resnet-50"),
    ("use_pretrained_backbone", True),
    ("depths", [10**9]),
    ("num_hidden_layers", 10**9),
    ("num_local_experts", 10**9),
    ("architectures", ["EvilForCausalLM"]),
    ("trust_remote_code", True),
)
"""config.json entries that would run, fetch or allocate if a model were built from the config."""


def evil_name(name: str, rng: random.Random) -> str:
    """name with a terminal or log attack spliced in."""
    cut = rng.randrange(len(name) + 1)
    return name[:cut] + rng.choice(EVIL_NAME_PARTS) + name[cut:]
