"""Chat templates: the model's own Jinja template, rendered in a guarded sandbox, or a fallback.

Templates come from model files, so they are untrusted code. They run in jinja2's
``ImmutableSandboxedEnvironment`` (no ``_``-attributes, no mutation of lists and dicts,
``range`` capped at 100 000 items) with the globals and filters transformers gives them
(``raise_exception``, ``strftime_now``, ``tojson``, ``bos_token``, ``eos_token``, ``tools``...),
less ``lipsum``, whose cost its arguments set. A template's source is bounded before it is
compiled (characters and lexer tokens: compiling costs ~0.1 ms a token), and a template nested
deeper than Python can compile is refused. On top of the sandbox, every render is bounded, and
breaking a bound raises :class:`ChatTemplateError`:

* time: ``{% for %}`` loops are rewritten to pass each item through a guard, and every call,
  attribute lookup, filter, operator and output chunk checks the render's deadline, so nested
  loops over ``range`` stop within about one check interval of the deadline;
* size: every value that enters or leaves a call, a filter, an operator, a ``~`` concatenation
  or ``{{ }}`` must "weigh" (its length written out) at most ``max_chars``, the operations that
  can multiply sizes (``*``, ``**``, ``%`` and ``format`` widths, ``replace``, ``center``,
  ``ljust``/``rjust``/``zfill``, ``expandtabs``, ``translate``, ``join``, ``indent``, ``batch``,
  ``tojson`` indents) are bounded before they run, and the output stops at ``max_chars``;
* lazy sequences (``map``, ``select``, ``reverse``... give generators): whatever consumes one (a
  ``list``, ``sort`` or ``join``, ``str.join``, ``loop.length``) gets at most ``max_chars`` of
  weight from it (each item weighing at least 1) before the render stops.

:func:`encode_chat` turns a conversation into ids so that special tokens come only from the
template's own text: text a user typed stays plain even when it spells ``<|im_end|>``.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from importlib import resources
from itertools import islice
from typing import Any

from jinja2 import TemplateError, nodes, pass_environment, pass_eval_context
from jinja2.ext import loopcontrols
from jinja2.filters import do_batch, do_center, do_format, do_indent, do_join, do_replace, make_attrgetter
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from ...errors import LoomConfigError, LoomError, ModelFormatError
from .tokenizer import Tokenizer

FALLBACKS = ("chatml", "gemma", "llama3")
LLAMA3_MARKERS = frozenset({"<|start_header_id|>", "<|eot_id|>"})
_GUARD_EVERY = 64  # loop items between two deadline checks
# A format width or precision of 7+ digits (1 000 000+ characters) is refused before formatting.
_HUGE_WIDTH = re.compile(r"\d{7,}")
# Bounds on a template's source, checked before it is parsed: real templates (tool-calling ones
# included) are a few thousand lexer tokens; compiling costs ~0.1-0.2 ms a token on one core.
MAX_SOURCE_CHARS = 1_000_000
MAX_SOURCE_TOKENS = 20_000
# wordwrap and urlize walk every word in Python, out of the deadline's reach: ~0.4 s at this size
_MAX_SLOW_TEXT = 100_000


class ChatTemplateError(LoomError, ValueError):
    """A chat template could not be compiled or rendered.

    ``kind`` says why: ``"syntax"``, ``"security"`` (sandbox escape attempt), ``"too_large"``,
    ``"timeout"``, ``"template_raised"`` (the template's own ``raise_exception``), ``"render"``
    (any other failure inside the template) or ``"splice"`` (user text could not be kept apart
    from template text, see :func:`encode_chat`).
    """

    def __init__(self, kind: str, message: str):
        self.kind = kind
        self.detail = message
        super().__init__(f"chat template {kind}: {message}")


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one render: characters of output (and of any value inside), and seconds."""

    max_chars: int = 1_000_000
    timeout_s: float = 2.0


class ChatTemplate:
    """A compiled chat template.

    ``source`` is ``"file"`` for the model's own template or ``"fallback:<name>"`` (``chatml``,
    ``gemma``, ``llama3``) when the model carries none; ``text`` is the Jinja source.
    """

    def __init__(self, text: str, *, source: str = "file", bos_token: str = "", eos_token: str = "",
                 limits: RenderLimits | None = None):
        self.text = text
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.limits = limits or RenderLimits()
        self._env = _GuardedEnvironment(self.limits)
        self._template = self._env.compile_guarded(text)

    @classmethod
    def for_model(cls, meta_or_config: Mapping[str, Any], architecture: str, *,
                  limits: RenderLimits | None = None) -> ChatTemplate:
        """The template of a model: GGUF metadata (``tokenizer.chat_template``) or an HF
        tokenizer_config.json dict (``chat_template``); a family fallback when it has none.

        The fallback is chosen by ``architecture`` and vocabulary: ``gemma*`` -> gemma,
        a vocabulary with Llama 3's header tokens -> llama3, anything else -> chatml.
        """
        if _is_gguf(meta_or_config):
            text, bos, eos, vocab = _from_gguf(meta_or_config)
        else:
            text, bos, eos, vocab = _from_hf_config(meta_or_config)
        if text:
            return cls(text, source="file", bos_token=bos, eos_token=eos, limits=limits)
        return cls.fallback(_fallback_name(architecture, vocab), bos_token=bos, eos_token=eos, limits=limits)

    @classmethod
    def fallback(cls, name: str, *, bos_token: str = "", eos_token: str = "",
                 limits: RenderLimits | None = None) -> ChatTemplate:
        """One of the built-in family templates in ``loomlab.resources/templates``."""
        if name not in FALLBACKS:
            raise LoomConfigError(f"unknown fallback chat template {name!r}; known: {list(FALLBACKS)}")
        text = resources.files("loomlab.resources").joinpath("templates", f"{name}.jinja").read_text("utf-8")
        return cls(text, source=f"fallback:{name}", bos_token=bos_token, eos_token=eos_token, limits=limits)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **context: Any) -> str:
        """The prompt text for ``messages`` (dicts with string ``role`` and ``content``).

        ``context`` adds or overrides template variables (``tools``, ``documents``, ...).
        """
        variables = {"messages": _checked_messages(messages), "add_generation_prompt": add_generation_prompt,
                     "bos_token": self.bos_token, "eos_token": self.eos_token, "tools": None,
                     "documents": None, **context}
        return self._env.render(self._template, variables)

    def __repr__(self) -> str:
        return f"ChatTemplate(source={self.source!r}, {len(self.text)} chars)"


