"""One user's flood of MARK_READ / REBUILD on the real runtime (fake clock): the log gets
at most burst + rate x T of them (ADR-0009), and MARK_READs that change nothing write
nothing at all, even with the user's bucket empty."""

from __future__ import annotations

import pytest

from domain.conversation import READ_ACTIVITY_REFRESH
from domain.errors import RateLimited
from domain.params import Parameters

T = "acme"


def attempt(command, *args):  # noqa: ANN001, ANN201
    try:
        return command(*args)
    except RateLimited:
        return None


def test_a_flood_of_user_commands_writes_at_most_burst_plus_rate_times_t(make_harness, clock) -> None:  # noqa: ANN001
    p = Parameters()
    h = make_harness(p)
    h.app.create_conversation(T, "c", "", ["ann", "bob"])
    h.app.send_message(T, "c", sender="ann", text="one")
    h.settle()
    start = h.log_top()
    accepted = 0
    for _step in range(40):  # 40 rounds of 100 commands, 0.1 s apart: T = 4 s
        for i in range(100):
            command = h.app.request_rebuild if i % 2 else h.app.mark_read
            args = (T, "c", "bob") if i % 2 else (T, "c", "bob", 1)  # never coalesced: not settled
            if attempt(command, *args) is not None:
                accepted += 1
        clock.advance(0.1)
    bound = p.per_user_command_burst + p.per_user_command_rate.per_second * 4.0
    assert h.log_top() - start <= accepted <= bound + 1  # +1: the float edge of the last refill
    assert accepted >= p.per_user_command_burst  # the gate does not refuse a legitimate burst


def test_mark_reads_that_change_nothing_write_nothing_and_are_not_charged(make_harness, clock) -> None:  # noqa: ANN001
    p = Parameters()
    h = make_harness(p)
    h.app.create_conversation(T, "c", "", ["ann", "bob"])
    h.app.send_message(T, "c", sender="ann", text="one")
    first = h.app.mark_read(T, "c", "bob", 1)
    assert first["coalesced"] is False
    h.settle()
    for _ in range(int(p.per_user_command_burst) - 1):
        h.app.request_rebuild(T, "c", "bob")  # the bucket is empty now
    h.settle()
    top = h.log_top()
    for read_seq in (0, 1) * 50:
        again = h.app.mark_read(T, "c", "bob", read_seq)
        assert again == {"conversation_id": "c", "read_seq": 1, "coalesced": True, "position": top}
    assert h.log_top() == top
    with pytest.raises(RateLimited):
        h.app.request_rebuild(T, "c", "bob")
    # Activity older than the refresh share of the window is news again (alpha counts it).
    clock.advance(p.activity_window * READ_ACTIVITY_REFRESH + 1)
    refreshed = h.app.mark_read(T, "c", "bob", 1)
    # The read seq did not move: nothing for bob's read stream; the activity refresh is
    # group-committed (ADR-0018): one Conversation.MembersActive once flushed.
    assert refreshed["coalesced"] is False and refreshed["position"] == top
    assert h.app.flush_activity() == 1
    assert h.log_top() == top + 1
    assert h.app.conversation(T, "c").members["bob"] == clock.now
