"""What training from the Run panel costs: epochs/s through the panel against core's ``train``
called directly, and the longest GUI-thread stall while the panel trains.

    QT_QPA_PLATFORM=offscreen python tests/bench/bench_run_panel.py [--epochs 2000] [--repeat 3]
        [--width 64] [--telemetry]

The panel trains in a JobRunner thread and redraws its loss curve from a timer; the direct run
trains the same network (rebuilt from the same seed) on the same task in this thread. Runs
alternate direct / panel so that a noisy machine slows both alike; the best of ``--repeat`` runs
of each is kept. The stall is the longest gap between ticks of a 10 ms timer on the GUI thread,
beside the same measure taken with nothing running for as long (what the machine's load alone
costs).
With ``--telemetry`` a Telemetry panel (default sampling) watches the network in both runs. The GIL
switch interval is the workbench's (1 ms).
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.procinfo import machine
from loomlab.core.train import TrainConfig, train
from loomlab.core.train_tasks import make_task
from loomlab.views.run_panel import RunPanel
from loomlab.views.telemetry_panel import TelemetryPanel
from loomlab.views.workers import JobRunner

SEED = 0
PROBE_INTERVAL_MS = 10


def mlp(width: int) -> VolumetricNetwork:
    rng = np.random.default_rng(SEED)
    net = VolumetricNetwork(1, 1, 3, 1)
    sizes = ((16, width, "Tanh"), (width, width, "Tanh"), (width, 4, "Linear"))
    for x, (n_in, n_out, act) in enumerate(sizes):
        net[0, 0, x, 0] = make_layer("Dense", input_height=n_in, output_height=n_out, activation=act, rng=rng)
    return net


def watched(net: VolumetricNetwork, telemetry: TelemetryPanel | None) -> VolumetricNetwork:
    if telemetry is not None:
        telemetry.set_network(net)
    return net


def direct_epochs_per_s(width: int, epochs: int, telemetry: TelemetryPanel | None) -> float:
    net = watched(mlp(width), telemetry)
    batches = make_task(net, SEED).batches
    t = time.perf_counter()
    train(net, batches, TrainConfig(epochs=epochs, learning_rate=0.01))
    return epochs / (time.perf_counter() - t)


def panel_epochs_per_s(panel: RunPanel, width: int, epochs: int,
                       telemetry: TelemetryPanel | None) -> tuple[float, float]:
    """Epochs/s of one training run from the panel, and the longest GUI stall (ms) meanwhile."""
    panel.set_network(watched(mlp(width), telemetry))
    loop = QEventLoop()
    while panel.is_busy():  # the task is chosen in a job
        loop.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents)
    panel.epochs_box.setValue(epochs)
    panel.lr_box.setValue(0.01)
    ticks = [time.perf_counter()]
    probe = QTimer()
    probe.setInterval(PROBE_INTERVAL_MS)
    probe.timeout.connect(lambda: ticks.append(time.perf_counter()))
    probe.start()
    t = time.perf_counter()
    panel.train()
    while panel.is_busy():
        loop.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents)
    elapsed = time.perf_counter() - t
    probe.stop()
    if len(panel.losses) != epochs:
        raise RuntimeError(f"the panel trained {len(panel.losses)} of {epochs} epochs: {panel.status.text()}")
    return epochs / elapsed, 1000 * max(np.diff(ticks)) if len(ticks) > 1 else float("nan")


def idle_stall_ms(seconds: float) -> float:
    """The longest gap between ticks of the probe timer with nothing running: the machine's own
    share of a stall, measured beside the panel's."""
    loop = QEventLoop()
    ticks = [time.perf_counter()]
    probe = QTimer()
    probe.setInterval(PROBE_INTERVAL_MS)
    probe.timeout.connect(lambda: ticks.append(time.perf_counter()))
    probe.start()
    while time.perf_counter() - ticks[0] < seconds:
        loop.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents)
    probe.stop()
    return 1000 * max(np.diff(ticks))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--telemetry", action="store_true")
    args = parser.parse_args()
    sys.setswitchinterval(0.001)  # as the workbench sets it (app/gui.py warm_up)
    app = QApplication.instance() or QApplication([])
    runner = JobRunner()
    panel = RunPanel(runner)
    panel.show()
    telemetry = TelemetryPanel() if args.telemetry else None
    direct, through_panel, stalls, idle = [], [], [], []
    try:
        direct_epochs_per_s(args.width, args.epochs // 10, telemetry)  # warm-up: first calls, caches
        for _ in range(args.repeat):
            direct.append(direct_epochs_per_s(args.width, args.epochs, telemetry))
            rate, stall = panel_epochs_per_s(panel, args.width, args.epochs, telemetry)
            through_panel.append(rate)
            stalls.append(stall)
            idle.append(idle_stall_ms(args.epochs / rate))
    finally:
        panel.shutdown()
        if telemetry is not None:
            telemetry.shutdown()
        runner.shutdown()
    print(json.dumps({
        "machine": machine(), "epochs": args.epochs, "network": f"Dense 16-{args.width}-{args.width}-4, "
        "linear-map task (4 batches of 8)", "telemetry_panel": args.telemetry,
        "direct_epochs_per_s": round(max(direct), 1), "panel_epochs_per_s": round(max(through_panel), 1),
        "panel_vs_direct": round(max(through_panel) / max(direct), 3),
        "gui_stall_ms_max": round(max(stalls), 1), "gui_stall_ms_per_run": [round(s, 1) for s in stalls],
        "idle_stall_ms_per_run": [round(s, 1) for s in idle],
    }, indent=2))
    app.processEvents()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
