"""Write ``tests/data/tiny-hf/tiny-<family>/``: a small random transformers checkpoint of one family
(config.json + model.safetensors, as ``save_pretrained`` writes it) and ``reference.json``, the
oracle the architecture tests compare with: transformers' float32 logits at every position of
:data:`INPUT_IDS` and its greedy continuation of them, each token chosen by a full forward of the
sequence so far (no cache, no generation settings in the way).

torch and transformers are the oracle, not dependencies of the project: run this with an
environment that has them, naming the families to (re)write::

    python tests/data/tiny-hf/make_tiny.py phi3 granite

Every family is 3 blocks of width 64 over a 256-token vocabulary (a checkpoint well under 1 MB).
Weights are drawn with a larger spread than transformers' default (``initializer_range`` 0.1, not
0.02): at 0.02 a tiny model attends almost uniformly and its logits hardly depend on the
architecture's details, which then go untested.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
INPUT_IDS = [1, 17, 42, 99, 3, 250, 7, 7, 7, 128, 64, 5]
GREEDY = 32
SEED = 0

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
              initializer_range=0.1, tie_word_embeddings=False)

# family -> (config.json model_type, settings besides COMMON, storage dtype of the safetensors)
FAMILIES: dict[str, tuple[str, dict, str]] = {
    # soft-capping small enough to bend this model's scores and logits; window 4 < the 12-token prompt;
    # query_pre_attn_scalar = head_dim and a tied head, as llama.cpp assumes for a GGUF of this size
    "gemma2": ("gemma2", dict(attn_logit_softcapping=1.0, final_logit_softcapping=2.0, sliding_window=4,
                              query_pre_attn_scalar=16, tie_word_embeddings=True), "float32"),
    "olmo2": ("olmo2", {}, "float32"),
}
# families whose norm gammas are drawn at random too (transformers starts them all equal, so a norm
# read into the wrong place would go unnoticed)
RANDOM_NORMS = {"gemma2", "olmo2"}


def write(family: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, settings, dtype = FAMILIES[family]
    torch.manual_seed(SEED)
    config = AutoConfig.for_model(model_type, **{**COMMON, **settings})
    model = AutoModelForCausalLM.from_config(config).float().eval()
    if family in RANDOM_NORMS:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(0.2 * torch.randn_like(p))
    folder = HERE / f"tiny-{family}"
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    # the reference is the saved weights in float32 (bfloat16 storage rounds them first)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([INPUT_IDS])).logits[0]
        ids = list(INPUT_IDS)
        for _ in range(GREEDY):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    reference = {"architecture": model_type, "storage_dtype": dtype,
                 "reference": "transformers+torch float32 forward of the saved weights",
                 "input_ids": INPUT_IDS, "logits": logits.tolist(), f"greedy_{GREEDY}": ids[len(INPUT_IDS):]}
    (folder / "reference.json").write_text(json.dumps(reference))
    print(f"{folder}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    unknown = [f for f in sys.argv[1:] if f not in FAMILIES]
    if unknown or len(sys.argv) < 2:
        sys.exit(f"usage: make_tiny.py FAMILY ...; families: {', '.join(FAMILIES)}")
    for name in sys.argv[1:]:
        write(name)
