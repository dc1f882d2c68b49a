"""One GRPO step: sample, reward, advantages, log-probs, 1-2 inner epochs of updates.

The math comes from ``torchref`` (``group_advantages``, ``grpo_loss`` and the
diagnostics); this module only batches it.
"""

from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import dataclass

import torch

from scaleup.config import TrainConfig
from scaleup.distributed import all_reduce, rank_share, world_size
from scaleup.logprobs import completion_logprobs, trim
from scaleup.rollout import Rollouts, sample_rollouts
from torchref import clip_metrics, group_advantages, grpo_loss, k3_kl


@dataclass
class Batch:
    """What the loss needs, for N rows: inputs, response mask, advantages, old/ref log-probs."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor
    logp_old: torch.Tensor | None = None
    logp_ref: torch.Tensor | None = None

    @classmethod
    def from_rollouts(cls, r: Rollouts, adv: torch.Tensor) -> Batch:
        return cls(r.prompt_ids, r.prompt_mask, r.completion_ids, r.response_mask, adv)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def rows(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop`` of every tensor."""
        def s(x):
            return None if x is None else x[start:stop]
        return Batch(s(self.prompt_ids), s(self.prompt_mask), s(self.completion_ids),
                     s(self.mask), s(self.adv), s(self.logp_old), s(self.logp_ref))


CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def micro_batches(n: int, size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in chunks of ``size``."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def global_count(total_mask: torch.Tensor, agg: str) -> float:
    """Valid tokens (``agg="token"``) or rows (``"seq"``, ``"constant"``) of the whole
    step's batch: this
    rank's ``total_mask`` summed over all ranks (one scalar all-reduce; just this rank's
    count without a process group)."""
    local = float((total_mask != 0).sum()) if agg == "token" else float(total_mask.shape[0])
    return all_reduce([local], device=total_mask.device)[0]


def loss_normaliser(total_mask: torch.Tensor, agg: str) -> float:
    """The denominator ``D`` of :func:`micro_batch_weight`: ``global_count / K``.

    With K ranks under DDP, which *averages* the ranks' gradients (divides their sum by
    K), the global token-mean ``sum over all ranks' valid tokens / global_token_count``
    needs each rank to scale its local masked sum by ``K / global_token_count`` (for
    ``agg="seq"``: its sum of per-row means by ``K / global_rows``). That is a mean over
    the whole batch, not a mean of per-rank means, which would weight a rank's tokens by
    ``1 / (K * its own count)``. With one process ``D`` is the batch's own count.
    """
    return max(global_count(total_mask, agg), 1.0) / world_size()


def micro_batch_weight(mask: torch.Tensor, total_mask: torch.Tensor, agg: str,
                       normaliser: float | None = None) -> float:
    """Weight of a micro-batch's ``grpo_loss`` in the accumulated full-batch loss.

    ``grpo_loss`` normalises over the rows it is given. Summing ``w_k * loss_k`` over the
    micro-batches gives the loss of the whole batch at once when
    ``w_k = (valid tokens in k) / (valid tokens in the batch)`` for ``agg="token"`` (the
    normaliser is the batch's global token count, not a mean of per-micro-batch means)
    and ``w_k = (rows in k) / (rows in the batch)`` for ``agg="seq"`` and ``"constant"``
    (Dr. GRPO's ``sum / (rows * max_new_tokens)``; ``grpo_loss`` gets
    ``max_len=cfg.max_new_tokens``, so trimming a micro-batch does not change its
    constant). Across K processes
    "the batch" is all ranks' rows together and the denominator is
    :func:`loss_normaliser` (global count / K, because DDP averages over the ranks).
    ``normaliser`` is that denominator when already computed (it costs an all-reduce).
    """
    if normaliser is None:
        normaliser = loss_normaliser(total_mask, agg)
    count = float((mask != 0).sum()) if agg == "token" else float(mask.shape[0])
    return count / normaliser


def batch_logprobs(model, batch: Batch, micro_batch_size: int, chunk: int,
                   with_entropy: bool = False):
    """Log-probs (N, T) of every row, micro-batch by micro-batch (no grad).

    Each micro-batch is trimmed of all-padding columns and padded back with zeros, exactly
    as in :func:`loss_backward`, so a no-grad pass and the training pass compute the same
    function.
    """
    out, ents = [], []
    with torch.no_grad():
        for start, stop in micro_batches(len(batch), micro_batch_size):
            lp, ent = _mb_logprobs(model, batch.rows(start, stop), chunk, with_entropy)
            out.append(lp)
            ents.append(ent)
    return torch.cat(out), (torch.cat(ents) if with_entropy else None)


def _mb_logprobs(model, mb: Batch, chunk: int, with_entropy: bool, forward=None):
    """One micro-batch's log-probs, trimmed then padded back. ``forward`` (the DDP-wrapped
    :class:`~scaleup.distributed.LogprobModule`) replaces the plain call when given."""
    p_ids, p_mask, c_ids, c_mask = trim(mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                        mb.mask)
    if forward is None:
        lp, ent = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk, with_entropy)
    else:
        lp, ent = forward(p_ids, p_mask, c_ids, c_mask, chunk, with_entropy)
    pad = mb.completion_ids.shape[1] - lp.shape[1]
    lp = torch.nn.functional.pad(lp, (0, pad))
    ent = torch.nn.functional.pad(ent, (0, pad)) if with_entropy else None
    return lp, ent


