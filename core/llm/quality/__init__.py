"""Making a model smaller or new and measuring what it costs: quantization recipes, their drift
(KL divergence against the original), GGUF export and merges of two models."""
