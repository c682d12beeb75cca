"""Every table the demo prints is followed by a one-line legend naming each of its columns."""

from __future__ import annotations

import io
import re
from pathlib import Path

from cli.demo import run_demo
from domain.params import Parameters

HEADERS = ("mailbox_entries", "big_head", "expected")  # a word only the header line of each table has


def test_each_demo_table_has_a_legend_naming_every_column(tmp_path: Path) -> None:
    out = io.StringIO()
    run_demo(tmp_path / "data", 400, params=Parameters(), out=out)
    lines = out.getvalue().splitlines()
    headers = [i for i, line in enumerate(lines) if any(re.search(rf"\b{h}\b", line) for h in HEADERS)]
    headers = [i for i in headers if not lines[i].lstrip().startswith("columns:")]
    assert len(headers) == 7, headers  # 3 cost tables, 3 session tables, 1 check table
    for i in headers:
        legend = next((line for line in lines[i + 1 :] if line.lstrip().startswith("columns:")), None)
        rows_between = lines[i + 1 : lines.index(legend, i + 1)] if legend else []
        assert legend is not None and not any(r.startswith("[") or not r.strip() for r in rows_between), lines[i]
        for column in lines[i].split():
            assert re.search(rf"(^|[ ;,/]){re.escape(column)}\b", legend.split(":", 1)[1]), (column, legend)
