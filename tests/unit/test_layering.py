"""The layering, as a test (docs/ARCHITECTURE.md draws it).

Every module's imports are read with `ast` (also those inside functions and under
TYPE_CHECKING: a lazy import is still a dependency) and checked against one table:
which packages a package may import. Two finer rules sit beside the table: an adapter
stands alone (a module of one engine's package, `adapters/cassandra/`, `adapters/sqlite/`,
`adapters/rocksdb/`, `adapters/postgres/`, imports only modules of that package;
`adapters/memory.py` imports no other adapter), and only the composition root (the
`fanout/bootstrap/` package) picks adapters and the projection host: the entry points
(`cli/`, `tools/`, `api/`) reach them through it.

A violation that is known and has an owner is listed in PENDING with the fix that
removes it; the test fails on any other violation, and also when a pending one is gone
(then delete its line), so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# package -> the project packages its modules may import (itself always allowed).
#
#   api/  cli/            entry points (HTTP app, the `fanout` command, the demo)
#     |                   (cli/ only: api/ reads through fanout/ and imports no tool)
#   tools/                operator tools: replay, rebuild/verify, analyze
#     |                   (the entry points reach adapters and hosts through the root only)
#   fanout/               service layer: commands, queries, push, the composition root
#     |         \
#   adapters/   streams/  engines behind the ports | projection hosts (embedded runner)
#         \     /
#       projections/      read-side logic written once, and the ports
#           |
#        domain/          pure rules: no I/O, no clock reads
ALLOWED: dict[str, frozenset[str]] = {
    "domain": frozenset(),
    "projections": frozenset({"domain"}),
    "adapters": frozenset({"domain", "projections"}),
    "streams": frozenset({"domain", "projections"}),
    "fanout": frozenset({"domain", "projections", "adapters", "streams"}),
    "tools": frozenset({"domain", "projections", "fanout"}),
    "api": frozenset({"domain", "projections", "fanout"}),
    "cli": frozenset({"domain", "projections", "fanout", "tools", "api"}),
}
PACKAGES = tuple(ALLOWED)

# The composition root: the one package of the service layer that builds engines and hosts.
COMPOSITION_ROOT = "fanout.bootstrap"
ROOT_ONLY = frozenset({"adapters", "streams"})  # fanout/ imports these only in COMPOSITION_ROOT
# cli/ may import api/ only to serve it.
CLI_TO_API = frozenset({"api.app"})

# (importing module, imported module): known, owned, with the change that removes it.
PENDING: dict[tuple[str, str], str] = {}


def package_of(module: str) -> str:
    return module.split(".", 1)[0]


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def project_imports(module: str, path: Path) -> set[str]:
    """The project modules `module` imports, as dotted names (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            imported.add(stem)
            # `from fanout import strict_json` imports the module fanout.strict_json
            imported.update(f"{stem}.{alias.name}" for alias in node.names)
    return {name for name in imported if package_of(name) in ALLOWED}


def real(name: str, known: dict[str, Path]) -> str:
    """`from fanout import strict_json` names fanout.strict_json; `from a.b import C` names a.b."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def engine_of(module: str) -> str | None:
    """adapters.cassandra.views -> cassandra, adapters.memory -> memory: the engine an adapter
    module talks to (its package under adapters/, or the module itself); None for the bare
    `adapters` package, which holds nothing."""
    parts = module.split(".")
    return parts[1] if parts[0] == "adapters" and len(parts) > 1 else None


def allowed(module: str, target: str) -> bool:
    """May `module` import `target` (both project modules)?"""
    layer, other = package_of(module), package_of(target)
    if layer == other:  # within a package; between two adapters only of one engine's package
        return layer != "adapters" or "adapters" in (module, target) or engine_of(module) == engine_of(target)
    if other not in ALLOWED[layer]:
        return False
    if layer == "fanout" and other in ROOT_ONLY:
        return module == COMPOSITION_ROOT or module.startswith(COMPOSITION_ROOT + ".")
    if layer == "cli" and other == "api":
        return target in CLI_TO_API
    return True


def violations() -> set[tuple[str, str]]:
    known = modules()
    return {
        (module, target)
        for module, path in known.items()
        for target in {real(n, known) for n in project_imports(module, path)} - {module}
        if not allowed(module, target)
    }


def cycles() -> list[list[str]]:
    """Import cycles between modules (top-level imports and lazy ones alike)."""
    known = modules()
    graph = {m: {real(n, known) for n in project_imports(m, p)} & known.keys() - {m} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_follows_the_layering_table() -> None:
    unexpected = sorted(violations() - PENDING.keys())
    assert not unexpected, "imports against the layering (see ALLOWED):\n" + "\n".join(
        f"  {m} imports {t}" for m, t in unexpected
    )


def test_the_pending_violations_are_still_there_so_the_list_only_shrinks() -> None:
    fixed = sorted(PENDING.keys() - violations())
    assert not fixed, "fixed, delete from PENDING:\n" + "\n".join(f"  {m} -> {t}" for m, t in fixed)


def test_no_two_modules_import_each_other_even_lazily() -> None:
    assert cycles() == []


def test_the_rules_see_every_package_of_the_build() -> None:
    """A new top-level package must get a row in the table (pyproject lists the same)."""
    text = (ROOT / "pyproject.toml").read_text()
    for package in PACKAGES:
        assert f'"{package}*"' in text and f'"{package}"' in text
    assert modules().keys() >= {f"{p}" for p in PACKAGES}


def test_the_readme_layout_names_every_package_and_module() -> None:
    """README's Layout section is the tree: a module added or renamed shows up there."""
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1)].lower()
    missing = [f"{p}/" for p in PACKAGES if f"\n{p}/" not in layout]
    missing += [name for name in modules() if "." in name and name.rsplit(".", 1)[1] not in layout.replace(".py", "")]
    assert not missing, f"not in README's Layout: {missing}"


LONG_MODULE = 400  # lines: no module over ~400 lines without a reason written at its top


def test_a_module_over_400_lines_says_why_at_its_top() -> None:
    """A production module grows past LONG_MODULE lines only with a paragraph in its
    docstring starting "Why this module is long:" (then someone decided, not drifted)."""
    silent = []
    for name, path in modules().items():
        text = path.read_text()
        if text.count("\n") > LONG_MODULE:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Why this module is long:" not in doc:
                silent.append(f"{name} ({text.count(chr(10))} lines)")
    assert not silent, f"over {LONG_MODULE} lines without saying why at the top: {silent}"
