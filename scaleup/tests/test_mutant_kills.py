"""Tests the scale-up's mutation run showed missing (README, "Mutation testing"): each
pins a value or a call by hand where a mutant of ``scaleup.step`` / ``scaleup.evaluate``
survived the rest of the suite."""

from __future__ import annotations

import contextlib
import json
import math
import re
import resource
import time

import numpy as np
import pytest
import torch

import scaleup.step as step_module
from scaleup.evaluate import evaluate_run, held_out_problems, paired_bootstrap, run_model
from scaleup.rollout import Rollouts, chat_prompts, sample_rollouts
from scaleup.step import grpo_step, step_advantages
from scaleup.tasks import EVAL_SHARE, ArithmeticTask, Problem, TaskError
from scaleup.tests.conftest import ParityTask, small_cfg
from scaleup.train import make_optimizer, task_of

CPU = torch.device("cpu")


class RecordingSampler:
    """A stand-in for ``VllmSampler`` (``--rollout vllm``) that samples with ``generate``
    and records how the trainer calls it, and what it returned."""

    def __init__(self, model):
        self.model, self.calls, self.rollouts = model, [], []

    def wake_up(self):
        self.calls.append("wake_up")

    def sync(self, model):
        self.calls.append(("sync", model is self.model))

    def sleep(self):
        self.calls.append("sleep")

    def sample(self, tokenizer, problems, group_size, max_new_tokens, stop_ids, device,
               seed=None, step=None, greedy=False, adapter=True):
        self.calls.append(("sample", len(problems), group_size, max_new_tokens,
                           list(stop_ids), device, seed, step, greedy, adapter))
        roll = sample_rollouts(self.model, tokenizer, problems, group_size, max_new_tokens,
                               stop_ids, device, greedy=greedy)
        self.rollouts.append(roll)
        return roll


def test_grpo_step_calls_its_sampler_with_seed_and_step_and_counts_lengths_by_hand(
        policy, tokenizer, monkeypatch):
    """The sampler is woken, given the policy, asked for the step's problems with the
    run's seed and the step number, put to sleep; the step's length metrics are the mean
    response lengths of the completions the task scored right and wrong, the reward and
    truncation shares those of the rollouts it returned."""
    model, stops = policy
    cfg = small_cfg(prompts_per_step=3, seed=5)
    sampler = RecordingSampler(model)
    task = ParityTask()
    torch.manual_seed(0)
    opt = make_optimizer(model, cfg)
    devices, reduce = [], step_module.all_reduce
    monkeypatch.setattr(step_module, "all_reduce", lambda values, op="sum", device=None: (
        devices.append(device), reduce(values, op, device))[1])
    t0 = time.perf_counter()
    m = grpo_step(model, tokenizer, opt, task, 3, cfg, stops, CPU, sampler=sampler)
    assert 0 < m["step_time_s"] <= time.perf_counter() - t0  # the step's own wall time
    assert devices and set(devices) == {CPU}  # every reduction on the step's device
    assert sampler.calls == [
        "wake_up", ("sync", True),
        ("sample", 3, cfg.group_size, cfg.max_new_tokens, list(stops), CPU, 5, 3, False, True),
        "sleep"]
    (roll,) = sampler.rollouts
    scores = [task.score(t, p) for t, p in zip(roll.texts, roll.problems, strict=True)]
    lengths = roll.response_mask.sum(1).tolist()
    right = [n for n, s in zip(lengths, scores, strict=True) if s]
    wrong = [n for n, s in zip(lengths, scores, strict=True) if not s]
    assert right and wrong, "both kinds of completion occur"
    assert m["len_correct"] == pytest.approx(sum(right) / len(right))
    assert m["len_incorrect"] == pytest.approx(sum(wrong) / len(wrong))
    assert m["mean_reward"] == pytest.approx(len(right) / len(scores))
    assert m["truncated_frac"] == pytest.approx(float(roll.truncated.float().mean()))


def test_run_model_with_a_sampler_decodes_greedily_with_the_options_given(tokenizer):
    """``eval --rollout vllm``: every batch goes to the sampler with the evaluation's
    token budget, stop tokens and device, greedy, with or without the adapter; records
    keep each completion's text, score and truncation."""

    class Scripted:
        def __init__(self):
            self.calls = []

        def sample(self, tok, chunk, group_size, max_new_tokens, stop_ids, device, *,
                   greedy, adapter):
            self.calls.append((len(chunk), group_size, max_new_tokens, stop_ids, device,
                               greedy, adapter))
            n = len(chunk)
            return Rollouts(*(torch.zeros(n, 1),) * 4, torch.tensor([i % 2 == 1 for i in
                                                                     range(n)]),
                            [p.answer for p in chunk], list(chunk), 0.0)

    problems = [Problem(f"q{i}", str(i)) for i in range(5)]
    sampler = Scripted()
    task = ArithmeticTask()
    records = run_model(None, tokenizer, task, problems, 11, 2, [7, 9], CPU, adapter=False,
                        sampler=sampler)
    assert sampler.calls == [(2, 1, 11, [7, 9], CPU, True, False)] * 2 + [
        (1, 1, 11, [7, 9], CPU, True, False)]
    assert [r["completion"] for r in records] == [p.answer for p in problems]
    assert [r["truncated"] for r in records] == [False, True, False, True, False]
    assert [r["correct"] for r in records] == [task.score(p.answer, p) for p in problems]


def test_paired_bootstrap_default_is_ten_thousand_resamples():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)  # continuous: every resample counts
    assert paired_bootstrap(a, b) == paired_bootstrap(a, b, n_boot=10_000)
    assert paired_bootstrap(a, b) != paired_bootstrap(a, b, n_boot=10_001)


def test_batch_scaled_advantages_by_hand_with_a_large_eps():
    """``scale_rewards="batch"``: (r - group mean) / (std of the batch + eps), population
    std; eps = 0.5 makes a sign or factor mistake on eps visible."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    std = math.sqrt(5 / 8 * 3 / 8)
    want = torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / (std + 0.5)
    cfg = small_cfg(estimator="dr_grpo", scale_rewards="batch")
    torch.testing.assert_close(step_advantages(r, cfg, eps=0.5), want)
    rpp = step_advantages(r, small_cfg(estimator="reinforce_pp"), eps=0.5)
    torch.testing.assert_close(rpp, (r - 5 / 8) / (std + 0.5))


def test_arithmetic_held_out_record_counts_every_training_problem():
    """The record ``eval.json`` keeps: every problem of every training step regenerated
    (steps differ, so more than one step's worth) and none in the evaluation set."""
    cfg = small_cfg(steps=6, prompts_per_step=5, seed=3)
    problems, record = held_out_problems(cfg, 40)
    task = task_of(cfg)
    assert isinstance(task, ArithmeticTask)
    trained = {p.prompt for step in range(6) for p in task.sample(5, 3, step)}
    assert len(trained) > 5
    assert record == {
        "rule": f"reserved split: blake2b('a op b') % {EVAL_SHARE} == 0, never drawn for "
                "training", "share": 1 / EVAL_SHARE,
        "training_problems_checked": len(trained), "overlapping_problems": 0}
    assert len(problems) == 40 and not {p.prompt for p in problems} & trained


def test_gsm8k_held_out_problems_honour_allow_overlap(tmp_path):
    def gsm(path, questions):
        path.write_text("".join(json.dumps({"question": q, "answer": "x\n#### 1"}) + "\n"
                                for q in questions))
        return str(path)

    train = gsm(tmp_path / "train.jsonl", ["How many apples?", "How many pears?"])
    mixed = gsm(tmp_path / "mixed.jsonl", ["How many apples?", "How many figs?"])
    cfg = small_cfg(task="gsm8k", data=train, eval_data=mixed)
    with pytest.raises(Exception, match="1 of its 2 questions are also in the training"):
        held_out_problems(cfg, 10)
    problems, record = held_out_problems(
        small_cfg(task="gsm8k", data=train, eval_data=mixed, allow_overlap=True), 10)
    assert len(problems) == 2
    assert record["overlapping_questions"] == 1 and record["allow_overlap"] is True


def test_eval_of_a_gsm8k_run_honours_eval_data_and_the_default_n_boot(tiny_dir, tmp_path,
                                                                    monkeypatch):
    """``grpo-scaleup eval --eval-data`` replaces the GSM8K run's own evaluation file (the
    set, its length and the held-out record are the new file's), and the interval uses
    the documented 10,000 resamples when ``n_boot`` is not given."""
    import scaleup.evaluate
    from scaleup.train import train

    def gsm(path, questions):
        path.write_text("".join(json.dumps({"question": q, "answer": "x\n#### 1"}) + "\n"
                                for q in questions))
        return str(path)

    seen = []

    def spy(a, b, *args):
        seen.append(args)
        return paired_bootstrap(a, b, *args)

    monkeypatch.setattr(scaleup.evaluate, "paired_bootstrap", spy)
    data = gsm(tmp_path / "train.jsonl", ["How many apples?", "How many pears?"])
    own = gsm(tmp_path / "own.jsonl", ["How many figs?"])
    other = gsm(tmp_path / "other.jsonl", ["How many plums?", "How many kiwis?", "Cats?"])
    out = tmp_path / "run"
    train(small_cfg(model=str(tiny_dir), output_dir=str(out), task="gsm8k", data=data,
                    eval_data=own, steps=1, save_every=1, max_new_tokens=2, seed=5),
          show_progress=False)
    r = evaluate_run(out, n_problems=10, batch_size=4, n_samples=1, max_new_tokens=2,
                     eval_data=other)
    assert r["n_problems"] == 3 and r["held_out"]["eval_data"] == other
    assert seen == [(10_000, 5)]
    assert json.loads((out / "eval.json").read_text())["held_out"]["eval_data"] == other
    assert evaluate_run(out, n_problems=10, batch_size=4, n_samples=1, max_new_tokens=2,
                        n_boot=20)["n_problems"] == 1  # without the override: the run's
    # --allow-overlap as an override: evaluating on the training file is refused by
    # default and done, and recorded, when allowed
    with pytest.raises(TaskError, match="is the training file"):
        evaluate_run(out, n_problems=10, batch_size=4, n_samples=1, max_new_tokens=2,
                     n_boot=20, eval_data=data)
    r = evaluate_run(out, n_problems=10, batch_size=4, n_samples=1, max_new_tokens=2,
                     n_boot=20, eval_data=data, allow_overlap=True)
    assert r["n_problems"] == 2 and r["held_out"]["allow_overlap"] is True


@pytest.mark.parametrize("level", [0.95, 0.5])
def test_paired_bootstrap_interval_is_the_percentiles_of_resampled_pair_means(level):
    """The percentile bootstrap by its definition: resample the n pairs with replacement
    (numpy's ``default_rng(seed).integers(0, n, (n_boot, n))``), take each resample's mean
    difference, and report the (1 - level)/2 and (1 + level)/2 quantiles of those means."""
    g = np.random.default_rng(0)  # continuous scores: no two resample means tie, so a
    a, b = g.normal(size=30), g.normal(size=30)  # quantile a little off is another value
    d = a - b
    draws = np.random.default_rng(3).integers(0, 30, (500, 30))
    means = d[draws].mean(axis=1)
    want = (d.mean(), *np.quantile(means, [(1 - level) / 2, (1 + level) / 2]))
    assert paired_bootstrap(a, b, 500, 3, level) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("with_sampler", [True, False])
def test_loss_backward_statistics_with_a_sampler_by_hand(policy, with_sampler):
    """``--rollout vllm``'s batch: ``logp_sampler`` and ``--tis-cap`` enter the loss (the
    accumulated loss equals one ``grpo_loss`` over the whole batch with them), and the
    mismatch statistics are the mean and max of ``|logp_new - logp_sampler|`` over every
    valid token of the batch, across micro-batches; without a sampler they are NaN, as
    the KL without a reference. The clip statistics are those of the whole batch, dual
    clip included."""
    from scaleup.logprobs import completion_logprobs
    from scaleup.step import CLIP_KEYS, MISMATCH_KEYS, batch_logprobs, loss_backward
    from scaleup.tests.test_step import _random_batch
    from torchref import clip_metrics, grpo_loss

    model, _ = policy
    gen = torch.Generator().manual_seed(0)  # not the global RNG: other tests move it
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    batch = _random_batch(seed=4)
    batch.adv = -batch.adv.abs()  # negative advantages: the dual clip can bind
    cfg = small_cfg(micro_batch_size=4, beta=0.0, dual_clip=1.5,
                    tis_cap=1.2 if with_sampler else None)
    gen = torch.Generator().manual_seed(3)
    lp0, _ = batch_logprobs(model, batch, 6, 3)
    batch.logp_old = lp0 - 0.8 * (2 * torch.rand(lp0.shape, generator=gen) - 1)  # e^+-0.8
    batch.logp_ref = None
    if with_sampler:
        batch.logp_sampler = batch.logp_old + 0.5 * torch.randn(lp0.shape, generator=gen)
    model.zero_grad()
    stats = loss_backward(model, batch, cfg)
    lp, _ = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                batch.completion_ids, batch.mask, chunk=100)
    lp = lp.detach()
    full = grpo_loss(lp, batch.logp_old, batch.logp_old, batch.adv, batch.mask, **{
        **cfg.loss_options(), "logp_sampler": batch.logp_sampler})
    assert stats["loss"] == pytest.approx(float(full), abs=1e-6)
    clip = clip_metrics(lp, batch.logp_old, batch.adv, batch.mask, cfg.clip_eps,
                        cfg.clip_eps_high, cfg.importance_level, cfg.dual_clip)
    for key in CLIP_KEYS:
        assert stats[key] == pytest.approx(float(clip[key]), abs=1e-6), key
    assert stats["clip_ratio/low_mean"] > 0
    assert math.isnan(stats["kl"]) and "KL" not in stats
    valid = batch.mask != 0
    if with_sampler:
        gap = (lp - batch.logp_sampler)[valid].abs()
        assert stats[MISMATCH_KEYS[0]] == pytest.approx(float(gap.mean()), rel=1e-5)
        assert stats[MISMATCH_KEYS[1]] == pytest.approx(float(gap.max()), rel=1e-5)
        # the capped weights act: the same loss without the sampler differs
        plain = grpo_loss(lp, batch.logp_old, batch.logp_old, batch.adv, batch.mask,
                          **{**cfg.loss_options(), "tis_cap": None})
        assert abs(float(plain) - float(full)) > 1e-4
    else:
        assert all(math.isnan(stats[k]) for k in MISMATCH_KEYS)
    # the health check's max |log ratio| of this epoch, over every micro-batch
    ratio = (lp - batch.logp_old)[valid].abs()
    assert stats["max_abs_log_ratio"] == pytest.approx(float(ratio.max()), rel=1e-5)


