"""A token as a person reads it alone: its text, with each byte that is not whole UTF-8 on its own
written ``<0xNN>`` (a byte-level BPE token holding part of a character such as ``æ``, or a
SentencePiece byte token) instead of the replacement character decoding gives it."""

from __future__ import annotations

import codecs
import re
from functools import cache

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_HEX = "loomlab-token-hex"


def _hex_bytes(error: UnicodeDecodeError) -> tuple[str, int]:
    return "".join(f"<0x{b:02X}>" for b in error.object[error.start:error.end]), error.end


codecs.register_error(_HEX, _hex_bytes)


def token_text(tokenizer, token_id: int) -> str:
    """Token ``token_id`` of ``tokenizer`` (``decode`` and ``id_to_token``, as core's tokenizers
    have) as text, its incomplete UTF-8 bytes as ``<0xNN>``."""
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    raw = token_bytes(tokenizer.id_to_token(token_id))
    return text if raw is None else raw.decode("utf-8", errors=_HEX)


def token_bytes(spelling: str) -> bytes | None:
    """The bytes a vocabulary spelling stands for: a SentencePiece byte token ``<0xE6>``, or a
    byte-level BPE piece (GPT-2's byte-to-character table, ``Ã¦``); None for anything else."""
    byte = _BYTE_TOKEN.fullmatch(spelling)
    if byte:
        return bytes([int(byte[1], 16)])
    table = _byte_of_char()
    if all(c in table for c in spelling):
        return bytes(table[c] for c in spelling)
    return None


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable bytes stand for themselves, the others for
    the characters from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars
