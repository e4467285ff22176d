#!/usr/bin/env python3
"""End-to-end checks of `astrai train --dashboard` and `astrai plot` on a tiny synthetic run:
1. the dashboard listens on an ephemeral port before the first update; its JSON endpoint serves
   records while the run trains, and after it finished exactly the records of metrics.jsonl;
   the finished run keeps serving until SIGTERM, which ends it with status 0;
2. SIGTERM during training stops the run (checkpoint, "stopped") and the process at once;
3. `astrai plot` writes the run's panels as PNG and SVG, and gives clear errors for a missing
   metrics.jsonl, an empty one, an unknown metric, an unsupported extension and an unwritable
   output; `astrai dashboard` rejects a missing directory.

usage: dashboard_cli_test.py ASTRAI MAKE_SHARDS
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from cli_checks import check, finish, metrics, run, tiny_seq_args, tiny_seq_setup  # noqa: E402

ASTRAI, MAKE = sys.argv[1], sys.argv[2]


def train_args(data, cfg, out, steps, extra=()):
    return tiny_seq_args(ASTRAI, data, cfg, out, steps, extra=extra)


class Proc:
    """A running `astrai` with its stderr collected by a thread."""

    def __init__(self, args):
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err = ""
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stderr:
            with self.lock:
                self.err += line

    def stderr(self):
        with self.lock:
            return self.err

    def wait(self, seconds):
        """The exit status once the process ended and its stderr was read to the end (None, after
        a kill, if it did not end in time)."""
        try:
            code = self.p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.p.kill()
            code = None
        self.reader.join(timeout=10)
        return code

    def wait_for(self, pattern, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            m = re.search(pattern, self.stderr())
            if m:
                return m
            if self.p.poll() is not None:
                time.sleep(0.2)
                return re.search(pattern, self.stderr())
            time.sleep(0.02)
        return None


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head[:8]
    return struct.unpack(">II", head[16:24])


def live_dashboard(tmp, data, cfg):
    out = os.path.join(tmp, "live")
    steps = 120
    proc = Proc(train_args(data, cfg, out, steps, ["--dashboard", "--port", "0"]))
    m = proc.wait_for(r"dashboard: listening on (http://127\.0\.0\.1:(\d+)/)", 60)
    check(m is not None, f"train --dashboard --port 0 logs its address ({proc.stderr()[-300:]})")
    if not m:
        proc.p.kill()
        return
    base = m.group(1)
    # (Records served during training: sigterm_while_training, whose run cannot finish first.)
    finished = proc.wait_for(r"dashboard: training finished; still serving", 30)
    check(finished is not None and proc.p.poll() is None, "a finished run keeps serving")
    # The reader thread polls every 0.5 s: wait for the last line to be read.
    served = []
    for _ in range(100):
        served = get(base + "api/metrics?run=0&from=0")["records"]
        if len(served) == steps:
            break
        time.sleep(0.05)
    on_disk = metrics(out)
    check(len(on_disk) == steps and served == on_disk, f"the endpoint serves exactly metrics.jsonl ({len(served)} vs {len(on_disk)})")
    check(any("val_loss" in r for r in served), "validation records included")
    runs = get(base + "api/runs")["runs"]
    check(runs[0]["name"] == "live" and runs[0]["records"] == steps, f"/api/runs names the run ({runs})")
    page = urllib.request.urlopen(base, timeout=10).read().decode()
    check("AstrAI training dashboard" in page, "the page is served")
    proc.p.send_signal(signal.SIGTERM)
    code = proc.wait(10)
    check(code == 0, f"SIGTERM ends the finished run's dashboard with status 0 (got {code})")
    check(f"done after {steps} updates" in proc.p.stdout.read(), "the run's summary is printed")


def sigterm_while_training(tmp, data, cfg):
    out = os.path.join(tmp, "term")
    proc = Proc(train_args(data, cfg, out, 100000, ["--dashboard", "--port", "0"]))
    m = proc.wait_for(r"dashboard: listening on (http://127\.0\.0\.1:(\d+)/)", 60)
    check(m is not None, "second dashboard starts")
    if not m:
        proc.p.kill()
        return
    # SIGTERM once updates run (before that the trainer's handler is not installed yet).
    deadline = time.time() + 120
    served = 0
    while time.time() < deadline and served < 3:
        served = len(get(m.group(1) + "api/metrics?run=0")["records"])
        time.sleep(0.05)
    check(served >= 3 and proc.p.poll() is None, f"records served while training ({served} of 100000 updates)")
    proc.p.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    check(code == 0, f"SIGTERM during training stops it and exits (status {code}; {proc.stderr()[-300:]})")
    check("stopped by signal" in proc.stderr() and "still serving" not in proc.stderr(),
          "an interrupted run saves its checkpoint and does not keep serving")


def plot_checks(tmp, run_dir):
    png = os.path.join(tmp, "loss.png")
    r = run([ASTRAI, "plot", run_dir, "--output", png, "--width", "800", "--height", "500", "--log-y", "loss"])
    check(r.returncode == 0 and png_size(png) == (800, 500), f"plot writes an 800x500 PNG ({r.stderr[-300:]})")
    check("loss, lr, grad_norm, tokens_per_s, step_seconds" in r.stdout, f"plot names its panels ({r.stdout.strip()})")
    svg = os.path.join(tmp, "two.svg")
    r = run([ASTRAI, "plot", run_dir, run_dir + "/", "--metrics", "loss", "-o", svg])
    text = open(svg).read() if os.path.exists(svg) else ""
    check(r.returncode == 0 and text.startswith("<?xml") and text.count('data-panel="') == 1,
          f"plot --metrics loss writes one SVG panel ({r.stderr[-300:]})")
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    errors = [
        ([os.path.join(tmp, "nothing"), "-o", png], "no such directory"),
        ([tmp, "-o", png], "no metrics.jsonl"),
        ([empty, "-o", png], "empty file"),
        ([run_dir, "--metrics", "loss,bogus", "-o", png], 'unknown metric "bogus"'),
        ([run_dir, "-o", os.path.join(tmp, "loss.jpg")], 'unsupported image type ".jpg"'),
        ([run_dir, "-o", os.path.join(tmp, "no", "dir", "loss.png")], "does not exist"),
        ([run_dir, "-o", "/proc/astrai-plot.png"], "cannot write it"),
    ]
    open(os.path.join(empty, "metrics.jsonl"), "w").close()
    for args, want in errors:
        r = run([ASTRAI, "plot", *args])
        check(r.returncode != 0 and want in r.stderr, f"plot {' '.join(args[-3:])}: error mentions '{want}' ({r.stderr.strip()[-200:]})")
    r = run([ASTRAI, "dashboard", os.path.join(tmp, "nothing"), "--port", "0"])
    check(r.returncode != 0 and "no such directory" in r.stderr, "dashboard rejects a missing directory")
    # Under mpirun every rank would open a dashboard: refused before training starts.
    r = subprocess.run(train_args(os.path.join(tmp, "data"), os.path.join(tmp, "config.json"), os.path.join(tmp, "mpi"),
                                  2, ["--dashboard", "--port", "0"]),
                       capture_output=True, text=True, env={**os.environ, "OMPI_COMM_WORLD_SIZE": "2"})
    check(r.returncode != 0 and "--dashboard under mpirun/srun is not supported" in r.stderr,
          f"--dashboard under mpirun is refused ({r.stderr.strip()[-200:]})")


def main():
    tmp = tempfile.mkdtemp(prefix="astrai_dashboard_test_")
    try:
        data, cfg = tiny_seq_setup(MAKE, tmp)
        for phase in (lambda: live_dashboard(tmp, data, cfg), lambda: sigterm_while_training(tmp, data, cfg),
                      lambda: plot_checks(tmp, os.path.join(tmp, "live"))):
            t0 = time.time()
            phase()
            print(f"({time.time() - t0:.1f} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
