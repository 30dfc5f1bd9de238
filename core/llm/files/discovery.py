"""Finding local models: folders the user names, the Hugging Face hub cache, LM Studio's folders;
and :func:`resolve`, the one place a model name a user typed becomes a file or folder.

A model is a ``.gguf`` file (a split model's first file stands for all of its files), or a
Hugging Face directory (``config.json`` beside ``model.safetensors`` or a sharded
``model.safetensors.index.json``). Any layout is accepted:
flat, nested, symlinked (symlink loops are visited once). Each candidate gets a cheap check (a
GGUF file's 24-byte header and its architecture, an HF folder's config.json); one that fails is
still listed, with the reason in ``problem``, so that a listing can say why a file is not a model
or not one this build runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ...errors import LoomConfigError, ModelFormatError, ModelNotFoundError
from ...io.bounded_read import parse_json_text, read_small_bytes
from . import architectures, registry
from .gguf_file import check_header, leading_architecture
from .gguf_splits import first_split, split_parts
from .hf_files import CONFIG, INDEX, MAX_JSON_FILE_BYTES, SINGLE

MAX_DEPTH = 8
HEADER_READ_BYTES = 4096  # the fixed header and (in practice) the first metadata pair


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    kind: str  # "gguf" | "hf"
    source: str  # "builtin" | "folder" | "hf-cache" | "lmstudio"
    size: int  # bytes of weights on disk (0 for a built-in not yet fetched)
    fetched: bool = True
    problem: str = ""  # why this file or folder cannot be a model ("" when it passed the cheap check)


def default_roots() -> list[tuple[Path, str]]:
    """The places looked at when the user names none: HF hub cache and LM Studio's folders."""
    home = Path.home()
    hf_home = Path(os.environ.get("HF_HOME", home / ".cache" / "huggingface"))
    hf = Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub"))
    return [(hf, "hf-cache"),
            (home / ".lmstudio" / "models", "lmstudio"),
            (home / ".cache" / "lm-studio" / "models", "lmstudio")]


def builtin_entries() -> list[ModelEntry]:
    out = []
    for alias, m in registry.BUILTINS.items():
        fetched = registry.is_fetched(alias)
        out.append(ModelEntry(alias, registry.model_path(alias), "gguf", "builtin", m.size, fetched))
    return out


def discover(folders: Iterable[str | os.PathLike] = (), *, include_defaults: bool = True,
             include_builtins: bool = True) -> list[ModelEntry]:
    """Every model found, built-ins first, then by source and path; each path listed once.

    Files that look like models by name but fail the cheap check are included with their
    ``problem`` set; a folder that does not exist adds nothing.
    """
    roots = [(Path(f).expanduser(), "folder") for f in folders]
    if include_defaults:
        roots += default_roots()
    entries = builtin_entries() if include_builtins else []
    seen = {e.path.resolve() for e in entries if e.fetched}
    for root, source in roots:
        for entry in _scan(root, source):
            real = entry.path.resolve()
            if real not in seen:
                seen.add(real)
                entries.append(entry)
    return entries


def _scan(root: Path, source: str) -> Iterable[ModelEntry]:
    if root.is_file() and root.suffix.lower() == ".gguf":
        yield _gguf_entry(root, source)
        return
    if not root.is_dir():
        return
    visited: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        try:
            st = here.stat()
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in visited or len(here.relative_to(root).parts) > MAX_DEPTH:
            dirnames[:] = []  # a symlink loop, or too deep to be a model folder
            continue
        visited.add((st.st_dev, st.st_ino))
        dirnames.sort()
        names = set(filenames)
        if CONFIG in names and {SINGLE, INDEX} & names:
            yield ModelEntry(_hf_name(here, root), here, "hf", source,
                             sum(_size(here / n) for n in names if n.endswith(".safetensors")),
                             problem=_hf_problem(here))
        for name in sorted(filenames):
            if name.lower().endswith(".gguf") and first_split(here / name) == here / name:
                yield _gguf_entry(here / name, source)


