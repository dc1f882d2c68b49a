"""The ``jaxgrpo`` command line: outputs, clear errors, nothing overwritten, progress,
and runs that stop cleanly on Ctrl-C."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from grpospec import CountingConfig
from grpospec.outdir import LOCK, OutputFolderError, claim_output_dir
from jaxgrpo.cli import main


def cli(capsys, *args) -> tuple[int, str]:
    """Run ``jaxgrpo ARGS`` in this process: (exit code, stdout + stderr)."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out + out.err


def test_counting_writes_metrics_summary_and_plot(tmp_path, impl, capsys):
    out = tmp_path / "run"
    code, text = cli(capsys, "counting", "--impl", impl.name, "--seeds", "2", "--steps", "3",
                     "--out", out)
    assert code == 0, text
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2 * 3 and {r["seed"] for r in rows} == {"0", "1"}
    assert {r["step"] for r in rows} == {"0", "1", "2"}
    assert set(rows[0]) == {"impl", "seed", "step", *CountingConfig().metric_names}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["impl"] == impl.name and summary["config"]["steps"] == 3
    assert summary["steps_done"] == 3 and not summary["interrupted"]
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean_reward" in text


def test_existing_output_folder_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, text = cli(capsys, "counting", "--seeds", "2", "--steps", "2", "--out", out)
    assert code == 2
    assert "refusing to overwrite" in text
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == [LOCK, "notes.txt"] or sorted(
        p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args, message", [
    (["counting", "--impl", "tf"], "--impl"),
    (["counting", "--agg", "mean"], "--agg"),
    (["counting", "--clip-eps", "1.5"], "--clip-eps must lie in (0, 1)"),
    (["counting", "--learning-rate", "-0.1"], "--learning-rate must be > 0, got -0.1"),
    (["counting", "--estimator", "ppo"], "--estimator"),
    (["counting", "--mesh", "3x5"], "XLA_FLAGS=--xla_force_host_platform_device_count=15"),
    (["experiment", "nope"], "NAME must be one of"),
])
def test_bad_options_get_a_clear_message(tmp_path, args, message, capsys):
    code, text = cli(capsys, *args, "--out", tmp_path / "x")
    assert code == 2
    assert message in " ".join(text.split()), text
    assert "Traceback" not in text
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("where", ["under-a-file", "unwritable"])
def test_an_unusable_output_folder_is_one_line(tmp_path, where, capsys):
    if where == "under-a-file":
        (tmp_path / "README.md").write_text("a file")
        out = tmp_path / "README.md" / "sub"
    else:
        if os.geteuid() == 0:
            pytest.skip("root can write anywhere")
        (tmp_path / "ro").mkdir(mode=0o500)
        out = tmp_path / "ro" / "run"
    code, text = cli(capsys, "counting", "--seeds", "2", "--steps", "2", "--out", out)
    assert code == 2 and "--out" in text and "Traceback" not in text
    assert len(text.strip().splitlines()) <= 2, text


def test_default_run_folders_are_unique_even_in_the_same_second(tmp_path):
    a = claim_output_dir(None, "counting", root=tmp_path)
    b = claim_output_dir(None, "counting", root=tmp_path)
    assert a.path != b.path and a.path.name in b.path.name  # b has a -2 suffix
    # the same folder named twice at once: the second is refused, not shared
    first = claim_output_dir(tmp_path / "same", "counting")
    with pytest.raises(OutputFolderError, match="in use by another run"):
        claim_output_dir(tmp_path / "same", "counting")
    first.release()
    # a failed start leaves nothing behind
    c = claim_output_dir(tmp_path / "fresh", "counting")
    c.release_if_unused()
    assert not (tmp_path / "fresh").exists()


