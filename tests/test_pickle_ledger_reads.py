"""What a call's arguments cost is worked out once per value and kept, but charged at every call.

A pickle can hand one memo'd list to a call thousands of times; the ledger keeps what reading it
costs (``read_costs``) so that our own work per further call is a lookup, while the budget is
charged exactly what it would be charged without the cache. A value that changes (a list grown by
APPEND, a dict given a new value by SETITEM) is worked out again.
"""

from __future__ import annotations

import pytest

from tieaudit.formats.pickle_budget import MAX_KEY_COLLISIONS, REGISTER_UNITS, OverBudget, PickleBudget
from tieaudit.formats.pickle_ledger import MIN_KEPT_READ, Ledger
from tieaudit.formats.pickle_vm import Hashable


def ledger() -> Ledger:
    return Ledger(PickleBudget(1 << 20), Hashable, frozenset({list, tuple, dict, set}))


def charged(books: Ledger, args: tuple[object, ...]) -> int:
    before = books.budget.left
    books.charge_call(args, "a call")
    return before - books.budget.left


def nested(books: Ledger, items: list[object]) -> list[object]:
    """A list registered as holding containers, as the VM's APPENDS leaves it."""
    made: list[object] = []
    books.extend(made, items)
    return made


def test_a_repeated_argument_is_charged_the_same_every_call() -> None:
    books = ledger()
    pairs = nested(books, [books.make_tuple([f"k{i}", "x" * 10]) for i in range(MIN_KEPT_READ * 2)])
    first = charged(books, (pairs,))  # and the keeping of what it cost
    assert first > REGISTER_UNITS and id(pairs) in books.read_costs
    assert [charged(books, (pairs,)) for _ in range(3)] == [first - REGISTER_UNITS] * 3


def test_a_list_that_grows_is_charged_for_its_new_length() -> None:
    books = ledger()
    pairs = nested(books, [books.make_tuple([i, i]) for i in range(MIN_KEPT_READ * 2)])
    first = charged(books, (pairs,))
    books.extend(pairs, [books.make_tuple([-1, -1])])
    assert charged(books, (pairs,)) > first


def test_a_list_of_lists_is_read_again_every_call() -> None:
    """Its inner lists may grow: nothing is kept, each call reads every element again."""
    books = ledger()
    inner: list[list[object]] = [[i, i] for i in range(MIN_KEPT_READ * 2)]
    pairs = nested(books, list(inner))
    first = charged(books, (pairs,))
    assert id(pairs) not in books.read_costs
    books.extend(inner[0], list(range(1000)))
    assert charged(books, (pairs,)) > first


def test_a_dict_given_a_new_value_is_read_again() -> None:
    books = ledger()
    table = dict.fromkeys(range(MIN_KEPT_READ * 2), "short")
    first = charged(books, (table,)) - REGISTER_UNITS  # less the keeping of what it cost
    assert charged(books, (table,)) == first
    table[0] = "x" * 10_000
    books.changed(table)
    assert charged(books, (table,)) - REGISTER_UNITS == first + 10_000 - len("short")


def test_colliding_keys_are_counted_at_every_call() -> None:
    """Keys of one hash make each new dict probe them all: repeating the pairs repeats the count."""
    books = ledger()
    modulus = 2**61 - 1
    pairs = nested(books, [books.make_tuple([k * modulus, 0]) for k in range(1, 40)])
    with pytest.raises(OverBudget, match="MAX_KEY_COLLISIONS"):
        for _ in range(MAX_KEY_COLLISIONS):
            books.charge_call((pairs,), "a call")
