"""The int8 mode's fused decode step (core/llm/model/fused_decode.py) against its oracle, the grid path:
every step's logits bit for bit, on the real SmolLM2 and on small llama-style decoders of every
feature the step reads (block formats, biases, Q/K norms, sliding windows, RoPE layouts, tied or
untied heads) and of the phi3, granite and smollm3 builders (split fused matrices, multipliers,
layers without RoPE); and every case it must leave to the grid (observers, morphed or disabled layers,
float16 caches, prompts longer than MAX_ROWS, a region that cannot run) gives the grid's logits;
short prompts, speculative verification rows and batches are fused and equal the grid (and each
sequence alone).

Each test also counts the fused step's answers (:func:`spy`), so a test meant for the fused
step cannot pass on the grid alone, nor a fallback test on the fused step.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from types import SimpleNamespace

import numba
import numpy as np
import pytest

from loomlab.core.activations import GELU, SILU, SQRT_2_OVER_PI, activate
from loomlab.core.errors import LoomShapeError
from loomlab.core.llm.kernels.block_morph import encode
from loomlab.core.llm.kernels.mlp_kernel import gated
from loomlab.core.llm.kernels.quant_int8 import int8_activations
from loomlab.core.llm.model import causal_lm, fused_decode, gemma2, olmo2
from loomlab.core.llm.model.layer_builders import (
    assemble_causal_lm,
    attention_layer,
    build_decoder,
    decoder_block,
    mlp_layer,
    norm_layer,
    standard_rope,
)
from loomlab.core.llm.model.llm_layers import LLMGatedMLP, LLMHead, LLMRMSNorm
from loomlab.core.llm.model.loader import architecture
from loomlab.core.llm.model.model_args import ModelArgs
from loomlab.core.llm.model.rope import RopeConfig
from loomlab.core.morph import morph_layer, morph_sublayer
from loomlab.core.observe import CallbackObserver

F32 = np.float32
VOCAB = 96
PROMPT = [5, 17, 42, 3, 88, 11]
TWO_THREADS = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                 reason="needs a numba thread team of 2 (NUMBA_NUM_THREADS < 2 here)")


# ---------------------------------------------------------------------------------------------
# Helpers: the grid alone, greedy decoding (the spy on the fused step: conftest.py).


@contextmanager
def grid_only(monkeypatch):
    """The grid path alone: ``fused_step`` never answers."""
    with monkeypatch.context() as m:
        m.setattr(causal_lm, "fused_step", lambda *a: None)
        yield


@contextmanager
def threads(n: int):
    """numba's team at ``n`` threads, put back afterwards."""
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def greedy(net, prompt, steps: int, caches=None, between=None, moved: bool = True
           ) -> tuple[list[np.ndarray], list[int]]:
    """In the int8 mode: the prompt's logits, then ``steps`` greedy steps' (copies) and the tokens
    chosen; ``between(k)`` runs before step k (1-based). ``moved``: check every cache moved one
    position a token."""
    caches = caches if caches is not None else net.make_cache()
    logits, tokens = [], []
    with int8_activations():
        out = net.step(np.array([prompt]), [caches])
        logits.append(np.array(out))
        for k in range(1, steps + 1):
            if between is not None:
                between(k)
            tokens.append(int(np.argmax(out[0])))
            out = net.step(np.array([[tokens[-1]]]), [caches])
            logits.append(np.array(out))
    assert not moved or all(c.offset == len(prompt) + steps for c in caches)
    return logits, tokens


def assert_same_bits(got, expected):
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.dtype == b.dtype == F32 and a.shape == b.shape, k
        assert np.array_equal(a, b), f"step {k}: {np.sum(a != b)} logits differ, max {np.max(np.abs(a - b))}"


def twin_runs(monkeypatch, spy, make, run):
    """``run(net)`` on a network from ``make()`` with the fused step allowed, and on another from
    ``make()`` on the grid alone: (allowed result, grid result, the spy's answers)."""
    allowed = run(make())
    answers = list(spy)
    with grid_only(monkeypatch):
        grid = run(make())
    return allowed, grid, answers


# ---------------------------------------------------------------------------------------------
# 1. The real model.


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
def test_smollm2_generation_is_the_grid_bit_for_bit(smollm2, spy, monkeypatch, n_threads):
    net = smollm2.net
    prompt = smollm2.tokenizer.encode("The river Loom rises in the northern hills and")
    with threads(n_threads):
        fused, fused_tokens = greedy(net, prompt, 12)
        assert spy == [True] * 13  # the prompt (T <= MAX_ROWS rows) and every token fused
        with grid_only(monkeypatch):
            grid, grid_tokens = greedy(net, prompt, 12)
    assert fused_tokens == grid_tokens
    assert_same_bits(fused, grid)


