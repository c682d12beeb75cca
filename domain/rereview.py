"""ADR-0003's re-review conditions, the ones a metric can see (ADR-0026).

Pure: every reading, and the clock, is passed in. `read` turns the measures into one
`Reading` per watched condition (red, green, or unknown without data); `advance` turns a
memo and the readings into the new memo and the conditions that turned red: each opens
ONE review per episode (like T1/T2, ADR-0020), an episode ending once it is green again.

Watched: (1) T1 or T2 firing for `rereview_hold` (7 days) without a break; (4) the mailbox
layer's unit cost (time of the mailbox store's write per mailbox entry) above 3 x the
initial estimate; (7) the large bucket's mean alpha above `rereview_alpha_large_max` (0.5).
The conditions no metric can see are `CHECKLIST`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.params import Parameters

UNIT_COST_FACTOR = 3.0  # condition 4: "more than 3x the initial estimate"
MIN_COST_ENTRIES = 1_000  # condition 4 is judged only over at least this many entries

# condition number -> the review trigger it opens (domain.review.WATCH_TRIGGERS)
TRIGGER_OF = {1: "rereview_1", 4: "rereview_4", 7: "rereview_7"}

TITLES = {
    1: "T1 or T2 holds for 7 consecutive days",
    4: "the mailbox layer's unit cost above 3x the initial estimate",
    7: "alpha far from the assumption (large bucket mean alpha above 0.5)",
}

# The conditions no metric can see: where each would be decided (ADR-0003 re-review conditions).
CHECKLIST = (
    {"condition": 2, "text": "the group member limit is raised (e.g. 100,000 -> 500,000)",
     "where": "FANOUT_MAX_GROUP_MEMBERS: a settings change, reviewed with the capacity plan"},
    {"condition": 3, "text": "the per_conversation_msg_rate tiers are raised",
     "where": "FANOUT_PER_CONVERSATION_MSG_RATE: a settings change; it moves the platform fan-out bound"},
    {"condition": 5, "text": "end-to-end encryption is enabled for big groups",
     "where": "a product decision: previews and mention_type leave the server; re-check the minimal change set"},
    {"condition": 6, "text": "MailboxStore moves to an in-house implementation and its write cost falls sharply",
     "where": "an ADR replacing ADR-0004 (the mailbox store)"},
    {"condition": 8, "text": "mention_only proposed as the default above some size",
     "where": "the product promise itself: reopen ADR-0003, never a configuration change"},
)  # fmt: skip


@dataclass(frozen=True)
class Reading:
    condition: int
    state: str  # "red", "green" or "unknown" (no data yet)
    value: float | None  # what was measured
    limit: float | None  # red above it
    details: dict[str, Any]

    @property
    def red(self) -> bool:
        return self.state == "red"

    def as_dict(self) -> dict[str, Any]:
        return {
            "condition": self.condition,
            "title": TITLES[self.condition],
            "state": self.state,
            "value": self.value,
            "limit": self.limit,
            "details": self.details,
        }


@dataclass(frozen=True)
class Measures:
    """What the watch reads at one moment."""

    now: float
    firing: dict[str, bool]  # T1 / T2 firing now (the capacity window's flags)
    mailbox_write_seconds: float | None  # time in the mailbox store's write, None: not measured here
    mailbox_entries: int  # entries those writes stored
    large_alpha_mean: float | None  # mean alpha over the large bucket's conversations, None: none
    large_conversations: int


def holding_since(memo: dict[str, Any], firing: dict[str, bool], now: float) -> dict[str, float]:
    """When each trigger started firing without a break (absent: not firing now)."""
    before = {k: float(v) for k, v in memo.get("since", {}).items()}
    return {t: before.get(t, now) for t in ("T1", "T2") if firing.get(t)}


def read(params: Parameters, memo: dict[str, Any], m: Measures) -> list[Reading]:
    """The three watched conditions at `m.now`, given the memo of the last evaluation."""
    since = holding_since(memo, m.firing, m.now)
    held = {t: m.now - s for t, s in since.items()}
    longest = max(held.values(), default=0.0)
    one = Reading(
        1,
        "red" if since and longest >= params.rereview_hold else "green",
        longest,
        params.rereview_hold,
        {"holding_since": since, "held_s": held, "hold_s": params.rereview_hold, "firing": dict(m.firing)},
    )
    estimate = params.mailbox_unit_cost_estimate_us
    if m.mailbox_write_seconds is None or m.mailbox_entries < MIN_COST_ENTRIES:
        unit_cost = None
        four_state = "unknown"
    else:
        unit_cost = m.mailbox_write_seconds * 1e6 / m.mailbox_entries
        four_state = "red" if unit_cost > UNIT_COST_FACTOR * estimate else "green"
    four = Reading(
        4,
        four_state,
        unit_cost,
        UNIT_COST_FACTOR * estimate,
        {
            "unit_cost_us": unit_cost,
            "estimate_us": estimate,
            "factor": UNIT_COST_FACTOR,
            "entries_measured": m.mailbox_entries,
            "min_entries": MIN_COST_ENTRIES,
            "measured_here": m.mailbox_write_seconds is not None,
        },
    )
    seven = Reading(
        7,
        "unknown"
        if m.large_alpha_mean is None
        else ("red" if m.large_alpha_mean > params.rereview_alpha_max else "green"),
        m.large_alpha_mean,
        params.rereview_alpha_max,
        {"size_bucket": "large", "conversations": m.large_conversations},
    )
    return [one, four, seven]


def advance(memo: dict[str, Any], readings: list[Reading], now: float) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """(the new memo, [(condition, episode)] that turned red now). A condition red at the
    previous evaluation does not open another review until it has been green (or unknown)."""
    red_before: dict[str, bool] = {str(k): bool(v) for k, v in memo.get("red", {}).items()}
    episodes: dict[str, int] = {str(k): int(v) for k, v in memo.get("episodes", {}).items()}
    firing = readings[0].details.get("firing", {}) if readings else {}
    turned: list[tuple[int, int]] = []
    red: dict[str, bool] = {}
    for r in readings:
        key = str(r.condition)
        red[key] = r.red
        if r.red and not red_before.get(key):
            episodes[key] = episodes.get(key, 0) + 1
            turned.append((r.condition, episodes[key]))
    return {"since": holding_since(memo, firing, now), "red": red, "episodes": episodes}, turned
