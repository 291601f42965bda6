"""The package's import rules, read from the source with ``ast`` (nothing is imported).

Every import inside ``etstore/`` points down the floors below (docs/architecture.md):
a module imports only modules on its own floor or a lower one, no modules import each
other in a circle, and nothing is imported inside a function except the optional heavy
third-party dependencies and the C extensions, each with a comment saying why it is lazy.
A failure lists every offending import as ``module -> imported (line N)``.
"""

from __future__ import annotations

import ast
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "etstore"

# (floor, dotted prefix): a module belongs to the longest prefix that names it or a parent;
# "etstore" names only the package facade (etstore/__init__.py), so a new top-level module
# has no floor until it is added here. The store (DuckDB, the graph index) sits above the
# algorithms, the simulator and the analyses, which are functions of traces and import no
# store; the application layer (app/: loads, runs and records) sits on the store and may
# import floors 1-6; the facade and etstore.testing sit
# above it and below report/cli/: they may import floors 1-7¼; only report/cli import the
# facade, and no module of the package imports etstore.testing (tests and bench do).
FLOORS: tuple[tuple[float, str], ...] = (
    (1, "etstore.proto"),
    (1, "etstore.errors"),
    (1, "etstore.units"),
    (1, "etstore.collective"),
    (1, "etstore.progress"),
    (1, "etstore.lazy"),
    (1, "etstore.pandas_gate"),
    (1, "etstore.sandbox"),
    (1, "etstore.gcpause"),
    (2, "etstore.model"),
    (2, "etstore.topology"),
    (2, "etstore.ir"),
    (2, "etstore.dag"),
    (2, "etstore.digest"),
    (3, "etstore.formats"),
    (3, "etstore.workloads"),
    (4, "etstore.algorithms"),
    (5, "etstore.sim"),
    (5.5, "etstore.analysis"),
    (6, "etstore.store"),
    (7.25, "etstore.app"),
    (7.5, "etstore"),
    (7.5, "etstore.testing"),
    (8, "etstore.report"),
    (8, "etstore.cli"),
)
TEST_ONLY = "etstore.testing"

# (importer prefix, imported prefix): pairs the floors allow but the design forbids. store/
# stores what it is given; reading files is the application layer's (app/), never the store's.
# sim/ computes from traces, topologies and configs; loading and recording is app/'s.
FORBIDDEN: tuple[tuple[str, str], ...] = (
    ("etstore.store", "etstore.formats"),
    ("etstore.sim", "etstore.store"),
)

# Third-party modules a function may import lazily: optional or heavy to load.
LAZY_ALLOWED = (
    "duckdb",
    "pyarrow",
    "ladybug",
    "plotly",
    "neo4j",
    "yaml",
    "networkx",
    "pandas",
    "polars",
    "rich",  # the console, tables and bars: JSON and CSV output, --help and --version never draw
    "ray",  # optional (etstore[ray]): only --ray loads it
)


@dataclass(frozen=True)
class Import:
    """One import statement's target as seen from ``module``."""

    module: str
    target: str  # dotted name: an etstore module, or the third-party module named
    line: int
    in_function: bool
    internal: bool  # target is a module of the package (or one of its C extensions)

    def __str__(self) -> str:
        return f"{self.module} -> {self.target} (line {self.line})"


def discover(root: Path, package: str) -> tuple[dict[str, Path], set[str]]:
    """Python modules of ``package`` under ``root`` (name → file) and its C extension names."""
    modules: dict[str, Path] = {}
    extensions: set[str] = set()
    for path in sorted((root / package).rglob("*")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts:
            continue
        if path.suffix == ".py":
            parts = rel.with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
        elif path.suffix == ".c":
            extensions.add(".".join(rel.with_suffix("").parts))
    return modules, extensions


def _resolve_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _lazy_comment(lines: list[str], comments: set[int], line: int) -> bool:
    """A comment on the import's line or in the imports/comments directly above it."""
    row = line
    while row >= 1:
        if row in comments:
            return True
        text = lines[row - 1].strip()
        if row != line and not text.startswith(("import ", "from ")):
            return False
        row -= 1
    return False


def _comment_lines(path: Path) -> set[int]:
    with path.open("rb") as f:
        return {tok.start[0] for tok in tokenize.tokenize(f.readline) if tok.type == tokenize.COMMENT}


def _walk(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import node with whether it runs inside a function (or lambda) body."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner)


def collect(root: Path, package: str) -> tuple[list[Import], list[str]]:
    """Every import of every module of ``package``, and the lazy imports without a comment.

    ``from a.b import c`` targets ``a.b.c`` when that is a module of the package and
    ``a.b`` otherwise; relative imports are resolved against the importing module.
    """
    modules, extensions = discover(root, package)
    known = set(modules) | extensions
    found: list[Import] = []
    uncommented: list[str] = []
    for module, path in modules.items():
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
        lines = source.splitlines()
        comments = _comment_lines(path)
        is_package = path.name == "__init__.py"
        for node, in_function in _walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve_base(module, is_package, node)
                targets = []
                for alias in node.names:
                    # a submodule when the package has it (or a third-party one we name);
                    # otherwise the name lives in ``base``
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known or sub in LAZY_ALLOWED else base)
            for target in dict.fromkeys(targets):
                internal = target == package or target.startswith(package + ".")
                imp = Import(module, target, node.lineno, in_function, internal)
                found.append(imp)
                if in_function and not _lazy_comment(lines, comments, node.lineno):
                    uncommented.append(str(imp))
    return found, sorted(set(uncommented))


def floor_of(module: str) -> float | None:
    """The floor of ``module`` from FLOORS, or None when no entry names it."""
    best: tuple[int, float] | None = None
    for floor, prefix in FLOORS:
        # the facade names only etstore/__init__.py; a new top-level module must be placed
        inside = module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))
        if inside and (best is None or len(prefix) > best[0]):
            best = (len(prefix), floor)
    return None if best is None else best[1]