@pytest.fixture(scope="module")
def gemma3():
    from loomlab.core.llm.generate.textmodel import load_model

    with load_model("gemma3-270m") as model:
        yield model


@pytest.mark.parametrize("n_threads", [pytest.param(2, marks=TWO_THREADS)])
def test_gemma3_generation_is_the_grid_bit_for_bit(gemma3, spy, monkeypatch, n_threads):
    """gemma3's blocks: a norm after each half, sliding and global layers with their own RoPE,
    Q/K norms, GELU, Q4_K / Q6_K / Q5_0 / Q8_0 matrices, a scaled embedding."""
    net = gemma3.net
    prompt = gemma3.tokenizer.encode("The river Loom rises in the northern hills and")
    with threads(n_threads):
        fused, fused_tokens = greedy(net, prompt, 6)
        assert spy == [True] * 7
        with grid_only(monkeypatch):
            grid, grid_tokens = greedy(net, prompt, 6)
    assert fused_tokens == grid_tokens
    assert_same_bits(fused, grid)


def test_output_multipliers_that_differ_stay_on_the_grid(spy, monkeypatch):
    """The step scales both halves of every block by one multiplier (granite's): a block whose
    MLP has its own is left to the grid."""
    def make():
        net = family_decoder("granite")
        blocks_of(net)[1][1].output_scale = 0.5
        return net

    allowed, grid, answers = twin_runs(monkeypatch, spy, make, lambda net: greedy(net, PROMPT, 3)[0])
    assert answers == [False] * 4
    assert_same_bits(allowed, grid)


def test_an_unknown_block_layout_stays_on_the_grid(spy, monkeypatch):
    """A block whose attention half has a norm before and two after is no layout the step knows."""
    def make():
        net = synthetic("32-blocks")
        half = net.cells[1].children[0]
        half.children.append(copy.deepcopy(half.children[0]))
        half.children.append(copy.deepcopy(half.children[0]))
        return net

    allowed, grid, answers = twin_runs(monkeypatch, spy, make, lambda net: greedy(net, PROMPT, 3)[0])
    assert answers == [False] * 4
    assert_same_bits(allowed, grid)


# ---------------------------------------------------------------------------------------------
# 2. Small llama-style decoders of each feature the step reads.

K_QUANTS = {"wq": "Q4_K", "wk": "Q6_K", "wv": "Q4_K", "wo": "Q4_K", "gate": "Q4_K", "up": "Q6_K",
            "down": "Q4_K", "head": "Q6_K"}
BLOCKS_32 = {"wq": "Q4_0", "wk": "Q4_1", "wv": "Q5_0", "wo": "Q5_1", "gate": "Q8_0", "up": "Q4_0",
             "down": "Q5_1", "head": "Q8_0"}
MIXED = {"wq": "Q6_K", "wk": "Q8_0", "wv": "Q4_K", "wo": "Q4_1", "gate": "Q4_K", "up": "Q5_0",
         "down": "Q6_K", "head": "Q4_0"}


