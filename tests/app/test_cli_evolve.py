"""``loomlab dna``, ``splice`` and ``evolve`` against the engine's own results."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest

from loomlab.app.cli import main
from loomlab.core.evolve.genetics.dna import compare_dna
from loomlab.core.evolve.genetics.splicing import SpliceConfig, splice
from loomlab.core.evolve.llm.dna_table import model_report
from loomlab.core.evolve.llm.recipe_genome import recipe_from_bytes
from loomlab.core.evolve.search.reporters import ConsoleReporter
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.io import load_network, save_network
from loomlab.core.io.checkpoint import checkpoint_bytes
from loomlab.core.io.loom_json import dumps, read_network
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.recipe import weighted_layers
from loomlab.core.morph import morph_all
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace

TINY = Path(__file__).parents[1] / "data" / "tiny-hf"
GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "evolve-goldens-seed1.json").read_text())
PAIR = next(c for c in GOLDEN["dna_pairs"] if c["result"]["LogicShifts"])
CONFIG = """
[run]
task = "xor"
population = 12
generations = 3
[neat]
seed = 5
[speciation]
compatibility_threshold = 0.5
"""


@pytest.fixture
def pair(tmp_path):
    paths = []
    for name in ("a", "b"):
        save_network(read_network(PAIR[name]), tmp_path / f"{name}.json")
        paths.append(str(tmp_path / f"{name}.json"))
    return paths


def test_dna_prints_loom_comparison(pair, capsys):
    assert main(["dna", *pair, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == compare_dna(*map(load_network, pair)).to_loom()
    assert main(["dna", *pair]) == 0
    out = capsys.readouterr().out
    shift = PAIR["result"]["LogicShifts"][0]
    assert f"overall overlap  {PAIR['result']['OverallOverlap']:.6f}" in out and "logic shifts" in out
    assert any(line.split()[:2] == [shift["SourcePos"], shift["TargetPos"]] for line in out.splitlines())


def test_dna_of_a_network_and_its_int8_morph_suggests_across_dtypes(pair, tmp_path, capsys):
    morphed = load_network(pair[0])
    morph_all(morphed, "int8")
    save_network(morphed, tmp_path / "a-int8.json")
    assert main(["dna", pair[0], str(tmp_path / "a-int8.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(list(morphed.layers()))
    assert out[0] == "overall overlap  0.000000"  # Loom scores layers of another dtype 0 ...
    assert out[-1] == (f"{n} layer(s) differ in dtype (at 0,0,0,0: float32 against int8) and score 0, "
                       "as in Loom; --across-dtypes compares their dequantized weights")  # ... and says so
    assert main(["dna", pair[0], str(tmp_path / "a-int8.json"), "--across-dtypes"]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = compare_dna(load_network(pair[0]), morphed, across_dtypes=True).overall_overlap
    assert out[0] == f"overall overlap  {expected:.6f}" and expected > 0.99
    assert not any("differ in dtype" in line for line in out)
    assert main(["dna", *pair]) == 0 and "differ in dtype" not in capsys.readouterr().out


def test_dna_compares_two_language_models_as_the_dna_panel_does(capsys):
    a, b = str(TINY / "tiny-llama"), str(TINY / "tiny-qwen2")
    assert main(["dna", a, b]) == 0
    lines = capsys.readouterr().out.splitlines()
    report = model_report(a, b)  # the panel's comparison
    assert lines[0] == f"overall overlap  {report.comparison.overall_overlap:.6f}"
    assert [line.rsplit(None, 1) for line in lines[2:]] == [[r.name, f"{r.overlap:.6f}"] for r in report.rows]
    assert main(["dna", a, "net.json"]) == 2
    assert capsys.readouterr().err.strip() == (f"loomlab: error: {a} is a language model and net.json a "
                                               "network: compare two networks (.json / .loom) or two "
                                               "language models")


def test_splice_saves_the_engines_child(pair, tmp_path):
    out = tmp_path / "child.loom"
    assert main(["splice", *pair, "-o", str(out), "--mode", "point", "--split", "0.3"]) == 0
    expected = splice(*map(load_network, pair), SpliceConfig(mode="point", split_ratio=0.3)).child
    assert dumps(load_network(out)) == dumps(expected)
    assert main(["splice", *pair, "-o", str(out), "--mode", "average"]) == 2


def test_evolve_runs_resumes_and_lists(tmp_path, capsys):
    (tmp_path / "run.toml").write_text(CONFIG)
    ws = str(tmp_path / "ws.sqlite3")
    assert main(["evolve", str(tmp_path / "run.toml"), "--workspace", ws]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" |")[0] for line in lines if line.startswith("Gen ")] == ["Gen 1", "Gen 2", "Gen 3"]
    assert main(["evolve", "--resume", "1", "--generations", "2", "--workspace", ws]) == 0
    assert "finished at generation 5" in capsys.readouterr().out
    # the oracle: the same run through the API, five generations straight (the CLI's NEAT config
    # is the task's own, with the config's seed)
    task = get_task("xor")
    api = Evolution(task, config=task.neat_config(seed=5), population=12,
                    speciation=SpeciationConfig(compatibility_threshold=0.5))
    api.run(5)
    with Workspace(ws) as w:
        point = EvolutionRuns(w).latest_checkpoint(1)
        assert point.members == [checkpoint_bytes(m) for m in api.members]
    assert main(["evolve", "--list", "--workspace", ws]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["1", "xor", "5", "finished"]


@pytest.mark.parametrize("text, message", [
    ('[run]\ntask = "xor"\ngenerations = 2\nbogus = 1\n', "unknown key(s) in [run]: bogus"),
    ('[run]\ntask = "xor"\ngenerations = 2\n[neat]\nnode_mutate_rate = 1.5\n',
     "node_mutate_rate must lie in [0, 1]"),
    ('[run]\ntask = "knots"\ngenerations = 2\n', "unknown task 'knots'"),
    ('[run]\ntask = "xor"\ngenerations = 2\n[neat]\nrate = 1\n', "unexpected keyword argument 'rate'"),
    ('[run]\ntask = "xor"\ngenerations = 2\n[task]\nhidden = -1\n', "hidden"),
    ('[run]\ntask = "xor"\n', "how many generations"),
    ("[run\n", "not a TOML file"),
])
def test_bad_configs_give_one_line_and_exit_2(tmp_path, capsys, text, message):
    (tmp_path / "bad.toml").write_text(text)
    assert main(["evolve", str(tmp_path / "bad.toml"), "--workspace", str(tmp_path / "ws.sqlite3")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_resume_hint_after_ctrl_c_works_as_printed(tmp_path, capsys, monkeypatch):
    (tmp_path / "run.toml").write_text(CONFIG.replace("generations = 3", "generations = 4"))
    ws = str(tmp_path / "my ws.sqlite3")  # a space: the hint quotes it
    printed = ConsoleReporter.end_generation

    def ctrl_c_after_generation_2(self, stats, population):
        printed(self, stats, population)
        if stats.generation == 2:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(ConsoleReporter, "end_generation", ctrl_c_after_generation_2)
    assert main(["evolve", str(tmp_path / "run.toml"), "--workspace", ws]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("run 1 stopped at generation 2") and "resume with: " in last
    hint = shlex.split(last.split("resume with: ")[1])
    assert hint[:2] == ["loomlab", "evolve"]
    monkeypatch.setattr(ConsoleReporter, "end_generation", printed)
    assert main(hint[1:]) == 0
    assert "run 1 finished at generation 4" in capsys.readouterr().out
    task = get_task("xor")  # the oracle: four generations straight
    api = Evolution(task, config=task.neat_config(seed=5), population=12,
                    speciation=SpeciationConfig(compatibility_threshold=0.5))
    api.run(4)
    with Workspace(ws) as w:
        assert EvolutionRuns(w).latest_checkpoint(1).members == [checkpoint_bytes(m) for m in api.members]


def test_resuming_a_solved_run_says_why_it_stops(tmp_path, capsys):
    # threshold 0 is xor's floor: every generation reaches it, so the run is solved at once and,
    # as in neat-python, a resumed run stops again at its first generation
    (tmp_path / "run.toml").write_text(CONFIG + "[task]\nthreshold = 0.0\n")
    ws = str(tmp_path / "ws.sqlite3")
    assert main(["evolve", str(tmp_path / "run.toml"), "--workspace", ws]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("run 1 solved at generation 1")
    assert main(["evolve", "--resume", "1", "--generations", "50", "--workspace", ws]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("run 1 has reached the task's threshold 0 ([task] threshold): it stops again at "
                      "the first generation that reaches it, as a neat-python run does")
    assert out[-1].startswith("run 1 solved at generation 2: best fitness ")
    assert out[-1].endswith(", which reached the task's threshold 0 ([task] threshold)")


def byte_level_model(folder: Path) -> Path:
    """tiny-llama (vocabulary 256) with a byte-level tokenizer, so it loads as a language model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    shutil.copytree(TINY / "tiny-llama", folder)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_a_quant_recipe_run_prints_and_saves_its_best_recipe(tmp_path, capsys, monkeypatch):
    model = byte_level_model(tmp_path / "tiny")
    (tmp_path / "qr.toml").write_text(f"""
[run]
task = "quant-recipe"
population = 3
generations = 1
[task]
model = "{model.as_posix()}"
probes = ["hello world"]
probe_tokens = 4
dtypes = ["float32", "int8", "int4"]
mutation_rate = 0.5
[neat]
seed = 2
""")
    monkeypatch.chdir(tmp_path)
    assert main(["evolve", "qr.toml", "--workspace", "ws.sqlite3"]) == 0
    out = capsys.readouterr().out.splitlines()
    with Workspace(tmp_path / "ws.sqlite3") as ws:  # the oracle: the run's stored best member
        best = recipe_from_bytes(bytes.fromhex(EvolutionRuns(ws).latest_checkpoint(1).state["best"]))
    names = [la.name for la in weighted_layers(load_causal_lm(model))]
    morphs = {name: gene for name, gene in zip(names, best, strict=True) if gene != "float32"}
    assert morphs and json.loads((tmp_path / "quant-recipe-run-1.json").read_text()) == morphs
    counts = Counter("as loaded" if gene == "float32" else gene for gene in best)
    layers = " ".join(f"{name}×{n}" for name, n in counts.most_common())
    assert out[-2].startswith(f"best recipe: {layers}, ") and out[-2].endswith(" KiB")
    assert out[-1] == (f"saved as quant-recipe-run-1.json; measure it with: loomlab quant-report "
                       f"{model.as_posix()} --recipe quant-recipe-run-1.json")


