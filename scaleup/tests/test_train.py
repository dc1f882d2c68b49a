"""The loop on the tiny model: resume, output folders, learning, evaluation, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from scaleup.checkpoint import CheckpointError, latest_checkpoint
from scaleup.cli import main
from scaleup.evaluate import evaluate_run, paired_bootstrap
from scaleup.tasks import DigitTask
from scaleup.tests.conftest import small_cfg
from scaleup.train import OutputDirError, read_log, train

TIMING = ("step_time_s", "sample_tokens_per_s", "peak_mem_gb")


def _cfg(tiny_dir, out, **kw):
    return small_cfg(model=str(tiny_dir), output_dir=str(out), task="digit", **kw)


def _adapter(out):
    return load_file(str(latest_checkpoint(out) / "adapter_model.safetensors"))


def _strip(log):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in log]


def test_resume_equals_no_interruption(tiny_dir, tmp_path):
    kw = dict(steps=4, save_every=2, inner_epochs=2, prompts_per_step=4, max_new_tokens=4)
    straight = train(_cfg(tiny_dir, tmp_path / "a", **kw), show_progress=False)
    # interrupted after 3 steps: the checkpoint holds 2, the log 3
    train(_cfg(tiny_dir, tmp_path / "b", **kw), stop_after=3, show_progress=False)
    assert len(read_log(tmp_path / "b" / "log.jsonl")) == 3
    assert latest_checkpoint(tmp_path / "b").name == "step_000002"
    resumed = train(_cfg(tiny_dir, tmp_path / "b"), resume=True, show_progress=False)
    assert _strip(resumed["log"]) == _strip(straight["log"])
    assert [r["step"] for r in resumed["log"]] == [0, 1, 2, 3]
    a, b = _adapter(tmp_path / "a"), _adapter(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(r["trained_rows"] and r["grad_norm"] > 0 for r in straight["log"])


def test_output_folder_is_never_silently_overwritten(tiny_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(OutputDirError, match="already exists"):
        train(_cfg(tiny_dir, out), show_progress=False)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(_cfg(tiny_dir, out), resume=True, show_progress=False)
    assert (out / "precious.txt").read_text() == "keep me"


def test_grpo_learns_the_digit_task(tiny_dir, tmp_path):
    """The loop demonstrably learns: 'start your reply with a digit' from about 10/272."""
    cfg = _cfg(tiny_dir, tmp_path / "learn", steps=30, prompts_per_step=8, group_size=8,
               max_new_tokens=2, micro_batch_size=64, lora_r=16, lora_alpha=32,
               save_every=30, seed=0)
    log = train(cfg, show_progress=False)["log"]
    rewards = np.array([r["mean_reward"] for r in log])
    p0 = _start_digit_probability(tiny_dir)  # the expected reward before training
    assert p0 < 0.1
    assert rewards[-10:].mean() > p0 + 0.3
    assert rewards[-10:].mean() > rewards[:2].mean() + 0.25


def _start_digit_probability(tiny_dir) -> float:
    """P(first token is a digit) under the untrained model, from its plain forward."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": DigitTask().sample(1, 0, 0)[0]
                                       .prompt}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0, -1].double(), -1)
    digits = [tok.convert_tokens_to_ids(d) for d in "0123456789"]
    return float(probs[digits].sum())


def test_paired_bootstrap_against_closed_forms():
    a = np.array([1, 0, 1, 1, 0, 1.])
    assert paired_bootstrap(a, a - 0.25, n_boot=200) == (0.25, 0.25, 0.25)  # constant diff
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 2000), rng.integers(0, 2, 2000)
    diff, lo, hi = paired_bootstrap(a, b, n_boot=4000, seed=1)
    d = a - b
    half = 1.96 * d.std() / np.sqrt(d.size)  # normal approximation
    assert diff == pytest.approx(d.mean())
    assert lo == pytest.approx(d.mean() - half, abs=0.01)
    assert hi == pytest.approx(d.mean() + half, abs=0.01)
    with pytest.raises(ValueError, match="same non-zero length"):
        paired_bootstrap(a, b[:3])


