"""The house's import rules, read from the source with an AST walk (nothing is imported):

1. packages import one way: plmodels <- probes <- workbench <- apps, and none imports research/;
2. inside workbench, a layer imports only its own layer or lower ones (WORKBENCH_LAYERS);
3. no import cycle between modules of the product, and plmodels keeps its own two walls: the shared
   `plmodels.components` import no model family and no training code, and nothing in plmodels
   outside `plmodels.training` imports training (a model file must load without the trainer);
4. imports of the product's own modules sit at module top, so the graph above is the whole graph
   (the two exceptions import lazily, their imports still edges of the graph: workbench/cli.py imports
   its subcommand's library when it runs, so `workbench --help` takes 0.09 s and not 3.5 s with every
   analysis imported, measured on a 2-core EPYC; workbench/analyses/registry.py, whose records the CLI
   reads to build its parser, imports each analysis module in that analysis' run function);
5. no test module (`test_*.py`) and no `conftest.py` is imported by another file of tests/ or
   research/tests: shared helpers live in helper modules, so a test module runs or is deselected alone.

The checkers are plain functions, so the tests after them plant an upward import, a cycle and an
imported test module in a copy of the tree and check that they are reported.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plmodels", "probes", "workbench", "apps")            # lowest first
WORKBENCH_LAYERS = ("core", "data", "store", "analyses", "figures", "presentation")   # lowest first
ENTRY = "entry"        # workbench's top-level modules: cli, pipeline, app_launcher
LAZY_ALLOWED = {"workbench/cli.py", "workbench/analyses/registry.py"}
# (importer prefix, imported prefixes it must not use, why)
WALLS = [
    ("plmodels.components", ("plmodels.encoder", "plmodels.decoder", "plmodels.training", "plmodels.checkpoint",
                             "plmodels.hf"), "shared components import no family and no trainer"),
    ("plmodels.", ("plmodels.training",), "only plmodels.training imports the trainer"),
]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root: Path, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module top) of every import of a first-party module in `path`;
    `from pkg import name` counts as importing pkg.name when that is a module of the tree."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module, is_package = module_name(root, path), path.name == "__init__.py"
    top = {id(n) for n in tree.body}
    for n in tree.body:   # imports under a module-level `if`/`try` count as top-level too
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(s) for s in ast.walk(n)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            names = [f"{base}.{a.name}" if (root / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").is_file()
                     or (root / Path(*f"{base}.{a.name}".split("."))).is_dir() else base for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES + ("research",):
                out.append((name, node.lineno, id(node) in top))
    return out


def rank(module: str) -> tuple[int, int]:
    """(package rank, workbench layer rank) of a module name."""
    parts = module.split(".")
    if parts[0] == "research":
        return (len(PACKAGES), 0)
    pkg = PACKAGES.index(parts[0])
    if parts[0] != "workbench" or len(parts) == 1:
        return (pkg, len(WORKBENCH_LAYERS) if parts[0] == "workbench" and len(parts) == 1 else 0)
    layer = parts[1]
    return (pkg, WORKBENCH_LAYERS.index(layer) if layer in WORKBENCH_LAYERS else len(WORKBENCH_LAYERS))


def layer_name(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "workbench":
        return parts[0]
    return f"workbench.{parts[1]}" if len(parts) > 1 and parts[1] in WORKBENCH_LAYERS else f"workbench ({ENTRY})"


def check(root: Path) -> list[str]:
    """Every violation of the rules in the module docstring, as readable lines."""
    problems, graph = [], {}
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    for path in files:
        rel = path.relative_to(root).as_posix()
        me = module_name(root, path)
        deps = graph.setdefault(me, set())
        for target, line, at_top in imports(root, path):
            if target.split(".")[0] == "research":
                problems.append(f"{rel}:{line}: the product imports research ({target})")
                continue
            if rank(target) > rank(me):
                problems.append(f"{rel}:{line}: upward import {layer_name(me)} -> {layer_name(target)} ({target})")
            for who, banned, why in WALLS:
                if (me + ".").startswith(who) and not me.startswith("plmodels.training") \
                        and any((target + ".").startswith(b + ".") for b in banned):
                    problems.append(f"{rel}:{line}: {me} imports {target} ({why})")
            if not at_top and rel not in LAZY_ALLOWED:
                problems.append(f"{rel}:{line}: import of {target} inside a function")
            if target != me and not me.startswith(target + "."):   # a package's own __init__ is not a cycle
                deps.add(target)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_product_follows_the_import_rules():
    assert check(ROOT) == []


def test_every_workbench_subpackage_is_a_known_layer_with_a_docstring():
    subs = sorted(p.name for p in (ROOT / "workbench").iterdir() if (p / "__init__.py").is_file())
    assert subs == sorted(WORKBENCH_LAYERS)
    for sub in subs:
        doc = ast.get_docstring(ast.parse((ROOT / "workbench" / sub / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 10, sub


@pytest.fixture
def tree(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")


def test_the_checker_reports_an_upward_import(tree):
    _append(tree / "workbench" / "core" / "io.py", "from workbench.analyses import probing")
    _append(tree / "plmodels" / "encoder.py", "import workbench")
    found = check(tree)
    assert any("workbench/core/io.py" in p and "upward import workbench.core -> workbench.analyses" in p for p in found)
    assert any("plmodels/encoder.py" in p and "upward import plmodels -> workbench" in p for p in found)


def test_the_checker_reports_a_breach_of_plmodels_walls(tree):
    _append(tree / "plmodels" / "components" / "layers.py", "from plmodels.encoder import EncoderConfig")
    _append(tree / "plmodels" / "checkpoint.py", "from plmodels.training import pretrain")
    found = check(tree)
    assert any("components/layers.py" in p and "shared components import no family" in p for p in found), found
    assert any("plmodels/checkpoint.py" in p and "only plmodels.training imports the trainer" in p for p in found)


def test_the_checker_reports_a_cycle_and_a_lazy_import(tree):
    _append(tree / "workbench" / "analyses" / "probing.py", "from workbench.analyses import prune")
    _append(tree / "workbench" / "analyses" / "compare.py", "def f():\n    from workbench.data import tasks")
    found = check(tree)
    assert any(p.startswith("import cycle:") and "workbench.analyses.probing" in p
               and "workbench.analyses.prune" in p for p in found), found
    assert any("workbench/analyses/compare.py" in p and "inside a function" in p for p in found)


# ------------------------------------------------------------------------------- the tests' own imports
TEST_ROOTS = ("tests", "research/tests")


def imports_of_test_modules(root: Path) -> list[str]:
    """Imports of a test module (`test_*.py`) or a `conftest.py` by any file under TEST_ROOTS, one phrase
    each: helpers shared by tests live in helper modules (tests/plmodels/toy_runs.py, ...), so that
    running or deselecting one test module never depends on another."""
    out = []
    for top in TEST_ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module, is_package = module_name(root, path), path.name == "__init__.py"
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = _resolve(node, module, is_package)
                    names = [base] + [f"{base}.{a.name}" for a in node.names]
                else:
                    continue
                for name in names:
                    last = name.rsplit(".", 1)[-1]
                    target = root / Path(*name.split("."))
                    if (last.startswith("test_") or last == "conftest") and target.with_suffix(".py").is_file():
                        out.append(f"{path.relative_to(root)}:{node.lineno}: imports the test module {name}")
    return out


def test_no_test_module_imports_another_or_a_conftest():
    assert imports_of_test_modules(ROOT) == []


def test_the_checker_reports_a_test_module_imported_by_another(tmp_path):
    for top in TEST_ROOTS:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    _append(tmp_path / "tests" / "probes" / "test_l0.py", "from tests.probes.test_importance import CRUCIAL")
    _append(tmp_path / "tests" / "plmodels" / "test_hooks.py", "from .conftest import encoder")
    _append(tmp_path / "tests" / "workbench" / "test_cli.py", "from tests.plmodels import test_train")
    found = imports_of_test_modules(tmp_path)
    assert [p.split(": ", 1)[1] for p in found] == [
        "imports the test module tests.plmodels.conftest", "imports the test module tests.probes.test_importance",
        "imports the test module tests.plmodels.test_train"], found
