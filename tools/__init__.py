"""Maintainer tooling, run as `python -m tools.<name>`; nothing in the shipped package imports it."""
