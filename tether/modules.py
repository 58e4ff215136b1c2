"""Loading a module from a file that is not in a package: the examples (`examples/*.py`) are scripts users run,
and the demo, the benches and the tests read their agent and tasks from those same files."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_file(path: Path) -> ModuleType:
    """The module in `path`, named by its stem, executed fresh."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
