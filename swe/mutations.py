"""Bugs injected by program transformation, as SWE-smith's procedural modifications make them. Pure.

Each mutant changes one place in one function: a comparison or boolean
operator flipped, a condition inverted, a statement dropped, a constant moved
by one (or a boolean negated), two positional arguments swapped. Only the
text of that place changes, so the diff reads like a one-line bug, not a
reformatted file; the rest of the file keeps its comments and layout.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = ("flip_compare", "flip_boolop", "invert_condition", "drop_statement", "change_constant", "swap_arguments")

_FLIPPED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Mutant:
    kind: str
    function: str  # qualified name within the module: "f", "Class.method"
    line: int  # 1-based, where the change starts
    before: str  # the source text replaced
    after: str  # what replaces it
    source: str  # the whole module with the change


def mutants(source: str) -> Iterator[Mutant]:
    """Every single-place mutant of every function in `source`, in source order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for qualname, function in _functions(tree):
        for kind, node, after in _sites(function):
            before = _segment(lines, node)
            if before is None or after == before:
                continue
            line, _ = _span(node)[0] or (0, 0)
            yield Mutant(kind=kind, function=qualname, line=line, before=before, after=after,
                         source=_replace(lines, node, after))


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + node.name, node
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")

    yield from walk(tree.body, "")


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes of the function's body, not of functions or classes nested in it (they are sites of their own
    where they are top-level; nested ones are left alone)."""
    stack: list[ast.AST] = list(reversed(function.body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _sites(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[str, ast.AST, str]]:
    """(kind, node to replace, its replacement text) for each place in the function."""
    docstring = ast.get_docstring(function, clean=False) is not None
    for node in _own_nodes(function):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIPPED:
            flipped = ast.Compare(left=node.left, ops=[_FLIPPED[type(node.ops[0])]()], comparators=node.comparators)
            yield "flip_compare", node, ast.unparse(flipped)
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield "flip_boolop", node, f"({ast.unparse(ast.BoolOp(op=other, values=node.values))})"
        elif isinstance(node, ast.If | ast.While | ast.IfExp):
            test = node.test
            inverted = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else \
                ast.UnaryOp(op=ast.Not(), operand=test)
            yield "invert_condition", test, f"({ast.unparse(inverted)})"
        elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            if isinstance(node.value, bool):
                yield "change_constant", node, repr(not node.value)
            elif isinstance(node.value, int):
                yield "change_constant", node, repr(node.value + 1)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and \
                not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            swapped = ast.Call(func=node.func, args=[node.args[1], node.args[0], *node.args[2:]],
                               keywords=node.keywords)
            yield "swap_arguments", node, ast.unparse(swapped)
    for body in _bodies(function):
        statements = body[1:] if body is function.body and docstring else body
        if len(statements) < 2:
            continue  # dropping a block's only statement leaves it empty
        for statement in statements:
            if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield "drop_statement", statement, "pass"


def _bodies(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[list[ast.stmt]]:
    for node in _own_nodes(function):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
    yield function.body


def _segment(lines: list[str], node: ast.AST) -> str | None:
    """The node's text (positions are UTF-8 byte offsets within lines)."""
    start, end = _span(node)
    if start is None or end is None:
        return None
    (first, first_col), (last, last_col) = start, end
    encoded = [line.encode() for line in lines[first - 1:last]]
    if len(encoded) == 1:
        return encoded[0][first_col:last_col].decode()
    return (encoded[0][first_col:] + b"".join(encoded[1:-1]) + encoded[-1][:last_col]).decode()


def _replace(lines: list[str], node: ast.AST, text: str) -> str:
    start, end = _span(node)
    assert start is not None and end is not None
    (first, first_col), (last, last_col) = start, end
    head = lines[first - 1].encode()[:first_col].decode()
    tail = lines[last - 1].encode()[last_col:].decode()
    return "".join([*lines[:first - 1], head, text, tail, *lines[last:]])


def _span(node: ast.AST) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    lineno, col = getattr(node, "lineno", None), getattr(node, "col_offset", None)
    end_lineno, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if lineno is None or col is None or end_lineno is None or end_col is None:
        return None, None
    return (lineno, col), (end_lineno, end_col)