def encode_chat(tokenizer: Tokenizer, template: ChatTemplate, messages: Sequence[Mapping[str, Any]],
                add_generation_prompt: bool = True, **context: Any) -> list[int]:
    """Token ids of a rendered conversation; special tokens only where the template wrote them.

    Method: the template is rendered twice, once with the real contents and once with each
    content replaced by a unique marker. The marker render gives the template's own text between
    the contents; the real render must then equal that text with each content (or its
    whitespace-trimmed form, as templates that ``| trim`` produce) in the markers' places, which
    proves where every user span lies. Special-token text is matched outside those spans only;
    the text between special tokens is encoded as plain text, users' spans included. This gives
    the ids transformers' ``apply_chat_template`` gives, except that typed special-token text
    stays text.

    If the template's output depends on the contents other than by trimming (so the spans cannot
    be proven), the whole text is encoded with special tokens matched only when no content
    spells one; otherwise :class:`ChatTemplateError` (``"splice"``) is raised.
    """
    text = template.render(messages, add_generation_prompt, **context)
    spans = _user_spans(template, messages, text, add_generation_prompt, context)
    if spans is None:
        if any(tokenizer.special_spans(m["content"]) for m in messages):
            raise ChatTemplateError("splice", "the template transforms message contents, so text that "
                                    "spells special tokens cannot be kept apart from the template's own")
        spans = []
    return tokenizer.encode_pieces(_pieces(text, tokenizer.special_spans(text), spans))


