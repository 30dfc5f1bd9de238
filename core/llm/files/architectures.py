"""The architecture names (GGUF ``general.architecture``, config.json ``model_type``) that the
model floor builds, kept here so that a listing can tell a file it cannot run before anything
loads it; ``model.loader.ARCHITECTURES`` maps each one to its module (a test keeps them equal)."""

SUPPORTED: frozenset[str] = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text",
                                       "qwen3moe", "qwen3_moe", "mixtral", "bert", "nomic_bert",
                                       "nomic-bert", "phi3", "granite", "smollm3", "gemma2", "olmo2"})


def unsupported(name: str) -> str:
    """Why a model of architecture ``name`` cannot run here ("" when it can)."""
    if name in SUPPORTED:
        return ""
    return f"architecture {name!r} is not supported (supported: {', '.join(sorted(SUPPORTED))})"
