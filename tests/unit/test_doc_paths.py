"""The documents a newcomer reads name only files that exist, and the ADRs have one index.

Every repository path named in README.md, docs/ARCHITECTURE.md, docs/PROTOCOL.md,
docs/ENGINES.md, docs/PERFORMANCE.md and docs/adr/*.md must exist in the working tree:

* a markdown link's target when it is relative (`[x](../PROTOCOL.md#frames)`), resolved from
  the document's folder, its `#anchor` dropped;
* a path in the text, backticked or not, that starts with a top-level folder of the project
  (`fanout/`, `adapters/`, `tests/`, ...) or is `Makefile` / `pyproject.toml`, read from the
  repository's root, its `:line` suffix (`:12`, `:12-30`), `::test` id and `#anchor` dropped.

A rename therefore fails here until the documents follow it. Globs and placeholders
(`tests/distributed/test_*.py`, `docs/adr/<number>.md`, `{a,b}`) are not paths and are left out,
as are prose fragments such as `and/or`.

And: every ADR file is listed in docs/adr/README.md, and every ADR's third line is its status
in the one format (accepted, rejected with a date, superseded by a linked ADR, or proposed)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADR = ROOT / "docs" / "adr"

DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "docs" / "ARCHITECTURE.md",
    ROOT / "docs" / "PROTOCOL.md",
    ROOT / "docs" / "ENGINES.md",
    ROOT / "docs" / "PERFORMANCE.md",
    *sorted(ADR.glob("*.md")),
]

TOP = ("domain", "projections", "adapters", "streams", "fanout", "tools", "api", "cli", "bench", "tests", "docs",
       "infra", "clients", ".ci")
# A path: a top-level folder then path characters, or one of the root's files; not preceded by
# a character that would make it the tail of something else (`src/fanout/x`, `a.tests/`, a URL).
# The match stops at `:` (`fanout/x.py:12`, `tests/x.py::test_y`), `#`, `)`, `,`, a space.
PATH = re.compile(
    r"(?<![\w./~$:-])"
    r"((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./*<>{}$-]*|Makefile\b|pyproject\.toml\b)"
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"[*<>{}$]|\.\.\.")
STATUS = re.compile(
    r"Status: (?:accepted \(\d{4}-\d\d-\d\d\)\.|rejected \(\d{4}-\d\d-\d\d\)\."
    r"|superseded by \[ADR-\d{4}\]\(\d{4}-[\w-]+\.md\)\.|proposed\.)"
)


def named_paths(text: str) -> set[str]:
    """The repository paths a document names in its text (links aside), as written."""
    found = set()
    for m in PATH.finditer(text):
        token = m.group(1)
        if PLACEHOLDER.search(token):
            continue  # a glob or a placeholder, not one file
        token = token.rstrip(".")  # the end of a sentence (`:line`, `::test`, `#anchor` stop the match)
        found.add(token)
    return found


def link_targets(text: str) -> set[str]:
    """The relative targets of a document's markdown links, anchors dropped."""
    found = set()
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#") or PLACEHOLDER.search(target):
            continue  # a URL (http:, mailto:), an anchor in the same page, or a placeholder
        found.add(target.split("#")[0])
    return found


def missing_in(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    missing = [p for p in sorted(named_paths(text)) if not (ROOT / p.rstrip("/")).exists()]
    for target in sorted(link_targets(text)):
        resolved = (doc.parent / target).resolve()
        if not resolved.is_relative_to(ROOT):
            missing.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            missing.append(target)
    return missing


def test_every_path_a_document_names_exists() -> None:
    missing = {str(d.relative_to(ROOT)): m for d in DOCUMENTS if (m := missing_in(d))}
    assert not missing, f"paths named but absent: {missing}"


def test_the_extraction_finds_paths_and_leaves_globs_and_prose() -> None:
    text = (
        "see `fanout/bootstrap.py:12` and adapters/cassandra/views.py, then `tests/e2e/test_x.py::test_y`; "
        "`tests/distributed/test_*.py`, `docs/adr/<n>.md`, src/fanout/x.py and/or the Makefile."
    )
    assert named_paths(text) == {
        "fanout/bootstrap.py",
        "adapters/cassandra/views.py",
        "tests/e2e/test_x.py",
        "Makefile",
    }
    assert link_targets("[a](../PROTOCOL.md#frames) [b](https://example.com) [c](#here)") == {"../PROTOCOL.md"}


def test_every_adr_is_in_the_index_and_the_index_is_linked() -> None:
    listed = {t for t in link_targets((ADR / "README.md").read_text(encoding="utf-8")) if re.fullmatch(r"\d{4}-.*", t)}
    adrs = {p.name for p in ADR.glob("[0-9][0-9][0-9][0-9]-*.md")}
    assert sorted(adrs - listed) == [], "ADRs missing from docs/adr/README.md"
    assert sorted(listed - adrs) == [], "docs/adr/README.md lists ADRs that do not exist"
    for doc, target in ((ROOT / "README.md", "docs/adr/README.md"), (ROOT / "docs" / "ARCHITECTURE.md", "adr/README.md")):
        assert target in link_targets(doc.read_text(encoding="utf-8")), f"{doc.name} does not link the ADR index"


def test_every_adr_has_one_title_and_status_format() -> None:
    wrong = []
    for p in sorted(ADR.glob("[0-9][0-9][0-9][0-9]-*.md")):
        lines = p.read_text(encoding="utf-8").split("\n")
        if not lines[0].startswith(f"# ADR-{p.name[:4]}: ") or lines[1] != "" or not STATUS.fullmatch(lines[2]):
            wrong.append(f"{p.name}: {lines[:3]}")
    assert not wrong, "an ADR starts with `# ADR-NNNN: Title`, a blank line, then its status line:\n" + "\n".join(wrong)
