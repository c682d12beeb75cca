"""The SDK's typed models against the two descriptions of the wire: the JSON examples of
docs/PROTOCOL.md (themselves checked against a real server by tests/e2e/test_protocol_doc.py)
and the OpenAPI the running server serves. A field added, removed or renamed on either side
fails here, with the model and the field named."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from fanout_client import models
from pydantic import BaseModel

from tests.clients.conftest import ServeProcess
from tests.e2e.test_protocol_doc import doc_examples

# PROTOCOL example -> the SDK model of it, and the models of its nested objects by key.
FROM_DOC: dict[str, type[BaseModel]] = {
    "frame AUTH": models.AuthRequest,
    "frame MARK_READ": models.MarkReadRequest,
    "frame PULL_HISTORY": models.PullHistoryRequest,
    "frame REBUILD": models.RebuildRequest,
    "frame AUTH_OK": models.AuthOkFrame,
    "frame SESSION_LIST_BATCH": models.SessionListBatchFrame,
    "frame MESSAGE": models.MessageFrame,
    "frame HEAD": models.HeadFrame,
    "frame READ_OK": models.ReadOkFrame,
    "frame HISTORY": models.HistoryFrame,
    "frame REBUILD_OK": models.RebuildOkFrame,
    "frame ERROR": models.ErrorFrame,
    "http send": models.SendResult,
    "http send batch": models.BatchResult,
    "http head": models.ConversationHead,
    "http sessions": models.Sessions,
    "http mailbox": models.MailboxPage,
    "http error": models.ErrorBody,
}
NESTED: dict[tuple[type[BaseModel], str], type[BaseModel]] = {
    (models.SessionListBatchFrame, "sessions"): models.Session,
    (models.SessionListBatchFrame, "big_group_heads"): models.BigGroupHead,
    (models.Sessions, "sessions"): models.Session,
    (models.Sessions, "big_group_heads"): models.BigGroupHead,
    (models.HistoryFrame, "messages"): models.Message,
    (models.MailboxPage, "entries"): models.MailboxEntry,
}
OPTIONAL = {(models.Session, "delivered_conversation_seq")}  # PROTOCOL: present only with a gap flag
# OpenAPI component -> SDK model (the server documents these frames and bodies by schema).
FROM_OPENAPI: dict[str, type[BaseModel]] = {
    "AuthFrame": models.AuthRequest,
    "MarkReadFrame": models.MarkReadRequest,
    "PullHistoryFrame": models.PullHistoryRequest,
    "RebuildFrame": models.RebuildRequest,
    "AuthOkFrame": models.AuthOkFrame,
    "SessionListBatchFrame": models.SessionListBatchFrame,
    "MessageFrame": models.MessageFrame,
    "HeadFrame": models.HeadFrame,
    "ReadOkFrame": models.ReadOkFrame,
    "HistoryFrame": models.HistoryFrame,
    "RebuildOkFrame": models.RebuildOkFrame,
    "ErrorFrame": models.ErrorFrame,
    "ErrorBody": models.ErrorBody,
    "SendResult": models.SendResult,
    "BatchSent": models.BatchSent,
    "BatchRefused": models.BatchRefused,
    "BatchResult": models.BatchResult,
}


def mismatches(model: type[BaseModel], example: dict[str, Any], where: str) -> list[str]:
    fields = set(model.model_fields)
    required = {n for n, f in model.model_fields.items() if f.is_required() or (model, n) not in OPTIONAL}
    problems = [f"{where}: the server sends {k!r}, {model.__name__} lacks it" for k in sorted(set(example) - fields)]
    problems += [f"{where}: {model.__name__}.{k} is not in the example" for k in sorted(required - set(example))]
    for key, value in example.items():
        inner = NESTED.get((model, key))
        if inner is not None:
            for i, item in enumerate(value):
                problems += mismatches(inner, item, f"{where}.{key}[{i}]")
    return problems


def test_every_protocol_example_has_exactly_the_fields_of_its_sdk_model_and_parses() -> None:
    examples = doc_examples()
    assert set(FROM_DOC) <= set(examples), f"examples the SDK expects are gone: {set(FROM_DOC) - set(examples)}"
    problems: list[str] = []
    for name, model in FROM_DOC.items():
        example = examples[name]
        problems += mismatches(model, example, name)
        model.model_validate({**example, "token": example.get("token", "t")} if name == "frame AUTH" else example)
    assert not problems, "\n".join(problems)
    assert {n for n in examples if n.startswith("frame ")} == {n for n in FROM_DOC if n.startswith("frame ")}, (
        "a frame of PROTOCOL.md has no SDK model"
    )


def test_every_frame_and_body_of_the_servers_openapi_matches_its_sdk_model(served: ServeProcess) -> None:
    with urllib.request.urlopen(f"{served.url}/v1/openapi.json", timeout=10) as resp:
        schemas = json.load(resp)["components"]["schemas"]
    problems: list[str] = []
    for name, model in FROM_OPENAPI.items():
        assert name in schemas, f"the server's OpenAPI has no {name} any more"
        properties, required = set(schemas[name].get("properties", {})), set(schemas[name].get("required", []))
        fields = set(model.model_fields)
        problems += [f"{name}.{p}: in the OpenAPI, not in {model.__name__}" for p in sorted(properties - fields)]
        sdk_required = {n for n, f in model.model_fields.items() if f.is_required()}
        problems += [f"{name}.{p}: required by the OpenAPI, optional in the SDK" for p in sorted(required - sdk_required - {"type"})]  # fmt: skip
    frames = {n for n in schemas if n.endswith("Frame")}
    assert frames <= set(FROM_OPENAPI), f"frames of the OpenAPI with no SDK model: {frames - set(FROM_OPENAPI)}"
    assert not problems, "\n".join(problems)
