"""Tokenizers for LLMs, on HF ``tokenizers``: from a tokenizer.json or built from a GGUF vocabulary.

A GGUF file carries its vocabulary as metadata (``tokenizer.ggml.*``). Two kinds are built here:

* ``gpt2``: byte-level BPE from ``tokens`` + ``merges``, split first by the pre-tokenizer that
  ``tokenizer.ggml.pre`` names (SmolLM2's ``smollm`` splits digits one by one, Llama 3's
  ``llama-bpe`` and Qwen's ``qwen2`` use their own regexes).
* ``llama`` (SentencePiece BPE; Gemma uses it too): spaces become ``▁`` (and, with
  ``add_space_prefix``, each run of text starts with one), then the adjacent pair
  whose concatenation is the best-scored vocabulary piece is merged, again and again; a
  character not in the vocabulary falls back to its UTF-8 bytes (``<0xNN>`` tokens). That is an
  HF BPE whose merges are every (left, right) split of a normal piece, ranked by the piece's score.
* ``bert`` (WordPiece, BERT-family embedding models): llama.cpp's converter writes a word-initial
  piece as ``▁piece`` and a continuation ``##piece`` as ``piece``; turned back, they make BERT's
  WordPiece, after BERT's normaliser (lowercase, accents stripped, as llama.cpp lowercases every
  text) and its split at whitespace and punctuation. Every text is wrapped in CLS ... SEP.

Token types (llama.cpp's numbering): control, unknown and unused tokens are *special* (matched in
text only when asked for, see :meth:`Tokenizer.encode`); user-defined ones (Gemma's runs of
spaces, newlines and tabs, HTML tags) are plain added tokens matched in the raw text before the
model, as SentencePiece does.

A tokenizer.json can describe a tokenizer that the Rust library cannot run (a Split regex that
backtracks past Oniguruma's limit, a TemplateProcessing naming a token the vocabulary lacks): the
library then panics, and pyo3 raises ``PanicException``, a BaseException. Every call into it is
guarded, so that a panic is a :class:`~loomlab.core.errors.ModelFormatError` naming the file, and
a new tokenizer encodes and decodes :data:`PROBE_TEXT` before it is handed out.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE, WordPiece

from ...errors import LoomConfigError, ModelFormatError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPECIAL_TYPES = (UNKNOWN, CONTROL, UNUSED)
# Control tokens that end a turn in common chat formats: generation stops on them too, as in
# llama.cpp and in the models' HF generation configs (Gemma's lists <end_of_turn>).
END_OF_TURN_TEXTS = frozenset({"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                               "<|endoftext|>", "<|end_of_text|>", "<EOT>", "<end_of_utterance>"})
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# A UTF-8 character spans at most 4 bytes; a stream never needs to hold more tokens than that
# to complete one, so after this many it gives up waiting and emits what it has.
_MAX_PENDING_TOKENS = 8
# What a new tokenizer must encode (with and without the model's BOS/EOS) and decode: words,
# digits, punctuation, runs of one letter, whitespace and characters outside ASCII.
PROBE_TEXT = ("Hello, world! It's 2024-05-17: 3.14 + 42 = 45.14 ... aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab "
              "\t\n  ÿé漢字 😀 <|im_start|> </s>")


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])


def _regex_then_byte_level(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# ``tokenizer.ggml.pre`` -> pre-tokenizer. "default" is GPT-2's regex, as transformers reads it.
GPT2_PRE_TOKENIZERS = {
    "default": _byte_level,
    "gpt2": _byte_level,
    "smollm": _digits_then_byte_level,
    "starcoder": _digits_then_byte_level,
    "llama-bpe": lambda: _regex_then_byte_level(_LLAMA3_REGEX),
    "llama3": lambda: _regex_then_byte_level(_LLAMA3_REGEX),
    "qwen2": lambda: _regex_then_byte_level(_QWEN2_REGEX),
}


class Tokenizer:
    """Text <-> token ids for one model.

    Build it with :meth:`from_file` (an HF tokenizer.json) or :meth:`from_gguf_metadata`.
    Thread-safe: encoding takes a lock because the special-token switch lives on the HF object.
    """

    def __init__(self, hf: HFTokenizer, *, bos_id: int | None, eos_ids: Iterable[int],
                 pad_id: int | None = None, unk_id: int | None = None,
                 aliases: Mapping[int, int] | None = None, vocab_size: int | None = None,
                 source: str = "tokenizer"):
        self._hf = hf
        self.source = source  # what a ModelFormatError names: the tokenizer.json, or GGUF metadata
        self._lock = threading.Lock()
        self._aliases = dict(aliases or {})  # duplicate vocabulary entries -> the id HF knows
        self._special = frozenset(i for i, tok in hf.get_added_tokens_decoder().items() if tok.special)
        self._special |= {a for a, i in self._aliases.items() if i in self._special}
        self.vocab_size = vocab_size or hf.get_vocab_size(with_added_tokens=True)
        self._pre = hf.pre_tokenizer
        self._continuation_pre = _continuation_pre_tokenizer(hf.pre_tokenizer)
        self.bos_id = bos_id
        self.eos_ids = frozenset(eos_ids)
        self.pad_id = pad_id
        self.unk_id = unk_id
        self._probe()

    def _probe(self) -> None:
        """Encode and decode :data:`PROBE_TEXT`: a tokenizer the library cannot run fails here, at
        load, rather than at some user's first message."""
        for add_special_tokens in (False, True):
            self.decode(self.encode(PROBE_TEXT, add_special_tokens))

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load an HF ``tokenizer.json`` (or a directory holding one).

        BOS/EOS come from the sibling ``tokenizer_config.json`` (``bos_token``, ``eos_token``),
        ``generation_config.json`` and ``config.json`` (``eos_token_id``, int or list), where present.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise ModelFormatError(str(path), f"missing; {_found_files(path.parent)}")
        with _rust_calls(str(path), "reading it"):
            try:
                hf = HFTokenizer.from_file(str(path))
            except Exception as e:  # tokenizers raises a bare Exception for bad JSON or unknown parts
                raise ModelFormatError(str(path), f"not a valid tokenizer.json: {e}") from None
        folder = path.parent
        tok_config = _read_json(folder / "tokenizer_config.json")
        configs = [_read_json(folder / "generation_config.json"), _read_json(folder / "config.json")]
        bos_id = _token_id(hf, tok_config.get("bos_token"))
        eos_ids = {i for i in [_token_id(hf, tok_config.get("eos_token"))] if i is not None}
        for config in configs:
            eos_ids.update(_config_ids(config, "eos_token_id", hf))
            if bos_id is None:
                bos_id = next(iter(_config_ids(config, "bos_token_id", hf)), None)
        return cls(hf, bos_id=bos_id, eos_ids=eos_ids, pad_id=_token_id(hf, tok_config.get("pad_token")),
                   unk_id=_token_id(hf, tok_config.get("unk_token")), source=str(path))

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer a GGUF file describes in its ``tokenizer.ggml.*`` metadata.

        ``meta`` maps keys to Python values; arrays may be lists or numpy arrays. A missing or
        inconsistent key raises :class:`ModelFormatError` naming it.
        """
        kind = _get(meta, "tokenizer.ggml.model", str)
        tokens = _tokens(meta)
        n = len(tokens)
        ids = {name: _optional_id(meta, f"tokenizer.ggml.{name}_token_id", n)
               for name in ("bos", "eos", "unknown", "padding", "eot", "eom", "cls", "seperator")}
        types = _token_types(meta, n, [i for i in ids.values() if i is not None])
        if kind not in _GGUF_KINDS:
            raise ModelFormatError("tokenizer.ggml.model", f"unsupported tokenizer model {kind!r}; "
                                   "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE) and "
                                   "'bert' (WordPiece)")
        build, add_bos_default = _GGUF_KINDS[kind]
        vocab, aliases = _vocab(tokens)
        hf = build(meta, tokens, types, vocab, ids["unknown"])
        _add_typed_tokens(hf, tokens, types)
        if kind == "bert":  # llama.cpp wraps every text in CLS ... SEP (its BOS and EOS, when not named)
            first, last = _first_id(ids, "cls", "bos"), _first_id(ids, "seperator", "eos")
        else:
            first = ids["bos"] if _get(meta, "tokenizer.ggml.add_bos_token", bool, add_bos_default) else None
            last = ids["eos"] if _get(meta, "tokenizer.ggml.add_eos_token", bool, False) else None
        hf.post_processor = _template_processing(tokens, first, last)
        eos_ids = {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
        eos_ids |= {i for i in np.flatnonzero(types == CONTROL).tolist() if tokens[i] in END_OF_TURN_TEXTS}
        return cls(hf, bos_id=ids["bos"], eos_ids=eos_ids, pad_id=ids["padding"], unk_id=ids["unknown"],
                   aliases=aliases, vocab_size=n, source="tokenizer.ggml.*")

    # ---- text <-> ids ---------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False, *,
               allow_special: bool = False) -> list[int]:
        """Token ids of ``text``.

        ``add_special_tokens`` adds what the model wants around a sequence (BOS for Gemma).
        Text that spells a special token (``"<|im_start|>"``) stays plain text unless
        ``allow_special`` is True: chat templates ask for that for their own text only.
        """
        return self._encoding(text, add_special_tokens, allow_special).ids

    def encode_pieces(self, pieces: Sequence[str | int]) -> list[int]:
        """Ids of a sequence given as plain-text pieces and token ids, as if it were one text.

        Strings never yield special tokens; ints are taken as they are. Each string is encoded
        as that run of text would be inside the whole text (a tokenizer.json Metaspace that puts
        "▁" only at the start of a text gives it to the opening string alone).
        """
        ids: list[int] = []
        with self._lock, self._rust("encoding"):
            self._hf.encode_special_tokens = True
            try:
                for k, piece in enumerate(pieces):
                    if not isinstance(piece, str):
                        ids.append(self._valid_id(piece))
                        continue
                    if k > 0 and self._continuation_pre is not None:
                        self._hf.pre_tokenizer = self._continuation_pre
                    ids.extend(self._hf.encode(piece, add_special_tokens=False).ids)
            finally:
                self._hf.pre_tokenizer = self._pre
        return ids

    def special_spans(self, text: str) -> list[tuple[int, int, int]]:
        """``(start, end, id)`` of each special token spelled in ``text``, as character offsets."""
        enc = self._encoding(text, False, True)
        return [(start, end, i) for i, (start, end) in zip(enc.ids, enc.offsets, strict=True)
                if i in self._special]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens are written out unless ``skip_special_tokens``."""
        ids = self._checked_ids(ids)
        with self._rust("decoding"):
            return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_batch(self, id_lists: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        """The text of each list of ids, as :meth:`decode` gives it, in one call (one pipe round
        trip for :class:`~.tokenizer_process.TokenizerProcess`)."""
        checked = [self._checked_ids(ids) for ids in id_lists]
        with self._rust("decoding"):
            return self._hf.decode_batch(checked, skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
        """An incremental detokenizer: push ids one at a time, get text deltas back."""
        return StreamDecoder(self, skip_special_tokens)

    # ---- vocabulary ---------------------------------------------------------------------------

    def id_to_token(self, i: int) -> str:
        """The vocabulary spelling of token ``i`` (``"Ġthe"``, ``"▁the"``, ``"<0x0A>"``)."""
        return self._hf.id_to_token(self._checked_ids([i])[0])

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary spelling, or None."""
        return self._hf.token_to_id(token)

    def is_special(self, i: int) -> bool:
        """True for control/unknown/unused tokens (BOS, EOS, turn markers...)."""
        return i in self._special

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    def to_json(self) -> str:
        """This tokenizer as an HF ``tokenizer.json`` text (what :meth:`from_file` reads); a GGUF
        vocabulary's duplicate spellings keep only the id HF knows them by."""
        return self._hf.to_str()

    def close(self) -> None:
        """Nothing to free (the HF tokenizer is plain memory); here so a model closes whichever
        tokenizer it has, this one or a :class:`~.tokenizer_process.TokenizerProcess`."""

    def _encoding(self, text: str, add_special_tokens: bool, allow_special: bool):
        if not isinstance(text, str):
            raise LoomConfigError(f"text to encode must be a str, not {type(text).__name__}")
        with self._lock, self._rust("encoding"):
            self._hf.encode_special_tokens = not allow_special
            return self._hf.encode(text, add_special_tokens=add_special_tokens)

    def _rust(self, doing: str):
        return _rust_calls(self.source, doing)

    def _valid_id(self, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < self.vocab_size:
            raise LoomConfigError(f"token id {i!r} is not in the vocabulary (0..{self.vocab_size - 1})")
        return int(i)

    def _checked_ids(self, ids: Sequence[int]) -> list[int]:
        """Valid ids, with duplicate vocabulary entries mapped to the id HF knows them by."""
        return [self._aliases.get(i, i) for i in map(self._valid_id, ids)]

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)})")


