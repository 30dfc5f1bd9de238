"""Which mode a model supports: chat with its own template or an instruction-tuned release's
family template; completion only for a base model (gemma3-270m has no template in its file)."""

from __future__ import annotations

import pytest

from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.model import model_info
from loomlab.core.llm.model.model_info import CHAT, COMPLETION, supports_chat


@pytest.mark.parametrize(("alias", "mode", "template_in_file"), [
    ("smollm2-135m", CHAT, True), ("gemma3-270m", COMPLETION, False),
])
def test_the_built_in_models(alias, mode, template_in_file):
    info = model_info.describe(registry.fetch(alias))
    assert (info.mode, info.chat_template) == (mode, template_in_file)
    with load_model(alias) as model:
        assert model.supports_chat is (mode == CHAT)
        # the base model is still given a family template: chat would run, and echo the prompt
        assert model.template.source == ("file" if template_in_file else "fallback:gemma")


@pytest.mark.parametrize(("path", "metadata", "chat"), [
    ("gemma-3-270m-q4_k_m.gguf", {"general.name": "Gemma 3 270m", "general.basename": "gemma-3"}, False),
    ("gemma-3-270m-it-Q4_K_M.gguf", {}, True),  # instruction-tuned, named so by its file
    ("model.gguf", {"general.finetune": "Instruct"}, True),
    ("model.gguf", {"general.name": "Mistral 7B Chat v0.2"}, True),
    ("Qwen2.5-0.5B", {"_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}, True),  # an HF config's origin
    ("digit-smith-7b.gguf", {"general.name": "Edit Bot"}, False),  # "it" inside words is no marker
    ("llama-base.gguf", {"general.name": 7}, False),  # a non-string name is read as text
])
def test_without_a_template_in_the_file_the_name_decides(path, metadata, chat):
    assert supports_chat(False, path, metadata) is chat


def test_a_template_in_the_file_always_means_chat():
    assert supports_chat(True, "gemma-3-270m-q4_k_m.gguf", {"general.name": "Gemma 3 270m"})
