"""Fixtures shared by every suite: the real engines of the distributed runtime (tests/engines.py)."""

pytest_plugins = ["tests.engines"]
