"""Write ``tests/data/tiny-hf/tiny-<family>/inspect.json``: the oracle the model-inspection tests
compare with, computed by transformers+torch (float32, eager attention) from the checked-in tiny
checkpoint of each causal family, with hooks written here:

- ``patterns``: every head's attention pattern on :data:`INPUT_IDS` (``output_attentions``);
- ``lens``: the logit lens of the clean run (the residual stream after the embedding and after each
  decoder layer, each taken through the final norm, the head and the family's logit scaling and
  soft-capping), its top 5 tokens and the answer token's probability and rank at every position;
- ``attribution``: direct logit attribution of the answer's logit at the last position, every RMSNorm
  between a component and the residual stream linearised by freezing its 1/rms at the clean run's;
- ``ablation``: the answer's log-probability and an 8-token greedy continuation (each token by a full
  forward of the sequence so far, no cache) with a head / attention / MLP / block knocked out;
- ``patching``: activation patching from the clean run on :data:`INPUT_IDS` into the run on
  :data:`CORRUPTED_IDS`, scored by the logit difference between the answer and the wrong token.

torch and transformers are the oracle, not dependencies of the project: run this with an
environment that has them, naming the families to (re)write (all causal families if none)::

    python tests/data/tiny-hf/make_inspect_reference.py llama gemma2

Every check the data rests on (the lens at the last layer is the model's output, the attributions sum
to the logit, the per-family norm and multiplier handling reproduces every layer) is asserted here.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_tiny import INPUT_IDS  # noqa: E402

CORRUPTED_IDS = [{3: 98, 9: 130}.get(i, t) for i, t in enumerate(INPUT_IDS)]
GREEDY = 8
REFERENCE = "transformers+torch float32, eager attention, hooks written in make_inspect_reference.py"
TOP = 5


@dataclass(frozen=True)
class Family:
    """Where a family's decoder layer puts its norms and multipliers (read off its modeling file)."""
    # the decoder-layer module whose output is the attention part added to the residual (before any
    # multiplier); when it is not self_attn it is an RMSNorm applied to self_attn's output
    attn_out: str = "self_attn"
    # the decoder-layer module whose output is the MLP (or MoE) part added to the residual
    mlp_out: str = "mlp"
    # RMSNorm scaling: weight + norm_offset (gemma: x * (1 + weight))
    norm_offset: float = 0.0
    # config attribute multiplying both parts before they are added to the residual (granite)
    residual_multiplier: str | None = None
    # config attribute dividing the head's logits (granite)
    logits_divisor: str | None = None
    # config attribute soft-capping the final logits, cap * tanh(logits / cap) (gemma2)
    final_softcap: str | None = None


POST_NORMS = dict(attn_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm")
FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "qwen2": Family(),
    "mixtral": Family(),
    "qwen3moe": Family(),
    "phi3": Family(),
    "smollm3": Family(),
    "granite": Family(residual_multiplier="residual_multiplier", logits_divisor="logits_scaling"),
    "gemma2": Family(**POST_NORMS, norm_offset=1.0, final_softcap="final_logit_softcapping"),
    "gemma3": Family(**POST_NORMS, norm_offset=1.0, final_softcap="final_logit_softcapping"),
    # olmo2 has no pre-norms: its post_attention_layernorm normalises the attention output
    "olmo2": Family(**POST_NORMS),
}


def sig(x) -> float | list:
    """Floats (nested lists of them) rounded to 7 significant digits."""
    if isinstance(x, list):
        return [sig(v) for v in x]
    return float(f"{float(x):.7g}")


def first(out):
    return out[0] if isinstance(out, tuple) else out


def with_first(out, new):
    return (new, *out[1:]) if isinstance(out, tuple) else new


# ----- hooks: (module, kind, function) triples registered for one forward ---------------------------

def on_output(module, f):
    """f(output tensor) -> replacement (the first element of a tuple output)."""
    return module, "out", lambda m, args, kwargs, out: with_first(out, f(first(out)))


def on_input(module, f, name):
    """f(first input tensor) -> replacement, passed positionally or as keyword ``name``."""
    def hook(m, args, kwargs):
        if args:
            return (f(args[0]), *args[1:]), kwargs
        return args, {**kwargs, name: f(kwargs[name])}
    return module, "pre", hook


