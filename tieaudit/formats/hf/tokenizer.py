"""tokenizer.json: the vocabulary size a Hugging Face folder's tokenizer holds (rule TIE vocab)."""

from __future__ import annotations

import os

from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.records import Skipped
from tieaudit.formats.hf_dir import TOKENIZER, load_json


def tokenizer_vocab_size(tokenizer: object) -> int | None:
    """Max token id + 1 over the model vocabulary and the added tokens of a tokenizer.json."""
    ids: list[int] = []
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        ids.extend(v for v in vocab.values() if isinstance(v, int))
    elif isinstance(vocab, list) and vocab:  # Unigram: the position is the id
        ids.append(len(vocab) - 1)
    added = tokenizer.get("added_tokens") if isinstance(tokenizer, dict) else None
    if isinstance(added, list):
        ids.extend(t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int))
    return max(ids) + 1 if ids else None


def read_tokenizer(folder: str) -> tuple[int | None, list[str], list[Skipped]]:
    """tokenizer.json's vocabulary size, the file read, and a note when it is unreadable."""
    if not os.path.isfile(os.path.join(folder, TOKENIZER)):
        return None, [], []
    try:
        size = tokenizer_vocab_size(load_json(folder, TOKENIZER))
    except UnsafeInputError:
        raise
    except InputError as exc:
        return None, [], [Skipped(TOKENIZER, f"{exc.message}; tokenizer vocabulary size unknown")]
    return size, [TOKENIZER], []
