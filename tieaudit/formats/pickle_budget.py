"""What reading a torch file may cost: one budget for the pickle VM and the flattening after it.

The pickle VM builds objects, and an allowed call (``OrderedDict``, ``Counter``, ``set``,
``_codecs.encode``, a tensor rebuild) or an unknown class's placeholder may copy, scan or hash what
it is given. A few bytes of pickle can hand one memo'd container to such a call millions of times,
so counting opcodes, depth or size alone bounds nothing. Every such cost is charged here as it is
spent, in units of about one byte of memory (or, for work that allocates nothing, about 10 ns):
each object built, each element a call may read, copy or hash (a tuple key counted as a tree), each
memo entry and opcode, the pickle's own bytes, and afterwards each value flattened with its dotted
name and each tensor with what the audit and its reports will keep for it. The memo and the VM's
own records are given back when the VM stops (they die with it).

The budget grows with the file: ``MIN_PICKLE_UNITS`` plus ``PICKLE_UNITS_PER_BYTE`` per byte of it
(real checkpoints carry their storages, many bytes per byte of pickle), never more than
``MAX_PICKLE_UNITS``. A 10 MB file may spend about 400 million units, which the attacks of
tests/test_trust2_vm_budget.py turn into at most some 430 MiB and a few seconds; one that asks
for more is refused in one line naming the limit, before the memory is spent.
"""

from __future__ import annotations

from typing import NoReturn

MIN_PICKLE_UNITS = 96 << 20
"""Units any file may spend, however small: 64 KB archives whose pickle inflates 8 times to half
a million containers (tests/test_torch_bounds.py) stay under it."""
PICKLE_UNITS_PER_BYTE = 30
"""Units each byte of the file adds. The densest real layout, torch.save of 100 000 two-element
tensors (25 000 parameters with Adam state), each over its own storage record (9 MB of pickle in a
28 MB file), spends 20 per byte; larger tensors spend far less. At 30, a 10 MB input's worst case
(empty sets, memo entries, a tensor fan-out for the JSON report) peaks near 430 MiB."""
MAX_PICKLE_UNITS = 4 << 30
"""Units no file may spend, however large (a sparse file is large for free): a 1 TB mixture-of-
experts checkpoint (some 300 000 tensors, 50 MB of pickle) needs about 1.7 billion."""
MAX_KEY_COLLISIONS = 1024
"""Dict keys allowed to share a hash with a different earlier key. CPython's int, float and
tuple hashes can be solved for (k * (2**61 - 1) all hash to 0), and n keys of one hash make
inserting them cost n**2 / 2 comparisons; real checkpoints have none."""

SLOT_UNITS = 8
"""A reference on the stack, in a list or tuple: one pointer."""
VISIT_UNITS = 8
"""One element a call reads or copies (a list item, a dict entry, one element of a hashed tuple)."""
OPCODE_UNITS = 16
"""One opcode run, whatever it does (about 60 ns), and the stack slot it may fill (twice a pointer:
a list growing by one slot at a time is copied whole when it moves)."""
OBJECT_UNITS = 256
"""An object a hook makes (a tensor record, a storage record, a placeholder), with its fields."""
ENTRY_UNITS = 96
"""One dict entry: the entry and its share of the hash table while the table grows (old and new
tables both held: up to 90 bytes an entry), twice that in an OrderedDict."""
MEMO_UNITS = 128
"""One memo entry: a dict entry and its int key."""
CONTAINER_UNITS = 88
"""An empty list, dict or tuple, or a MARK frame, with its garbage-collector header and a slot."""
SET_UNITS = 240
"""An empty set (its table is preallocated)."""
REGISTER_UNITS = 128
"""The VM's record of a nested container: its depth by id, and the reference that keeps the id."""
LEAF_UNITS = 160
"""A leaf or container flattened (its name's object, the tuple pairing it), besides the name."""
NODE_UNITS = 512
"""A container walked while flattening (once per place it appears): about 8 us of Python for a
placeholder, counted, listed and named; the units stand for time here."""
TENSOR_UNITS = 3072
"""A tensor leaf's cost after flattening: its records in the checkpoint, the alias graph, the rules
and the reports (measured: about 3 KB per tensor through ``inspect --format json``)."""


class OverBudget(Exception):
    """Reading the file would cost more than its budget (memory, work or hashing)."""


class PickleBudget:
    """The units one file's pickles and their flattening may still spend."""

    def __init__(self, file_bytes: int) -> None:
        self.file_bytes = max(file_bytes, 0)
        """Size of the file the budget is for."""
        self.limit = min(MAX_PICKLE_UNITS, MIN_PICKLE_UNITS + PICKLE_UNITS_PER_BYTE * self.file_bytes)
        """Units allowed in all."""
        self.left = self.limit
        """Units still allowed; below 0 only just before ``over`` raises."""

    def charge(self, units: int, what: str) -> None:
        """Spend units on what (a few words: what the units were for); raise OverBudget past the limit."""
        self.left -= units
        if self.left < 0:
            self.over(what)

    def over(self, what: str) -> NoReturn:
        """Raise OverBudget naming the limit and what crossed it."""
        if self.limit == MAX_PICKLE_UNITS:
            rule = "MAX_PICKLE_UNITS"
        else:
            rule = f"MIN_PICKLE_UNITS + PICKLE_UNITS_PER_BYTE x {self.file_bytes} bytes of file"
        raise OverBudget(
            f"is over its pickle budget of {self.limit} units ({rule}; a unit is about a byte of "
            f"memory) at {what}"
        )
