"""``loomlab serve`` with an embedding model (tiny BERT): /v1/embeddings gives sentence-transformers'
embeddings (the reference of ``tests/data/tiny-hf/tiny-bert``), chat and completions a 400 that
says the model only embeds, and the server goes on."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from loomlab.app.serve import Server
from loomlab.core.llm.generate.textmodel import load_model

TINY_BERT = Path(__file__).resolve().parents[1] / "data" / "tiny-hf" / "tiny-bert"
REF = json.loads((TINY_BERT / "reference.json").read_text())
TIMEOUT = 120


@pytest.fixture(scope="module")
def served():
    with load_model(TINY_BERT) as model:
        own = model.embed(REF["texts"])  # before serving: the server's engine holds the model while it works
        server = Server(model, port=0)
        url = server.start()
        yield model, url, own
        server.stop()


def test_embeddings_are_sentence_transformers(served):
    model, url, own = served
    client = openai.OpenAI(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0)
    got = client.embeddings.create(model=model.name, input=REF["texts"])  # the client asks for base64
    vectors = np.array([d.embedding for d in got.data], np.float32)
    np.testing.assert_array_equal(vectors, own)
    np.testing.assert_allclose(vectors, np.array(REF["mean_normalized"], np.float32), atol=2e-6, rtol=0)
    assert got.usage.prompt_tokens == sum(map(len, REF["token_ids"]))


@pytest.mark.parametrize("path, body", [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/completions", {"prompt": "hello", "max_tokens": 2}),
])
def test_generating_with_an_embedding_model_is_a_400(served, path, body):
    with httpx.Client(base_url=served[1], timeout=TIMEOUT) as http:
        reply = http.post(path, json=body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "model" and error["code"] == "embedding_model"
        assert "is an embedding model (bert)" in error["message"]
        assert "cannot chat or complete" in error["message"]
        assert http.post("/embeddings", json={"input": "hello"}).status_code == 200
