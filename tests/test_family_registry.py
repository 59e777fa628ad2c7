"""The family registry and the checkpoint card stay the one place they are (issue 76, parts 1 and 2),
read from the source with an AST walk (the walk imports nothing but the registry's names):

1. branches on model-kind strings outside plmodels/families.py: a comparison of a `kind` (`x.kind`,
   `kind`, `getattr(x, "kind", ...)`, `meta["kind"]`, `d.get("kind")`) with a family's name or a
   tuple of names (`model.kind == "encoder"`, `kind in ("decoder", "xlnet")`, `kind in BILM_KINDS`)
   may not grow past MAX_KIND_BRANCHES; probes and analyses ask `plmodels.families` instead;
2. no module but the card loader (plmodels/checkpoint.py) names card.json or config.resolved.json
   as a file to read, nor uses CARD_FILE / RUN_CONFIG_FILE; the trainer (plmodels/training/loop.py)
   owns its run folder and may use RUN_CONFIG_FILE.
The last tests plant a branch and a card read in a copy of a file and check that the walks find them.
"""
from __future__ import annotations

import ast
from pathlib import Path

from plmodels.checkpoint import MODEL_KINDS
from plmodels.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plmodels", "probes", "workbench", "apps")
REGISTRY = "plmodels/families.py"
MAX_KIND_BRANCHES = 0  # today; was 60 before the registry (issue 76 counted 55 with a narrower grep)
KIND_NAMES = set(FAMILIES)  # the record names a branch would compare a kind with
KIND_TUPLES = {"BILM_KINDS"}  # module-level tuples of kind names
CARD_READERS = {"plmodels/checkpoint.py": {"card.json", "config.resolved.json", "CARD_FILE", "RUN_CONFIG_FILE"},
                "plmodels/training/loop.py": {"config.resolved.json", "RUN_CONFIG_FILE"}}


def _is_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Name):
        return node.id in ("kind", "model_kind")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call):
        f, a = node.func, node.args
        if isinstance(f, ast.Name) and f.id == "getattr" and len(a) >= 2:
            return isinstance(a[1], ast.Constant) and a[1].value == "kind"
        if isinstance(f, ast.Attribute) and f.attr == "get" and a:
            return isinstance(a[0], ast.Constant) and a[0].value == "kind"
    return False


def _names_a_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in KIND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e.value if isinstance(e, ast.Starred) else e) for e in node.elts)
    return isinstance(node, ast.Name) and node.id in KIND_TUPLES


def kind_branches(path: Path) -> list[str]:
    """'path:line: source' of every comparison of a model kind with a family's name in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides) and any(_names_a_kind(s) for s in sides):
                out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}: "
                           f"{ast.unparse(node)}")
    return out


def card_reads(path: Path, allowed: set[str] = frozenset()) -> list[str]:
    """'path:line: what' of each use of card.json / config.resolved.json as a file name (a string that is
    the name or a path ending in it, an f-string part too) or of CARD_FILE / RUN_CONFIG_FILE."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        what = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in ("card.json", "config.resolved.json"):
                if node.value == name or node.value.endswith("/" + name):
                    what = name
        elif isinstance(node, ast.Name) and node.id in ("CARD_FILE", "RUN_CONFIG_FILE"):
            what = node.id
        elif isinstance(node, ast.alias) and node.name in ("CARD_FILE", "RUN_CONFIG_FILE"):
            what = node.name
        if what is not None and what not in allowed:
            out.append(f"{path}:{getattr(node, 'lineno', '?')}: {what}")
    return out


def _sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, path.relative_to(ROOT).as_posix()


def test_checkpoint_kinds_are_the_registry():
    assert set(MODEL_KINDS) == set(FAMILIES) == KIND_NAMES


def test_branches_on_model_kind_strings_do_not_grow():
    found = [b for path, rel in _sources() if rel != REGISTRY for b in kind_branches(path)]
    assert len(found) <= MAX_KIND_BRANCHES, "branch on the family record instead:\n" + "\n".join(found)


def test_only_the_card_loader_reads_card_and_run_config_files():
    found = [r for path, rel in _sources() for r in card_reads(path, CARD_READERS.get(rel, set()))]
    assert not found, "read checkpoints' cards with plmodels.checkpoint.read_card:\n" + "\n".join(found)


def test_the_walks_find_a_planted_branch_and_a_planted_card_read(tmp_path):
    src = (ROOT / "workbench/analyses/prune.py").read_text(encoding="utf-8")
    assert not kind_branches(ROOT / "workbench/analyses/prune.py")
    planted = tmp_path / "prune.py"
    planted.write_text(src + '\n\ndef _planted(model, meta, path):\n'
                             '    if getattr(model, "kind", None) in ("decoder", "xlnet"):\n        return 1\n'
                             '    if meta["kind"] != "seq2seq":\n        return 2\n'
                             '    return (path / "card.json").read_text(), f"{path}/config.resolved.json"\n',
                       encoding="utf-8")
    assert len(kind_branches(planted)) == 2
    assert sorted(r.rsplit(": ", 1)[1] for r in card_reads(planted)) == ["card.json", "config.resolved.json"]
