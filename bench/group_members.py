"""Who the members of a small-groups bench are (`--users`), one definition for the embedded
bench (small_groups.py) and the distributed one (distributed_small_groups.py), so their runs
of one shape are the same work (docs/PERFORMANCE.md section 29)."""

from __future__ import annotations

import argparse


def add_users_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--users",
        type=int,
        default=0,
        help="the user population the members are drawn from (group g's i-th member is user "
        "(g * members + i) %% users; with users = groups * members every group has members of its "
        "own); 0 (the default): every group has the same members u0..u<members-1>, the shape of "
        "the sections before PERFORMANCE.md section 29",
    )


def member(g: int, i: int, members: int, users: int) -> str:
    """Group g's i-th member."""
    return f"u{(g * members + i) % users}" if users else f"u{i}"
