"""The engine's kernels are cached under a stamp of every engine file with numba code, so a kernel
whose inlined code changed in another file is compiled again (numba alone looks at the kernel's
own file). Oracle: sha256 of the files, computed here."""

from __future__ import annotations

import hashlib
import os

from numba.core.caching import CacheImpl

from loomlab.core import numba_cache, stats_kernel
from loomlab.core.llm.kernels import quant
from loomlab.core.llm.model import fused_decode


def locator(dispatcher):
    return dispatcher._cache._impl._locator


def test_the_stamp_is_the_contents_of_the_engines_kernel_files():
    files = numba_cache.kernel_sources()
    assert numba_cache.ROOT / "llm" / "model" / "fused_decode.py" in files
    assert numba_cache.ROOT / "llm" / "kernels" / "quant_int8_superblocks.py" in files
    assert all(b"numba" in f.read_bytes() for f in files)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.parent.name}/{f.name}\0".encode() + f.read_bytes())
    assert numba_cache.engine_stamp() == digest.hexdigest()


def test_a_change_of_contents_changes_the_stamp_and_a_touch_does_not(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import numba\n")
    b.write_text("x = 1\n")
    before = numba_cache.sources_stamp((a, b))
    os.utime(a, (0, 0))
    assert numba_cache.sources_stamp((a, b)) == before
    b.write_text("x = 2\n")
    assert numba_cache.sources_stamp((a, b)) != before


def test_the_language_model_kernels_carry_the_stamp_and_others_keep_numbas():
    for kernel in (quant._block_matmul, fused_decode._step_parallel):
        found = locator(kernel)
        assert type(found).__name__.startswith("Engine")
        assert found.get_source_stamp()[1] == numba_cache.engine_stamp()
    assert not type(locator(stats_kernel.float32_stats)).__name__.startswith("Engine")
    numba_cache.install()  # a second install adds nothing
    assert sum(getattr(c, "engine", False) for c in CacheImpl._locator_classes) == \
        len(CacheImpl._locator_classes) // 2
