"""`fanout analyze alpha|capacity`: what the reviewers of ADR-0003 look at before
deciding enable_mention_only (alpha per size bucket, the enter criterion, N_eq) and
the capacity signals T1/T2.

Reads the views only (no lock: it runs beside `fanout serve`); the RocksDB mailbox
is not opened, since a running server holds its lock and nothing here needs it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from domain.params import Parameters, SizeBucket
from domain.policy import equivalent_threshold
from domain.tier import Tier
from fanout.queries import Queries
from projections.capacity import CapacityProjection
from projections.sqlite import SqliteViews


class AnalyzeError(RuntimeError):
    pass


class _NoMailbox:
    """The views without the mailbox store (analyze reads heads and states only)."""

    def close(self) -> None:
        pass


def open_views(data_dir: Path) -> SqliteViews:
    if not (Path(data_dir) / "views.sqlite").exists():
        raise AnalyzeError(f"{data_dir} has no views (views.sqlite); run `fanout serve` or `fanout rebuild all` first")
    return SqliteViews(data_dir, mailbox=_NoMailbox())  # type: ignore[arg-type]


@dataclass(frozen=True)
class Terms:
    min_saving: float
    max_active_ratio: float
    source: str  # "given" or "tier <review id>"


def _tier_terms(views: SqliteViews, tenant: str, bucket: str) -> Terms | None:
    row = (
        views.reader()
        .execute("SELECT body FROM tiers WHERE tier_id=?", (str(Tier.create_id(tenant, bucket)),))
        .fetchone()
    )
    if row is None:
        return None
    body = json.loads(row[0])
    if not body.get("enabled"):
        return None
    return Terms(
        float(body["read_diffusion_min_saving"]),
        float(body["read_diffusion_max_active_ratio"]),
        f"tier (review {str(body.get('review_id'))[:8]})",
    )


def alpha_report(
    data_dir: Path,
    params: Parameters,
    *,
    tenant: str | None = None,
    min_saving: float | None = None,
    max_active_ratio: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Per size bucket: conversations, members, alpha mean/p50/p90 and, under the given
    or each tier's review parameters, how many conversations meet the enter criterion,
    their total saving N x (1 - alpha), and N_eq at the bucket's mean alpha."""
    if (min_saving is None) != (max_active_ratio is None):
        raise AnalyzeError("give both --min-saving and --max-active-ratio, or neither (then each tier's are used)")
    now = time.time() if now is None else now
    views = open_views(data_dir)
    try:
        q = Queries(views, params)
        tenants = [tenant] if tenant else sorted({h["tenant"] for h in views.all_heads()})
        given = Terms(min_saving, max_active_ratio, "given") if min_saving is not None else None  # type: ignore[arg-type]
        buckets: dict[str, dict[str, Any]] = {
            b.value: {"bucket": b.value, "conversations": [], "terms": set()} for b in SizeBucket
        }
        for t in tenants:
            per_bucket = q.alpha_by_bucket(t, now=now)
            for bucket, stats in per_bucket.items():
                terms = given or _tier_terms(views, t, bucket)
                for c in stats["per_conversation"]:
                    row = {"tenant": t, **c}
                    if terms is not None:
                        crit = q.criterion(c["members"], c["alpha"], terms.min_saving, terms.max_active_ratio)
                        row.update(meets=crit["meets"], saving=crit["saving"], n_eq=crit["n_eq"])
                        buckets[bucket]["terms"].add(terms)
                    buckets[bucket]["conversations"].append(row)
    finally:
        views.close()
    rows = []
    for bucket, b in buckets.items():
        convs = b["conversations"]
        alphas = sorted(c["alpha"] for c in convs)
        mean = sum(alphas) / len(alphas) if alphas else None
        terms_set: set[Terms] = b["terms"]
        one = next(iter(terms_set)) if len(terms_set) == 1 else None
        meeting = [c for c in convs if c.get("meets")]
        rows.append(
            {
                "size_bucket": bucket,
                "conversations": len(convs),
                "members": sum(c["members"] for c in convs),
                "alpha_mean": mean,
                "alpha_p50": alphas[len(alphas) // 2] if alphas else None,
                "alpha_p90": alphas[min(len(alphas) - 1, int(len(alphas) * 0.9))] if alphas else None,
                "min_saving": one.min_saving if one else None,
                "max_active_ratio": one.max_active_ratio if one else None,
                "terms": one.source if one else ("mixed tiers" if terms_set else None),
                "meet_enter": len(meeting) if terms_set else None,
                "saving_meeting": sum(c["saving"] for c in meeting) if terms_set else None,
                "n_eq_at_mean_alpha": equivalent_threshold(one.min_saving, mean) if one and mean is not None else None,
                "per_conversation": convs,
            }
        )
    return {"at": now, "tenant": tenant, "buckets": rows}


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
        print("review parameters: none (no enabled tier; give --min-saving and --max-active-ratio)", file=out)
    print(
        "meet enter: N x (1 - alpha) > min_saving and alpha < max_ratio (ADR supplement 1); "
        "saving: total over those; N_eq = min_saving / (1 - mean alpha)",
        file=out,
    )


def plot_alpha(report: dict[str, Any], path: Path) -> None:
    """Alpha per conversation by size bucket: a box plot with the points strewn over it,
    and the max_active_ratio line(s)."""
    import random

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = report["buckets"]
    fig, ax = plt.subplots(figsize=(8, 5))
    data = [[c["alpha"] for c in b["per_conversation"]] for b in buckets]
    positions = list(range(1, len(buckets) + 1))
    ax.boxplot([d if d else [float("nan")] for d in data], positions=positions, widths=0.5, showfliers=False)
    rng = random.Random(0)
    for x, d in zip(positions, data, strict=True):
        ax.scatter([x + rng.uniform(-0.18, 0.18) for _ in d], d, s=12, alpha=0.6)
    ax.set_xticks(positions)
    ax.set_xticklabels([f"{b['size_bucket']}\n({b['conversations']} conv.)" for b in buckets])
    ax.set_ylabel("alpha = active members / members")
    ax.set_ylim(-0.02, 1.02)
    drawn = set()
    for b in buckets:
        ratio = b["max_active_ratio"]
        if ratio is not None and ratio not in drawn:
            drawn.add(ratio)
            ax.axhline(ratio, linestyle="--", color="tab:red", linewidth=1)
            ax.annotate(f"max_active_ratio = {ratio:g}", (0.55, ratio), color="tab:red", va="bottom", fontsize=8)
    ax.set_title(
        "alpha per conversation by size bucket" + (f" (tenant {report['tenant']})" if report["tenant"] else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def capacity_report(data_dir: Path, params: Parameters) -> dict[str, Any]:
    views = open_views(data_dir)
    try:
        state = views.capacity_state(CapacityProjection.name)
    finally:
        views.close()
    cap = CapacityProjection(params, state)
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
