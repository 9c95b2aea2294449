"""The pickle VM's books: what it has built (by identity), and what building it cost.

Kept per container: its nesting depth (so nothing is nested past MAX_DEPTH, however it is built),
and for tuples what hashing one costs, counted as a tree (a tuple whose halves are shared has
2**depth nodes to hash, though the pickle built only depth of them). Charged to the budget: each
container built and kept on record, each element an allowed call may read, copy or hash, each
dict key's hashing; dict keys that share a hash with a different key are counted.
"""

from __future__ import annotations

from tieaudit.formats.pickle_budget import (
    CONTAINER_UNITS,
    ENTRY_UNITS,
    MAX_KEY_COLLISIONS,
    OBJECT_UNITS,
    REGISTER_UNITS,
    SLOT_UNITS,
    VISIT_UNITS,
    OverBudget,
    PickleBudget,
)

MAX_DEPTH = 200
"""Containers (and MARKs) nested deeper than this are refused; real checkpoints nest below 20."""
MIN_KEPT_READ = 64
"""Values shorter than this are read again at each call rather than have their cost kept."""
DISTINCT_INTS = 2**61 - 1
"""CPython hashes an int to itself modulo this prime: ints nearer 0 than it never share a hash."""


class PickleError(Exception):
    """The pickle is malformed or uses something torch.load(weights_only=True) refuses."""


