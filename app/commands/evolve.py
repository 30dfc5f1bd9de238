"""``loomlab dna``, ``loomlab splice`` and ``loomlab evolve``: compare networks by their DNA, splice
two, and run evolution experiments (headless, no Qt)."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from importlib.resources import files
from pathlib import Path

from ..cli import CliError, print_table, progress_bar
from .net import load_net

EXAMPLE_CONFIG = "examples/xor.toml"  # in loomlab.resources: the README's example run


def register(sub) -> None:
    dna = sub.add_parser("dna", help="compare two networks or two language models by their DNA",
                         description="Two networks (.json / .loom) are compared as Loom's CompareNetworks "
                                     "does; two language models (built-in names, .gguf files, HF folders) "
                                     "by their count sketches across dtypes, as the DNA panel does.")
    dna.add_argument("a", help="a Loom JSON network or .loom checkpoint, or a language model")
    dna.add_argument("b", help="the network or language model to compare it with")
    dna.add_argument("--across-dtypes", action="store_true",
                     help="networks: compare dequantized weights, so a morph scores near its original "
                          "(Loom: 0); language models are always compared so")
    dna.add_argument("--json", action="store_true", help="Loom's JSON result")
    dna.set_defaults(handler=cmd_dna)

    sp = sub.add_parser("splice", help="a child of two networks (Loom's SpliceDNA)")
    sp.add_argument("a", help="parent A (the child has its structure)")
    sp.add_argument("b", help="parent B")
    sp.add_argument("-o", "--output", required=True, help="where to save the child (.json or .loom)")
    sp.add_argument("--mode", default="blend", help="blend (default), point or uniform")
    sp.add_argument("--alpha", type=float, default=0.5, help="B's share in a blend (default 0.5)")
    sp.add_argument("--split", type=float, default=0.5, help="where point mode cuts (default 0.5)")
    sp.add_argument("--fitness-a", type=float, default=0.0)
    sp.add_argument("--fitness-b", type=float, default=0.0)
    sp.add_argument("--seed", type=int, help="seed of uniform mode (default: random)")
    sp.set_defaults(handler=cmd_splice)

    ev = sub.add_parser("evolve", help="run (or resume) an evolution experiment",
                        description="Evolve networks for a task as CONFIG.toml says; every generation is "
                                    "checkpointed in the workspace, and Ctrl-C stops after the last one. "
                                    f"Example config (loomlab/resources/{EXAMPLE_CONFIG}):\n\n"
                                    + files("loomlab.resources").joinpath(EXAMPLE_CONFIG).read_text("utf-8"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("config", nargs="?", help="the run's TOML config (not needed with --resume)")
    ev.add_argument("--generations", type=int, help="generations to run (default: the config's)")
    ev.add_argument("--until", type=float, metavar="FITNESS",
                    help="stop once a member reaches FITNESS (default: the config's [run] until)")
    ev.add_argument("--resume", type=int, metavar="RUN", help="continue run RUN from its last checkpoint")
    ev.add_argument("--recipe-out", metavar="FILE",
                    help="quant-recipe, gguf-recipe: where to save the best recipe "
                         "(default: TASK-run-RUN.json)")
    ev.add_argument("--replay-out", metavar="FILE",
                    help="control tasks (cartpole ...): where to save the best member's first episode, "
                         ".gif or .mp4 (default: TASK-run-RUN.gif)")
    ev.add_argument("--scheduler", help="evaluate on Dask: 'local' (a local cluster) or tcp://host:port")
    ev.add_argument("--workspace", help="the workspace database (default: the workbench's)")
    ev.add_argument("--list", action="store_true", help="list the workspace's runs and exit")
    ev.set_defaults(handler=cmd_evolve)


# ----- dna / splice --------------------------------------------------------------------------
def cmd_dna(args) -> int:
    from loomlab.core.evolve.llm.dna_table import kind_of

    kinds = kind_of(args.a), kind_of(args.b)
    if kinds[0] != kinds[1]:
        raise CliError(f"{args.a} is a {_KIND_TEXT[kinds[0]]} and {args.b} a {_KIND_TEXT[kinds[1]]}: "
                       "compare two networks (.json / .loom) or two language models")
    return _dna_of_models(args) if kinds[0] == "model" else _dna_of_networks(args)


_KIND_TEXT = {"network": "network", "model": "language model"}


def _dna_of_networks(args) -> int:
    from loomlab.core.evolve.genetics.dna import compare_dna, dtype_mismatches

    a, b = load_net(args.a), load_net(args.b)
    result = compare_dna(a, b, across_dtypes=args.across_dtypes)
    if args.json:
        print(json.dumps(result.to_loom(), indent=2))
    else:
        _print_overlaps(result.overall_overlap, [(k, f"{v:.6f}") for k, v in result.layer_overlaps.items()],
                        "layer z,y,x,l")
        if result.logic_shifts:
            print("logic shifts")
            print_table(("from", "to", "overlap"),
                        [(s.source_pos, s.target_pos, f"{s.overlap:.6f}") for s in result.logic_shifts])
    mismatches = [] if args.across_dtypes else dtype_mismatches(a, b)
    if mismatches:  # a network against its int8 morph reads 0 everywhere: say why, and what compares
        key, dtype_a, dtype_b = mismatches[0]
        print(f"{len(mismatches)} layer(s) differ in dtype (at {key}: {dtype_a} against {dtype_b}) and "
              "score 0, as in Loom; --across-dtypes compares their dequantized weights",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _dna_of_models(args) -> int:
    """The DNA panel's comparison (:func:`loomlab.core.evolve.llm.dna_table.model_report`)."""
    from loomlab.core.evolve.llm.dna_table import model_report

    report = model_report(args.a, args.b, progress=progress_bar)
    if args.json:
        print(json.dumps(report.comparison.to_loom(), indent=2))
        return 0
    _print_overlaps(report.comparison.overall_overlap, [(r.name, f"{r.overlap:.6f}") for r in report.rows],
                    "layer (count sketches, across dtypes)")
    return 0


