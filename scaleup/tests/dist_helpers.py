"""Helpers for the multi-process tests: start K CPU processes (gloo, 127.0.0.1 only), and
the fixed batch and model every process (and the 1-process reference) builds alike."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

from scaleup.modeling import add_lora
from scaleup.step import Batch, batch_logprobs
from scaleup.tests.conftest import small_cfg
from scaleup.tiny import tiny_qwen2, tiny_tokenizer

N_PROMPTS, GROUP = 4, 2  # 8 rows: rank 0 gets groups 0-1, rank 1 groups 2-3


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_env(port: int) -> dict[str, str]:
    """Environment for a process group on the loopback interface only."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _die_with_parent(parent: int) -> None:
    """Linux: this rank is killed when the process that started it dies (a mutant's run
    stopped by mutmut's timeout would otherwise leave its forked ranks blocked forever
    in a collective the other rank never joins)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # ``parent`` died before the call
            os._exit(1)


def _entry(rank, fn, k, port, args, parent):
    _die_with_parent(parent)
    os.environ.update(local_env(port))
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(k),
                      LOCAL_WORLD_SIZE=str(k))
    torch.set_num_threads(1)
    try:
        fn(rank, k, *args)
    finally:
        report_mutmut_hits()


#: Set by the root conftest.py in mutmut's stats phase: where a child process writes the
#: mutated functions it reached (mutmut only sees the test process's own calls).
HITS_DIR = "MUTMUT_CHILD_HITS_DIR"


def report_mutmut_hits() -> None:
    """In mutmut's stats phase, write the functions this (child) process reached through
    mutmut's trampolines to ``$MUTMUT_CHILD_HITS_DIR``; the root conftest.py adds them
    to the test that started the process, so the DDP code's mutants are run against the
    multi-process tests. A no-op outside mutmut."""
    out = os.environ.get(HITS_DIR)
    if os.environ.get("MUTANT_UNDER_TEST") != "stats" or not out:
        return
    from mutmut.state import state

    with open(os.path.join(out, f"hits-{os.getpid()}.txt"), "w") as f:
        f.write("\n".join(sorted(state()._stats)))


def start_method() -> str:
    """``spawn`` (what torchrun's fresh processes are like); ``fork`` for a mutant's run
    under mutmut, whose test process is a fresh fork that ran only the scale-up's torch
    tests (no JAX), with one OpenMP thread: each spawned rank imports torch and
    transformers again (about 6 of the 13-20 s of a two-process test there)."""
    phase = os.environ.get("MUTANT_UNDER_TEST", "")
    return "fork" if phase and phase not in ("stats", "fail") else "spawn"


def run_ranks(fn, k: int, *args, timeout: float = 240.0) -> None:
    """Run ``fn(rank, k, *args)`` in ``k`` new processes (``start_method()``; RANK,
    WORLD_SIZE, MASTER_ADDR/PORT set as torchrun would); re-raise a worker's error; kill
    them all after ``timeout`` seconds (a deadlock fails the test instead of hanging it)."""
    ctx = mp.start_processes(_entry, args=(fn, k, free_port(), args, os.getpid()), nprocs=k,
                             join=False, start_method=start_method())
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{k} processes did not finish in {timeout} s")


def fixed_batch(seed: int = 0) -> Batch:
    """8 rows (4 prompts x G = 2) with different prompt padding and response lengths, so
    the two ranks' shares hold different numbers of valid tokens (19 and 12): a mean of
    per-rank token means would differ from the global token mean."""
    g = torch.Generator().manual_seed(seed)
    n, p, t = N_PROMPTS * GROUP, 4, 7
    lengths = [7, 5, 4, 3, 2, 1, 6, 3]
    p_mask = torch.ones(n, p, dtype=torch.long)
    c_mask = torch.zeros(n, t)
    for i in range(n):
        p_mask[i, : i % p] = 0
        c_mask[i, : lengths[i]] = 1
    return Batch(torch.randint(0, 256, (n, p), generator=g), p_mask,
                 torch.randint(0, 256, (n, t), generator=g), c_mask,
                 torch.randn(n, generator=g))


def fixed_policy(cfg):
    """The tiny model with a LoRA adapter whose B matrices are non-zero (seeded), so that
    every LoRA weight gets a gradient."""
    model = add_lora(tiny_qwen2(0, tiny_tokenizer()), cfg)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def off_policy(model, batch: Batch) -> Batch:
    """``batch`` with ``logp_old`` = the model's log-probs + seeded noise (ratios away from
    1, some outside the clip band) and ``logp_ref`` = ``logp_old - 0.2``."""
    lp, _ = batch_logprobs(model, batch, len(batch), 3)
    noise = 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    batch.logp_old = lp + noise
    batch.logp_ref = batch.logp_old - 0.2
    return batch


def grad_cfg(agg):
    return small_cfg(agg=agg, micro_batch_size=3, beta=0.1)


def update_cfg():
    return small_cfg(inner_epochs=2, beta=0.05, micro_batch_size=3, learning_rate=1e-3,
                     max_grad_norm=1.0)


def lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def lora_params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def equivalence_run(rank: int, k: int, out_dir: str) -> dict:
    """On this rank's share of :func:`fixed_batch` (all of it when ``k == 1``): the
    accumulated, DDP-reduced gradient of ``loss_backward`` for token and seq
    aggregation, then one ``_update`` (2 inner epochs, AdamW, gradient clipping). Saves
    the results to ``out_dir/rank<r>.pt`` and returns them."""
    from scaleup.distributed import finish_distributed, init_distributed, rank_share, wrap_ddp
    from scaleup.step import _update, loss_backward, zero_weight_row
    from scaleup.train import make_optimizer

    setup = init_distributed("cpu")
    rows = torch.tensor(rank_share(list(range(N_PROMPTS * GROUP)), k, rank))
    result = {}
    for agg in ("token", "seq", "constant"):
        model = fixed_policy(grad_cfg(agg))
        ddp = wrap_ddp(model, torch.device("cpu"))
        full = off_policy(model, fixed_batch())
        share = full.rows(int(rows[0]), int(rows[-1]) + 1)
        model.zero_grad()
        result[f"stats_{agg}"] = loss_backward(model, share, grad_cfg(agg), ddp)
        result[f"grads_{agg}"] = lora_grads(model)
    cfg = update_cfg()
    model = fixed_policy(cfg)
    ddp = wrap_ddp(model, torch.device("cpu"))
    opt = make_optimizer(model, cfg)
    full = fixed_batch()
    share = full.rows(int(rows[0]), int(rows[-1]) + 1)
    result["params_before"] = lora_params(model)
    result["update_stats"] = _update(model, opt, share, cfg, ddp)
    result["params_after"] = lora_params(model)
    # batch-level statistics: the reward mean/std and the entropy quantile over both ranks
    from scaleup.step import step_advantages

    rewards = torch.tensor([1.0, 0, 1, 1, 0, 0, 2, 1])  # the shares' stds differ
    share_r = rewards[rows]
    for name, kw in (("batch", dict(scale_rewards="batch")),
                     ("reinforce_pp", dict(estimator="reinforce_pp"))):
        cfg = small_cfg(group_size=GROUP, prompts_per_step=N_PROMPTS, **kw)
        result[f"adv_{name}"] = step_advantages(share_r, cfg)
    from scaleup.step import entropy_keep_mask

    # q = 0.3: the global threshold keeps 7 of rank 0's tokens, its own quantile would keep 6
    cfg = dataclasses.replace(grad_cfg("seq"), top_entropy_quantile=0.3, entropy_coef=0.05)
    model = fixed_policy(cfg)
    ddp = wrap_ddp(model, torch.device("cpu"))
    share = off_policy(model, fixed_batch()).rows(int(rows[0]), int(rows[-1]) + 1)
    _, ent = batch_logprobs(model, share, cfg.micro_batch_size, 3, with_entropy=True)
    share.keep = entropy_keep_mask(ent, share.mask, cfg.top_entropy_quantile)
    result["topq_keep"] = share.keep
    model.zero_grad()
    result["topq_stats"] = loss_backward(model, share, cfg, ddp)
    result["topq_grads"] = lora_grads(model)
    # the sampler-vs-trainer mismatch (a vLLM sampler's log-probs): the trainer's own
    # plus 0.001 x (flat index + 1), so rank 1's rows hold the largest gap
    cfg = grad_cfg("token")
    model = fixed_policy(cfg)
    ddp = wrap_ddp(model, torch.device("cpu"))
    full_s = off_policy(model, fixed_batch())
    logp_now, _ = batch_logprobs(model, full_s, cfg.micro_batch_size, 3)
    offsets = 1e-3 * torch.arange(1, full_s.mask.numel() + 1).reshape(full_s.mask.shape)
    full_s.logp_sampler = logp_now + offsets
    result["mismatch_offsets"], result["mismatch_valid"] = offsets, full_s.mask != 0
    model.zero_grad()
    result["mismatch_stats"] = loss_backward(
        model, full_s.rows(int(rows[0]), int(rows[-1]) + 1), cfg, ddp)
    # rank 1 lost all its groups (as dynamic sampling may leave it): it updates on a
    # zero-weight row, rank 0 on its 2 groups (4 rows); == the 1-process update on those
    # 2 groups, for every aggregation (the placeholder row counts in no normaliser)
    for agg in ("token", "seq", "constant"):
        cfg = dataclasses.replace(update_cfg(), agg=agg)
        model = fixed_policy(cfg)
        ddp = wrap_ddp(model, torch.device("cpu"))
        opt = make_optimizer(model, cfg)
        first = full.rows(0, N_PROMPTS * GROUP // 2)
        share = first if rank == 0 else zero_weight_row(full)
        result[f"uneven_stats_{agg}"] = _update(model, opt, first if k == 1 else share, cfg,
                                                ddp)
        result[f"uneven_after_{agg}"] = lora_params(model)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finish_distributed(setup)
    return result


def resume_run(rank: int, k: int, model_dir: str, out_dir: str) -> None:
    """In one process group: a straight 4-step run ``a`` and a run ``b`` interrupted
    after 3 steps (checkpoint at 2) and then resumed (``train`` joins the existing group).
    Each rank saves its torch RNG state at the end of ``a`` and of ``b``."""
    from scaleup.distributed import finish_distributed, init_distributed
    from scaleup.train import train

    setup = init_distributed("cpu")
    kw = dict(model=model_dir, task="digit", steps=4, save_every=2, inner_epochs=2,
              prompts_per_step=4, max_new_tokens=4, dynamic_sampling=True)
    train(small_cfg(output_dir=os.path.join(out_dir, "a"), **kw), show_progress=False)
    torch.save(torch.get_rng_state(), os.path.join(out_dir, f"a_rng{rank}.pt"))
    train(small_cfg(output_dir=os.path.join(out_dir, "b"), **kw), stop_after=3,
          show_progress=False)
    train(small_cfg(output_dir=os.path.join(out_dir, "b")), resume=True, show_progress=False)
    torch.save(torch.get_rng_state(), os.path.join(out_dir, f"b_rng{rank}.pt"))
    finish_distributed(setup)
