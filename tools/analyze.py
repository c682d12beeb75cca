"""`fanout analyze alpha|capacity`: what the reviewers of ADR-0003 look at before
deciding enable_mention_only (alpha per size bucket, the enter criterion, N_eq) and
the capacity signals T1/T2.

Reads the views only (no lock: it runs beside `fanout serve`); the RocksDB mailbox
is not opened, since a running server holds its lock and nothing here needs it. On the
distributed runtime (FANOUT_VIEWS=cassandra://...) it reads the Cassandra views, beside
the API replicas and the workers; capacity merges the per-partition windows.

The alpha report itself is fanout/queries.py's `alpha_report_of` (the console serves the
same); the plots are tools/plots.py's."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from domain.params import Parameters, SizeBucket
from fanout.bootstrap import NoStore, capacity_window, open_views_to_read
from fanout.config import EngineUnavailable, Settings
from fanout.queries import alpha_report_of
from projections.ports import ViewStore


class AnalyzeError(RuntimeError):
    pass


def tool_settings(data_dir: Path, params: Parameters, settings: Settings | None) -> Settings:
    """The settings the stores are opened by: the command's, over its data dir (the embedded
    engines over `data_dir` with `params` when none are given)."""
    if settings is None:
        return Settings.embedded(data_dir, params)
    return replace(settings, data_dir=Path(data_dir), params=params)


def open_views(data_dir: Path, settings: Settings | None = None, params: Parameters | None = None) -> ViewStore:
    """The views the settings name, as the composition root opens them for reading beside
    the running processes (the data dir's SQLite views without their mailbox, or the
    Cassandra views of FANOUT_VIEWS)."""
    s = tool_settings(data_dir, params or (settings.params if settings else Parameters()), settings)
    try:
        return open_views_to_read(s)
    except NoStore as exc:
        raise AnalyzeError(f"{exc}; run `fanout serve` or `fanout rebuild all` first") from None
    except EngineUnavailable as exc:
        raise AnalyzeError(str(exc)) from None


def alpha_report(
    data_dir: Path,
    params: Parameters,
    *,
    tenant: str | None = None,
    min_saving: float | None = None,
    max_active_ratio: float | None = None,
    now: float | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """fanout/queries.py `alpha_report_of` over the data dir's views (or the Cassandra
    views the settings name), opened and closed here."""
    if (min_saving is None) != (max_active_ratio is None):
        raise AnalyzeError("give both --min-saving and --max-active-ratio, or neither (then each tier's are used)")
    views = open_views(data_dir, settings, params)
    try:
        return alpha_report_of(
            views, params, tenant=tenant, min_saving=min_saving, max_active_ratio=max_active_ratio, now=now
        )
    finally:
        views.close()


COLUMNS = (
    ("size_bucket", "bucket"),
    ("conversations", "convs"),
    ("members", "members"),
    ("alpha_mean", "alpha mean"),
    ("alpha_p50", "p50"),
    ("alpha_p90", "p90"),
    ("min_saving", "min_saving"),
    ("max_active_ratio", "max_ratio"),
    ("meet_enter", "meet enter"),
    ("saving_meeting", "saving N(1-a)"),
    ("n_eq_at_mean_alpha", "N_eq@mean"),
)


def _cell(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if key.startswith("alpha"):
        return f"{v:.4f}"
    if key == "max_active_ratio":
        return f"{v:g}"
    if isinstance(v, float):
        return "inf" if v == float("inf") else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_alpha(report: dict[str, Any], out: TextIO) -> None:
    cells = [[_cell(k, r[k]) for k, _ in COLUMNS] for r in report["buckets"]]
    heads = [h for _, h in COLUMNS]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(report["at"]))
    print(f"alpha per size bucket at {at} UTC" + (f", tenant {report['tenant']}" if report["tenant"] else ""), file=out)
    print("  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True)), file=out)
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths, strict=True)), file=out)
    sources = {r["size_bucket"]: r["terms"] for r in report["buckets"] if r["terms"]}
    if sources:
        print("review parameters: " + ", ".join(f"{b}: {s}" for b, s in sources.items()), file=out)
    else:
        print("review parameters: none (no review decided them; give --min-saving and --max-active-ratio)", file=out)
    print(
        "meet enter: N x (1 - alpha) > min_saving and alpha < max_ratio (ADR supplement 1); "
        "saving: total over those; N_eq = min_saving / (1 - mean alpha)",
        file=out,
    )


def capacity_report(data_dir: Path, params: Parameters, settings: Settings | None = None) -> dict[str, Any]:
    """The capacity window: the one state of the embedded runtime, or on the distributed
    one the states of every log partition (`capacity`, `capacity.p<N>`) merged, with the
    firing flags of the monitor that evaluates them (ADR-0020)."""
    views = open_views(data_dir, settings, params)
    try:
        cap = capacity_window(tool_settings(data_dir, params, settings), views)
    finally:
        views.close()
    rates = cap.rates()
    limits = cap.limits()
    t1_limit, t2_limit = limits["T1"], limits["T2"]
    last = cap.last_at
    return {
        "window_s": params.capacity_window,
        "last_event_at": last,
        "fanout_entries_per_sec": rates["fanout_entries_per_sec"],
        "platform_fanout_budget": params.platform_fanout_budget,
        "budget_use": rates["fanout_entries_per_sec"] / params.platform_fanout_budget,
        "large_group_entries_per_sec": rates["large_group_entries_per_sec"],
        "mailbox_write_budget": params.mailbox_write_budget,
        "T1": {
            "limit": t1_limit,
            "over": rates["fanout_entries_per_sec"] > t1_limit,
            "firing": bool(cap.firing.get("T1")),
        },
        "T2": {
            "limit": t2_limit,
            "over": rates["large_group_entries_per_sec"] > t2_limit,
            "firing": bool(cap.firing.get("T2")),
        },
        "entries_total": cap.entries_total,
        "messages_total": cap.messages_total,
        # the window second by second (event time): [second, entries, large-group entries]
        "per_second": [
            [sec, sum(per.values()), sum(n for k, n in per.items() if k.endswith("\x1f" + SizeBucket.LARGE.value))]
            for sec, per in cap.slots
        ],
    }


def print_capacity(r: dict[str, Any], out: TextIO) -> None:
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["last_event_at"])) + " UTC" if r["last_event_at"] else "-"
    print(f"capacity over the last {r['window_s']:g}s of event time (last send {at})", file=out)
    print(
        f"  fanout entries/s        {r['fanout_entries_per_sec']:>12,.1f}  of budget {r['platform_fanout_budget']:,.0f}"
        f" ({r['budget_use']:.1%})",
        file=out,
    )
    print(
        f"  large-group entries/s   {r['large_group_entries_per_sec']:>12,.1f}  of mailbox write budget "
        f"{r['mailbox_write_budget']:,.0f}",
        file=out,
    )
    for t, what in (("T1", "fanout entries/s"), ("T2", "large-group mailbox writes/s")):
        s = r[t]
        state = "FIRING (review opened)" if s["firing"] else ("over" if s["over"] else "ok")
        print(f"  {t}: {what} > {s['limit']:,.0f}: {state}", file=out)
    print(f"  totals: {r['messages_total']:,} messages, {r['entries_total']:,} mailbox entries", file=out)
    print("  T1/T2 only open a review; they never switch a policy (ADR decision 3)", file=out)
