"""The maps kept honest (issue 76, part 5): what a newcomer reads to find their way must match the code.

1. every module and subpackage of the product is named in its package's docstring (the map at the top
   of each `__init__.py`);
2. the CLI's family lists (`pretrain`'s kinds, `import-hf`'s model_types) are read off the registries
   (plmodels/families.py's FAMILIES, plmodels.hf.registry.IMPORTERS), not written out beside them;
3. a reference to a section of a docs page (`docs/x.md, "Title"`, `x.md#anchor`, `x.md section 1d`)
   names a section that exists in that page, so no link points into a section that moved.

4. docs/design.md's layout table names every module of the product, and its paper -> file -> flags
   table names only flags, objectives, files and recipes the code has, with a row for every kind;
5. the README's command table names every subcommand, and its documentation list every docs page.

Each checker is a plain function; the tests after it plant a fault and check that it is reported.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plmodels", "probes", "workbench", "apps")


# --------------------------------------------------------------------------- 1. package docstrings
def _named(name: str, doc: str) -> bool:
    """Whether `name` is named as a module in a map: `name.py`, `name/`, `` `name` ``, or a whole word on
    an indented or table line (a prose word such as "heads" in a sentence does not count)."""
    word = rf"(?<![\w.-]){re.escape(name)}(?![\w-])"
    if re.search(rf"{word}(\.py|/)|`{re.escape(name)}`", doc):
        return True
    return any(re.search(word, line) for line in doc.splitlines() if line.startswith((" ", "|")))


def unnamed_modules(package: Path) -> list[str]:
    """The modules (name.py) and subpackages (name/) of `package` its __init__.py docstring does not name."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    names += [p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(n for n in names if not _named(n, doc))


def _packages() -> list[Path]:
    return sorted(init.parent for top in PACKAGES for init in (ROOT / top).rglob("__init__.py"))


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_named_in_its_package_docstring(package):
    assert unnamed_modules(package) == [], f"{package.relative_to(ROOT)}/__init__.py: add them to its map"


def test_a_module_missing_from_the_map_is_reported(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "__init__.py").write_text("")
    for name in ("heads", "edge", "lens"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "__init__.py").write_text('"""pkg: the heads of a model, read in prose.\n\n'
                                     '    edge.py   edge probes\n    sub/      a layer\n\n`lens` too."""\n')
    assert unnamed_modules(pkg) == ["heads"]   # "heads" appears only as a prose word


# --------------------------------------------------------------------------- 2. the CLI's family lists
def _description(command: str) -> str:
    """`workbench COMMAND --help`'s description, as printed, lines unwrapped."""
    from workbench import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices[command].format_help().split())


def test_the_cli_lists_every_family_the_registries_hold():
    from plmodels.families import FAMILIES
    from plmodels.hf.registry import IMPORTERS

    assert f"({', '.join(FAMILIES)})" in _description("pretrain")
    assert f"({', '.join(sorted(IMPORTERS))};" in _description("import-hf")


def test_the_cli_lists_are_read_off_the_registries_not_copied(monkeypatch):
    """A family added to a registry appears in the help without an edit to workbench/cli.py."""
    import plmodels.families
    import plmodels.hf.registry

    monkeypatch.setitem(plmodels.families.FAMILIES, "planted", plmodels.families.FAMILIES["encoder"])
    monkeypatch.setitem(plmodels.hf.registry.IMPORTERS, "zz_planted", plmodels.hf.registry.IMPORTERS["bert"])
    assert "seq2seq, xlnet, planted)" in _description("pretrain")
    assert "xlnet, zz_planted;" in _description("import-hf")


# --------------------------------------------------------------------------- 3. section references
# `docs/x.md, "Title"` (a title may wrap over lines), `x.md#anchor`, `x.md section 3` / `x.md, 1d` (a
# bare number is not a reference: "notebook.md, 4 x 256" names a shape)
TITLED = re.compile(r'((?:docs|research)/[\w-]+\.md|README\.md),? (?:section )?"([^"]+)"')
ANCHORED = re.compile(r'((?:docs|research)/[\w-]+\.md|README\.md)#([\w-]+)')
NUMBERED = re.compile(r'((?:docs|research)/[\w-]+\.md|README\.md),? (section \d+[a-z]?|\d+[a-z])(?![\w-])')


