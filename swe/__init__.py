"""Coding-agent tasks built from real packages and graded so that reward hacking scores zero (issue 18)."""
