"""The engine URLs of SPEC section 8, parsed into what each client takes.

* `FANOUT_EVENT_STORE=postgresql://user[:password]@host:port/dbname[?schema=...&pool_size=...]`
  -> eventsourcing's environment for its PostgreSQL recorder;
* `FANOUT_LOG=kafka://host:port[,host:port...][?topic=fanout.events&partitions=6&replication=1
  &min_insync=N]` -> the brokers (Kafka's bootstrap servers) and the event topic's name, partition count,
  replication and `min.insync.replicas` of the topics the processes create (absent: the
  broker's default; a cluster: replication=3&min_insync=2). Producers always use acks=all;
* `FANOUT_VIEWS=cassandra://host[:port][,host...]/keyspace[?replication=1&consistency=LOCAL_ONE
  &datacenter=datacenter1&in_flight=200&compression=lz4&head_cache=200000]` -> contact points, keyspace,
  replication factor, the consistency level of reads and writes (a cluster:
  replication=3&consistency=LOCAL_QUORUM), the requests a unit of work keeps in the air at once
  (ADR-0027), the compression of the native protocol's frames (`lz4`, or `none`: ADR-0032), and
  how many conversation heads an API replica keeps for its logins (0: none; ADR-0035).

A malformed URL stops start-up with a ConfigError naming the setting."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit


class UrlError(ValueError):
    pass


def _query(text: str, known: set[str], name: str) -> dict[str, str]:
    raw = parse_qs(text, keep_blank_values=True)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UrlError(f"{name}: unknown parameter {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return {k: v[-1] for k, v in raw.items()}


def _int(value: str, what: str, name: str, lo: int = 1) -> int:
    try:
        v = int(value)
    except ValueError:
        raise UrlError(f"{name}: {what}={value!r} is not an integer") from None
    if v < lo:
        raise UrlError(f"{name}: {what} must be at least {lo}")
    return v


def _hosts(netloc: str, default_port: int, name: str) -> list[tuple[str, int]]:
    hosts = []
    for part in netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "")
        if not host:
            raise UrlError(f"{name}: a host is missing in {netloc!r}")
        hosts.append((host, _int(port, "port", name) if port else default_port))
    return hosts


# -- PostgreSQL ---------------------------------------------------------------------------


def postgres_env(url: str, name: str = "FANOUT_EVENT_STORE") -> dict[str, str]:
    """eventsourcing's environment for the PostgreSQL recorder at `url`."""
    u = urlsplit(url)
    if u.scheme not in ("postgresql", "postgres"):
        raise UrlError(f"{name}={url!r}: expected postgresql://user@host:port/dbname")
    dbname = unquote(u.path.lstrip("/"))
    if not dbname or not u.hostname:
        raise UrlError(
            f"{name}={url!r}: name the host and the database, e.g. postgresql://postgres@127.0.0.1:5432/fanout"
        )
    q = _query(u.query, {"schema", "pool_size", "max_overflow", "connect_timeout"}, name)
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": dbname,
        "POSTGRES_HOST": u.hostname,
        "POSTGRES_PORT": str(u.port or 5432),
        "POSTGRES_USER": unquote(u.username or "postgres"),
        "POSTGRES_PASSWORD": unquote(u.password or ""),
        "POSTGRES_CONNECT_TIMEOUT": q.get("connect_timeout", "5"),
        "POSTGRES_POOL_SIZE": q.get("pool_size", "5"),
        "POSTGRES_MAX_OVERFLOW": q.get("max_overflow", "10"),
        "POSTGRES_LOCK_TIMEOUT": "5",
    }
    if "schema" in q:
        env["POSTGRES_SCHEMA"] = q["schema"]
    return env


# -- Kafka ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaSettings:
    brokers: str  # host:port,host:port
    topic: str = "fanout.events"
    partitions: int = 6
    replication: int = 1
    min_insync: int = 0  # min.insync.replicas of the topics we create; 0: the broker's default


