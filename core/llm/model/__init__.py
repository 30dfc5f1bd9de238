"""A language model as a grid network: arguments, RoPE, KV cache, the LLM layers, one module per
architecture family (llama, qwen, gemma3), the fused decode step and the loader."""

from ...numba_cache import install

install()  # before any kernel here is defined: their cache follows the files they take code from
