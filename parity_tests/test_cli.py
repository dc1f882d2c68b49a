"""The ``jaxgrpo`` command line: outputs, clear errors, nothing overwritten."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from jaxgrpo.cli import app

runner = CliRunner()


def test_counting_writes_metrics_summary_and_plot(tmp_path, impl):
    out = tmp_path / "run"
    result = runner.invoke(app, ["counting", "--impl", impl.name, "--seeds", "2", "--steps", "3",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2 * 3 and {r["seed"] for r in rows} == {"0", "1"}
    assert {r["step"] for r in rows} == {"0", "1", "2"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["impl"] == impl.name and summary["config"]["steps"] == 3
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean_reward" in result.output


def test_existing_output_folder_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["counting", "--seeds", "2", "--steps", "2", "--out", str(out)])
    assert result.exit_code == 2
    assert "refusing to overwrite" in result.output
    assert (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


@pytest.mark.parametrize("args, message", [
    (["counting", "--impl", "tf"], "--impl must be one of jax, torch"),
    (["counting", "--agg", "mean"], "agg must be one of"),
    (["counting", "--clip-eps", "1.5"], "clip_eps must lie in (0, 1)"),
    (["counting", "--estimator", "ppo"], "estimator must be one of"),
    (["experiment", "nope"], "NAME must be one of"),
])
def test_bad_options_get_a_clear_message(tmp_path, args, message):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_experiment_writes_a_figure_and_a_table(tmp_path):
    out = tmp_path / "exp"
    result = runner.invoke(app, ["experiment", "zero-signal", "--seeds", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = (out / "zero-signal.md").read_text()
    assert "| no dynamic sampling |" in table and "| dynamic sampling x4 |" in table
    assert (out / "zero-signal.png").read_bytes()[:4] == b"\x89PNG"


LM_ARGS = ["--steps", "3", "--pretrain-steps", "5", "--n-prompts", "4", "--group-size", "4"]


def test_lm_writes_metrics_summary_and_plot(tmp_path, impl):
    out = tmp_path / "lm"
    result = runner.invoke(app, ["lm", "--impl", impl.name, "--seeds", "2", *LM_ARGS,
                                 "--task", "near", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 2 * 3 and {r["seed"] for r in rows} == {"0", "1"}
    assert "clip_ratio/high_mean" in rows[0] and "ds_filled" not in rows[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["impl"] == impl.name and summary["config"]["task"] == "near"
    assert summary["config"]["pretrain_steps"] == 5
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean_reward" in result.output and "tiny Qwen2" in result.output


def test_lm_options_are_every_field_of_the_config():
    """The CLI is derived from ``LMConfig``: one option per field, with its help line."""
    import dataclasses

    import typer

    from grpospec.lm import LMConfig

    command = typer.main.get_command(app).commands["lm"]
    options = {p.name: p for p in command.params}
    for f in dataclasses.fields(LMConfig):
        assert f.name in options, f.name
        assert options[f.name].help, f.name  # a help line from LMConfig's docstring
        assert options[f.name].default == f.default, f.name
    assert "clip-higher upper range" in options["clip_eps_high"].help
    result = runner.invoke(app, ["lm", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--completion-length" in result.output


@pytest.mark.parametrize("args, message", [
    (["lm", "--impl", "tf"], "--impl must be one of jax, torch"),
    (["lm", "--task", "sum"], "task must be one of ('arithmetic', 'near')"),
    (["lm", "--digits", "7"], "digits must be at most 4"),
    (["lm", "--num-kv-heads", "3"], "num_heads (4) must be a multiple of num_kv_heads (3)"),
    (["lm", "--completion-length", "2"], "completion_length must leave room for the answer"),
    (["lm", "--base-accuracy", "0.6", "--base-near", "0.6"],
     "base_accuracy + base_near must be at most 1"),
    (["lm", "--mesh", "3x1"], "needs 3 devices"),
    (["experiment", "lm-nope"], "NAME must be one of"),
])
def test_bad_lm_options_get_a_clear_message(tmp_path, args, message):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "x")], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()
