"""Look inside a language model while it talks (TransformerLens's questions, on this runtime's
models, quantized or morphed): which positions each head attends to (:func:`attention_patterns`),
what each block would predict (:func:`logit_lens`), which heads and MLPs push a token's logit
(:func:`attribute`), what changes when components are switched off (:func:`ablate`), and which
carry the difference between two prompts (:func:`patch`).

Each takes a :class:`~loomlab.core.llm.model.causal_lm.CausalLM` and token ids and computes on
the exact path (float32 activations) of the calling thread; :class:`Inspector` does the same for a
loaded :class:`~loomlab.core.llm.generate.textmodel.TextModel` from text, holding the model while
it works.
"""

from .ablation import KINDS, MODES, Ablation, AblationResult, ablate
from .attribution import Attribution, attribute
from .inspector import Inspector
from .lens import LogitLens, logit_lens
from .patching import PATCH_SITES, PatchGrid, patch
from .patterns import AttentionPatterns, attention_patterns
from .trace import SITES, Trace, Tracer

__all__ = ["KINDS", "MODES", "PATCH_SITES", "SITES", "Ablation", "AblationResult", "AttentionPatterns",
           "Attribution", "Inspector", "LogitLens", "PatchGrid", "Trace", "Tracer", "ablate",
           "attention_patterns", "attribute", "logit_lens", "patch"]
