"""Cassandra: the views and the mailbox of the distributed runtime (one session for both,
connect.py), their keyspace and tables (schema.py), rebuild/verify (rebuild.py) and the
write stamps that fence a stale writer (stamps.py). ADR-0014, ADR-0016, ADR-0021."""