# ---- the guarded environment -----------------------------------------------------------------------

class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox plus a deadline and size bounds (see the module docstring)."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, limits: RenderLimits):
        # optimized=False: jinja's constant folding retries every subexpression at every level,
        # so compiling ``a.b.b.b...`` 100 deep took seconds, and it would run filters at compile time
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                         finalize=self._finalize, optimized=False)
        self.limits = limits
        self._state = threading.local()  # the deadline of the render running in this thread
        del self.globals["lipsum"]  # lipsum(n) costs what n says, inside one call
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.filters.update(self._bounded_filters())
        self.filters = {name: self._guard_filter(f) for name, f in self.filters.items()}

    def compile_guarded(self, text: str):
        if not isinstance(text, str):
            raise ChatTemplateError("syntax", f"template must be a str, not {type(text).__name__}")
        try:
            self._check_source(text)
            tree = _GuardLoops().visit(self.parse(text))
            tree.set_environment(self)
            return self.from_string(tree)
        except TemplateError as e:
            raise ChatTemplateError("syntax", str(e)) from None
        except (RecursionError, SyntaxError, MemoryError) as e:  # SyntaxError: Python's block limit
            raise ChatTemplateError("too_large", f"the template nests too deeply to compile "
                                    f"({type(e).__name__}: {e})") from None

    def _check_source(self, text: str) -> None:
        """Refuses a source whose compiling would take long, before parsing it."""
        if len(text) > MAX_SOURCE_CHARS:
            raise ChatTemplateError("too_large", f"the template has {len(text)} characters, over "
                                    f"{MAX_SOURCE_CHARS}")
        tokens = (token for token in self.lex(text) if token[1] != "whitespace")
        if next(islice(tokens, MAX_SOURCE_TOKENS, None), None) is not None:
            raise ChatTemplateError("too_large", f"the template has over {MAX_SOURCE_TOKENS} tokens")

    def render(self, template, variables: dict) -> str:
        self._state.deadline = time.monotonic() + self.limits.timeout_s
        out, size = [], 0
        try:
            for chunk in template.generate(variables):
                size += len(chunk)
                self._check_size(size, "output")
                self.check_time()
                out.append(chunk)
        except ChatTemplateError:
            raise
        except TemplateError as e:  # SecurityError, UndefinedError, ...
            kind = "security" if isinstance(e, SecurityError) else "render"
            raise ChatTemplateError(kind, str(e)) from None
        except (RecursionError, MemoryError) as e:
            raise ChatTemplateError("too_large", f"{type(e).__name__}: {e}") from None
        except Exception as e:  # anything a template can provoke: TypeError, OverflowError, ...
            raise ChatTemplateError("render", f"{type(e).__name__}: {e}") from None
        finally:
            self._state.deadline = None
        return "".join(out)

    # ---- bounds ----

    def check_time(self) -> None:
        deadline = getattr(self._state, "deadline", None)
        if deadline is not None and time.monotonic() > deadline:
            raise ChatTemplateError("timeout", f"rendering took more than {self.limits.timeout_s} s")

    def _check_size(self, size: int, what: str) -> None:
        if size > self.limits.max_chars:
            raise ChatTemplateError("too_large", f"{what} would exceed {self.limits.max_chars} characters")

    def _check_values(self, values, what: str) -> None:
        for value in values:
            self._check_size(_weight(value, self.limits.max_chars), what)

    def _check_format(self, fmt: Any, args, kwargs) -> None:
        if isinstance(fmt, bytes):
            fmt = fmt.decode("latin-1")
        if isinstance(fmt, str) and _HUGE_WIDTH.search(fmt):
            raise ChatTemplateError("too_large", "format width or precision over 999999")
        self._check_ints(args, kwargs)

    def _check_ints(self, args, kwargs) -> None:
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and abs(value) > self.limits.max_chars:
                raise ChatTemplateError("too_large", f"argument {value} exceeds {self.limits.max_chars}")

    # ---- sandbox hooks ----

    def unsafe_undefined(self, obj: Any, attribute: str):
        raise ChatTemplateError("security", f"access to attribute {attribute!r} of a "
                                f"{type(obj).__name__!r} object is not allowed")

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.check_time()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.check_time()
        return super().getitem(obj, argument)

    def call(self, context, obj, /, *args, **kwargs):
        self.check_time()
        self._check_values((*args, *kwargs.values()), "argument")
        args, kwargs = self._metered_args(args, kwargs)
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str | bytes):
            name = getattr(obj, "__name__", "")
            if name == "join" and args and not isinstance(args[0], list | tuple):
                # str.join takes any iterable whole before it sizes the result: take it here, bounded
                args = (list(self._metered(iter(args[0]), f"{type(owner).__name__}.join()")), *args[1:])
            self._check_size(_str_method_size(owner, name, args, kwargs, self.limits.max_chars),
                             f"{type(owner).__name__}.{name}()")
        result = super().call(context, obj, *args, **kwargs)
        self._check_values((result,), "result")
        return result

    def wrap_str_format(self, value: Any):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        @wraps(wrapped)
        def checked(*args, **kwargs):
            self._check_format(fmt, args, kwargs)
            return self._checked_result(wrapped(*args, **kwargs))
        return checked

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        self.check_time()
        self._check_size(_binop_size(operator, left, right, self.limits.max_chars), f"operator {operator}")
        if operator == "%" and isinstance(left, str | bytes):
            self._check_format(left, right if isinstance(right, tuple) else (right,), {})
        return self._checked_result(super().call_binop(context, operator, left, right))

    def concat_guard(self, *parts: Any) -> str:
        """Stands in for ``~``: refuses to build a string over the limit."""
        self.check_time()
        self._check_size(sum(_weight(p, self.limits.max_chars) for p in parts), "concatenation")
        return "".join(map(str, parts))

    def loop_guard(self, iterable: Any):
        """Wraps every ``{% for %}`` iterable: checks the deadline as items go by, and meters a lazy
        one (``loop.length`` takes it whole)."""
        if isinstance(iterable, Iterator):
            iterable = self._metered(iterable, "loop")
        for k, item in enumerate(iterable):
            if k % _GUARD_EVERY == 0:
                self.check_time()
            yield item

    def _metered(self, items: Iterator, what: str):
        """``items`` passed through, refused once what went by weighs over ``max_chars`` (an item
        at least 1), so whatever takes the whole of a lazy sequence holds a bounded part of it."""
        total = 0
        for item in items:
            total += max(_weight(item, self.limits.max_chars), 1)
            self._check_size(total, what)
            self.check_time()
            yield item

    def _metered_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def meter(value):
            return self._metered(value, "sequence") if isinstance(value, Iterator) else value
        return tuple(map(meter, args)), {k: meter(v) for k, v in kwargs.items()}

    def _finalize(self, value: Any) -> Any:
        self._check_values((value,), "output value")
        return value

    def _checked_result(self, value: Any) -> Any:
        self._check_values((value,), "result")
        return value

    def _guard_filter(self, func):
        @wraps(func)  # keeps jinja's pass_context / pass_eval_context marks
        def guarded(*args, **kwargs):
            self.check_time()
            self._check_values((*args, *kwargs.values()), "filter argument")
            args, kwargs = self._metered_args(args, kwargs)
            return self._checked_result(func(*args, **kwargs))
        return guarded

    def _bounded_filters(self) -> dict:
        """Filters whose output can be far larger than their inputs, bounded before they run."""
        limit = self.limits.max_chars

        def center(value, width=80):
            self._check_ints((width,), {})
            return do_center(value, width)

        def indent(s, width=4, first=False, blank=False):
            step = len(width) if isinstance(width, str) else width
            self._check_ints((step,), {})
            self._check_size(len(str(s)) + (str(s).count("\n") + 1) * step, "indent")
            return do_indent(s, width, first, blank)

        @pass_eval_context
        def replace(eval_ctx, s, old, new, count=None):
            self._check_size(_replace_size(str(s), str(old), str(new)), "replace")
            return do_replace(eval_ctx, s, old, new, count)

        @pass_eval_context
        def join(eval_ctx, value, d="", attribute=None):
            items = list(value)  # an attribute of an item weighs no more than the item
            self._check_size(sum(_weight(x, limit) for x in items) + _weight(d, limit) * len(items), "join")
            return do_join(eval_ctx, items, d, attribute)

        def batch(value, linecount, fill_with=None):
            self._check_ints((linecount,), {})
            return do_batch(value, linecount, fill_with)

        @pass_environment
        def sum_(environment, iterable, attribute=None, start=0):
            # Python's sum() of lists copies the total at every step, out of reach of the deadline
            if attribute is not None:
                iterable = map(make_attrgetter(environment, attribute), iterable)
            total = start
            for item in self.loop_guard(iterable):
                numbers = isinstance(total, int | float) and isinstance(item, int | float)
                total = total + item if numbers else self.call_binop(None, "+", total, item)
            return total

        def slow_text(name):
            func = self.filters[name]

            @wraps(func)
            def bounded(*args, **kwargs):
                if any(isinstance(a, str) and len(a) > _MAX_SLOW_TEXT for a in args):
                    raise ChatTemplateError("too_large", f"{name} of over {_MAX_SLOW_TEXT} characters")
                return func(*args, **kwargs)
            return bounded

        def format_(value, *args, **kwargs):
            self._check_format(value, args, kwargs)
            return do_format(value, *args, **kwargs)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            if indent is not None and not (isinstance(indent, int) and 0 <= indent <= 64):
                raise ChatTemplateError("too_large", f"tojson indent {indent!r} is not 0..64")
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        return {"center": center, "indent": indent, "replace": replace, "join": join, "format": format_,
                "tojson": tojson, "batch": batch, "sum": sum_, "wordwrap": slow_text("wordwrap"),
                "urlize": slow_text("urlize")}


