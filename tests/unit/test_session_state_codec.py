"""The login's narrow read of a state row (adapters/cassandra/writer.py `session_state`, from the
columns SESSION_STATE_COLUMNS as a tuple) gives the SessionState the whole row gives: the
stored row as written (`state_cells`), read back the long way (`state_row`,
`UserConversationState.from_row`, `SessionState.of`) and the short way, for any state; and
the login's copy of it in one cell (session_states.py, ADR-0043) says the same."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.cassandra.session_states import session_cell, session_of_cell
from adapters.cassandra.writer import SESSION_STATE_COLUMNS, session_state, state_cells, state_row
from projections.rows import STATE_COLUMNS
from projections.state import SessionState, UserConversationState

seqs = st.integers(min_value=0, max_value=2**40)
states = st.builds(
    UserConversationState,
    read_conversation_seq=seqs,
    joined_seq=seqs,
    last_active=st.floats(min_value=0, max_value=2e9, allow_nan=False),
    delivered_conversation_seq=st.none() | seqs,
    skipping=st.booleans(),
    gap_end=st.none() | seqs,
    rebuilt_seq=seqs,
    mention_seqs=st.lists(seqs, max_size=12),
    broadcast_base=seqs,
)


@given(states)
def test_the_narrow_read_gives_the_session_state_of_the_whole_row(state: UserConversationState) -> None:
    stored = dict(zip(STATE_COLUMNS, state_cells(state), strict=True))
    long_way = SessionState.of(UserConversationState.from_row(state_row(stored)))
    assert session_state(tuple(stored[c] for c in SESSION_STATE_COLUMNS)) == long_way
    assert long_way == SessionState.of(state)


@given(states)
def test_the_login_copy_cell_gives_the_session_state_of_the_whole_row(state: UserConversationState) -> None:
    """ADR-0043: the copy's one cell (session_states.py) reads back as the SessionState of
    the row it was written with, whichever way the writer made it: from a state (a gap
    update) or from the row's stored cells (a put)."""
    want = SessionState.of(state)
    assert session_of_cell(session_cell(want)) == want
    stored = state_cells(state)
    from_cells = session_state([stored[STATE_COLUMNS.index(c)] for c in SESSION_STATE_COLUMNS])
    assert session_cell(from_cells) == session_cell(want)


@given(st.binary(max_size=80))
def test_a_cell_this_code_did_not_write_is_refused(cell: bytes) -> None:
    """Not a version-1 cell of the right length: a clear ValueError, never a wrong count."""
    if len(cell) == len(session_cell(SessionState(0, None, False, None, 0, 0, 0))) and cell[:1] == b"\x01":
        assert isinstance(session_of_cell(cell), SessionState)
        return
    with pytest.raises(ValueError, match="session_states cell"):
        session_of_cell(cell)
