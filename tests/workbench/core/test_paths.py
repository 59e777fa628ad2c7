"""workbench.core.paths: data_root honours WORKBENCH_DATA; dataset_dir names what is missing."""
from pathlib import Path

import pytest

from workbench.core import paths


def test_data_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_DATA", str(tmp_path))
    assert paths.data_root() == tmp_path.resolve()


def test_data_root_default_is_shared_data_next_to_repo(monkeypatch):
    monkeypatch.delenv("WORKBENCH_DATA", raising=False)
    repo = Path(paths.__file__).resolve().parents[2]
    assert (repo / "workbench" / "core" / "paths.py").is_file()
    assert paths.data_root() == (repo.parent / "shared" / "data").resolve()


def test_dataset_dir_missing_folder_names_folder_and_files(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        paths.dataset_dir("wikitext2", ["wiki.valid.tokens", "wiki.test.tokens"])
    msg = str(e.value)
    assert str(tmp_path / "wikitext2") in msg
    assert "wiki.valid.tokens" in msg and "wiki.test.tokens" in msg


def test_dataset_dir_missing_file_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_DATA", str(tmp_path))
    (tmp_path / "ud_english_gum" / "const").mkdir(parents=True)
    for f in paths.DATASETS["ud_english_gum"]:
        if f != "const/dev.ptb":
            (tmp_path / "ud_english_gum" / f).write_text("x")
    with pytest.raises(FileNotFoundError, match=r"lacks const/dev\.ptb"):
        paths.dataset_dir("ud_english_gum")
    (tmp_path / "ud_english_gum" / "const" / "dev.ptb").write_text("x")
    assert paths.dataset_dir("ud_english_gum") == tmp_path.resolve() / "ud_english_gum"


def test_unknown_dataset_without_expected_lists_known():
    with pytest.raises(ValueError, match="tiny_shakespeare"):
        paths.dataset_dir("no_such_set")


def test_registry_matches_real_data(monkeypatch):
    monkeypatch.delenv("WORKBENCH_DATA", raising=False)
    if not paths.data_root().is_dir():
        pytest.skip("shared data not present")
    for name in paths.DATASETS:
        assert paths.dataset_dir(name).is_dir()