class StreamDecoder:
    """Turns a stream of token ids into text deltas without splitting a UTF-8 character.

    It decodes a short window of recent ids and emits only what the newest id added, holding back
    while the text ends in an incomplete character (U+FFFD). Decoding a window, not one id, keeps
    what depends on neighbours right (SentencePiece's leading space, byte-fallback sequences).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []  # the window: ids from the last emitted boundary on
        self._read = 0  # ids in the window whose text was already emitted

    def push(self, token_id: int) -> str:
        """Add one id; return the new text it completes ("" while a character is unfinished)."""
        self._ids.append(token_id)
        done, text = self._decode_both(self._ids[:self._read], self._ids)
        pending = len(self._ids) - self._read
        if len(text) <= len(done) or (text.endswith("\ufffd") and pending < _MAX_PENDING_TOKENS):
            return ""
        # Start the next window at the ids just emitted, so the next delta sees its left context.
        self._ids = self._ids[self._read:]
        self._read = len(self._ids)
        return text[len(done):]

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character shows as U+FFFD)."""
        done, text = self._decode_both(self._ids[:self._read], self._ids)
        self._ids, self._read = [], 0
        return text[len(done):]

    def _decode_both(self, done: list[int], ids: list[int]) -> tuple[str, str]:
        """The texts of the emitted ids and of the whole window, in one call: behind a tokenizer
        process each call is a pipe round trip, which wakes the child beside the decoding threads."""
        if not done:
            return "", self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""
        first, second = self._tok.decode_batch([done, ids], skip_special_tokens=self._skip)
        return first, second


