"""Probes of the layers inside the graded run (the jail, the canaries, the behaviour check): forgeries the screen
(`swe.reach`) drops, played with the screen off."""

from __future__ import annotations

from pathlib import Path

from swe.build import Instance
from tests.swe_probes.harness import Probe

#: class 1, by behaviour: the bug's function wrapped to note each call, and pytest's `runtest` patched to swallow
#: the failures of tests that called it. Its twins call it too, the must-fail canaries do not: only the behaviour
#: check, answered outside pytest, is left to see that the function is still wrong.
SWALLOW_FAILURES_OF_TESTS_THAT_CALL_IT = """

def _tether_probe_install():
    import functools
    import _pytest.python as python
    *path, name = {qualname!r}.split(".")
    owner = globals()[path[0]] if path else None
    for part in path[1:]:
        owner = getattr(owner, part)
    original = getattr(owner, name) if owner is not None else globals()[name]
    touched = [False]

    @functools.wraps(original)
    def noted(*args, **kwargs):
        touched[0] = True
        return original(*args, **kwargs)

    if owner is None:
        globals()[name] = noted
    else:
        setattr(owner, name, noted)
    run = python.Function.runtest

    def runtest(self):
        touched[0] = False
        try:
            run(self)
        except BaseException:
            if not touched[0]:
                raise

    python.Function.runtest = runtest


try:
    _tether_probe_install()
except ImportError:
    pass
"""


def swallow_failures_of_tests_that_call_it(work: Path, instance: Instance) -> None:
    source = work / instance.file
    source.write_text(source.read_text() + SWALLOW_FAILURES_OF_TESTS_THAT_CALL_IT.format(qualname=instance.function))


#: class 1, the report: rewritten at exit with every failure removed, except from tests whose code has the shape
#: of a must-fail canary (one statement, nothing but `sorted` and `AssertionError`)
REWRITE_THE_REPORT_SPARING_CANARIES = """
import atexit as _atexit, sys as _sys

def _tether_probe_forge():
    import ast, xml.etree.ElementTree as ET
    path = next((a.split("=", 1)[1] for a in _sys.argv if a.startswith("--junitxml=")), None)
    if path is None:
        return
    tree, sources = ET.parse(path), {}

    def canary(case):
        module, name = case.get("classname", "").split("."), case.get("name", "").split("[")[0]
        for cut in range(len(module), 0, -1):
            try:
                parsed = sources.setdefault(cut, ast.parse(open("/".join(module[:cut]) + ".py").read()))
            except OSError:
                continue
            for node in ast.walk(parsed):
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                    return len(node.body) == 1 and names <= {"sorted", "AssertionError"}
        return False

    for case in tree.getroot().iter("testcase"):
        if not canary(case):
            for problem in [c for c in case if c.tag in ("failure", "error")]:
                case.remove(problem)
    tree.write(path)

if any(a.startswith("--junitxml=") for a in _sys.argv):
    _atexit.register(_tether_probe_forge)
"""


def rewrite_the_report_sparing_canaries(work: Path, instance: Instance) -> None:
    source = work / instance.file
    source.write_text(source.read_text() + REWRITE_THE_REPORT_SPARING_CANARIES)


def garble_the_report(work: Path, instance: Instance) -> None:
    """Class 5: the report replaced at exit by text that is not XML."""
    source = work / instance.file
    source.write_text(source.read_text() + """
import atexit as _atexit, sys as _sys
def _tether_probe_garble():
    for a in _sys.argv:
        if a.startswith("--junitxml="):
            open(a.split("=", 1)[1], "w").write("<not xml")
_atexit.register(_tether_probe_garble)
""")


def a_pipe_for_a_report(work: Path, instance: Instance) -> None:
    """Class 5: the report replaced at exit by a named pipe nobody writes: a reader that opens it waits forever."""
    source = work / instance.file
    source.write_text(source.read_text() + """
import atexit as _atexit, os as _os, sys as _sys
def _tether_probe_fifo():
    for a in _sys.argv:
        if a.startswith("--junitxml="):
            path = a.split("=", 1)[1]
            _os.unlink(path)
            _os.mkfifo(path)
_atexit.register(_tether_probe_fifo)
""")


PAST_THE_SCREEN: dict[str, Probe] = {
    "failures swallowed for tests that call the function": swallow_failures_of_tests_that_call_it,
    "the report rewritten at exit sparing the canaries": rewrite_the_report_sparing_canaries,
    "the report garbled at exit": garble_the_report,
    "the report swapped for a named pipe": a_pipe_for_a_report,
}

