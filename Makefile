# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint typecheck bench serve clean browser \
	install-distributed engines-up engines-down engines-check test-engine-restarts test-on-engines \
	cluster-up cluster-down test-cluster

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev,distributed]'
	$(BIN)/pip install --quiet -e clients/python  # the Python SDK, fanout-client (tests/clients)
	touch $(STAMP)

install: $(STAMP)

# The distributed runtime's clients (confluent-kafka, faust, scylla-driver, eventsourcing[postgres],
# testcontainers): a separate install, not needed by `make test` / `make demo`.
DIST_STAMP := $(VENV)/.installed-distributed
$(DIST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[distributed]'
	touch $(DIST_STAMP)

install-distributed: $(DIST_STAMP)

# Real engines on loopback without Docker (docs/ENGINES.md, ADR-0011): Kafka and Cassandra jars
# from Maven Central, PostgreSQL from the OS packages. Settings: FANOUT_ENGINES_DIR (data, pids,
# logs, engines.env; default /tmp/fanout-engines), FANOUT_ENGINES_CACHE (jars, Maven repo).
engines-up:
	infra/engines/up.sh

engines-down:
	infra/engines/down.sh

# Three Cassandra 5.0 nodes and three Kafka 4.4 brokers on 127.0.0.2-127.0.0.4 plus a PostgreSQL of
# their own (infra/cluster/, ADR-0027); URLs in $(FANOUT_CLUSTER_DIR)/cluster.env (/tmp/fanout-cluster).
cluster-up: $(DIST_STAMP)
	PY=$(BIN)/python infra/cluster/up.sh

cluster-down:
	infra/cluster/down.sh

# The node-loss tests on the three-node cluster (tests/cluster/): up, the tests, down (always).
# FANOUT_CRASH_MEMBERS: the group's size (10,000 here; ADR-0027 says why not 100,000).
# CLUSTER_RUNS: runs of each scenario (3 for people who change the cluster code; .ci/run: 1).
CLUSTER_RUNS ?= 3
test-cluster: $(DIST_STAMP)
	PY=$(BIN)/python infra/cluster/up.sh
	FANOUT_CRASH_MEMBERS=$${FANOUT_CRASH_MEMBERS:-10000} FANOUT_CRASH_RUNS=$(CLUSTER_RUNS) \
	  $(BIN)/python -m pytest -m cluster -s tests/cluster; \
	  status=$$?; infra/cluster/down.sh; exit $$status

# up, smoke checks with the real clients, timings and RSS, down (always)
engines-check: $(DIST_STAMP)
	PY=$(BIN)/python infra/engines/check.sh

demo: $(STAMP)
	$(BIN)/fanout demo --data-dir ./data/demo --force

serve: $(STAMP)
	$(BIN)/fanout serve

# Debian's chromium for the reviewer console's browser tests, installed with apt-get where it is
# missing (as infra/engines/postgres-up.sh installs PostgreSQL); the tests fail loudly without it.
browser:
	infra/browser/chromium-up.sh

# The whole suite on one set of engines (started here when they are down, stopped after:
# infra/testcontainers/engines.py run): first everything but the tests that restart or kill a
# shared engine, on TEST_WORKERS pytest processes (pytest-xdist; each test has namespaces of its
# own on the engines), then those alone (ADR-0058). Both parts run; the target fails if either did.
TEST_WORKERS ?= 3
test: $(STAMP) browser
	$(BIN)/python infra/testcontainers/engines.py run -- $(MAKE) --no-print-directory test-on-engines

test-on-engines:
	@status=0; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=20 -m "not engine_restart" || status=1; \
	$(BIN)/python -m pytest --durations=10 -m engine_restart || status=1; \
	exit $$status

# The tests that restart or kill Kafka and Cassandra, alone (`make test` runs them after the rest).
test-engine-restarts: $(STAMP)
	$(BIN)/python -m pytest -m engine_restart

# Everything that needs neither engines nor a browser: no Java, PostgreSQL or Chromium (tests/conftest.py).
test-fast: $(STAMP)
	FANOUT_TESTS_WITHOUT_ENGINES=1 $(BIN)/python -m pytest -m "not engines and not browser"

lint: $(STAMP)
	$(BIN)/ruff check domain projections adapters streams fanout tools api cli tests bench clients

typecheck: $(STAMP)
	$(BIN)/mypy

# The headline table of docs/PERFORMANCE.md, both runtimes in one run (bench/headline.py: the
# engines of engines.env when they answer, else started and stopped; sized for under 20 minutes on 2
# cores). `$(BIN)/python bench/headline.py --quick` is a smoke run of the same benches.
bench: $(STAMP)
	$(BIN)/python bench/headline.py

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
