"""A Faust app whose consumer reads committed records only.

The relay writes the event topic in Kafka transactions; a record of an aborted one must never
be applied. faust-streaming 0.15.3 has no setting for the consumer's isolation level (it reads
committed only with processing_guarantee="exactly_once", which also makes Faust run
transactional producers the workers do not need), so the app's consumer thread sets it on the
aiokafka consumer it creates. `streams/worker.py` builds its app from `WorkerApp`."""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """aiokafka's consumer as Faust builds it, reading committed records only."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # handed to aiokafka's Fetcher at start()
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


class WorkerApp(faust.App):
    """A Faust app whose consumer reads committed records only (see the module doc)."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)