class _GuardLoops(NodeTransformer):
    """Rewrites ``{% for x in it %}`` to iterate ``environment.loop_guard(it)`` and ``a ~ b`` to
    ``environment.concat_guard(a, b)``. Environment attributes cannot be shadowed by template
    variables, so a template cannot switch the guards off."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = _env_call("loop_guard", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        node = self.generic_visit(node)
        return _env_call("concat_guard", node.nodes, node.lineno)


def _env_call(name: str, args: list, lineno: int) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)


def _weight(value: Any, limit: int) -> int:
    """About how many characters ``value`` takes written out; stops counting past ``limit``."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, bool | float) or value is None:
        return 8
    if isinstance(value, int):
        return value.bit_length() // 3 + 1  # decimal digits, rounded up
    if isinstance(value, Mapping):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list | tuple | set | frozenset):
        total = len(value)
        for item in value:
            if total > limit:
                break
            total += _weight(item, limit - total)
        return total
    return 0


def _binop_size(operator: str, left: Any, right: Any, limit: int) -> int:
    """An upper bound on the size of ``left operator right`` that needs no computing of it."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(n, int):
                return _weight(seq, limit) * max(n, 0)
        return _weight(left, limit) + _weight(right, limit)
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        return int(max(right, 0) * math.log10(abs(left))) + 1
    return _weight(left, limit) + _weight(right, limit)


def _replace_size(s: str, old: str, new: str) -> int:
    hits = s.count(old) if old else len(s) + 1
    return len(s) + hits * len(new)


def _str_method_size(s: str | bytes, name: str, args, kwargs, limit: int) -> int:
    """Bounds for str and bytes methods that can grow a string; other methods are bounded by their
    inputs (``join`` is given a list: :meth:`_GuardedEnvironment.call` takes any other iterable)."""
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        return max(len(s), args[0])
    if name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        tabs = s.count(b"\t" if isinstance(s, bytes) else "\t")
        return len(s) + tabs * max(tab, 0) if isinstance(tab, int) else len(s)
    if name == "replace" and len(args) >= 2 and type(args[0]) is type(args[1]) is type(s):
        return _replace_size(s, args[0], args[1])
    if name == "join" and args and isinstance(args[0], list | tuple):
        return _weight(args[0], limit) + len(s) * len(args[0])
    if name == "translate" and args and isinstance(args[0], Mapping):
        return len(s) * max([1, *(_weight(v, limit) for v in args[0].values())])
    return len(s)


def _raise_exception(message: Any) -> None:
    raise ChatTemplateError("template_raised", str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# ---- where a template comes from -----------------------------------------------------------------

def _is_gguf(meta: Mapping[str, Any]) -> bool:
    return any(isinstance(k, str) and k.startswith(("tokenizer.", "general.")) for k in meta)


def _from_gguf(meta: Mapping[str, Any]) -> tuple[str | None, str, str, Sequence[str]]:
    text = meta.get("tokenizer.chat_template")
    if text is not None and not isinstance(text, str):
        raise ModelFormatError("tokenizer.chat_template", f"expected a string, found {type(text).__name__}")
    tokens = meta.get("tokenizer.ggml.tokens")
    tokens = tokens if isinstance(tokens, Sequence) and not isinstance(tokens, str) else []

    def token(key: str) -> str:
        i = meta.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

    return text, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"), tokens


def _from_hf_config(config: Mapping[str, Any]) -> tuple[str | None, str, str, Sequence[str]]:
    text = config.get("chat_template")
    if isinstance(text, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in text if isinstance(t, Mapping)}
        text = named.get("default", next(iter(named.values()), None))
    if text is not None and not isinstance(text, str):
        raise ModelFormatError("chat_template", f"expected a string, found {type(text).__name__}")
    added = config.get("added_tokens_decoder")
    vocab = [t.get("content", "") for t in added.values() if isinstance(t, Mapping)] \
        if isinstance(added, Mapping) else []
    return text, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")), vocab


def _token_text(token: Any) -> str:
    if isinstance(token, Mapping):
        token = token.get("content")
    return token if isinstance(token, str) else ""


def _fallback_name(architecture: str, vocab: Sequence[str]) -> str:
    if architecture.lower().startswith("gemma"):
        return "gemma"
    if LLAMA3_MARKERS & set(vocab):
        return "llama3"
    return "chatml"


# ---- messages and splicing ---------------------------------------------------------------------

def _checked_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise LoomConfigError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            raise LoomConfigError(f"message {k} must be a dict with string 'role' and 'content'")
        out.append(dict(m))
    return out


def _user_spans(template: ChatTemplate, messages, text: str, add_generation_prompt: bool,
                context: dict) -> list[tuple[int, int]] | None:
    """Where each message content lies in ``text``, proven by a render with markers; or None."""
    nonce = secrets.token_hex(4)
    # An empty content stays empty: there is nothing in it to protect, and a template may test it.
    marked = [{**m, "content": m["content"] and f"\ue000{nonce}:{k}\ue001"} for k, m in enumerate(messages)]
    try:
        skeleton = template.render(marked, add_generation_prompt, **context)
    except ChatTemplateError:
        return None
    parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", skeleton)
    if not text.startswith(parts[0]):
        return None
    pos, spans = len(parts[0]), []
    for k in range(1, len(parts), 2):
        content, after = messages[int(parts[k])]["content"], parts[k + 1]
        shown = next((c for c in (content, content.strip(), content.lstrip(), content.rstrip())
                      if text.startswith(c + after, pos)), None)
        if shown is None:
            return None
        spans.append((pos, pos + len(shown)))
        pos += len(shown) + len(after)
    return spans if pos == len(text) else None


def _pieces(text: str, specials: list[tuple[int, int, int]], user_spans: list[tuple[int, int]]) -> list:
    """Plain-text pieces and special ids; specials that touch a user span stay text."""
    pieces: list[str | int] = []
    pos = 0
    for start, end, token_id in specials:
        if any(start < u_end and u_start < end for u_start, u_end in user_spans):
            continue
        pieces += [text[pos:start], token_id]
        pos = end
    pieces.append(text[pos:])
    return pieces
