"""The floors hold: every import between infopt's modules points down (or sideways inside one
floor without a cycle), and imports sit at the top of the module except where docs/ARCHITECTURE.md
allows a lazy one.

The graph is read from the source with ``ast`` (nothing is imported), so a function-local import,
one under ``TYPE_CHECKING`` and a string in ``importlib`` are all seen.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# folder on disk -> import name (pyproject.toml's package-dir)
FOLDERS = {"optimize": "infopt", "core": "infopt.core", "runtime": "infopt.runtime", "passes": "infopt.passes",
           "quantize": "infopt.quantize", "gpu_kernels": "infopt.kernels",
           "exporters": "infopt.exporters", "validators": "infopt.validators", "recipes": "infopt.recipes"}

# lowest first; a module belongs to the longest prefix that names it
FLOORS = [
    "infopt.recipes",
    "infopt.core",
    "infopt.runtime",
    "infopt.validators",
    "infopt.quantize",
    "infopt.kernels",
    "infopt.exporters",
    "infopt.passes",
    "infopt.exporters.servers",
    "infopt.report",
    "infopt.api",
    "infopt.cli",
    "infopt",
]

# where a function-local import of infopt's own modules is allowed, and why
LAZY_ALLOWED = {
    "infopt": "`import infopt` stays light: build/load/gate load on first use (PEP 562)",
    "infopt.api": "the package only: `infopt verify` imports infopt.api.provenance without the build (PEP 562)",
    "infopt.cli.*": "`infopt --help` imports no torch: a command loads the API when it runs",
}


def _lazy_allowed(module: str) -> bool:
    return any(module.startswith(a[:-1]) if a.endswith(".*") else module == a for a in LAZY_ALLOWED)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    local: bool


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def floor_of(module: str) -> int:
    best = max((f for f in FLOORS if module == f or module.startswith(f + ".")), key=len)
    return FLOORS.index(best)


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def edges() -> list[Edge]:
    known = modules()
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, local in _imports(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                if node.level or not (node.module or "").startswith("infopt"):
                    continue
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                         for a in node.names]
            for name in names:
                if name.split(".")[0] == "infopt" and (target := _resolve(name, known)) and target != module:
                    found.append(Edge(module, target, node.lineno, local))
    return found


def _imports(tree: ast.AST, local: bool = False):
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, local
        inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _imports(child, inner)


def _is_package_of(source: str, target: str) -> bool:
    """A package's ``__init__`` re-exporting its own modules is not an upward import."""
    return modules()[source].name == "__init__.py" and target.startswith(source + ".")


def test_every_module_has_a_floor():
    for module in modules():
        assert floor_of(module) >= 0, module


def test_no_import_points_up():
    up = [f"{e.source}:{e.line} ({FLOORS[floor_of(e.source)]}) imports {e.target} ({FLOORS[floor_of(e.target)]})"
          for e in edges() if floor_of(e.target) > floor_of(e.source) and not _is_package_of(e.source, e.target)]
    assert not up, "imports pointing up a floor:\n" + "\n".join(up)


def test_no_cycles():
    graph: dict[str, set[str]] = {}
    for e in edges():
        if not _is_package_of(e.source, e.target):
            graph.setdefault(e.source, set()).add(e.target)
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_internal_imports_sit_at_the_top():
    lazy = [f"{e.source}:{e.line} imports {e.target} inside a function" for e in edges()
            if e.local and not _lazy_allowed(e.source)]
    assert not lazy, "function-local imports of infopt's own modules (allowed only in " \
                     f"{', '.join(LAZY_ALLOWED)}):\n" + "\n".join(lazy)


def test_the_checker_sees_a_violation(tmp_path):
    """The check can fail: an upward edge and a cycle planted in a copy of the graph are found."""
    assert floor_of("infopt.core.errors") < floor_of("infopt.api.orchestrator")
    assert floor_of("infopt.exporters.servers.triton") > floor_of("infopt.exporters.staging")
    tree = ast.parse("def f():\n    from infopt.api import build\n")
    (node, local), = list(_imports(tree))
    assert local and isinstance(node, ast.ImportFrom)


def test_no_module_names_a_module_above_it():
    """A string that names an infopt module (for ``importlib.import_module``, ``python -m``, a table of
    plugins) is an import the graph above cannot see; none names a module above the floor of the
    module that holds it. Registries are filled from above instead (``infopt.passes`` registers its
    passes into ``core/pass_api.py``)."""
    known = modules()
    up = []
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value and node.value in known \
                    and floor_of(node.value) > floor_of(module):
                up.append(f"{module}:{node.lineno} names {node.value}")
    assert not up, "\n".join(up)


