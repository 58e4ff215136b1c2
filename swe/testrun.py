"""Running a repository's tests and reading what they did from pytest's JUnit XML, never from their output.

The report goes to a fresh folder outside the repository under a random name,
so code under test cannot know where to forge one. Only tests the report says
passed count as passed; a test asked for that the report does not list did not
run, and counts as failed. The run has a time limit and, where the platform
allows it (`unshare`: a network namespace of its own), no network.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from infra.processes import children_of
from swe.isolate import jailed
from swe.scratch import scratch

#: where Tether's own modules are imported from (its plugins join a clean tree's test run at build time)
TETHER_ROOT = Path(__file__).resolve().parent.parent
#: pytest's own plugins only: the project's plugins (asyncio, hypothesis, ...) are not the package's
BASE_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


@dataclass(frozen=True)
class TestReport:
    passed: frozenset[str]
    failed: dict[str, str] = field(default_factory=dict)  # test id → the report's message (failures, errors)
    skipped: frozenset[str] = frozenset()
    timed_out: bool = False
    isolated: bool = False  # ran without network
    hidden: bool = False  # ran with the folders it was asked to hide empty
    refused: bool = False  # not run: the folders could not be hidden
    unreadable: str | None = None  # why the report, there, could not be read (not a file, too large, not XML)

    def outcome(self, test: str) -> bool:
        """Whether `test` passed: reported as passed, not merely absent from the failures."""
        return test in self.passed


@cache
def network_isolation() -> list[str]:
    """The prefix that runs a command in a network namespace of its own, or [] where none can be made. Where
    it can, the command also gets a user namespace (it cannot reach this process through /proc) and a process
    namespace (nothing it starts outlives it)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    # a user namespace first (no root needed), then a plain one (root)
    for flags in (["-rn", "--pid", "--fork", "--mount-proc", "--kill-child"], ["-rn"], ["-n"]):
        try:
            if subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return [unshare, *flags]
        except (OSError, subprocess.TimeoutExpired):
            continue
    return []


def run_tests(repo: Path, *, timeout_s: float, tests: Sequence[str] = (), python: str = sys.executable,
              hide: Sequence[Path] = (), unhidden_ok: bool = False, plugins: Sequence[str] = (),
              env: Mapping[str, str] | None = None) -> TestReport:
    """pytest over `tests` (node ids; all when empty) with `repo` as the working folder and first on the path.
    `hide`: folders the run must not see. Given any, the run is jailed (`swe.jail`): a root of its own with the
    system's folders and the interpreter read-only, a private copy of `repo`, and nothing else of the machine;
    only the report comes back. Where no jail can be made the run does not happen and every test counts as
    failed, unless `unhidden_ok` (`hidden` says which it was). Either way the run's home folder is a fresh empty
    one.
    `plugins`: Tether's own pytest plugins to load (build time, on a clean tree: Tether joins the path after
    the tree), with `env` set for them."""
    isolation = network_isolation()
    with scratch("tether-swe-report-") as private:
        report = Path(private) / f"{os.urandom(16).hex()}.xml"
        home = Path(private) / "home"
        home.mkdir()
        command = [*isolation, python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--tb=short",
                   f"--junitxml={report}", *(a for p in plugins for a in ("-p", p)), *tests]
        hidden = jailed(command, work=repo, out=Path(private), hide=hide, collect=[report.name],
                        python=python) if hide else None
        if hide and hidden is None and not unhidden_ok:
            return TestReport(frozenset(), {t: "not run: no mount namespace to hide the task's data" for t
                                            in tests}, isolated=bool(isolation), refused=True)
        command = hidden or command
        roots = [*import_roots(repo), *([TETHER_ROOT] if plugins else [])]
        environment = {**clean_environment(), **BASE_ENV, **(env or {}), "HOME": str(home),
                       "PYTHONPATH": os.pathsep.join(map(str, roots))}
        try:
            subprocess.run(command, cwd=repo, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout_s, check=False, preexec_fn=limit_files(MAX_FILE_BYTES))
        except subprocess.TimeoutExpired:
            return TestReport(frozenset(), {t: "timed out" for t in tests}, timed_out=True,
                              isolated=bool(isolation))
        refused = report.with_name(report.name + ".refused")  # the jail's word on a report it would not bring back
        found = read_junit(report) if not refused.exists() else \
            TestReport(frozenset(), unreadable=refused.read_text(errors="replace")[:500])
    missing = {t: "did not run" for t in tests if t not in found.passed and t not in found.failed
               and t not in found.skipped}
    return TestReport(found.passed, {**found.failed, **missing}, found.skipped, isolated=bool(isolation),
                      hidden=hidden is not None, unreadable=found.unreadable)


