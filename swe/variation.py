"""Inputs the visible tests do not use: a recorded call with one argument changed a little. Pure.

A fix special-cased to the tests' own inputs (it returns what the test
expects for that one input and keeps the bug for every other) behaves like
the original on the recorded calls and unlike it on these. Each variant
changes one argument by one step of its own kind: a number moved, a sequence
reversed, shortened, lengthened, reordered or passed as an iterator (which
pickles, unlike the iterators tests pass), an element or a value changed, a
flag flipped. Arguments of other kinds (functions, objects) stay as they
are, and a call with none to change gives no variant.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Call = tuple[list[Any], dict[str, Any]]


def variants(call: Call, rng: random.Random, count: int) -> list[Call]:
    """Up to `count` calls like `call` with one argument changed; the arguments themselves are not touched."""
    args, kwargs = call
    places: list[int | str] = [i for i, a in enumerate(args) if _changeable(a)]
    places += [k for k, v in kwargs.items() if _changeable(v)]
    made: list[Call] = []
    for _ in range(count * 3):
        if not places or len(made) >= count:
            break
        place = rng.choice(places)
        new_args, new_kwargs = list(args), dict(kwargs)
        if isinstance(place, int):
            new_args[place] = vary(args[place], rng)
        else:
            new_kwargs[place] = vary(kwargs[place], rng)
        made.append((new_args, new_kwargs))
    return made


def _changeable(value: Any) -> bool:
    return type(value) in CHANGES


def vary(value: Any, rng: random.Random) -> Any:
    """`value` changed by one step of its kind (a new object), or itself if it has no kind this knows."""
    change = CHANGES.get(type(value))
    return value if change is None else change(value, rng)


def _number(value: Any, rng: random.Random) -> Any:
    step = rng.choice((1, -1, 2, -2, 3))
    return type(value)(value + step if rng.random() < 0.7 else value * -1 + step)


def _text(value: Any, rng: random.Random) -> Any:
    if not value:
        return value + (b"x" if isinstance(value, bytes) else "x")
    cut = rng.randrange(len(value) + 1)
    return rng.choice((value[::-1], value[:cut], value + value[:cut] or value + value, value[cut:] + value[:cut]))


def _sequence(value: Any, rng: random.Random) -> Any:
    items = list(value)
    how = rng.choice(("reverse", "drop", "repeat", "shuffle", "element", "iterate") if items else ("grow",))
    if how == "iterate":  # as an iterator, a function may take another path: the same items, or changed ones
        return iter(items if rng.random() < 0.5 else list(_sequence(value, rng)))
    if how == "reverse":
        items.reverse()
    elif how == "drop":
        del items[rng.randrange(len(items))]
    elif how == "repeat":
        items.insert(rng.randrange(len(items) + 1), rng.choice(items))
    elif how == "shuffle":
        rng.shuffle(items)
    elif how == "element":
        at = rng.randrange(len(items))
        items[at] = vary(items[at], rng)
    else:
        items.append(0)
    return type(value)(items)


def _mapping(value: dict[Any, Any], rng: random.Random) -> dict[Any, Any]:
    changed = dict(value)
    if changed and rng.random() < 0.5:
        del changed[rng.choice(list(changed))]
    elif changed:
        key = rng.choice(list(changed))
        changed[key] = vary(changed[key], rng)
    else:
        changed[0] = 0
    return changed


def _members(value: Any, rng: random.Random) -> Any:
    items = sorted(value, key=repr)  # the set's own order depends on how it was built
    if items and rng.random() < 0.5:
        items.remove(rng.choice(items))
    else:
        items.append(vary(rng.choice(items), rng) if items else 0)
    try:
        return type(value)(items)
    except TypeError:  # an element that changed into something unhashable
        return value


CHANGES: dict[type, Callable[[Any, random.Random], Any]] = {
    bool: lambda value, rng: not value, int: _number, float: _number, str: _text, bytes: _text,
    list: _sequence, tuple: _sequence, dict: _mapping, set: _members, frozenset: _members,
}