def test_rank_device_by_hand(monkeypatch):
    """Each rank's device: an explicit ``cpu``/``cuda:N`` is kept; ``cuda``, and ``auto``
    with a GPU, mean ``cuda:LOCAL_RANK`` (0 when unset); ``auto`` without one is ``cpu``."""
    from scaleup.distributed import _rank_device

    monkeypatch.setenv("LOCAL_RANK", "3")
    assert [_rank_device(d) for d in ("cpu", "cuda:1", "cuda")] == ["cpu", "cuda:1", "cuda:3"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _rank_device("auto") == "cuda:3"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _rank_device("auto") == "cpu"
    monkeypatch.delenv("LOCAL_RANK")
    assert _rank_device("cuda") == "cuda:0"


def test_init_distributed_picks_nccl_for_a_gpu_rank_and_gloo_for_a_cpu_rank(monkeypatch):
    """Under torchrun (WORLD_SIZE > 1): a GPU rank selects its GPU, then joins with NCCL;
    a CPU rank joins with gloo; either way this call created the group (the process group
    calls are recorded, not made: no GPU and no second process here)."""
    import torch.distributed as dist

    from scaleup.distributed import DistSetup, init_distributed

    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(str(d)))
    assert init_distributed("cuda") == DistSetup("cuda:1", created=True)
    assert calls == ["cuda:1", "nccl"]
    calls.clear()
    assert init_distributed("cpu") == DistSetup("cpu", created=True)
    assert calls == ["gloo"]


def test_init_distributed_joins_a_running_group_without_owning_it(tmp_path):
    """A process group that already runs (started by the caller) is joined, not created:
    ``finish_distributed`` then leaves it to its owner."""
    import torch.distributed as dist

    from scaleup.distributed import (
        DistSetup,
        finish_distributed,
        init_distributed,
        is_distributed,
        rank,
        world_size,
    )

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        setup = init_distributed("cpu")
        assert setup == DistSetup("cpu", created=False)
        assert not is_distributed() and world_size() == 1 and rank() == 0  # one process
        finish_distributed(setup)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_wrap_ddp_gives_a_gpu_rank_its_device_and_a_cpu_rank_none(monkeypatch):
    """With K > 1 the policy's forward is wrapped in DDP, ``device_ids`` being the rank's
    GPU (``cuda:N`` -> [N]) and ``None`` on a CPU (DDP's own rule); without a process
    group nothing is wrapped. DDP is recorded, not built: no GPU and no group here."""
    import scaleup.distributed as D

    assert D.wrap_ddp(torch.nn.Linear(2, 2), torch.device("cpu")) is None
    made = []
    monkeypatch.setattr(D, "is_distributed", lambda: True)
    monkeypatch.setattr(D, "DistributedDataParallel", lambda module, device_ids: made.append(
        (type(module), module.policy, device_ids)))
    policy = torch.nn.Linear(2, 2)
    for device in ("cuda:1", "cpu"):
        D.wrap_ddp(policy, torch.device(device))
    assert made == [(D.LogprobModule, policy, [1]), (D.LogprobModule, policy, None)]


def test_zero_weight_row_is_row_0_with_an_all_zero_mask():
    """A rank left without rows trains on one placeholder row: row 0 of the batch, every
    token masked out (loss weight 0), flagged as a placeholder; the batch is unchanged."""
    from scaleup.step import zero_weight_row
    from scaleup.tests.test_step import _random_batch

    batch = _random_batch()
    row = zero_weight_row(batch)
    assert row.placeholder and not batch.placeholder
    assert torch.equal(row.completion_ids, batch.completion_ids[:1])
    assert torch.equal(row.adv, batch.adv[:1]) and torch.equal(row.prompt_ids,
                                                                batch.prompt_ids[:1])
    assert row.mask.shape == batch.mask[:1].shape and not row.mask.any()
    assert batch.mask.any()


# ---------------------------------------------------------------- scaleup.tasks' parsing
def test_normalize_number_strips_a_trailing_full_stop_and_nothing_else():
    from fractions import Fraction

    from scaleup.tasks import normalize_number

    assert normalize_number("3/4.") == Fraction(3, 4)  # the full stop of a sentence
    assert normalize_number(" 12. ") == 12
    assert normalize_number("12X") is None  # only "." is stripped, not other letters


def test_parse_gsm8k_answer_writes_integers_plainly_and_other_values_as_fractions():
    from scaleup.tasks import parse_gsm8k_answer

    assert parse_gsm8k_answer("so 7 / 2\n#### 3.5") == "7/2"  # denominator 2: a fraction
    assert parse_gsm8k_answer("#### 1,200") == "1200"
    assert parse_gsm8k_answer("#### 12.0") == "12"


def test_dataset_task_scores_with_its_fallback_setting():
    from scaleup.tasks import DatasetTask

    problem = Problem("What is 5 + 7?", "12")
    unboxed = "5 + 7 makes 12"
    assert DatasetTask((problem,), fallback_last_number=True).score(unboxed, problem) == 1
    assert DatasetTask((problem,)).score(unboxed, problem) == 0
    assert DatasetTask((problem,)).score("\\boxed{12}", problem) == 1


