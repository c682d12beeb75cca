"""The plots of `fanout analyze alpha|capacity --png`: what a reviewer decides on, drawn
with matplotlib (imported when a plot is drawn, not before) from the reports of
tools/analyze.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from domain.params import Parameters
from domain.policy import meets_enter_criterion, read_diffusion_saving
from fanout.queries import Terms
from tools.analyze import AnalyzeError

# Example thresholds for the plot when no review decided any and none were given on the
# command line (the values of the `fanout analyze` help example). The plot says so.
EXAMPLE_TERMS = Terms(20_000.0, 0.05, "EXAMPLE values: no review decided any; give --min-saving/--max-active-ratio")
BUCKET_COLORS = {"small": "tab:blue", "medium": "tab:orange", "large": "tab:purple"}


class PlotError(AnalyzeError):
    pass


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise PlotError(f"cannot write the PNG {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _source(terms: str) -> str:
    return "given on the command line" if terms == "given" else f"from {terms}"


def alpha_plot_data(report: dict[str, Any]) -> dict[str, Any]:
    """What the alpha plot draws: the thresholds (given, a review's, or the example
    values), each conversation with whether it meets the enter criterion and its saving
    N x (1 - alpha), and the totals. Conversations without members are left out."""
    terms = sorted(
        {
            (b["min_saving"], b["max_active_ratio"], _source(b["terms"]))
            for b in report["buckets"]
            if b["min_saving"] is not None
        }
    )
    mixed = [b["size_bucket"] for b in report["buckets"] if b["terms"] == "mixed tiers"]
    example = not terms and not mixed
    if example:
        terms = [(EXAMPLE_TERMS.min_saving, EXAMPLE_TERMS.max_active_ratio, EXAMPLE_TERMS.source)]
    points = []
    for b in report["buckets"]:
        for c in b["per_conversation"]:
            if c["members"] <= 0:
                continue
            n, alpha = c["members"], c["alpha"]
            if example:
                meets = meets_enter_criterion(n, alpha, EXAMPLE_TERMS.min_saving, EXAMPLE_TERMS.max_active_ratio)
            else:
                meets = bool(c.get("meets"))
            points.append({"bucket": b["size_bucket"], "members": n, "alpha": alpha, "meets": meets,
                           "saving": read_diffusion_saving(n, alpha) if meets else 0.0})  # fmt: skip
    return {
        "terms": [{"min_saving": t[0], "max_active_ratio": t[1], "source": t[2]} for t in terms],
        "example": example,
        "mixed_buckets": mixed,
        "points": points,
        "left_out": sum(1 for b in report["buckets"] for c in b["per_conversation"] if c["members"] <= 0),
        "meeting": sum(1 for p in points if p["meets"]),
        "saving": sum(p["saving"] for p in points),
        "entries": sum(p["members"] for p in points),
    }


def plot_alpha(report: dict[str, Any], path: Path, params: Parameters | None = None) -> dict[str, Any]:
    """What a reviewer decides on: each conversation as member count N (x, log) against
    alpha (y, log; alpha = 0 drawn on a floor line), colored by size bucket; the line
    alpha = read_diffusion_max_active_ratio, the curve N x (1 - alpha) = read_diffusion_min_saving
    (N = N_eq(alpha)), the region meeting the enter criterion shaded, and the saving
    (mailbox entries per message avoided) in the legend and title. Returns alpha_plot_data."""
    import math

    plt = _pyplot()
    params = params or Parameters()
    data = alpha_plot_data(report)
    points = data["points"]
    ns = [p["members"] for p in points]
    positive = [p["alpha"] for p in points if p["alpha"] > 0]
    max_ratio = max(t["max_active_ratio"] for t in data["terms"]) if data["terms"] else 1.0
    min_saving_hi = max((t["min_saving"] for t in data["terms"]), default=1.0)
    min_saving_lo = min((t["min_saving"] for t in data["terms"]), default=1.0)
    # alpha = 0 (nobody active) cannot sit on a log axis: draw it on a floor line below
    # every non-zero alpha of the data, and mark it.
    floor = min([*positive, max_ratio]) / 4
    y_lo, y_hi = floor / 2.5, 1.6
    x_lo = max(0.8, min([*ns, min_saving_lo]) / 2.5)
    # the criterion curve's corner (N_eq at alpha = max_active_ratio) stays in view
    n_eq_top = max([min_saving_hi, *(t["min_saving"] / (1 - t["max_active_ratio"]) for t in data["terms"]
                                     if t["max_active_ratio"] < 1)])  # fmt: skip
    x_hi = max([*ns, n_eq_top]) * 4

    fig, ax = plt.subplots(figsize=(13, 7))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)

    styles = ["-", "--", ":"]
    for i, t in enumerate(data["terms"][:3]):
        ms, ratio, ls = t["min_saving"], t["max_active_ratio"], styles[i]
        grid = [
            10 ** (math.log10(y_lo) + k * (math.log10(min(ratio, 0.999)) - math.log10(y_lo)) / 200) for k in range(201)
        ]
        ax.fill_betweenx(grid, [ms / (1 - a) for a in grid], x_hi, color="tab:green", alpha=0.13, linewidth=0,
                         label="meets enter: N(1-alpha) > min_saving and alpha < max_active_ratio" if i == 0 else None)  # fmt: skip
        curve = [10 ** (math.log10(y_lo) + k * (math.log10(0.999) - math.log10(y_lo)) / 400) for k in range(401)]
        ax.plot([ms / (1 - a) for a in curve], curve, color="tab:green", linestyle=ls, linewidth=1.5,
                label=f"N x (1 - alpha) = min_saving = {ms:,.0f}  (N = N_eq(alpha))")  # fmt: skip
        ax.axhline(ratio, color="tab:red", linestyle=ls, linewidth=1.5, label=f"alpha = max_active_ratio = {ratio:g}")

    ax.axhline(floor, color="0.5", linestyle=":", linewidth=1)
    ax.annotate("alpha = 0 (no active member) drawn on this line", (x_lo * 1.1, floor / 1.15), va="top", fontsize=8,
                color="0.35")  # fmt: skip
    for bound in (params.small_max_members, params.medium_max_members):
        if x_lo < bound < x_hi:
            ax.axvline(bound, color="0.85", linewidth=1, zorder=0)
    for bucket in ("small", "medium", "large"):
        mine = [p for p in points if p["bucket"] == bucket]
        if not mine:
            continue
        saving = sum(p["saving"] for p in mine)
        meeting = sum(1 for p in mine if p["meets"])
        color = BUCKET_COLORS[bucket]
        label: str | None = f"{bucket}: {len(mine):,} conv., {meeting:,} meet, saving {saving:,.0f} entries/msg"
        for zero, meets in ((False, False), (False, True), (True, False), (True, True)):
            sel = [p for p in mine if (p["alpha"] == 0) == zero and p["meets"] == meets]
            if sel:
                ax.scatter([p["members"] for p in sel], [p["alpha"] if p["alpha"] > 0 else floor for p in sel],
                           s=44 if meets else 20, marker="v" if zero else "o", color=color,
                           alpha=0.9 if meets else 0.55, edgecolors="black" if meets else "none",
                           linewidths=0.9, label=label)  # fmt: skip
                label = None
    ax.set_xlabel("N = members of the conversation (log)")
    ax.set_ylabel("alpha = active members / members (log)")
    ax.grid(True, which="major", color="0.92")
    total, saving = data["entries"], data["saving"]
    pct = f" ({saving / total:.0%})" if total else ""
    where = f"tenant {report['tenant']}" if report.get("tenant") else "all tenants"
    at = time.strftime("%Y-%m-%d %H:%M", time.gmtime(report["at"]))
    ax.set_title(
        f"Enter criterion of mention_only per conversation ({where}, {at} UTC)"
        + (" with EXAMPLE thresholds" if data["example"] else "")
        + "\n"
        f"{data['meeting']:,} of {len(points):,} conversations meet it. If they switched, one message to each would "
        f"write {saving:,.0f} fewer\nmailbox entries (the sum of N(1-alpha) over them) of the {total:,.0f} one "
        f"message to every conversation writes today{pct}",
        fontsize=10,
    )
    notes = [
        f"thresholds ({t['source']}): read_diffusion_min_saving {t['min_saving']:,.0f}, "
        f"read_diffusion_max_active_ratio {t['max_active_ratio']:g}"
        for t in data["terms"]
    ]
    if data["mixed_buckets"]:
        notes.append(f"{', '.join(data['mixed_buckets'])}: tiers with different parameters (thresholds not drawn)")
    if data["left_out"]:
        notes.append(f"{data['left_out']} conversation(s) without members left out")
    notes.append("black edge: meets the criterion; triangles: alpha = 0; grey verticals: size bucket bounds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.9)
    fig.text(0.01, 0.01, "\n".join(notes), fontsize=9, va="bottom",
             color="tab:red" if data["example"] else "0.25")  # fmt: skip
    fig.tight_layout(rect=(0, 0.02 + 0.025 * len(notes), 1, 1))
    _save(fig, path)
    return data


def plot_capacity(r: dict[str, Any], path: Path) -> None:
    """Mailbox entries per second over the capacity window (event time), all groups and
    large groups, against the window averages T1 and T2 are decided on, their limits and
    the budgets. Refuses (PlotError) when no message was ever sent: nothing to draw."""
    if not r["per_second"] or r["last_event_at"] is None:
        raise PlotError("nothing to plot: no message has been sent, so the capacity window is empty")
    plt = _pyplot()
    last = float(r["last_event_at"])
    xs = [sec - last for sec, _, _ in r["per_second"]]
    total = [float(n) for _, n, _ in r["per_second"]]
    large = [float(n) for _, _, n in r["per_second"]]
    fig, ax = plt.subplots(figsize=(11, 6))
    ax.set_yscale("log")
    ax.bar(xs, [v if v > 0 else float("nan") for v in total], width=0.9, align="edge", color="tab:blue", alpha=0.45,
           label="mailbox entries in that second (all groups)")  # fmt: skip
    ax.bar(xs, [v if v > 0 else float("nan") for v in large], width=0.9, align="edge", color="tab:purple",
           alpha=0.6, label="... of them to large groups")  # fmt: skip
    lines = (
        (r["fanout_entries_per_sec"], "tab:blue", "-", "window average, all groups (T1 input)"),
        (r["large_group_entries_per_sec"], "tab:purple", "-", "window average, large groups (T2 input)"),
        (r["T1"]["limit"], "tab:red", "--", "T1 limit (share of platform_fanout_budget)"),
        (r["T2"]["limit"], "tab:orange", "--", "T2 limit (share of the mailbox write budget)"),
        (r["platform_fanout_budget"], "0.3", ":", "platform_fanout_budget"),
        (r["mailbox_write_budget"], "0.55", ":", "mailbox write budget"),
    )
    positive = [v for v in [*total, *(x[0] for x in lines)] if v > 0]
    for value, color, style, label in lines:
        if value > 0:
            ax.axhline(value, color=color, linestyle=style, linewidth=1.5, label=f"{label}: {value:,.1f}/s")
    ax.set_ylim(min(positive) / 3, max(positive) * 3)
    ax.set_xlim(-r["window_s"] - 1, 1)
    ax.set_xlabel("seconds before the last send (event time)")
    ax.set_ylabel("mailbox entries per second (log)")
    states = [
        f"{t}: {'FIRING (review opened)' if r[t]['firing'] else 'over' if r[t]['over'] else 'ok'}" for t in ("T1", "T2")
    ]
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(last))
    ax.set_title(
        f"Capacity over the last {r['window_s']:g} s of event time (last send {at} UTC)\n"
        f"{r['fanout_entries_per_sec']:,.1f} entries/s = {r['budget_use']:.1%} of the platform budget; "
        f"{', '.join(states)}\n"
        "T1/T2 compare the window averages with their limits and only open a review (ADR-0003 decision 3)",
        fontsize=10,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(True, which="major", color="0.92")
    fig.tight_layout()
    _save(fig, path)