def loss_backward(model, batch: Batch, cfg: TrainConfig, ddp=None) -> dict[str, float]:
    """Accumulate the gradient of the whole batch's ``grpo_loss`` over micro-batches.

    Each micro-batch's loss is scaled by :func:`micro_batch_weight`, so the accumulated
    gradient equals that of ``grpo_loss`` on the full batch. ``batch.logp_ref`` may be
    ``None`` when ``cfg.beta == 0`` (it is then never used). Does not zero or step.
    Returns the loss, clip fraction, entropy and (when ``logp_ref`` is given) KL, each
    averaged over the batch's valid tokens, and the largest ``|logp_new - logp_old|``.

    With ``ddp`` (K processes, ``batch`` = this rank's rows) "the batch" is all ranks'
    rows: the weights use the global normaliser, DDP all-reduces the gradient once, on
    the last micro-batch's backward (``no_sync`` before it), and the returned statistics
    are those of the whole batch, the same on every rank.
    """
    total = batch.mask
    normaliser = loss_normaliser(total, cfg.agg)
    n_valid = max(global_count(total, "token"), 1.0)
    k = world_size()
    sums = {"loss": 0.0, **dict.fromkeys(CLIP_KEYS, 0.0), "entropy": 0.0, "kl": 0.0,
            "max_abs_log_ratio": 0.0}
    spans = micro_batches(len(batch), cfg.micro_batch_size)
    for i, (start, stop) in enumerate(spans):
        mb = batch.rows(start, stop)
        sync = ddp is None or i == len(spans) - 1
        with contextlib.nullcontext() if sync else ddp.no_sync():
            logp_new, ent = _mb_logprobs(model, mb, cfg.logprob_chunk, with_entropy=True,
                                         forward=ddp)
            logp_ref = mb.logp_ref if mb.logp_ref is not None else mb.logp_old
            loss = grpo_loss(logp_new, mb.logp_old, logp_ref, mb.adv, mb.mask, cfg.clip_eps,
                             cfg.beta, cfg.agg, cfg.clip_eps_high, max_len=cfg.max_new_tokens)
            w = micro_batch_weight(mb.mask, total, cfg.agg, normaliser)
            (loss * w).backward()
        with torch.no_grad():
            tok_w = float((mb.mask != 0).sum()) / n_valid
            valid = mb.mask != 0
            sums["loss"] += float(loss.detach()) * w / k
            clip = clip_metrics(logp_new, mb.logp_old, mb.adv, mb.mask, cfg.clip_eps,
                                cfg.clip_eps_high)
            for key in CLIP_KEYS:
                sums[key] += float(clip[key]) * tok_w
            sums["entropy"] += float(ent[valid].sum()) / n_valid
            if mb.logp_ref is not None:
                sums["kl"] += float(k3_kl(logp_new[valid], mb.logp_ref[valid]).sum()) / n_valid
            diff = (logp_new - mb.logp_old)[valid].abs()
            if diff.numel():
                sums["max_abs_log_ratio"] = max(sums["max_abs_log_ratio"], float(diff.max()))
    if k > 1:
        names = ("loss", *CLIP_KEYS, "entropy", "kl")
        sums.update(zip(names, all_reduce([sums[n] for n in names], device=total.device),
                        strict=True))
        sums["max_abs_log_ratio"] = all_reduce([sums["max_abs_log_ratio"]], "max",
                                               device=total.device)[0]
    if batch.logp_ref is None:
        sums["kl"] = float("nan")
    return sums


