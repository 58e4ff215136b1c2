"""Prepared models' folders are named by their recipe's code: documenting it keeps the model, changing it does not."""

from __future__ import annotations

from pathlib import Path

from tether.supervised import recipe

SOURCE = '''"""Module doc."""
LR = 1e-3  # the rate


def steps(n):
    """How many."""
    return n * 2
'''


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_docstrings_comments_and_layout_do_not_change_the_recipe(tmp_path: Path) -> None:
    documented = SOURCE.replace('"""Module doc."""', '"""Module doc, rewritten\n\nat length."""').replace(
        "# the rate", "# the rate, explained").replace('"""How many."""', '"""How many steps."""') + "\n\n"
    assert recipe(_file(tmp_path, "a.py", SOURCE)) == recipe(_file(tmp_path, "b.py", documented))
    undocumented = SOURCE.replace('    """How many."""\n', "")
    assert recipe(_file(tmp_path, "a.py", SOURCE)) == recipe(_file(tmp_path, "c.py", undocumented))


def test_a_change_of_code_changes_the_recipe(tmp_path: Path) -> None:
    base = recipe(_file(tmp_path, "a.py", SOURCE))
    for changed in (SOURCE.replace("1e-3", "2e-3"), SOURCE.replace("n * 2", "n * 3"),
                    SOURCE.replace("return n * 2", "x = 'How many.'\n    return n * 2")):
        assert recipe(_file(tmp_path, "d.py", changed)) != base
    assert recipe(_file(tmp_path, "a.py", SOURCE), _file(tmp_path, "e.py", SOURCE)) != base  # every file counts
