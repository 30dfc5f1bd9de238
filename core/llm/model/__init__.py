"""A language model as a grid network: arguments, RoPE, KV cache, the LLM layers, one module per
architecture family (llama, qwen, gemma3), the fused decode step and the loader."""
