"""``loomlab inspect`` on SmolLM2-135M. Oracle: the engine's own inspections (core/inspect) of the
same prompt, through the Inspector the panel uses; the human tables are checked for the same
numbers where they print them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loomlab.app.cli import main
from loomlab.core.inspect import Ablation, Inspector, Tracer
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.kernels.quant_int8 import int8_activations

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
CLEAN, CORRUPTED = "Mary gave John a", "John gave John a"


@pytest.fixture(scope="module")
def inspector():
    with load_model(MODEL) as model:
        yield Inspector(model)


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def inspect_json(capsys, *extra) -> dict:
    code, out, _ = run(["inspect", MODEL, "--prompt", PROMPT, *extra, "--json"], capsys)
    assert code == 0
    return json.loads(out)


def test_lens_and_attribution_print_the_engines_numbers(inspector, capsys):
    ids = inspector.prompt_ids(PROMPT)
    lens = inspector.lens(ids, k=3)
    got = inspect_json(capsys, "--what", "lens", "--top", "3")
    assert got["tokens"] == ids and got["target"] == lens.target
    assert got["target_text"] == " Paris"
    assert got["top_ids"] == lens.top_ids.tolist()
    np.testing.assert_allclose(got["target_probs"], lens.target_probs, atol=1e-6)
    paris = inspector.token_id(" Paris")
    a = inspector.attribution(ids, paris)
    got = inspect_json(capsys, "--what", "attribution", "--target", " Paris")
    assert got["target"] == paris and got["position"] == len(ids) - 1
    assert got["logit"] == pytest.approx(a.logit, abs=1e-5)
    np.testing.assert_allclose(got["heads"], a.heads, atol=1e-5)
    np.testing.assert_allclose(got["mlp"], a.mlp, atol=1e-5)
    assert got["total"] == pytest.approx(got["logit"], abs=1e-3)
    code, out, _ = run(["inspect", MODEL, "--prompt", PROMPT, "--what", "attribution", "--top", "1"], capsys)
    kind, layer, head, share = a.components()[0]
    assert code == 0 and f"logit of ' Paris' after position {len(ids) - 1}" in out
    assert f"{share:+.4f}" in out.splitlines()[2]


def test_patterns_ablation_and_patching(inspector, capsys):
    ids = inspector.prompt_ids(PROMPT)
    got = inspect_json(capsys, "--what", "patterns")
    patterns = inspector.patterns(ids)
    assert (got["layers"], got["heads"]) == (30, 9)
    np.testing.assert_allclose(got["patterns"][7], patterns.layer(7), atol=1e-6)
    result = inspector.ablation(ids, [Ablation("head", 28, 3), Ablation("mlp", 29)], new_tokens=3)
    got = inspect_json(capsys, "--what", "ablation", "--ablate", "head:28:3", "--ablate", "mlp:29",
                       "--new-tokens", "3")
    assert got["ablations"] == ["head L28H3 zero", "mlp L29 zero"]
    assert (got["greedy_before"], got["greedy_after"]) == (result.greedy_before, result.greedy_after)
    assert got["logprob_after"] == pytest.approx(result.logprob_after, abs=1e-5)
    code, out, _ = run(["inspect", MODEL, "--prompt", CLEAN, "--corrupted", CORRUPTED, "--what", "patching",
                        "--site", "z", "--json"], capsys)
    got = json.loads(out)
    assert code == 0 and np.array(got["restored"]).shape == (30, 9)
    # two cells against whole runs of the corrupted prompt with that head's values copied in
    clean, corrupted = inspector.prompt_ids(CLEAN), inspector.prompt_ids(CORRUPTED)
    with inspector.model.busy(), int8_activations(False):
        tracer = Tracer(inspector.model.net)
        logits = tracer.logits(tracer.run(np.array([clean])).final)[0, -1]
        assert got["answer"] == int(np.argmax(logits))
        z = tracer.run(np.array([clean]), keep=("z",))
        for layer, head in ((0, 0), (22, 4)):
            def edit(site, i, value, layer=layer, head=head):
                if (site, i) != ("z", layer):
                    return value
                value = value.copy()
                value[:, :, head] = z["z", layer][:, :, head]
                return value

            final = tracer.run(np.array([corrupted]), edit=edit).final
            answer, wrong = tracer.token_logits(final[:, -1], [got["answer"], got["wrong"]])[0]
            assert got["diffs"][layer][head] == pytest.approx(answer - wrong, abs=1e-4)
    restored = (np.array(got["diffs"]) - got["corrupted_diff"]) / (got["clean_diff"] - got["corrupted_diff"])
    np.testing.assert_allclose(got["restored"], restored, atol=1e-5)


@pytest.mark.parametrize(("extra", "message"), [
    (["--what", "ablation"], "needs at least one --ablate"),
    (["--what", "ablation", "--ablate", "head:3"], "--ablate 'head:3': expected"),
    (["--what", "patching"], "needs --corrupted"),
    (["--what", "patching", "--corrupted", "Paris"], "equally long"),
    (["--target", " Parisian capital"], "not one; a target is one token"),
    (["--what", "attribution", "--position", "40"], "outside the sequence"),
    (["--what", "ablation", "--ablate", "mlp:30"], "layer 30 does not exist"),
])
def test_bad_requests_say_what_is_wrong(extra, message, capsys):
    code, out, err = run(["inspect", MODEL, "--prompt", PROMPT, *extra], capsys)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") <= 4  # the load's progress lines, then one error
