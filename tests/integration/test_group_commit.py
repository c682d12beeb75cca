"""Group commit of queued commands (ADR-0030): `FanoutApplication.grouped` runs commands as if
one after another and writes their events in one event-store transaction.

The reference is the same commands run one by one on a second application with the same
clock: every outcome (accepted with its seq, refused with its code, a duplicate), every
event in the log (in the same order, at the same positions) and every position answered must
be the same, whatever the commands (sends by members and strangers, retries of a
client_msg_id, sends over the rate gates, a member leaving mid-group) and however they are
cut into groups. A refused command in the middle of a group drops the aggregates it touched
from the cache; a later command of the group then reloads one behind the group's staged
events, the group's transaction fails on the version, and the group runs again alone: that
path is part of what is compared."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import FanoutError
from domain.params import Parameters
from fanout.application import FanoutApplication
from fanout.clock import FakeClock
from fanout.units import outcome

T = "acme"
CONVERSATIONS = {"c0": ["m0", "m1", "m2", "m3"], "c1": ["m0", "m1", "m2", "m3"], "c2": ["m0", "m1"]}
SENDERS = ["m0", "m1", "m2", "m3", "stranger"]

Op = tuple[str, ...]


def make(env: dict[str, str]) -> tuple[FanoutApplication, FakeClock]:
    clock = FakeClock()
    # activity refreshes of MARK_READ stay pending (no flush within a test) and ride with the
    # next command on their conversation, which may then be refused after changing it
    app = FanoutApplication(Parameters(), dict(env), clock=clock, activity_flush_interval=3600.0)
    for cid, members in CONVERSATIONS.items():
        app.create_conversation(T, cid, cid, members)
    return app, clock


def call(app: FanoutApplication, op: Op) -> Callable[[], Any]:
    if op[0] == "leave":
        return partial(app.remove_member, T, op[1], op[2])
    if op[0] == "read":
        return partial(app.mark_read, T, op[1], op[2], int(op[3]))
    _, cid, sender, key = op
    return partial(app.send_message, T, cid, sender=sender, text=f"{sender} in {cid}", client_msg_id=key or None)


def shown(outcome: tuple[Any, BaseException | None]) -> Any:
    result, exc = outcome
    if exc is not None:
        assert isinstance(exc, FanoutError), repr(exc)
        return ("refused", exc.code)
    return {k: v for k, v in result.items() if k not in ("message_id", "position")}


def log_of(app: FanoutApplication) -> list[tuple[Any, ...]]:
    out = []
    for n in app.recorder.select_notifications(start=0, limit=100_000):
        event = app.mapper.to_domain_event(n)
        fields = {k: v for k, v in vars(event).items() if k not in ("timestamp", "message_id")}
        out.append((n.id, n.originator_id, n.originator_version, n.topic, sorted(fields.items(), key=str)))
    return out


ops = st.one_of(
    st.tuples(
        st.just("send"),
        st.sampled_from(sorted(CONVERSATIONS)),
        st.sampled_from(SENDERS),
        st.sampled_from(["", "k0", "k1"]),
    ),
    st.tuples(st.just("leave"), st.sampled_from(sorted(CONVERSATIONS)), st.sampled_from(["m1", "m3"])),
    st.tuples(
        st.just("read"), st.sampled_from(sorted(CONVERSATIONS)), st.sampled_from(SENDERS), st.sampled_from("0123")
    ),
)


def compare(env_grouped: dict[str, str], env_alone: dict[str, str], rounds: list[list[Op]]) -> FanoutApplication:
    grouped, g_clock = make(env_grouped)
    alone, a_clock = make(env_alone)
    try:
        for ops_ in rounds:
            g_out = grouped.grouped([call(grouped, op) for op in ops_])
            a_out, wrote = [], []
            for op in ops_:
                before = alone.log_position()
                a_out.append(outcome(call(alone, op)))
                wrote.append(alone.log_position() > before)
            assert [shown(o) for o in g_out] == [shown(o) for o in a_out], ops_
            for (g, _), (a, _), w in zip(g_out, a_out, wrote, strict=True):
                if g is None:
                    continue
                if w:  # its own last event: the same position
                    assert g["position"] == a["position"], ops_
                else:  # it wrote nothing: the log position once the group is written
                    assert g["position"] >= a["position"], ops_
            g_clock.advance(1.0)
            a_clock.advance(1.0)
        assert log_of(grouped) == log_of(alone)
        return grouped
    finally:
        grouped.close()
        alone.close()


POPO = {"PERSISTENCE_MODULE": "eventsourcing.popo"}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(ops, min_size=1, max_size=12), min_size=1, max_size=5))
def test_a_group_writes_what_the_same_commands_one_by_one_write(rounds: list[list[Op]]) -> None:
    compare(POPO, POPO, rounds)


def sqlite(path: Path) -> dict[str, str]:
    return {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}


def test_a_group_is_one_transaction_and_a_refusal_writes_nothing(tmp_path: Path) -> None:
    sends = [
        ("send", "c0", "m0", ""),
        ("send", "c1", "m1", ""),
        ("send", "c2", "stranger", ""),
        ("send", "c2", "m0", ""),
    ]
    rounds = [[op for op in sends]]
    app = compare(sqlite(tmp_path / "g.sqlite"), sqlite(tmp_path / "a.sqlite"), rounds)
    assert (app.group_commits, app.grouped_commands, app.group_fallbacks) == (1, 3, 0)


def test_a_refused_send_that_changed_nothing_leaves_the_group_whole(tmp_path: Path) -> None:
    """m0 sends to c0, then again at once (over the per-sender gate: refused before it changed
    anything), then m1 sends to c0 on the staged copy: one transaction."""
    rounds = [[("send", "c0", "m0", ""), ("send", "c0", "m0", ""), ("send", "c0", "m1", "")]]
    app = compare(sqlite(tmp_path / "g.sqlite"), sqlite(tmp_path / "a.sqlite"), rounds)
    assert (app.group_commits, app.group_fallbacks) == (1, 0)


def test_a_refused_send_that_changed_a_staged_conversation_has_the_staged_sends_written_first(tmp_path: Path) -> None:
    """m0's send to c0 is staged; m3's read leaves an activity refresh pending on c0; m0's
    second send records that refresh on the staged c0, then is refused by the per-sender
    gate: the staged send is written first (the refused change is dropped with c0 from the
    cache), and m1's send reloads c0 as written: two transactions, the same outcomes and
    log as one by one."""
    rounds = [[("send", "c0", "m0", ""), ("read", "c0", "m3", "0"), ("send", "c0", "m0", ""), ("send", "c0", "m1", "")]]
    app = compare(sqlite(tmp_path / "g.sqlite"), sqlite(tmp_path / "a.sqlite"), rounds)
    assert (app.group_commits, app.group_fallbacks) == (2, 0)


def test_a_group_that_loses_a_race_to_another_writer_runs_alone_and_loses_nothing(tmp_path: Path) -> None:
    """Two applications on one SQLite event store: the other one sends to c0 behind this one's
    cached copy; this one's group fails on c0's version and its sends run again alone (the
    send to c0 on c0 as the other left it)."""
    env = sqlite(tmp_path / "shared.sqlite")
    app, _ = make(env)
    other = FanoutApplication(Parameters(), dict(env), clock=FakeClock())
    try:
        app.send_message(T, "c0", sender="m0", text="cached")
        other.send_message(T, "c0", sender="m1", text="behind the cache")
        out = app.grouped([call(app, ("send", "c1", "m0", "")), call(app, ("send", "c0", "m2", ""))])
        assert [shown(o)["conversation_seq"] for o in out] == [1, 3]
        assert app.group_fallbacks == 1  # and c0 was dropped from the cache: the send alone loads it fresh
        seqs = [e[4] for e in log_of(app) if e[3].endswith("MessageSent")]
        assert len(seqs) == 4
    finally:
        other.close()
        app.close()
