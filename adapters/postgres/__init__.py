"""PostgreSQL: the distributed runtime's event store, eventsourcing's PostgreSQL recorders
with their tables created under an advisory lock and their insert sent in binary
(event_store.py, ADR-0022, ADR-0037), and its opening checked in one line (connect.py)."""
