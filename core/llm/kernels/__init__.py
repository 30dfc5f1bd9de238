"""The ground floor of the language models: numba kernels over GGUF's quantized blocks (one format
in one place), the 8-bit-activation products, attention, norms and the MLP, the thread pacing
they share, and block-format morphs. Imports nothing else from ``loomlab.core.llm``."""

from ...numba_cache import install

install()  # before any kernel here is defined: their cache follows the files they take code from