def _jaxgrpo(*args, cwd, **kw):
    return subprocess.Popen([sys.executable, "-m", "jaxgrpo.cli", *map(str, args)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_two_runs_started_at_once_write_two_folders(tmp_path):
    procs = [_jaxgrpo("counting", "--seeds", "2", "--steps", "2", cwd=tmp_path)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2
    for folder in folders:
        assert (folder / "metrics.csv").is_file() and (folder / "summary.json").is_file()


CTRL_C_AFTER_200_STEPS = """
import os, signal, sys
from jaxgrpo.cli import main
from jaxgrpo.counting import progress_listener

def press_ctrl_c(done):  # what a user's Ctrl-C does, once 200 steps are reported
    if done >= 200:
        os.kill(os.getpid(), signal.SIGINT)

with progress_listener(press_ctrl_c):
    main(sys.argv[1:])
"""


def test_ctrl_c_stops_at_a_chunk_boundary_and_writes_what_finished(tmp_path):
    """SIGINT (as Ctrl-C sends) once the run is 200 steps in: exit code 130, and the
    folder holds the finished chunks' metrics: a whole number of chunks, fewer than all."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_AFTER_200_STEPS, "counting", "--seeds",
                           "2", "--steps", "3000", "--chunk-steps", "100", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and 200 <= summary["steps_done"] < 3000
    assert summary["steps_done"] % 100 == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2 * summary["steps_done"]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_compiled_program_reports_progress_and_chunks_change_nothing():
    """Progress comes from inside the compiled program (one report per step here, all
    seeds at once), and a run in chunks equals the run in one piece."""
    from jaxgrpo.runs import run_seeds

    cfg = CountingConfig(steps=12)
    seen: list[int] = []
    chunked = run_seeds("jax", cfg, [3, 4], seen.append, chunk_steps=5)
    assert sum(seen) == 12 and chunked.steps_done == 12 and not chunked.interrupted
    whole = run_seeds("jax", cfg, [3, 4], chunk_steps=12)
    for k in cfg.metric_names:
        np.testing.assert_allclose(chunked.metrics[k], whole.metrics[k], rtol=1e-5, atol=1e-6,
                                   err_msg=k)


def test_an_interrupted_jax_run_keeps_its_finished_chunks(monkeypatch):
    import jaxgrpo.runs as runs

    cfg = CountingConfig(steps=10)
    program = runs.compile_jax_seeds(cfg, [0, 1], chunk_steps=3)
    calls = [0]

    def interrupted_chunk(runner, start):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return program.chunk(runner, start)

    fake = runs.CompiledRun(program.init, interrupted_chunk, program.last, 3, program.keys)
    metrics, interrupted = runs.run_jax(fake, cfg)
    assert interrupted and metrics["mean_reward"].shape == (2, 6)


def test_experiment_writes_a_figure_and_a_table(tmp_path, capsys):
    out = tmp_path / "exp"
    code, text = cli(capsys, "experiment", "zero-signal", "--seeds", "2", "--out", out)
    assert code == 0, text
    table = (out / "zero-signal.md").read_text()
    assert "| no dynamic sampling |" in table and "| dynamic sampling x4 |" in table
    assert (out / "zero-signal.png").read_bytes()[:4] == b"\x89PNG"


def test_help_fits_80_columns_without_cutting_names_or_defaults():
    env = {**os.environ, "COLUMNS": "80"}
    text = subprocess.run([sys.executable, "-m", "jaxgrpo.cli", "counting", "--help"],
                          capture_output=True, text=True, env=env, check=True).stdout
    assert "--completion-length" in text and "--importance-level" in text
    assert "..." not in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80


LM_ARGS = ["--steps", "3", "--pretrain-steps", "5", "--n-prompts", "4", "--group-size", "4"]


def test_lm_writes_metrics_summary_and_plot(tmp_path, impl, capsys):
    out = tmp_path / "lm"
    code, text = cli(capsys, "lm", "--impl", impl.name, "--seeds", "2", *LM_ARGS,
                     "--task", "near", "--out", out)
    assert code == 0, text
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2 * 3 and {r["seed"] for r in rows} == {"0", "1"}
    assert "clip_ratio/high_mean" in rows[0] and "ds_filled" not in rows[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["impl"] == impl.name and summary["config"]["task"] == "near"
    assert summary["config"]["pretrain_steps"] == 5 and summary["steps_done"] == 3
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean_reward" in text and "tiny Qwen2" in text


def test_lm_options_are_every_field_of_the_config():
    """The CLI is derived from ``LMConfig``: one option per field, with its help line."""
    import dataclasses

    from grpospec.lm import LMConfig

    env = {**os.environ, "COLUMNS": "200"}
    text = subprocess.run([sys.executable, "-m", "jaxgrpo.cli", "lm", "--help"],
                          capture_output=True, text=True, env=env, check=True).stdout
    flat = " ".join(text.split())
    for f in dataclasses.fields(LMConfig):
        assert re.search(rf"--{f.name.replace('_', '-')}[ ,]", flat), f.name
    assert "clip-higher upper range" in flat


@pytest.mark.parametrize("args, message", [
    (["lm", "--impl", "tf"], "--impl"),
    (["lm", "--task", "sum"], "--task must be one of ('arithmetic', 'near')"),
    (["lm", "--digits", "7"], "--digits must be at most 4"),
    (["lm", "--num-kv-heads", "3"], "--num-heads (4) must be a multiple of num_kv_heads (3)"),
    (["lm", "--completion-length", "2"], "--completion-length must leave room for the answer"),
    (["lm", "--base-accuracy", "0.6", "--base-near", "0.6"],
     "--base-accuracy + base_near must be at most 1"),
    (["lm", "--mesh", "3x1"], "needs 3 devices"),
    (["lm", "--loss-mode", "ppo"], "--loss-mode must be one of ('vanilla', 'cispo', 'sapo'"),
    (["lm", "--overlong-buffer", "9"], "--overlong-buffer must be <= the maximum length (8)"),
    (["lm", "--estimator", "rloo", "--scale-rewards", "batch"],
     "--scale-rewards applies to estimator 'grpo' or 'dr_grpo'"),
    (["experiment", "lm-nope"], "NAME must be one of"),
])
def test_bad_lm_options_get_a_clear_message(tmp_path, args, message, capsys):
    code, text = cli(capsys, *args, "--out", tmp_path / "x")
    assert code == 2, text
    assert message in " ".join(text.split()), text
    assert "Traceback" not in text
    assert not (tmp_path / "x").exists()