def test_a_gguf_recipe_run_saves_its_best_and_compares_it_with_the_presets(tmp_path, capsys, monkeypatch):
    from loomlab.core.evolve.llm.format_space import FormatSpace
    from loomlab.core.llm.generate.textmodel import load_model
    from loomlab.core.llm.quality.drift import measure_drift

    model = byte_level_model(tmp_path / "tiny")
    (tmp_path / "train.txt").write_text("The mill on the river ground wheat for three hundred years. " * 10)
    (tmp_path / "heldout.txt").write_text("A keeper climbed the stairs each evening to light the lamp. " * 10)
    (tmp_path / "gr.toml").write_text(f"""
[run]
task = "gguf-recipe"
population = 6
generations = 2
[task]
model = "{model.as_posix()}"
train = "train.txt"
heldout = "heldout.txt"
ctx = 64
budget = "pareto"
[neat]
seed = 3
""")
    monkeypatch.chdir(tmp_path)
    assert main(["evolve", "gr.toml", "--workspace", "ws.sqlite3"]) == 0
    out = capsys.readouterr().out.splitlines()
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        best = recipe_from_bytes(bytes.fromhex(EvolutionRuns(ws).latest_checkpoint(1).state["best"]))
    with load_model(model) as loaded:
        heldout = (tmp_path / "heldout.txt").read_text()
        space = FormatSpace(loaded, (tmp_path / "train.txt").read_text(), heldout, ctx=64)
        assert json.loads((tmp_path / "gguf-recipe-run-1.json").read_text()) == space.mapping(best)
        table = out[out.index(next(line for line in out if line.startswith("held-out text:"))) + 2:]
        assert [row.split()[0] for row in table] == list(space.presets)
        assert any(row.split()[-1] != "-" for row in table)
        for row in table:  # the oracle: quant-report of each preset on the held-out text
            want = measure_drift(loaded, space.mapping(space.presets[row.split()[0]]), heldout, ctx=64).stats
            assert row.split()[3] == f"{want.kl_mean:.4f}" and row.split()[5] == f"{100 * want.same_top:.1f}"
            saved = row.split()[-1]
            if saved != "-":  # the evolved recipe within the preset's bytes, saved: quant-report reads it
                assert space.recipe_bytes(space.genes_of(saved)) <= space.recipe_bytes(
                    space.presets[row.split()[0]])
                evolved = measure_drift(loaded, saved, heldout, ctx=64).stats
                assert row.split()[8] == f"{evolved.kl_mean:.4f}"
