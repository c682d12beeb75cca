"""fanout's client half: the client rule of docs/PROTOCOL.md (no undetectable gap), state
stores, the service API and the `fanout-client` command."""

from fanout_client.client import NotCaughtUp, UserClient
from fanout_client.core import SyncCore
from fanout_client.errors import (
    ApiError,
    AuthenticationFailed,
    Conflict,
    FanoutClientError,
    Forbidden,
    InvalidRequest,
    NotAMember,
    NotFound,
    ProtocolViolation,
    RetriesExhausted,
    StateMismatch,
)
from fanout_client.ranges import RangeSet
from fanout_client.service import ServiceClient
from fanout_client.state import ClientState, ConversationState
from fanout_client.stores import MemoryStore, SqliteStore, StateStore

__all__ = [
    "ApiError",
    "AuthenticationFailed",
    "ClientState",
    "Conflict",
    "ConversationState",
    "FanoutClientError",
    "Forbidden",
    "InvalidRequest",
    "MemoryStore",
    "NotAMember",
    "NotCaughtUp",
    "NotFound",
    "ProtocolViolation",
    "RangeSet",
    "RetriesExhausted",
    "ServiceClient",
    "SqliteStore",
    "StateMismatch",
    "StateStore",
    "SyncCore",
    "UserClient",
]
