"""Length-prefixed JSON messages between the engine and its child processes (the tokenizer
process, the evolution run process): a 4-byte big-endian length, then that many bytes of JSON.

Only JSON crosses, never a pickle, so a broken or hostile peer can send wrong values but never
code. A torn or oversized message raises :class:`EngineProcessError`; an error raised in the
child travels back as a payload and is raised again, typed, in the parent.
"""

from __future__ import annotations

import json
import os
import select
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

from .errors import EngineProcessError, LoomConfigError, LoomError, ModelFormatError

_LENGTH = struct.Struct(">I")
MAX_MESSAGE_BYTES = 1 << 30  # a message longer than this is no child's: the stream is broken


def send(stream: BinaryIO, message: Any, default: Callable[[Any], Any] | None = None) -> None:
    """Write ``message`` (a JSON value, or a JSON text already) and flush; ``default`` as json's."""
    data = (message if isinstance(message, str) else json.dumps(message, default=default)).encode()
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def receive(stream: BinaryIO, timeout: float | None = None, who: str = "child process") -> Any:
    """The next message, or None at a clean end of the stream. A torn or oversized message
    raises :class:`EngineProcessError`; ``timeout`` seconds of silence raise TimeoutError."""
    head = _read_exactly(stream, _LENGTH.size, timeout, who)
    if head is None:
        return None
    (size,) = _LENGTH.unpack(head)
    if size > MAX_MESSAGE_BYTES:
        raise EngineProcessError(f"{who} message of {size} bytes (limit {MAX_MESSAGE_BYTES})")
    body = _read_exactly(stream, size, timeout, who)
    if body is None:
        raise EngineProcessError(f"{who} stream ended inside a message")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EngineProcessError(f"{who} sent invalid JSON: {e}") from None


def readable(stream: BinaryIO, timeout: float) -> bool:
    """Whether ``stream`` has something to read (a message or its end) within ``timeout`` s."""
    return bool(select.select([stream.fileno()], [], [], timeout)[0])


def _read_exactly(stream: BinaryIO, n: int, timeout: float | None, who: str) -> bytes | None:
    chunks, got = [], 0
    fd = stream.fileno()
    while got < n:
        if timeout is not None and not select.select([fd], [], [], timeout)[0]:
            raise TimeoutError
        chunk = os.read(fd, n - got)
        if not chunk:
            if got:
                raise EngineProcessError(f"{who} stream ended inside a message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# Errors that travel back as themselves; anything else becomes an EngineProcessError.
_ERRORS = {cls.__name__: cls for cls in (LoomError, LoomConfigError, OSError, FileNotFoundError,
                                         IsADirectoryError, NotADirectoryError, PermissionError)}


def error_payload(e: Exception) -> dict[str, Any]:
    """``e`` as a message the parent turns back into an exception (:func:`error_from`)."""
    if isinstance(e, ModelFormatError):
        return {"kind": "ModelFormatError", "field": e.field, "detail": e.detail, "offset": e.offset}
    if _ERRORS.get(type(e).__name__) is type(e):
        return {"kind": type(e).__name__, "message": str(e)}
    return {"kind": "other", "message": f"{type(e).__name__}: {e}"}


def error_from(payload: dict[str, Any], who: str = "child process") -> Exception:
    kind = payload.get("kind")
    if kind == "ModelFormatError":
        return ModelFormatError(payload["field"], payload["detail"], payload["offset"])
    if kind in _ERRORS:
        return _ERRORS[kind](payload["message"])
    return EngineProcessError(f"the {who} failed: {payload.get('message')}")
