"""Coding-agent tasks built from real packages: bugs made by program transformation, checked out for an agent and
graded by the package's own tests so that a change to the tests, the tools or the grader scores zero."""