def _headings(page: Path) -> list[str]:
    """A page's section titles: its `#` headings and the bold run-in titles that open a paragraph."""
    lines = page.read_text().splitlines()
    bold = [m.group(1) for line in lines if (m := re.match(r"\*\*([^*]+)\*\*", line))]
    return [" ".join(line.lstrip("#").split()) for line in lines if line.startswith("#")] + bold


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def broken_section_refs(root: Path, files: list[Path]) -> list[str]:
    """`file: page "section"` for each reference in `files` to a section `page` does not have."""
    bad = []
    for f in files:
        text = f.read_text()
        for pattern, found in ((TITLED, lambda h, s: any(s in x for x in h)),
                               (ANCHORED, lambda h, s: s in {_anchor(x) for x in h}),
                               (NUMBERED, lambda h, s: any(x.startswith(f"{s}.") for x in h))):
            for m in pattern.finditer(text):
                page, section = root / m.group(1), " ".join(m.group(2).removeprefix("section ").split())
                if not page.exists() or not found(_headings(page), section):
                    bad.append(f"{f.relative_to(root)}: {m.group(1)} {section!r}")
    return bad


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    # this file is left out: its docstring and planted faults name sections that do not exist
    return [ROOT / p for p in out.stdout.split() if (ROOT / p).is_file() and ROOT / p != Path(__file__).resolve()]


def test_no_reference_points_into_a_section_that_moved():
    assert broken_section_refs(ROOT, _tracked()) == []


def test_a_reference_to_a_moved_section_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "recipe.md").write_text("# Recipes\n\n## Which config to use\n\n## 2. The targets\n")
    src = tmp_path / "a.py"
    src.write_text('"""See docs/recipe.md, "Which config\n to use", docs/recipe.md#which-config-to-use and\n'
                   'docs/recipe.md section 2; moved: docs/recipe.md, "Batch 32", docs/recipe.md#batch-32,\n'
                   'docs/recipe.md section 1d and docs/gone.md, "Anything"."""\n')
    assert broken_section_refs(tmp_path, [src]) == [
        "a.py: docs/recipe.md 'Batch 32'", "a.py: docs/gone.md 'Anything'",
        "a.py: docs/recipe.md 'batch-32'", "a.py: docs/recipe.md '1d'"]


# --------------------------------------------------------------------------- 4. the family policy table
def _policy_rows(design: Path) -> list[dict[str, str]]:
    """docs/design.md's paper -> file -> flags table, one dict per row keyed by its header."""
    lines = design.read_text().splitlines()
    start = lines.index("| paper | file | kind | flags | recipe |")
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def policy_faults(rows: list[dict[str, str]]) -> list[str]:
    """Each flag, objective, file or recipe a row names that the code does not have."""
    from dataclasses import fields

    from plmodels import recipes
    from plmodels.families import FAMILIES
    from plmodels.training.masking import MaskingConfig   # the fields of PretrainConfig.masking
    from plmodels.training.objectives import OBJECTIVES

    masking = {f.name for f in fields(MaskingConfig)}
    shipped = set(recipes.names("pretrain"))
    faults = []
    for row in rows:
        config = FAMILIES[row["kind"]].config_class
        for name in re.findall(r"`([^`]+)`", row["flags"]):
            if name.startswith("objective: "):
                ok = name.removeprefix("objective: ") in OBJECTIVES
            elif name.startswith("masking."):
                ok = name.removeprefix("masking.") in masking
            elif name.startswith("plmodels/"):
                ok = (ROOT / name).is_file()
            elif "." in name:   # Seq2SeqConfig.t5()
                cls, attr = name.removesuffix("()").split(".")
                ok = cls == config.__name__ and callable(getattr(config, attr, None))
            else:
                ok = name in {f.name for f in fields(config)}
            if not ok:
                faults.append(f"{row['paper']}: {name}")
        for name in re.findall(r"`([^`]+)`", row["file"]):
            if not (ROOT / "plmodels" / name).is_file():
                faults.append(f"{row['paper']}: {name}")
        for name in re.findall(r"`([^`]+)`", row["recipe"]):
            if name not in shipped:
                faults.append(f"{row['paper']}: {name}")
    return faults