@contextmanager
def _rust_calls(source: str, doing: str) -> Iterator[None]:
    """A panic of the Rust library inside the block as a :class:`ModelFormatError` naming ``source``."""
    try:
        yield
    except BaseException as e:  # pyo3's PanicException derives from BaseException, not Exception
        if type(e).__name__ != "PanicException":
            raise
        raise ModelFormatError(source, f"the tokenizer it describes failed while {doing}: {e}") from None


def _continuation_pre_tokenizer(pre) -> pre_tokenizers.PreTokenizer | None:
    """For text that follows a special token: a Metaspace that adds the leading space only at the
    start of the whole text ("first") must not add it to a later piece encoded on its own."""
    if isinstance(pre, pre_tokenizers.Metaspace) and pre.prepend_scheme == "first":
        return pre_tokenizers.Metaspace(replacement=pre.replacement, prepend_scheme="never", split=pre.split)
    return None


# ---- GGUF metadata ------------------------------------------------------------------------------

def _get(meta: Mapping[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in meta:
        if default is ...:
            raise ModelFormatError(key, "missing from the metadata")
        return default
    value = meta[key]
    if kind is bool and isinstance(value, np.bool_):
        value = bool(value)
    if kind is int and isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ModelFormatError(key, f"expected {kind.__name__}, found {type(value).__name__}")
    return value


def _tokens(meta: Mapping[str, Any]) -> list[str]:
    key = "tokenizer.ggml.tokens"
    tokens = meta.get(key)
    if not isinstance(tokens, Sequence) or isinstance(tokens, str) or not tokens:
        raise ModelFormatError(key, "missing or not a non-empty list of strings")
    if not all(isinstance(t, str) for t in tokens):
        raise ModelFormatError(key, "every token must be a string")
    return list(tokens)


def _optional_id(meta: Mapping[str, Any], key: str, n: int) -> int | None:
    i = _get(meta, key, int, None)
    if i is not None and not 0 <= i < n:
        raise ModelFormatError(key, f"token id {i} is outside the vocabulary of {n} tokens")
    return i


def _numbers(meta: Mapping[str, Any], key: str, n: int, dtype: type) -> np.ndarray | None:
    if key not in meta:
        return None
    try:
        values = np.asarray(meta[key], dtype=dtype)
    except (TypeError, ValueError):
        raise ModelFormatError(key, f"expected an array of {dtype.__name__}") from None
    if values.shape != (n,):
        raise ModelFormatError(key, f"has shape {values.shape}, expected one value per token ({n})")
    return values


def _token_types(meta: Mapping[str, Any], n: int, marked_ids: list[int]) -> np.ndarray:
    """The token types; without the key, every token is normal except the BOS/EOS/... ids."""
    types = _numbers(meta, "tokenizer.ggml.token_type", n, np.int64)
    if types is None:
        types = np.full(n, NORMAL, np.int64)
        types[marked_ids] = CONTROL
    return types


def _vocab(tokens: list[str]) -> tuple[dict[str, int], dict[int, int]]:
    """token -> first id, and duplicate ids -> that first id (some GGUF vocabularies repeat)."""
    vocab: dict[str, int] = {}
    aliases = {}
    for i, t in enumerate(tokens):
        first = vocab.setdefault(t, i)
        if first != i:
            aliases[i] = first
    return vocab, aliases


def _gpt2_tokenizer(meta: Mapping[str, Any], tokens: list[str], types: np.ndarray,
                    vocab: dict[str, int], unk_id: int | None) -> HFTokenizer:
    key = "tokenizer.ggml.merges"
    raw = _get(meta, key, Sequence)
    merges = []
    for line in raw:
        pair = line.split(" ") if isinstance(line, str) else ()
        if len(pair) != 2:
            raise ModelFormatError(key, f"merge {line!r} is not two tokens separated by one space")
        merges.append((pair[0], pair[1]))
    pre = _get(meta, "tokenizer.ggml.pre", str, "default")
    if pre not in GPT2_PRE_TOKENIZERS:
        raise ModelFormatError("tokenizer.ggml.pre", f"unsupported pre-tokenizer {pre!r}; "
                               f"supported: {sorted(GPT2_PRE_TOKENIZERS)}")
    hf = _bpe(vocab, merges, key)
    hf.pre_tokenizer = GPT2_PRE_TOKENIZERS[pre]()
    hf.decoder = decoders.ByteLevel()
    return hf


def _spm_tokenizer(meta: Mapping[str, Any], tokens: list[str], types: np.ndarray,
                   vocab: dict[str, int], unk_id: int | None) -> HFTokenizer:
    scores = _numbers(meta, "tokenizer.ggml.scores", len(tokens), np.float64)
    if scores is None:  # no scores: earlier pieces were learned first
        scores = -np.arange(len(tokens), dtype=np.float64)
    hf = _bpe(vocab, _spm_merges(tokens, types, scores), "tokenizer.ggml.scores",
              unk_token=tokens[unk_id] if unk_id is not None else None, byte_fallback=True)
    prefix = _get(meta, "tokenizer.ggml.add_space_prefix", bool, True)
    # As llama.cpp (and transformers' "legacy" Llama): every run of text between added tokens
    # gets SentencePiece's dummy "▁" prefix when the vocabulary asks for one.
    space = normalizers.Replace(" ", "▁")
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), space]) if prefix else space
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    hf.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return hf


