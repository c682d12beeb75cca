"""The README's Python code blocks run as they are written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_python_block_in_the_readme_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python block to run"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
