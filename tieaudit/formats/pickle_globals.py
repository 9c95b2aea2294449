"""The verdict on each global a pickle names: torch's own, from its committed allowlist (TIE010).

A pickle is clean exactly when ``torch.load(weights_only=True)`` with torch's default allowlist
would load it. The allowlist is data generated from torch (``formats/torch_allowlist.json``), and a
name is looked up whole, after torch's Python 2 renaming, exactly as torch's unpickler looks it up:

- ``allowed``: on torch's default allowlist (tieaudit reads it for real, or refuses the file when
  it has no stand-in for it, such as quantized tensors);
- ``runs-code``: anything else. torch's default refuses it, and ``torch.load(weights_only=False)``
  or ``pickle.load`` would import it and do what the pickle asks with it (call it, create an
  instance, set its state). tieaudit hands out an inert placeholder instead and calls nothing.

There is no third, "probably harmless" class: a list of names someone judged safe can always be
walked around (``pathlib.Path.write_text``, ``numpy.ndarray.tofile``), and torch refuses them all.
A policy's ``safe-globals`` (the exact names a user passes to ``torch.serialization.add_safe_globals``)
turns TIE010 into TIE011 for those names only (``rules/pickle_code.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tieaudit.formats.torch_allowlist import torch_allowlist

Verdict = Literal["allowed", "runs-code"]
VERDICTS: tuple[Verdict, ...] = ("runs-code", "allowed")
"""Most dangerous first (the order reports list them in)."""

Use = Literal["imported", "called", "instantiated", "state set"]
USES: tuple[Use, ...] = ("imported", "called", "instantiated", "state set")
"""What loading the pickle without weights_only would do with a global, in the order it happens:
import it (GLOBAL), call it (REDUCE), create an instance with ``cls.__new__`` (NEWOBJ), and call the
result's ``__setstate__`` or set its attributes (BUILD)."""


@dataclass
class Named:
    """One global a file's pickles name: its verdict and what loading would do with it."""

    verdict: Verdict
    uses: set[Use] = field(default_factory=lambda: {"imported"})

    def described(self) -> str:
        """``imported, called`` and so on, in the order loading does it."""
        return ", ".join(use for use in USES if use in self.uses)


def classify(module: str, name: str) -> Verdict:
    """torch's verdict on GLOBAL module.name (already renamed the way torch renames it)."""
    allowlist = torch_allowlist()
    if module in allowlist.blocked_modules:
        return "runs-code"
    return "allowed" if f"{module}.{name}" in allowlist.allowed else "runs-code"


def blocked(name: str) -> bool:
    """Whether torch refuses name even after ``add_safe_globals`` (its module is blocked)."""
    return any(name.startswith(f"{module}.") for module in torch_allowlist().blocked_modules)
