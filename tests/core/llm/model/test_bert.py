"""BERT-family embedding models (bert, nomic-bert) from an HF folder and from a GGUF written from it.

Oracles: ``tests/data/tiny-hf/tiny-{bert,nomic-bert}/reference.json`` (make_tiny.py): transformers'
token ids of a few texts, sentence-transformers' embeddings of them (mean pooling, L2-normalised,
as the folder's modules say) and CLS-pooled ones of the same weights. The GGUF is written the way
llama.cpp's converter writes a BERT (conversion/bert.py: gguf-py's tensor names, its "phantom
space" WordPiece vocabulary, gguf-py's SpecialVocab, ``{arch}.pooling_type``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from loomlab.core.errors import EmbeddingModelError, LoomConfigError, ModelFormatError
from loomlab.core.llm.files.hf_files import open_hf
from loomlab.core.llm.generate.textmodel import TextModel, load_model
from loomlab.core.llm.model.encoder import Encoder
from loomlab.core.llm.model.model_info import EMBEDDING, describe

from .test_architectures import finish_gguf, gguf_writer, hf_checkpoint

TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf"
TINY_BERT = TINY / "tiny-bert"
# family -> GGUF architecture
ARCHS = {"bert": gguf.MODEL_ARCH.BERT, "nomic-bert": gguf.MODEL_ARCH.NOMIC_BERT}
REFS = {family: json.loads((TINY / f"tiny-{family}" / "reference.json").read_text()) for family in ARCHS}
REF = REFS["bert"]
MEAN = np.array(REF["mean_normalized"], np.float32)
CLS = np.array(REF["cls"], np.float32)
ATOL = 2e-6  # float32 sums in another order over 3 blocks of width 64


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def assert_embeddings(got: np.ndarray, want: np.ndarray) -> None:
    cosine = (unit(got) * unit(want)).sum(axis=-1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def bert_gguf(path: Path, folder: Path = TINY_BERT, pooling: int = gguf.PoolingType.MEAN,
              drop: str = "", family: str = "bert") -> Path:
    """``folder`` as llama.cpp's convert_hf_to_gguf.py writes a BERT or nomic-bert (float32
    tensors), less the tensor named ``drop``."""
    arch = ARCHS[family]
    cfg, tensors = hf_checkpoint(folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.get)
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    writer = gguf_writer(path, gguf.MODEL_ARCH_NAMES[arch], cfg)
    if "rope_parameters" in cfg:
        writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_eps(cfg["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)
    writer.add_tokenizer_model("bert")
    # the converter's "phantom space" vocabulary: ▁word, a continuation ##piece as piece
    writer.add_token_list([t if t in special else t[2:] if t.startswith("##") else "\u2581" + t
                           for t in tokens])
    writer.add_token_types(types)
    writer.add_token_type_count(cfg["type_vocab_size"])
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(writer)
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    for hf_name, w in tensors.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is not None and name != drop:  # the converter leaves out BERT's pooler
            writer.add_tensor(name, w)
    finish_gguf(writer)
    return path


def st_folder(tmp_path: Path, modules: list[str], pooling: dict | None = None, config: dict | None = None,
              drop: str = "") -> Path:
    """A copy of tiny-bert with sentence-transformers modules ``modules`` (of "Pooling",
    "Normalize"), the Pooling module's config ``pooling``, config.json changes, less tensor ``drop``."""
    folder = tmp_path / "st"
    shutil.copytree(TINY_BERT, folder,
                    ignore=shutil.ignore_patterns("1_Pooling", "2_Normalize", "modules.json"))
    entries = [{"idx": i + 1, "name": str(i + 1), "path": f"{i + 1}_{m}",
                "type": f"sentence_transformers.models.{m}"} for i, m in enumerate(modules)]
    if entries:
        (folder / "modules.json").write_text(json.dumps(entries))
    if pooling is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    if drop:
        with open_hf(TINY_BERT) as hf:
            kept = {k: t.data() for k, t in hf.tensors.items() if k != drop}
        save_file(kept, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> Path:
    return bert_gguf(tmp_path_factory.mktemp("bert") / "tiny-bert.gguf")


@pytest.fixture(scope="module", params=[(f, s) for f in ARCHS for s in ("hf", "gguf")], ids="-".join)
def family_model(request, tmp_path_factory):
    family, source = request.param
    folder = TINY / f"tiny-{family}"
    path = folder if source == "hf" else bert_gguf(tmp_path_factory.mktemp(family) / "m.gguf", folder,
                                                   family=family)
    with load_model(path) as m:
        yield m, REFS[family]


@pytest.fixture(scope="module")
def model(family_model):
    return family_model[0]


def test_tokenizers_give_transformers_ids(family_model):
    model, ref = family_model
    assert [model.prompt_ids(t) for t in ref["texts"]] == ref["token_ids"]


def test_embeddings_are_sentence_transformers(family_model):
    """Mean pooling and L2 normalisation: the folder's modules; the GGUF's pooling_type, and
    llama.cpp's normalisation."""
    model, ref = family_model
    assert isinstance(model.net, Encoder) and model.is_embedding_model
    assert_embeddings(model.embed(ref["texts"]), np.array(ref["mean_normalized"], np.float32))


def test_cls_pooling_as_the_model_says(tmp_path):
    with load_model(bert_gguf(tmp_path / "cls.gguf", pooling=gguf.PoolingType.CLS)) as m:
        assert_embeddings(m.embed(REF["texts"]), unit(CLS))  # a GGUF embedding is normalised
    folder = st_folder(tmp_path, ["Pooling"], {"word_embedding_dimension": 64, "pooling_mode_cls_token": True,
                                               "pooling_mode_mean_tokens": False})
    with load_model(folder) as m:
        assert_embeddings(m.embed(REF["texts"]), CLS)


def test_a_plain_transformers_folder_is_mean_pooled_unnormalised(tmp_path):
    with load_model(st_folder(tmp_path, [])) as m:
        got = m.embed(REF["texts"])
    assert_embeddings(unit(got), MEAN)
    assert np.abs(np.linalg.norm(got, axis=-1) - 1).min() > 0.1


def test_nomic_bert_config_in_nomics_own_keys(tmp_path):
    """nomic's published config.json spells the sizes its own way (n_embd, rotary_emb_base ...):
    the same weights give the same embeddings; a variant not built here is refused by its key."""
    folder = tmp_path / "nomic"
    shutil.copytree(TINY / "tiny-nomic-bert", folder)
    cfg = json.loads((folder / "config.json").read_text())
    nomic = {"model_type": "nomic_bert", "n_embd": cfg["hidden_size"], "n_layer": cfg["num_hidden_layers"],
             "n_head": cfg["num_attention_heads"], "n_inner": cfg["intermediate_size"], "n_positions": 64,
             "rotary_emb_base": cfg["rope_parameters"]["rope_theta"],
             "layer_norm_epsilon": cfg["layer_norm_eps"],
             "vocab_size": cfg["vocab_size"], "type_vocab_size": 2, "activation_function": "swiglu",
             "prenorm": False, "rotary_emb_fraction": 1.0, "qkv_proj_bias": False}
    (folder / "config.json").write_text(json.dumps(nomic))
    ref = REFS["nomic-bert"]
    with load_model(folder) as m:
        assert_embeddings(m.embed(ref["texts"]), np.array(ref["mean_normalized"], np.float32))
    (folder / "config.json").write_text(json.dumps({**nomic, "prenorm": True}))
    with pytest.raises(ModelFormatError, match="config.json:prenorm"):
        load_model(folder).close()


def test_an_embedding_model_refuses_to_generate(model):
    calls = [lambda: model.generate("hello"), lambda: model.chat([{"role": "user", "content": "hi"}]),
             lambda: model.classify(["hello"]), lambda: model.batch_generate(["hello"])]
    for call in calls:
        with pytest.raises(EmbeddingModelError, match="is an embedding model .* cannot chat or complete"):
            call()
    assert issubclass(EmbeddingModelError, LoomConfigError)
    assert not model.supports_chat and model.info()["embedding_model"]


def test_an_embedding_model_runs_on_numpy_only():
    with pytest.raises(LoomConfigError, match="embedding models run on the CPU"):
        load_model(TINY_BERT, backend="strict")


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_describe_says_embedding(source, gguf_path):
    info = describe(TINY_BERT if source == "hf" else gguf_path)
    assert (info.mode, info.embedding_model, info.kv_cache_bytes, info.problem) == (EMBEDDING, True, 0, "")
    assert (info.blocks, info.hidden_size, info.heads, info.context_length) == (3, 64, 4, 64)


def test_bad_files_are_refused_naming_the_field(tmp_path):
    cases = [
        (lambda: bert_gguf(tmp_path / "rank.gguf", pooling=gguf.PoolingType.RANK), "bert.pooling_type"),
        (lambda: bert_gguf(tmp_path / "drop.gguf", drop="blk.1.ffn_down.bias"), "blk.1.ffn_down.bias"),
        (lambda: st_folder(tmp_path / "a", [], drop="encoder.layer.1.output.dense.bias"),
         "encoder.layer.1.output.dense.bias"),
        (lambda: st_folder(tmp_path / "b", [], config={"hidden_act": "swish"}), "config.json:hidden_act"),
        (lambda: st_folder(tmp_path / "c", ["Pooling"], {"pooling_mode": "max"}), "pooling_mode"),
        (lambda: st_folder(tmp_path / "d", [], config={"num_attention_heads": 5}), "num_attention_heads"),
        (lambda: bert_gguf(tmp_path / "qkv.gguf", TINY / "tiny-nomic-bert", drop="blk.2.attn_qkv.weight",
                           family="nomic-bert"), "blk.2.attn_qkv.weight"),
    ]
    for make, field in cases:
        path = make()
        with pytest.raises(ModelFormatError, match=field.replace(".", r"\.")):
            load_model(path).close()


def test_the_encoder_is_a_grid_of_core_families(family_model):
    """The grid shows the encoder as core families: observers see every layer of the blocks."""
    model, ref = family_model
    seen = [layer.type_name for layer in model.net.all_layers()]
    mlp = {"bert": ("Dense", 6), "nomic-bert": ("SwiGLU", 3)}[ref["architecture"].replace("_", "-")]
    assert seen[:2] == ["Embedding", "LayerNorm"] and seen.count(mlp[0]) == mlp[1]
    assert seen.count("MultiHeadAttention") == 3 and seen.count("LayerNorm") == 7
    assert isinstance(model, TextModel)