def _spm_merges(tokens: list[str], types: np.ndarray, scores: np.ndarray) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, best-scored result first.

    SentencePiece merges whichever adjacent pair forms the highest-scored piece; a BPE that
    ranks merges by that score does the same. Ties go to the lower id (learned earlier).
    """
    normal = {t for t, kind in zip(tokens, types.tolist(), strict=True) if kind == NORMAL}
    ids, cuts = [], []  # each merge as (piece id, where it splits): Gemma 3 has 500k of them
    for i in np.flatnonzero(types == NORMAL).tolist():
        piece = tokens[i]
        for k in range(1, len(piece)):
            if piece[:k] in normal and piece[k:] in normal:
                ids.append(i)
                cuts.append(k)
    ids_a, cuts_a = np.array(ids, np.int64), np.array(cuts, np.int64)
    order = np.lexsort((cuts_a, ids_a, -scores[ids_a]))  # by score, then id, then the split
    return [(tokens[i][:k], tokens[i][k:]) for i, k in zip(ids_a[order].tolist(), cuts_a[order].tolist(),
                                                          strict=True)]


def _wordpiece_tokenizer(meta: Mapping[str, Any], tokens: list[str], types: np.ndarray,
                         vocab: dict[str, int], unk_id: int | None) -> HFTokenizer:
    """BERT's WordPiece over the vocabulary llama.cpp's converter wrote: its ``▁piece`` back to
    ``piece`` and its continuation ``piece`` back to ``##piece``; control tokens as they are."""
    words = [t if kind in _SPECIAL_TYPES else t[1:] if t.startswith("▁") else "##" + t
             for t, kind in zip(tokens, types.tolist(), strict=True)]
    unk = tokens[unk_id] if unk_id is not None else "[UNK]"
    hf = HFTokenizer(WordPiece(_vocab(words)[0], unk_token=unk, continuing_subword_prefix="##"))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    return hf


