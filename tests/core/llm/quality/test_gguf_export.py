"""GGUF export (issue 14 §5): a model is written as it is now — the file's bytes where nothing
changed, the new blocks of a block-format morph (gguf-py's quantizer is the oracle where it has
one), F16/BF16 for Loom's float16/bfloat16 — with every metadata key copied; our loader reopens it
with the same logits; refusals and failures leave no file behind and an old one untouched."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader, LlamaFileType

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.gguf_export import export_gguf, export_refusal
from loomlab.core.llm.quality.recipe import apply_recipe, plan_recipe
from loomlab.core.morph import morph_sublayer

PROMPT = "The capital of France is Paris, and the capital of Italy is"
CHANGED_KEYS = {"general.file_type", "general.quantized_by"}


def weighted(net) -> dict[str, tuple[int, object]]:
    """Each weighted layer by its name (blk.0.attn_q/k/v/output ...): (cell, layer)."""
    from loomlab.core.llm.quality.drift import weighted_layers

    return {w.name: (w.cell, w.layer) for w in weighted_layers(net)}


class Morphed:
    """Morph layers by name for one test and put the shared model back afterwards."""

    def __init__(self, net, plan: dict[str, str]):
        self.layers = [weighted(net)[name] for name in plan]
        self.plan = plan

    def __enter__(self):
        for (cell, layer), fmt in zip(self.layers, self.plan.values(), strict=True):
            morph_sublayer(layer, cell, fmt)
        return self

    def __exit__(self, *exc):
        for cell, layer in self.layers:
            morph_sublayer(layer, cell, layer.weights.file_encoding())


def logits(model, text: str = PROMPT) -> np.ndarray:
    return model.net.step(np.array([model.tokenizer.encode(text, add_special_tokens=True)]), None)


def metadata(path) -> dict:
    """Every key -> (GGUF types, value as a plain list or scalar), read by gguf-py."""
    reader = GGUFReader(path)
    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the header's own fields (version, counts)
        value = f.contents()
        out[key] = (tuple(f.types), value.tolist() if isinstance(value, np.ndarray) else value)
    return out


def tensors(path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(path).tensors}


def only_file(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ----- the model as loaded ----------------------------------------------------------------------
def test_an_unmorphed_model_is_written_as_its_file_byte_for_byte(smollm2, tmp_path):
    out = tmp_path / "copy.gguf"
    report = export_gguf(smollm2, out)
    source = smollm2.net.source.path
    assert out.read_bytes() == source.read_bytes()
    assert report.changed == 0 and report.tensors == len(tensors(source))
    assert report.nbytes == source.stat().st_size
    assert metadata(out) == metadata(source)  # gguf-py reads it as it reads the file
    assert only_file(tmp_path) == ["copy.gguf"]


# ----- a morphed model ---------------------------------------------------------------------------
MIX = {"blk.0.attn_q/k/v/output": "Q8_0", "blk.0.ffn_gate/up/down": "Q4_0",
       "blk.1.attn_q/k/v/output": "float16", "blk.1.ffn_norm": "float16",
       "blk.2.ffn_gate/up/down": "bfloat16", "blk.3.attn_q/k/v/output": "Q5_1",
       "output (tied to token_embd)": "float16"}


def test_a_morphed_model_reopens_with_the_same_logits_and_its_new_encodings(smollm2, tmp_path):
    out = tmp_path / "mixed.gguf"
    source = smollm2.net.source.path
    progress = []
    with Morphed(smollm2.net, MIX):
        expected = logits(smollm2)
        report = export_gguf(smollm2, out, progress=lambda *a: progress.append(a))
        layers = weighted(smollm2.net)
        f16_ffn_norm = layers["blk.1.ffn_norm"][1].weights.current("float16")["gamma"]
        bf16_gate = layers["blk.2.ffn_gate/up/down"][1].weights.current("bfloat16")["gate"]
    assert progress[-1] == ("export", report.tensors, report.tensors) and len(progress) == report.tensors
    with load_model(out) as reopened:
        # bit for bit: the same blocks and the same float values reach the same kernels
        np.testing.assert_array_equal(logits(reopened), expected)
        assert reopened.template.source == smollm2.template.source
    np.testing.assert_array_equal(logits(smollm2), logits(smollm2))  # (the shared model is back)

    written, original = tensors(out), tensors(source)
    # the source's tensors in its order; the head, morphed apart from the table it was tied to,
    # becomes a head of its own right after it
    names = list(original)
    at = names.index("token_embd.weight") + 1
    assert list(written) == names[:at] + ["output.weight"] + names[at:]
    assert GT(written["output.weight"].tensor_type) == GT.F16
    for name, fmt in [("blk.0.attn_q.weight", GT.Q8_0), ("blk.0.attn_v.weight", GT.Q8_0),
                      ("blk.0.ffn_up.weight", GT.Q4_0), ("blk.3.attn_k.weight", GT.Q5_1)]:
        t, src = written[name], original[name]
        assert GT(t.tensor_type) == fmt
        oracle = gguf.quants.quantize(gguf.quants.dequantize(src.data, src.tensor_type), fmt)
        assert np.array_equal(np.asarray(t.data), oracle)
    assert GT(written["blk.1.attn_q.weight"].tensor_type) == GT.F16
    assert GT(written["blk.1.ffn_norm.weight"].tensor_type) == GT.F32  # vectors stay F32, as in llama.cpp
    assert np.array_equal(written["blk.1.ffn_norm.weight"].data, f16_ffn_norm)
    gate = written["blk.2.ffn_gate.weight"]
    assert GT(gate.tensor_type) == GT.BF16
    assert np.array_equal(np.asarray(gate.data).view(np.uint16), (bf16_gate.view(np.uint32) >> 16))
    from loomlab.core.llm.quality.drift import weighted_layers

    # every other tensor is the file's, byte for byte (the table too: only the head left it)
    morphed = {t for w in weighted_layers(smollm2.net) if w.name in MIX for t in w.tensors}
    morphed.discard("token_embd.weight")
    for name in set(names) - morphed:
        assert np.array_equal(np.asarray(written[name].data), np.asarray(original[name].data)), name
    # metadata: the source's, but for the file type (Q4_1 still holds most weights) and who made it
    new, old = metadata(out), metadata(source)
    assert {k: v for k, v in new.items() if k not in CHANGED_KEYS} == {k: v for k, v in old.items()
                                                                        if k not in CHANGED_KEYS}
    assert new["general.file_type"][1] == LlamaFileType.MOSTLY_Q4_1 == report.file_type
    assert new["general.quantized_by"][1] == "Loom Lab"


def test_a_model_morphed_to_q8_0_is_a_q8_0_file(smollm2, tmp_path):
    out = tmp_path / "q8.gguf"
    plan = dict.fromkeys(weighted(smollm2.net), "Q8_0")
    with Morphed(smollm2.net, plan):
        expected = logits(smollm2)
        report = export_gguf(smollm2, out)
    written = tensors(out)
    kinds = {GT(t.tensor_type) for t in written.values()}
    assert kinds == {GT.Q8_0, GT.F32} and "output.weight" not in written  # the tied table written once
    assert report.file_type == LlamaFileType.MOSTLY_Q8_0
    with load_model(out) as reopened:
        np.testing.assert_array_equal(logits(reopened), expected)


def test_matrices_of_one_layer_in_formats_of_their_own_f16_included(smollm2, tmp_path):
    """A recipe gives each matrix its own format (MatrixStore.morph_parts), F16 where rows are not
    whole blocks (llama.cpp's last fallback): each is written as forward reads it."""
    out = tmp_path / "parts.gguf"
    cell, layer = weighted(smollm2.net)["blk.0.ffn_gate/up/down"]
    layer.cfg.dtype = layer.weights.morph_parts({"gate": "Q8_0", "up": "F16", "down": "Q4_0"})
    try:
        expected = logits(smollm2)
        up = layer.weights.current("float32")["up"].dequantize()
        export_gguf(smollm2, out)
    finally:
        morph_sublayer(layer, cell, layer.weights.file_encoding())
    written = tensors(out)
    assert [GT(written[f"blk.0.ffn_{p}.weight"].tensor_type) for p in ("gate", "up", "down")] == [
        GT.Q8_0, GT.F16, GT.Q4_0]
    assert np.array_equal(np.asarray(written["blk.0.ffn_up.weight"].data), up.astype(np.float16))
    with load_model(out) as reopened:
        np.testing.assert_array_equal(logits(reopened), expected)


def synthetic_llama(path) -> object:
    """A one-block llama whose rows are whole 256-weight blocks (neither built-in model's layers
    are), random float32 weights: what the K formats are exported from."""
    rng = np.random.default_rng(7)
    d, ffn, vocab = 256, 512, 64
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,), "output.weight": (vocab, d),
              "blk.0.attn_norm.weight": (d,), "blk.0.attn_q.weight": (d, d),
              "blk.0.attn_k.weight": (128, d), "blk.0.attn_v.weight": (128, d),
              "blk.0.attn_output.weight": (d, d), "blk.0.ffn_norm.weight": (d,),
              "blk.0.ffn_gate.weight": (ffn, d), "blk.0.ffn_up.weight": (ffn, d),
              "blk.0.ffn_down.weight": (d, ffn)}
    for name, shape in shapes.items():
        w = 1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.05 * rng.standard_normal(shape)
        writer.add_tensor(name, w.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return load_causal_lm(path)


def test_k_formats_are_written_as_the_blocks_forward_reads(tmp_path):
    net = synthetic_llama(tmp_path / "k.gguf")
    model = SimpleNamespace(net=net, name="synthetic")
    try:
        layers = weighted(net)
        for name, fmt in {"blk.0.attn_q/k/v/output": "Q4_K", "blk.0.ffn_gate/up/down": "Q6_K"}.items():
            cell, layer = layers[name]
            morph_sublayer(layer, cell, fmt)
        ids = np.arange(20)[None]
        expected = net.step(ids, None)
        encoded = layers["blk.0.ffn_gate/up/down"][1].weights.current("float32")["down"]
        export_gguf(model, tmp_path / "out.gguf")
    finally:
        net.close()
    written = tensors(tmp_path / "out.gguf")
    down = written["blk.0.ffn_down.weight"]
    assert GT(down.tensor_type) == GT.Q6_K and GT(written["blk.0.attn_q.weight"].tensor_type) == GT.Q4_K
    # gguf-py cannot quantize K formats; it reads them: its dequantization is the kernels'
    np.testing.assert_array_equal(gguf.quants.dequantize(down.data, GT.Q6_K).reshape(encoded.shape),
                                  encoded.dequantize())
    reopened = load_causal_lm(tmp_path / "out.gguf")
    try:
        np.testing.assert_array_equal(reopened.step(ids, None), expected)
    finally:
        reopened.close()


@pytest.mark.parametrize("preset, llama_h", [("Q3_K_S", 11), ("Q5_K_S", 16)])
def test_a_preset_is_written_as_llama_quantizes_file_type(tmp_path, preset, llama_h):
    """``general.file_type`` is the preset's (llama.h's LLAMA_FTYPE_MOSTLY_<preset>), as
    llama-quantize writes it, not the _M type the majority rule would give the mix."""
    net = synthetic_llama(tmp_path / "k.gguf")
    try:
        plan = plan_recipe(net, preset)
        apply_recipe(net, plan)
        model = SimpleNamespace(net=net, name="synthetic")
        mix = export_gguf(model, tmp_path / "mix.gguf")
        report = export_gguf(model, tmp_path / "out.gguf", ftype=plan.file_type)
        assert plan_recipe(net, "Q4_0").file_type is None  # a format, not a preset
    finally:
        net.close()
    assert mix.file_type == llama_h + 1  # the majority rule: the _M type of the mix's K type
    assert report.file_type == llama_h == metadata(tmp_path / "out.gguf")["general.file_type"][1]


# ----- refusals, failures, cancel ----------------------------------------------------------------
def test_a_loom_dtype_gguf_cannot_store_is_refused_before_anything_is_written(smollm2, tmp_path):
    out = tmp_path / "model.gguf"
    out.write_bytes(b"old")
    with Morphed(smollm2.net, {"blk.4.ffn_gate/up/down": "int8", "blk.5.attn_norm": "fp8e4m3"}):
        reason = export_refusal(smollm2)
        with pytest.raises(LoomConfigError, match=r"ffn_gate/up/down is int8; blk\.5\.attn_norm is fp8e4m3"):
            export_gguf(smollm2, out)
    assert "blk.4.ffn_gate/up/down is int8" in reason
    assert out.read_bytes() == b"old" and only_file(tmp_path) == ["model.gguf"]
    assert export_refusal(smollm2) == ""


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(smollm2, tmp_path, monkeypatch):
    out = tmp_path / "model.gguf"
    out.write_bytes(b"old")
    calls = []

    def failing(self, tensor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 40:
            raise OSError("disk full")
        return original(self, tensor, *args, **kwargs)

    original = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", failing)
    with Morphed(smollm2.net, {"blk.0.attn_q/k/v/output": "Q8_0"}), pytest.raises(OSError, match="disk full"):
        export_gguf(smollm2, out)
    assert out.read_bytes() == b"old" and only_file(tmp_path) == ["model.gguf"]


@pytest.mark.parametrize("kind", ["callable", "event"])
def test_cancel_stops_between_tensors_and_leaves_nothing(smollm2, tmp_path, kind):
    event = threading.Event()
    seen = []

    def progress(stage, done, total):
        seen.append(done)
        if done == 10:
            event.set()

    cancel = event if kind == "event" else event.is_set
    with pytest.raises(LoomCancelled, match="after 10 of 272 tensors"):
        export_gguf(smollm2, tmp_path / "model.gguf", progress=progress, cancel=cancel)
    assert seen[-1] == 10 and only_file(tmp_path) == []


def test_the_models_own_file_and_a_folder_model_are_refused(smollm2, tmp_path):
    source = smollm2.net.source.path
    before = source.stat().st_mtime_ns
    with pytest.raises(LoomConfigError, match="reads its weights from that file"):
        export_gguf(smollm2, source)
    assert source.stat().st_mtime_ns == before
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "data" / "tiny-hf" / "tiny-llama"
    net = load_causal_lm(folder)
    try:
        with pytest.raises(LoomConfigError, match="only a model loaded from a GGUF file"):
            export_gguf(SimpleNamespace(net=net, name="tiny-llama"), tmp_path / "x.gguf")
    finally:
        net.close()
    assert only_file(tmp_path) == []


def test_a_model_with_matrices_split_from_fused_ones_is_refused(tmp_path):
    """phi3's Q/K/V and gate/up are row ranges of its attn_qkv and ffn_up, no tensors of the file."""
    from ..model.test_architectures import write_gguf

    net = load_causal_lm(write_gguf(tmp_path / "phi3.gguf", "tiny-phi3", "phi3"))
    model = SimpleNamespace(net=net, name="tiny-phi3")
    try:
        refusal = export_refusal(model)
        assert "'wq' matrix is not the file's blk.0.attn_q.weight but part of a fused one" in refusal
        with pytest.raises(LoomConfigError, match="cannot be exported as GGUF"):
            export_gguf(model, tmp_path / "out.gguf")
    finally:
        net.close()
    assert only_file(tmp_path) == ["phi3.gguf"]


# ----- gemma3: its own tokenizer and template ----------------------------------------------------
def test_gemma3_round_trip_keeps_tokenizer_template_and_settings(tmp_path):
    out = tmp_path / "gemma.gguf"
    text = "Gemma's tokenizer: ünïcødé, spaces  and\ttabs, 1234567."
    with load_model("gemma3-270m") as model:
        layers = weighted(model.net)
        cell, layer = layers["blk.0.ffn_gate/up/down"]
        morph_sublayer(layer, cell, "Q8_0")  # a private model: no need to put it back
        expected = logits(model, "The sky is")
        ids = model.tokenizer.encode(text, add_special_tokens=True)
        template, args = model.template, model.net.args
        report = export_gguf(model, out)
        source = model.net.source.path
    new, old = metadata(out), metadata(source)
    assert {k: v for k, v in new.items() if k not in CHANGED_KEYS} == {k: v for k, v in old.items()
                                                                        if k not in CHANGED_KEYS}
    assert report.file_type == LlamaFileType.MOSTLY_Q5_0  # Q5_0 still holds the most matrix weights
    with load_model(out) as reopened:
        assert reopened.tokenizer.encode(text, add_special_tokens=True) == ids
        assert (reopened.template.source, reopened.template.text) == (template.source, template.text)
        assert reopened.net.args == args and reopened.supports_chat is False
        np.testing.assert_array_equal(logits(reopened, "The sky is"), expected)
    with open_gguf(out) as f, open_gguf(source) as g:
        assert f.kv_types == g.kv_types | {"general.quantized_by": (gguf.GGUFValueType.STRING, None)}
