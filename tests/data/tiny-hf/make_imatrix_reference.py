"""Write ``tests/data/tiny-hf/tiny-<family>/imatrix.json``: the oracle the importance-matrix tests
compare with, computed by transformers+torch (float32, eager attention) from the checked-in tiny
checkpoint, with forward pre-hooks on every ``nn.Linear`` written here.

llama-imatrix's statistics, as ``tools/imatrix/imatrix.cpp`` collects them: a fixed token sequence
(:data:`TEXT_IDS`, its first token the model's BOS) is cut into ``len // CTX`` chunks of ``CTX``
tokens, each chunk's first token replaced by BOS; each chunk runs alone from position 0; every
linear layer's input rows (every token) are summed per input column, squared (``in_sum2``) and plain
(``in_sum``), and counted. Each linear is named as llama.cpp names its GGUF tensor (phi3's fused
``qkv_proj`` is ``attn_qkv``, its ``gate_up_proj`` ``ffn_up``); the LM head is ``output.weight``,
kept only when it is not tied to the embedding (a tied head is ``token_embd.weight`` to llama.cpp,
which it never collects).

torch and transformers are the oracle, not dependencies of the project: run this with an
environment that has them, naming the families to (re)write (all of :data:`FAMILIES` if none)::

    python tests/data/tiny-hf/make_imatrix_reference.py llama
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = ("llama", "gemma2", "phi3")
CTX = 32
N_TOKENS = 80  # two whole chunks and a rest the chunking leaves out
REFERENCE = "transformers+torch float32, eager attention, nn.Linear pre-hooks in make_imatrix_reference.py"
# transformers' module path inside a decoder layer -> llama.cpp's tensor stem
STEMS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def text_ids(bos: int, vocab: int) -> list[int]:
    """A fixed token sequence, as a tokenizer that adds BOS would give it."""
    return [bos] + [(i * 37 + 11) % (vocab - 1) + 1 for i in range(N_TOKENS - 1)]


def chunks_of(ids: list[int], ctx: int, bos: int) -> list[list[int]]:
    """llama-imatrix's chunks: ``len // ctx`` of them, each one's first token BOS."""
    return [[bos] + ids[i * ctx + 1:(i + 1) * ctx] for i in range(len(ids) // ctx)]


def gguf_name(module: str, tied: bool) -> str | None:
    if module == "lm_head":
        return None if tied else "output.weight"
    m = LAYER.fullmatch(module)
    if m is None or m[2] not in STEMS:
        raise SystemExit(f"no GGUF name for the linear {module}")
    return f"blk.{m[1]}.{STEMS[m[2]]}.weight"


def sig(values) -> list[float]:
    return [float(f"{v:.7g}") for v in values]


def build(family: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    folder = HERE / f"tiny-{family}"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    config = model.config
    bos, tied = int(config.bos_token_id), bool(getattr(config, "tie_word_embeddings", False))
    ids = text_ids(bos, config.vocab_size)
    chunks = chunks_of(ids, CTX, bos)
    sums: dict[str, dict] = {}

    def hook(name):
        def f(module, args):
            x = args[0].detach().to(torch.float64).reshape(-1, args[0].shape[-1])
            s = sums.setdefault(name, {"in_sum2": torch.zeros(x.shape[1], dtype=torch.float64),
                                       "in_sum": torch.zeros(x.shape[1], dtype=torch.float64), "count": 0})
            s["in_sum2"] += (x * x).sum(0)
            s["in_sum"] += x.sum(0)
            s["count"] += x.shape[0]
        return f

    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            name = gguf_name(module_name, tied)
            if name is not None:
                module.register_forward_pre_hook(hook(name))
    with torch.no_grad():
        for chunk in chunks:
            model(torch.tensor([chunk]), use_cache=False)
    for name, s in sums.items():
        assert s["count"] == len(chunks) * CTX, f"{family}: {name} saw {s['count']} tokens"
    return {"architecture": config.model_type, "reference": REFERENCE, "ctx": CTX, "bos": bos,
            "ids": ids, "chunks": chunks,
            "tensors": {name: {"in_sum2": sig(s["in_sum2"].tolist()), "in_sum": sig(s["in_sum"].tolist()),
                               "count": s["count"]} for name, s in sorted(sums.items())}}


def write(family: str) -> None:
    data = build(family)
    path = HERE / f"tiny-{family}" / "imatrix.json"
    path.write_text(json.dumps(data, separators=(",", ":"), allow_nan=False))
    print(f"{path}: {path.stat().st_size} bytes, {len(data['tensors'])} tensors, "
          f"{len(data['chunks'])} chunks")


if __name__ == "__main__":
    unknown = [f for f in sys.argv[1:] if f not in FAMILIES]
    if unknown:
        sys.exit(f"usage: make_imatrix_reference.py [FAMILY ...]; families: {', '.join(FAMILIES)}")
    for name in sys.argv[1:] or FAMILIES:
        write(name)
