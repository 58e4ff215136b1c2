"""Calls one function of a tree on recorded inputs and prints what each call did, as data: the behaviour check's
runner (`swe.behaviour`).

Run by path as `python -P replay.py` with the tree first on PYTHONPATH, in the
graded run's jail when it grades: standard library and cloudpickle only. It
reads one pickle from stdin, `{"nonce", "module", "function", "calls",
"timeout_s", "max_items"}` (each call a pickled `(args, kwargs)`), and writes
one line per call, `NONCE<TAB>JSON`: the outcome in a canonical form (values,
iterators drained, the exception's type name, or a time-out), the same on
every run for the same behaviour. The process only reports: whoever reads the
lines decides what they mean, outside it, and never unpickles them.
"""

import importlib
import inspect
import itertools
import json
import math
import pickle
import re
import signal
import sys
from types import BuiltinFunctionType, FunctionType, GeneratorType, MethodType, ModuleType
from typing import Any

ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
MAX_DEPTH = 8
MAX_LINE = 65536
ROUTINES = (FunctionType, BuiltinFunctionType, MethodType, type)


class TimedOut(BaseException):
    """Raised in the call when its time is up (a BaseException: `except Exception` in the code cannot catch it)."""


def _on_alarm(signum: int, frame: object) -> None:
    raise TimedOut


def canonical(value: Any, max_items: int, depth: int = 0) -> Any:
    """JSON data that is equal for equal values: containers in an order that does not depend on hashing,
    iterators drained (at most `max_items`), other objects by type and address-free repr."""
    if depth > MAX_DEPTH:
        return {"deep": type(value).__qualname__}

    def again(inner: Any) -> Any:
        return canonical(inner, max_items, depth + 1)

    if value is None or isinstance(value, (bool, int, str)):
        return value if not isinstance(value, int) or isinstance(value, bool) or abs(value) < 2**53 \
            else {"int": str(value)}
    if isinstance(value, float):
        return {"float": repr(value)} if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, (bytes, bytearray)):
        return {type(value).__name__: value.hex()}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [again(v) for v in value[:max_items]], "n": len(value)}
    if isinstance(value, dict):
        items = sorted(([again(k), again(v)] for k, v in itertools.islice(value.items(), max_items)), key=json.dumps)
        return {"dict": items, "type": type(value).__qualname__, "n": len(value)}
    if isinstance(value, (set, frozenset)):
        return {type(value).__name__: sorted((again(v) for v in itertools.islice(value, max_items)), key=json.dumps),
                "n": len(value)}
    if isinstance(value, ROUTINES):  # by name: a function's identity is not its behaviour (a class is one too)
        return {"object": getattr(value, "__qualname__", type(value).__qualname__)}
    if isinstance(value, ModuleType):  # by name, and what its names hold, one level down
        return {"module": value.__name__, "names": sorted(([k, _shallow(v)] for k, v in list(vars(value).items())
                                                           [:max_items] if not k.startswith("__")), key=json.dumps)}
    if isinstance(value, (range, GeneratorType)) or (hasattr(value, "__next__") and hasattr(value, "__iter__")):
        drained = list(itertools.islice(value, max_items + 1))
        return {"iterator": [again(v) for v in drained[:max_items]], "more": len(drained) > max_items}
    state = _state(value)
    if state:
        return {"object": type(value).__qualname__, "state": again(state)}
    return {"object": type(value).__qualname__, "repr": ADDRESS.sub("", repr(value))[:4096]}


def _shallow(value: Any) -> str:
    """A module's entry, by what it is: a module by its name, a function or class by where it was made."""
    if isinstance(value, ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, ROUTINES):
        return f"{type(value).__name__} {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    return type(value).__qualname__


def _state(value: Any) -> dict[str, Any]:
    """An object's attributes, from its `__dict__` and its slots (one never set shows as such)."""
    state = dict(getattr(value, "__dict__", None) or {})
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__"):
                state[slot] = getattr(value, slot, NOT_SET)
    return state


NOT_SET = "<not set>"


def outcome(function: Any, call: bytes, timeout_s: float, max_items: int) -> Any:
    try:
        args, kwargs = pickle.loads(call)
    except Exception as exc:  # an input the tree cannot rebuild (a class it no longer has): part of its behaviour
        return {"unpickled": type(exc).__name__}
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        result = canonical(function(*args, **kwargs), max_items)
        after = canonical([args, kwargs], max_items)  # what the call did to its arguments
        return {"returned": result, "arguments": after}
    except TimedOut:
        return {"timed out": True}
    except Exception as exc:
        return {"raised": type(exc).__qualname__}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def target(module: str, qualname: str) -> Any:
    """The function to call; for a class's `__init__`, the class (the call constructs)."""
    found: Any = importlib.import_module(module)
    if qualname.endswith(".__init__"):
        qualname = qualname.removesuffix(".__init__")
    for part in qualname.split("."):
        found = inspect.getattr_static(found, part)
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    return found


def main() -> int:
    job = pickle.loads(sys.stdin.buffer.read())
    nonce = job["nonce"]
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    try:
        function = target(job["module"], job["function"])
    except Exception as exc:
        failed = json.dumps({"missing": type(exc).__qualname__})
        for _ in job["calls"]:
            out.write(f"{nonce}\t{failed}\n")
        return 0
    for call in job["calls"]:
        try:
            line = json.dumps(outcome(function, call, job["timeout_s"], job["max_items"]))
        except Exception as exc:  # an outcome that cannot be written down (a repr that raised)
            line = json.dumps({"unwritable": type(exc).__qualname__})
        out.write(f"{nonce}\t{line[:MAX_LINE]}\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