def random_weights(args: ModelArgs, seed: int = 0, *, tied: bool = True, mlp_bias: bool = False) -> dict:
    """transformers-named float32 weights of ``args``'s shapes, scaled so activations stay ~1."""
    rng = np.random.default_rng(seed)
    d, f = args.hidden_size, args.intermediate_size
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(F32)

    def gamma(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(F32)

    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, d)).astype(F32),
         "model.norm.weight": gamma(d)}
    if not tied:
        w["lm_head.weight"] = mat(VOCAB, d)
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = gamma(d), gamma(d)
        for n, (rows, cols) in {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, q)}.items():
            w[f"{p}self_attn.{n}_proj.weight"] = mat(rows, cols)
            if n in args.attention_biases:
                w[f"{p}self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(rows)).astype(F32)
        if args.qk_norm:
            w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = (gamma(args.head_dim),
                                                                                   gamma(args.head_dim))
        for n, (rows, cols) in {"gate": (f, d), "up": (f, d), "down": (d, f)}.items():
            w[f"{p}mlp.{n}_proj.weight"] = mat(rows, cols)
            if mlp_bias:
                w[f"{p}mlp.{n}_proj.bias"] = (0.1 * rng.standard_normal(rows)).astype(F32)
    return w


def blocks_of(net):
    """``(attention, MLP)`` of each block (build_decoder's layout)."""
    return [(b.children[0].children[1], b.children[2].children[1]) for b in net.cells[1:-2]]


def morph_blocks(net, formats: dict[str, str]) -> None:
    """Every matrix into its block format of ``formats`` (the LM head: ``formats["head"]``)."""
    for attn, mlp in blocks_of(net):
        attn.cfg.dtype = attn.weights.morph_parts({n: formats[n] for n in ("wq", "wk", "wv", "wo")})
        mlp.cfg.dtype = mlp.weights.morph_parts({n: formats[n] for n in ("gate", "up", "down")})
    head = net.cells[-1]
    head.cfg.dtype = head.weights.morph_to(formats["head"])


ARGS = dict(architecture="llama", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
            intermediate_size=512, norm_eps=1e-5)
CASES = {
    "k-quants": ({}, K_QUANTS, {}),
    "32-blocks": ({}, BLOCKS_32, {}),
    "mixed-untied": ({}, MIXED, {"tied": False}),
    "qwen2-biases": ({"attention_biases": ("q", "k", "v")}, MIXED, {}),
    "all-biases": ({"attention_biases": ("q", "k", "v", "o")}, BLOCKS_32, {"mlp_bias": True}),
    "qwen3-qk-norm": ({"qk_norm": True}, K_QUANTS, {"tied": False}),
    "sliding-window": ({"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 3},
                       MIXED, {}),
    "interleaved-rope": ({"rope_interleaved": True}, BLOCKS_32, {}),
    "one-kv-head": ({"num_kv_heads": 1, "num_layers": 3}, K_QUANTS, {}),
    "heads-of-32": ({"num_heads": 8, "num_kv_heads": 4, "head_dim": 32, "qk_norm": True,
                     "attention_biases": ("q", "k", "v"), "rope_interleaved": True}, MIXED, {"tied": False}),
    # SmolLM2-like widths that are not whole super-blocks, 3 heads over 2 threads
    "narrow": ({"hidden_size": 96, "num_heads": 3, "num_kv_heads": 1, "head_dim": 32,
                "intermediate_size": 160}, BLOCKS_32, {}),
    "llama3-rope": ({"rope": RopeConfig(base=500000.0, kind="llama3", factor=8.0, original_context=4)},
                    MIXED, {"tied": False}),
}


# family -> its settings besides ARGS, the block formats
FAMILIES = {
    # the fused Q/K/V and gate/up quantized whole, then split into row ranges of their blocks
    "phi3": ({}, {"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q4_K", "gate": "Q4_K", "up": "Q4_K",
                  "down": "Q6_K", "head": "Q8_0"}),
    # every multiplier: the residual adds scaled, the logits divided
    "granite": ({"embedding_scale": 12.0, "residual_scale": 0.22, "attention_scale": 0.1, "logit_scale": 8.0},
                MIXED),
    # a layer without RoPE (a rope of zero frequencies) after one with
    "smollm3": ({"rope_layers": (True, False), "rope_interleaved": True}, K_QUANTS),
}


def family_decoder(family: str):
    """A ``family`` decoder built by its own module from random weights, in block formats."""
    changes, formats = FAMILIES[family]
    module = architecture(family)
    args = module.Args(**(ARGS | {"architecture": family} | changes))
    w = random_weights(args, 4)
    if family == "phi3":
        for i in range(args.num_layers):
            attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            w[attn + "qkv_proj.weight"] = encode(
                np.concatenate([w.pop(f"{attn}{n}_proj.weight") for n in "qkv"]), "Q8_0")
            w[mlp + "gate_up_proj.weight"] = encode(
                np.concatenate([w.pop(f"{mlp}{n}_proj.weight") for n in ("gate", "up")]), "Q4_K")
        w = module.sanitize(w, args)
    net = module.build(args, w)
    morph_blocks(net, formats)
    return net


def synthetic(case: str, seed: int = 0):
    if case in FAMILIES:
        return family_decoder(case)
    changes, formats, options = CASES[case]
    args = ModelArgs(**(ARGS | changes))
    net = build_decoder(args, random_weights(args, seed, **options))
    morph_blocks(net, formats)
    return net


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
@pytest.mark.parametrize("case", [*CASES, *FAMILIES])
def test_synthetic_decoder_is_the_grid_bit_for_bit(case, n_threads, spy, monkeypatch):
    net = synthetic(case)
    steps = 9
    with threads(n_threads):
        fused, fused_tokens = greedy(net, PROMPT, steps)
        assert spy == [True] * (steps + 1)
        with grid_only(monkeypatch):
            grid, grid_tokens = greedy(net, PROMPT, steps)
    assert fused_tokens == grid_tokens
    assert_same_bits(fused, grid)


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
def test_gelu_decoder_is_the_grid_bit_for_bit(n_threads, spy, monkeypatch):
    """The step's other activation (tanh-GELU), in a decoder assembled as build_decoder does."""
    args = ModelArgs(**ARGS)
    w = random_weights(args, 3)
    plain = build_decoder(args, w)
    blocks = [decoder_block(list(b.children[0].children),
                            [b.children[2].children[0], mlp_layer(args, w, i, "GELU")])
              for i, b in enumerate(plain.cells[1:-2])]
    net = assemble_causal_lm(args, w, blocks)
    morph_blocks(net, MIXED)
    assert blocks_of(net)[0][1].cfg.act_id == GELU
    with threads(n_threads):
        fused, _ = greedy(net, PROMPT, 8)
        assert spy == [True] * 9
        with grid_only(monkeypatch):
            grid, _ = greedy(net, PROMPT, 8)
    assert_same_bits(fused, grid)


def gemma2_decoder(seed: int = 0):
    """A gemma2 network (gemma3's block: a norm before and after each half) with soft-capped
    scores and logits, a sliding and a global layer, GELU, MIXED matrices."""
    layers = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 3}
    caps = {"attn_softcap": 1.5, "final_softcap": 8.0}
    args = gemma2.Args(**(ARGS | layers | caps | {"architecture": "gemma2"}))
    w = random_weights(args, seed)
    rng = np.random.default_rng(seed + 1)
    for i in range(args.num_layers):
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            w[f"model.layers.{i}.{name}.weight"] = (1 + 0.1 * rng.standard_normal(256)).astype(F32)
    net = gemma2.build(args, w)
    morph_blocks(net, MIXED)
    return net


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
def test_gemma2_decoder_is_the_grid_bit_for_bit(n_threads, spy, monkeypatch):
    """gemma2's soft caps in the step: the scores' by attend_chunk, the logits' by the head's own
    function; a prompt and 8 tokens."""
    with threads(n_threads):
        (fused, fused_tokens), (grid, grid_tokens), answers = twin_runs(
            monkeypatch, spy, gemma2_decoder, lambda net: greedy(net, PROMPT, 8))
    assert answers == [True] * 9 and fused_tokens == grid_tokens
    assert_same_bits(fused, grid)
    net = gemma2_decoder()
    assert net.cells[-1].softcap == 8.0 and blocks_of(net)[0][0].spec.softcap == 1.5
    assert 1 < np.abs(fused[-1]).max() <= 8.0  # capped logits


def test_caches_that_grow_alternate_trim_or_fork_are_followed(spy, monkeypatch):
    """The step writes into the caches' buffers by address: a cache that grows (buffers moved at
    256 positions), two sequences' caches taken in turn, a trimmed cache and a prefix cache's fork
    (made at its exact length, so it grows at its first token) each get the grid's logits."""
    long_prompt = [int(t) for t in np.random.default_rng(5).integers(0, VOCAB, 250)]

    def run(net):
        a, b = net.make_cache(), net.make_cache()
        out = []
        with int8_activations():
            out.append(net.step(np.array([long_prompt]), [a]))
            out.append(net.step(np.array([PROMPT]), [b]))
            for k in range(10):  # a passes 256 positions
                for caches in (a, b):
                    out.append(net.step(np.array([[k + 1]]), [caches]))
            for c in b:
                c.trim(3)
            forked = [c.fork(c.offset - 2) for c in a]
            for k in range(4):
                for caches in (b, forked, a):
                    out.append(net.step(np.array([[k + 20]]), [caches]))
        assert [c.offset for c in a] == [264] * 2 and [c.offset for c in forked] == [262] * 2
        assert [c.offset for c in b] == [len(PROMPT) + 10 - 3 + 4] * 2
        return [np.array(o) for o in out]

    fused, grid, answers = twin_runs(monkeypatch, spy, lambda: synthetic("mixed-untied"), run)
    assert answers == [False, True] + [True] * 32  # the long prompt: MAX_ROWS < 250 rows
    assert_same_bits(fused, grid)


@TWO_THREADS
def test_the_thread_count_changing_between_steps_is_followed(spy, monkeypatch):
    def run(net):
        try:
            return greedy(net, PROMPT, 8, between=lambda k: numba.set_num_threads(1 + k % 2))
        finally:
            numba.set_num_threads(before)

    before = numba.get_num_threads()
    (fused, _), (grid, _), answers = twin_runs(monkeypatch, spy, lambda: synthetic("qwen3-qk-norm"), run)
    assert answers == [True] * 9
    assert_same_bits(fused, grid)


@pytest.mark.parametrize(("token", "asked"), [
    (VOCAB, [True, True]), (-1, [True, True]), (2**40, [True, True]),  # the fused step's embedding raised
    (3.5, [True, False, True])])  # a float id: left to the grid, whose embedding refuses it
def test_a_bad_token_gets_the_grids_typed_error_and_moves_nothing(token, asked, spy):
    net = synthetic("32-blocks")
    caches = net.make_cache()
    with int8_activations():
        net.step(np.array([PROMPT]), [caches])
        with pytest.raises(LoomShapeError, match=rf"token ids must be integers in \[0, {VOCAB}\)"):
            net.step(np.array([[token]]), [caches])
        assert [c.offset for c in caches] == [len(PROMPT)] * 2
        net.step(np.array([[3]]), [caches])
    assert spy == asked
    assert [c.offset for c in caches] == [len(PROMPT) + 1] * 2


@pytest.mark.parametrize("last_only", [True, False])
def test_several_tokens_of_a_sequence_are_the_grid_bit_for_bit(last_only, spy, monkeypatch):
    """A prompt, then 7 tokens at once (a speculative verification), then a batch of two
    sequences of 3 tokens each: every row's logits (or each sequence's last) as the grid's."""
    def run(net):
        a, b = net.make_cache(), net.make_cache()
        with int8_activations():
            out = [net.step(np.array([PROMPT]), [a], last_only=last_only),
                   net.step(np.array([PROMPT[:4]]), [b], last_only=last_only),
                   net.step(np.array([[3, 1, 4, 1, 5, 9, 2]]), [a], last_only=last_only),
                   net.step(np.array([[6, 5, 3], [5, 8, 9]]), [a, b], last_only=last_only)]
        return [np.array(o) for o in out]

    fused, grid, answers = twin_runs(monkeypatch, spy, lambda: synthetic("qwen3-qk-norm"), run)
    assert answers == [True] * 4
    rows = [(1, 6), (1, 4), (1, 7), (2, 3)]
    assert [f.shape for f in fused] == [(b, VOCAB) if last_only else (b, t, VOCAB) for b, t in rows]
    assert_same_bits(fused, grid)


# ---------------------------------------------------------------------------------------------
# 3. What the step leaves to the grid gives the grid's result.


def test_an_observer_listening_keeps_the_step_on_the_grid(spy, monkeypatch):
    net = synthetic("mixed-untied")
    events = []
    net.attach(CallbackObserver(events.append))
    fused, _ = greedy(net, PROMPT, 4)
    assert spy == []  # never asked: CausalLM.step saw a listener
    assert len({e.step_count for e in events}) == 5  # it saw the layers of every step
    with grid_only(monkeypatch):
        grid, _ = greedy(synthetic("mixed-untied"), PROMPT, 4)
    assert_same_bits(fused, grid)


def _morph_head(net, dtype):
    morph_layer(net, len(net.cells) - 1, "float16" if dtype == "float16" else "Q8_0")


def _morph_mlp(net, dtype):
    mlp = blocks_of(net)[1][1]
    if dtype == "float16":
        morph_sublayer(mlp, 2, dtype)
    else:  # a block format for each matrix again
        mlp.cfg.dtype = mlp.weights.morph_parts({"gate": "Q4_K", "up": "Q6_K", "down": "Q5_0"})


def _f16_down(net, dtype):
    mlp = blocks_of(net)[0][1]
    mlp.cfg.dtype = mlp.weights.morph_parts({"down": "F16" if dtype == "float16" else "Q4_1"})


def _morph_embedding(net, dtype):
    morph_layer(net, 0, "Q8_0" if dtype == "float16" else "Q4_0")


GRID_FROM_3_TO_5 = [True, True, True, False, False, False, True, True, True]
MORPHS = {"head": (_morph_head, GRID_FROM_3_TO_5), "mlp": (_morph_mlp, GRID_FROM_3_TO_5),
          "f16-matrix": (_f16_down, GRID_FROM_3_TO_5),
          "embedding-blocks": (_morph_embedding, [True] * 9)}


@pytest.mark.parametrize("where", list(MORPHS))
def test_a_layer_morphed_between_steps_is_noticed(where, spy, monkeypatch):
    """At step 3: the LM head (a grid cell, morph_layer) or block 1's MLP (a child, morph_sublayer)
    morphed to float16, or block 0's down matrix to F16 (no integer kernel): the grid from then
    on; back in block formats at step 6: fused again. The embedding's table in a block format
    changes what both paths embed but not whether the step applies. Every step equals a grid run
    with the same morphs."""
    morph, expected = MORPHS[where]

    def run(net):
        def change(k):
            if k in (3, 6):
                morph(net, "float16" if k == 3 else "blocks")
        return greedy(net, PROMPT, 8, between=change)

    (fused, tokens), (grid, grid_tokens), answers = twin_runs(
        monkeypatch, spy, lambda: synthetic("mixed-untied"), run)
    assert answers == expected
    assert tokens == grid_tokens
    assert_same_bits(fused, grid)


def test_a_changed_weight_is_noticed(spy, monkeypatch):
    """The final norm's gamma changed between steps (its weights' version moves): the layout is
    gathered again and the fused step uses the new gamma, as the grid does."""
    def run(net):
        def change(k):
            if k == 4:
                store = net.cells[-2].weights
                store.master *= F32(1.5)
                store.touch()
        return greedy(net, PROMPT, 7, between=change)

    (fused, _), (grid, _), answers = twin_runs(monkeypatch, spy, lambda: synthetic("k-quants"), run)
    assert answers == [True] * 8
    assert_same_bits(fused, grid)


def _disable(layer, on, net):
    layer.cfg.is_disabled = on


def _link_to_final_norm(layer, on, net):
    """The layer stands for the final norm's cell while ``on`` (a remote link: the grid runs the
    target in its place)."""
    layer.cfg.is_remote_link, layer.cfg.target_x = on, len(net.cells) - 2


# a skipped attention's cache waits: the caches then stand at two offsets, the grid's for good
LAGGING = [True, True, True] + [False] * 6
SWITCHES = {"disabled-block": ("block", _disable, LAGGING),
            "disabled-attention": ("attention", _disable, LAGGING),
            "disabled-head": ("head", _disable, GRID_FROM_3_TO_5),
            "linked-mlp": ("mlp", _link_to_final_norm, GRID_FROM_3_TO_5)}


@pytest.mark.parametrize("case", list(SWITCHES))
def test_a_disabled_or_linked_layer_keeps_the_step_on_the_grid(case, spy, monkeypatch):
    """Block 1's cell, its attention or MLP (children), or the LM head disabled or linked
    elsewhere from step 3 to 5 (fixed tokens: with the head disabled a step returns hidden
    states, not logits)."""
    which, switch, expected = SWITCHES[case]

    def run(net):
        attn, mlp = blocks_of(net)[1]
        layer = {"block": net.cells[2], "attention": attn, "mlp": mlp, "head": net.cells[-1]}[which]
        caches = net.make_cache()
        out = []
        with int8_activations():
            out.append(net.step(np.array([PROMPT]), [caches]))
            for k in range(1, 9):
                switch(layer, 3 <= k < 6, net)
                out.append(net.step(np.array([[k]]), [caches]))
        return [np.array(o) for o in out], [c.offset for c in caches]

    (fused, offsets), (grid, grid_offsets), answers = twin_runs(
        monkeypatch, spy, lambda: synthetic("32-blocks"), run)
    assert answers == expected
    assert offsets == grid_offsets
    assert_same_bits(fused, grid)


def olmo2_decoder(seed: int = 0, post_norms_only: bool = True):
    """An olmo2 network (Q/K norms over all heads; ``post_norms_only``: a norm after each half
    and none before, else llama's pre-norm blocks around those attentions), MIXED matrices."""
    args = olmo2.Args(**(ARGS | {"architecture": "olmo2"}))
    w = random_weights(args, seed)
    rng = np.random.default_rng(seed + 1)
    d, q, kv = args.hidden_size, args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        for name, n in (("self_attn.q_norm", q), ("self_attn.k_norm", kv), ("post_feedforward_layernorm", d)):
            w[p + name + ".weight"] = (1 + 0.1 * rng.standard_normal(n)).astype(F32)
    if post_norms_only:
        net = olmo2.build(args, w)
    else:
        rope = standard_rope(args, w)
        blocks = [decoder_block([norm_layer(args, w, f"model.layers.{i}.input_layernorm.weight"),
                                 attention_layer(args, w, i, rope, whole_qk_norm=True)],
                                [norm_layer(args, w, f"model.layers.{i}.post_attention_layernorm.weight"),
                                 mlp_layer(args, w, i)]) for i in range(args.num_layers)]
        net = assemble_causal_lm(args, w, blocks)
    for block in net.cells[1:-2]:
        attn, mlp = (next(la for la in block.children[k].children if not isinstance(la, LLMRMSNorm))
                     for k in (0, 2))
        attn.cfg.dtype = attn.weights.morph_parts({n: MIXED[n] for n in ("wq", "wk", "wv", "wo")})
        mlp.cfg.dtype = mlp.weights.morph_parts({n: MIXED[n] for n in ("gate", "up", "down")})
    net.cells[-1].cfg.dtype = net.cells[-1].weights.morph_to(MIXED["head"])
    return net


@pytest.mark.parametrize("post_norms_only", [True, False], ids=["olmo2", "whole-qk-norm-in-pre-norm-blocks"])
def test_olmo2_stays_on_the_grid(post_norms_only, spy, monkeypatch):
    """olmo2's blocks (norms after each half only) are no layout of the step, and Q/K norms over
    all heads, which the step would take head by head, are refused in a layout it knows too."""
    allowed, grid, answers = twin_runs(monkeypatch, spy, lambda: olmo2_decoder(0, post_norms_only),
                                       lambda net: greedy(net, PROMPT, 3)[0])
    assert answers == [False] * 4
    assert_same_bits(allowed, grid)


def test_float16_caches_keep_the_step_on_the_grid(spy, monkeypatch):
    def run(net):
        return greedy(net, PROMPT, 4, caches=net.make_cache(dtype="float16"))

    (fused, _), (grid, _), answers = twin_runs(monkeypatch, spy, lambda: synthetic("mixed-untied"), run)
    assert answers == [False] * 5
    assert_same_bits(fused, grid)


def test_prompts_batches_and_continuations_are_fused(spy, monkeypatch):
    def run(net):
        caches = [net.make_cache(), net.make_cache()]
        out = []
        with int8_activations():
            out.append(net.step(np.array([PROMPT, PROMPT[::-1]]), caches))
            out.append(net.step(np.array([[7], [9]]), caches))  # one token each of two sequences
            out.append(net.step(np.array([[4, 5, 6]]), caches[:1]))  # T > 1 continuing one
            out.append(net.step(np.array([[8]]), caches[:1]))  # then fused
        assert [c.offset for c in caches[0]] == [len(PROMPT) + 5] * 2
        assert [c.offset for c in caches[1]] == [len(PROMPT) + 1] * 2
        return [np.array(o) for o in out]

    fused, grid, answers = twin_runs(monkeypatch, spy, lambda: synthetic("k-quants"), run)
    assert answers == [True] * 4
    assert_same_bits(fused, grid)


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
@pytest.mark.parametrize("case", ["k-quants", "32-blocks"])
def test_a_batch_is_the_grid_and_each_sequence_alone_bit_for_bit(case, n_threads, spy, monkeypatch):
    """Three sequences at different positions decoded together: each step's logits are the
    grid's batched step's, and each sequence's are what it gets decoded alone."""
    prompts = [PROMPT, PROMPT[:3], PROMPT[::-1] + [1, 2]]

    def together(net):
        caches = [net.make_cache() for _ in prompts]
        tokens, out = [], []
        with int8_activations():
            for p, c in zip(prompts, caches, strict=True):
                tokens.append(int(np.argmax(net.step(np.array([p]), [c])[0])))
            for _ in range(6):
                logits = np.array(net.step(np.array(tokens)[:, None], caches))
                out.append(logits)
                tokens = [int(np.argmax(row)) for row in logits]
        return out

    with threads(n_threads):
        fused, grid, answers = twin_runs(monkeypatch, spy, lambda: synthetic(case), together)
        assert answers == [True] * (len(prompts) + 6)
        assert_same_bits(fused, grid)
        net = synthetic(case)
        for b, p in enumerate(prompts):  # alone: the prompt's logits, then 6 steps
            alone, _ = greedy(net, p, 6)
            assert_same_bits([step[b:b + 1] for step in fused], alone[1:])


def test_int8_mode_off_keeps_the_step_on_the_grid(spy, monkeypatch):
    net = synthetic("mixed-untied")
    caches = net.make_cache()
    net.step(np.array([PROMPT]), [caches])
    net.step(np.array([[3]]), [caches])
    assert spy == [False, False]


# ---------------------------------------------------------------------------------------------
# 4. A region that cannot run one iteration per thread is abandoned: the grid's logits anyway.


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
def test_a_region_asking_for_more_threads_than_the_team_has_falls_back(n_threads, spy, monkeypatch):
    """Step 2's region asks for one thread more than the team has (fused_decode's numba alone is
    told so): it is abandoned, the grid computes that step over the caches it wrote into, and the
    fused step goes on from step 3; every step equals the grid's, every cache moved one a step."""
    real = fused_decode.numba

    def run(net):
        def change(k):
            short = SimpleNamespace(get_num_threads=lambda: n_threads + 1)
            monkeypatch.setattr(fused_decode, "numba", short if k == 2 else real)
        return greedy(net, PROMPT, 4, between=change)

    with threads(n_threads):
        (fused, _), (grid, _), answers = twin_runs(monkeypatch, spy, lambda: synthetic("qwen2-biases"), run)
    assert answers == [True, True, False, True, True]
    assert_same_bits(fused, grid)


# ---------------------------------------------------------------------------------------------
# 6. The gated activation kernel.


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float32 values lie between a and b (0 where equal, -0.0 == 0.0)."""
    def ordered(x):
        i = x.astype(F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


def gate_and_up(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Gate values over 10 decades of both signs, the exp / x^3 overflow edges, and ~N(0, 4)."""
    rng = np.random.default_rng(seed)
    mags = np.logspace(-6, 4.5, 4000).astype(F32)
    edges = np.array([0, 1e-30, 1, 5, 10, 15, 20, 30, 80, 87, 88, 89, 90, 100, 1e4, 1e6, 1e12, 1e20, 3e38],
                     F32)
    gate = np.concatenate([mags, -mags, edges, -edges, rng.standard_normal(4000).astype(F32) * 4])
    return gate, rng.uniform(-3, 3, gate.size).astype(F32)


def exact(act: int, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The activation formula in float64."""
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        if act == SILU:
            a = g / (1 + np.exp(-g))
        else:
            a = 0.5 * g * (1 + np.tanh(SQRT_2_OVER_PI * (g + 0.044715 * g**3)))
    return a * up


@pytest.mark.parametrize("act", [SILU, GELU])
def test_gated_is_the_activation_formula(act):
    """Against numpy's float32 formula (core.activations.activate) within 4 ulp where the formula
    is well conditioned (SiLU's normal range; GELU for gate >= 0, where 1 + tanh does not cancel:
    below, libm's and numpy's tanh differing in the last bit become many ulp of the result); and,
    everywhere, within float32's rounding of the float64 formula (a few eps of the result, plus for
    GELU tanh's last bit times |gate * up|)."""
    gate, up = gate_and_up()
    with np.errstate(over="ignore", invalid="ignore"):
        expected = activate(act, gate) * up
    got = gated(act, gate, up)
    assert got.dtype == F32 and got.shape == gate.shape and np.all(np.isfinite(got))
    conditioned = np.abs(expected) >= 1e-30 if act == SILU else gate >= 0
    assert ulps(got, expected)[conditioned].max() <= 4
    truth, eps = exact(act, gate, up), np.finfo(F32).eps
    tanh_bit = eps * np.abs(gate.astype(np.float64) * up) if act == GELU else 0
    bound = 4 * eps * np.abs(truth) + 1e-36 + tanh_bit
    assert np.all(np.abs(got - truth) <= bound)
    assert np.all(np.abs(expected - truth) <= bound)  # the bound is one numpy's formula meets too
    assert np.array_equal(gated(act, gate.reshape(2, -1), up.reshape(2, -1)), got.reshape(2, -1))


@pytest.mark.parametrize("activation", ["Silu", "GELU"])
def test_int8_gated_mlp_is_the_kernels_composition(activation):
    """The int8 mode's LLMGatedMLP is ``down(gated(act, gate(x), up(x)))``, each product the int8
    one an LLMHead of the same matrix computes, plus the biases."""
    rng = np.random.default_rng(11)
    d, f = 256, 512
    w = {"gate": encode(rng.standard_normal((f, d)).astype(F32) / 16, "Q4_K"),
         "up": encode(rng.standard_normal((f, d)).astype(F32) / 16, "Q8_0"),
         "down": encode(rng.standard_normal((d, f)).astype(F32) / 16, "Q6_K"),
         "b_gate": rng.standard_normal(f).astype(F32), "b_up": rng.standard_normal(f).astype(F32),
         "b_down": rng.standard_normal(d).astype(F32)}
    mlp = LLMGatedMLP(w, activation)
    x = rng.standard_normal((1, 3, d)).astype(F32)
    with int8_activations():
        got, _ = mlp.forward(x, None)
        gate = LLMHead(w["gate"]).forward(x, None)[0] + w["b_gate"]
        up = LLMHead(w["up"]).forward(x, None)[0] + w["b_up"]
        h = gated(mlp.cfg.act_id, gate, up)
        expected = LLMHead(w["down"]).forward(h, None)[0] + w["b_down"]
    assert np.array_equal(got, expected)