def test_load_gsm8k_reads_utf8_whatever_the_locale(tmp_path):
    """GSM8K has non-ASCII text (e.g. "€"); the file is read as UTF-8 even where the
    locale's encoding is ASCII (a C locale without Python's UTF-8 mode)."""
    import os
    import subprocess
    import sys

    from scaleup.tasks import load_gsm8k

    question = "A café sells tea at €3. Two cost?"
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"question": question, "answer": "3 * 2 = 6\n#### 6"},
                               ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_gsm8k(path)[0].prompt.startswith(question)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = ("import locale, sys; from scaleup.tasks import load_gsm8k; "
            "print(locale.getpreferredencoding(False)); "
            "print(load_gsm8k(sys.argv[1])[0].prompt)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env,
                         capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert out.returncode == 0, out.stderr
    encoding, prompt = out.stdout.splitlines()
    assert encoding.lower() in ("ansi_x3.4-1968", "ascii", "us-ascii")  # the test's premise
    assert prompt.startswith(question)


def test_eval_rollout_vllm_override_decodes_with_the_sampler_given_the_checkpoint(
        tiny_dir, tmp_path, monkeypatch):
    """``grpo-scaleup eval --rollout vllm`` on a run trained with ``hf``: the override is
    recorded, the sampler is made from the run's config with the evaluation's token
    budget, given the model with the checkpoint's adapter loaded, asked for every batch
    greedily (with the adapter, then without: the starting model), and closed. A
    recording stand-in (``generate`` underneath) replaces the vLLM engine, which runs
    in the vLLM venv's ``test_vllm.py``."""
    import scaleup.train
    from scaleup.train import train

    made = []

    class Closing(RecordingSampler):
        def close(self):
            self.calls.append("close")

    def make(cfg, model, tokenizer, device):
        made.append((cfg.rollout, cfg.max_new_tokens, device))
        made.append(Closing(model))
        return made[-1]

    out = tmp_path / "run"
    train(small_cfg(model=str(tiny_dir), output_dir=str(out), steps=1, save_every=1,
                    max_new_tokens=2, seed=5), show_progress=False)
    monkeypatch.setattr(scaleup.train, "make_sampler", make)
    r = evaluate_run(out, n_problems=3, batch_size=2, n_samples=1, max_new_tokens=3,
                     n_boot=20, rollout="vllm")
    (rollout, max_new, device), sampler = made
    assert (rollout, max_new, device, r["rollout"]) == ("vllm", 3, CPU, "vllm")
    assert sampler.calls[0] == ("sync", True)
    samples = [c for c in sampler.calls if c[0] == "sample"]
    assert [(c[1], c[2], c[3], c[8], c[9]) for c in samples] == [
        (2, 1, 3, True, True), (1, 1, 3, True, True), (2, 1, 3, True, False),
        (1, 1, 3, True, False)]
    assert sampler.calls[-1] == "close" and len(sampler.calls) == 6
    assert json.loads((out / "eval.json").read_text())["rollout"] == "vllm"
    assert evaluate_run(out, n_problems=3, batch_size=2, n_samples=1, max_new_tokens=3,
                        n_boot=20)["rollout"] == "hf"  # without the override: the run's
    assert len(made) == 2
    with pytest.raises(ValueError, match="rollout"):  # the override is checked
        evaluate_run(out, n_problems=3, batch_size=2, n_samples=1, rollout="vlm")


def test_greedy_rollouts_do_not_depend_on_the_rng(policy, tokenizer):
    """``greedy=True`` (evaluation) decodes the argmax: the same completions whatever the
    torch seed, while sampling (the default) draws different ones."""
    model, stops = policy
    problems = [Problem("1+2=", "3"), Problem("4+4=", "8")]
    outs = {}
    for greedy in (True, False):
        for seed in (0, 1):
            torch.manual_seed(seed)
            roll = sample_rollouts(model, tokenizer, problems, 2, 6, stops,
                                   torch.device("cpu"), greedy=greedy)
            outs[greedy, seed] = roll.completion_ids
    assert torch.equal(outs[True, 0], outs[True, 1])
    assert not torch.equal(outs[False, 0], outs[False, 1])


def test_trim_drops_exactly_the_all_padding_columns_by_hand():
    """Leading prompt columns that are padding in every row (2 here) and completion
    columns after every row's end (the last 2) go; a column padded in one row stays."""
    from scaleup.logprobs import trim

    prompt_mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    prompt_ids = torch.arange(10).view(2, 5)
    completion_mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    completion_ids = torch.arange(10, 20).view(2, 5)
    p_ids, p_mask, c_ids, c_mask = trim(prompt_ids, prompt_mask, completion_ids,
                                        completion_mask)
    assert torch.equal(p_ids, prompt_ids[:, 2:]) and torch.equal(p_mask, prompt_mask[:, 2:])
    assert torch.equal(c_ids, completion_ids[:, :3])
    assert torch.equal(c_mask, completion_mask[:, :3])


def test_peak_memory_on_a_cpu_is_the_process_rss_in_gb():
    """``ru_maxrss`` is in KiB on Linux: this test process holds between 10 MB and the
    machine's RAM."""
    import os

    from scaleup.step import peak_memory_gb

    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    assert 0.01 < peak_memory_gb(torch.device("cpu")) < ram_gb


def test_rng_snapshot_of_a_gpu_includes_its_cuda_state(monkeypatch):
    """On a CUDA device the snapshot holds that device's generator state too (recorded
    here, not taken: no GPU needed), and restoring it sets it back on that device."""
    from scaleup.step import rng_restore, rng_snapshot

    calls = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: calls.append(("get", d)) or "S")
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: calls.append(("set", s, d)))
    gpu = torch.device("cuda", 1)
    snap = rng_snapshot(gpu)
    assert snap[1] == "S" and torch.equal(snap[0], torch.get_rng_state())
    rng_restore(snap, gpu)
    assert calls == [("get", gpu), ("set", "S", gpu)]
    assert rng_snapshot(torch.device("cpu"))[1] is None


def test_arithmetic_task_messages_name_min_digits_and_low_operands_include_0():
    """``min_digits`` is named in its message; with 1-digit operands allowed the space
    starts at 0: 10 x 10 problems per operator for digits = 1, 90 x 90 from 10 for
    min_digits = 2."""
    with pytest.raises(ValueError) as e:
        ArithmeticTask(min_digits=0)
    assert str(e.value) == "min_digits must be an int >= 1, got 0"
    assert ArithmeticTask(digits=1, operators="+").space() == 100
    assert ArithmeticTask(digits=2, min_digits=2, operators="+").space() == 90 ** 2


def test_digit_task_prompt_word_for_word():
    from scaleup.tasks import DigitTask

    assert DigitTask().sample(3, seed=0, step=0) == [
        Problem("Start your reply with a digit.", "")] * 3


def test_loss_normaliser_counts_every_row_and_token_by_default():
    """Without a process group and by default (not a placeholder): the batch's own valid
    tokens for ``agg="token"``, its rows for ``"seq"``."""
    from scaleup.step import loss_normaliser

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert loss_normaliser(mask, "token") == 3.0
    assert loss_normaliser(mask, "seq") == 2.0
    assert loss_normaliser(mask, "seq", placeholder=True) == 1.0  # max(0 rows, 1)


def test_arithmetic_space_and_whole_eval_split_by_hand():
    """The space counts every operator: 10 x 10 x 3 problems for one digit and ``+-*``.
    Asked for more problems than the split has, ``eval_problems`` returns the whole split
    and nothing else: for 2-digit operands only, every held-out ``a + b`` with a, b in
    10..99 (no 1-digit operand)."""
    from scaleup.tasks import held_out

    assert ArithmeticTask(digits=1).space() == 300
    task = ArithmeticTask(digits=2, min_digits=2, operators="+")
    split = {f"What is {a} + {b}?" for a in range(10, 100) for b in range(10, 100)
             if held_out(a, "+", b)}
    got = {p.prompt.split("?")[0] + "?" for p in task.eval_problems(2 * len(split), seed=0)}
    assert got == split and len(split) > 500


def test_make_task_passes_the_operators_on():
    from scaleup.tasks import make_task

    assert make_task("arithmetic", digits=1, operators="-").operators == "-"


def test_paired_bootstrap_refuses_2d_scores():
    with pytest.raises(ValueError) as e:
        paired_bootstrap(np.ones((2, 2)), np.ones((2, 2)))
    assert str(e.value) == ("a and b must be 1-D of the same non-zero length, got shapes "
                            "(2, 2) and (2, 2)")


def test_sampling_config_is_the_policy_itself_field_by_field():
    """Every warper at its no-op value and the pad id passed on (the same policy whose
    log-probs enter the ratio); greedy decoding for evaluation."""
    from scaleup.rollout import sampling_config

    cfg = sampling_config(7, [5, 6], 3)
    assert cfg.do_sample and cfg.pad_token_id == 3 and cfg.eos_token_id == [5, 6]
    assert cfg.max_new_tokens == 7 and cfg.min_new_tokens == 0
    assert cfg.use_cache is True  # the KV cache (transformers' own default is None)
    noop = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0,
                no_repeat_ngram_size=0, num_beams=1)
    assert {k: getattr(cfg, k) for k in noop} == noop
    greedy = sampling_config(7, [5], 3, greedy=True)
    assert not greedy.do_sample and greedy.pad_token_id == 3


def test_completion_logprobs_computes_no_entropy_by_default(policy):
    from scaleup.logprobs import completion_logprobs

    model, _ = policy
    ids, mask = torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long)
    lp, ent = completion_logprobs(model, ids, mask, ids, mask)
    assert ent is None and lp.shape == (1, 3)


# --- the 2026-12-03 ledger sample (mutation.sample 0.05 <all 15 modules> --seed 33) ---


class _Stop(Exception):
    pass


class RecordingModel:
    """Wraps a model: records what ``generate`` is given, then runs it (or, with
    ``stop``, raises ``_Stop`` instead: for inputs on a device nothing can run on)."""

    def __init__(self, model, stop=False):
        self.model, self.stop, self.seen = model, stop, []

    @property
    def training(self):
        return self.model.training

    def eval(self):
        self.model.eval()

    def train(self, mode=True):
        self.model.train(mode)

    def generate(self, **kw):
        self.seen.append(kw)
        if self.stop:
            raise _Stop
        return self.model.generate(**kw)


def test_sample_rollouts_gives_generate_the_padding_mask_on_the_device(policy, tokenizer):
    """Prompts of different lengths are left-padded; ``generate`` gets the tokenizer's
    mask (0 on the pads, repeated per sample: it cannot always infer it, e.g. when the pad
    token is a stop token) and both tensors on the device asked for ("meta" here: a
    device the CPU tensors are not on)."""
    model, stops = policy
    problems = [Problem("What is 1 + 1?", "2"),
                Problem("What is 12345 * 678 - 91011 + 1213 * 1415 + 1617?", "0")]
    rec = RecordingModel(model)
    roll = sample_rollouts(rec, tokenizer, problems, 2, 2, stops, CPU, greedy=True)
    (kw,) = rec.seen
    enc = tokenizer(chat_prompts(tokenizer, problems), return_tensors="pt", padding=True,
                    padding_side="left", add_special_tokens=False)
    assert (enc["attention_mask"] == 0).any(), "the test's premise: one prompt is padded"
    torch.testing.assert_close(kw["attention_mask"],
                               enc["attention_mask"].repeat_interleave(2, 0))
    torch.testing.assert_close(kw["input_ids"], enc["input_ids"].repeat_interleave(2, 0))
    assert roll.prompt_mask.equal(kw["attention_mask"])
    # generate pads finished rows with the tokenizer's pad token (not its eos fallback)
    assert kw["generation_config"].pad_token_id == tokenizer.pad_token_id is not None
    meta = RecordingModel(model, stop=True)
    with pytest.raises(_Stop):
        sample_rollouts(meta, tokenizer, problems, 2, 2, stops, torch.device("meta"))
    (kw,) = meta.seen
    assert kw["input_ids"].device.type == kw["attention_mask"].device.type == "meta"


