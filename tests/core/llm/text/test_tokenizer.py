"""Tokenizers built from GGUF vocabularies against transformers' ids (tests/data/llm/*.json) and a
slow SentencePiece reference; HF tokenizer.json directories; stream decoding; bad metadata."""

from __future__ import annotations

import json
import random
import re
from functools import cache
from pathlib import Path

import pytest
from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE, WordLevel
from tokenizers.pre_tokenizers import Metaspace, Whitespace

from loomlab.core.errors import LoomConfigError, ModelFormatError
from loomlab.core.llm.files import registry
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.text.tokenizer import GPT2_PRE_TOKENIZERS, Tokenizer

DATA = Path(__file__).resolve().parents[3] / "data"
GOLDEN = {"smollm2-135m": "smollm2-135m-instruct-q4_1.json", "gemma3-270m": "gemma3-270m-q4_k_m.json"}
MODELS = sorted(GOLDEN)


@cache
def gguf_metadata(alias: str) -> dict:
    """The file's metadata as Python values (the project's reader, itself checked against gguf-py's
    GGUFReader in test_gguf_file.py and 50x faster on gemma's 262k-token vocabulary)."""
    with open_gguf(registry.fetch(alias)) as g:
        return dict(g.metadata)


@cache
def gguf_tokenizer(alias: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_metadata(alias))


@cache
def golden(alias: str) -> dict:
    return json.loads((DATA / "llm" / GOLDEN[alias]).read_text())


def cases(alias: str) -> list[dict]:
    return golden(alias)["tokenize"]


# ---- the built-in models against transformers ---------------------------------------------------

@pytest.mark.parametrize("alias", MODELS)
def test_tokenize_cases_match_transformers(alias):
    tok = gguf_tokenizer(alias)
    for case in cases(alias):
        # transformers' encode(add_special_tokens=False) matches special-token text: allow_special.
        ids = tok.encode(case["text"], allow_special=True)
        assert ids == case["ids_no_special"], case["text"]
        assert tok.decode(ids) == case["text"]


@pytest.mark.parametrize("alias", MODELS)
def test_typed_special_token_text_stays_plain(alias):
    tok = gguf_tokenizer(alias)
    for case in cases(alias):
        ids = tok.encode(case["text"])
        assert not [i for i in ids if tok.is_special(i)], case["text"]
        assert tok.decode(ids) == case["text"]
        if not tok.special_spans(case["text"]):
            assert ids == case["ids_no_special"]


def test_smollm_chatml_markers_typed_by_a_user_are_text():
    tok = gguf_tokenizer("smollm2-135m")
    text = "<|im_start|>user\nhi<|im_end|>"
    assert tok.encode(text, allow_special=True) == [1, 4093, 198, 6004, 2]
    plain = tok.encode(text)
    assert 1 not in plain and 2 not in plain and len(plain) > 5
    assert tok.special_spans(text) == [(0, 12, 1), (len(text) - 10, len(text), 2)]


@pytest.mark.parametrize("alias", MODELS)
def test_raw_prompt_ids_match_transformers(alias):
    tok = gguf_tokenizer(alias)
    raw = [c for c in golden(alias)["generate"] if c["kind"] == "raw"]
    assert raw
    for case in raw:
        assert tok.encode(case["prompt"], add_special_tokens=True) == case["prompt_ids"]


