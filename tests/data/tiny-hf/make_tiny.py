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
    # mixture of experts: 4 experts of width 32, 2 per token, in every block
    "qwen3moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
                 "float32"),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32), "float32"),
    # phi3's default pad id (32000) lies outside the tiny vocabulary
    "phi3": ("phi3", dict(pad_token_id=None, bos_token_id=1, eos_token_id=2), "float32"),
    "granite": ("granite", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.1,
                                logits_scaling=8.0), "float32"),
    # 4 blocks: the 4th is the one without RoPE (no_rope_layer_interval 4, llama.cpp's fixed step)
    "smollm3": ("smollm3", dict(num_hidden_layers=4, pad_token_id=None, bos_token_id=1, eos_token_id=2),
                "float32"),
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


# ----- encoder-only embedding models ---------------------------------------------------------------
# family -> (config.json model_type, settings). BERT's own widths (its config has no GQA or head_dim)
ENCODERS: dict[str, tuple[str, dict]] = {
    "bert": ("bert", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                          max_position_embeddings=64, type_vocab_size=2, initializer_range=0.1)),
    "nomic-bert": ("nomic_bert", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, head_dim=16, max_position_embeddings=64,
                                      type_vocab_size=2, initializer_range=0.1)),
}
# A WordPiece vocabulary: BERT's specials, single characters, their ## continuations, a few words.
WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz0123456789.,!?'-",
             *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"),
             "the", "hello", "world", "emb", "##ed", "##ding", "##ing", "sentence", "model", "un",
             "##aff"]
EMBED_TEXTS = ["Hello, world!", "The embedding of a sentence.", "unaffable models embed 42 things",
               "Élan VITAL, déjà-vu?", "x"]


def write_encoder(family: str) -> None:
    """An encoder checkpoint saved as a sentence-transformers folder (the transformer, mean pooling,
    L2 normalisation) with ``reference.json``: the token ids transformers' tokenizer gives each of
    :data:`EMBED_TEXTS`, sentence-transformers' embeddings of them, and CLS-pooled ones (no
    normalisation) from the same weights."""
    import tempfile

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import AutoConfig, AutoModel, BertTokenizerFast

    model_type, settings = ENCODERS[family]
    folder = HERE / f"tiny-{family}"
    torch.manual_seed(SEED)
    config = AutoConfig.for_model(model_type, vocab_size=len(WORDPIECE), **settings)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(WORDPIECE) + "\n")
        tokenizer = BertTokenizerFast(vocab=str(Path(tmp) / "vocab.txt"), do_lower_case=True)
        AutoModel.from_config(config).float().eval().save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        transformer = Transformer(tmp)
        d = config.hidden_size
        mean = SentenceTransformer(modules=[transformer, Pooling(d, "mean"), Normalize()], device="cpu")
        cls = SentenceTransformer(modules=[transformer, Pooling(d, "cls")], device="cpu")
        mean.save(str(folder))
    (folder / "README.md").unlink()  # sentence-transformers' model card: nothing a test reads
    with torch.no_grad():
        embeddings = {"mean_normalized": mean.encode(EMBED_TEXTS, convert_to_numpy=True).tolist(),
                      "cls": cls.encode(EMBED_TEXTS, convert_to_numpy=True).tolist()}
    reference = {"architecture": model_type, "storage_dtype": "float32",
                 "reference": "sentence-transformers float32 encode of the saved weights",
                 "texts": EMBED_TEXTS, "token_ids": [tokenizer(t)["input_ids"] for t in EMBED_TEXTS],
                 **embeddings}
    (folder / "reference.json").write_text(json.dumps(reference))
    print(f"{folder}: {sum(p.numel() for p in mean.parameters())} parameters")


if __name__ == "__main__":
    unknown = [f for f in sys.argv[1:] if f not in FAMILIES and f not in ENCODERS]
    if unknown or len(sys.argv) < 2:
        sys.exit(f"usage: make_tiny.py FAMILY ...; families: {', '.join([*FAMILIES, *ENCODERS])}")
    for name in sys.argv[1:]:
        write_encoder(name) if name in ENCODERS else write(name)
