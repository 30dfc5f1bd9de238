"""A model's tokenizer built and run in a child process.

The HF ``tokenizers`` library builds its BPE model in one call that holds the GIL: ~35 ms for
SmolLM2's 49k vocabulary, ~0.9 s for Gemma's 262k one (plus its 514k merges). A program with a
GUI thread cannot afford that freeze, so :class:`TokenizerProcess` reads and builds the tokenizer
in ``python -m loomlab.core.llm.text.tokenizer_process`` and asks it for every encode and decode.
It has the public interface of :class:`~loomlab.core.llm.text.tokenizer.Tokenizer`; a call costs a
pipe round trip (tens of microseconds), while generating a token takes milliseconds.

The protocol is length-prefixed JSON over the child's stdin and stdout, one request and one
reply at a time: first ``{"gguf": path}`` or ``{"hf": path}``, answered by the vocabulary facts;
then ``{"method": name, "args": [...], "kwargs": {...}}``, answered by ``{"ok": result}`` or
``{"error": {...}}``, which the caller gets back as the same typed error. End of input ends it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...errors import EngineProcessError, LoomConfigError
from ...pipe_messages import error_from, error_payload, receive, send
from .tokenizer import StreamDecoder, Tokenizer

BUILD_TIMEOUT_S = 300.0  # reading and building Gemma's tokenizer takes ~2.5 s on a 2-core machine
CALL_TIMEOUT_S = 120.0  # encoding a whole book takes seconds; a silent child longer than this is stuck
_METHODS = frozenset({"encode", "encode_pieces", "special_spans", "decode", "decode_batch", "id_to_token",
                      "token_to_id"})


class TokenizerProcess:
    """The tokenizer of the model at ``path`` (a GGUF file or an HF directory), in a child process.

    The child starts at once and builds while the caller goes on (loading the weights, say);
    the first use waits for it. Thread-safe: one request at a time. ``close()`` ends the child
    (so does this process exiting: the child stops at the end of its input).
    """

    def __init__(self, path: str | os.PathLike[str]):
        path = Path(path)
        self.path = path
        self._lock = threading.Lock()
        self._info: dict[str, Any] | None = None
        self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, bufsize=0)
        # also run if the object is dropped unclosed, or at exit: no child outlives its use
        self._stop = weakref.finalize(self, _stop, self._proc)
        try:
            send(self._proc.stdin, {"hf" if path.is_dir() else "gguf": str(path)})
        except OSError:  # the child died at once; the first use reports how
            pass

    # ---- the Tokenizer interface ------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False, *,
               allow_special: bool = False) -> list[int]:
        return self._call("encode", text, add_special_tokens, allow_special=allow_special)

    def encode_pieces(self, pieces) -> list[int]:
        return self._call("encode_pieces", list(pieces))

    def special_spans(self, text: str) -> list[tuple[int, int, int]]:
        return [tuple(span) for span in self._call("special_spans", text)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._call("decode", list(ids), skip_special_tokens)

    def decode_batch(self, id_lists, skip_special_tokens: bool = False) -> list[str]:
        return self._call("decode_batch", [list(ids) for ids in id_lists], skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        return self._call("id_to_token", i)

    def token_to_id(self, token: str) -> int | None:
        return self._call("token_to_id", token)

    def is_special(self, i: int) -> bool:
        return i in self.special_ids

    @property
    def special_ids(self) -> frozenset[int]:
        return self._facts()["special_ids"]

    @property
    def vocab_size(self) -> int:
        return self._facts()["vocab_size"]

    @property
    def bos_id(self) -> int | None:
        return self._facts()["bos_id"]

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._facts()["eos_ids"]

    @property
    def pad_id(self) -> int | None:
        return self._facts()["pad_id"]

    @property
    def unk_id(self) -> int | None:
        return self._facts()["unk_id"]

    # ---- the child ----------------------------------------------------------------------------
    def wait_ready(self) -> TokenizerProcess:
        """Wait until the child has built the tokenizer; raises its error if it could not."""
        self._facts()
        return self

    def close(self) -> None:
        """End the child (idempotent). Later calls raise :class:`EngineProcessError`."""
        self._stop()

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def _facts(self) -> dict[str, Any]:
        with self._lock:
            if self._info is None:
                info = self._receive(BUILD_TIMEOUT_S)
                info["special_ids"] = frozenset(info["special_ids"])
                info["eos_ids"] = frozenset(info["eos_ids"])
                self._info = info
            return self._info

    def _call(self, method: str, *args, **kwargs) -> Any:
        self._facts()
        try:
            request = json.dumps({"method": method, "args": args, "kwargs": kwargs}, default=_plain)
        except (TypeError, ValueError) as e:
            raise LoomConfigError(f"tokenizer {method}: {e}") from None
        with self._lock:
            try:
                send(self._proc.stdin, request)
            except (OSError, ValueError):  # a broken pipe, or closed by close()
                raise self._ended() from None
            return self._receive(CALL_TIMEOUT_S)

    def _receive(self, timeout: float) -> Any:
        if self._proc.returncode is not None or self._proc.stdout.closed:
            raise self._ended()
        try:
            reply = receive(self._proc.stdout, timeout, WHO)
        except TimeoutError:
            self._proc.kill()
            self._proc.wait()
            raise EngineProcessError(f"the tokenizer process for {self.path} gave no answer in "
                                     f"{timeout:g} s and was stopped") from None
        if reply is None:
            raise self._ended()
        if "error" in reply:
            raise error_from(reply["error"], WHO)
        return reply["ok"]

    def _ended(self) -> EngineProcessError:
        code = self._proc.poll()
        if code is None:
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return EngineProcessError(f"the tokenizer process for {self.path} has ended (exit code {code})")

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return f"TokenizerProcess({str(self.path)!r}, {state})"


def _stop(proc: subprocess.Popen) -> None:
    if proc.returncode is None:
        try:
            proc.stdin.close()  # end of input: the child leaves its loop
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    proc.stdin.close()
    proc.stdout.close()


# ---- wire format ---------------------------------------------------------------------------------

WHO = "tokenizer process"


def _plain(value: Any) -> Any:
    """numpy ids (what sampling returns) as JSON numbers."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a text, a token id or a list of them")


