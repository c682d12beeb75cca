"""`fanout analyze alpha|capacity --png`: the plots a reviewer decides on, drawn from real
data dirs (the demo's, and a runtime driven directly); a plot that cannot be drawn is
refused with exit 2, never skipped silently."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from cli.demo import run_demo
from domain.params import Parameters
from fanout.bootstrap import bootstrap
from fanout.config import Settings
from tests.integration.test_cli import fanout
from tools.analyze import alpha_report, capacity_report
from tools.plots import alpha_plot_data, plot_alpha


def png_size(path: Path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        return image.size


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo on 400 members: a review enabled mention_only for demo x small, later rolled back."""
    data_dir = tmp_path_factory.mktemp("plots") / "data"
    run_demo(data_dir, 400, params=Parameters(), out=io.StringIO())
    return data_dir


@pytest.fixture(scope="module")
def quiet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No review ever decided: one conversation (nobody active after the window) and one message."""
    data_dir = tmp_path_factory.mktemp("plots") / "quiet"
    with bootstrap(Settings.embedded(data_dir)) as rt:
        rt.app.create_conversation("acme", "general", "General", [f"u{i}" for i in range(30)])
        rt.app.send_message("acme", "general", sender="u0", text="hello")
        rt.runner.catch_up()
    return data_dir


@pytest.fixture(scope="module")
def empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Views exist, nothing was ever sent."""
    data_dir = tmp_path_factory.mktemp("plots") / "empty"
    with bootstrap(Settings.embedded(data_dir)) as rt:
        rt.runner.catch_up()
    return data_dir


def test_the_alpha_plot_marks_the_conversations_meeting_the_criterion_and_their_saving(
    demo_dir: Path, tmp_path: Path
) -> None:
    png = tmp_path / "alpha.png"
    r = fanout(
        "analyze", "alpha", "--data-dir", str(demo_dir), "--min-saving", "100", "--max-active-ratio", "0.1",
        "--png", str(png),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"plot written to {png}" in r.stderr and "EXAMPLE" not in r.stderr
    width, height = png_size(png)
    assert width >= 1000 and height >= 600

    report = alpha_report(demo_dir, Parameters(), min_saving=100, max_active_ratio=0.1)
    data = alpha_plot_data(report)
    assert not data["example"]
    assert data["terms"] == [{"min_saving": 100, "max_active_ratio": 0.1, "source": "given on the command line"}]
    (big,) = [p for p in data["points"] if p["members"] == 400]
    assert big["meets"] and big["saving"] == pytest.approx(400 * (1 - big["alpha"]))
    assert data["meeting"] == 1 and data["saving"] == pytest.approx(big["saving"])  # the small groups do not meet it


def test_the_alpha_plot_takes_the_thresholds_of_the_latest_review_when_none_are_given(
    demo_dir: Path, tmp_path: Path
) -> None:
    png = tmp_path / "alpha.png"
    r = fanout("analyze", "alpha", "--data-dir", str(demo_dir), "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert "(tier not enabled)" in r.stdout  # the demo rolled its tier back; the review's terms remain
    png_size(png)
    data = alpha_plot_data(alpha_report(demo_dir, Parameters()))
    # the demo's review: read_diffusion_min_saving = members // 2, max_active_ratio 0.1
    assert [(t["min_saving"], t["max_active_ratio"]) for t in data["terms"]] == [(200.0, 0.1)]
    assert data["terms"][0]["source"].startswith("from review ")


def test_without_any_thresholds_the_alpha_plot_uses_the_example_values_and_says_so(
    quiet_dir: Path, tmp_path: Path
) -> None:
    png = tmp_path / "alpha.png"
    r = fanout("analyze", "alpha", "--data-dir", str(quiet_dir), "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert "EXAMPLE thresholds" in r.stderr
    png_size(png)
    data = alpha_plot_data(alpha_report(quiet_dir, Parameters(), now=10**10))  # long after: alpha = 0
    assert data["example"] and data["terms"][0]["source"].startswith("EXAMPLE")
    assert [p["alpha"] for p in data["points"]] == [0.0]  # drawn on the floor line, not lost
    assert plot_alpha(alpha_report(quiet_dir, Parameters(), now=10**10), tmp_path / "zero.png")["points"]


def test_analyze_capacity_png_draws_entries_per_second_against_the_limits(quiet_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "capacity.png"
    r = fanout("analyze", "capacity", "--data-dir", str(quiet_dir), "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert f"plot written to {png}" in r.stderr and "T1" in r.stdout
    png_size(png)
    report = capacity_report(quiet_dir, Parameters())
    assert [n for _, n, _ in report["per_second"]] == [30]


def test_analyze_capacity_png_refuses_when_nothing_was_sent(empty_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "capacity.png"
    r = fanout("analyze", "capacity", "--data-dir", str(empty_dir), "--png", str(png))
    assert r.returncode == 2
    assert r.stderr.startswith("fanout: error:") and "nothing to plot" in r.stderr
    assert not png.exists()


@pytest.mark.parametrize("what", ["alpha", "capacity"])
def test_a_png_that_cannot_be_written_is_refused_with_exit_2(what: str, quiet_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "no-such-dir" / "plot.png"
    r = fanout("analyze", what, "--data-dir", str(quiet_dir), "--png", str(png))
    assert r.returncode == 2, r.stderr
    assert "cannot write the PNG" in r.stderr and str(png) in r.stderr
