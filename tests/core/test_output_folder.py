"""core/io/output_folder.py: the one rule for a folder written whole (a merged model).

Oracle: the rule as the module states it: new, empty or only-ours folders may be replaced; other
files need ``force``; an input, the home and working folders and any folder holding them never."""

from __future__ import annotations

import json
import re

import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.io.output_folder import MARKER, check_output_folder, marker_bytes


def refused(path, message: str, **kwargs) -> None:
    with pytest.raises(LoomConfigError, match=re.escape(message)):
        check_output_folder(path, **kwargs)


def test_new_empty_and_own_folders_may_be_replaced(tmp_path):
    assert check_output_folder(tmp_path / "new") == (tmp_path / "new").resolve()
    (tmp_path / "empty").mkdir()
    assert check_output_folder(tmp_path / "empty") == (tmp_path / "empty").resolve()
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text("{}")
    (own / MARKER).write_bytes(marker_bytes(["config.json"]))
    assert check_output_folder(own) == own.resolve()
    link = tmp_path / "link"
    link.symlink_to(own)
    assert check_output_folder(link) == own.resolve()  # the folder is replaced, the link stays


@pytest.mark.parametrize("marker, entries", [
    (None, "config.json"),  # no marker: nothing is ours
    ({"written_by": "someone else", "files": ["config.json"]}, ".loomlab-output.json, config.json"),
    ({"written_by": "Loom Lab", "files": ["other.json"]}, "config.json"),  # lists other files
    ({"written_by": "Loom Lab", "files": "config.json"}, ".loomlab-output.json, config.json"),
    ("[" * 100_000, ".loomlab-output.json, config.json"),  # too deep to parse: not ours
])
def test_a_folder_is_ours_only_when_its_marker_lists_each_file(tmp_path, marker, entries):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    if marker is not None:
        (out / MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    refused(out, f"{out} holds files Loom Lab did not write there ({entries}); writing the model would "
                 f"remove them: give a new or empty folder, or --force")
    assert check_output_folder(out, force=True) == out.resolve()


def test_a_subfolder_listed_in_the_marker_is_not_ours(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / MARKER).write_bytes(marker_bytes(["sub"]))
    refused(out, "holds files Loom Lab did not write there (sub)")


def test_many_foreign_files_are_counted(tmp_path):
    for i in range(5):
        (tmp_path / "out" / f"f{i}").mkdir(parents=True)
    refused(tmp_path / "out", "(f0, f1, f2 and 2 more)")


def test_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    refused(tmp_path / "file", f"{tmp_path / 'file'} exists and is not a folder", force=True)


def test_home_working_folder_inputs_and_their_parents_are_refused_even_forced(tmp_path, monkeypatch):
    home, work = tmp_path / "home" / "me", tmp_path / "work"
    home.mkdir(parents=True)
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    model = tmp_path / "models" / "a.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    cases = [("~", "is the home folder"), (home.parent, "holds the home folder"),
             (".", "is the working folder"), ("/", f"holds the input {model}"),
             (model.parent, f"holds the input {model}"), (model, "exists and is not a folder")]
    for path, why in cases:
        refused(path, f"{path} {why}", inputs=[model], force=True)
    refused(work / "..", f"{work / '..'} holds the home folder", force=True)  # no inputs given
    assert check_output_folder(home / "merged", inputs=[model]) == home / "merged"