def kafka_settings(url: str, name: str = "FANOUT_LOG") -> KafkaSettings:
    u = urlsplit(url)
    if u.scheme != "kafka" or not u.netloc:
        raise UrlError(f"{name}={url!r}: expected kafka://host:port[,host:port]")
    q = _query(u.query, {"topic", "partitions", "replication", "min_insync"}, name)
    topic = q.get("topic", "fanout.events")
    if not topic or len(topic) > 200 or not all(c.isalnum() or c in "._-" for c in topic):
        raise UrlError(f"{name}: topic={topic!r} is not a Kafka topic name")
    return KafkaSettings(
        brokers=",".join(f"{h}:{p}" for h, p in _hosts(u.netloc, 9092, name)),
        topic=topic,
        partitions=_int(q.get("partitions", "6"), "partitions", name),
        replication=_int(q.get("replication", "1"), "replication", name),
        min_insync=_min_insync(q, name),
    )


def _min_insync(q: dict[str, str], name: str) -> int:
    if "min_insync" not in q:
        return 0
    v = _int(q["min_insync"], "min_insync", name)
    if v > _int(q.get("replication", "1"), "replication", name):
        raise UrlError(f"{name}: min_insync={v} is more than replication: no write could ever succeed")
    return v


# -- Cassandra ------------------------------------------------------------------------------

CONSISTENCY_LEVELS = ("ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "ALL", "EACH_QUORUM")


@dataclass(frozen=True)
class CassandraSettings:
    hosts: tuple[str, ...]
    port: int
    keyspace: str
    replication: int = 1
    consistency: str = "LOCAL_ONE"
    datacenter: str = "datacenter1"
    in_flight: int = 200  # requests in the air while a unit of work commits (adapters.cassandra.views.IN_FLIGHT)
    compression: str = "lz4"  # of the native protocol's frames: lz4 or none (ADR-0032)
    head_cache: int = 200_000  # heads an API replica keeps for its logins, 0: none (projections/head_cache.py)


COMPRESSIONS = ("lz4", "none")


def cassandra_settings(url: str, name: str = "FANOUT_VIEWS") -> CassandraSettings:
    u = urlsplit(url)
    if u.scheme != "cassandra" or not u.netloc:
        raise UrlError(f"{name}={url!r}: expected cassandra://host:port/keyspace")
    keyspace = u.path.strip("/")
    if not keyspace or not keyspace.replace("_", "a").isalnum() or not keyspace[0].isalpha() or len(keyspace) > 48:
        raise UrlError(
            f"{name}={url!r}: name a keyspace (letters, digits, _; up to 48), e.g. cassandra://127.0.0.1:9042/fanout"
        )
    q = _query(u.query, {"replication", "consistency", "datacenter", "in_flight", "compression", "head_cache"}, name)
    hosts = _hosts(u.netloc, 9042, name)
    if len({p for _, p in hosts}) != 1:
        raise UrlError(f"{name}: every contact point must use the same port")
    consistency = q.get("consistency", "LOCAL_ONE").upper()
    if consistency not in CONSISTENCY_LEVELS:
        raise UrlError(f"{name}: consistency={consistency!r}; one of {', '.join(CONSISTENCY_LEVELS)}")
    compression = q.get("compression", "lz4").lower()
    if compression not in COMPRESSIONS:
        raise UrlError(f"{name}: compression={compression!r}; one of {', '.join(COMPRESSIONS)}")
    return CassandraSettings(
        hosts=tuple(h for h, _ in hosts),
        port=hosts[0][1],
        keyspace=keyspace,
        replication=_int(q.get("replication", "1"), "replication", name),
        consistency=consistency,
        datacenter=q.get("datacenter", "datacenter1"),
        in_flight=_int(q.get("in_flight", "200"), "in_flight", name),
        compression=compression,
        head_cache=_int(q.get("head_cache", "200000"), "head_cache", name, lo=0),
    )
