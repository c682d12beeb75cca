"""OffsetGaps answers as the intervaltree.IntervalTree Faust's consumer would keep (streams/
read_committed.py): random gaps, in offset order and not, merged, looked up and chopped the way
`Consumer._add_gap` and `Consumer._new_offset` use them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from intervaltree import IntervalTree

from streams.read_committed import OffsetGaps


def spans(tree: IntervalTree | OffsetGaps) -> list[tuple[int, int]]:
    return sorted((iv.begin, iv.end) for iv in tree)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 60), st.integers(1, 8)),
        st.tuples(st.just("overlap"), st.integers(0, 70), st.integers(0, 20)),
        st.tuples(st.just("chop"), st.integers(0, 70), st.integers(0, 20)),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(ops)
def test_same_answers_as_the_interval_tree(program: list[tuple[str, int, int]]) -> None:
    tree, gaps = IntervalTree(), OffsetGaps()
    for op, a, n in program:
        if op == "add":
            tree.addi(a, a + n)
            tree.merge_overlaps()
            gaps.addi(a, a + n)
            gaps.merge_overlaps()
        elif op == "overlap":
            assert sorted((s.begin, s.end) for s in gaps.overlap(a, a + n)) == sorted(
                (iv.begin, iv.end) for iv in tree.overlap(a, a + n)
            )
        else:
            tree.chop(a, a + n)
            gaps.chop(a, a + n)
        assert spans(gaps) == spans(tree)
        assert bool(gaps) == bool(tree)


def test_gaps_in_offset_order_append() -> None:
    """A relay's commit markers: one gap after each transaction; touching spans stay apart."""
    gaps = OffsetGaps()
    for begin in range(1, 10_000, 3):
        gaps.addi(begin, begin + 1)
    assert len(gaps) == 3_333
    gaps.addi(4, 5)  # again: nothing new
    assert len(gaps) == 3_333
    gaps.chop(0, 5_000)
    assert spans(gaps)[0] == (5_002, 5_003)


def test_a_null_gap_is_refused_as_the_tree_refuses_it() -> None:
    import pytest

    with pytest.raises(ValueError):
        IntervalTree().addi(3, 3)
    with pytest.raises(ValueError):
        OffsetGaps().addi(3, 3)
