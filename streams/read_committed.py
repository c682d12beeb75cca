"""A Faust app whose consumer reads committed records only.

The relay writes the event topic in Kafka transactions; a record of an aborted one must never
be applied. faust-streaming 0.15.3 has no setting for the consumer's isolation level (it reads
committed only with processing_guarantee="exactly_once", which also makes Faust run
transactional producers the workers do not need), so the app's consumer thread sets it on the
aiokafka consumer it creates. `streams/worker.py` builds its app from `WorkerApp`.

Reading committed records, the consumer meets a gap in the offsets after every transaction (its
commit marker), and Faust keeps the gaps of a partition until its next offset commit, so that
the committed offset can pass them. Faust keeps them in an `intervaltree.IntervalTree` and
calls `merge_overlaps()` after each one: a rebuild of the whole tree, O(n log n) a gap, which
took about a quarter of a worker's CPU under small-group traffic (one transaction per relay
batch, a marker in every partition it wrote; yappi profile in docs/PERFORMANCE.md section 16).
`OffsetGaps` keeps the same spans in a list, merged as they come: O(1) for a gap that comes in
offset order, as they all do."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import Any, NamedTuple

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """aiokafka's consumer as Faust builds it, reading committed records only."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # handed to aiokafka's Fetcher at start()
        return consumer


class Span(NamedTuple):
    """Offsets begin..end-1 (an `intervaltree.Interval` as Faust reads one: begin, end)."""

    begin: int
    end: int


class OffsetGaps:
    """The gaps of one partition's offsets, with the part of `intervaltree.IntervalTree`'s
    interface that Faust's consumer uses (`addi`, `merge_overlaps`, `overlap`, `chop`, truth),
    and the same answers (tests/unit/test_offset_gaps.py runs both on random operations).
    The spans are kept sorted, disjoint and merged where they overlap (as `merge_overlaps`
    leaves a tree: spans that only touch stay apart)."""

    __slots__ = ("_spans",)

    def __init__(self) -> None:
        self._spans: list[Span] = []

    def __bool__(self) -> bool:
        return bool(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Any:
        return iter(self._spans)

    def addi(self, begin: int, end: int, data: object = None) -> None:
        if begin >= end:
            raise ValueError(f"null gap {begin}..{end}")
        spans = self._spans
        if not spans or spans[-1].end <= begin:
            spans.append(Span(begin, end))  # the usual case: after every span so far
            return
        i = bisect_left(spans, begin, key=lambda s: s.begin)
        if i > 0 and spans[i - 1].end > begin:  # overlaps the span before it
            i -= 1
        j = i
        while j < len(spans) and spans[j].begin < end:  # and those it reaches into
            j += 1
        if i < j:
            begin, end = min(begin, spans[i].begin), max(end, spans[j - 1].end)
        spans[i:j] = [Span(begin, end)]

    def merge_overlaps(self) -> None:
        """Nothing to do: the spans are merged as they are added."""

    def overlap(self, begin: int, end: int) -> list[Span]:
        """The spans that share an offset with begin..end-1 (none for an empty range)."""
        if begin >= end:
            return []
        return [s for s in self._spans if s.begin < end and s.end > begin]

    def chop(self, begin: int, end: int) -> None:
        """Offsets begin..end-1 are no longer gaps (a span across either edge is cut there)."""
        kept: list[Span] = []
        for s in self._spans:
            if s.end <= begin or s.begin >= end:
                kept.append(s)
                continue
            if s.begin < begin:
                kept.append(Span(s.begin, begin))
            if s.end > end:
                kept.append(Span(end, s.end))
        self._spans = kept


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gap = defaultdict(OffsetGaps)  # see the module doc

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


class WorkerApp(faust.App):
    """A Faust app whose consumer reads committed records only (see the module doc)."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)
