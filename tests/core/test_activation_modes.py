"""TextModel.activations: the exact float32 path (default) and the opt-in int8 mode, which
quantizes decode activations per block as llama.cpp does (oracle: the float path, to within the
KL llama.cpp's own numerics give, and the int8 kernels called directly)."""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.kernels.quant_int8 import int8_enabled, int8_matvec


def _decode_logits(model, ids):
    caches = [model.net.make_cache()]
    with model.busy():
        model.net.step(np.array([ids[:-1]]), caches)
        return model.net.step(np.array([[ids[-1]]]), caches)[0], int8_enabled()


def test_int8_mode_multiplies_with_the_integer_kernels_and_stays_close(smollm2):
    ids = smollm2.tokenizer.encode("The capital of France is the city of", add_special_tokens=True)
    exact, was_int8 = _decode_logits(smollm2, ids)
    assert not was_int8
    smollm2.activations = "int8"
    try:
        fast, was_int8 = _decode_logits(smollm2, ids)
        # the LM head's product in the step is the kernel's own (tied Q8_0 table)
        head = smollm2.net.cells[-1].weights.current("float32")["weight"]
        hidden = smollm2.net.hidden_states(np.array([ids]))[0, -1]
        with smollm2.busy():
            np.testing.assert_array_equal(smollm2.net.cells[-1].forward(hidden[None], None)[0][0],
                                          int8_matvec(head, hidden))
    finally:
        smollm2.activations = "float32"
    assert was_int8 and not np.array_equal(fast, exact)
    p, q = _softmax(exact), _softmax(fast)
    assert float(np.sum(p * (np.log(p) - np.log(q)))) < 0.02  # measured ~0.002 on average
    assert np.argmax(fast) == np.argmax(exact)


def test_bad_activation_mode(smollm2):
    with pytest.raises(LoomConfigError, match="activations"):
        smollm2.activations = "int4"
    assert smollm2.activations == "float32"


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def test_int8_mode_prefills_long_prompts_row_invariantly(smollm2):
    """In the int8 mode every matrix product takes the integer kernels, prompts past 64 tokens too
    (the float mode's dequantize + BLAS path is not row-invariant): a 100-token prompt prefilled
    at once gives its last 40 positions the bits of a 60-token step followed by a 40-token one."""
    ids = np.random.default_rng(5).integers(100, 20000, (1, 100))
    smollm2.activations = "int8"
    try:
        with smollm2.busy():
            whole = smollm2.net.step(ids, [smollm2.net.make_cache()], last_only=False)
            caches = [smollm2.net.make_cache()]
            smollm2.net.step(ids[:, :60], caches)
            split = smollm2.net.step(ids[:, 60:], caches, last_only=False)
    finally:
        smollm2.activations = "float32"
    np.testing.assert_array_equal(whole[0, 60:].view(np.uint32), split[0].view(np.uint32))