def _lazy_allowed(target: str, extensions: set[str]) -> bool:
    if target in extensions:
        return True
    return any(target == name or target.startswith(name + ".") for name in LAZY_ALLOWED)


def floor_violations(imports: list[Import]) -> list[str]:
    """Imports that point up the floors, into etstore.testing, or from an unplaced module."""
    out = []
    for imp in imports:
        if not imp.internal:
            continue
        here, there = floor_of(imp.module), floor_of(imp.target)
        if here is None:
            out.append(f"{imp}: {imp.module} has no floor (add it to FLOORS and docs/architecture.md)")
        elif there is None:
            out.append(f"{imp}: {imp.target} has no floor (add it to FLOORS and docs/architecture.md)")
        elif imp.target == TEST_ONLY or imp.target.startswith(TEST_ONLY + "."):
            if not imp.module.startswith(TEST_ONLY):
                out.append(f"{imp}: only tests and bench import {TEST_ONLY}")
        elif there > here:
            out.append(f"{imp}: floor {here:g} imports floor {there:g}")
    return sorted(set(out))


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def forbidden_imports(imports: list[Import]) -> list[str]:
    """Imports of :data:`FORBIDDEN` pairs, ``TYPE_CHECKING`` and in-function ones included."""
    out = [
        f"{imp}: {above} must not import {below}"
        for imp in imports
        for above, below in FORBIDDEN
        if _under(imp.module, above) and _under(imp.target, below)
    ]
    return sorted(set(out))