def test_evaluate_run_after_learning(tiny_dir, tmp_path, monkeypatch):
    import scaleup.evaluate

    seen = []

    def spy(a, b, *args):  # the interval is resampled with the run's seed
        seen.append(args)
        return paired_bootstrap(a, b, *args)

    monkeypatch.setattr(scaleup.evaluate, "paired_bootstrap", spy)
    out = tmp_path / "ev"
    cfg = _cfg(tiny_dir, out, steps=25, prompts_per_step=8, group_size=8, max_new_tokens=2,
               micro_batch_size=64, lora_r=16, lora_alpha=32, save_every=25, seed=3)
    train(cfg, show_progress=False)
    r = evaluate_run(out, n_problems=30, batch_size=30, n_samples=30, n_boot=500)
    assert r["n_problems"] == 30 and seen == [(500, 3)]
    assert r["accuracy_final"] - r["accuracy_start"] == pytest.approx(r["difference"])
    assert r["ci95"][0] <= r["difference"] <= r["ci95"][1]
    samples = [json.loads(x) for x in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert [s["model"] for s in samples] == ["final"] * 30 + ["start"] * 30
    for s in samples:
        assert s["truncated"] == ("truncated" in s["flags"])
    record = json.loads((out / "eval.json").read_text())
    assert record["ci95"] == r["ci95"]
    assert set(record) == {"checkpoint", "n_problems", "rollout", "accuracy_final",
                           "accuracy_start", "difference", "ci95", "held_out", "flags_final",
                           "flags_start"}
    # every problem's record is in the samples: the interval is the paired bootstrap of
    # them; the flag counts are theirs
    a, b = ([s["correct"] for s in samples if s["model"] == m] for m in ("final", "start"))
    assert r["ci95"] == list(paired_bootstrap(np.array(a), np.array(b), 500, 3)[1:])
    for m in ("final", "start"):
        flags = [f for s in samples if s["model"] == m for f in s["flags"]]
        assert record[f"flags_{m}"] == {f: flags.count(f) for f in set(flags)}


def cli(capsys, *args) -> tuple[int, str]:
    """Run ``grpo-scaleup ARGS`` in this process: (exit code, stdout + stderr)."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out + out.err


def test_cli_train_then_refuse_then_resume_then_eval(tiny_dir, tmp_path, capsys):
    out = str(tmp_path / "cli")
    common = ["--model", str(tiny_dir), "--output-dir", out, "--task", "digit", "--steps", "2",
              "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3",
              "--device", "cpu", "--save-every", "1", "--lora-r", "2"]
    code, text = cli(capsys, "train", *common)
    assert code == 0, text
    assert len(read_log(tmp_path / "cli" / "log.jsonl")) == 2
    code, text = cli(capsys, "train", *common)
    assert code == 2 and "already exists" in text and "Traceback" not in text
    code, text = cli(capsys, "train", "--output-dir", out, "--resume")
    assert code == 0, text
    code, text = cli(capsys, "eval", "--output-dir", out, "--n-problems", "3", "--n-boot", "50")
    assert code == 0 and "accuracy final" in text, text


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/folder"], "no such folder"),
    (["--agg", "mean"], "--agg"),
    (["--inner-epochs", "3"], "--inner-epochs must be one of"),
    (["--clip-eps", "1.5"], "--clip-eps must be a number in (0, 1)"),
    (["--learning-rate", "-0.1"], "--learning-rate must be a number in (0, inf]"),
    (["--task", "gsm8k"], "needs --data"),
    (["--group-size", "0"], "--group-size must be an int >= 1"),
    (["--estimator", "gae"], "--estimator must be one of"),
    (["--dual-clip", "0.5"], "--dual-clip must be a number in (1, inf]"),
    (["--loss-mode", "gpg", "--dual-clip", "2"], "--dual-clip needs loss_mode 'vanilla'"),
])
def test_cli_bad_options_get_clear_messages(tiny_dir, tmp_path, args, message, capsys):
    base = ["train", "--model", str(tiny_dir), "--output-dir", str(tmp_path / "x")]
    code, text = cli(capsys, *base, *args)
    assert code == 2 and message in text.replace("\n", " "), text
    assert "Traceback" not in text


def test_cli_malformed_data_line_names_file_and_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "q", "answer": "#### 2"}\n{"question": "q"}\n')
    code, text = cli(capsys, "train", "--model", str(tiny_dir), "--output-dir", str(tmp_path / "y"),
                      "--task", "gsm8k", "--data", str(data))
    flat = text.replace("\n", "")
    assert code == 2 and "line 2" in flat and "gsm.jsonl" in flat, text
    assert not (tmp_path / "y").exists()


def test_cli_model_folder_without_config(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, text = cli(capsys, "train", "--model", str(tmp_path / "empty"), "--output-dir",
                      str(tmp_path / "z"))
    assert code == 2 and "no config.json" in text.replace("\n", " "), text


def test_default_hub_model_offline_fails_fast_in_one_line(tmp_path, capsys, monkeypatch):
    """No network (HF_HUB_OFFLINE set, model not cached): one clear line at once, not a
    minute of retries, and no empty run folder left behind."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    out = tmp_path / "run"
    code, text = cli(capsys, "train", "--output-dir", out, "--steps", "1")
    assert code == 2 and "not in the local cache" in text and "Traceback" not in text
    assert not out.exists()


def test_scaleup_help_fits_80_columns_without_cutting_names_or_defaults():
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}
    text = subprocess.run([sys.executable, "-m", "scaleup.cli", "train", "--help"],
                          capture_output=True, text=True, env=env, check=True).stdout
    assert "Qwen/Qwen2.5-0.5B-Instruct" in text and "--gradient-checkpointing" in text
    assert "..." not in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