def _print_overlaps(overall: float, rows: list[tuple[str, str]], heading: str) -> None:
    print(f"overall overlap  {overall:.6f}")
    print_table((heading, "overlap"), rows)


def cmd_splice(args) -> int:
    from loomlab.core.evolve.genetics.splicing import SpliceConfig, splice
    from loomlab.core.io import save_network

    config = SpliceConfig(mode=args.mode, blend_alpha=args.alpha, split_ratio=args.split,
                          fitness_a=args.fitness_a, fitness_b=args.fitness_b, seed=args.seed)
    result = splice(load_net(args.a), load_net(args.b), config)
    save_network(result.child, args.output)
    print(f"saved {args.output}: {result.blended_count} of {len(result.similarities)} layers similar (> 0)")
    return 0


# ----- evolve ----------------------------------------------------------------------------------
def cmd_evolve(args) -> int:
    from loomlab.core.evolve.search.reporters import ConsoleReporter
    from loomlab.core.evolve.search.run import Evolution
    from loomlab.core.evolve.search.run_config import read_plan
    from loomlab.core.evolve.search.schedulers import make_evaluator
    from loomlab.core.workspace.evolution_runs import EvolutionRuns
    from loomlab.core.workspace.store import Workspace, default_path

    workspace = Path(args.workspace) if args.workspace else default_path()
    if args.list:
        with Workspace(workspace) as ws:
            rows = [(str(r.id), r.task, str(r.generations), r.status) for r in EvolutionRuns(ws).list()]
            print_table(("run", "task", "generations", "status"), rows)
        return 0
    if (args.config is None) == (args.resume is None):
        raise CliError("give a CONFIG.toml, or --resume RUN (not both)")
    plan = read_plan(args.config) if args.config else None  # errors: one line naming the file
    generations = args.generations if args.generations is not None else (plan.generations if plan else None)
    if generations is None or generations < 0:
        raise CliError("say how many generations: --generations N (or generations in the config's [run])")
    scheduler = args.scheduler or (plan.scheduler if plan else None)
    until = args.until if args.until is not None else (plan.until if plan else None)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())  # Ctrl-C: stop after a checkpoint
    try:
        options = plan.evaluator if plan else {}
        with Workspace(workspace) as ws, make_evaluator(scheduler, **options) as evaluator:
            reporters = [ConsoleReporter()]
            if args.resume is not None:
                run = Evolution.resume(ws, args.resume, evaluator=evaluator, reporters=reporters)
            else:
                run = plan.evolution(evaluator=evaluator, reporters=reporters, store=ws)
            start = run.generation
            print(f"run {run.run_id} in {workspace} (generation {start})")
            if _reached(run, until):
                print(f"run {run.run_id} has reached {_limit(run, until)}: it stops again at the first "
                      "generation that reaches it, as a neat-python run does")
            result = run.run(generations, until=until, cancel=stop.is_set,
                             progress=lambda done, total: progress_bar("evaluate", done, total))
    finally:
        signal.signal(signal.SIGINT, previous)
    line = f"run {result.run_id} {result.status} at generation {result.generation}: best fitness " \
           f"{result.best_fitness:.4f}"
    if result.status == "solved":
        line += f", which reached {_limit(run, until)}"
    elif result.status == "stopped":
        left = generations - (result.generation - start)
        line += f"; resume with: {_resume_command(args, result.run_id, left, scheduler, until)}"
    print(line)
    if run.genome.member_kind == "recipe" and run.best is not None:
        _save_best_recipe(run, args.recipe_out or f"{run.task.name}-run-{result.run_id}.json")
    if hasattr(run.task, "episode") and run.best is not None:
        _save_replay(run, args.replay_out or f"{run.task.name}-run-{result.run_id}.gif")
    return 0


