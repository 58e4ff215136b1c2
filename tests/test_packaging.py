"""The project as a wheel, not an editable checkout: every file the code reads ships, and old events still decode.

A container image or `pip install .` gets only what the wheel holds; a data
file left out (an old schema in `avsc/history/`, the tiny model's chat
template, the broker's `pom.xml`) fails there and nowhere else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# The packages pyproject.toml ships, read from it: the list is written once.
PACKAGES = tuple(name.rstrip("*") for name in tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"]["find"]["include"])
FROZEN = Path(__file__).parent / "frozen"

# Run by the fresh environment's interpreter: the installed `schemas` decodes every frozen record.
DECODE = """
import json, pathlib, sys
import schemas
from schemas.serde import decode
print(json.dumps({"from": schemas.__file__,
                  "decoded": sorted(f"{p.parent.name}/{type(decode(p.read_bytes())).__name__}"
                                    for p in pathlib.Path(sys.argv[1]).glob("v*/*.bin"))}))
"""


def _source_files() -> set[str]:
    """Every file of the shipped packages but their bytecode, relative to the root."""
    return {str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the sources (a build writes `build/` and `*.egg-info` beside them)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("tether-*.whl")
    return built


def test_the_wheel_ships_every_file_of_its_packages(wheel: Path) -> None:
    shipped = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files() - shipped)
    assert not missing, f"in the source tree but not in the wheel (pyproject's package-data): {missing}"


def test_a_fresh_environment_with_the_wheel_decodes_every_frozen_record(wheel: Path, tmp_path: Path) -> None:
    """No editable finder, no checkout on the path: the dependencies come from the test's own environment."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(_site_packages(python)), str(wheel)], check=True, capture_output=True, timeout=300)
    deps = sysconfig.get_paths()["purelib"]  # on PYTHONPATH its .pth files (the editable install) are not read
    result = subprocess.run([str(python), "-c", DECODE, str(FROZEN)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env={"PYTHONPATH": deps, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["from"].startswith(str(venv)), found["from"]  # the wheel's copy, not the checkout
    assert found["decoded"] == sorted(f"{p.parent.name}/{p.stem}" for p in FROZEN.glob("v*/*.bin"))


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


#: modules imported directly but installed by a declared dependency of which they are a part
COMES_WITH = {"pydantic_core": "pydantic", "starlette": "fastapi", "urllib3": "kubernetes",
              "vllm": None}  # vllm: imported only where it runs (its weight-transfer helpers), never installed by us


def test_every_module_the_code_imports_is_a_declared_dependency() -> None:
    """An image installs the wheel with its role's extras and nothing else: a module that only arrived with
    another package (aiohttp once came with faust and ray), or with the test tools, is missing there and nowhere
    else. Which role may import what: tests/test_images.py."""
    import ast
    import re
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    shipped = [r for name, extra in project["optional-dependencies"].items() if name != "test" for r in extra]
    declared = {re.split(r"[<>=\[ ;!~]", r)[0].lower().replace("_", "-") for r in [*project["dependencies"], *shipped]}
    distributions = packages_distributions()
    undeclared: dict[str, str] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__" or top in COMES_WITH:
                        continue
                    dists = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
                    if not dists & declared:
                        undeclared.setdefault(top, str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