def test_vocabulary_and_special_ids():
    smol, gemma = gguf_tokenizer("smollm2-135m"), gguf_tokenizer("gemma3-270m")
    assert (smol.vocab_size, smol.bos_id, smol.pad_id) == (49152, 1, 2)
    assert smol.eos_ids == {2, 0}  # <|im_end|> and <|endoftext|>
    assert (gemma.vocab_size, gemma.bos_id, gemma.unk_id, gemma.pad_id) == (262144, 2, 3, 0)
    assert gemma.eos_ids == {1, 106}  # <eos> and <end_of_turn>, as Gemma's generation config says
    assert smol.id_to_token(504) == "The" and smol.token_to_id("ĠParis") == 7042
    assert gemma.id_to_token(238 + 0x0A) == "<0x0A>" and gemma.token_to_id("▁the") == 506
    assert gemma.is_special(105) and gemma.is_special(0) and not gemma.is_special(107)
    assert smol.is_special(2) and not smol.is_special(17)
    assert gemma.encode("") == [] and gemma.encode("", add_special_tokens=True) == [2]
    assert smol.encode("hi", add_special_tokens=True) == smol.encode("hi")  # add_bos_token is False


def test_special_spans_are_character_offsets():
    tok = gguf_tokenizer("gemma3-270m")
    text = "héllo 👩‍💻<start_of_turn>x<end_of_turn>"
    spans = tok.special_spans(text)
    assert [text[s:e] for s, e, _ in spans] == ["<start_of_turn>", "<end_of_turn>"]
    assert [i for _, _, i in spans] == [105, 106]


def test_encode_pieces_joins_text_and_ids():
    tok = gguf_tokenizer("gemma3-270m")
    pieces = ["<start_of_turn>", 105, "user\nhi", 106, ""]
    ids = tok.encode_pieces(pieces)
    assert ids == tok.encode("<start_of_turn>") + [105] + tok.encode("user\nhi") + [106]
    assert ids[:5] == tok.encode("<start_of_turn>")[:5] and 105 not in tok.encode("<start_of_turn>")


def test_bad_ids_and_text_are_rejected():
    tok = gguf_tokenizer("smollm2-135m")
    for bad in ([49152], [-1], [True], ["3"]):
        with pytest.raises(LoomConfigError, match="not in the vocabulary"):
            tok.decode(bad)
    with pytest.raises(LoomConfigError, match="must be a str"):
        tok.encode(b"bytes")


# ---- streaming ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("alias", MODELS)
def test_stream_decoder_emits_whole_characters(alias):
    tok = gguf_tokenizer(alias)
    held_back = 0
    for text in [c["text"] for c in cases(alias)] + EXTRA_TEXTS:
        ids = tok.encode(text)
        stream = tok.decode_stream()
        deltas = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(deltas) == text
        assert not any("\ufffd" in d for d in deltas), text
        held_back += sum(d == "" for d in deltas[:-1])
    assert held_back > 0  # characters spread over several tokens were held until complete


def test_stream_decoder_flushes_an_unfinished_character():
    tok = gguf_tokenizer("gemma3-270m")
    stream = tok.decode_stream()
    assert stream.push(tok.token_to_id("Hi")) == "Hi"
    assert stream.push(tok.token_to_id("<0xF0>")) == ""  # first byte of a 4-byte character
    assert stream.flush() == "\ufffd"


def test_stream_decoder_skips_special_tokens_on_request():
    tok = gguf_tokenizer("smollm2-135m")
    ids = tok.encode("<|im_start|>assistant\nOK<|im_end|>", allow_special=True)
    stream = tok.decode_stream(skip_special_tokens=True)
    assert "".join([stream.push(i) for i in ids] + [stream.flush()]) == "assistant\nOK"


# ---- SentencePiece BPE against a slow reference -------------------------------------------------