def rewards_of(task, rollouts: Rollouts) -> torch.Tensor:
    """(N,) float32 0/1 rewards from the task's checker."""
    r = [task.score(t, p) for t, p in zip(rollouts.texts, rollouts.problems, strict=True)]
    return torch.tensor(r, dtype=torch.float32)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated on ``device`` (CUDA), else the process's peak RSS, in GB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def grpo_step(model, tokenizer, optimizer, task, step: int, cfg: TrainConfig,
              stop_ids: list[int], device: torch.device, ddp=None) -> dict[str, float]:
    """One GRPO step on ``cfg.prompts_per_step`` prompts of ``task`` (see module doc).

    ``logp_old`` is computed by the same code as ``logp_new`` (a no-grad pass over the same
    micro-batches), so the ratio is exactly 1 in the first inner epoch; ``logp_ref`` comes
    from the same model with the adapter disabled, only when ``beta > 0`` (or
    ``cfg.log_kl``). Returns the step's metrics (entropy, clip fraction and KL from the
    last inner epoch, before its optimizer step).

    With K processes (``ddp`` from :func:`scaleup.distributed.wrap_ddp`) this rank samples
    and trains its share of the step's prompts (whole groups); the returned metrics are
    those of all ranks' rows together (``sample_tokens_per_s`` is the ranks' sum,
    ``step_time_s`` and ``peak_mem_gb`` this rank's).
    """
    t0 = time.perf_counter()
    problems = rank_share(task.sample(cfg.prompts_per_step, cfg.seed, step))
    roll = sample_rollouts(model, tokenizer, problems, cfg.group_size, cfg.max_new_tokens,
                           stop_ids, device)
    rewards = rewards_of(task, roll).to(device)
    grouped = rewards.view(-1, cfg.group_size)
    adv = group_advantages(grouped, std_norm=cfg.std_norm).view(-1)
    zero_var = grouped.amax(1) == grouped.amin(1)
    lengths = roll.response_mask.sum(1).float()
    correct = rewards > 0.5
    batch = full = Batch.from_rollouts(roll, adv)
    if cfg.dynamic_sampling:
        keep = (~zero_var).repeat_interleave(cfg.group_size).nonzero().squeeze(1)
        batch = Batch.from_rollouts(roll.select(keep), adv[keep])
    # one all-reduce for the whole step's counts (the identity in a single process)
    (n_rows, reward_sum, n_groups, zero_var_groups, n_correct, len_correct, len_incorrect,
     n_truncated, tokens_per_s, trained_rows) = all_reduce([
        len(rewards), rewards.sum(), grouped.shape[0], zero_var.sum(), correct.sum(),
        lengths[correct].sum(), lengths[~correct].sum(), roll.truncated.sum(),
        float(lengths.sum()) / max(roll.sample_seconds, 1e-9), len(batch)], device=device)
    n_incorrect = n_rows - n_correct
    metrics = {
        "step": step,
        "mean_reward": reward_sum / n_rows,
        "frac_reward_zero_std": zero_var_groups / n_groups,
        "len_correct": len_correct / n_correct if n_correct else float("nan"),
        "len_incorrect": len_incorrect / n_incorrect if n_incorrect else float("nan"),
        "truncated_frac": n_truncated / n_rows,
        "sample_tokens_per_s": tokens_per_s,
        "trained_rows": int(trained_rows),
    }
    stats = dict.fromkeys(("loss", *CLIP_KEYS, "entropy", "kl", "max_abs_log_ratio"),
                          float("nan"))
    if trained_rows:  # some rank has rows to train: every rank takes part in the update
        stats = _update(model, optimizer, batch if len(batch) else zero_weight_row(full), cfg,
                        ddp)
    metrics.update(stats)
    metrics["step_time_s"] = time.perf_counter() - t0
    metrics["peak_mem_gb"] = peak_memory_gb(device)
    return metrics


def zero_weight_row(batch: Batch) -> Batch:
    """Row 0 of ``batch`` with an all-zero mask, so its loss weight is 0. A rank that has no
    rows left (dynamic sampling dropped all its groups) while other ranks train updates on
    it, so that it still joins DDP's gradient all-reduce and the same optimizer step."""
    row = batch.rows(0, 1)
    row.mask = torch.zeros_like(row.mask)
    return row


def _update(model, optimizer, batch: Batch, cfg: TrainConfig, ddp=None) -> dict[str, float]:
    """``logp_old`` (and ``logp_ref``), then ``cfg.inner_epochs`` optimizer steps.

    With ``ddp`` the backward passes go through it (one gradient all-reduce per optimizer
    step), so every rank clips and steps on the same, global gradient.
    """
    # One mode for the old and the new pass, so they are the same function. transformers
    # only checkpoints activations in train mode; with lora_dropout = 0 (the default) and
    # Qwen's zero attention dropout, train mode computes exactly what eval mode does.
    model.train(cfg.gradient_checkpointing)
    batch.logp_old, _ = batch_logprobs(model, batch, cfg.micro_batch_size, cfg.logprob_chunk)
    if cfg.beta > 0 or cfg.log_kl:
        with model.disable_adapter():
            batch.logp_ref, _ = batch_logprobs(model, batch, cfg.micro_batch_size,
                                               cfg.logprob_chunk)
    params = [p for p in model.parameters() if p.requires_grad]
    first_ratio = float("nan")
    for epoch in range(cfg.inner_epochs):
        optimizer.zero_grad(set_to_none=True)
        stats = loss_backward(model, batch, cfg, ddp)
        if epoch == 0:
            first_ratio = stats["max_abs_log_ratio"]
        if cfg.max_grad_norm > 0:
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    stats["first_epoch_max_abs_log_ratio"] = first_ratio
    stats.pop("max_abs_log_ratio")
    return stats
