"""Typed errors raised by the engine."""

from __future__ import annotations


class LoomError(Exception):
    """Base class of every error the engine raises on purpose."""


class LoomFormatError(LoomError, ValueError):
    """A network file (Loom JSON or checkpoint) is malformed.

    ``path`` is the JSON path of the culprit (``$.layers[3].weights``) so a user can find it.
    """

    def __init__(self, path: str, message: str):
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}")


class LoomShapeError(LoomError, ValueError):
    """An input tensor does not fit the layer that receives it."""


class LoomConfigError(LoomError, ValueError):
    """A parameter passed to the engine (training config, dtype name, ...) is invalid."""


class ModelFormatError(LoomError, ValueError):
    """A model file (GGUF, safetensors, HF config) is malformed.

    ``field`` names what was wrong and ``offset`` the byte offset in the file, when known.
    """

    def __init__(self, field: str, message: str, offset: int | None = None):
        self.field = field
        self.offset = offset
        self.detail = message
        where = f"{field}" + (f" at byte {offset}" if offset is not None else "")
        super().__init__(f"{where}: {message}")


class EmbeddingModelError(LoomConfigError):
    """An embedding model (an encoder such as BERT) was asked to generate text: it only computes
    embeddings."""


class ModelFetchError(LoomError):
    """A built-in model could not be fetched (network, pip, checksum) or was cancelled."""


class EngineProcessError(LoomError):
    """A helper process of the engine (a model's tokenizer process) ended, hung or broke its protocol."""


class ModelNotFoundError(LoomConfigError):
    """A model name that names nothing: not a built-in alias, not a file or folder, not a model
    found in the folders searched. The message names the built-ins and those folders.

    ``searched`` is None when only the built-ins were asked about (fetching by alias).
    """

    def __init__(self, name: str, builtins: list[str], searched: list[str] | None):
        self.name = name
        self.builtins = builtins
        self.searched = searched
        if searched is None:
            message = f"no built-in model {name!r}; built-in: {', '.join(builtins)}"
        else:
            where = f", and no model of that name in {', '.join(searched)}" if searched else ""
            message = (f"no model {name!r}: not a built-in ({', '.join(builtins)}), no file or folder "
                       f"of that name{where}; `loomlab models list` shows the models found")
        super().__init__(message)


class LoomCancelled(LoomError):
    """Long work that has no partial result (a merge, a DNA sketch) was stopped by its ``cancel``."""


class InspectError(LoomConfigError):
    """An inspection asked of a model or a sequence it cannot apply to (an embedding model, a
    layer or head the model does not have, prompts of unequal length to patch between)."""