def private_imports(source: str, module: str = "infopt.x") -> list[str]:
    """``from infopt.M import _name`` lines in ``source``: a private name used outside its module."""
    return [f"{module}:{node.lineno} imports {a.name} from {node.module}" for node, _ in _imports(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("infopt")
            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]


def test_no_module_imports_a_private_name_from_another():
    found = [line for module, path in modules().items() for line in private_imports(path.read_text(), module)]
    assert not found, "private names imported across modules (make them public where they are defined):\n" + "\n".join(found)
    assert private_imports("from infopt.report.html import CSS, _Chart\n") == ["infopt.x:1 imports _Chart from infopt.report.html"]


def folder_pairs_both_ways(found: list[Edge]) -> list[str]:
    """Top-level folders on disk that import each other both ways (with the edges' counts)."""
    known = modules()

    def folder(module: str) -> str:
        return known[module].relative_to(ROOT).parts[0]

    counts: dict[tuple[str, str], int] = {}
    for e in found:
        pair = (folder(e.source), folder(e.target))
        if pair[0] != pair[1]:
            counts[pair] = counts.get(pair, 0) + 1
    return [f"{a} -> {b} ({n}), {b} -> {a} ({counts[(b, a)]})" for (a, b), n in sorted(counts.items())
            if a < b and (b, a) in counts]


def test_the_folders_on_disk_are_the_floors():
    """A tool that reads imports from paths (not pyproject's package-dir) draws the house as it is:
    no two top-level folders import each other both ways."""
    both = folder_pairs_both_ways(edges())
    assert not both, "top-level folders importing each other both ways:\n" + "\n".join(both)
    planted = [Edge("infopt.core.errors", "infopt.api.orchestrator", 1, False),
               Edge("infopt.api.orchestrator", "infopt.core.errors", 1, False)]
    assert folder_pairs_both_ways(planted) == ["core -> optimize (1), optimize -> core (1)"]


def test_no_module_outside_the_passes_names_a_pass():
    """A pass is named by the recipes and by its own module: the builder, the tasks, the flags, the reports and
    the servers reach passes through the registry, their typed details and the build settings, never by name.
    Every string constant of the source outside ``passes/`` that equals a registered pass's name fails."""
    import infopt.passes  # noqa: F401 - registers the bundled passes
    from infopt.core.pass_api import PASSES

    names = set(PASSES.items)
    assert {"capture", "quantize_int8", "quantize_int4", "capture_kv_decoder", "write_genai_folder"} <= names
    found = []
    for module, path in modules().items():
        if module.startswith("infopt.passes"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} names pass {node.value!r}")
    assert not found, "\n".join(found)


DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def test_no_source_module_holds_a_dated_measurement():
    """Dated figures live in benchmarks/results/; a docstring or comment says the rule and links there."""
    dated = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}" for path in modules().values()
             for number, line in enumerate(path.read_text().splitlines(), 1) if DATE.search(line)]
    assert not dated, "\n".join(dated)


def model_type_comparisons(source: str, model_types: set[str]) -> list[int]:
    """The lines of ``source`` that compare a ``model_type``, or compare anything with a family's model type."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        named = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if "model_type" in ast.unparse(node) or named & model_types:
            lines.append(node.lineno)
    return lines


def test_no_model_type_is_compared_outside_the_families():
    """A family's quirks live in ``exporters/families/``: elsewhere code asks ``family_of(config)``, never the
    ``model_type`` itself."""
    from infopt.exporters.families import FAMILIES

    model_types = {t for family in FAMILIES.all().values() for t in family.model_types}
    assert {"llama", "qwen2", "gpt_oss"} <= model_types
    assert model_type_comparisons('if "gpt_oss" in str(getattr(config, "model_type", "")): pass', model_types) == [1]
    assert model_type_comparisons("kind = 'decoder' if config.model_type in TYPES else 'x'", model_types) == [1]
    assert model_type_comparisons("if name == 'qwen2': pass", model_types) == [1]
    assert model_type_comparisons("family = family_of(config)", model_types) == []
    found = [f"{path.relative_to(ROOT)}:{line}" for module, path in modules().items()
             if not module.startswith("infopt.exporters.families")
             for line in model_type_comparisons(path.read_text(), model_types)]
    assert not found, "\n".join(found)


def test_tests_share_helpers_through_tests_support_only():
    """A test module imports shared helpers from ``tests/support/``, never from another test module or conftest. A
    helper module elsewhere (``tests/matrix/models.py``) serves its own folder only."""
    tests = ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                parts = name.split(".")
                if parts[0] != "tests" or "support" in parts[1:2]:
                    continue
                if re.match(r"test_\w+|conftest$", parts[-1]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports the test module {name}")
                elif (ROOT.joinpath(*parts) if ROOT.joinpath(*parts).is_dir() else ROOT.joinpath(*parts[:-1])) != path.parent:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}, another folder's helper")
    assert not found, "\n".join(found)


def test_benchmarks_import_only_helpers_that_exist():
    """A benchmark takes shared helpers from ``tests/support/`` alone, and each name it imports is there. Imports
    inside functions count: a moved helper otherwise breaks a benchmark only when someone runs it."""
    import importlib
    import importlib.util

    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests"):
                continue
            where = f"benchmarks/{path.name}:{node.lineno}"
            if not node.module.startswith("tests.support"):
                found.append(f"{where} imports {node.module}, not a tests/support/ helper")
                continue
            module = importlib.import_module(node.module)
            found += [f"{where}: {node.module} has no {alias.name}" for alias in node.names
                      if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None]
    assert not found, "\n".join(found)
