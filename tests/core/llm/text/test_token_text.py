"""A token read alone shows its incomplete UTF-8 bytes as <0xNN> (not the replacement character),
for byte-level BPE spellings (GPT-2's byte table) and SentencePiece byte tokens alike."""

from __future__ import annotations

from loomlab.core.llm.text.token_text import token_bytes, token_text


class Vocabulary:
    """decode and id_to_token as a tokenizer has them, over spellings with known bytes."""

    def __init__(self, spellings: list[str], raw: list[bytes]):
        self.spellings, self.raw = spellings, raw

    def id_to_token(self, i: int) -> str:
        return self.spellings[i]

    def decode(self, ids) -> str:
        return b"".join(self.raw[i] for i in ids).decode("utf-8", errors="replace")


def test_byte_level_bpe_pieces_of_a_character_show_their_bytes():
    # "日" is E6 97 A5 in UTF-8; GPT-2's table spells E6 "æ", 97 "Ĺ" and A5 "¥", a space "Ġ"
    vocab = Vocabulary(["æĹ", "¥", "Ġcaf", "Ã©"], [b"\xe6\x97", b"\xa5", b" caf", "é".encode()])
    assert [token_text(vocab, i) for i in range(4)] == ["<0xE6><0x97>", "<0xA5>", " caf", "é"]


def test_a_sentencepiece_byte_token_and_a_mixed_piece():
    vocab = Vocabulary(["<0xE6>", "ĠaÃ"], [b"\xe6", b" a\xc3"])  # " a" and the first byte of "é"
    assert token_text(vocab, 0) == "<0xE6>"
    assert token_text(vocab, 1) == " a<0xC3>"


def test_every_byte_has_one_gpt2_spelling():
    spelled = {c: token_bytes(c) for c in map(chr, range(0x200)) if token_bytes(c) is not None}
    assert sorted(spelled.values()) == [bytes([b]) for b in range(256)]