def test_the_family_policy_table_names_only_what_the_code_has():
    """Every kind has a row, and each flag, objective, file and recipe a row names exists."""
    from plmodels.families import FAMILIES

    rows = _policy_rows(ROOT / "docs" / "design.md")
    assert {row["kind"] for row in rows} == set(FAMILIES)
    assert policy_faults(rows) == []


def test_a_flag_the_code_lacks_is_reported():
    row = {"paper": "RoBERTa", "file": "`encoder.py`", "kind": "encoder", "recipe": "`roberta-mini` `gone-mini`",
           "flags": "`position_ids`, `rotary_dims`, `masking.sop`, `masking.nope`, `objective: span`, "
                    "`objective: nope`, `EncoderConfig.nope()`"}
    assert policy_faults([row]) == ["RoBERTa: rotary_dims", "RoBERTa: masking.nope", "RoBERTa: objective: nope",
                                    "RoBERTa: EncoderConfig.nope()", "RoBERTa: gone-mini"]


# --------------------------------------------------------------------------- 4b. the layout table
def layout_gaps(design: Path, root: Path) -> list[str]:
    """Modules (`package.module`) that docs/design.md's layout table does not name in their package's rows.

    A row's layer cell is `pkg` or `pkg.sub` (a blank cell continues the row above; "(entry)" rows
    count for the top-level modules of their package); its modules cell names modules as `name` or
    `name/` (a subpackage), and `app_pages/*` a subpackage as a whole."""
    lines = design.read_text().splitlines()
    start = lines.index("| layer | modules | role |")
    named: dict[str, set[str]] = {}
    layer = ""
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cell_layer, cell_modules = (c.strip() for c in line.strip("|").split("|")[:2])
        if cell_layer:
            layer = re.sub(r"\s*\(.*\)", "", cell_layer).strip("` ")
        names = {n.rstrip("/*").rstrip("/") for n in re.findall(r"`([^`]+)`", cell_modules)}
        named.setdefault(layer, set()).update(names)
    gaps = []
    for layer, names in named.items():
        package = root / layer.replace(".", "/")
        if layer.split(".")[0] not in PACKAGES or not (package / "__init__.py").exists():
            continue
        for p in sorted(package.iterdir()):
            name = p.stem if p.suffix == ".py" else p.name
            is_module = p.suffix == ".py" and name != "__init__"
            is_package = p.is_dir() and (p / "__init__.py").exists()
            if (is_module or is_package) and name not in names and f"{layer}.{name}" not in named:
                gaps.append(f"{layer}.{name}")
    return gaps


def test_the_layout_table_names_every_module():
    assert layout_gaps(ROOT / "docs" / "design.md", ROOT) == []


def test_a_module_missing_from_the_layout_table_is_reported(tmp_path):
    for path in ("plmodels/__init__.py", "plmodels/a.py", "plmodels/b.py", "plmodels/sub/__init__.py",
                 "plmodels/sub/c.py", "plmodels/sub/d.py", "plmodels/other/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    design = tmp_path / "design.md"
    design.write_text("| layer | modules | role |\n|---|---|---|\n| `plmodels` | `a` | x |\n| | `other/` | y |\n"
                      "| `plmodels.sub` | `c` | z |\n")
    assert layout_gaps(design, tmp_path) == ["plmodels.b", "plmodels.sub.d"]


# --------------------------------------------------------------------------- 5. the README
def readme_gaps(readme: str, commands: list[str], pages: list[str]) -> list[str]:
    """Subcommands the README's command table does not show as `workbench CMD ...`, and docs pages
    (docs/x.md) it does not name."""
    missing = [c for c in commands if not re.search(rf"`workbench {re.escape(c)}(?![\w-])", readme)]
    return missing + [p for p in pages if p not in readme]


def test_the_readme_names_every_command_and_every_docs_page():
    from workbench import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    pages = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    assert readme_gaps((ROOT / "README.md").read_text(), list(sub.choices), pages) == []


def test_a_command_or_page_missing_from_the_readme_is_reported():
    readme = "| `workbench probe MODEL` | x |\n| `workbench heads-extra` | y |\n- `docs/a.md`: a page\n"
    assert readme_gaps(readme, ["probe", "heads"], ["docs/a.md", "docs/b.md"]) == ["heads", "docs/b.md"]
