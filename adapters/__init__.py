"""Engine adapters of the ports: one package per engine (cassandra/, sqlite/, rocksdb/) and
the in-memory backend (memory.py). Modules of one package may import each other; an
adapter never imports another engine's (tests/unit/test_layering.py)."""
