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
