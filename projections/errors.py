"""The port errors of storage (ADR-0010): how every store says that it failed, whatever
its engine. Each adapter translates its driver's errors into them at its boundary
(`storage_boundary`, with a translation of its own: `adapters/sqlite/errors.py`,
`adapters/rocksdb/mailbox.py`, `adapters/cassandra/errors.py`, `adapters/postgres/connect.py`),
so the layers above match these types and never a driver's name or message:
the API answers 503 with `reason` (fanout/overload.py), the projection hosts say why
they retry (streams/embedded.py, streams/worker.py), `fanout` says in one line that it
cannot use its data dir (cli/main.py)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

C = TypeVar("C", bound=type)


class StorageError(Exception):
    """The store failed the request for a reason of its own (its files, its engine), not
    because the request was wrong; the message is the engine's. `reason` is the 503 reason
    a write refused for it is answered with; None: no condition to wait out (e.g. a
    database file another process holds locked, or not a database at all)."""

    reason: str | None = None


class StorageFull(StorageError):
    """No space to write: the disk is full, a quota or a file size limit is reached."""

    reason = "storage_full"


class StorageIOError(StorageError):
    """The store's disk failed a read or a write (an I/O error)."""

    reason = "storage_error"


class StorageUnavailable(StorageError):
    """The store did not answer: too few replicas did (quorum lost), a request timed out,
    no node could be reached (ADR-0027). A store on another machine: `fanout` never reads
    it as its data dir's failure."""

    reason = "storage_error"


Translate = Callable[[BaseException], StorageError | None]


def storage_boundary(
    errors: tuple[type[BaseException], ...], translate: Translate, *, also: Iterable[str] = ()
) -> Callable[[C], C]:
    """A class decorator for a store: each of its public methods (inherited ones too) and
    those named in `also` raise `translate(exc)` from a driver's exception `exc` of `errors`
    (the driver's own exception when it returns None: a request the engine rejects is a
    bug to see, not a storage failure). Nothing runs but the call while none is raised: the
    cost is one call per method. A generator method translates what its iteration raises; a
    `contextlib.contextmanager` method (a unit of work) what its block, its commit and its
    rollback raise."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isgeneratorfunction(method):

            @functools.wraps(method)
            def generator(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
                try:
                    return (yield from method(*args, **kwargs))
                except errors as exc:
                    error = translate(exc)
                    if error is None:
                        raise
                    raise error from exc

            return generator
        if inspect.isgeneratorfunction(getattr(method, "__wrapped__", None)):  # @contextmanager

            @functools.wraps(method)
            @contextmanager
            def unit(*args: Any, **kwargs: Any) -> Iterator[Any]:
                try:
                    with method(*args, **kwargs) as value:
                        yield value
                except errors as exc:
                    error = translate(exc)
                    if error is None:
                        raise
                    raise error from exc

            return unit

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except errors as exc:
                error = translate(exc)
                if error is None:
                    raise
                raise error from exc

        return call

    def decorate(cls: C) -> C:
        for name in sorted({n for n in dir(cls) if not n.startswith("_")} | set(also)):
            attribute = inspect.getattr_static(cls, name)
            if inspect.isfunction(attribute) and not getattr(attribute, BOUNDARY, False):
                wrapped = wrap(attribute)
                setattr(wrapped, BOUNDARY, True)
                setattr(cls, name, wrapped)
        return cls

    return decorate


BOUNDARY = "__storage_boundary__"  # set on a method translated already (a subclass of a store)
