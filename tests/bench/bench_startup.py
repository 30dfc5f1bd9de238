"""From starting ``python`` to the main window shown, and where the time goes.

    xvfb-run -a python tests/bench/bench_startup.py [--repeat 5]

Each run is a fresh interpreter doing what ``loomlab`` does before its event loop: import the
app (Qt, pyqtgraph, numba), ``warm_up()`` (numba kernels, GIL switch interval, freezing the
startup heap out of the garbage collector), build and show the window, and process events until
it is drawn. The parent times the whole, interpreter start included; the child reports its
phases. Prints JSON with the best and median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

from loomlab.core.procinfo import machine

CHILD = """
import json, time
t0 = time.perf_counter()
from loomlab.app.gui import make_app, warm_up
from loomlab.app.main_window import MainWindow
t1 = time.perf_counter()
app = make_app([])
warm_up()
t2 = time.perf_counter()
window = MainWindow()
window.show()
app.processEvents()
t3 = time.perf_counter()
print(json.dumps({"imports_s": t1 - t0, "warm_up_s": t2 - t1, "window_s": t3 - t2}), flush=True)
window.close()
"""


def one_run() -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    shown = time.perf_counter() - start
    proc.communicate(timeout=60)
    if proc.returncode != 0 or not line:
        raise SystemExit(f"the child exited with {proc.returncode} before showing the window")
    return {"shown_s": shown, **json.loads(line)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = [one_run() for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["shown_s"])
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(),
        "runs": args.repeat,
        "best": {k: round(v, 3) for k, v in best.items()},
        "median_shown_s": round(statistics.median(r["shown_s"] for r in runs), 3),
    }, indent=1))


if __name__ == "__main__":
    main()