def test_the_reductions_are_made_on_the_data_device(monkeypatch):
    """Every all-reduce of the reward statistics and of the loss's statistics is given
    the device of the tensors reduced (NCCL reduces only tensors on the GPU): recorded
    by a stand-in that sums nothing (one process), with ``world_size`` 2 so the
    statistics are reduced."""
    import scaleup.step as step
    from scaleup.step import global_reward_stats

    devices = []

    def recording(values, op="sum", device=None):
        devices.append(device)
        return [float(v) for v in values]

    monkeypatch.setattr(step, "all_reduce", recording)
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0])
    mean, std, equal = global_reward_stats(rewards)
    assert (mean, std, equal) == (0.75, pytest.approx(0.75 ** 0.5 * 0.25 ** 0.5), False)
    assert devices == [CPU, CPU, CPU]
    devices.clear()
    monkeypatch.setattr(step, "world_size", lambda: 2)
    sums = step.loss_backward(torch.nn.Linear(1, 1), _stub_forward_batch(step, monkeypatch),
                              small_cfg())
    assert devices and all(d == CPU for d in devices), devices
    assert math.isnan(sums["kl"])  # no logp_ref: the KL is not measured


def _stub_forward_batch(step, monkeypatch):
    """A 2-row batch (3 tokens each, advantages +-1) and, in place of the model's
    forward, log-probs from a linear layer and an entropy of 1 everywhere: for
    ``loss_backward`` tests where only its own arithmetic matters."""
    def logprobs(model_, mb, chunk, with_entropy, forward=None, entropy_grad=False):
        x = model_(torch.ones(len(mb), mb.mask.shape[1], 1)).squeeze(-1) - 2.0
        return x, torch.ones_like(x)

    monkeypatch.setattr(step, "_mb_logprobs", logprobs)
    z = torch.zeros(2, 3, dtype=torch.long)
    return step.Batch(z, torch.ones_like(z), z, torch.ones(2, 3), torch.tensor([1.0, -1.0]))


def test_peak_memory_on_the_cpu_is_the_peak_rss_in_kibibytes(monkeypatch):
    """Linux reports ``ru_maxrss`` in KiB: the peak in GB is ``maxrss * 1024 / 1e9``:
    1,500,000 KiB is 1.536 GB exactly; a real reading lies between readings just before
    and after (the peak only grows). (The bracket alone killed a divisor of 1e9 + 1 only
    while the process's peak held still between the readings: not in a fresh fork.)"""
    from types import SimpleNamespace

    from scaleup.step import peak_memory_gb

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gb = peak_memory_gb(CPU)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert before * 1024 / 1e9 <= gb <= after * 1024 / 1e9
    asked = []
    monkeypatch.setattr(step_module, "resource", SimpleNamespace(
        RUSAGE_SELF=resource.RUSAGE_SELF, RUSAGE_CHILDREN=resource.RUSAGE_CHILDREN,
        getrusage=lambda who: asked.append(who) or SimpleNamespace(ru_maxrss=1_500_000)))
    assert peak_memory_gb(CPU) == 1.536 and asked == [resource.RUSAGE_SELF]


def test_arithmetic_operands_span_their_digit_ranges_exactly():
    """An n-digit operand is drawn from 10^(n-1) .. 10^n - 1 (0 .. 9 for one digit):
    over 600 problems of 3-digit operands the smallest is below 110 and >= 100 (a lower
    bound of 11^2 = 121 would never give it), the largest 999 or just below."""
    task = ArithmeticTask(digits=3, min_digits=3, operators="+")
    ops = _operands(task.sample(600, 0, 0))
    assert 100 <= min(ops) < 110 and 990 <= max(ops) <= 999
    ops = _operands(ArithmeticTask(digits=1, operators="+").sample(300, 0, 0))
    assert min(ops) == 0 and max(ops) == 9


def _operands(problems) -> list[int]:
    return [int(x) for p in problems for x in re.findall(r"\d+", p.prompt.split("?")[0])]


def test_arithmetic_sample_draws_stream_0_by_default():
    task = ArithmeticTask()
    assert task.sample(5, 3, 2) == task.sample(5, 3, 2, stream=0)
    assert task.sample(5, 3, 2) != task.sample(5, 3, 2, stream=1)


def test_the_digit_task_records_why_nothing_is_held_out():
    problems, record = held_out_problems(small_cfg(task="digit"), 3)
    assert record == {"rule": "none: the digit task has one prompt"}
    assert len(problems) == 3


def test_eval_device_overrides_the_runs(tiny_dir, tmp_path, monkeypatch):
    """``grpo-scaleup eval --device D`` loads the policy on D, not on the run's device:
    recorded by a stand-in for ``load_policy`` (the run was trained with device cpu)."""
    import scaleup.evaluate as ev
    from scaleup.train import train

    out = tmp_path / "run"
    train(small_cfg(model=str(tiny_dir), output_dir=str(out), steps=1, save_every=1,
                    max_new_tokens=2), show_progress=False)
    seen = []

    def recording(cfg):
        seen.append(cfg.device)
        raise _Stop

    monkeypatch.setattr(ev, "load_policy", recording)
    for device in (None, "auto"):
        with pytest.raises(_Stop):
            evaluate_run(out, n_problems=2, batch_size=2, n_samples=1, device=device)
    assert seen == ["cpu", "auto"]


# --- the second ledger sample of 2026-12-03 (seed 34) ---


def test_position_ids_count_real_tokens_from_0_by_hand():
    """Left padding: positions start at 0 on the first real token (pads clamped to 0)."""
    from scaleup.logprobs import position_ids

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_batch_from_rollouts_carries_the_samplers_logprobs():
    """``--rollout vllm``: the sampler's log-probs go into the batch (for TIS and the
    mismatch metrics), as do the other fields; masked by the response mask as given."""
    from scaleup.step import Batch

    ids = torch.tensor([[5, 6], [7, 8]])
    lp = torch.tensor([[-0.5, -1.0], [-2.0, 0.0]])
    r = Rollouts(ids, torch.ones_like(ids), ids, torch.tensor([[1, 1], [1, 0]]),
                 torch.tensor([False, True]), ["a", "b"], [None, None], 0.1, logp_sampler=lp)
    b = Batch.from_rollouts(r, torch.tensor([1.0, -1.0]))
    assert b.logp_sampler is lp
    assert b.mask.tolist() == [[1, 1], [1, 0]]
    assert Batch.from_rollouts(r, torch.tensor([1.0, -1.0]),
                               mask_truncated=True).mask.tolist() == [[1, 1], [0, 0]]


def test_peak_memory_on_a_gpu_is_the_allocators_peak_in_gb(monkeypatch):
    """On CUDA the peak is ``torch.cuda.max_memory_allocated`` in GB (a stand-in for the
    allocator: no GPU here)."""
    from scaleup.step import peak_memory_gb

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3_000_000_000)
    assert peak_memory_gb(torch.device("cuda", 0)) == 3.0


def test_finish_distributed_waits_for_every_rank_by_default(tmp_path, monkeypatch):
    """After a normal end (the default) the ranks meet at a barrier before the group is
    destroyed; after an error (``ok=False``) they do not (recorded, in a real 1-process
    gloo group this call created)."""
    import torch.distributed as dist

    from scaleup.distributed import DistSetup, finish_distributed

    barriers = []
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(1))
    for i, (kwargs, expect) in enumerate((({}, [1]), ({"ok": False}, []))):
        barriers.clear()
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'store{i}'}",
                                rank=0, world_size=1)
        finish_distributed(DistSetup("cpu", created=True), **kwargs)
        assert not dist.is_initialized() and barriers == expect


def test_on_main_then_share_reraises_the_main_ranks_exception(monkeypatch):
    """Rank 0's exception is broadcast and raised on every rank, itself (here as rank 0
    of a stand-in 2-process group whose broadcast keeps the box as it is)."""
    import scaleup.distributed as d

    monkeypatch.setattr(d, "is_distributed", lambda: True)
    monkeypatch.setattr(d, "is_main", lambda: True)
    monkeypatch.setattr(d.dist, "broadcast_object_list", lambda box, src: None)

    def refuse():
        raise FileExistsError("output_dir is not empty")

    with pytest.raises(FileExistsError, match="output_dir is not empty"):
        d.on_main_then_share(refuse)
    assert d.on_main_then_share(lambda: 7) == 7


def test_eval_problems_names_n_and_fills_n_from_a_large_space():
    """``n`` is checked by name; a space too large to enumerate (4-digit operands: 3e8
    problems) still gives n distinct held-out problems, by drawing."""
    task = ArithmeticTask(digits=4)
    with pytest.raises(ValueError, match=r"^n must be an int >= 1, got 0$"):
        task.eval_problems(0, 0)
    assert task.space() > 4_000_000
    problems = task.eval_problems(20, 0)
    assert len({p.prompt for p in problems}) == 20


# --- the third ledger sample of 2026-12-03 (seed 35) ---


def test_eval_problems_falls_back_to_the_whole_split(monkeypatch):
    """When the draws keep finding the same problems (a stand-in ``_draw`` that always
    gives one), the rest of the split is enumerated: asked for the split's size, the
    whole split of 2-digit ``a + b`` (a, b in 0..99), each once."""
    from scaleup.tasks import held_out

    task = ArithmeticTask(digits=2, operators="+")
    split = {(a, "+", b) for a in range(100) for b in range(100) if held_out(a, "+", b)}
    first = min(split)
    monkeypatch.setattr(ArithmeticTask, "_draw", lambda self, rng, evaluation: first)
    got = task.eval_problems(len(split), seed=0)
    want = {f"What is {a} + {b}?" for a, _, b in split}
    assert {p.prompt.split("?")[0] + "?" for p in got} == want and len(got) == len(split)


