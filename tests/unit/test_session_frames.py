"""How a login's sessions are cut into SESSION_LIST_BATCH frames (fanout/queries.py `_framed`):
a first screen of `first` sessions, then frames of `size`, whatever parts the store reads them
in; only the last frame says `last`, and a frame goes out only once it is known not to be the
last (one more session read), so `last` is never wrong."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fanout.queries import FIRST_SESSION_BATCH, SESSION_BATCH, Queries, _framed
from tests.host_log import PARAMS, LogBuilder


@given(
    parts=st.lists(st.lists(st.integers(), max_size=12), max_size=8),
    first=st.integers(1, 9),
    size=st.integers(1, 9),
)
def test_frames_hold_first_then_size_sessions_in_order_and_only_the_last_says_last(
    parts: list[list[int]], first: int, size: int
) -> None:
    frames = list(_framed(iter(parts), first, size))
    everything = [x for part in parts for x in part]
    assert [x for frame, _ in frames for x in frame] == everything  # type: ignore[misc]
    assert [last for _, last in frames] == [False] * (len(frames) - 1) + [True]
    sizes = [len(frame) for frame, _ in frames]
    if not everything:
        assert sizes == [0]  # one empty frame: the client learns the list is empty
        return
    assert 0 not in sizes
    expected = [first, *[size] * len(sizes)][: len(sizes)]
    assert sizes[:-1] == expected[:-1] and 0 < sizes[-1] <= expected[-1]


def test_a_frame_goes_out_as_soon_as_one_more_session_is_read() -> None:
    """Lazy: the first frame is yielded before the store's later parts are read."""
    read: list[int] = []

    def parts():  # type: ignore[no-untyped-def]
        for i in range(5):
            read.append(i)
            yield list(range(i * 10, i * 10 + 10))

    frames = _framed(parts(), 3, 20)
    assert next(frames) == ([0, 1, 2], False) and read == [0]


def test_a_login_sends_a_first_screen_then_full_frames() -> None:
    """A user in 730 conversations: frames of 100 (the first screen), 500, then 130."""
    b = LogBuilder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    try:
        for i in range(FIRST_SESSION_BATCH + SESSION_BATCH + 130):
            b.app.create_conversation("acme", f"c{i}", "", ["u", "v"])
        b.settle()
        frames = list(Queries(b.views, PARAMS).session_batches("acme", "u"))
    finally:
        b.close()
    assert [(len(f["sessions"]), f["last"]) for f in frames] == [
        (FIRST_SESSION_BATCH, False),
        (SESSION_BATCH, False),
        (130, True),
    ]