def passthrough(module):
    """The module returns its input unchanged."""
    def hook(m, args, kwargs, out):
        return with_first(out, args[0] if args else kwargs["hidden_states"])
    return module, "out", hook


def store(into: list):
    def f(x):
        into.append(x.detach().clone())
        return x
    return f


@contextmanager
def hooked(edits):
    handles = []
    try:
        for module, kind, fn in edits:
            if kind == "pre":
                handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(fn, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def close(a, b, tol, what):
    import torch
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    err = float((a - b).abs().max())
    assert err <= tol, f"{what}: off by {err:.3g} (tolerance {tol})"


class Inspector:
    def __init__(self, family: str):
        import torch
        from transformers import AutoModelForCausalLM

        self.family = family
        self.fam = FAMILIES[family]
        self.model = AutoModelForCausalLM.from_pretrained(
            HERE / f"tiny-{family}", dtype=torch.float32, attn_implementation="eager").eval()
        self.config = self.model.config
        self.layers = list(self.model.model.layers)
        self.L = len(self.layers)
        self.H = self.config.num_attention_heads
        self.hd = self.layers[0].self_attn.o_proj.in_features // self.H
        def setting(name, default):
            return getattr(self.config, name) if name else default
        self.mult = setting(self.fam.residual_multiplier, 1.0)
        self.div = setting(self.fam.logits_divisor, 1.0)
        self.cap = setting(self.fam.final_softcap, None)

    # modules of layer i
    def attn(self, i):
        return self.layers[i].self_attn

    def o_proj(self, i):
        return self.layers[i].self_attn.o_proj

    def attn_out(self, i):
        return getattr(self.layers[i], self.fam.attn_out)

    def mlp_out(self, i):
        return getattr(self.layers[i], self.fam.mlp_out)

    def head(self, h):
        return slice(h * self.hd, (h + 1) * self.hd)

    def forward(self, ids, edits=(), **kwargs):
        import torch
        with hooked(edits):
            return self.model(torch.tensor([ids]), use_cache=False, **kwargs)

    def greedy(self, edits=()):
        ids = list(INPUT_IDS)
        for _ in range(GREEDY):
            ids.append(int(self.forward(ids, edits).logits[0, -1].argmax()))
        return ids[len(INPUT_IDS):]

    # the final norm, head, scaling and capping as the model's forward applies them
    def norm_scale(self, norm, x):
        """1/rms of x as ``norm`` computes it, and the weight as it applies it; checked against it."""
        import torch
        eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
        s = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        w = norm.weight + self.fam.norm_offset
        close(norm(x), x * s * w, 1e-5, f"{self.family}: RMSNorm linearisation of {type(norm).__name__}")
        return s, w

    def unembed(self, r):
        import torch
        logits = self.model.lm_head(self.model.model.norm(r)) / self.div
        if self.cap is not None:
            logits = torch.tanh(logits / self.cap) * self.cap
        return logits

    def capture(self, ids, **kwargs):
        """One forward with every activation the data needs stored, per layer."""
        acts = {k: [] for k in ("resid_pre", "resid_post", "z", "o", "attn", "mlp")}
        edits = []
        for i, layer in enumerate(self.layers):
            edits += [on_input(layer, store(acts["resid_pre"]), "hidden_states"),
                      on_output(layer, store(acts["resid_post"])),
                      on_input(self.o_proj(i), store(acts["z"]), "input"),
                      on_output(self.attn(i), store(acts["o"])),
                      on_output(self.attn_out(i), store(acts["attn"])),
                      on_output(self.mlp_out(i), store(acts["mlp"]))]
        out = self.forward(ids, edits, **kwargs)
        for k, v in acts.items():
            assert len(v) == self.L, f"{self.family}: {k} captured {len(v)} times for {self.L} layers"
            acts[k] = [t[0] for t in v]  # drop the batch
        return out, acts

    def build(self) -> dict:
        import torch

        L, H, T = self.L, self.H, len(INPUT_IDS)
        clean, acts = self.capture(INPUT_IDS, output_attentions=True, output_hidden_states=True)
        corrupted = self.forward(CORRUPTED_IDS)
        logits = clean.logits[0]
        answer = int(logits[-1].argmax())
        wrong = int(corrupted.logits[0, -1].argmax())
        if wrong == answer:
            wrong = int(logits[-1].topk(2).indices[1])

        def diff(out):
            return float(out.logits[0, -1, answer] - out.logits[0, -1, wrong])

        # the residual stream, and the per-family reading of each layer's two parts
        resid = [acts["resid_pre"][0]] + acts["resid_post"]
        close(resid[0], clean.hidden_states[0][0], 0, f"{self.family}: embedding output")
        for i in range(L):
            close(acts["resid_pre"][i], resid[i], 0, f"{self.family}: layer {i} input")
            close(resid[i] + self.mult * (acts["attn"][i] + acts["mlp"][i]), resid[i + 1], 1e-5,
                  f"{self.family}: layer {i} = input + attention part + MLP part")
            bias = self.o_proj(i).bias
            W = self.o_proj(i).weight
            heads = sum(acts["z"][i][:, self.head(h)] @ W[:, self.head(h)].T for h in range(H))
            close(heads + (0 if bias is None else bias), acts["o"][i], 1e-5,
                  f"{self.family}: layer {i} heads + bias = o_proj output")
            if self.fam.attn_out != "self_attn":
                s, w = self.norm_scale(self.attn_out(i), acts["o"][i])
                close(acts["o"][i] * s * w, acts["attn"][i], 1e-5,
                      f"{self.family}: layer {i} post-attention norm")

        # ----- attention patterns
        patterns = [a[0].tolist() for a in clean.attentions]
        assert len(patterns) == L and len(patterns[0]) == H
        for a in clean.attentions:
            close(a[0].sum(-1), torch.ones(H, T), 1e-5, f"{self.family}: pattern rows sum to 1")

        # ----- logit lens
        lens = {"top_ids": [], "top_probs": [], "answer_probs": [], "answer_ranks": []}
        for j, r in enumerate(resid):
            lens_logits = self.unembed(r)
            if j == L:
                close(lens_logits, logits, 1e-5, f"{self.family}: lens at the last layer = final logits")
            probs = lens_logits.softmax(-1)
            top = probs.topk(TOP, dim=-1)
            lens["top_ids"].append(top.indices.tolist())
            lens["top_probs"].append(sig(top.values.tolist()))
            lens["answer_probs"].append(sig(probs[:, answer].tolist()))
            lens["answer_ranks"].append((lens_logits > lens_logits[:, answer:answer + 1]).sum(-1).tolist())

        # ----- direct logit attribution at the last position
        r = resid[L][-1]
        s, w = self.norm_scale(self.model.model.norm, r)
        u = w * self.model.lm_head.weight[answer]

        def contribution(c):
            return float(s * (c @ u) / self.div)

        logit = contribution(r)
        close(logit, self.model.lm_head(self.model.model.norm(r))[answer] / self.div, 1e-5,
              f"{self.family}: attributed logit = head's logit")
        if self.cap is None:
            close(logit, logits[-1, answer], 1e-5, f"{self.family}: attributed logit = final logit")
        head_attr, bias_attr, mlp_attr = [], [], []
        for i in range(L):
            if self.fam.attn_out == "self_attn":
                linear = self.mult
            else:  # the post-attention norm, its 1/rms frozen at the clean run's
                so, wo = self.norm_scale(self.attn_out(i), acts["o"][i][-1])
                linear = so * wo * self.mult
            W = self.o_proj(i).weight
            z = acts["z"][i][-1]
            head_attr.append([contribution(linear * (W[:, self.head(h)] @ z[self.head(h)]))
                              for h in range(H)])
            bias = self.o_proj(i).bias
            bias_attr.append(0.0 if bias is None else contribution(linear * bias))
            mlp_attr.append(contribution(self.mult * acts["mlp"][i][-1]))
        embed = contribution(resid[0][-1])
        total = embed + sum(map(sum, head_attr)) + sum(bias_attr) + sum(mlp_attr)
        close(total, logit, 1e-4, f"{self.family}: attributions sum to the logit")
        attribution = {"logit": sig(logit), "embed": sig(embed), "heads": sig(head_attr),
                       "attn_bias": sig(bias_attr), "mlp": sig(mlp_attr)}

        # ----- ablation
        def answer_logprob(out):
            return sig(out.logits[0, -1].log_softmax(-1)[answer])

        def set_head(h, value):
            def f(z):
                z = z.clone()
                z[..., self.head(h)] = value
                return z
            return f

        mean_z = acts["z"][0][:, self.head(2)].mean(0)
        cases = [
            (dict(kind="head", layer=1, head=0, mode="zero"),
             [on_input(self.o_proj(1), set_head(0, 0.0), "input")]),
            (dict(kind="head", layer=L - 1, head=1, mode="zero"),
             [on_input(self.o_proj(L - 1), set_head(1, 0.0), "input")]),
            (dict(kind="head", layer=0, head=2, mode="mean"),
             [on_input(self.o_proj(0), set_head(2, mean_z), "input")]),
            (dict(kind="attention", layer=0, mode="zero"), [on_output(self.attn(0), torch.zeros_like)]),
            (dict(kind="mlp", layer=1, mode="zero"), [on_output(self.mlp_out(1), torch.zeros_like)]),
            (dict(kind="block", layer=1, mode="disable"), [passthrough(self.layers[1])]),
        ]
        # zeroing self_attn zeroes the attention part (a post-norm of zeros is zeros)
        seen = []
        self.forward(INPUT_IDS, cases[3][1] + [on_output(self.attn_out(0), store(seen))])
        assert float(seen[0].abs().max()) == 0.0, f"{self.family}: zeroed attention still adds something"
        # a disabled block hands its input on unchanged
        seen = []
        self.forward(INPUT_IDS, cases[5][1] + [on_input(self.layers[2], store(seen), "hidden_states")])
        close(seen[0][0], acts["resid_pre"][1], 0, f"{self.family}: disabled block 1 passes its input on")
        ablation = {"clean": {"answer_logprob": answer_logprob(clean), "greedy": self.greedy()},
                    "cases": [{**case, "answer_logprob": answer_logprob(self.forward(INPUT_IDS, edits)),
                               "greedy": self.greedy(edits)} for case, edits in cases]}

        # ----- activation patching
        def at(p, value):
            def f(x):
                x = x.clone()
                x[:, p] = value[p]
                return x
            return f

        def patched(edits):
            return sig(diff(self.forward(CORRUPTED_IDS, edits)))

        patching = {
            "clean_diff": sig(diff(clean)), "corrupted_diff": sig(diff(corrupted)),
            "resid_pre": [[patched([on_input(self.layers[i], at(p, acts["resid_pre"][i]), "hidden_states")])
                           for p in range(T)] for i in range(L)],
            "attention": [[patched([on_output(self.attn_out(i), at(p, acts["attn"][i]))]) for p in range(T)]
                          for i in range(L)],
            "mlp": [[patched([on_output(self.mlp_out(i), at(p, acts["mlp"][i]))]) for p in range(T)]
                    for i in range(L)],
            "heads": [[patched([on_input(self.o_proj(i), set_head(h, acts["z"][i][:, self.head(h)]),
                                         "input")])
                       for h in range(H)] for i in range(L)],
        }
        # patching the embedding at every changed position makes the corrupted run the clean one
        changed = [p for p in range(T) if INPUT_IDS[p] != CORRUPTED_IDS[p]]
        both = self.forward(CORRUPTED_IDS,
                            [on_input(self.layers[0], at(changed, acts["resid_pre"][0]), "hidden_states")])
        close(diff(both), diff(clean), 1e-4, f"{self.family}: patched embeddings restore the clean diff")
        close(both.logits, clean.logits, 1e-4, f"{self.family}: patched embeddings restore the clean run")

        return {"architecture": self.config.model_type,
                "reference": REFERENCE,
                "input_ids": INPUT_IDS, "corrupted_ids": CORRUPTED_IDS, "answer": answer, "wrong": wrong,
                "patterns": sig(patterns), "lens": lens, "attribution": attribution,
                "ablation": ablation, "patching": patching}


def write(family: str) -> None:
    import torch

    with torch.no_grad():
        data = Inspector(family).build()
    path = HERE / f"tiny-{family}" / "inspect.json"
    path.write_text(json.dumps(data, separators=(",", ":"), allow_nan=False))
    p = data["patching"]
    print(f"{path}: {path.stat().st_size} bytes; answer {data['answer']}, wrong {data['wrong']}, "
          f"clean diff {p['clean_diff']}, corrupted diff {p['corrupted_diff']}")


if __name__ == "__main__":
    unknown = [f for f in sys.argv[1:] if f not in FAMILIES]
    if unknown:
        sys.exit(f"usage: make_inspect_reference.py [FAMILY ...]; families: {', '.join(FAMILIES)}")
    for name in sys.argv[1:] or FAMILIES:
        write(name)
