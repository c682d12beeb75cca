"""Fixtures shared by every suite (the real engines of the distributed runtime,
tests/engines.py), and the markers that say what a test needs beyond Python:

* `engines`: PostgreSQL, Kafka or Cassandra. Given to every test whose fixtures reach the
  `engines` fixture (the `fresh_*` namespaces, the e2e `[distributed]` server), and to every
  test under tests/distributed/ and tests/cluster/, so a test cannot forget it.
* `browser`: Chromium. Given to every test that uses a `browser` fixture.

`make test-fast` runs `-m "not engines and not browser"` with FANOUT_TESTS_WITHOUT_ENGINES=1:
then a test that reaches the engines without the marker (a fixture looked up at run time)
fails with that message instead of starting Java and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.engines"]

HERE = Path(__file__).resolve().parent
ENGINE_DIRS = (HERE / "distributed", HERE / "cluster")


def needs_engines(item: pytest.Item) -> bool:
    if "engines" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("runtime_kind") == "distributed":
        return True
    return any(d in Path(str(item.path)).parents for d in ENGINE_DIRS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_engines(item):
            item.add_marker(pytest.mark.engines)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
