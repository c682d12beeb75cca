"""The hypothesis invariant machine of tests/integration/test_invariants_stateful.py (D, G,
U, M, H, A against its reference model) on the DISTRIBUTED runtime: an API replica on
PostgreSQL (with the machine's fake clock), `fanout relay` and `fanout worker` subprocesses,
the views read back from Cassandra. The same rules, model and invariants; fewer examples
(FANOUT_DISTRIBUTED_INVARIANT_EXAMPLES, default 8), each in a tenant of its own on one
deployment shared by the module.

What differs from the embedded machine: "settle" waits until the views hold the log (the
relay and the worker run on their own, so "falling behind" only defers the checks), and
"restart" closes the replica and opens a new one (the relay and the worker keep running)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from fanout.bootstrap import bootstrap_distributed
from fanout.config import load_settings
from fanout.distributed import DistributedRuntime
from tests.distributed.cluster import Cluster, cluster_for, create_namespace, drop_namespace
from tests.e2e.conftest import check_settings, params_env
from tests.integration import test_invariants_stateful as inv
from tests.integration.conftest import FakeClock

# Hypothesis flags any change of the global `random` state during a draw; the Cassandra driver's
# threads (load balancing, reconnection) use it meanwhile (as in tests/e2e/test_hostile_input_fuzz.py).
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")]

SETTLE_TIMEOUT = 60.0

_deployment: Cluster | None = None


@pytest.fixture(scope="module", autouse=True)
def deployment(engines: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One database, topic and keyspace, with the relay and one worker, for every example."""
    global _deployment
    urls = create_namespace(engines, partitions=2, schema=True)
    c = cluster_for(urls, tmp_path_factory.mktemp("invariants") / "logs", **params_env(inv.PARAMS))
    try:
        check_settings({**c.urls, **c.settings_env}, inv.PARAMS)
        c.replica()  # the event store's tables, and the replica wait_workers watches
        c.start("relay")
        c.start("worker")
        c.wait_workers(1)
        _deployment = c
        yield c
    finally:
        _deployment = None
        c.close()
        drop_namespace(urls)


class DistributedHarness:
    """The embedded machine's Harness, over an API replica of the distributed runtime."""

    def __init__(self, cluster: Cluster, clock: FakeClock) -> None:
        self.cluster = cluster
        self.clock = clock
        self.rt = self._open()

    def _open(self) -> DistributedRuntime:
        s = load_settings({**self.cluster.urls, **self.cluster.settings_env})
        # the machine's FakeClock is years from PostgreSQL's: the clock guard off (ADR-0041); the
        # replica shares that clock with the model, so its hours agree with themselves
        return bootstrap_distributed(replace(s, params=replace(inv.PARAMS, max_clock_skew=0)), clock=self.clock).start()

    @property
    def app(self):  # noqa: ANN201
        return self.rt.app

    @property
    def queries(self):  # noqa: ANN201
        return self.rt.queries

    def settle(self) -> None:
        """Until the views hold everything the log holds (the relay and the worker run apart)."""
        self.cluster.settle(self.rt, SETTLE_TIMEOUT)

    def restart(self) -> None:
        self.rt.close()
        self.rt = self._open()
        self.settle()

    def log_top(self) -> int:
        return int(self.rt.app.recorder.max_notification_id() or 0)

    def close(self) -> None:
        self.rt.close()


class DistributedMachine(inv.FanoutMachine):
    def tenant(self) -> str:
        return f"t{uuid.uuid4().hex[:8]}"

    def open_harness(self) -> Any:
        assert _deployment is not None, "the module's deployment fixture did not run"
        return DistributedHarness(_deployment, self.clock)


DistributedMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("FANOUT_DISTRIBUTED_INVARIANT_EXAMPLES", "6")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestInvariantsOnTheDistributedRuntime = DistributedMachine.TestCase

