"""The coding-task pipeline's errors; the CLI turns them into a message naming what to change.

    SweError
    ├── SourceError    a package's source could not be fetched, unpacked or committed
    └── BuildError     the package's tests cannot serve as a reference (unstable, failing, none)
"""

from __future__ import annotations


class SweError(Exception):
    pass


class SourceError(SweError):
    pass


class BuildError(SweError):
    pass