class Ledger:
    """Depths, tuple hash costs and dict keys of one pickle's values, and their charges."""

    def __init__(self, budget: PickleBudget, keyable: tuple[type, ...], containers: frozenset[type]) -> None:
        self.budget = budget
        self.scalar_keys = keyable
        """Types accepted as dict keys as they are (tuples of them are accepted too)."""
        self.containers = containers
        """Types whose values hold other values."""
        self.dicts = frozenset(kind for kind in containers if issubclass(kind, dict))
        """The dict types among them."""
        self.depths: dict[int, int] = {}
        """Nesting depth of each container deeper than 1, by id (``alive`` keeps the ids)."""
        self.hash_costs: dict[int, int] = {}
        """Nodes hashing each registered tuple visits, counted as a tree (shared parts again)."""
        self.key_tuples: dict[int, bool] = {}
        """Registered tuples already checked as dict keys: whether they may be one."""
        self.alive: list[object] = []
        """Every container registered, so ids in the tables above are never reused."""
        self.key_hashes: dict[int, object] = {}
        """The first dict key seen with each hash (strings and small ints aside)."""
        self.collisions = 0
        """Dict keys seen whose hash an earlier, different key had."""
        self.paid = 0
        """Units of the call being charged that were charged already (keys hashed as met)."""
        self.read_costs: dict[int, tuple[object, int, int]] = {}
        """What a call's reading a value costs, by id: the value (keeping the id), its length then,
        the units; kept only for values that change by growing, if at all."""

    # ------------------------------------------------------------------ depth

    def depth(self, value: object) -> int:
        """Nesting depth of value: 0 for a scalar; containers of depth 1 are not registered."""
        return self.depths.get(id(value), 1) if type(value) in self.containers else 0

    def register(self, container: object, depth: int) -> None:
        """Record a container nested depth levels deep (refusing past MAX_DEPTH)."""
        if depth > MAX_DEPTH:
            raise PickleError(f"containers nested deeper than {MAX_DEPTH} levels")
        budget = self.budget
        budget.left -= REGISTER_UNITS
        if budget.left < 0:
            budget.over("recording a nested container")
        self.depths[id(container)] = depth
        self.alive.append(container)

    def make_tuple(self, items: list[object] | tuple[object, ...]) -> tuple[object, ...]:
        """A tuple of items, charged, with its depth and (when it holds containers) hash cost."""
        value = tuple(items)
        budget = self.budget
        budget.left -= CONTAINER_UNITS + SLOT_UNITS * len(value)
        if budget.left < 0:
            budget.over("a tuple")
        depths, containers, hash_costs = self.depths, self.containers, self.hash_costs
        depth, cost = 1, 1 + len(value)
        for item in value:
            if type(item) in containers:
                inner = depths.get(id(item), 1) + 1
                if inner > depth:
                    depth = inner
                if type(item) is tuple:
                    cost += hash_costs.get(id(item), len(item) + 1) - 1
        if depth > 1:  # only tuples holding containers; a tuple of scalars holds none
            self.register(value, depth)
            hash_costs[id(value)] = cost
        return value

    def grow(self, container: object, item: object) -> None:
        """container now holds item: its depth is at least item's plus one."""
        kind = type(item)
        if kind is str or kind is int:
            return
        depth = self.depth(item) + 1
        if depth > self.depths.get(id(container), 1):
            self.register(container, depth)

    def extend(self, target: list[object], items: list[object]) -> None:
        """APPEND(S): target.extend(items), charged, depths kept."""
        budget = self.budget
        budget.left -= 2 * SLOT_UNITS * len(items)  # the slots, and a resize's slack
        if budget.left < 0:
            budget.over("APPEND(S) to a list")
        containers, depths = self.containers, self.depths
        deepest = 0
        for item in items:
            if type(item) in containers:
                inner = depths.get(id(item), 1)
                if inner > deepest:
                    deepest = inner
        if deepest and deepest + 1 > depths.get(id(target), 1):
            self.register(target, deepest + 1)
        target.extend(items)

    # ------------------------------------------------------------------ keys

    def hash_cost(self, value: object) -> int:
        """Nodes hashing value visits (1 for a scalar; a tuple counted as a tree)."""
        if type(value) is not tuple:
            return 1
        return self.hash_costs.get(id(value), len(value) + 1)

    def keyable(self, value: object) -> bool:
        """Whether value may be a dict key: a hashable scalar, or tuples of them (at most MAX_DEPTH
        deep, so checking recurses that far at most; the answer is kept per registered tuple)."""
        if isinstance(value, self.scalar_keys):
            return True
        if type(value) is not tuple:
            return False
        known = self.key_tuples.get(id(value))
        if known is not None:
            return known
        answer = all(self.keyable(item) for item in value)
        if id(value) in self.depths:
            self.key_tuples[id(value)] = answer
        return answer

    def key(self, key: object) -> object:
        """key, as a dict key about to be hashed: charged, checked, counted if it collides."""
        kind = type(key)
        if kind is str or (kind is int and -DISTINCT_INTS < key < DISTINCT_INTS):  # type: ignore[operator]
            return key  # str hashes are salted per process; these ints hash to distinct values
        self.budget.charge(VISIT_UNITS * self.hash_cost(key) + ENTRY_UNITS, "hashing a dict key")
        if not self.keyable(key):
            raise PickleError(f"a dict key of type {type(key).__name__}, which tieaudit does not accept")
        self._track(key)
        return key

    def _track(self, key: object) -> object:
        """Count key if its hash is an earlier, different key's (each such key makes every insertion
        of the next ones probe past it); the first key seen with its hash."""
        first = self.key_hashes.setdefault(hash(key), key)
        if first is key:
            return first
        self.budget.charge(VISIT_UNITS * self.hash_cost(key), "comparing dict keys of one hash")
        if first != key:
            self.collisions += 1
            if self.collisions > MAX_KEY_COLLISIONS:
                raise OverBudget(
                    f"has more than MAX_KEY_COLLISIONS ({MAX_KEY_COLLISIONS}) dict keys whose hash a "
                    "different key has too (keys chosen to collide make every insertion probe them all)"
                )
        return first

    def pair_key(self, pair: object) -> tuple[int, bool]:
        """pair may become a dict entry in a call (OrderedDict(items)): hashing its key is charged
        (counted as one, without refusing what the call may refuse itself); the units charged, and
        whether hashing it again would count nothing more (it is the first key of its hash)."""
        key = pair[0]  # type: ignore[index]
        kind = type(key)
        if kind is str or (kind is int and -DISTINCT_INTS < key < DISTINCT_INTS):
            return 0, True
        units = VISIT_UNITS * self.hash_cost(key) + ENTRY_UNITS
        self.budget.charge(units, "hashing a dict key")  # before hashing it: a tuple may be a DAG
        if not self.keyable(key):
            return units, True
        before = self.collisions
        first = self._track(key)
        return units, self.collisions == before and first is key

    # ------------------------------------------------------------------ calls

    def charge_call(self, args: tuple[object, ...], what: str) -> None:
        """Charge what a call may read of its arguments before it runs: every element of each
        argument, the elements of the containers among those (a tensor rebuild copies a size list
        from there, rebuild_from_type_v2 one level further), every string's characters, and the
        hashing of every key that a dict argument or a list of pairs puts in a new dict.

        A pickle can hand one memo'd value to a call thousands of times: what reading it costs is
        worked out once and kept (``read_costs``) where it cannot change, so each further call is
        charged the same units for the work of a lookup, and the budget counts calls, not our own
        scans of them."""
        units = self._known(args)
        if units < 0:
            self.paid = 0
            units, fixed = SLOT_UNITS * (len(args) + 1), True
            for arg in args:
                cost, same = self._argument(arg)
                units += cost
                fixed = fixed and same and type(arg) is not list  # a list may grow
            self._keep(args, units, fixed)
            units -= self.paid
        self.budget.charge(units, what)

    def _known(self, value: object) -> int:
        """The units kept for value at its current length, or -1."""
        kept = self.read_costs.get(id(value))
        if kept is not None and kept[0] is value and kept[1] == len(value):  # type: ignore[arg-type]
            return kept[2]
        return -1

    def _keep(self, value: object, units: int, fixed: bool) -> None:
        """Keep what reading value costs, if nothing in it can change but value's own length (lists
        only grow, by APPEND(S); tuples and strings never change) and the keeping pays for itself."""
        if fixed and len(value) >= MIN_KEPT_READ:  # type: ignore[arg-type]
            self.budget.charge(REGISTER_UNITS, "keeping what reading a value costs")
            self.read_costs[id(value)] = (value, len(value), units)  # type: ignore[arg-type]

    def _argument(self, arg: object) -> tuple[int, bool]:
        """What a call may read of arg, and whether that can change only with arg's length."""
        kind = type(arg)
        if kind is str or kind is bytes:
            return len(arg), True  # type: ignore[arg-type]
        if kind is tuple or kind is list:
            if id(arg) not in self.depths:  # it holds no containers
                return VISIT_UNITS * len(arg), True  # type: ignore[arg-type]
            units = self._known(arg)
            if units >= 0:
                return units, True
            units, fixed = VISIT_UNITS * len(arg), True  # type: ignore[arg-type]
            depths = self.depths
            for item in arg:  # type: ignore[attr-defined]
                units += self._inner(item)
                inner = type(item)
                if inner is list or inner is tuple:
                    if len(item) == 2:
                        cost, same = self.pair_key(item)  # charged already
                        units += cost
                        self.paid += cost
                        fixed = fixed and same
                    fixed = fixed and inner is tuple and id(item) not in depths
                elif inner in self.containers:
                    fixed = False
            self._keep(arg, units, fixed)
            return units, True
        if kind in self.dicts:
            units = self._known(arg)
            if units >= 0:
                return units, False
            units, fixed, depths = VISIT_UNITS * len(arg), True, self.depths  # type: ignore[arg-type]
            for key, item in arg.items():  # type: ignore[attr-defined]
                units += self._inner(item) + VISIT_UNITS * (self.hash_cost(key) - 1)
                inner = type(item)
                if inner in self.containers and (inner is not tuple or id(item) in depths):
                    fixed = False
            self._keep(arg, units, fixed)  # SETITEM(S) into it forgets this (``changed``)
            return units, False
        return 0, True  # nothing it holds is read

    def changed(self, holder: object) -> None:
        """SETITEM(S) put a value in holder, perhaps in place of another: what reading it costs
        must be worked out again."""
        if self.read_costs:
            self.read_costs.pop(id(holder), None)

    def _inner(self, item: object) -> int:
        """What a call may read of item, an element of one of its arguments."""
        if isinstance(item, (str, bytes, list, tuple, dict)):
            return len(item) if isinstance(item, (str, bytes)) else VISIT_UNITS * len(item)
        return 0

    def charge_result(self, result: object, what: str) -> None:
        """Charge what a call returned as new memory (an existing object returned costs the same)."""
        kind = type(result)
        if kind is str or kind is bytes:
            units = CONTAINER_UNITS + len(result)  # type: ignore[arg-type]
        elif isinstance(result, dict):
            per = ENTRY_UNITS if kind is dict else 2 * ENTRY_UNITS  # an OrderedDict links its entries
            units = CONTAINER_UNITS + per * len(result)
        elif kind is list or kind is tuple:
            units = CONTAINER_UNITS + SLOT_UNITS * len(result)  # type: ignore[arg-type]
        else:
            units = OBJECT_UNITS
        self.budget.charge(units, what)

    def made(self, value: object, args: tuple[object, ...]) -> object:
        """Register a container a hook returned (an OrderedDict, a Counter, a stand-in holding args)."""
        depths, containers = self.depths, self.containers
        if isinstance(value, dict):
            depth = 1
            for item in value.values():
                if type(item) in containers:
                    depth = max(depth, depths.get(id(item), 1) + 1)
            for key in value:
                self.key(key)
        else:  # a stand-in holding the arguments: as deep as the tuple of them (registered if nested)
            depth = depths.get(id(args), 1)
        if depth > 1:
            self.register(value, depth)
        return value
