"""Inspection of a loaded :class:`~loomlab.core.llm.generate.textmodel.TextModel`: text in, token
texts out, the model held while it works.

Each call holds the model (``TextModel.busy``: a chat or a server request waits its turn, the
same refusal a second generation gets) and computes on the exact path, float32 activations, the
one transformers computes, whatever the model's chat mode is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from ..errors import InspectError
from ..llm.generate.textmodel import TextModel
from ..llm.kernels.quant_int8 import int8_activations
from ..llm.text.chat_template import encode_chat
from .ablation import Ablation, AblationResult, ablate
from .attribution import Attribution, attribute
from .lens import LogitLens, logit_lens
from .patching import PatchGrid, patch
from .patterns import AttentionPatterns, attention_patterns


class Inspector:
    """The inspections of :mod:`loomlab.core.inspect` for ``model``, from prompts or chat turns."""

    def __init__(self, model: TextModel):
        if model.is_embedding_model:
            raise InspectError(f"{model.name or 'this model'} is an embedding model: inspection follows "
                               "a causal language model's next-token predictions")
        self.model = model

    # ----- sequences ------------------------------------------------------------------------
    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """A prompt's token ids as generation would read it (the model's BOS where it wants one)."""
        return self.model.prompt_ids(prompt)

    def chat_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """A conversation as the model read it, its last message (a reply) included: the chat
        template's rendering without a generation prompt."""
        if not messages:
            raise InspectError("the conversation is empty")
        return encode_chat(self.model.tokenizer, self.model.template, list(messages),
                           add_generation_prompt=False)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        return self.model.token_texts(list(ids))

    def token_id(self, text: str) -> int:
        """The one token ``text`` encodes to (``" Paris"``); :class:`InspectError` naming the
        pieces when it is several tokens or none."""
        ids = self.model.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            pieces = ", ".join(repr(t) for t in self.token_texts(ids)) or "none"
            raise InspectError(f"{text!r} is {len(ids)} tokens ({pieces}), not one; a target is one token")
        return ids[0]

    # ----- the inspections ------------------------------------------------------------------
    @contextmanager
    def _held(self) -> Iterator[None]:
        with self.model.busy(), int8_activations(False):
            yield

    def patterns(self, ids: Sequence[int], **kw) -> AttentionPatterns:
        with self._held():
            return attention_patterns(self.model.net, ids, **kw)

    def lens(self, ids: Sequence[int], **kw) -> LogitLens:
        with self._held():
            return logit_lens(self.model.net, ids, **kw)

    def attribution(self, ids: Sequence[int], token: int | None = None, position: int = -1,
                    **kw) -> Attribution:
        with self._held():
            return attribute(self.model.net, ids, token, position, **kw)

    def ablation(self, ids: Sequence[int], ablations: Sequence[Ablation], **kw) -> AblationResult:
        with self._held():
            return ablate(self.model.net, ids, ablations, **kw)

    def patching(self, clean_ids: Sequence[int], corrupted_ids: Sequence[int], **kw) -> PatchGrid:
        with self._held():
            return patch(self.model.net, clean_ids, corrupted_ids, **kw)
