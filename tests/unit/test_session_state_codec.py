"""The login's narrow read of a state row (adapters/cassandra/writer.py `session_state`, from the
columns SESSION_STATE_COLUMNS as a tuple) gives the SessionState the whole row gives: the
stored row as written (`state_cells`), read back the long way (`state_row`,
`UserConversationState.from_row`, `SessionState.of`) and the short way, for any state."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

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