def test_arithmetic_messages_name_digits_and_n():
    with pytest.raises(ValueError, match=r"^digits must be an int >= 1, got 0$"):
        ArithmeticTask(digits=0)
    with pytest.raises(ValueError, match=r"^n must be an int >= 1, got 0$"):
        ArithmeticTask().sample(0, 0, 0)


def test_make_task_gives_gsm8k_the_fallback_option(tmp_path):
    from scaleup.tasks import make_task

    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"})
                    + "\n")
    assert make_task("gsm8k", data_path=str(data), fallback_last_number=True
                     ).fallback_last_number is True
    assert make_task("gsm8k", data_path=str(data)).fallback_last_number is False


def test_answers_match_is_false_when_math_verify_raises(monkeypatch):
    """math-verify's own errors (and timeouts) are no match, never an exception."""
    import scaleup.tasks as tasks

    def broken():
        def parse(*a, **k):
            raise RuntimeError("math-verify failed")
        return parse, parse, object, object

    monkeypatch.setattr(tasks, "_math_verify", broken)
    assert tasks.answers_match("4", "4") is False


def test_run_model_decodes_the_token_budget_given(policy, tokenizer):
    """Evaluation's ``max_new_tokens`` reaches ``generate``."""
    model, stops = policy
    rec = RecordingModel(model)
    problems = [Problem("What is 1 + 1?", "2")]
    run_model(rec, tokenizer, ParityTask(), problems, 3, 1, stops, CPU)
    assert [kw["generation_config"].max_new_tokens for kw in rec.seen] == [3]


def test_the_entropy_bonus_acts_at_coef_1(monkeypatch):
    """``entropy_coef`` 1 adds ``-1 * mean entropy`` to the loss (through a stand-in
    forward whose entropy is 1 everywhere: the loss moves by exactly -1), as 0.5 moves it
    by -0.5."""
    import scaleup.step as step

    batch = _stub_forward_batch(step, monkeypatch)
    loss = {c: step.loss_backward(torch.nn.Linear(1, 1), batch,
                                  small_cfg(entropy_coef=c))["loss"] for c in (0.0, 0.5, 1.0)}
    assert loss[0.5] - loss[0.0] == pytest.approx(-0.5, abs=1e-6)
    assert loss[1.0] - loss[0.0] == pytest.approx(-1.0, abs=1e-6)


def test_tensors_made_for_the_data_go_on_the_datas_device(monkeypatch):
    """Tensors built beside a given one take its device, not the default device: with
    the default device set to "meta", ``truncated_rows`` of CPU ids still works, and
    ``all_gather_cat`` (a stand-in 2-process gather that copies this rank's tensor)
    builds its padded buffer on the CPU."""
    import scaleup.distributed as d
    from scaleup.rollout import truncated_rows

    ids = torch.tensor([[5, 1, 2], [3, 4, 4]])
    with torch.device("meta"):
        assert truncated_rows(ids, [5, 9]).tolist() == [False, True]
    devices = []

    def gather(out, t):
        devices.append(t.device)
        for o in out:
            o.copy_(t)

    monkeypatch.setattr(d, "is_distributed", lambda: True)
    monkeypatch.setattr(d, "world_size", lambda: 2)
    monkeypatch.setattr(d.dist, "all_gather", gather)
    x = torch.tensor([1.0, 2.0])
    with torch.device("meta"):
        out = d.all_gather_cat(x)
    assert devices == [CPU, CPU] and out.device == CPU


# --- the ledger sample of 2026-12-03, seed 36 (10%) ---


class _ConstantTask(ParityTask):
    """ParityTask's problems, every completion scored ``value``."""

    def __init__(self, value):
        self.value = value

    def score(self, completion, problem):
        return self.value


@pytest.mark.parametrize("value", [0, 1])
def test_grpo_step_length_of_a_kind_no_completion_has_is_nan(policy, tokenizer, value):
    """All completions right: the mean length of the wrong ones is nan (there are none),
    that of the right ones the mean response length; all wrong: the other way round."""
    model, stops = policy
    cfg = small_cfg(prompts_per_step=2, seed=1)
    torch.manual_seed(0)
    m = grpo_step(model, tokenizer, make_optimizer(model, cfg), _ConstantTask(value), 0, cfg,
                  stops, CPU)
    assert m["mean_reward"] == value
    present, absent = ("len_correct", "len_incorrect")[::1 if value else -1]
    assert math.isnan(m[absent]) and 1 <= m[present] <= cfg.max_new_tokens


def test_wrap_ddp_gives_a_gpu_rank_without_an_index_the_current_device(monkeypatch):
    """``cuda`` with no index: DDP gets the current CUDA device (recorded, not built)."""
    import scaleup.distributed as D

    made = []
    monkeypatch.setattr(D, "is_distributed", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(D, "DistributedDataParallel",
                        lambda module, device_ids: made.append(device_ids))
    D.wrap_ddp(torch.nn.Linear(2, 2), torch.device("cuda"))
    assert made == [[3]]


def test_extract_answer_drops_the_comma_after_the_last_number():
    """The fallback's last number keeps its thousands separators but not a comma that
    ends it ("12," of "is 12, so"), and not the spaces around it."""
    from scaleup.tasks import extract_answer

    assert extract_answer("so the total is 1,200, I think", True) == "1,200"
    assert extract_answer("the answer is 12,", True) == "12"
    assert extract_answer("the answer is 12,", False) is None


def test_exploit_flags_count_reasoning_outside_the_boxed_answers_only():
    """The boxed answer's own characters are not reasoning: a long boxed number with
    short text around it is flagged; exactly ``min_reasoning_chars`` characters of text
    are enough, one fewer are not."""
    from scaleup.tasks import exploit_flags

    long_box = "\\boxed{" + "1" * 30 + "}"
    assert exploit_flags("so " + long_box, False) == ["no_reasoning"]
    assert exploit_flags("a" * 20 + " " + long_box, False) == []
    assert exploit_flags("a" * 19 + " " + long_box, False) == ["no_reasoning"]
    assert exploit_flags("abcd \\boxed{1}", False, min_reasoning_chars=4) == []


def test_eval_problems_fallback_honours_min_digits(monkeypatch):
    """The enumeration that fills the split when draws repeat starts at the smallest
    operand of ``min_digits`` digits: for 2-digit operands, every held-out ``a + b`` with
    a, b in 10..99 and nothing else (``_draw`` replaced by one that always repeats)."""
    from scaleup.tasks import held_out

    task = ArithmeticTask(digits=2, min_digits=2, operators="+")
    split = {(a, "+", b) for a in range(10, 100) for b in range(10, 100) if held_out(a, "+", b)}
    first = min(split)
    monkeypatch.setattr(ArithmeticTask, "_draw", lambda self, rng, evaluation: first)
    got = task.eval_problems(len(split) + 50, seed=0)
    want = {f"What is {a} + {b}?" for a, _, b in split}
    assert {p.prompt.split("?")[0] + "?" for p in got} == want and len(got) == len(split)


def test_make_task_defaults_are_the_train_configs_and_options_reach_the_task(tmp_path):
    """``make_task``'s defaults are ``TrainConfig``'s (one place for the run's task);
    ``fallback_last_number`` reaches the arithmetic task; gsm8k without data is one line."""
    from scaleup.config import TrainConfig
    from scaleup.tasks import make_task

    cfg = TrainConfig(model="unused")
    task = make_task("arithmetic")
    assert (task.digits, task.operators, task.fallback_last_number) == (
        cfg.digits, cfg.operators, cfg.fallback_last_number) == (2, "+-*", False)
    problem = Problem("What is 5 + 7?", "12")
    assert make_task("arithmetic", fallback_last_number=True).score("5 + 7 is 12", problem) == 1
    assert make_task("arithmetic").score("5 + 7 is 12", problem) == 0
    with pytest.raises(TaskError, match=r"^task 'gsm8k' needs a data file \(--data PATH to "
                                        r"a GSM8K JSONL file\)$"):
        make_task("gsm8k")


def test_answers_match_reads_the_boxed_answer_as_latex_only():
    """What is inside the box is parsed as LaTeX only: ``\\boxed{3 & 4}`` is not the
    answer 4, nor ``\\boxed{= 3}`` the answer 3 (math-verify's default extraction would
    fall back to the last plain expression and match both)."""
    from scaleup.tasks import answers_match

    assert not answers_match("3 & 4", "4")
    assert not answers_match("= 3", "3")
    assert answers_match("3", "3") and answers_match("\\frac{1}{2}", "0.5")


def test_init_distributed_without_torch_distributed_is_one_line(monkeypatch):
    import torch.distributed as dist

    from scaleup.distributed import init_distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"^WORLD_SIZE > 1 but this torch build has no "
                                           r"torch.distributed$"):
        init_distributed("cpu")


def test_update_restores_the_dropout_rng_on_the_steps_device(policy, tokenizer, monkeypatch):
    """The first inner epoch replays the old pass's random stream on the step's device
    (the rank's own GPU in a K-GPU run; recorded here on the CPU)."""
    model, stops = policy
    cfg = small_cfg(prompts_per_step=2, seed=1)
    devices, restore = [], step_module.rng_restore
    monkeypatch.setattr(step_module, "rng_restore", lambda snap, device: (
        devices.append(device), restore(snap, device))[1])
    torch.manual_seed(0)
    grpo_step(model, tokenizer, make_optimizer(model, cfg), ParityTask(), 0, cfg, stops, CPU)
    assert devices == [CPU]


# --- the ledger sample of 2026-12-03, seed 37 (10%) ---


def test_check_divisible_is_one_exact_line():
    from scaleup.config import ConfigError
    from scaleup.distributed import check_divisible

    with pytest.raises(ConfigError, match=r"^prompts_per_step \(--prompts-per-step\) = 3 must "
                       r"be divisible by the number of processes \(2\): each process samples "
                       r"whole groups of an equal share of the prompts$"):
        check_divisible(small_cfg(prompts_per_step=3), 2)
    check_divisible(small_cfg(prompts_per_step=4), 2)


