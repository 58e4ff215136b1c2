"""The behaviour check's parts, each alone: variants of recorded calls (pure), the canonical answers the replay
prints, the screen's count of reach, the report reader on what a graded run can leave, and the jail."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swe import replay
from swe.isolate import jail_works, jailed
from swe.reach import beyond, reach
from swe.testrun import read_junit
from swe.variation import variants

scalars = st.one_of(st.booleans(), st.integers(-1000, 1000), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=8), st.binary(max_size=8), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                        st.tuples(inner, inner),
                                                        st.dictionaries(st.text(max_size=4), inner, max_size=4),
                                                        st.frozensets(st.integers(-50, 50), max_size=5)),
                      max_leaves=6)
calls = st.tuples(st.lists(values, max_size=4), st.dictionaries(st.sampled_from("abcd"), values, max_size=3))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls, st.integers(0, 2**32), st.integers(0, 6))
def test_variants_change_one_argument_and_never_the_call(call: tuple[list[Any], dict[str, Any]], seed: int,
                                                        count: int) -> None:
    before = copy.deepcopy(call)
    made = variants(call, random.Random(seed), count)
    assert call == before  # the recorded call is not touched
    assert len(made) <= count
    for args, kwargs in made:
        assert len(args) == len(call[0]) and kwargs.keys() == call[1].keys()
        changed: list[int | str] = [i for i, (a, b) in enumerate(zip(args, call[0], strict=True)) if a is not b]
        changed += [k for k in kwargs if kwargs[k] is not call[1][k]]
        assert len(changed) <= 1
    again = variants(before, random.Random(seed), count)  # the same seed, the same variants (iterators too)
    assert json.dumps(replay.canonical(made, 100)) == json.dumps(replay.canonical(again, 100))


def test_variants_of_a_call_with_nothing_to_change_are_none() -> None:
    assert variants(([len, object()], {"key": print}), random.Random(0), 5) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=12, unique=True), st.randoms())
def test_a_canonical_answer_does_not_depend_on_order_in_sets_and_dicts(words: list[str], rng: random.Random) -> None:
    shuffled = list(words)
    rng.shuffle(shuffled)
    as_set = json.dumps(replay.canonical(set(words), 100))
    assert as_set == json.dumps(replay.canonical(set(shuffled), 100))
    assert json.dumps(replay.canonical(dict.fromkeys(words, 1), 100)) == \
        json.dumps(replay.canonical(dict.fromkeys(shuffled, 1), 100))


def test_a_canonical_answer_drains_iterators_and_leaves_addresses_out() -> None:
    class Slotted:
        __slots__ = ("a", "b")

        def __init__(self) -> None:
            self.a = 1

    drained = replay.canonical(iter(range(5)), 3)
    assert drained == {"iterator": [0, 1, 2], "more": True}
    assert replay.canonical(Slotted(), 10) == {"object": "test_a_canonical_answer_drains_iterators_and_leaves_"
                                                         "addresses_out.<locals>.Slotted",
                                               "state": {"dict": [["a", 1], ["b", "<not set>"]], "type": "dict",
                                                         "n": 2}}
    assert "0x" not in json.dumps(replay.canonical(object(), 10))
    assert replay.canonical(float("nan"), 1) == {"float": "nan"}


@pytest.mark.parametrize("source, names", [
    (b"class A:\n    def __\xef\xbd\x85q__(self, other):\n        return True\n", ["__eq__"]),  # fullwidth e
    (b"class A:\n    pass\nsetattr(A, '__e' 'q__', lambda s, o: True)\n", ["__eq__", "setattr"]),
    (b"import atexit as _a\n", ["atexit"]),
    (b"from _pytest import python\n", ["_pytest", "python"][:1]),
    (b"x = getattr(__builtins__, 'open')\n", ["__builtins__"]),
])
def test_the_screen_counts_reach_however_it_is_spelled(source: bytes, names: list[str]) -> None:
    assert set(names) <= set(beyond(source, [b"", None]))


def test_the_screen_counts_no_prose_and_allows_what_the_original_had() -> None:
    prose = b"def f():\n    raise ValueError('cannot open the file in f.<locals>: see os docs')\n"
    assert beyond(prose, [b""]) == []
    original = b"import os\ndef f():\n    return os.sep\n"
    assert beyond(original, [b"def f():\n    return '/'\n", original]) == []  # the fix restores the original
    assert reach(b"def broken(:\n open(") == {"open": 1}  # a file that does not parse: its text


def test_a_report_that_is_not_a_plain_file_of_xml_is_unreadable_and_never_blocks(tmp_path: Path) -> None:
    assert read_junit(tmp_path / "absent.xml").passed == frozenset()
    (tmp_path / "garbled.xml").write_text("<not xml")
    assert "not well-formed" in str(read_junit(tmp_path / "garbled.xml").unreadable)
    os.mkfifo(tmp_path / "pipe.xml")
    assert "not a regular file" in str(read_junit(tmp_path / "pipe.xml").unreadable)  # returns: no writer needed
    (tmp_path / "real.xml").write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_b"/>'
                                       "</testsuite></testsuites>")
    (tmp_path / "link.xml").symlink_to(tmp_path / "real.xml")
    assert read_junit(tmp_path / "link.xml").unreadable is not None
    assert read_junit(tmp_path / "real.xml").passed == {"tests/test_a.py::test_b"}


@pytest.mark.skipif(not jail_works(), reason="no user and mount namespaces here: the grader refuses to grade")
def test_the_jail_leaves_only_its_copy_writable_and_hides_what_it_is_told(tmp_path: Path) -> None:
    """The run writes to its private copy and nowhere else; what it wrote stays in the jail; the tasks folder,
    /tmp's other folders and the home folder are not there."""
    copy_, hidden, outside, out = tmp_path / "copy", tmp_path / "tasks", tmp_path / "outside", tmp_path / "out"
    for folder in (copy_, hidden, outside, out):
        folder.mkdir()
    (copy_ / "code.py").write_text("x = 1\n")
    (hidden / "secret").write_text("gold")
    script = ("import os, sys\n"
              "def tries(p):\n"
              "    try:\n"
              "        open(p, 'w').write('x'); return 'wrote'\n"
              "    except OSError as e:\n"
              "        return type(e).__name__\n"
              f"print(tries('{copy_}/mine'), tries('{outside}/theirs'), tries('{sys.prefix}/mark'),\n"
              f"      os.path.exists('{hidden}/secret'), os.listdir(os.path.expanduser('~')))\n")
    argv = jailed([sys.executable, "-c", script], work=copy_, out=out, hide=[hidden])
    assert argv is not None
    done = subprocess.run(argv, cwd=copy_, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # /tmp is an empty one in the jail: `outside` (under the real one) is not there
    wrote_copy, wrote_outside, wrote_prefix, sees_secret, home = done.stdout.split(" ", 4)
    assert (wrote_copy, wrote_outside, wrote_prefix, sees_secret) == ("wrote", "FileNotFoundError", "OSError",
                                                                      "False"), done.stdout
    # the home is empty but for the way to the interpreter, where it lives there (bound back, read-only)
    needed = {Path(p).relative_to(Path.home()).parts[0] for p in (sys.prefix, sys.base_prefix)
              if Path(p).is_relative_to(Path.home())}
    assert set(json.loads(home.strip().replace("'", '"'))) <= needed, home
    assert not (copy_ / "mine").exists() and not (outside / "theirs").exists()  # the copy the run wrote was its own


def _tree(root: Path, module: str) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(module)
    return root


def test_the_replay_answers_each_call_as_data(tmp_path: Path) -> None:
    import pickle

    from swe.behaviour import replay as run_replay

    tree = _tree(tmp_path / "tree", "def f(x, *rest, key=None):\n    if x < 0:\n        raise ValueError(x)\n"
                                    "    return (i * x for i in range(3))\n")
    calls = [pickle.dumps(([2], {})), pickle.dumps(([-1], {})), pickle.dumps(([1, 5], {"key": 3})), b"junk"]
    answers = run_replay(tree, "pkg.mod", "f", calls, timeout_s=60)
    assert answers.problem is None
    parsed = [json.loads(a or "null") for a in answers.lines]
    assert parsed[0]["returned"] == {"iterator": [0, 2, 4], "more": False}
    assert parsed[1] == {"raised": "ValueError"} and parsed[3] == {"unpickled": "UnpicklingError"}


def test_a_replay_that_floods_its_output_is_cut_off_not_read_whole(tmp_path: Path) -> None:
    import pickle

    from swe.behaviour import replay as run_replay

    tree = _tree(tmp_path / "tree", "import sys\nfor _ in range(4096):\n    sys.stdout.write('x' * 65536)\n"
                                    "def f(x):\n    return x\n")
    answers = run_replay(tree, "pkg.mod", "f", [pickle.dumps(([1], {}))], timeout_s=120)
    assert answers.lines == [None] and "answered 0 of 1" in str(answers.problem)


@pytest.mark.parametrize("source, name", [
    (b"m = getattr(print.__self__, '__imp' + 'ort__')('sys')\n", "__self__"),
    (b"m = getattr(obj, 'mod' + 'ules')\n", "getattr"),
    (b"try:\n    1 / 0\nexcept Exception as e:\n    g = e.__traceback__.tb_frame\n", "tb_frame"),
    (b"A = type('A', (), {'__e' + 'q__': lambda s, o: True})\n", "type(name, bases, namespace)"),
    (b"f = (x for x in ()).gi_frame\n", "gi_frame"),
])
def test_the_screen_counts_the_ways_to_names_built_at_run_time(source: bytes, name: str) -> None:
    assert name in beyond(source, [b""])


def test_the_screen_parses_nothing_far_larger_than_a_fix() -> None:
    """A file many times the size of the one it changes is refused unread: parsing megabytes of syntax tree is
    what a red-team probe used to keep the grader busy for minutes."""
    from swe.reach import TOO_LARGE

    original = b"def f(x):\n    return x\n"
    assert beyond(original + b"x = [" + b"0," * 200_000 + b"]\n", [original]) == [TOO_LARGE]
    assert beyond(original + b"# a note\n" * 100, [original]) == []  # a fix's size is fine
    assert beyond(b"y = 1\n" * 60_000, [None]) == [TOO_LARGE]  # a new module of 360 KB


def test_the_screen_counts_pickles_and_the_python_2_builtins() -> None:
    source = b"import pickle as _p\n_p.loads(bytes.fromhex('63'))\nx = '__builtin__'\n"
    assert {"pickle", "__builtin__"} <= set(beyond(source, [b""]))


def test_a_canonical_answer_names_classes_and_modules() -> None:
    import types

    class Iterating:  # a class with the methods of an iterator is not one
        def __iter__(self) -> Iterating:
            return self

        def __next__(self) -> int:
            raise StopIteration

    module = types.ModuleType("tlz.sample")
    module.inner = types.ModuleType("tlz.sample.inner")  # type: ignore[attr-defined]
    assert replay.canonical(Iterating, 10) == {"object": Iterating.__qualname__}
    assert replay.canonical(module, 10) == {"module": "tlz.sample", "names": [["inner", "module tlz.sample.inner"]]}