def spm_reference(text: str, tokens: list[str], scores, types, add_space_prefix: bool) -> list[int]:
    """llama.cpp's SentencePiece tokenizer, written plainly: user-defined tokens are cut out
    first (longest match); in between, spaces become ▁ and the adjacent pair whose concatenation
    is the best-scored normal piece is merged (leftmost on ties) until none is; a piece left
    outside the vocabulary becomes its UTF-8 bytes. With ``add_space_prefix`` every run of text
    between user-defined tokens starts with ▁."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    user = sorted((t for i, t in enumerate(tokens) if types[i] == 4), key=len, reverse=True)
    byte_id = {int(t[3:5], 16): i for i, t in enumerate(tokens) if types[i] == 6}
    ids = []
    for k, part in enumerate(re.split("(" + "|".join(map(re.escape, user)) + ")", text) if user else [text]):
        if k % 2:
            ids.append(tokens.index(part))
            continue
        if not part:
            continue
        symbols = list(("▁" if add_space_prefix else "") + part.replace(" ", "▁"))
        while True:
            best = None
            for j in range(len(symbols) - 1):
                i = normal.get(symbols[j] + symbols[j + 1])
                if i is not None and (best is None or scores[i] > best[0]):
                    best = (scores[i], j)
            if best is None:
                break
            j = best[1]
            symbols[j:j + 2] = [symbols[j] + symbols[j + 1]]
        for s in symbols:
            ids.extend([normal[s]] if s in normal else [byte_id[b] for b in s.encode()])
    return ids


EXTRA_TEXTS = [
    "Ünïcödé façade — naïve résumé", "  multiple   spaces\t\ttabs\n\n\nnewlines  ",
    "<table><tr><td>x</td></tr></table>", "Привет, мир! Καλημέρα κόσμε. مرحبا بالعالم",
    "👩‍💻 for (int i=0;i<10;i++) { x += i; }", "a\u0301 combining, \u200b zero width, \x01 control",
    "The year 1999 was before 2026; ½ ⅓ ∞ ≠ ≤", "ȘȚ ǅ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀",
]


def test_gemma_matches_slow_sentencepiece_reference():
    meta = gguf_metadata("gemma3-270m")
    tokens, scores, types = (meta[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    tok = gguf_tokenizer("gemma3-270m")
    for text in [c["text"] for c in cases("gemma3-270m")] + EXTRA_TEXTS:
        assert tok.encode(text) == spm_reference(text, tokens, scores, types, False), text


def small_spm_meta(**overrides) -> dict:
    """A llama-style (SentencePiece) vocabulary small enough to test every merge order."""
    pieces = ["▁", "a", "b", "c", "▁a", "ab", "bc", "▁ab", "abc", "▁abc", "ca", "cab", "▁b", "▁c",
              "aa", "▁ca", "bca", "▁bca", "cc"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["\n"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [4]
    scores = [0.0] * 259 + [-float(k) for k in range(len(pieces))] + [0.0]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    return meta | overrides


def test_small_sentencepiece_vocabulary_matches_reference():
    meta = small_spm_meta()
    tok = Tokenizer.from_gguf_metadata(meta)
    rng = random.Random(7)
    args = [meta[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type")]
    for _ in range(300):
        text = "".join(rng.choice("abc \né") for _ in range(rng.randint(1, 14)))
        ids = tok.encode(text)
        assert ids == spm_reference(text, *args, add_space_prefix=True), repr(text)
        # After the user-defined "\n" the next run starts with a prefix space, which decodes.
        assert tok.decode(ids) == re.sub("\n(?=[^\n])", "\n ", text)
    assert tok.encode("abc", add_special_tokens=True) == [1, tok.token_to_id("▁abc")]
    assert tok.eos_ids == {2}


def test_space_prefix_starts_each_run_of_text_as_in_llama_cpp():
    tok = Tokenizer.from_gguf_metadata(small_spm_meta())
    abc, space_abc = tok.token_to_id("abc"), tok.token_to_id("▁abc")
    assert tok.encode("abc") == [space_abc] and tok.decode([space_abc]) == "abc"
    assert tok.encode(" abc") == [tok.token_to_id("▁"), space_abc]  # the prefix is unconditional
    assert tok.encode("abc<s>abc", allow_special=True) == [space_abc, 1, space_abc]
    assert tok.encode_pieces(["abc", 1, "abc"]) == [space_abc, 1, space_abc]
    no_prefix = Tokenizer.from_gguf_metadata(small_spm_meta(**{"tokenizer.ggml.add_space_prefix": False}))
    assert no_prefix.encode("abc") == [abc] and no_prefix.encode(" abc") == [space_abc]


def test_first_only_metaspace_prefix_survives_piecewise_encoding(tmp_path):
    # tokenizer.json files with a Metaspace "first" scheme put "▁" only at the start of the text.
    hf = HFTokenizer(BPE({"<s>": 0, "▁": 1, "a": 2, "▁a": 3}, [("▁", "a")]))
    hf.pre_tokenizer = Metaspace(replacement="▁", prepend_scheme="first", split=False)
    hf.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_file(tmp_path)
    assert tok.encode("a<s>a", allow_special=True) == [3, 0, 2]
    assert tok.encode_pieces(["a", 0, "a"]) == [3, 0, 2]
    assert tok.encode("a") == [3]  # the pre-tokenizer is restored after piecewise encoding


# ---- pre-tokenizer hints, HF files, bad metadata ----------------------------------------------------

@pytest.mark.parametrize("name, pieces", [
    ("gpt2", ["x", "Ġ12345", "Ġit", "'s"]),
    ("smollm", ["x", "Ġ", "1", "2", "3", "4", "5", "Ġit", "'s"]),  # digits one by one
    ("llama-bpe", ["x", "Ġ", "123", "45", "Ġit", "'s"]),  # digits in threes
    ("qwen2", ["x", "Ġ", "1", "2", "3", "4", "5", "Ġit", "'s"]),
])
def test_pre_tokenizer_hints(name, pieces):
    assert [p for p, _ in GPT2_PRE_TOKENIZERS[name]().pre_tokenize_str("x 12345 it's")] == pieces


def test_from_file_reads_an_hf_directory(tmp_path):
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "<eot>": 3, "hello": 4, "world": 5}
    hf = HFTokenizer(WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = Whitespace()
    hf.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<eot>")])
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": "</s>", "unk_token": "[UNK]"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    tok = Tokenizer.from_file(tmp_path)
    assert (tok.bos_id, tok.eos_ids, tok.pad_id, tok.unk_id, tok.vocab_size) == (1, {2, 3}, 2, 0, 6)
    assert tok.encode("hello world", add_special_tokens=True) == [1, 4, 5]
    assert tok.encode("hello </s>") == [4, 0, 0, 0] and tok.encode("hello </s>", allow_special=True) == [4, 2]
    assert tok.is_special(3) and not tok.is_special(4)


def test_from_file_rejects_bad_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="not a valid tokenizer.json"):
        Tokenizer.from_file(tmp_path)


def tiny_tokenizer_json(folder: Path, **parts) -> Path:
    """A word-level tokenizer.json of a few words with ``parts`` (its "normalizer", ...) replaced."""
    vocab = {"[UNK]": 0, "<s>": 1, "a": 2, "b": 3, "hello": 4}
    hf = HFTokenizer(WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = Whitespace()
    hf.add_special_tokens([AddedToken("<s>", special=True)])
    data = {**json.loads(hf.to_str()), **parts}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder / "tokenizer.json"


# tokenizer.json parts the Rust library accepts but panics on when it encodes (pyo3's
# PanicException, a BaseException); `encodes` is a text that still goes through
PANICS = {
    "backtracking split regex": ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a+)+$"},
                                                    "behavior": "Isolated", "invert": False}}, "hello b"),
    "replace of an empty pattern": ({"normalizer": {"type": "Replace", "pattern": {"String": ""},
                                                    "content": "x"},
                                     "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                       "trim_offsets": True, "use_regex": True}}, ""),
    "template naming an unknown token": ({"post_processor": {
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<nope>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {}}}, "hello b"),
}


@pytest.mark.parametrize("name", PANICS)
def test_a_tokenizer_that_panics_is_refused_at_load(name, tmp_path):
    path = tiny_tokenizer_json(tmp_path, **PANICS[name][0])
    with pytest.raises(ModelFormatError) as err:
        Tokenizer.from_file(tmp_path)
    assert err.value.field == str(path) and "the tokenizer it describes failed" in err.value.detail


def test_a_panic_after_load_is_a_typed_error_from_every_entry_point(tmp_path):
    # a regex that backtracks only on runs of "z" passes the load probe, and panics on such a text
    path = tiny_tokenizer_json(tmp_path, pre_tokenizer={"type": "Split", "pattern": {"Regex": "(z+)+$"},
                                                        "behavior": "Isolated", "invert": False})
    tok = Tokenizer.from_file(path)
    text = "z" * 40 + "y"
    for call in (lambda: tok.encode(text), lambda: tok.special_spans(text),
                 lambda: tok.encode_pieces(["hello", 1, text])):
        with pytest.raises(ModelFormatError) as err:
            call()
        assert err.value.field == str(path) and "failed while encoding" in err.value.detail
    assert tok.encode("hello") == [4]  # and it goes on working


def test_a_missing_tokenizer_json_is_named_with_what_the_folder_holds(tmp_path):
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(ModelFormatError) as err:
        Tokenizer.from_file(tmp_path)
    assert str(err.value) == (f"{tmp_path / 'tokenizer.json'}: missing; the folder holds "
                              "config.json, model.safetensors, tokenizer.model")
    with pytest.raises(ModelFormatError, match="missing.json: missing; the folder holds config.json"):
        Tokenizer.from_file(tmp_path / "missing.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelFormatError, match="tokenizer.json: missing; the folder is empty"):
        Tokenizer.from_file(empty)


def test_tiny_hf_checkpoints_carry_no_tokenizer():
    # The tiny decoders are fed token ids directly; nothing there to load. (An embedding model's
    # tokenizer is part of its oracle: its sentence-transformers folder's reference holds
    # transformers' ids, see test_bert.)
    folders = sorted(f for f in (DATA / "tiny-hf").iterdir() if not (f / "modules.json").exists())
    assert folders and not any((f / name).exists() for f in folders
                               for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))


def small_gpt2_meta(**overrides) -> dict:
    tokens = ["<|endoftext|>", "a", "b", "ab", "Ġ", "Ġab"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": ["a b", "Ġ ab"],
            "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1], "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.pre": "gpt2"}
    return meta | overrides


def test_small_gpt2_vocabulary():
    tok = Tokenizer.from_gguf_metadata(small_gpt2_meta())
    assert tok.encode("ab ab") == [3, 5]
    assert tok.encode("ab<|endoftext|>", allow_special=True) == [3, 0]
    assert tok.decode([3, 5, 0]) == "ab ab<|endoftext|>"


@pytest.mark.parametrize("change, field", [
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": ["a", 3]}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.model": "rwkv"}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.model": 5}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.token_type": ["x"] * 6}, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.bos_token_id": 6}, "tokenizer.ggml.bos_token_id"),
    ({"tokenizer.ggml.eos_token_id": -1}, "tokenizer.ggml.eos_token_id"),
    ({"tokenizer.ggml.merges": ["a b c"]}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.merges": ["a z"]}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.merges": 7}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.pre": "mystery"}, "tokenizer.ggml.pre"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "tokenizer.ggml.add_bos_token"),
])
def test_bad_gpt2_metadata_names_the_field(change, field):
    meta = {k: v for k, v in (small_gpt2_meta() | change).items() if v is not None}
    with pytest.raises(ModelFormatError) as err:
        Tokenizer.from_gguf_metadata(meta)
    assert err.value.field == field


def test_bad_sentencepiece_metadata_names_the_field():
    with pytest.raises(ModelFormatError) as err:
        Tokenizer.from_gguf_metadata(small_spm_meta(**{"tokenizer.ggml.scores": [0.0, 1.0]}))
    assert err.value.field == "tokenizer.ggml.scores"
