"""Constrained generation: output that must match a JSON schema, a regular expression or a grammar.

``response_format`` takes OpenAI's shapes where they exist::

    {"type": "text"}                                   # no constraint
    {"type": "json_object"}                            # any JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}  # OpenAI's wrapper
    {"type": "json_schema", "json_schema": {...}}      # or the schema itself
    {"type": "regex", "pattern": "..."}
    {"type": "grammar", "grammar": "<lark grammar>"}

The matching is llguidance's (the library llama.cpp uses): it compiles the constraint to a
grammar and, at each step, computes the set of tokens that keep the output inside the language.
:class:`Constraint` turns that set into a logits mask (disallowed tokens -> -inf) and advances on
the chosen token; once the grammar is complete only EOS is allowed.

A constrained generation ends ``"stop"`` once its output is a whole match, EOS or not, and
``"length"`` when max_tokens cut it before: that output does not match. llguidance puts no bound
of its own on the length of a number or a string, so a schema without ``maximum``/``maxLength``
lets a model write digits until max_tokens.

A regex whose lexer would grow past :data:`LEXER_FUEL` (``(a{100}){100}{100}``, say) is refused
with :class:`LoomConfigError` at the first token it is asked to follow.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping
from functools import lru_cache

import llguidance
import llguidance.numpy
import numpy as np

from ...errors import LoomConfigError
from ..files.weights_source import WeightSource
from ..text.tokenizer import Tokenizer
from ..text.tokenizer_process import TokenizerProcess

FORMAT_TYPES = ("text", "json_object", "json_schema", "regex", "grammar")

# compact JSON: with llguidance's default (any whitespace between items) small models were free to
# pad with newlines until max_tokens; a schema's own "x-guidance" options still override this
_JSON_OPTIONS = {"whitespace_flexible": False}

# The work llguidance's lexer may spend building a constraint's regular expressions before the
# first token. Its default, 1,000,000, let (a{100}){100}{100} compute a first mask for ~4 s before
# refusing a token; at this much the refusal comes in ~0.05 s, and a 10,000-character regex,
# (a{100}){100}, still fits (as do JSON schemas with formats, patterns and long enums).
LEXER_FUEL = 50_000
_LIMITS = llguidance.LLParserLimits(initial_lexer_fuel=LEXER_FUEL)


def grammar_of(response_format: Mapping | None) -> str | None:
    """The llguidance grammar ``response_format`` asks for (None: unconstrained), validated:
    a bad shape, schema, regex or grammar raises one :class:`LoomConfigError` naming it."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise LoomConfigError(f"response_format must be a mapping with a 'type', got {response_format!r}")
    try:
        key = json.dumps(response_format, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise LoomConfigError(f"response_format must be JSON data: {e}") from None
    return _compiled(key)


@lru_cache(maxsize=64)
def _compiled(key: str) -> str | None:
    fmt = json.loads(key)
    kind = fmt.get("type")
    if kind not in FORMAT_TYPES:
        raise LoomConfigError(f"response_format type must be one of {FORMAT_TYPES}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, _JSON_OPTIONS)
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) and "schema" in spec else spec
        if not isinstance(schema, dict):
            raise LoomConfigError(f"response_format json_schema must be a JSON object (a schema), "
                                  f"got {schema!r}")
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, _JSON_OPTIONS)
    elif kind == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(_text(fmt, "pattern"))
    else:
        grammar = llguidance.LLMatcher.grammar_from_lark(_text(fmt, "grammar"))
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise LoomConfigError(f"response_format {kind} is invalid: {error.strip()}")
    return grammar


def _text(fmt: dict, field: str) -> str:
    value = fmt.get(field)
    if not isinstance(value, str) or not value:
        raise LoomConfigError(f"response_format {fmt.get('type')} needs a non-empty string "
                              f"'{field}', got {value!r}")
    return value


class Constraint:
    """The state of one constrained generation: :meth:`mask` the logits, then :meth:`consume`
    the token chosen from them."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, vocab_size: int):
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=_LIMITS)
        if self._matcher.is_error():
            raise LoomConfigError(f"response_format is invalid: {self._matcher.get_error()}")
        self._vocab_size = vocab_size
        self._bits = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer | TokenizerProcess, vocab_size: int,
                      source: WeightSource | None, response_format: Mapping | None) -> Constraint | None:
        """A fresh constraint for one generation by a model with this ``tokenizer`` and
        ``vocab_size`` (None when unconstrained). ``source``, the model's files, rebuilds the
        tokenizer here when it runs in a child process."""
        grammar = grammar_of(response_format)
        if grammar is None:
            return None
        return cls(_llg_tokenizer(tokenizer, vocab_size, source), grammar, vocab_size)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every token the constraint forbids at this step set to -inf (a new
        array: the caller's logits are left as they were)."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bits)
        if self._matcher.is_error():
            raise LoomConfigError(f"response_format could not be followed: {self._matcher.get_error()}")
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self._vocab_size]
        return np.where(allowed.astype(bool), logits, np.float32(-np.inf))

    @property
    def complete(self) -> bool:
        """Whether the output so far is a whole match of the format (it may end here)."""
        return self._matcher.is_accepting()

    def consume(self, token: int) -> None:
        """Advance past ``token`` (one the last :meth:`mask` allowed)."""
        if not self._matcher.consume_token(token):
            raise LoomConfigError(f"response_format rejected token {token}: {self._matcher.get_error()}")


# Building llguidance's view of a vocabulary takes 0.2-1 s, so each tokenizer keeps one per
# vocabulary size (dropped with it).
_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def _llg_tokenizer(tokenizer: Tokenizer | TokenizerProcess, vocab_size: int,
                   source: WeightSource | None) -> llguidance.LLTokenizer:
    with _tokenizers_lock:
        built = _tokenizers.setdefault(tokenizer, {})
        found = built.get(vocab_size)
        if found is None:
            eos = sorted(tokenizer.eos_ids)
            found = built[vocab_size] = llguidance.LLTokenizer(
                _tokenizer_json(tokenizer, source), n_vocab=vocab_size, eos_token=eos or None)
        return found


def _tokenizer_json(tokenizer: Tokenizer | TokenizerProcess, source: WeightSource | None) -> str:
    """The tokenizer as tokenizer.json text. A tokenizer running in a child process (the GUI's)
    cannot hand over its HF object, so the same one is built here from the model's own files
    (``source``), as the child built it."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer.to_json()
    if source is None:
        raise LoomConfigError("response_format needs the model's tokenizer, and this model has no source "
                              "files to build it from")
    if source.kind == "gguf":
        return Tokenizer.from_gguf_metadata(source.metadata).to_json()
    return Tokenizer.from_file(source.path).to_json()
