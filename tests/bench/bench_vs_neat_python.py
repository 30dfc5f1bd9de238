"""Benchmark: network evaluations per second on XOR, ours against neat-python's, population 1,000.

    python tests/bench/bench_vs_neat_python.py [--population 1000] [--hidden 4] [--rounds 5]

One evaluation is one network scored on XOR's four cases (the same four inputs on both sides),
by ``XorTask.evaluate`` (batched forward, vectorised fitness) for ours and by neat-python's XOR
example evaluation (``FeedForwardNetwork.create`` then ``activate`` per case, ``4 - sum of squared
errors``) for theirs. Populations: neat-python's first generation (genomes 2 -> hidden -> 1, fully
connected, random weights); ours twice: ``random_weights``, the same first generation (the XOR
task's seed network, Dense 2 -> hidden -> 1, with a different weight seed per member), and
``neat_mutated``, the members of a ``NEATPopulation`` of that seed network under Loom's default
mutations (``NEATConfig.default``: about a fifth of the members get another layer type and run
their own forward), and ``neat_mutated_task_config`` under the XOR task's own NEAT config
(``get_task("xor").neat_config()``, Dense only: what XOR evolution runs use by default).
neat-python runs in a virtual environment of its own that this script creates under
~/.cache/loomlab/bench-neat-python (``python -m venv`` + ``pip install neat-python``). The sides
alternate in ``rounds`` rounds and the best round of each counts. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from benchtools import best

from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.batched import group_key
from loomlab.core.evolve.search.population import NEATPopulation
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.procinfo import machine

VENV = Path.home() / ".cache" / "loomlab" / "bench-neat-python" / "venv"

# neat-python's XOR example configuration with `hidden` hidden nodes and tanh nodes (our hidden
# layer's activation); the mutation settings do not matter here, only evaluation is timed.
NEAT_CONFIG = """
[NEAT]
fitness_criterion = max
fitness_threshold = 3.9
pop_size = {population}
reset_on_extinction = False
no_fitness_termination = False

[DefaultGenome]
activation_default = tanh
activation_mutate_rate = 0.0
activation_options = tanh
aggregation_default = sum
aggregation_mutate_rate = 0.0
aggregation_options = sum
bias_init_mean = 0.0
bias_init_stdev = 1.0
bias_max_value = 30.0
bias_min_value = -30.0
bias_mutate_power = 0.5
bias_mutate_rate = 0.7
bias_replace_rate = 0.1
compatibility_disjoint_coefficient = 1.0
compatibility_weight_coefficient = 0.5
conn_add_prob = 0.5
conn_delete_prob = 0.5
enabled_default = True
enabled_mutate_rate = 0.01
feed_forward = True
initial_connection = full_nodirect
node_add_prob = 0.2
node_delete_prob = 0.2
single_structural_mutation = False
structural_mutation_surer = default
num_hidden = {hidden}
num_inputs = 2
num_outputs = 1
response_init_mean = 1.0
response_init_stdev = 0.0
response_max_value = 30.0
response_min_value = -30.0
response_mutate_power = 0.0
response_mutate_rate = 0.0
response_replace_rate = 0.0
weight_init_mean = 0.0
weight_init_stdev = 1.0
weight_max_value = 30
weight_min_value = -30
weight_mutate_power = 0.5
weight_mutate_rate = 0.8
weight_replace_rate = 0.1

[DefaultSpeciesSet]
compatibility_threshold = 3.0

[DefaultStagnation]
species_fitness_func = max
max_stagnation = 20
species_elitism = 2

[DefaultReproduction]
elitism = 2
survival_threshold = 0.2
min_species_size = 1
"""

# Runs in neat-python's venv: argv = config path, repeat; prints the best seconds to evaluate the
# whole population and the package's version.
NEAT_TIMER = """
import json, sys, time
from importlib.metadata import version
import neat
XOR_INPUTS = [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
XOR_OUTPUTS = [(0.0,), (1.0,), (1.0,), (0.0,)]
config = neat.Config(neat.DefaultGenome, neat.DefaultReproduction, neat.DefaultSpeciesSet,
                     neat.DefaultStagnation, sys.argv[1])
genomes = list(neat.Population(config, seed=0).population.items())

def eval_genomes(genomes, config):
    for genome_id, genome in genomes:
        genome.fitness = 4.0
        net = neat.nn.FeedForwardNetwork.create(genome, config)
        for xi, xo in zip(XOR_INPUTS, XOR_OUTPUTS):
            output = net.activate(xi)
            genome.fitness -= (output[0] - xo[0]) ** 2

best = float("inf")
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    eval_genomes(genomes, config)
    best = min(best, time.perf_counter() - t)
print(json.dumps({"seconds": best, "members": len(genomes), "version": version("neat-python")}))
"""


def neat_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "neat-python"], check=True)
    return python


def time_neat_python(config_path: Path, repeat: int) -> dict:
    out = subprocess.run([str(neat_python()), "-c", NEAT_TIMER, str(config_path), str(repeat)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    task = get_task("xor", hidden=args.hidden)
    populations = {
        "random_weights": [get_task("xor", hidden=args.hidden, seed=i).seed_network()
                           for i in range(args.population)],
        "neat_mutated": NEATPopulation(task.seed_network(), args.population,
                                       NEATConfig.default(args.hidden, seed=1)).members,
        "neat_mutated_task_config": NEATPopulation(task.seed_network(), args.population,
                                                   task.neat_config(seed=1)).members,
    }
    ours_s = dict.fromkeys(populations, float("inf"))
    theirs = None
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "config-feedforward"
        config_path.write_text(NEAT_CONFIG.format(population=args.population, hidden=args.hidden))
        for _ in range(args.rounds):
            for name, members in populations.items():
                ours_s[name] = min(ours_s[name], best(lambda m=members: task.evaluate(m), 3))
            run = time_neat_python(config_path, 3)
            theirs = run if theirs is None or run["seconds"] < theirs["seconds"] else theirs
    theirs_rate = theirs["members"] / theirs["seconds"]
    ours = {name: {"batched_members": sum(group_key(m) is not None for m in populations[name]),
                   "evals_per_s": round(args.population / s),
                   "speedup": round(args.population / s / theirs_rate, 1)}
            for name, s in ours_s.items()}
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(),
        "command": " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "population": args.population, "hidden": args.hidden,
        "neat_python_version": theirs["version"],
        "neat_python_evals_per_s": round(theirs_rate),
        "ours": ours,
    }, indent=2))


if __name__ == "__main__":
    main()