def test_held_out_problems_refuses_an_overlap_in_one_line(monkeypatch):
    """The guard against a future change: were the training draws to give evaluation
    problems (a stand-in ``sample`` here), the run stops naming how many."""
    cfg = small_cfg(steps=1, prompts_per_step=2, seed=0)
    task = task_of(cfg)
    clash = task.eval_problems(3, cfg.seed)[:2]
    monkeypatch.setattr(ArithmeticTask, "sample", lambda self, n, seed, step, stream=0: clash)
    with pytest.raises(RuntimeError, match=r"^2 evaluation problems were also trained on$"):
        held_out_problems(cfg, 3)


def test_digit_task_names_n():
    from scaleup.tasks import DigitTask

    with pytest.raises(ValueError, match=r"^n must be an int >= 1, got 0$"):
        DigitTask().sample(0, 0, 0)


def test_loss_backward_clip_shares_use_clip_eps_high(policy):
    """The step's ``clip_ratio/high_mean`` is the share of positive-advantage tokens whose
    ratio passes ``1 + clip_eps_high`` (0.5 here), not ``1 + clip_eps`` (0.2): the whole
    batch's ``torchref.clip_metrics`` with the high bound, which differs from the
    symmetric one on these ratios (e^+-0.8)."""
    from scaleup.step import batch_logprobs, loss_backward
    from scaleup.tests.test_step import _random_batch
    from torchref import clip_metrics

    model, _ = policy
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    batch = _random_batch(seed=4)
    batch.adv = batch.adv.abs()
    cfg = small_cfg(micro_batch_size=4, beta=0.0, clip_eps=0.2, clip_eps_high=0.5)
    gen = torch.Generator().manual_seed(3)
    lp0, _ = batch_logprobs(model, batch, 6, 3)
    batch.logp_old = lp0 - 0.8 * (2 * torch.rand(lp0.shape, generator=gen) - 1)
    batch.logp_ref = None
    model.zero_grad()
    stats = loss_backward(model, batch, cfg)
    lp = lp0.detach()
    high = clip_metrics(lp, batch.logp_old, batch.adv, batch.mask, 0.2, 0.5)
    symmetric = clip_metrics(lp, batch.logp_old, batch.adv, batch.mask, 0.2, None)
    assert float(high["clip_ratio/high_mean"]) != float(symmetric["clip_ratio/high_mean"])
    assert stats["clip_ratio/high_mean"] == pytest.approx(float(high["clip_ratio/high_mean"]),
                                                          abs=1e-6)


def test_local_count_counts_by_default_and_a_placeholder_as_zero():
    from scaleup.step import local_count

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert (local_count(mask, "token"), local_count(mask, "seq")) == (3.0, 2.0)
    assert local_count(mask, "token", placeholder=True) == 0.0


def test_all_reduce_builds_its_tensor_on_the_device_given(monkeypatch):
    """With a process group the values travel as one float64 tensor on the device asked
    for (NCCL reduces only GPU tensors): the "meta" device, recorded by a stand-in
    reduction (no group here)."""
    import torch.distributed as dist

    import scaleup.distributed as D

    seen = []

    class Recorded(Exception):
        pass

    def recording(t, op=None):
        seen.append((t.device.type, t.dtype, tuple(t.shape)))
        raise Recorded

    monkeypatch.setattr(D, "is_distributed", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", recording)
    with pytest.raises(Recorded):
        D.all_reduce([1, 2.5], device="meta")
    assert seen == [("meta", torch.float64, (2,))]


# --- the ledger sample of 2026-12-03, seed 38 (2%) ---


def test_held_out_is_the_documented_hash_rule():
    """The split must not move between versions (a later ``eval`` regenerates it): the
    first 8 bytes of blake2b("a op b"), big-endian, 0 modulo EVAL_SHARE, as documented,
    for every 1- and 2-digit sum; about a tenth of them."""
    import hashlib

    from scaleup.tasks import held_out

    def rule(a, op, b):
        digest = hashlib.blake2b(f"{a} {op} {b}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % EVAL_SHARE == 0

    got = [held_out(a, "+", b) for a in range(100) for b in range(100)]
    assert got == [rule(a, "+", b) for a in range(100) for b in range(100)]
    assert 800 < sum(got) < 1200


def test_global_reward_stats_reduce_the_extremes_by_max(monkeypatch):
    """The max and the negated min travel in one all-reduce by ``max`` (the count, sum
    and squares by ``sum``): recorded by a stand-in that reduces nothing."""
    from scaleup.step import global_reward_stats

    ops = []

    def recording(values, op="sum", device=None):
        ops.append(op)
        return [float(v) for v in values]

    monkeypatch.setattr(step_module, "all_reduce", recording)
    global_reward_stats(torch.tensor([0.0, 1.0, 1.0]))
    assert ops == ["sum", "sum", "max"]


def test_init_distributed_without_torchrun_creates_nothing(monkeypatch):
    """No WORLD_SIZE > 1: the run's own device, and no group was created (so
    ``finish_distributed`` destroys nothing)."""
    from scaleup.distributed import DistSetup, init_distributed

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed("cpu") == DistSetup("cpu", created=False)


# --- the ledger sample of 2026-12-03, seed 39 (15%) ---


@pytest.mark.parametrize("rewards,expected", [([2.0, 2.0], (2.0, 0.0, True)),
                                              ([-1.0, 1.0], (0.0, 1.0, False)),
                                              ([0.0, 0.0, 3.0], (1.0, 2.0**0.5, False))])
def test_global_reward_stats_by_hand(rewards, expected):
    """One process: the mean, population std and whether max == min, by hand (an
    all-equal nonzero group and a group symmetric about 0 tell max == min from
    max == -min)."""
    from scaleup.step import global_reward_stats

    mean, std, equal = global_reward_stats(torch.tensor(rewards))
    assert (float(mean), float(std), bool(equal)) == pytest.approx(expected)


def test_rollouts_time_their_own_sampling(policy, tokenizer):
    model, stops = policy
    t0 = time.perf_counter()
    roll = sample_rollouts(model, tokenizer, [Problem("1+2=", "3")], 2, 4, stops,
                           torch.device("cpu"))
    elapsed = time.perf_counter() - t0
    assert 0 < roll.sample_seconds <= elapsed


def test_run_model_without_a_sampler_decodes_greedily(tokenizer, monkeypatch):
    import scaleup.evaluate as evaluate_module

    calls = []

    def recording(model, tok, chunk, group_size, max_new_tokens, stop_ids, device, **kw):
        calls.append(kw)
        n = len(chunk)
        return Rollouts(*(torch.zeros(n, 1),) * 4, torch.zeros(n, dtype=torch.bool),
                        ["0"] * n, list(chunk), 0.0)

    monkeypatch.setattr(evaluate_module, "sample_rollouts", recording)
    run_model(None, tokenizer, ArithmeticTask(), [Problem("q", "1")] * 3, 5, 2, [7], CPU)
    assert calls == [{"greedy": True}] * 2
    records = run_model(None, tokenizer, ArithmeticTask(), [Problem("q", "1")], 5, 2, [7], CPU)
    assert records == [{"prompt": "q", "answer": "1", "completion": "0", "correct": 0,
                        "truncated": False, "flags": ["no_reasoning"]}]


def test_paired_bootstrap_default_seed_is_0():
    a, b = np.linspace(0.0, 1.0, 20) ** 2, np.zeros(20)
    assert paired_bootstrap(a, b, 200) == paired_bootstrap(a, b, 200, seed=0)
    assert paired_bootstrap(a, b, 200) != paired_bootstrap(a, b, 200, seed=1)


def test_extract_answer_falls_back_to_the_last_number_only_when_asked():
    from scaleup.tasks import extract_answer

    assert extract_answer("so it is 5") is None
    assert extract_answer("so it is 5", fallback_last_number=True) == "5"


def test_digit_task_scores_an_ascii_digit_only():
    from scaleup.tasks import DigitTask

    task, p = DigitTask(), Problem("Start your reply with a digit.", "")
    assert [task.score(t, p) for t in ("7 apples", "X", "XX", "a1", "", " 1")] == [
        1, 0, 0, 0, 0, 0]


def test_make_task_passes_the_digits_on():
    from scaleup.tasks import make_task

    assert make_task("arithmetic", digits=1).digits == 1
    assert make_task("arithmetic", digits=3).digits == 3


def test_three_digit_operands_start_at_100(monkeypatch):
    """min_digits 3: operands 100..999 in the space and in the enumerated split (the
    enumeration reached by a split smaller than asked: draws stubbed to one problem, the
    split cut to operands below 102)."""
    import scaleup.tasks as tasks_module

    task = ArithmeticTask(digits=3, min_digits=3, operators="+")
    assert task.space() == 900**2
    monkeypatch.setattr(tasks_module, "held_out", lambda a, op, b: a < 102 and b < 102)
    monkeypatch.setattr(ArithmeticTask, "_draw", lambda self, rng, evaluation: (100, "+", 100))
    got = {p.prompt.split("?")[0] for p in task.eval_problems(10, seed=0)}
    assert got == {f"What is {a} + {b}" for a in (100, 101) for b in (100, 101)}
    assert len(task.eval_problems(3, seed=0)) == 3  # the drawn one and 2 of the other 3


def test_loss_backward_averages_the_entropy_over_one_valid_token(policy):
    """A batch with a single valid token: its statistics are that token's (the count
    floor of 1 only guards an empty batch)."""
    from scaleup.logprobs import completion_logprobs
    from scaleup.step import loss_backward
    from scaleup.tests.test_step import _random_batch

    model, _ = policy
    batch = _random_batch(seed=4)
    batch.mask = torch.zeros_like(batch.mask)
    batch.mask[2, 0] = 1
    batch.logp_old, batch.logp_ref = None, None
    stats = loss_backward(model, batch, small_cfg(micro_batch_size=4, beta=0.0))
    model.zero_grad()
    _, ent = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                 batch.completion_ids, batch.mask, chunk=100,
                                 with_entropy=True)
    assert stats["entropy"] == pytest.approx(float(ent[2, 0]), rel=1e-5)


def test_update_takes_the_high_entropy_tokens_among_the_valid_ones(policy, tokenizer,
                                                                   monkeypatch):
    """``top_entropy_quantile < 1``: the step asks for the quantile over the batch's
    valid tokens, with the batch's own completion mask (padding excluded: every 5th byte
    ends a completion too, so some end early)."""
    model, stops = policy
    stops = sorted(set(stops) | set(range(0, 256, 5)))
    seen = []
    keep_mask = step_module.entropy_keep_mask

    def recording(entropy, mask, top_quantile):
        seen.append((mask, top_quantile))
        return keep_mask(entropy, mask, top_quantile)

    monkeypatch.setattr(step_module, "entropy_keep_mask", recording)
    batches = []
    loss_backward = step_module.loss_backward
    monkeypatch.setattr(step_module, "loss_backward", lambda model, batch, cfg, ddp=None: (
        batches.append(batch), loss_backward(model, batch, cfg, ddp))[1])
    cfg = small_cfg(prompts_per_step=2, top_entropy_quantile=0.5, inner_epochs=2)
    torch.manual_seed(0)
    grpo_step(model, tokenizer, make_optimizer(model, cfg), ParityTask(), 0, cfg, stops, CPU)
    ((mask, q),) = seen
    assert q == 0.5 and isinstance(mask, torch.Tensor)
    assert torch.equal(mask, batches[0].mask) and not bool((mask != 0).all())


def test_a_placeholder_row_weighs_nothing_and_its_rows_stay_placeholders(policy):
    """``zero_weight_row``: weight 0 in every aggregation (given the normaliser or not),
    and any rows of it are still a placeholder."""
    from scaleup.step import micro_batch_weight, zero_weight_row
    from scaleup.tests.test_step import _random_batch

    row = zero_weight_row(_random_batch(seed=1))
    assert row.placeholder and row.rows(0, 1).placeholder
    assert not _random_batch(seed=1).rows(0, 2).placeholder
    for agg in ("token", "seq", "constant"):
        assert micro_batch_weight(row.mask, row.mask, agg, placeholder=True) == 0.0
        assert micro_batch_weight(row.mask, row.mask, agg, 3.0, placeholder=True) == 0.0


# --- the ledger sample of 2026-12-03, seed 40 (7%) ---


def test_rewards_of_are_float32_scores_in_order():
    from types import SimpleNamespace

    from scaleup.step import rewards_of
    from scaleup.tasks import DigitTask

    p = Problem("Start your reply with a digit.", "")
    r = rewards_of(DigitTask(), SimpleNamespace(texts=["1", "x", "9"], problems=[p] * 3))
    assert r.dtype == torch.float32 and r.tolist() == [1.0, 0.0, 1.0]


def test_answers_match_strips_only_a_trailing_full_stop():
    from scaleup.tasks import answers_match

    assert answers_match("4.", "4") and answers_match("4", "4")
    assert not answers_match("4X", "4") and not answers_match("4XX", "4")


def test_arithmetic_task_refuses_min_digits_above_digits_word_for_word():
    with pytest.raises(TaskError, match=r"^min_digits must be <= digits \(1\), got 2$"):
        ArithmeticTask(digits=1, min_digits=2)


def test_causal_lm_parts_of_a_plain_model_and_of_a_peft_one(policy, tokenizer):
    from scaleup.logprobs import causal_lm_parts
    from scaleup.tiny import tiny_qwen2

    plain = tiny_qwen2(0, tokenizer)
    decoder, head = causal_lm_parts(plain)
    assert decoder is plain.model and head is plain.lm_head
    model, _ = policy
    decoder, head = causal_lm_parts(model)
    assert decoder is model.get_base_model().model


def test_loss_backward_kl_is_the_mean_k3_over_valid_tokens(policy):
    """With a reference, the step's KL statistic is k3 averaged over every valid token of
    the batch, across micro-batches, by hand."""
    from scaleup.logprobs import completion_logprobs
    from scaleup.step import loss_backward
    from scaleup.tests.test_step import _random_batch

    model, _ = policy
    batch = _random_batch(seed=2)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        lp, _ = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                    batch.completion_ids, batch.mask, chunk=100)
    batch.logp_old = None
    batch.logp_ref = lp - 0.5 * torch.rand(lp.shape, generator=gen)
    stats = loss_backward(model, batch, small_cfg(micro_batch_size=4, beta=0.1))
    model.zero_grad()
    valid = batch.mask != 0
    d = (batch.logp_ref - lp)[valid]
    assert valid.sum() > 4
    assert stats["kl"] == pytest.approx(float((d.exp() - d - 1).mean()), rel=1e-4)


