"""Benchmark: CartPole-v1 environment steps per second for a population, batched against loops.

    python tests/bench/bench_control.py [--population 1000] [--episodes 10] [--hidden 8]
                                        [--members mutants|random] [--max-steps 500] [--rounds 3]

Every member plays the same ``episodes`` seeded episodes (Gymnasium ``reset(seed=k)``, k = 0,
1, ...), and a step is one member's action in one episode; the rate is the steps the episodes
actually took (the sum of their lengths) over the wall time of the whole population. Three ways:

* ``ours batched``: ``get_task("cartpole", episodes=..., hidden=...).evaluate(population)``, every
  member in every episode stepped as one batch (:mod:`loomlab.core.evolve.control.rollout`, numpy
  CartPole dynamics). CartPole pays 1 per step, so the steps are the returns summed.
* ``ours python loop``: the same population, member by member: one ``gymnasium.make("CartPole-v1")``
  per episode, the member's network (``NetworkStack([net]).forward_rows``, the batched path's own
  kernel, made once per member) called on each observation, action ``argmax`` of its 2 outputs.
  Its returns are checked against the batched ones (``same returns``).
* ``neat-python``: neat-python's own setup: the first generation of a ``neat.Population`` (the
  config of neat-python's ``examples/single-pole-balancing``, 4 inputs, 2 outputs), each genome
  evaluated as that example does: ``FeedForwardNetwork.create`` per genome, ``net.activate(obs)``
  per step, stepping ``gymnasium.make("CartPole-v1")`` per episode (action ``argmax``).

The populations: ``--members mutants`` (default) is a run's first generation, the task's seed
network (Dense 4 -> hidden -> 2, Tanh) under the task's NEAT mutations; ``random`` is the seed
network with a different weight seed per member (longer episodes: some balance to 500). Random
controllers fall over within tens of steps, so per-episode costs (``gymnasium.make``, reset) weigh
on short episodes: compare ``mean episode length`` before comparing rates, or fix the budget with
``--max-steps`` (at most CartPole-v1's 500). The sides alternate in ``rounds`` rounds and the best
round of each counts (the batched one is also the best of 3 calls per round).

neat-python is a benchmark-only dependency: ``.venv/bin/pip install neat-python`` (2.0.0 measured).
Prints the machine and a table: steps, mean episode length, seconds, steps/s, and each rate over
the Python loop's (the issue's target: batched >= 20x the loop).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from benchtools import best

from loomlab.core.errors import LoomError
from loomlab.core.evolve.search.batched import NetworkStack
from loomlab.core.evolve.search.population import NEATPopulation
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.procinfo import machine

ENV_ID = "CartPole-v1"

# neat-python's examples/single-pole-balancing/config-feedforward, with 2 outputs (one per CartPole
# action, the larger acts) instead of its 1, and the keys neat-python 2.0 wants spelled out
# (reset_on_extinction as a bool, no_fitness_termination). Fitness is the mean return (threshold
# {threshold}: a run stops when a genome reaches it).
NEAT_CONFIG = """
[NEAT]
fitness_criterion     = max
fitness_threshold     = {threshold}
pop_size              = {population}
reset_on_extinction   = False
no_fitness_termination = False

[DefaultGenome]
num_inputs              = 4
num_hidden              = 1
num_outputs             = 2
initial_connection      = partial_direct 0.5
feed_forward            = True
compatibility_disjoint_coefficient    = 1.0
compatibility_weight_coefficient      = 0.6
conn_add_prob           = 0.2
conn_delete_prob        = 0.2
node_add_prob           = 0.2
node_delete_prob        = 0.2
activation_default      = sigmoid
activation_options      = sigmoid
activation_mutate_rate  = 0.0
aggregation_default     = sum
aggregation_options     = sum
aggregation_mutate_rate = 0.0
bias_init_mean          = 0.0
bias_init_stdev         = 1.0
bias_replace_rate       = 0.1
bias_mutate_rate        = 0.7
bias_mutate_power       = 0.5
bias_max_value          = 30.0
bias_min_value          = -30.0
response_init_mean      = 1.0
response_init_stdev     = 0.0
response_replace_rate   = 0.0
response_mutate_rate    = 0.0
response_mutate_power   = 0.0
response_max_value      = 30.0
response_min_value      = -30.0

weight_max_value        = 30
weight_min_value        = -30
weight_init_mean        = 0.0
weight_init_stdev       = 1.0
weight_mutate_rate      = 0.8
weight_replace_rate     = 0.1
weight_mutate_power     = 0.5
enabled_default         = True
enabled_mutate_rate     = 0.01

[DefaultSpeciesSet]
compatibility_threshold = 3.0

[DefaultStagnation]
species_fitness_func = max
max_stagnation  = 20

[DefaultReproduction]
elitism            = 2
survival_threshold = 0.2
"""


def import_neat():
    """The ``neat`` module (neat-python), or an exit saying how to install it."""
    try:
        import neat
    except ImportError:
        sys.exit("neat-python is a benchmark-only dependency: .venv/bin/pip install neat-python")
    return neat


def neat_config(population: int, threshold: float = 500.0):
    """neat-python's ``Config`` from :data:`NEAT_CONFIG` (written to a temporary file, as it reads one)."""
    neat = import_neat()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config-feedforward"
        path.write_text(NEAT_CONFIG.format(population=population, threshold=threshold))
        return neat.Config(neat.DefaultGenome, neat.DefaultReproduction, neat.DefaultSpeciesSet,
                           neat.DefaultStagnation, str(path))


