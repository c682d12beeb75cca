"""Engine adapters of the ports: one module per technology (SQLite, RocksDB, in-memory;
PostgreSQL, Kafka and Cassandra come with the distributed runtime)."""