@contextlib.contextmanager
def no_leftovers() -> Iterator[None]:
    """Whatever the tests leave running is adopted by this process (a child subreaper) and killed when the block
    ends: nothing the graded code started writes to this process's output after it has printed its result. For a
    process of its own (`tether swe grade`): at the end it kills every child it has."""
    libc = ctypes.CDLL(None, use_errno=True)
    adopting = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        if adopting:
            _kill_children()
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


_PR_SET_CHILD_SUBREAPER = 36


def _kill_children() -> None:
    for _ in range(100):  # a killed child's own children are adopted next
        children = children_of(os.getpid())
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def import_roots(repo: Path) -> list[Path]:
    """Where the package's modules are imported from: `src/` first in a src layout, then the repository."""
    return [*([repo / "src"] if (repo / "src").is_dir() else []), repo]


#: the largest file a test run may write: past it the writer gets SIGXFSZ (no run fills the grader's disk)
MAX_FILE_BYTES = 1024 * 1024 * 1024


def limit_files(size: int) -> Callable[[], None]:
    """A `preexec_fn` that limits the files the child writes (its output included) to `size` bytes each."""
    def limit() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        cap = size if hard == resource.RLIM_INFINITY else min(size, hard)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, hard))
    return limit


#: a report larger than this was not written by pytest for a task's tests
MAX_REPORT_BYTES = 32 * 1024 * 1024


def read_junit(path: Path) -> TestReport:
    """Test ids as pytest names them (`path/to/test_x.py::Class::test`), from the report's classname and name.
    No report: nothing passed. A report that is not a regular file of at most `MAX_REPORT_BYTES` of XML (the run
    can reach the file: a link, a pipe that never ends, a document cut short) is `unreadable`: nothing passed,
    and the reason says why; reading it never blocks and never raises."""
    try:
        data = _read_report(path)
    except FileNotFoundError:
        return TestReport(frozenset())
    except (OSError, ValueError) as exc:
        return TestReport(frozenset(), unreadable=str(exc))
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        return TestReport(frozenset(), unreadable=f"the report is not well-formed XML: {exc}")
    passed: set[str] = set()
    failed: dict[str, str] = {}
    skipped: set[str] = set()
    for case in root.iter("testcase"):
        test = _node_id(case.get("classname", ""), case.get("name", ""))
        problems = [c for c in case if c.tag in ("failure", "error")]
        if problems:
            failed[test] = "\n".join(filter(None, ((p.get("message") or "").strip() for p in problems)))
        elif any(c.tag == "skipped" for c in case):
            skipped.add(test)
        else:
            passed.add(test)
    return TestReport(frozenset(passed - set(failed)), failed, frozenset(skipped))


def _read_report(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError("the report is not a regular file")
        if status.st_size > MAX_REPORT_BYTES:
            raise ValueError(f"the report is over {MAX_REPORT_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(MAX_REPORT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"the report is over {MAX_REPORT_BYTES} bytes")
    return data


def _node_id(classname: str, name: str) -> str:
    """pytest writes `pkg.tests.test_x.Class` as the classname: back to a path and classes."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that names a test module
        if parts[cut - 1].startswith("test") or parts[cut - 1].endswith("_test"):
            return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])
    return "::".join([classname, name])


def clean_environment() -> dict[str, str]:
    """What a test run inherits: the basics, not this process's settings, secrets or Python paths."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
    return {k: v for k, v in os.environ.items() if k in keep}
