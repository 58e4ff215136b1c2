"""Bugs by program transformation (swe/mutations.py): pure, property-tested."""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from swe.mutations import KINDS, mutants

OPS = ["<", "<=", ">", ">=", "==", "!=", "is", "is not", "in", "not in"]


@st.composite
def modules(draw: st.DrawFn) -> str:
    """A small module as people write them: comments, a class, a docstring, non-ASCII text."""
    op, join = draw(st.sampled_from(OPS)), draw(st.sampled_from(["and", "or"]))
    n, flag = draw(st.integers(-3, 300)), draw(st.booleans())
    extra = draw(st.sampled_from(["", "    total += 1  # counted\n", "    log('é', a)\n"]))
    return (
        "import math  # header comment\n\n\n"
        "def f(a, b, c=3):\n"
        '    """Docstring: never dropped."""\n'
        f"    total = {n}\n"
        f"{extra}"
        f"    if a {op} b {join} c:\n"
        "        return g(a, b, *c)\n"
        f"    while {flag}:\n"
        "        total = total - 1\n"
        "        break\n"
        "    return (a if a else b)\n\n\n"
        "class K:\n"
        "    def m(self, x):\n"
        "        def inner(y):\n"
        "            return y < 2\n"
        "        return math.pow(x, inner(x))\n"
    )


@settings(max_examples=60, deadline=None)
@given(modules())
def test_every_mutant_parses_changes_one_place_and_keeps_the_rest(source: str) -> None:
    found = list(mutants(source))
    assert {m.kind for m in found} <= set(KINDS)
    assert {m.function for m in found} == {"f", "K.m"}  # nested functions are not sites of their own
    for m in found:
        ast.parse(m.source)
        assert m.source != source and m.after != m.before
        assert m.source.replace(m.after, m.before, 1) == source or m.source.count(m.after) > 1
        original, mutated = source.splitlines(), m.source.splitlines()
        assert original[:m.line - 1] == mutated[:m.line - 1]  # nothing before the place changes
        changed = m.before.count("\n") + 1
        assert original[m.line - 1 + changed:] == mutated[m.line:]  # nor after it: comments and layout kept
        assert "header comment" in m.source and "never dropped" in m.source


def test_each_kind_makes_the_bug_it_names() -> None:
    source = (
        "def f(a, b):\n"
        "    if a < b and b:\n"
        "        a = g(a, b)\n"
        "    return a[1:]\n"
    )
    made = {(m.kind, m.before, m.after) for m in mutants(source)}
    assert ("flip_compare", "a < b", "a >= b") in made
    assert ("flip_boolop", "a < b and b", "(a < b or b)") in made
    assert ("invert_condition", "a < b and b", "(not (a < b and b))") in made
    assert ("swap_arguments", "g(a, b)", "g(b, a)") in made
    assert ("change_constant", "1", "2") in made
    assert ("drop_statement", "a = g(a, b)", "pass") not in made  # the only statement of its block
    assert ("drop_statement", "return a[1:]", "pass") in made
    assert ("drop_statement", "if a < b and b:\n        a = g(a, b)", "pass") in made


def test_a_condition_already_negated_is_inverted_by_removing_the_not() -> None:
    (inverted,) = [m for m in mutants("def f(x):\n    while not x.done:\n        x.step()\n")
                   if m.kind == "invert_condition"]
    assert inverted.after == "(x.done)"
