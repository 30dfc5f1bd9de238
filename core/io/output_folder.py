"""The one rule for a folder Loom Lab writes whole (a merged model): what may be replaced.

Replacing a folder removes what was in it, so it is allowed only for a new or empty folder, or one
holding nothing but what Loom Lab wrote there (a marker file, :data:`MARKER`, lists those files).
``force`` also allows a folder holding other files, but never one of the inputs, a folder that
holds an input, the home folder, the working folder or a folder holding either of those: removing
them would lose what the command reads or what the user keeps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import LoomConfigError
from .bounded_read import parse_json_text, read_small_text

MARKER = ".loomlab-output.json"
WRITTEN_BY = "Loom Lab"
MARKER_LIMIT = 64 * 1024  # bytes: a marker lists a few file names
SHOWN = 3  # foreign entries a refusal names


def marker_bytes(files: Iterable[str]) -> bytes:
    """The marker of a folder holding ``files`` (names, the marker itself not among them)."""
    return json.dumps({"written_by": WRITTEN_BY, "files": sorted(files)}, indent=2).encode()


def check_output_folder(target: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), *,
                        force: bool = False) -> Path:
    """The resolved folder to write in place of ``target`` (symlinks followed), once it is one that
    may be replaced (module doc); ``inputs`` are the paths the command reads.

    Raises:
        LoomConfigError: ``target`` is a file, an input or holds one, is the home or working folder
            or holds one of them, or (without ``force``) holds files Loom Lab did not write there.
    """
    folder = Path(target).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise LoomConfigError(f"{target} exists and is not a folder; give a folder to write the model into")
    _check_not_kept(folder, target, inputs)
    if not force and folder.is_dir():
        foreign = _foreign_entries(folder)
        if foreign:
            shown = ", ".join(foreign[:SHOWN]) + (f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN
                                                   else "")
            raise LoomConfigError(f"{target} holds files Loom Lab did not write there ({shown}); writing the "
                                  f"model would remove them: give a new or empty folder, or --force to "
                                  f"replace the folder and everything in it")
    return folder


def _check_not_kept(folder: Path, target, inputs: Iterable[str | os.PathLike]) -> None:
    """Refuse a folder that is or holds an input, the home folder or the working folder."""
    found = [(Path(p).expanduser(), p) for p in inputs]
    kept = [(path.resolve(), f"the input {p}") for path, p in found if path.exists()]
    kept += [(Path.home().resolve(), "the home folder"), (Path.cwd().resolve(), "the working folder")]
    for path, what in kept:
        if path == folder or folder in path.parents:
            where = "is" if path == folder else "holds"
            raise LoomConfigError(f"{target} {where} {what}; writing the model there would remove it: "
                                  f"give a new folder")


def _foreign_entries(folder: Path) -> list[str]:
    """The entries of ``folder`` its marker does not list (all of them without a marker)."""
    names = sorted(entry.name for entry in folder.iterdir())
    ours = _marked_files(folder) if MARKER in names else set()
    return [name for name in names if name not in ours]


def _marked_files(folder: Path) -> set[str]:
    """The files the marker lists, and the marker; nothing when it is not a marker Loom Lab wrote."""
    try:
        value = parse_json_text(read_small_text(folder / MARKER, "the output marker", MARKER_LIMIT),
                                "the output marker")
    except LoomConfigError:
        return set()
    if not isinstance(value, dict) or value.get("written_by") != WRITTEN_BY:
        return set()
    files = value.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return set()
    return {f for f in files if (folder / f).is_file() and not (folder / f).is_symlink()} | {MARKER}