def test_grpo_step_masks_truncated_completions_when_asked(policy, tokenizer, monkeypatch):
    """``mask_truncated``: the step builds its batch with the option it was given, also
    the batch of the groups dynamic sampling keeps."""
    from scaleup.step import Batch

    seen = []
    original = Batch.from_rollouts.__func__

    def recording(cls, roll, adv, mask_truncated=False):
        seen.append(mask_truncated)
        return original(cls, roll, adv, mask_truncated)

    monkeypatch.setattr(Batch, "from_rollouts", classmethod(recording))
    model, stops = policy
    for flag in (True, False):
        for ds in (False, True):
            cfg = small_cfg(prompts_per_step=2, mask_truncated=flag, dynamic_sampling=ds)
            torch.manual_seed(0)
            grpo_step(model, tokenizer, make_optimizer(model, cfg), ParityTask(), 0, cfg,
                      stops, CPU)
    assert seen == [True, True, True, False, False, False]


# --- the full run of 2026-12-03 ---


def test_run_model_evaluates_the_starting_model_with_the_adapter_disabled(tokenizer,
                                                                          monkeypatch):
    """``adapter=False`` decodes inside ``model.disable_adapter()`` (the starting model),
    ``adapter=True`` outside it (the checkpoint): a stand-in model records which."""
    import contextlib

    import scaleup.evaluate as evaluate_module

    class Model:
        disabled = False

        @contextlib.contextmanager
        def disable_adapter(self):
            self.disabled = True
            yield
            self.disabled = False

    seen = []

    def recording(model, tok, chunk, group_size, max_new_tokens, stop_ids, device, **kw):
        seen.append(model.disabled)
        n = len(chunk)
        return Rollouts(*(torch.zeros(n, 1),) * 4, torch.zeros(n, dtype=torch.bool),
                        ["0"] * n, list(chunk), 0.0)

    monkeypatch.setattr(evaluate_module, "sample_rollouts", recording)
    problems = [Problem("q", "1")] * 3
    run_model(Model(), tokenizer, ArithmeticTask(), problems, 5, 2, [7], CPU, adapter=False)
    assert seen == [True, True]
    seen.clear()
    run_model(Model(), tokenizer, ArithmeticTask(), problems, 5, 2, [7], CPU, adapter=True)
    assert seen == [False, False]


def test_run_model_refuses_rollouts_of_another_length_than_its_problems(tokenizer,
                                                                         monkeypatch):
    """A decoder that returns fewer completions than problems is an error, not a
    silently shorter evaluation."""
    import scaleup.evaluate as evaluate_module

    def short(model, tok, chunk, group_size, max_new_tokens, stop_ids, device, **kw):
        n = len(chunk)
        return Rollouts(*(torch.zeros(n, 1),) * 4, torch.zeros(n, dtype=torch.bool),
                        ["0"] * (n - 1), list(chunk), 0.0)

    monkeypatch.setattr(evaluate_module, "sample_rollouts", short)
    with pytest.raises(ValueError, match="zip"):
        run_model(None, tokenizer, ArithmeticTask(), [Problem("q", "1")] * 2, 5, 2, [7], CPU)


def test_paired_bootstrap_of_bool_scores_is_that_of_their_floats():
    """The records' ``correct`` values are bools: they are scored as 0/1 (NumPy refuses
    ``bool - bool``)."""
    a = np.array([True, True, False, True, False])
    b = np.array([False, True, False, False, False])
    assert paired_bootstrap(a, b, 300, 2) == paired_bootstrap(a * 1.0, b * 1.0, 300, 2)
    assert paired_bootstrap(a, b, 300, 2)[0] == pytest.approx(0.4)


@pytest.mark.parametrize("show", [True, False])
def test_evaluate_run_progress_bar_counts_both_models_problems(tmp_path, tiny_dir,
                                                               monkeypatch, show):
    """The bar (a recording stand-in for tqdm) is labelled "eval", counts problems,
    totals the problems of both models, is drawn exactly when ``show_progress``, and is
    advanced to its total."""
    import scaleup.evaluate as evaluate_module
    from scaleup.train import train

    bars = []

    class Bar:
        def __init__(self, **kw):
            self.kw, self.n = kw, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, k):
            self.n += k

        @staticmethod
        def write(message):
            pass

    out = tmp_path / "run"
    train(small_cfg(model=str(tiny_dir), output_dir=str(out), steps=1, save_every=1,
                    max_new_tokens=2), show_progress=False)
    monkeypatch.setattr(evaluate_module, "tqdm", Bar)
    r = evaluate_run(out, n_problems=3, batch_size=2, n_samples=1, max_new_tokens=2,
                     n_boot=20, show_progress=show)
    (bar,) = bars
    assert r["n_problems"] == 3
    assert {k: bar.kw[k] for k in ("total", "desc", "unit", "disable")} == {
        "total": 6, "desc": "eval", "unit": "problem", "disable": not show}
    assert bar.n == 6


class _ByPromptTask(ParityTask):
    """Reward 1 for every completion of the first problem, 0 for the second: two groups
    of zero variance, one at the top and one at the bottom of the rewards."""

    def score(self, completion, problem):
        return int(problem.prompt.endswith("-0."))


def test_a_step_whose_groups_all_have_zero_variance_trains_nothing_and_says_so(
        policy, tokenizer):
    """Both groups have zero variance (one all 1, one all 0: each group's max equals ITS
    min, not the batch's): ``frac_reward_zero_std`` is 1, dynamic sampling keeps no row,
    and the loss statistics are nan under the same names as a step that trains."""
    model, stops = policy
    cfg = small_cfg(prompts_per_step=2, dynamic_sampling=True)
    opt = make_optimizer(model, cfg)
    torch.manual_seed(0)
    m = grpo_step(model, tokenizer, opt, _ByPromptTask(), 0, cfg, stops, CPU)
    assert m["frac_reward_zero_std"] == 1.0 and m["mean_reward"] == 0.5
    assert m["trained_rows"] == 0
    trained = grpo_step(model, tokenizer, opt, ParityTask(), 1, small_cfg(), stops, CPU)
    assert trained["trained_rows"] > 0
    assert set(m) == set(trained)
    stats = set(m) - {"step", "mean_reward", "frac_reward_zero_std", "len_correct",
                      "len_incorrect", "truncated_frac", "sample_tokens_per_s",
                      "trained_rows", "step_time_s", "peak_mem_gb"}
    assert {"loss", "entropy", "kl", "grad_norm", "first_epoch_max_abs_log_ratio"} <= stats
    assert all(math.isnan(m[k]) for k in stats), {k: m[k] for k in stats if not math.isnan(m[k])}
    no_clip = small_cfg(max_grad_norm=0.0)
    plain = grpo_step(model, tokenizer, opt, ParityTask(), 2, no_clip, stops, CPU)
    assert "grad_norm" not in plain
    assert set(step_module.update_stat_names(no_clip)) == set(plain) - (set(m) - stats)