def gym_episode(act, seed: int, max_steps: int) -> int:
    """One episode of a fresh ``gymnasium.make(ENV_ID)`` reset with ``seed``, ``act(obs) -> action``
    per step, as neat-python's example and a plain Gymnasium loop run it; its return (= its steps)."""
    import gymnasium

    env = gymnasium.make(ENV_ID)
    try:
        obs, _ = env.reset(seed=seed)
        total = 0.0
        for _ in range(max_steps):
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            if terminated or truncated:
                break
    finally:
        env.close()
    return int(total)


def neat_python_returns(genomes, config, seeds: list[int], max_steps: int) -> np.ndarray:
    """Each genome's return in each episode ``[genomes, episodes]``, neat-python's example way."""
    neat = import_neat()
    out = np.zeros((len(genomes), len(seeds)))
    for i, genome in enumerate(genomes):
        net = neat.nn.FeedForwardNetwork.create(genome, config)
        for k, seed in enumerate(seeds):
            out[i, k] = gym_episode(lambda obs, net=net: int(np.argmax(net.activate(obs))), seed, max_steps)
    return out


def loop_returns(nets, seeds: list[int], max_steps: int) -> np.ndarray:
    """Each of our networks alone, episode by episode in Gymnasium: returns ``[members, episodes]``.
    A member whose network cannot act (it raises, or gives fewer than 2 outputs: a mutation can
    change a layer's width) stops and scores 0 in every episode, as the task scores it."""
    out = np.zeros((len(nets), len(seeds)))
    for i, net in enumerate(nets):
        stack = NetworkStack([net])
        member = [0]

        def act(obs, stack=stack, member=member):
            row = np.asarray(obs, np.float32).reshape(1, -1)
            ((_, y),) = stack.forward_rows(row, member, catch=LoomError)
            if isinstance(y, BaseException) or y.shape[1] < 2:
                raise CannotAct
            return int(np.argmax(y[0, :2]))

        try:
            for k, seed in enumerate(seeds):
                out[i, k] = gym_episode(act, seed, max_steps)
        except CannotAct:
            out[i] = 0.0
    return out


class CannotAct(Exception):
    """A member's network raised or gave too few outputs (it took no step)."""


def timed(fn):
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=1000)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--members", choices=("mutants", "random"), default="mutants")
    ap.add_argument("--max-steps", type=int, default=500, help="step budget per episode (<= 500)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not 1 <= args.max_steps <= 500:
        ap.error("--max-steps must be in 1..500 (CartPole-v1's time limit is 500)")
    neat = import_neat()
    task = get_task("cartpole", episodes=args.episodes, hidden=args.hidden, max_steps=args.max_steps)
    seeds = task.seeds()
    if args.members == "mutants":
        nets = NEATPopulation(task.seed_network(), args.population, task.neat_config(seed=1)).members
    else:
        nets = [get_task("cartpole", hidden=args.hidden, seed=i).seed_network()
                for i in range(args.population)]
    config = neat_config(args.population)
    genomes = list(neat.Population(config, seed=0).population.values())

    batched_s = loop_s = neat_s = float("inf")
    batched = loop = theirs = None
    for _ in range(args.rounds):
        batched_s = min(batched_s, best(lambda: task.evaluate(nets), 3))
        s, loop = timed(lambda: loop_returns(nets, seeds, args.max_steps))
        loop_s = min(loop_s, s)
        s, theirs = timed(lambda: neat_python_returns(genomes, config, seeds, args.max_steps))
        neat_s = min(neat_s, s)
    batched = np.array(task.evaluate(nets)) * args.episodes  # mean return -> steps per member
    batched_steps = int(np.rint(batched).sum())
    same = int(np.sum(np.rint(batched) == loop.sum(axis=1)))

    rows = [("ours batched", batched_steps, batched_s), ("ours python loop", int(loop.sum()), loop_s),
            ("neat-python", int(theirs.sum()), neat_s)]
    loop_rate = rows[1][1] / loop_s
    print(f"machine: {machine()}, python {platform.python_version()}, "
          f"load avg (1 min) {os.getloadavg()[0]:.2f}")
    print(f"command: {' '.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])}")
    print(f"{ENV_ID}: population {args.population} ({args.members}; neat-python: its first generation, "
          f"neat-python {version('neat-python')}), {args.episodes} episodes each (seeds {seeds[0]}.."
          f"{seeds[-1]}), at most {args.max_steps} steps; gymnasium {version('gymnasium')}")
    print(f"same returns, ours batched vs ours python loop: {same}/{args.population} members; "
          f"members that cannot act (a mutation broke the chain; score 0, no steps): "
          f"{int(np.sum(loop.sum(axis=1) == 0))}")
    print()
    print(f"{'way':18s} {'steps':>9s} {'mean ep len':>11s} {'seconds':>8s} {'steps/s':>10s} {'x loop':>7s}")
    for name, steps, seconds in rows:
        rate = steps / seconds
        print(f"{name:18s} {steps:9d} {steps / (args.population * args.episodes):11.1f} {seconds:8.3f} "
              f"{rate:10.0f} {rate / loop_rate:7.1f}")
    print(f"\nbatched over neat-python: {rows[0][1] / batched_s / (rows[2][1] / neat_s):.1f}x")


if __name__ == "__main__":
    main()