def _gguf_entry(path: Path, source: str) -> ModelEntry:
    """A GGUF file, or a split model by its first file: named without the part, sized as all its
    parts, with the first part missing named as its problem."""
    parts = split_parts(path)
    missing = next((p.name for p in parts if not p.is_file()), "")
    problem = f"part {parts.index(path.with_name(missing)) + 1} of {len(parts)} is missing: {missing}" \
        if missing else _gguf_problem(path)
    name = path.stem if len(parts) == 1 else path.name[:-len("-00001-of-00000.gguf")]
    return ModelEntry(name, path, "gguf", source, sum(map(_size, parts)), problem=problem)


def _gguf_problem(path: Path) -> str:
    """Why ``path`` is not a GGUF model this build runs, judged by its fixed header and its first
    metadata pair (the architecture, where the file puts it first) alone: a listing must stay
    fast, and reading the metadata takes 50-140 ms for the built-ins."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_READ_BYTES)
            check_header(head, os.fstat(f.fileno()).st_size)
    except OSError as e:
        return f"cannot read: {e.strerror}"
    except ModelFormatError as e:
        return f"not a GGUF model: {e}"
    name = leading_architecture(head)
    return "" if name is None else architectures.unsupported(name)


def _hf_problem(folder: Path) -> str:
    """Why ``folder`` is not an HF model, judged by its config.json alone, read as the loader
    reads it: a regular file of at most :data:`MAX_JSON_FILE_BYTES` (a FIFO would block the
    listing, ``/dev/zero`` fill the memory)."""
    try:
        raw = read_small_bytes(folder / CONFIG, CONFIG, MAX_JSON_FILE_BYTES)
        config = parse_json_text(raw, CONFIG)
    except LoomConfigError as e:
        return str(e)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        return "config.json has no model_type"
    return architectures.unsupported(config["model_type"])


def _hf_name(path: Path, root: Path) -> str:
    """``org/name`` for the hub cache layout ``models--org--name/snapshots/<rev>``, else the folder."""
    for part in path.relative_to(root).parts if path != root else ():
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/")
    return path.name


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def resolve(name_or_path: str | os.PathLike, *, progress: Callable[[str, int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> Path:
    """The model file or folder meant by ``name_or_path``, tried in this order:

    1. a built-in alias: fetched into the cache first when it is not there (``progress`` and
       ``cancel`` as in :func:`registry.fetch`);
    2. an existing file or folder;
    3. the name ``loomlab models list`` shows for a model in the default folders (HF hub cache,
       LM Studio), e.g. ``HuggingFaceTB/SmolLM2-135M``.

    Anything else raises :class:`ModelNotFoundError` naming the built-ins and the folders
    searched; a name two different models share raises :class:`LoomConfigError` naming both.
    """
    name = str(name_or_path)
    if name in registry.BUILTINS:
        return registry.fetch(name, progress=progress, cancel=cancel)
    path = Path(name).expanduser()
    if path.exists():
        return path
    roots = default_roots()
    matches = [e.path for root, source in roots for e in _scan(root, source) if e.name == name]
    distinct = list(dict.fromkeys(p.resolve() for p in matches))
    if len(distinct) > 1:
        raise LoomConfigError(f"{len(distinct)} models are named {name!r} ({', '.join(map(str, matches))}); "
                              "give the path of the one you mean")
    if matches:
        return matches[0]
    raise ModelNotFoundError(name, list(registry.BUILTINS), [_home_relative(root) for root, _ in roots])


def in_file(error: ModelFormatError, path: str | os.PathLike) -> ModelFormatError:
    """``error``, about the contents of the model at ``path``, saying which file it is about: the
    readers name only the field and byte offset (``magic at byte 0: ...``)."""
    if str(path) in str(error):
        return error
    return ModelFormatError(f"{path}: {error.field}", error.detail, error.offset)


def _home_relative(path: Path) -> str:
    """``~/.cache/...`` rather than ``/home/someone/.cache/...``: shorter, and what people type."""
    try:
        return str(Path("~") / path.relative_to(Path.home()))
    except ValueError:
        return str(path)
