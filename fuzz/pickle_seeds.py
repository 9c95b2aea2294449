"""The pickle-bearing files of the corpus, split into their pickles so that one can be mutated and
the file put back together (for fuzz/pickle_verdict.py and tests/test_trust2_pickle_differential.py).

- a torch.save zip: its ``<folder>/data.pkl`` member; the archive is written again with the same
  members in the same order (Python's zipfile, stored, as ``fixtures/hostile/builders.zip_of``
  does: torch reads such archives), so only the pickle differs;
- a legacy stream: its five pickles (magic number, protocol version, system info, object, storage
  keys) and the raw storage bytes after them; any of the five may be mutated.

Nothing here is unpickled: pickles are only walked with ``pickletools.genops``.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "fixtures" / "generated"
HOSTILE = ROOT / "fixtures" / "hostile"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
"""Suffixes the corpus gives its torch.save files (the content decides whether one is a pickle)."""
ZIP_MAGIC = b"PK\x03\x04"
LEGACY_PICKLES = ("magic number", "protocol version", "system info", "object", "storage keys")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Member:
    """One member of a seed archive, kept as it was."""

    name: str
    data: bytes
    compress: int


@dataclass(frozen=True)
class Seed:
    """One corpus file whose pickles can be mutated and written back."""

    label: str
    """The file, relative to the fixtures folder (``generated/torch/tied_lm.pt``)."""
    suffix: str
    """The file's suffix, kept by its mutants."""
    layout: str
    """``zip`` or ``legacy``."""
    pickles: tuple[bytes, ...]
    """zip: (data.pkl,); legacy: the five pickles in file order."""
    members: tuple[Member, ...] = ()
    """zip: every member, data.pkl's bytes included (replaced when assembling)."""
    pickle_member: int = 0
    """zip: the index of data.pkl in ``members``."""
    tail: bytes = b""
    """legacy: the storage bytes after the last pickle."""

    def assemble(self, pickles: tuple[bytes, ...]) -> bytes:
        """The file with its pickles replaced by ``pickles``."""
        if self.layout == "legacy":
            return b"".join(pickles) + self.tail
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for index, member in enumerate(self.members):
                info = zipfile.ZipInfo(member.name, ZIP_TIME)
                info.compress_type = member.compress
                archive.writestr(info, pickles[0] if index == self.pickle_member else member.data)
        return out.getvalue()

    @property
    def targets(self) -> tuple[int, ...]:
        """Indexes of the pickles worth mutating, most interesting first (the object pickle)."""
        return (0,) if self.layout == "zip" else (3, 2, 4, 0, 1)


def pickle_end(data: bytes, start: int = 0) -> int | None:
    """Offset just after the STOP of the pickle at data[start:], or None when it does not parse."""
    stream = io.BytesIO(data)
    stream.seek(start)
    try:
        for opcode, _, pos in pickletools.genops(stream):
            if opcode.name == "STOP":
                return (pos or 0) + 1
    except (ValueError, EOFError, UnicodeDecodeError):
        return None
    return None


def _zip_seed(label: str, suffix: str, data: bytes) -> Seed | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            members = tuple(Member(i.filename, archive.read(i), i.compress_type) for i in infos)
    except Exception:  # a hostile archive zipfile cannot read (bad offsets, encryption, bombs...)
        return None
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        return None  # duplicate members: rewriting them would change which one each reader takes
    index = next((i for i, m in enumerate(members) if m.name.endswith("/data.pkl")), None)
    if index is None or pickle_end(members[index].data) is None:
        return None
    return Seed(label, suffix, "zip", (members[index].data,), members=members, pickle_member=index)


def _legacy_seed(label: str, suffix: str, data: bytes) -> Seed | None:
    pickles, start = [], 0
    for _ in LEGACY_PICKLES:
        end = pickle_end(data, start)
        if end is None:
            return None
        pickles.append(data[start:end])
        start = end
    return Seed(label, suffix, "legacy", tuple(pickles), tail=data[start:])


def seed_of(path: Path, label: str) -> Seed | None:
    """The file as a seed, or None when it is neither a readable zip nor five parseable pickles."""
    data = path.read_bytes()
    if data.startswith(ZIP_MAGIC):
        return _zip_seed(label, path.suffix, data)
    if data[:1] == b"\x80" or data[:1] == b"\x8a":
        return _legacy_seed(label, path.suffix, data)
    return None


def is_pickle_bearing(path: Path) -> bool:
    """A zip, or a stream that starts as a pickle does (PROTO, or LONG1 of the legacy magic)."""
    if not path.is_file() or path.is_symlink():
        return False
    with path.open("rb") as handle:
        head = handle.read(4)
    return head.startswith(ZIP_MAGIC) or head[:1] in (b"\x80", b"\x8a")


def corpus_files() -> list[tuple[str, Path]]:
    """(label, path) of every pickle-bearing file: generated/ (torch.save, Trainer, Lightning,
    DeepSpeed, DCP and optimizer files) and the committed hostile pt_* files."""
    generated = [
        (f"generated/{path.relative_to(GENERATED)}", path)
        for path in sorted(GENERATED.rglob("*"))
        if path.suffix in PICKLE_SUFFIXES and is_pickle_bearing(path)
    ]
    hostile = [
        (f"hostile/{path.name}", path)
        for path in sorted(HOSTILE.glob("pt_*"))
        if path.is_file() and not path.is_symlink()
    ]
    return generated + hostile


SLOW_SEEDS = ("pt_zip_shared_fanout.pt",)
"""Seeds whose mutants make torch.load run for minutes: a REDUCE on the billion-entry shared list
makes torch format that list into its error message (a hang of torch's, not tieaudit's)."""
MAX_SEED_PICKLE_BYTES = 64 << 10
"""Seeds with a larger pickle are checked as they are, not mutated (a mutant costs what its pickle
costs to read twice, and the large ones only repeat the same few shapes)."""


def corpus_seeds(files: list[tuple[str, Path]]) -> list[Seed]:
    """The corpus files that split into pickles small enough to mutate."""
    seeds = []
    for label, path in files:
        seed = None if path.name in SLOW_SEEDS else seed_of(path, label)
        if seed is not None and max(len(p) for p in seed.pickles) <= MAX_SEED_PICKLE_BYTES:
            seeds.append(seed)
    return seeds
