"""RocksDB: the embedded runtime's mailbox (mailbox.py, ADR-0004)."""
