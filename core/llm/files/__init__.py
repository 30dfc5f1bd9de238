"""Model files on disk: GGUF and Hugging Face safetensors readers (memory-mapped), the registry
of built-in models, the discovery of local ones, and the weights a model is built from."""
