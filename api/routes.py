"""The route table (SPEC section 6), apart from the views."""

from __future__ import annotations

from aiohttp import web

from api import console, views
from api.openapi import openapi_json
from api.ws import websocket


def setup_routes(app: web.Application) -> None:
    r = app.router
    # operations (no token)
    r.add_get("/healthz", views.healthz, allow_head=False)
    r.add_get("/readyz", views.readyz, allow_head=False)
    r.add_get("/metrics", views.metrics, allow_head=False)
    r.add_get("/v1/openapi.json", openapi_json, allow_head=False)
    # service role (admin too)
    r.add_post("/v1/conversations", views.create_conversation)
    r.add_get("/v1/conversations/{cid}", views.get_conversation, allow_head=False)
    r.add_post("/v1/conversations/{cid}/members", views.add_members)
    r.add_delete("/v1/conversations/{cid}/members/{uid}", views.remove_member)
    r.add_post("/v1/conversations/{cid}/messages", views.send_message)
    r.add_post("/v1/messages/batch", views.send_batch)
    r.add_get("/v1/conversations/{cid}/messages/{seq}/delivery", views.get_delivery, allow_head=False)
    # admin role
    r.add_post("/v1/admin/reviews", views.open_review)
    r.add_get("/v1/admin/reviews", views.list_reviews, allow_head=False)
    r.add_get("/v1/admin/reviews/{review_id}", views.get_review, allow_head=False)
    r.add_post("/v1/admin/reviews/{review_id}/decision", views.decide_review)
    r.add_get("/v1/admin/tiers", views.list_tiers, allow_head=False)
    r.add_post("/v1/admin/tiers/{size_bucket}/rollback", views.roll_back_tier)
    r.add_get("/v1/admin/capacity", views.get_capacity, allow_head=False)
    r.add_get("/v1/admin/projections", views.get_projections, allow_head=False)
    r.add_get("/v1/admin/reviews/{review_id}/preview", views.preview_review, allow_head=False)
    r.add_get("/v1/admin/alpha", views.get_alpha, allow_head=False)
    r.add_get("/v1/admin/rereview", views.get_rereview, allow_head=False)
    r.add_get("/v1/admin/tiers/history", views.tier_history, allow_head=False)
    # the reviewer console: static files; it calls the admin routes above with the token it asks for
    r.add_get("/console", console.console_redirect, allow_head=False)
    r.add_get("/console/", console.console_page, allow_head=False)
    r.add_get("/console/{asset}", console.console_asset, allow_head=False)
    # user role (acts as the token's sub)
    r.add_get("/v1/me/sessions", views.my_sessions, allow_head=False)
    r.add_get("/v1/me/mailbox", views.my_mailbox, allow_head=False)
    r.add_post("/v1/me/conversations/{cid}/read", views.mark_read)
    r.add_get("/v1/me/conversations/{cid}/messages", views.my_history, allow_head=False)
    r.add_post("/v1/me/conversations/{cid}/rebuild", views.my_rebuild)
    r.add_get("/v1/ws", websocket, allow_head=False)