def test_grpo_step_moves_the_rewards_to_its_device_and_counts_tokens_per_second(
        policy, tokenizer, monkeypatch):
    """The checker's rewards are moved to the step's device; ``sample_tokens_per_s`` is
    the rollouts' response tokens over their own sampling time (a recording sampler)."""
    model, stops = policy
    cfg = small_cfg(prompts_per_step=2)
    moved = []
    rewards_of = step_module.rewards_of

    class Recorded(torch.Tensor):
        def to(self, *args, **kw):
            moved.append(args or kw)
            return torch.Tensor.to(torch.Tensor(self), *args, **kw)

    monkeypatch.setattr(step_module, "rewards_of",
                        lambda task, roll: rewards_of(task, roll).as_subclass(Recorded))
    sampler = RecordingSampler(model)
    m = grpo_step(model, tokenizer, make_optimizer(model, cfg), ParityTask(), 0, cfg, stops,
                  CPU, sampler=sampler)
    assert moved == [(CPU,)]
    (roll,) = sampler.rollouts
    assert 0 < roll.sample_seconds < 1  # so a floor of 1 s would show
    want = float(roll.response_mask.sum()) / roll.sample_seconds
    assert m["sample_tokens_per_s"] == pytest.approx(want, rel=1e-6)


def test_chat_prompts_are_one_user_turn_with_the_assistant_turn_opened(tokenizer):
    """ChatML (the tiny tokenizer has Qwen2's template), written out by hand."""
    got = chat_prompts(tokenizer, [Problem("What is 2 + 2?", "4")])
    assert got == ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]


def test_response_mask_builds_its_stop_ids_on_the_completions_device(monkeypatch):
    """The stop ids' tensor is built on the completions' device (``torch.isin`` needs
    both on one GPU; recorded by a wrapper of ``torch.tensor``, "meta" here), and the
    mask by hand."""
    import scaleup.rollout as rollout

    made, tensor = [], torch.tensor

    def recording(data, *args, **kw):
        made.append(kw.get("device"))
        return tensor(data, *args, **kw)

    ids = torch.zeros(2, 3, dtype=torch.int64, device="meta")
    monkeypatch.setattr(rollout.torch, "tensor", recording)
    m = rollout.response_mask(ids, [5, 6])
    monkeypatch.undo()
    assert made == [ids.device]
    assert m.device.type == "meta" and m.shape == (2, 3) and m.dtype == torch.float32
    cpu = rollout.response_mask(torch.tensor([[1, 5, 2], [6, 6, 1], [1, 2, 3]]), [5, 6])
    assert cpu.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]


def test_sample_rollouts_stops_generate_at_the_stop_ids_given(policy, tokenizer):
    """The stop ids given (not the model's own eos) are ``generate``'s eos tokens."""
    model, stops = policy
    rec = RecordingModel(model)
    sample_rollouts(rec, tokenizer, [Problem("What is 1 + 1?", "2")], 2, 2, [4, 9], CPU,
                    greedy=True)
    (kw,) = rec.seen
    assert kw["generation_config"].eos_token_id == [4, 9]


def test_check_divisible_defaults_to_the_number_of_processes(monkeypatch):
    import scaleup.distributed as d
    from scaleup.config import ConfigError

    d.check_divisible(small_cfg(prompts_per_step=3))  # one process
    monkeypatch.setattr(d, "world_size", lambda: 2)
    with pytest.raises(ConfigError, match=r"divisible by the number of processes \(2\)"):
        d.check_divisible(small_cfg(prompts_per_step=3))
    d.check_divisible(small_cfg(prompts_per_step=4))


def test_rank_share_names_the_items_and_shares_that_do_not_split():
    from scaleup.distributed import rank_share

    with pytest.raises(ValueError, match=r"^5 items do not split into 2 equal shares$"):
        rank_share(list(range(5)), 2, 0)


def test_step_advantages_pass_their_eps_to_the_group_std():
    """GRPO over one group [0, 1, 0, 1]: population std 0.5, so A = +-0.5 / (0.5 + eps)
    for the eps given."""
    cfg = small_cfg(group_size=4)
    r = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    got = step_advantages(r, cfg, eps=0.1)
    want = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64) * 0.5 / 0.6
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_loss_backward_max_sampler_gap_below_one(policy):
    """The max of ``|logp_new - logp_sampler|`` starts from 0, not from any floor: a
    sampler 0.01 nats off gives a max well below 1, the batch's own."""
    from scaleup.logprobs import completion_logprobs
    from scaleup.step import MISMATCH_KEYS, batch_logprobs, loss_backward
    from scaleup.tests.test_step import _random_batch

    model, _ = policy
    batch = _random_batch(seed=4)
    cfg = small_cfg(micro_batch_size=4, beta=0.0, tis_cap=2.0)
    lp0, _ = batch_logprobs(model, batch, 6, 3)
    batch.logp_old, batch.logp_ref = lp0, None
    gen = torch.Generator().manual_seed(1)
    batch.logp_sampler = lp0 + 0.01 * torch.randn(lp0.shape, generator=gen)
    model.zero_grad()
    stats = loss_backward(model, batch, cfg)
    lp, _ = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                batch.completion_ids, batch.mask, chunk=100)
    gap = (lp.detach() - batch.logp_sampler)[batch.mask != 0].abs()
    assert 0 < float(gap.max()) < 0.1
    assert stats[MISMATCH_KEYS[1]] == pytest.approx(float(gap.max()), rel=1e-4)


# --- the DDP paths in one process (before: judged only by the two-process runs, 8-17 s) ---


class _SpyDDP:
    """A stand-in for ``DistributedDataParallel(LogprobModule(policy))`` in one process:
    the module's own forward (no gradient reduction), recording for each training
    forward whether it ran inside ``no_sync()`` (DDP then skips the all-reduce)."""

    def __init__(self, policy):
        from scaleup.distributed import LogprobModule

        self.module, self.calls, self._no_sync = LogprobModule(policy), [], False

    def __call__(self, *args, **kwargs):
        self.calls.append(self._no_sync)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False


def test_a_step_through_ddp_trains_as_without_it_and_reduces_once_per_optimizer_step(
        policy, tokenizer):
    """Every training forward goes through the DDP module (``LogprobModule``: the same
    log-probs and entropies as the plain call, the entropy bonus's gradient included);
    all but the last micro-batch of each optimizer step run under ``no_sync``, so the
    gradient is all-reduced once per step. In one process DDP's forward is the
    module's: the parameters and metrics equal those of the step without it."""
    import copy

    model, stops = policy
    twin = copy.deepcopy(model)
    cfg = small_cfg(prompts_per_step=2, group_size=4, micro_batch_size=3, inner_epochs=2,
                    entropy_coef=0.05, learning_rate=0.05, seed=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.manual_seed(0)
    plain = grpo_step(model, tokenizer, make_optimizer(model, cfg), ParityTask(), 0, cfg,
                      stops, CPU)
    spy = _SpyDDP(twin)
    torch.manual_seed(0)
    through = grpo_step(twin, tokenizer, make_optimizer(twin, cfg), ParityTask(), 0, cfg,
                        stops, CPU, ddp=spy)
    # 8 rows in micro-batches of 3, 3, 2: sync on the third, twice (two inner epochs)
    assert spy.calls == [True, True, False] * 2
    timing = {"step_time_s", "peak_mem_gb", "sample_tokens_per_s"}
    assert plain.keys() == through.keys()
    for key in plain.keys() - timing:
        assert through[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-9, nan_ok=True), key
    moved = 0
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-9, msg=name)
        moved += name in before and not torch.equal(p, before[name])
    assert moved > 0  # the step trained: the comparison is not of two untouched adapters


def test_rank_and_is_main_are_the_process_groups_in_a_distributed_run(monkeypatch):
    import scaleup.distributed as d

    monkeypatch.setattr(d, "is_distributed", lambda: True)
    monkeypatch.setattr(d.dist, "get_rank", lambda: 2)
    assert d.rank() == 2 and not d.is_main()
    monkeypatch.setattr(d.dist, "get_rank", lambda: 0)
    assert d.rank() == 0 and d.is_main()


@pytest.mark.parametrize("me", [0, 2])
def test_gather_to_main_gives_rank_0_every_ranks_object_in_rank_order(monkeypatch, me):
    """Rank 0 passes a list of K slots and gets them filled in rank order; the other
    ranks pass none (``torch.distributed.gather_object``'s rule) and get ``None``. The
    stand-in gathers as torch does in a 3-process group (``dst=None`` means rank 0)."""
    import scaleup.distributed as d

    monkeypatch.setattr(d, "is_distributed", lambda: True)
    monkeypatch.setattr(d.dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(d.dist, "get_rank", lambda: me)
    calls = []

    def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
        dst = 0 if dst is None and group_dst is None else dst
        if (me == dst) != (object_gather_list is not None):
            raise ValueError("gather_list is given on the destination rank only")
        calls.append((obj, dst))
        if object_gather_list is not None:
            assert len(object_gather_list) == 3
            object_gather_list[:] = [f"from rank {r}" for r in range(3)]

    monkeypatch.setattr(d.dist, "gather_object", gather_object)
    out = d.gather_to_main(f"from rank {me}")
    assert calls == [(f"from rank {me}", 0)]
    assert out == (["from rank 0", "from rank 1", "from rank 2"] if me == 0 else None)


def test_on_main_then_share_gives_another_rank_rank_0s_result(monkeypatch):
    """A rank other than 0 does not call ``fn``; rank 0's broadcast fills its box."""
    import scaleup.distributed as d

    monkeypatch.setattr(d, "is_distributed", lambda: True)
    monkeypatch.setattr(d, "is_main", lambda: False)
    sent = []

    def broadcast_object_list(box, src):
        sent.append(src)
        box[:] = ["rank 0's result", None]

    monkeypatch.setattr(d.dist, "broadcast_object_list", broadcast_object_list)
    assert d.on_main_then_share(lambda: pytest.fail("fn ran on rank 1")) == "rank 0's result"
    assert sent == [0]
