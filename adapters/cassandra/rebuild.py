"""The Cassandra side of `fanout rebuild` and `fanout verify` (the AsideBuilds port, with
keyspaces where the SQLite side has file prefixes): views built aside in another keyspace
of the same cluster are compared with the live keyspace, or merged into it.

Cassandra renames neither tables nor keyspaces, and the readers (API replicas, workers)
name the live keyspace in FANOUT_VIEWS. So the switch is a MERGE, table by table, into the
live tables (docs/adr/0016-rebuild-on-cassandra.md): every row of the rebuilt table that
is missing or different in the live one is upserted (the runtime facts of a live row
carried over), then every live row the rebuilt table lacks is deleted. A reader sees each
row either as it was or as rebuilt, never a table emptied first. The tool runs it with the
workers stopped (nothing else writes the views), and checks the live tracking positions
did not move before it starts (StaleAside).

Comparison and merge stream both tables in token order (a full scan of a table comes back
in token order, then clustering order within a partition, and both keyspaces share the
cluster's partitioner): rows are grouped by token and the groups merged, so memory holds
one partition at a time (a 100k-member group's state partition at most), not a table.

The tables and their keys are read from system_schema: this module knows which tables each
part writes (TARGET_TABLES, beside their DDL in schema.py) and which columns are runtime facts
(projections/rows.py), nothing else; the composition root hands it the live views' session
and how to open views in another keyspace. A name built aside is the keyspace
`<live keyspace>_<name>` (cut to Cassandra's 48 characters)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement, SimpleStatement

from adapters.cassandra.connect import run
from adapters.cassandra.errors import cassandra_boundary
from adapters.cassandra.schema import TARGET_TABLES
from adapters.cassandra.session_states import vouch
from adapters.cassandra.stamps import RANK_REBUILD, stamp
from projections.ports import AsideProgress, StaleAside, StoreDiff, Swapped, ViewStore
from projections.rows import DELIVERY_RUNTIME

TABLES: tuple[str, ...] = (
    *TARGET_TABLES["heads"][:5],
    *TARGET_TABLES["state"],
    *TARGET_TABLES["heads"][5:],
    *TARGET_TABLES["mailbox"],
)

# Runtime facts, not derived from the log: ignored by verify, carried over by a merge.
# (delivery: when and to how many online devices the message was first pushed; reviews:
# the write stamp that orders a tenant's reviews.)
RUNTIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "delivery": DELIVERY_RUNTIME,
    "reviews": ("written",),
    "reviews_by_tenant": ("written",),
}
TRACKED = "delivery"  # the projection whose positions say how far the views are
FETCH = 5000  # rows per page of a scan
IN_FLIGHT = 100  # writes in the air during a merge
TIMEOUT = 300.0

KEYSPACE_LENGTH = 48  # Cassandra's longest keyspace name


@dataclass(frozen=True)
class Table:
    name: str
    keys: tuple[str, ...]  # partition key then clustering columns, in order
    partition: tuple[str, ...]
    values: tuple[str, ...]  # regular columns, sorted
    runtime: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.keys, *self.values)

    @property
    def compared(self) -> tuple[str, ...]:
        return tuple(c for c in self.values if c not in self.runtime)


@cassandra_boundary  # the driver's errors raised as the port errors (errors.py)
class CassandraAsideBuilds:
    """Views built aside in another keyspace, compared with or merged into the live one."""

    tables: tuple[str, ...] = TABLES

    def __init__(self, session: Session, keyspace: str, open_views: Callable[[str], ViewStore]) -> None:
        self.session = session
        self.keyspace = keyspace  # the live keyspace (FANOUT_VIEWS)
        self._open_views = open_views  # keyspace -> its views (tables created), on the same cluster
        self._tables: dict[str, Table] = {}

    def tables_of(self, targets: frozenset[str]) -> list[str]:
        """The tables the writes of `targets` go to (the mailbox table too)."""
        return [t for t in TABLES if any(t in TARGET_TABLES[p] for p in targets)]

    # -- keyspaces -----------------------------------------------------------------------

    def keyspace_of(self, name: str) -> str:
        suffix = f"_{name}"
        return f"{self.keyspace[: KEYSPACE_LENGTH - len(suffix)]}{suffix}"

    def open(self, name: str) -> ViewStore:
        self.remove(name)  # a crashed run's leftovers
        return self._open_views(self.keyspace_of(name))

    def remove(self, name: str) -> None:
        """Drop a keyspace built aside (nothing if there is none); never the live one."""
        keyspace = self.keyspace_of(name)
        if keyspace == self.keyspace:
            raise ValueError(f"{keyspace} is the live keyspace")
        self.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=TIMEOUT)

    def positions(self, name: str | None = None) -> dict[tuple[str, int], int]:
        """(projection, partition) -> position tracked in a keyspace (default: the live one)."""
        keyspace = self.keyspace if name is None else self.keyspace_of(name)
        rows = self.session.execute(f"SELECT projection, partition, position FROM {keyspace}.tracking", timeout=TIMEOUT)
        return {(r["projection"], int(r["partition"])): int(r["position"]) for r in rows}

    def close(self) -> None:
        """Nothing to release: the live views (and their session) are the caller's."""

    # -- compare ---------------------------------------------------------------------------

    def diff(self, name: str, limit: int, progress: AsideProgress | None = None) -> StoreDiff:
        """Compare every table of the live keyspace with the rebuilt keyspace's (runtime
        facts left out); positions: the delivery projection's views' position in each."""
        live_pos = self.positions()
        new_pos = self.positions(name)
        rebuilt = self.keyspace_of(name)
        result = StoreDiff(positions=(_low(live_pos), _low(new_pos)), rows={})
        for name in self.tables:
            table = self._table(name)
            only_live: list[tuple[Any, ...]] = []
            only_new: list[tuple[Any, ...]] = []
            counts = [0, 0]
            total = 0
            for live, new in self._merge(table, rebuilt, progress):
                if live is not None:
                    total += 1
                if live is not None and new is not None and _same(table, live, new):
                    continue
                for side, row, bucket in ((0, live, only_live), (1, new, only_new)):
                    if row is not None:
                        counts[side] += 1
                        if len(bucket) < limit:
                            bucket.append(_shown(table, row))
            result.rows[name] = total
            if counts[0] or counts[1]:
                result.differences[name] = (only_live, only_new)
                result.counts[name] = (counts[0], counts[1])
        return result

    # -- switch ----------------------------------------------------------------------------

    def swap(
        self,
        name: str,
        targets: frozenset[str],
        expect: dict[tuple[str, int], int],
        progress: AsideProgress | None = None,
    ) -> dict[str, Swapped]:
        """Merge the tables of `targets` built aside into the live ones: upserts of the rows
        missing or different (the live runtime facts carried over), then deletes of the
        live rows the rebuild lacks. StaleAside, with nothing written, if the live tracking
        positions are not `expect` (the views moved since the build started)."""
        if self.positions() != expect:
            raise StaleAside("the live views moved during the rebuild (a worker ran?); nothing was switched")
        # Every merged write is stamped just above position P (the one position the views stand
        # at): it replaces what the units up to P wrote and loses to any unit after P, so a
        # worker started during the merge is never overwritten (adapters/cassandra/stamps.py).
        ts = stamp(max(expect.values(), default=0), RANK_REBUILD)
        rebuilt = self.keyspace_of(name)
        out: dict[str, Swapped] = {}
        for table_name in self.tables_of(targets):
            table = self._table(table_name)
            insert = self._insert(table)
            delete = self._delete(table)
            rows = upserted = 0
            upserts: list[tuple[PreparedStatement, tuple[Any, ...]]] = []
            deletes: list[tuple[PreparedStatement, tuple[Any, ...]]] = []
            for live, new in self._merge(table, rebuilt, progress):
                if new is None:
                    deletes.append((delete, (ts, *(live[k] for k in table.keys))))  # type: ignore[index]
                    continue
                rows += 1
                if live is not None and _same(table, live, new):
                    continue
                row = dict(new)
                if live is not None:
                    row.update({c: live[c] for c in table.runtime})
                upserts.append((insert, (*(_bound(row[c]) for c in table.columns), ts)))
                if len(upserts) >= FETCH:
                    run(self.session, upserts, IN_FLIGHT)
                    upserted += len(upserts)
                    upserts = []
            run(self.session, upserts, IN_FLIGHT)
            run(self.session, deletes, IN_FLIGHT)
            out[table_name] = Swapped(rows=rows, upserted=upserted + len(upserts), deleted=len(deletes))
        if "session_states" in out:  # merged after user_states: the login's copy mirrors it (ADR-0043)
            vouch(self.session, self.keyspace)
        return out

    # -- the streaming merge -------------------------------------------------------------

    def _merge(
        self, table: Table, rebuilt: str, progress: AsideProgress | None
    ) -> Iterator[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
        """(live row, rebuilt row) pairs by primary key, None on the side that lacks it."""
        seen = 0

        def counted(groups: Iterator[tuple[int, list[dict[str, Any]]]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
            nonlocal seen
            for token, rows in groups:
                seen += len(rows)
                if progress is not None:
                    progress(table.name, seen)
                yield token, rows

        a_it = counted(self._groups(table, self.keyspace))
        b_it = self._groups(table, rebuilt)
        a, b = next(a_it, None), next(b_it, None)
        while a is not None or b is not None:
            if b is None or (a is not None and a[0] < b[0]):
                assert a is not None
                yield from ((r, None) for r in a[1])
                a = next(a_it, None)
            elif a is None or b[0] < a[0]:
                yield from ((None, r) for r in b[1])
                b = next(b_it, None)
            else:
                live = {_key(table, r): r for r in a[1]}
                new = {_key(table, r): r for r in b[1]}
                for k in sorted(live.keys() | new.keys(), key=repr):
                    yield live.get(k), new.get(k)
                a, b = next(a_it, None), next(b_it, None)

    def _groups(self, table: Table, keyspace: str) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """The rows of a table in token order, grouped by token (one partition, or the
        rare partitions that share a token)."""
        stmt = SimpleStatement(
            f"SELECT token({', '.join(table.partition)}) AS fanout_token, {', '.join(table.columns)} "
            f"FROM {keyspace}.{table.name}",
            fetch_size=FETCH,
        )
        token: int | None = None
        group: list[dict[str, Any]] = []
        for row in self.session.execute(stmt, timeout=TIMEOUT):
            t = int(row.pop("fanout_token"))
            if t != token and group:
                assert token is not None
                yield token, group
                group = []
            token = t
            group.append(row)
        if group:
            assert token is not None
            yield token, group

    def _table(self, name: str) -> Table:
        if name not in self._tables:
            rows = list(
                self.session.execute(
                    "SELECT column_name, kind, position FROM system_schema.columns "
                    "WHERE keyspace_name=%s AND table_name=%s",
                    (self.keyspace, name),
                )
            )
            if not rows:
                raise LookupError(f"no table {self.keyspace}.{name}")
            part = tuple(
                r["column_name"] for r in sorted(rows, key=lambda r: r["position"]) if r["kind"] == "partition_key"
            )
            clust = tuple(
                r["column_name"] for r in sorted(rows, key=lambda r: r["position"]) if r["kind"] == "clustering"
            )
            values = tuple(sorted(r["column_name"] for r in rows if r["kind"] == "regular"))
            self._tables[name] = Table(name, (*part, *clust), part, values, RUNTIME_COLUMNS.get(name, ()))
        return self._tables[name]

    def _insert(self, table: Table) -> PreparedStatement:
        cols = table.columns
        return self.session.prepare(
            f"INSERT INTO {self.keyspace}.{table.name} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
            "USING TIMESTAMP ?"
        )

    def _delete(self, table: Table) -> PreparedStatement:
        where = " AND ".join(f"{k}=?" for k in table.keys)
        return self.session.prepare(f"DELETE FROM {self.keyspace}.{table.name} USING TIMESTAMP ? WHERE {where}")


def _low(positions: dict[tuple[str, int], int]) -> int:
    tracked = [p for (name, _), p in positions.items() if name == TRACKED]
    return min(tracked) if tracked else 0


def _norm(v: Any) -> Any:
    if isinstance(v, dict) or hasattr(v, "items"):
        return tuple(sorted((k, _norm(x)) for k, x in v.items()))
    if isinstance(v, list | tuple | set | frozenset):
        return tuple(_norm(x) for x in v)
    return v


def _bound(v: Any) -> Any:
    """A value read back, as a prepared statement binds it (a map as a plain dict)."""
    return dict(v.items()) if hasattr(v, "items") else v


def _key(table: Table, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in table.keys)


def _same(table: Table, a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(_norm(a[c]) == _norm(b[c]) for c in table.compared)


def _shown(table: Table, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(_norm(row[c]) for c in (*table.keys, *table.compared))
