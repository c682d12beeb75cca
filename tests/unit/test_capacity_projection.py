"""CapacityProjection alone: MessageSent events from a real application (POPO event
store) over an event-time window; the ReviewTrigger effects and the state it saves."""

from __future__ import annotations

import dataclasses

from domain.conversation import Conversation
from domain.params import Parameters
from projections.capacity import CapacityProjection, ReviewTrigger
from projections.delivery import DeliveryProjection
from tests.unit.projection_log import ProjectionLog

T = "acme"
# T1 = 0.7 x 10 = 7 entries/s over a 10 s window: 3 members, one message a second, is 3/s.
PARAMS = dataclasses.replace(Parameters(), capacity_window=10.0, platform_fanout_budget=10.0, mailbox_write_budget=1e9)


def send_each_second(log: ProjectionLog, seconds: int, groups: list[str]) -> None:
    for _ in range(seconds):
        log.clock.advance(1.0)
        for g in groups:
            log.app.send_message(T, g, sender="a", text="x")
        log.clock.advance(3.0)  # the per-sender gate (1 per 3 s); the window is event time


def test_a_sustained_rate_over_t1_yields_one_trigger_while_it_lasts() -> None:
    log = ProjectionLog(PARAMS)
    p = CapacityProjection(PARAMS, log.views)
    groups = [f"g{i}" for i in range(12)]
    for g in groups:
        log.app.create_conversation(T, g, g, ["a", "b", "c"])
    send_each_second(log, 5, groups)  # 36 entries per 4 s: 9/s, over 7/s for a whole window
    effects = log.apply(p)
    assert [type(e) for e in effects] == [ReviewTrigger]
    (t,) = effects
    assert (t.trigger, t.tenant, t.size_bucket) == ("T1", T, "small")
    assert t.details["limit"] == 7.0 and t.details["rate"] > 7.0
    assert log.apply(p) == []  # no new events: nothing
    send_each_second(log, 2, groups)  # still over: firing already, no second trigger
    assert log.apply(p) == []
    saved = log.views.capacity_state(CapacityProjection.name)
    assert saved is not None and saved["firing"]["T1"] is True and saved["messages_total"] == 12 * 7


def test_a_replayed_message_is_not_counted_twice() -> None:
    log = ProjectionLog(PARAMS)
    log.app.create_conversation(T, "g", "g", ["a", "b"])
    log.app.send_message(T, "g", sender="a", text="x")
    events = log.events()
    log.apply(CapacityProjection(PARAMS, log.views), events)
    # A host restarted from the saved state gets the same events again (at-least-once).
    again = CapacityProjection(PARAMS, log.views)
    log.apply(again, events)
    saved = log.views.capacity_state(CapacityProjection.name)
    assert saved is not None and saved["entries_total"] == 2 and saved["messages_total"] == 1
    assert again.rates()["fanout_entries_per_sec"] == 2 / PARAMS.capacity_window


def test_the_tenant_of_a_message_comes_from_the_views_when_its_creation_is_not_in_the_unit() -> None:
    log = ProjectionLog(PARAMS)
    log.app.create_conversation(T, "g", "g", ["a", "b"])
    log.apply(DeliveryProjection(log.views, PARAMS))  # the head (and its aggregate id) is in the views
    log.app.send_message(T, "g", sender="a", text="x")
    p = CapacityProjection(PARAMS, log.views)
    sent = [(pos, e) for pos, e in log.events() if isinstance(e, Conversation.MessageSent)]
    assert p.missing(sent[0][1])
    log.apply(p, sent)
    assert p.per_scope == {f"{T}\x1fsmall": 2}
