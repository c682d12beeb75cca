"""Parameters of ADR-0003 (SPEC section 3). Plain values; reading them from the
environment is the job of `fanout.config`, not of the domain."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SizeBucket(StrEnum):
    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"


class WritePolicy(StrEnum):
    ALWAYS = "always"
    MENTION_ONLY = "mention_only"


DAY = 86_400.0


@dataclass(frozen=True)
class Rate:
    """`count` events per `per_seconds` seconds, e.g. 1 msg / 3 s."""

    count: float
    per_seconds: float

    @property
    def per_second(self) -> float:
        return self.count / self.per_seconds


@dataclass(frozen=True)
class Parameters:
    max_group_members: int = 100_000
    small_max_members: int = 1_000
    medium_max_members: int = 10_000
    # per_conversation_msg_rate by size bucket (ADR decision 6): 20 / 5 / 2 msg/s
    rate_small: float = 20.0
    rate_medium: float = 5.0
    rate_large: float = 2.0
    per_sender_in_conversation_rate: Rate = Rate(1, 3.0)
    # tenant_fanout_quota: a token bucket of mailbox entries per tenant
    tenant_fanout_quota_capacity: float = 2_000_000.0
    tenant_fanout_quota_refill_per_sec: float = 400_000.0
    # T1 / T2 inputs
    platform_fanout_budget: float = 400_000.0  # entries/s
    t1_ratio: float = 0.7
    mailbox_write_budget: float = 400_000.0  # entries/s of the mailbox layer
    t2_ratio: float = 0.5
    capacity_window: float = 60.0  # "sustained" = over this whole window, seconds
    activity_window: float = 7 * DAY
    policy_switch_exit_ratio: float = 0.8
    policy_switch_min_interval: float = DAY
    mailbox_shards: int = 16
    max_text_length: int = 4_000
    max_bulk_members: int = 100_000
    # user commands (MARK_READ, REBUILD) per (tenant, user): an in-process flood guard (ADR-0009)
    per_user_command_rate: Rate = Rate(5, 1.0)
    per_user_command_burst: float = 10.0
    # how long a read with min_position waits for the projector before UNAVAILABLE
    fresh_read_timeout: float = 5.0
    # overload (ADR-0010), operational bounds rather than ADR-0003 parameters:
    # writes are refused with UNAVAILABLE while the projector is behind by more than these
    max_projection_lag_events: int = 50_000
    max_projection_lag_entries: int = 10_000_000
    # open WebSockets; more are answered ERROR{UNAVAILABLE} and closed (1013)
    max_connections: int = 10_000
    # seconds an API replica's clock may differ from the event store's before it refuses the
    # writes it stamps (ADR-0041; 0 turns the check off: replicas sharing a test's fake clock)
    max_clock_skew: float = 300.0
    # ADR-0003's re-review conditions watched (ADR-0026): (1) T1 or T2 firing this long without
    # a break; (4) the initial estimate of the mailbox layer's unit cost, microseconds of the
    # mailbox store's write per entry (1 / mailbox_write_budget: 400k entries/s -> 2.5 us);
    # (7) the large bucket's mean alpha above this is "far from the assumption"
    rereview_hold: float = 7 * DAY
    mailbox_unit_cost_estimate_us: float = 2.5
    rereview_alpha_max: float = 0.5

    def size_bucket(self, member_count: int) -> SizeBucket:
        if member_count <= self.small_max_members:
            return SizeBucket.SMALL
        if member_count <= self.medium_max_members:
            return SizeBucket.MEDIUM
        return SizeBucket.LARGE

    def conversation_rate(self, bucket: SizeBucket) -> float:
        return {
            SizeBucket.SMALL: self.rate_small,
            SizeBucket.MEDIUM: self.rate_medium,
            SizeBucket.LARGE: self.rate_large,
        }[bucket]