def _save_replay(run, path: str) -> None:
    """A control run's best member in its first evaluation episode, saved as GIF or MP4."""
    from loomlab.core.evolve.control.frames import DRAWN, save_replay

    # an environment whose frames are not drawn from its state is recorded with its own render
    episode = run.task.episode(run.best, render=run.task.environment.env_id not in DRAWN)
    saved = save_replay(episode, path)
    print(f"replay of the best member ({episode.env_id}, seed {episode.seed}, {len(episode)} steps, "
          f"return {episode.total:g}): {saved}")


def _save_best_recipe(run, path: str) -> None:
    """Print a quant-recipe run's best recipe in one line and save it where ``quant-report`` and
    ``quantize`` read it from."""
    from loomlab.core.llm.quality.recipe import save_recipe

    save_recipe(path, run.task.morphs(run.best))
    print(f"best recipe: {run.task.summary(run.best)}")
    print(f"saved as {path}; measure it with: "
          f"{shlex.join(['loomlab', 'quant-report', run.task.params['model'], '--recipe', path])}")
    if hasattr(run.task, "comparison"):
        _print_comparison(run.task, Path(path))


def _print_comparison(task, best: Path) -> None:
    """A gguf-recipe run against llama.cpp's presets, all on the held-out text: each preset, and
    the evolved recipe with the lowest training KL within its bytes, saved beside the best recipe
    as ``BEST-within-PRESET.json``."""
    from loomlab.core.llm.quality.recipe import save_recipe
    from loomlab.core.units import format_bytes

    rows, saved = task.comparison(), {}
    for r in rows:
        if r.evolved is not None:
            saved[r.preset] = best.with_name(f"{best.stem}-within-{r.preset}.json")
            save_recipe(saved[r.preset], task.morphs(r.evolved))

    def cells(score):
        if score is None:
            return ["-"] * 4
        s = score.stats
        return [format_bytes(score.bytes), f"{s.kl_mean:.4f}", f"{s.kl_p99:.3f}", f"{100 * s.same_top:.1f}"]

    print("held-out text: each preset, and the evolved recipe with the lowest training KL within its bytes")
    print_table(("preset", "bytes", "KL mean", "KL p99", "same top %", "evolved bytes", "KL mean", "KL p99",
                 "same top %", "saved as"), [(r.preset, *cells(r.preset_score), *cells(r.evolved_score),
                                              str(saved.get(r.preset, "-"))) for r in rows])


def _reached(run, until: float | None) -> bool:
    """Whether the run's best member already meets its stop condition (so a resumed run stops
    after one generation)."""
    return run.task.solved(run.best_fitness) or (until is not None and run.best_fitness >= until)


def _limit(run, until: float | None) -> str:
    """The stop condition the run's best fitness meets, as a user would change it."""
    if run.task.solved(run.best_fitness):
        return f"the task's threshold {run.task.fitness_threshold:g} ([task] threshold)"
    return f"--until {until:g}"


def _resume_command(args, run_id: int, generations: int, scheduler: str | None, until: float | None) -> str:
    """The command that continues a stopped run where it stopped, with what this one was given
    (the workspace, the scheduler, the stop condition) and the generations it had left."""
    words = ["loomlab", "evolve", "--resume", str(run_id), "--generations", str(generations)]
    for option, value in (("--workspace", args.workspace), ("--scheduler", scheduler), ("--until", until)):
        if value is not None:
            words += [option, str(value)]
    return shlex.join(words)