# ---- the child's side ----------------------------------------------------------------------------

def _build(source: dict[str, str]) -> Tokenizer:
    if "hf" in source:
        return Tokenizer.from_file(source["hf"])
    from ..files.gguf_file import open_gguf
    from ..files.gguf_splits import first_split

    gguf = open_gguf(first_split(Path(source["gguf"])))  # a split model's metadata is in its first file
    try:
        return Tokenizer.from_gguf_metadata(gguf.metadata)
    finally:
        gguf.close()


def _facts_of(tok: Tokenizer) -> dict[str, Any]:
    return {"vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_ids": sorted(tok.eos_ids),
            "pad_id": tok.pad_id, "unk_id": tok.unk_id, "special_ids": sorted(tok.special_ids)}


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer requests from ``inp`` on ``out`` until ``inp`` ends."""
    source = receive(inp, who=WHO)
    if source is None:
        return
    try:
        tok = _build(source)
    except Exception as e:  # every failure goes back to the parent, typed, never a silent exit
        send(out, {"error": error_payload(e)})
        return
    send(out, {"ok": _facts_of(tok)})
    while (request := receive(inp, who=WHO)) is not None:
        method = request.get("method")
        try:
            if method not in _METHODS:
                raise LoomConfigError(f"the tokenizer has no method {method!r}")
            result = getattr(tok, method)(*request.get("args", ()), **request.get("kwargs", {}))
        except Exception as e:
            send(out, {"error": error_payload(e)})
        else:
            send(out, {"ok": result}, default=_plain)


def main() -> None:
    out = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol's channel
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the protocol
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
