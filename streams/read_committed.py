"""A Faust app whose consumer reads committed records only, and commits where its agent stands.

The relay writes the event topic in Kafka transactions; a record of an aborted one must never
be applied. faust-streaming 0.15.3 has no setting for the consumer's isolation level (it reads
committed only with processing_guarantee="exactly_once", which also makes Faust run
transactional producers the workers do not need), so the app's consumer thread sets it on the
aiokafka consumer it creates. `streams/worker.py` builds its app from `WorkerApp`.

**The offsets it commits (ADR-0044).** Reading committed records, the consumer meets a gap in
the offsets after every transaction (its commit marker). Faust 0.15.3 commits only a run of
consecutive acked offsets and fills the gaps from spans it records as it reads; but the span it
records runs one offset too far, over the record after the gap, which is acked as well, and the
duplicate ends the run: each commit advanced about one transaction, so under the relay's traffic
the group's committed offsets fell hopelessly behind (7-26 of 313-482 records a partition in
`tests/distributed/test_worker.py`; 503-531 of ~12,300 in the benches of 2026-12-06), a restarted
worker or a partition that moved was handed nearly the whole partition again (skipped by the
host's tracking, at 10-12 s of CPU), and Kafka's lag of the group said the workers were behind
when they were not. The span bookkeeping also cost about a quarter of a worker's CPU under
small-group traffic (docs/PERFORMANCE.md section 16).

This consumer commits what its agent has taken: the worker's one agent (concurrency 1) acks each
partition's records in offset order, after the unit that applied them committed (a take is
acked as a whole after it is handled), so every offset of a partition below its highest acked
one is a record already applied or one this consumer is never handed (a commit marker, a record
of an aborted transaction); the offset to commit is the highest acked + 1. No spans are kept.
Idempotence still rests on the host's tracking, never on these offsets (streams/host.py): a
commit behind the views costs records skipped, one ahead of them (an ack in a take's `finally`
at shutdown) is caught by the host, which reads from the log what the views lack."""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """aiokafka's consumer as Faust builds it, reading committed records only."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # handed to aiokafka's Fetcher at start()
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    """Reads committed records; commits each partition's highest acked offset + 1 (module doc)."""

    def _new_offset(self, tp: TP) -> int | None:
        acked = self._acked[tp]
        if not acked:
            return None
        top = max(acked)
        acked.clear()
        self._acked_index[tp].clear()
        return top + 1

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        """No spans are kept: the offset to commit does not need them (module doc)."""

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


class WorkerApp(faust.App):
    """A Faust app whose consumer reads committed records only (see the module doc)."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)