def _first_id(ids: dict[str, int | None], *names: str) -> int | None:
    return next((ids[n] for n in names if ids[n] is not None), None)


# ``tokenizer.ggml.model`` -> (builder, whether BOS is added when ``add_bos_token`` is absent).
_GGUF_KINDS = {"gpt2": (_gpt2_tokenizer, False), "llama": (_spm_tokenizer, True),
               "bert": (_wordpiece_tokenizer, True)}


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]], key: str, **kwargs) -> HFTokenizer:
    try:
        return HFTokenizer(BPE(vocab, merges, fuse_unk=True, **kwargs))
    except Exception as e:  # tokenizers raises a bare Exception, e.g. for a merge outside the vocabulary
        raise ModelFormatError(key, f"cannot build the BPE model: {e}") from None


def _add_typed_tokens(hf: HFTokenizer, tokens: list[str], types: np.ndarray) -> None:
    """Special tokens for control/unknown/unused types; user-defined ones as plain added tokens."""
    special = np.flatnonzero(np.isin(types, _SPECIAL_TYPES)).tolist()
    user = np.flatnonzero(types == USER_DEFINED).tolist()
    hf.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                           for i in special if tokens[i]])
    hf.add_tokens([AddedToken(tokens[i], normalized=False, special=False) for i in user if tokens[i]])


def _template_processing(tokens: list[str], bos: int | None, eos: int | None):
    if bos is None and eos is None:
        return None
    pieces = [(tokens[i], i) for i in (bos, eos) if i is not None]
    single = ([tokens[bos]] if bos is not None else []) + ["$A"] + ([tokens[eos]] if eos is not None else [])
    return processors.TemplateProcessing(single=single, special_tokens=pieces)


# ---- HF directories -------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(str(path), f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(str(path), "expected a JSON object")
    return data


def _token_id(hf: HFTokenizer, token: Any) -> int | None:
    """The id of a tokenizer_config token entry: a string or ``{"content": ...}``."""
    if isinstance(token, dict):
        token = token.get("content")
    return hf.token_to_id(token) if isinstance(token, str) else None


def _config_ids(config: dict, key: str, hf: HFTokenizer) -> list[int]:
    value = config.get(key)
    values = value if isinstance(value, list) else [value]
    n = hf.get_vocab_size(with_added_tokens=True)
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n]


def _found_files(folder: Path) -> str:
    """What ``folder`` does hold, for an error about a file it lacks."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError as e:
        return f"the folder cannot be listed ({e.strerror})"
    if not names:
        return "the folder is empty"
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return f"the folder holds {shown}"
