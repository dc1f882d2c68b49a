"""Torch CPU threads for the scale-up, on an idle and on a busy machine, side by side.

Each case trains the tiny Qwen2 (built in code) for ``--steps`` GRPO steps with
``grpo-scaleup train`` in a fresh process, and reports the mean step time from its
``log.jsonl`` (start-up and model loading excluded). "Busy" runs the same with one
other process spinning on a core meanwhile, as a laptop or a shared CI runner often has.
The cases: ``--threads 1`` (the default on CPU), ``--threads N`` for N = the number of
cores (torch's own default), and the same with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP
threads sleep instead of spinning while they wait for each other).

    .venv/bin/python benchmarks/bench_threads.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SPIN = "while True:\n    pass\n"


def step_time(model: Path, out: Path, threads: int, steps: int, env_extra: dict) -> float:
    """Mean seconds per step of a ``grpo-scaleup train`` run on the tiny model."""
    cmd = [sys.executable, "-m", "scaleup.cli", "train", "--model", str(model),
           "--device", "cpu", "--task", "digit", "--steps", str(steps), "--prompts-per-step",
           "8", "--group-size", "8", "--max-new-tokens", "8", "--micro-batch-size", "32",
           "--learning-rate", "1e-2", "--save-every", str(steps), "--threads", str(threads),
           "--output-dir", str(out)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    env.update(env_extra)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in log[1:]]  # step 0 warms up
    return sum(times) / len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per case")
    args = parser.parse_args()
    import torch

    from scaleup.tiny import save_tiny

    cores = os.cpu_count() or 1
    cases = [("--threads 1 (the CPU default)", 1, {}),
             (f"--threads {cores} (torch's default)", cores, {}),
             (f"--threads {cores}, OMP_WAIT_POLICY=PASSIVE", cores,
              {"OMP_WAIT_POLICY": "PASSIVE"})]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny(Path(tmp) / "tiny", seed=0)
        for busy in (False, True):
            spinner = (subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None)
            try:
                time.sleep(0.5)
                for i, (name, threads, extra) in enumerate(cases):
                    out = Path(tmp) / f"run-{int(busy)}-{i}"
                    results[(name, busy)] = step_time(model, out, threads, args.steps, extra)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    print(f"machine: {platform.platform()}, {cores} cores; torch {torch.__version__}; tiny "
          f"Qwen2, 8 prompts x 8 completions, 8 new tokens, {args.steps} steps per case")
    print()
    print("| threads | idle: s/step | busy (1 core taken): s/step | busy / idle |")
    print("|---|---:|---:|---:|")
    for name, _, _ in cases:
        idle, busy = results[(name, False)], results[(name, True)]
        print(f"| {name} | {idle:.3f} | {busy:.3f} | {busy / idle:.1f}x |")
    base = results[(cases[0][0], True)]
    worst = max(results[(name, True)] for name, _, _ in cases)
    print(f"\non the busy machine the slowest setting takes {worst / base:.1f}x the time of "
          "--threads 1")


if __name__ == "__main__":
    main()
