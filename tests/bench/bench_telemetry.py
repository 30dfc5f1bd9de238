"""What the telemetry panel costs a chat: greedy decode speed with and without it attached.

    QT_QPA_PLATFORM=offscreen python tests/bench/bench_telemetry.py [--model smollm2-135m]
        [--tokens 64] [--repeat 3] [--rate-hz HZ] [--sample-hz HZ | --every-pass]

As in the workbench, generation runs in a JobRunner thread while the GUI thread's event loop runs
the panel's refresh timer, so the measured cost is the core observer (stats of every layer's
output, for the passes the panel samples) plus the panel draining its buffer and redrawing. Runs
alternate without / with the panel so that a noisy machine slows both alike; the best of
``--repeat`` runs of each is kept. Prints JSON; the issue's target is a slowdown of at most 15%.
"""

from __future__ import annotations

import argparse
import json
import platform

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication

from loomlab.core.llm.generate.textmodel import TextModel, load_model
from loomlab.core.procinfo import machine
from loomlab.views.telemetry_panel import DEFAULT_RATE_HZ, DEFAULT_SAMPLE_HZ, TelemetryPanel
from loomlab.views.workers import JobRunner

PROMPT = ("The history of computing is a story of people and machines: from mechanical calculators "
          "and punched cards to transistors, integrated circuits and the networks that")
TARGET_PERCENT = 15.0


def decode_rate(model: TextModel, runner: JobRunner, tokens: int) -> float:
    """Tokens/s of one greedy generation in a worker, with the GUI event loop running meanwhile."""
    loop = QEventLoop()
    outcome: list = []

    def generate(job) -> float:
        for _ in model.generate(PROMPT, max_tokens=tokens, temperature=0.0, cancel=job.is_cancelled):
            pass
        return model.metrics().decode_tokens_per_s

    runner.start(generate, name="bench-generate", on_success=outcome.append,
                 on_failure=lambda e: outcome.append(RuntimeError(e)))
    while not outcome:
        loop.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents)
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate-hz", type=float, default=None,
                    help="the panel's refresh rate (its default if not given)")
    ap.add_argument("--sample-hz", type=float, default=DEFAULT_SAMPLE_HZ,
                    help="passes a second the panel records")
    ap.add_argument("--every-pass", action="store_true", help="record every pass (no sampling)")
    args = ap.parse_args()
    app = QApplication.instance() or QApplication([])
    runner = JobRunner()
    sample_hz = None if args.every_pass else args.sample_hz
    panel = TelemetryPanel(rate_hz=args.rate_hz or DEFAULT_RATE_HZ, sample_hz=sample_hz)
    panel.resize(1100, 650)
    panel.show()  # repaints take GUI-thread time too, as they would in the window
    with load_model(args.model) as model:
        decode_rate(model, runner, 2)  # JIT warm-up
        without, with_panel = [], []
        for _ in range(args.repeat):
            panel.set_network(None)
            without.append(decode_rate(model, runner, args.tokens))
            panel.set_network(model.net)
            with_panel.append(decode_rate(model, runner, args.tokens))
        panel.shutdown()
        runner.shutdown()
    app.processEvents()
    base, observed = max(without), max(with_panel)
    slowdown = 100.0 * (1.0 - observed / base)
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(), "model": args.model,
        "tokens": args.tokens, "repeat": args.repeat, "refresh_hz": round(1000 / panel.timer.interval(), 1),
        "sample_hz": sample_hz,
        "decode_tokens_per_s": {"without_panel": round(base, 1), "with_panel": round(observed, 1)},
        "runs": {"without_panel": [round(r, 1) for r in without],
                 "with_panel": [round(r, 1) for r in with_panel]},
        "slowdown_percent": round(slowdown, 1), "target_percent": TARGET_PERCENT,
        "meets_target": slowdown <= TARGET_PERCENT,
    }, indent=2))


if __name__ == "__main__":
    main()