def cycles(imports: list[Import]) -> list[list[str]]:
    """Module-level import cycles inside the package (Tarjan's SCC), each as its edges."""
    graph: dict[str, dict[str, int]] = {}
    for imp in imports:
        if imp.internal and not imp.in_function:
            graph.setdefault(imp.module, {}).setdefault(imp.target, imp.line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1 or v in graph.get(v, {}):
                inside = set(members)
                components.append(
                    sorted(
                        f"{a} -> {b} (line {line})"
                        for a in inside
                        for b, line in graph.get(a, {}).items()
                        if b in inside
                    )
                )

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def lazy_violations(imports: list[Import], extensions: set[str]) -> list[str]:
    """Function-level imports other than the optional heavy dependencies and C extensions."""
    out = []
    for imp in imports:
        if not imp.in_function or _lazy_allowed(imp.target, extensions):
            continue
        why = "a package module" if imp.internal else "not an optional heavy dependency"
        out.append(f"{imp}: imported inside a function ({why}); import it at module top")
    return sorted(set(out))


def _fail_unless_empty(title: str, lines: list[str]) -> None:
    """Fail with one line per offence (no traceback: the list is the whole story)."""
    if lines:
        pytest.fail(f"{title} ({len(lines)}):\n  " + "\n  ".join(lines), pytrace=False)


@pytest.fixture(scope="module")
def package_imports() -> tuple[list[Import], list[str], set[str]]:
    imports, uncommented = collect(ROOT, PACKAGE)
    return imports, uncommented, discover(ROOT, PACKAGE)[1]


def test_imports_point_down_the_floors(package_imports: tuple[list[Import], list[str], set[str]]) -> None:
    bad = floor_violations(package_imports[0])
    _fail_unless_empty("imports that point up the floors", bad)


def test_store_does_not_import_the_readers(
    package_imports: tuple[list[Import], list[str], set[str]],
) -> None:
    """store/ stores what app/ (or a caller) read: no reader of etstore.formats, not even for types;
    sim/ neither loads nor records (app/ does): no module of etstore.store."""
    _fail_unless_empty("imports the design forbids", forbidden_imports(package_imports[0]))


def test_no_import_cycles(package_imports: tuple[list[Import], list[str], set[str]]) -> None:
    found = cycles(package_imports[0])
    lines = [" | ".join(c) for c in found]
    _fail_unless_empty("module-level import cycles (edges inside each cycle)", lines)


def test_function_level_imports_are_only_optional_dependencies(
    package_imports: tuple[list[Import], list[str], set[str]],
) -> None:
    imports, _, extensions = package_imports
    bad = lazy_violations(imports, extensions)
    _fail_unless_empty("imports inside functions", bad)


def test_lazy_imports_say_why(package_imports: tuple[list[Import], list[str], set[str]]) -> None:
    imports, uncommented, extensions = package_imports
    allowed = {str(i) for i in imports if i.in_function and _lazy_allowed(i.target, extensions)}
    bad = [line for line in uncommented if line in allowed]
    _fail_unless_empty("lazy imports without a comment saying why they are lazy", bad)


def test_every_module_has_a_floor(package_imports: tuple[list[Import], list[str], set[str]]) -> None:
    modules, _ = discover(ROOT, PACKAGE)
    unplaced = sorted(m for m in modules if floor_of(m) is None)
    _fail_unless_empty("modules on no floor", unplaced)


def test_tests_and_bench_do_not_import_test_modules() -> None:
    """Shared test inputs live in etstore.testing and conftest fixtures, not in other test modules."""
    bad = []
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            bad += [
                f"{path.relative_to(ROOT)} -> {n} (line {node.lineno})"
                for n in names
                if n.split(".")[0] == "tests"
            ]
    _fail_unless_empty("imports of test modules (use etstore.testing or a conftest fixture)", bad)


# ---------------------------------------------------------------- the checker itself, on a toy package


def _toy(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "etstore" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checker_resolves_relative_submodule_and_lazy_imports(tmp_path: Path) -> None:
    root = _toy(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "formats/__init__.py": "from .et import read_et\n",
            "formats/et.py": (
                "from . import _frames\nfrom ..errors import X\nfrom etstore.formats import read_et\n"
                "def f():\n    import pandas  # optional\n    from etstore.sim import engine\n"
                "    import json\n    x = 1\n    from etstore.formats import _codec\n"
            ),
            "formats/_frames.py": "",
            "formats/_codec.c": "",
            "sim/__init__.py": "",
            "sim/engine.py": "",
        },
    )
    imports, uncommented = collect(root, "etstore")
    _, extensions = discover(root, "etstore")
    seen = {(i.module, i.target, i.line, i.in_function) for i in imports}
    assert ("etstore.formats", "etstore.formats.et", 1, False) in seen
    assert ("etstore.formats.et", "etstore.formats._frames", 1, False) in seen
    assert ("etstore.formats.et", "etstore.errors", 2, False) in seen
    assert ("etstore.formats.et", "etstore.formats", 3, False) in seen  # a name, not a submodule
    assert ("etstore.formats.et", "etstore.sim.engine", 6, True) in seen
    assert [c[0] for c in cycles(imports)] == ["etstore.formats -> etstore.formats.et (line 1)"]
    assert floor_violations(imports) == [
        "etstore.formats.et -> etstore.sim.engine (line 6): floor 3 imports floor 5"
    ]
    assert lazy_violations(imports, extensions) == [
        "etstore.formats.et -> etstore.sim.engine (line 6): imported inside a function (a package module); "
        "import it at module top",
        "etstore.formats.et -> json (line 7): imported inside a function (not an optional heavy dependency); "
        "import it at module top",
    ]
    assert "etstore.formats.et -> pandas (line 5)" not in uncommented
    assert "etstore.formats.et -> etstore.formats._codec (line 9)" in uncommented


def test_checker_places_modules_by_longest_prefix() -> None:
    assert floor_of("etstore.collective") == 1
    assert floor_of("etstore.algorithms.synth") == 4
    assert floor_of("etstore.store.embedded") == 6
    assert floor_of("etstore.topology.core") == 2
    assert floor_of("etstore.app.ingest_files") == 7.25
    assert floor_of("etstore") == 7.5
    assert floor_of("etstore.cli.demo") == 8
    assert floor_of("etstore.newthing") is None  # a new top-level module must be placed in FLOORS


def test_checker_finds_forbidden_imports_even_for_types(tmp_path: Path) -> None:
    root = _toy(
        tmp_path,
        {
            "__init__.py": "",
            "formats/__init__.py": "",
            "formats/tuner.py": "",
            "store/__init__.py": "",
            "store/tuner.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from etstore.formats.tuner import X\n"
            ),
            "app/__init__.py": "",
            "app/tuner.py": "from etstore.formats.tuner import X\n",
        },
    )
    imports, _ = collect(root, "etstore")
    assert floor_violations(imports) == []  # floor 4 may import floor 3: only FORBIDDEN says no
    assert forbidden_imports(imports) == [
        "etstore.store.tuner -> etstore.formats.tuner (line 3): etstore.store must not import etstore.formats"
    ]
