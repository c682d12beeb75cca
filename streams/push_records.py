"""A record of the pushes topic (streams/pushes.py): a `Delivered` as JSON, the positions a
commit left in the views (`ViewsTracked`, kind "tracked"), a worker's heartbeat (kind "beat",
streams/heartbeats.py), each with the format version FORMAT; and the tenant header a push
carries, which a replica reads without decoding the record (`tenant_of`)."""

from __future__ import annotations

import json
from typing import Any

from projections.delivery import Delivered
from projections.hosting import ViewsTracked
from streams.heartbeats import BEAT_KIND, FORMAT, WorkerBeat, decode_beat

TENANT_HEADER = "tenant"  # a push record's tenant, readable without decoding the record
MAX_PUSH_BYTES = 32 * 1024 * 1024  # a 100k-member push with the member lists, with room to spare


def encode(d: Delivered) -> bytes:
    """A Delivered as JSON: plain data only (the members per shard, the materialized set
    sorted, or null for every member)."""
    body = {
        "v": FORMAT,
        "tenant": d.tenant,
        "conversation_id": d.conversation_id,
        "seq": d.seq,
        "message": d.message,
        "materialized": None if d.materialized is None else sorted(d.materialized),
        "members_by_shard": {str(shard): members for shard, members in d.members_by_shard.items()},
        "mailbox_shards": d.mailbox_shards,
    }
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def encode_tracked(t: ViewsTracked) -> bytes:
    body = {
        "v": FORMAT,
        "kind": "tracked",
        "positions": {str(p): pos for p, pos in t.positions.items()},
        "since": {str(p): pos for p, pos in t.since.items()},
        "heads": [list(key) for key in t.heads],
    }
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def decode(value: bytes) -> Delivered | WorkerBeat | ViewsTracked:
    """The Delivered, WorkerBeat or ViewsTracked a record of the pushes topic holds;
    ValueError for anything else."""
    try:
        body = json.loads(value)
        if body.get("v") != FORMAT:
            raise ValueError(f"push record format {body.get('v')!r}, expected {FORMAT}")
        if body.get("kind") == "tracked":
            return ViewsTracked(
                {int(p): int(pos) for p, pos in body["positions"].items()},
                {int(p): int(pos) for p, pos in body.get("since", {}).items()},  # absent: a worker before ADR-0035
                tuple((str(t), str(c)) for t, c in body.get("heads", ())),
            )
        if body.get("kind") == BEAT_KIND:
            return decode_beat(body)
        materialized = body["materialized"]
        return Delivered(
            tenant=str(body["tenant"]),
            conversation_id=str(body["conversation_id"]),
            seq=int(body["seq"]),
            message=dict(body["message"]),
            materialized=None if materialized is None else frozenset(str(u) for u in materialized),
            members_by_shard={int(k): [str(u) for u in v] for k, v in body["members_by_shard"].items()},
            mailbox_shards=int(body["mailbox_shards"]),
        )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a push record: {exc}") from None


def tenant_of(msg: Any) -> str | None:
    """The tenant header of a push record; None for a record without one (a heartbeat, the
    positions a commit left, a push of a worker before the header)."""
    for name, value in msg.headers() or ():
        if name == TENANT_HEADER and value is not None:
            try:
                return bytes(value).decode()
            except UnicodeDecodeError:
                return None
    return None
