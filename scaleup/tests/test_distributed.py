"""K processes (gloo on CPU, 127.0.0.1) against one: the same update, only rank 0 writes.

The reference is always the plain single-process code on the full batch, run in this
(test) process without any process group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from scaleup.checkpoint import latest_checkpoint, load_checkpoint, rng_states, save_checkpoint
from scaleup.config import ConfigError
from scaleup.distributed import check_divisible, rank_share, world_size
from scaleup.step import MISMATCH_KEYS
from scaleup.tests import dist_helpers as H
from scaleup.tests.conftest import small_cfg
from scaleup.train import make_optimizer, read_log

#: float32 tolerance for 2-process vs 1-process results. The two differ only in the
#: order of float32 sums (micro-batches of different rows, DDP's sum then / 2) and in the
#: shapes the shares are trimmed to; measured max |difference| ~1e-8 on gradients and
#: ~1e-9 on the updated weights (entries O(0.1)).
ATOL, RTOL = 1e-6, 1e-5


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    H.run_ranks(H.equivalence_run, 2, str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    assert world_size() == 1  # no process group in the test process
    return H.equivalence_run(0, 1, str(tmp_path_factory.mktemp("single")))


def _close(got: dict, want: dict):
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.parametrize("agg", ["token", "seq", "constant"])
def test_two_process_gradient_equals_full_batch_gradient(two_ranks, one_rank, agg):
    """DDP's reduced gradient of the ranks' shares == the 1-process full-batch gradient,
    so the normaliser is global (19 + 12 valid tokens, not a mean of per-rank means)."""
    want = one_rank[f"grads_{agg}"]
    assert sum(float(g.abs().sum()) for g in want.values()) > 0
    for r in range(2):
        _close(two_ranks[r][f"grads_{agg}"], want)
        for key in ("loss", "clip_ratio/region_mean", "entropy", "kl", "max_abs_log_ratio"):
            assert two_ranks[r][f"stats_{agg}"][key] == pytest.approx(
                one_rank[f"stats_{agg}"][key], rel=RTOL, abs=ATOL), key
    assert 0 < one_rank[f"stats_{agg}"]["clip_ratio/region_mean"] < 1


def test_two_process_update_equals_one_process_update(two_ranks, one_rank):
    """One GRPO update (logp_old from the shares, 2 inner epochs, clipping, AdamW)."""
    before, after = one_rank["params_before"], one_rank["params_after"]
    assert all(not torch.equal(before[n], after[n]) for n in before)  # every weight moved
    for r in range(2):
        _close(two_ranks[r]["params_before"], before)
        _close(two_ranks[r]["params_after"], after)
        want, got = one_rank["update_stats"], two_ranks[r]["update_stats"]
        assert got["first_epoch_max_abs_log_ratio"] == 0.0
        for key in ("loss", "clip_ratio/region_mean", "entropy", "kl", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=RTOL, abs=ATOL), key
    # the ranks hold bit-identical weights: DDP gave both the same gradient
    assert all(torch.equal(two_ranks[0]["params_after"][n], two_ranks[1]["params_after"][n])
               for n in after)


def test_two_process_batch_statistics_equal_one_process(two_ranks, one_rank):
    """scale_rewards='batch' and reinforce_pp use the std (and mean) of both ranks' rewards;
    top_entropy_quantile the quantile of both ranks' tokens: the 2-process results equal
    the 1-process ones on the whole batch (which equal torchref's, test_step_variants)."""
    for name in ("batch", "reinforce_pp"):
        got = torch.cat([two_ranks[0][f"adv_{name}"], two_ranks[1][f"adv_{name}"]])
        torch.testing.assert_close(got, one_rank[f"adv_{name}"], atol=ATOL, rtol=RTOL)
    # per-rank statistics would differ (rank 0's rewards 1,0,1,1 alone: mean 0.75)
    r0 = torch.tensor([1.0, 0, 1, 1])
    local_std = r0.std(unbiased=False) + 1e-6
    assert not torch.allclose(two_ranks[0]["adv_reinforce_pp"], (r0 - r0.mean()) / local_std)
    assert not torch.allclose(two_ranks[0]["adv_batch"],
                              torch.tensor([0.5, -0.5, 0, 0]) / local_std)
    keep = torch.cat([two_ranks[0]["topq_keep"], two_ranks[1]["topq_keep"]])
    assert torch.equal(keep, one_rank["topq_keep"])
    assert 0.25 < float(one_rank["topq_keep"].sum()) / 31 < 0.35  # of the 31 valid tokens
    for r in range(2):
        _close(two_ranks[r]["topq_grads"], one_rank["topq_grads"])
        for key in ("loss", "entropy", "kl"):
            assert two_ranks[r]["topq_stats"][key] == pytest.approx(
                one_rank["topq_stats"][key], rel=RTOL, abs=ATOL), key


def test_two_process_sampler_mismatch_equals_one_process(two_ranks, one_rank):
    """The sampler-vs-trainer mismatch (``MISMATCH_KEYS``: mean and max ``|logp_sampler -
    logp_new|`` over the valid tokens) is the whole batch's on every rank: the sampler's
    log-probs are the trainer's plus 0.001 x (flat index + 1), so the mean and the max
    are those offsets' over the valid tokens (the max in rank 1's rows, so a sum of the
    ranks' maxima or a mean of one rank's tokens is wrong)."""
    offsets, valid = one_rank["mismatch_offsets"], one_rank["mismatch_valid"]
    want = dict(zip(MISMATCH_KEYS, (float(offsets[valid].mean()), float(offsets[valid].max())),
                    strict=True))
    assert float(offsets[valid][: int(valid[:4].sum())].max()) < want[MISMATCH_KEYS[1]] / 1.5
    for stats in (one_rank["mismatch_stats"], *(r["mismatch_stats"] for r in two_ranks)):
        for key, value in want.items():
            assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize("agg", ["token", "seq", "constant"])
def test_a_rank_without_rows_still_joins_the_update(two_ranks, one_rank, agg):
    """Rank 1 has nothing left to train (a zero-weight row, 1 micro-batch), rank 0 has two
    groups (4 rows, 2 micro-batches): no deadlock, and the update is the 1-process update
    on rank 0's groups alone, for every aggregation (before the fix, the placeholder row
    counted as a fifth row in ``seq``/``constant``: the gradient was 4/5 of the right one)."""
    for r in range(2):
        _close(two_ranks[r][f"uneven_after_{agg}"], one_rank[f"uneven_after_{agg}"])
        for key in ("loss", "clip_ratio/region_mean", "kl", "grad_norm"):
            assert two_ranks[r][f"uneven_stats_{agg}"][key] == pytest.approx(
                one_rank[f"uneven_stats_{agg}"][key], rel=RTOL, abs=ATOL), key
    assert not all(torch.equal(one_rank[f"uneven_after_{agg}"][n], one_rank["params_after"][n])
                   for n in one_rank["params_after"])


def test_shares_and_divisibility():
    assert rank_share(list(range(6)), 3, 1) == [2, 3]
    assert rank_share(list(range(6)), 1, 0) == list(range(6))
    check_divisible(small_cfg(prompts_per_step=4), 2)
    with pytest.raises(ConfigError, match=r"prompts_per_step \(--prompts-per-step\) = 4 must "
                                          r"be divisible by the number of processes \(3\)"):
        check_divisible(small_cfg(prompts_per_step=4), 3)


def test_each_rank_resumes_its_own_rng_stream(tmp_path):
    """A checkpoint of 2 ranks holds both RNG states; rank r restores its own."""
    cfg = small_cfg(output_dir=str(tmp_path))
    model = H.fixed_policy(cfg)
    opt = make_optimizer(model, cfg)
    states = []
    for seed in (10, 11):
        torch.manual_seed(seed)
        states.append(rng_states())
    save_checkpoint(tmp_path, 3, model, opt, cfg, states)
    torch.manual_seed(99)
    for r in (0, 1):
        assert load_checkpoint(latest_checkpoint(tmp_path), model, opt, r, 2) == 3
        assert torch.equal(torch.get_rng_state(), states[r]["torch"])
    # a single-process resume of it takes rank 0's
    load_checkpoint(latest_checkpoint(tmp_path), model, opt)
    assert torch.equal(torch.get_rng_state(), states[0]["torch"])


def test_torchrun_cli_two_processes_only_rank0_writes(tiny_dir, tmp_path):
    """``torchrun --nproc_per_node=2 -m scaleup.cli train``: one log line a step with the
    whole batch's counts, checkpoints from rank 0 holding both ranks' RNG streams."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={H.free_port()}",
           "-m", "scaleup.cli", "train", "--model", str(tiny_dir), "--output-dir", str(out),
           "--task", "digit", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
           "--max-new-tokens", "3", "--device", "cpu", "--save-every", "1", "--lora-r", "2"]
    env = {**os.environ, **H.local_env(0)}
    env.pop("MASTER_PORT")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "checkpoints", "config.json", "log.jsonl"]
    log = read_log(out / "log.jsonl")
    assert [r["step"] for r in log] == [0, 1]  # not one line per rank
    assert all(r["trained_rows"] == 4 for r in log)  # both ranks' rows: 2 prompts x G = 2
    assert json.loads((out / "config.json").read_text())["prompts_per_step"] == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001",
                                                                        "step_000002"]
    rng = torch.load(out / "checkpoints" / "step_000002" / "rng.pt", weights_only=True)
    assert len(rng["ranks"]) == 2
    assert not torch.equal(rng["ranks"][0]["torch"], rng["ranks"][1]["torch"])  # seed + rank
    assert proc.stderr.count("done: 2 steps") + proc.stdout.count("done: 2 steps") == 1


def test_two_process_resume_equals_no_interruption(tiny_dir, tmp_path):
    """2 processes, with dynamic sampling: interrupted after 3 steps (checkpoint at 2) and
    resumed == straight through (log, adapter, and each rank's sampling RNG at the end),
    so every rank reloaded the checkpoint and its own RNG stream."""
    H.run_ranks(H.resume_run, 2, str(tiny_dir), str(tmp_path))
    timing = ("step_time_s", "sample_tokens_per_s", "peak_mem_gb")
    logs = [[{k: v for k, v in r.items() if k not in timing}
             for r in read_log(tmp_path / run / "log.jsonl")] for run in "ab"]
    assert [r["step"] for r in logs[0]] == [0, 1, 2, 3] and logs[0] == logs[1]
    # step 0 kept one group in all: the other rank updated on a zero-weight row
    assert [r["trained_rows"] for r in logs[0]][0] == 4
    rng = {f"{run}{r}": torch.load(tmp_path / f"{run}_rng{r}.pt") for run in "ab" for r in (0, 1)}
    assert torch.equal(rng["a0"], rng["b0"]) and torch.equal(rng["a1"], rng["b1"])
    assert not torch.equal(rng["a0"], rng["a1"])  # seed + rank: two streams
    a, b = (load_file(str(latest_checkpoint(tmp_path / run) / "adapter_model.safetensors"))
            for run in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_a_rank_dies_with_the_process_that_started_it():
    """A rank whose test process is killed (mutmut's timeout of a mutant that deadlocks
    the ranks) does not live on blocked in a collective: it is killed with its parent."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    import time

    def alive(pid: int) -> bool:  # a zombie (killed, not yet reaped by init) is dead
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    ready_r, ready_w = os.pipe()
    pid_r, pid_w = os.pipe()
    starter = os.fork()
    if starter == 0:  # a mutant's test process: starts a rank, then is killed
        rank = os.fork()
        if rank == 0:
            H._die_with_parent(os.getppid())
            os.write(ready_w, b"1")
            time.sleep(60)
            os._exit(0)
        os.read(ready_r, 1)
        os.write(pid_w, str(rank).encode())
        time.sleep(60)
        os._exit(0)
    rank = int(os.read(pid_r, 20))
    for fd in (ready_r, ready_w, pid_r, pid_w):
        os.close(fd)
    assert alive(rank)
    os.kill(starter, 9)
    os.waitpid(starter, 0)
    deadline = time.monotonic() + 10
    while alive(rank) and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive(rank):
        os.kill(rank, 9)
        pytest.fail("the rank outlived the process that started it")
