"""A package's source, tests included, as a git repository of its own: one commit, no history to read a fix from.

Sources come from the package's source distribution on PyPI (pip download,
cached), so the tests are the ones its maintainers ship.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from swe.errors import SourceError

#: the identity of every commit the pipeline makes: the same bytes on every machine
GIT_IDENTITY = ["-c", "user.name=tether", "-c", "user.email=tether@localhost", "-c", "commit.gpgsign=false",
                "-c", "init.defaultBranch=main"]
#: git as the grader runs it on folders an agent wrote: no hooks, no configuration from the user's home or the
#: system (a graded run once wrote a hooks path into the home folder), no filters or fsmonitor the tree can name
GIT_SAFE = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "protocol.allow=never"]


def git_environment() -> dict[str, str]:
    """The environment git runs in: this one without any GIT_* settings, with the global and system configuration
    files ignored."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


JUNK = ("*.egg-info", "PKG-INFO", "__pycache__", ".pytest_cache")


def fetch_sdist(requirement: str, cache: Path) -> Path:
    """The source distribution of `requirement` (`name==version`), downloaded once into `cache`."""
    name, _, version = requirement.partition("==")
    if not version:
        raise SourceError(f"--package: pin a version, as NAME==VERSION (got {requirement!r})")
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_{version}".lower().replace("-", "_")

    def cached() -> list[Path]:
        return [p for p in cache.glob("*.tar.gz") if p.name.lower().replace("-", "_").startswith(stem)]

    if found := cached():
        return found[0]
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                           "--dest", str(cache), requirement], capture_output=True, text=True, timeout=300)
    found = cached()
    if done.returncode != 0 or not found:
        raise SourceError(f"pip could not download the source distribution of {requirement}: "
                          f"{done.stderr.strip()[-500:]}")
    return found[0]


def unpack(sdist: Path, to: Path) -> Path:
    """The sdist's tree as a repository at `to`: its files without build leftovers, committed once."""
    with tempfile.TemporaryDirectory() as scratch, tarfile.open(sdist) as archive:
        archive.extractall(scratch, filter="data")
        (top,) = Path(scratch).iterdir()
        shutil.copytree(top, to, ignore=shutil.ignore_patterns(*JUNK))
    return commit_tree(to, f"{sdist.name.removesuffix('.tar.gz')}")


def commit_tree(folder: Path, message: str) -> Path:
    """`folder` as a repository of one commit holding everything in it: no other history, refs, tags or reflog."""
    shutil.rmtree(folder / ".git", ignore_errors=True)
    git(folder, "init", "--quiet")
    git(folder, "add", "--all", "--force")
    git(folder, "commit", "--quiet", "--no-verify", "-m", message)
    git(folder, "reflog", "expire", "--expire=now", "--all")
    return folder


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", *GIT_SAFE, *GIT_IDENTITY, *args], cwd=folder, capture_output=True, text=True,
                          timeout=120, env=git_environment())
    if done.returncode != 0:
        raise SourceError(f"git {' '.join(args)} in {folder}: {done.stderr.strip()[-500:]}")
    return done.stdout
