"""The architecture document's map of the code holds to the folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def mapped_folders() -> list[str]:
    """The folders the map's table names in its first column."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Map of the code"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [folder for row in rows for folder in re.findall(r"`([^`]+/)`", row)]


def test_every_folder_the_map_names_exists() -> None:
    gone = [folder for folder in mapped_folders() if not (ROOT / folder / "__init__.py").is_file()]
    assert not gone, f"docs/architecture.md maps packages that are not there: {gone}"


def test_every_top_level_package_is_on_the_map() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    named = {folder.split("/")[0] for folder in mapped_folders()}
    assert packages <= named, f"docs/architecture.md's map misses {sorted(packages - named)}"
    assert len(mapped_folders()) >= len(packages)
