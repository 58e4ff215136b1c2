"""A pytest plugin that records the arguments of every call to chosen functions while a clean tree's tests run:
where the behaviour check (`swe.behaviour`) gets its inputs. Build time only, on the package's own clean tree.

Loaded by `-p swe.recorder` with Tether after the tree on the path.
`TETHER_RECORD` names the functions (`[[file, qualname], ...]`, the file
absolute), where to write (`out`) and how many calls to keep
per function (`max_calls`). A call is matched by its code's file and
qualified name, so a function is recorded however it is reached (re-exported,
wrapped, curried). Each call is kept as a cloudpickle of `(args, kwargs)` taken
when it starts, functions of the test modules by value; a call whose
arguments do not pickle (a generator, a lock) is passed over. Beside each
call, a few variants of it (`swe.variation`): inputs no test uses.
"""

import contextlib
import json
import os
import pickle
import random
import sys
import threading
from typing import Any

import cloudpickle

from swe.variation import variants

CO_VARARGS, CO_VARKEYWORDS = 0x04, 0x08
RESUMABLE = 0x20 | 0x80 | 0x200  # generator, coroutine, asynchronous generator
_spec = json.loads(os.environ.get("TETHER_RECORD", "{}"))
_targets = {(file, name) for file, name in _spec.get("targets", [])}
_calls: dict[tuple[str, str], dict[bytes, None]] = {t: {} for t in _targets}
_variants: dict[tuple[str, str], dict[bytes, None]] = {t: {} for t in _targets}
_rng = random.Random(_spec.get("seed", 0))
_by_value: set[str] = set()
_started: dict[int, Any] = {}
_busy = threading.local()


def _arguments(frame: Any) -> tuple[list[Any], dict[str, Any]]:
    """The call's (args, kwargs), rebuilt from its frame as it starts."""
    code, values = frame.f_code, frame.f_locals
    names = code.co_varnames
    positional = [values[n] for n in names[:code.co_argcount]]
    keywords = {n: values[n] for n in names[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]}
    at = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & CO_VARARGS:
        positional.extend(values[names[at]])
        at += 1
    if code.co_flags & CO_VARKEYWORDS:
        keywords.update(values[names[at]])
    return positional, keywords


def _pickle_tests_by_value() -> None:
    """Functions and classes of test modules travel by value: the replay imports no test module."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if name not in _by_value and os.path.basename(file).startswith(("test_", "conftest")):
            _by_value.add(name)
            with contextlib.suppress(ValueError, ImportError):
                cloudpickle.register_pickle_by_value(module)


def _profile(frame: Any, event: str, arg: Any) -> None:
    if event != "call" or getattr(_busy, "on", False):
        return
    code = frame.f_code
    key = (code.co_filename, code.co_qualname)
    calls = _calls.get(key)
    if calls is None or len(calls) >= _spec["max_calls"]:
        return
    if code.co_flags & RESUMABLE:  # a generator's frame calls again each time it resumes: only its first counts
        if id(frame) in _started:
            return
        _started[id(frame)] = frame  # held: its id cannot name another frame while it is here
    _busy.on = True
    try:
        _pickle_tests_by_value()
        call = _arguments(frame)
        if code.co_name == "__init__":  # replayed as a construction: the object it makes is the answer
            call = (call[0][1:], call[1])
        seen = cloudpickle.dumps(call)
        if seen in calls:
            return
        calls[seen] = None
        for variant in variants(call, _rng, _spec.get("variants_per_call", 3)):
            if len(_variants[key]) >= 2 * _spec["max_calls"]:
                break
            try:
                _variants[key].setdefault(cloudpickle.dumps(variant), None)
            except Exception:  # a variant that does not pickle
                continue
    except Exception:  # an argument that does not pickle: this call is passed over
        pass
    finally:
        _busy.on = False


def pytest_configure(config: Any) -> None:
    if _targets:
        sys.setprofile(_profile)
        threading.setprofile(_profile)


def pytest_unconfigure(config: Any) -> None:
    sys.setprofile(None)
    threading.setprofile(None)
    if _targets:
        with open(_spec["out"], "wb") as out:
            pickle.dump({f"{file}::{name}": {"seen": list(calls), "variants": list(_variants[(file, name)])}
                         for (file, name), calls in _calls.items()}, out)
