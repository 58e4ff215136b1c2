"""Tether's command line: one `tether` command fronting every service."""
