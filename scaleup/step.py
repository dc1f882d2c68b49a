"""One GRPO step: sample, reward, advantages, log-probs, 1-2 inner epochs of updates.

The math comes from ``torchref`` (the advantages, ``overlong_penalty``, ``grpo_loss``,
``high_entropy_mask`` and the diagnostics); this module only batches it, and supplies
the batch-level statistics (reward mean and std, the entropy quantile) over all ranks.
"""

from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import dataclass

import torch

from scaleup.config import TrainConfig
from scaleup.distributed import all_gather_cat, all_reduce, rank_share, world_size
from scaleup.logprobs import completion_logprobs, trim
from scaleup.rollout import Rollouts, sample_rollouts
from torchref import (
    clip_metrics,
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    k3_kl,
    overlong_penalty,
    rloo_advantages,
)


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
    placeholder: bool = False
    """a zero-weight stand-in for a rank with no rows (it counts in no normaliser)"""
    keep: torch.Tensor | None = None
    """(N, T) bool, the tokens that carry the policy term (``top_entropy_quantile``); None:
    all valid tokens"""
    logp_sampler: torch.Tensor | None = None
    """(N, T) the sampler's log-probs of the sampled tokens (``--rollout vllm``), or None"""

    @classmethod
    def from_rollouts(cls, r: Rollouts, adv: torch.Tensor, mask_truncated: bool = False
                      ) -> Batch:
        """The loss mask is the response mask, zeroed on truncated rows (no end-of-turn
        token) when ``mask_truncated``."""
        mask = r.response_mask
        if mask_truncated:
            mask = mask * (~r.truncated)[:, None].to(mask.dtype)
        return cls(r.prompt_ids, r.prompt_mask, r.completion_ids, mask, adv,
                   logp_sampler=r.logp_sampler)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def rows(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop`` of every tensor."""
        def s(x):
            return None if x is None else x[start:stop]
        return Batch(s(self.prompt_ids), s(self.prompt_mask), s(self.completion_ids),
                     s(self.mask), s(self.adv), s(self.logp_old), s(self.logp_ref),
                     self.placeholder, s(self.keep), s(self.logp_sampler))


CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
#: sampler-vs-trainer mismatch |logp_sampler - logp_old| over the sampled tokens (TRL's names)
MISMATCH_KEYS = ("sampling/sampling_logp_difference/mean",
                 "sampling/sampling_logp_difference/max")


def micro_batches(n: int, size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in chunks of ``size``."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def local_count(mask: torch.Tensor, agg: str, placeholder: bool = False) -> float:
    """This rank's share of the loss normaliser: its valid tokens (``agg="token"``) or its
    rows (``"seq"``, ``"constant"``); 0 for a :func:`zero_weight_row` placeholder, which
    stands in for a rank left without rows and must not count as a row."""
    if placeholder:
        return 0.0
    return float((mask != 0).sum()) if agg == "token" else float(mask.shape[0])


def global_count(total_mask: torch.Tensor, agg: str, placeholder: bool = False) -> float:
    """Valid tokens (``agg="token"``) or rows (``"seq"``, ``"constant"``) of the whole
    step's batch: :func:`local_count` summed over all ranks (one scalar all-reduce; just
    this rank's count without a process group)."""
    return all_reduce([local_count(total_mask, agg, placeholder)],
                      device=total_mask.device)[0]


def loss_normaliser(total_mask: torch.Tensor, agg: str, placeholder: bool = False) -> float:
    """The denominator ``D`` of :func:`micro_batch_weight`: ``global_count / K``.

    With K ranks under DDP, which *averages* the ranks' gradients (divides their sum by
    K), the global token-mean ``sum over all ranks' valid tokens / global_token_count``
    needs each rank to scale its local masked sum by ``K / global_token_count`` (for
    ``agg="seq"``: its sum of per-row means by ``K / global_rows``). That is a mean over
    the whole batch, not a mean of per-rank means, which would weight a rank's tokens by
    ``1 / (K * its own count)``. With one process ``D`` is the batch's own count.
    """
    return max(global_count(total_mask, agg, placeholder), 1.0) / world_size()


def micro_batch_weight(mask: torch.Tensor, total_mask: torch.Tensor, agg: str,
                       normaliser: float | None = None, placeholder: bool = False) -> float:
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
        normaliser = loss_normaliser(total_mask, agg, placeholder)
    return local_count(mask, agg, placeholder) / normaliser


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


def _mb_logprobs(model, mb: Batch, chunk: int, with_entropy: bool, forward=None,
                 entropy_grad: bool = False):
    """One micro-batch's log-probs, trimmed then padded back. ``forward`` (the DDP-wrapped
    :class:`~scaleup.distributed.LogprobModule`) replaces the plain call when given;
    ``entropy_grad`` keeps the entropies' gradient (for ``entropy_coef``)."""
    p_ids, p_mask, c_ids, c_mask = trim(mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                        mb.mask)
    if forward is None:
        lp, ent = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk, with_entropy,
                                      entropy_grad)
    else:
        lp, ent = forward(p_ids, p_mask, c_ids, c_mask, chunk, with_entropy, entropy_grad)
    pad = mb.completion_ids.shape[1] - lp.shape[1]
    lp = torch.nn.functional.pad(lp, (0, pad))
    ent = torch.nn.functional.pad(ent, (0, pad)) if with_entropy else None
    return lp, ent


def entropy_keep_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float
                      ) -> torch.Tensor:
    """``torchref.high_entropy_mask`` with the quantile over ALL ranks' valid tokens.

    The valid tokens' entropies of every rank are gathered (the identity in one process),
    ``high_entropy_mask`` picks the top ``top_quantile`` share of them, and this rank keeps
    its valid tokens with entropy >= the smallest picked value (the same set as ``>=`` the
    quantile, since no value lies strictly between the two).

    Args:
      entropy: (N, T) per-token entropies (a constant).
      mask: (N, T) nonzero at valid tokens.
      top_quantile: the share kept, in (0, 1].
    Returns:
      (N, T) bool.
    """
    valid = mask != 0
    everything = all_gather_cat(entropy.detach()[valid].float())
    if everything.numel() == 0:
        return valid
    chosen = high_entropy_mask(everything, torch.ones_like(everything), top_quantile)
    return valid & (entropy.detach().float() >= everything[chosen].min())


def loss_backward(model, batch: Batch, cfg: TrainConfig, ddp=None) -> dict[str, float]:
    """Accumulate the gradient of the whole batch's ``grpo_loss`` over micro-batches.

    Each micro-batch's loss is scaled by :func:`micro_batch_weight`, so the accumulated
    gradient equals that of ``grpo_loss`` on the full batch, with every option of
    :meth:`TrainConfig.loss_options`. ``entropy_coef > 0`` backpropagates through the
    training forward's entropies. ``batch.keep`` (the whole batch's high-entropy tokens,
    :func:`entropy_keep_mask`) restricts the policy term and the entropy bonus to those
    tokens, as ``grpo_loss(top_entropy_quantile=q)`` does on the full batch: their
    advantage (and bonus) is multiplied by ``keep``, which zeroes exactly the policy term
    of the other tokens in every loss mode, the KL term untouched. (``grpo_loss``'s own
    quantile would be per micro-batch.) ``batch.logp_ref`` may be
    ``None`` when ``cfg.beta == 0`` (it is then never used). Does not zero or step.
    Returns the loss, clip fraction, entropy and (when ``logp_ref`` is given) KL, each
    averaged over the batch's valid tokens, and the largest ``|logp_new - logp_old|``.

    ``batch.logp_old=None`` (one inner epoch, :func:`reuses_training_forward`): each
    micro-batch's ``logp_old`` is its own ``logp_new`` detached (TRL's shortcut: the same
    values a separate no-grad pass computes, so the same loss and gradient). With
    ``batch.logp_sampler`` the statistics include the sampler-vs-trainer mismatch
    :data:`MISMATCH_KEYS` (mean and max ``|logp_sampler - logp_new|`` over valid tokens).

    With ``ddp`` (K processes, ``batch`` = this rank's rows) "the batch" is all ranks'
    rows: the weights use the global normaliser, DDP all-reduces the gradient once, on
    the last micro-batch's backward (``no_sync`` before it), and the returned statistics
    are those of the whole batch, the same on every rank.
    """
    total = batch.mask
    normaliser = loss_normaliser(total, cfg.agg, batch.placeholder)
    n_valid = max(global_count(total, "token"), 1.0)
    k = world_size()
    entropy_grad = cfg.entropy_coef != 0
    options = cfg.loss_options()
    sums = {"loss": 0.0, **dict.fromkeys(CLIP_KEYS, 0.0), "entropy": 0.0, "kl": 0.0,
            "max_abs_log_ratio": 0.0, MISMATCH_KEYS[0]: 0.0, MISMATCH_KEYS[1]: 0.0}
    spans = micro_batches(len(batch), cfg.micro_batch_size)
    for i, (start, stop) in enumerate(spans):
        mb = batch.rows(start, stop)
        sync = ddp is None or i == len(spans) - 1
        with contextlib.nullcontext() if sync else ddp.no_sync():
            logp_new, ent = _mb_logprobs(model, mb, cfg.logprob_chunk, with_entropy=True,
                                         forward=ddp, entropy_grad=entropy_grad)
            logp_old = mb.logp_old if mb.logp_old is not None else logp_new.detach()
            logp_ref = mb.logp_ref if mb.logp_ref is not None else logp_old
            adv, bonus = mb.adv, (ent if entropy_grad else None)
            if mb.keep is not None:
                keep = mb.keep.to(logp_new.dtype)
                adv = (adv[:, None] if adv.dim() == 1 else adv) * keep
                bonus = None if bonus is None else bonus * keep
            loss = grpo_loss(logp_new, logp_old, logp_ref, adv, mb.mask, entropy=bonus,
                             logp_sampler=mb.logp_sampler, **options)
            w = micro_batch_weight(mb.mask, total, cfg.agg, normaliser, batch.placeholder)
            (loss * w).backward()
        with torch.no_grad():
            tok_w = float((mb.mask != 0).sum()) / n_valid
            valid = mb.mask != 0
            sums["loss"] += float(loss.detach()) * w / k
            clip = clip_metrics(logp_new, logp_old, mb.adv, mb.mask, cfg.clip_eps,
                                cfg.clip_eps_high, cfg.importance_level, cfg.dual_clip)
            for key in CLIP_KEYS:
                sums[key] += float(clip[key]) * tok_w
            sums["entropy"] += float(ent.detach()[valid].sum()) / n_valid
            if mb.logp_ref is not None:
                sums["kl"] += float(k3_kl(logp_new.detach()[valid],
                                          mb.logp_ref[valid]).sum()) / n_valid
            diff = (logp_new.detach() - logp_old)[valid].abs()
            if diff.numel():
                sums["max_abs_log_ratio"] = max(sums["max_abs_log_ratio"], float(diff.max()))
            if mb.logp_sampler is not None:
                gap = (logp_new.detach() - mb.logp_sampler)[valid].abs()
                sums[MISMATCH_KEYS[0]] += float(gap.sum()) / n_valid
                if gap.numel():
                    sums[MISMATCH_KEYS[1]] = max(sums[MISMATCH_KEYS[1]], float(gap.max()))
    if k > 1:
        names = ("loss", *CLIP_KEYS, "entropy", "kl", MISMATCH_KEYS[0])
        sums.update(zip(names, all_reduce([sums[n] for n in names], device=total.device),
                        strict=True))
        sums["max_abs_log_ratio"], sums[MISMATCH_KEYS[1]] = all_reduce(
            [sums["max_abs_log_ratio"], sums[MISMATCH_KEYS[1]]], "max", device=total.device)
    if batch.logp_ref is None:
        sums["kl"] = float("nan")
    if batch.logp_sampler is None:
        for key in MISMATCH_KEYS:
            sums[key] = float("nan")
    return sums


def rewards_of(task, rollouts: Rollouts) -> torch.Tensor:
    """(N,) float32 0/1 rewards from the task's checker."""
    r = [task.score(t, p) for t, p in zip(rollouts.texts, rollouts.problems, strict=True)]
    return torch.tensor(r, dtype=torch.float32)


def global_reward_stats(rewards: torch.Tensor) -> tuple[float, float, bool]:
    """``(mean, std, all_equal)`` of ALL ranks' rewards together (population std, float64
    sums: one all-reduce for the count and sum, one for the squared deviations, one for
    the max and min); this rank's own in one process."""
    n, total = all_reduce([rewards.numel(), rewards.sum()], device=rewards.device)
    mean = total / n
    (squares,) = all_reduce([((rewards.double() - mean) ** 2).sum()], device=rewards.device)
    high, neg_low = all_reduce([rewards.max(), -rewards.min()], "max", device=rewards.device)
    return mean, (squares / n) ** 0.5, high == -neg_low


def step_advantages(rewards: torch.Tensor, cfg: TrainConfig, eps: float = 1e-6
                    ) -> torch.Tensor:
    """(N,) advantages of this rank's rewards (N,), laid out group by group.

    ``cfg.estimator``: ``"grpo"`` / ``"dr_grpo"`` (``torchref.group_advantages``, scaled
    by the std of ``cfg.scale_rewards``: the estimator's own, group or none, unless set),
    ``"rloo"`` (``torchref.rloo_advantages``): per group, and a group lives on one rank.
    Batch statistics are those of the whole step's batch, ALL ranks' rewards
    (:func:`global_reward_stats`), so K processes compute what one process would:
    ``scale_rewards="batch"`` is ``(r - group mean) / (std_batch + eps)`` (0 for a group
    whose rewards are all equal, as ``group_advantages(scale_rewards="batch")``), and
    ``"reinforce_pp"`` is ``(r - mean_batch) / (std_batch + eps)``, zeros when every
    reward of the batch is equal (as ``torchref.reinforce_pp_advantages``).
    """
    grouped = rewards.view(-1, cfg.group_size)
    if cfg.estimator == "rloo":
        return rloo_advantages(grouped).view(-1)
    scale = cfg.scale_rewards or ("group" if cfg.estimator == "grpo" else "none")
    if cfg.estimator in ("grpo", "dr_grpo") and scale != "batch":
        return group_advantages(grouped, scale_rewards=scale, eps=eps).view(-1)
    mean, std, all_equal = global_reward_stats(rewards)
    if cfg.estimator == "reinforce_pp":
        if all_equal:
            return torch.zeros_like(rewards)
        return (rewards - mean) / (std + eps)
    return group_advantages(grouped, scale_rewards="none").view(-1) / (std + eps)


def shaped_rewards(task_rewards: torch.Tensor, lengths: torch.Tensor, cfg: TrainConfig
                   ) -> torch.Tensor:
    """The rewards the advantages see: the task's, plus DAPO's overlong penalty
    (``torchref.overlong_penalty`` with ``max_len = cfg.max_new_tokens``) when
    ``cfg.overlong_buffer`` is set. ``lengths`` (N,) counts each completion's response
    tokens (its end-of-turn token included)."""
    if cfg.overlong_buffer is None:
        return task_rewards
    return task_rewards + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer,
                                           cfg.overlong_penalty).to(task_rewards)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated on ``device`` (CUDA), else the process's peak RSS, in GB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def grpo_step(model, tokenizer, optimizer, task, step: int, cfg: TrainConfig,
              stop_ids: list[int], device: torch.device, ddp=None, sampler=None
              ) -> dict[str, float]:
    """One GRPO step on ``cfg.prompts_per_step`` prompts of ``task`` (see module doc).

    ``logp_old`` is computed by the same code as ``logp_new`` (the training forward's own,
    detached, when :func:`reuses_training_forward`; else a no-grad pass over the same
    micro-batches), so the ratio is exactly 1 in the first inner epoch; ``logp_ref`` comes
    from the same model with the adapter disabled, only when ``beta > 0`` (or
    ``cfg.log_kl``). Returns the step's metrics (entropy, clip fraction and KL from the
    last inner epoch, before its optimizer step).

    With K processes (``ddp`` from :func:`scaleup.distributed.wrap_ddp`) this rank samples
    and trains its share of the step's prompts (whole groups); the returned metrics are
    those of all ranks' rows together (``sample_tokens_per_s`` is the ranks' sum,
    ``step_time_s`` and ``peak_mem_gb`` this rank's).

    ``sampler`` (a :class:`scaleup.vllm_rollout.VllmSampler`, ``--rollout vllm``) samples
    instead of ``generate``: it is given the current adapter first (:meth:`sync`), woken
    before and put to sleep after sampling (GPU sleep mode only), and its log-probs enter
    the loss as ``logp_sampler`` (``--tis-cap``) and the logged mismatch.
    """
    t0 = time.perf_counter()
    problems = rank_share(task.sample(cfg.prompts_per_step, cfg.seed, step))
    if sampler is None:
        roll = sample_rollouts(model, tokenizer, problems, cfg.group_size, cfg.max_new_tokens,
                               stop_ids, device)
    else:
        sampler.wake_up()
        sampler.sync(model)
        roll = sampler.sample(tokenizer, problems, cfg.group_size, cfg.max_new_tokens,
                              stop_ids, device, seed=cfg.seed, step=step)
        sampler.sleep()
    rewards = rewards_of(task, roll).to(device)
    lengths = roll.response_mask.sum(1).float()
    shaped = shaped_rewards(rewards, lengths, cfg)
    grouped = shaped.view(-1, cfg.group_size)
    adv = step_advantages(shaped, cfg)
    zero_var = grouped.amax(1) == grouped.amin(1)
    correct = rewards > 0.5
    batch = full = Batch.from_rollouts(roll, adv, cfg.mask_truncated)
    if cfg.dynamic_sampling:
        keep = (~zero_var).repeat_interleave(cfg.group_size).nonzero().squeeze(1)
        batch = Batch.from_rollouts(roll.select(keep), adv[keep], cfg.mask_truncated)
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
    stats = dict.fromkeys(update_stat_names(cfg), float("nan"))
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
    row.placeholder = True
    return row


def rng_snapshot(device: torch.device):
    """The torch RNG state dropout draws from on ``device`` (CPU, and CUDA on a GPU)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def rng_restore(snapshot, device: torch.device) -> None:
    cpu, cuda = snapshot
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def reuses_training_forward(cfg: TrainConfig) -> bool:
    """Whether ``logp_old`` is the training forward's own ``logp_new``, detached (no
    separate no-grad pass): exact with one inner epoch (the policy that sampled is the one
    being differentiated, and the first epoch's dropout masks are the only ones drawn)
    unless the top-entropy mask needs ``logp_old``'s entropies before the update, or
    ``--separate-logp-old`` asks for the pass (and its health check)."""
    return (cfg.inner_epochs == 1 and cfg.top_entropy_quantile == 1
            and not cfg.separate_logp_old)


def update_stat_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The names of the statistics :func:`_update` returns: a step that trains no row
    (every group dropped by dynamic sampling, on every rank) logs them as nan, so every
    step's record has the same fields."""
    grad = ("grad_norm",) if cfg.max_grad_norm > 0 else ()
    return ("loss", *CLIP_KEYS, "entropy", "kl", *grad, "first_epoch_max_abs_log_ratio",
            *MISMATCH_KEYS)


def _update(model, optimizer, batch: Batch, cfg: TrainConfig, ddp=None) -> dict[str, float]:
    """``logp_old`` (and ``logp_ref``), then ``cfg.inner_epochs`` optimizer steps.

    Every pass runs in train mode, so LoRA dropout (``--lora-dropout``) acts in all of
    them, as transformers' activation checkpointing needs. ``logp_old`` is then one draw
    of the dropout masks; the first inner epoch replays the same random stream (the RNG
    state is restored before it), so it draws the same masks over the same micro-batches:
    its ratio is exactly 1 for any dropout (the health check
    ``first_epoch_max_abs_log_ratio == 0``), and later epochs draw new masks, as in any
    dropout training. The reference pass has the adapter, and so LoRA's dropout, off.

    With ``ddp`` the backward passes go through it (one gradient all-reduce per optimizer
    step), so every rank clips and steps on the same, global gradient.

    When :func:`reuses_training_forward`, there is no separate pass: ``logp_old`` is each
    micro-batch's ``logp_new`` detached (the same values, so the same gradient, one
    forward less), and ``first_epoch_max_abs_log_ratio`` is null (0 by construction).
    """
    device = batch.mask.device
    model.train()
    if cfg.beta > 0 or cfg.log_kl:
        with model.disable_adapter():
            batch.logp_ref, _ = batch_logprobs(model, batch, cfg.micro_batch_size,
                                               cfg.logprob_chunk)
    masks_of_old_pass = rng_snapshot(device)
    top_q = cfg.top_entropy_quantile < 1
    reuse = reuses_training_forward(cfg)
    if reuse:
        batch.logp_old = None
    else:
        batch.logp_old, ent_old = batch_logprobs(model, batch, cfg.micro_batch_size,
                                                 cfg.logprob_chunk, with_entropy=top_q)
    if top_q:  # the whole batch's high-entropy tokens, from the sampling policy
        batch.keep = entropy_keep_mask(ent_old, batch.mask, cfg.top_entropy_quantile)
    params = [p for p in model.parameters() if p.requires_grad]
    first_ratio = float("nan")
    for epoch in range(cfg.inner_epochs):
        if epoch == 0:
            rng_restore(masks_of_old_pass, device)
        optimizer.zero_grad(set_to_none=True)
        stats = loss_backward(model, batch, cfg, ddp)
        if epoch == 0:
            first_ratio = float("nan") if reuse else stats["max_abs_log_ratio"]
            mismatch = {k: stats[k] for k in MISMATCH_KEYS}
        if cfg.max_grad_norm > 0:
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    stats["first_epoch_max_abs_log_ratio"] = first_ratio
    stats.update(mismatch)  # the sampler's policy is the first epoch's
    stats.pop("max_abs_log_ratio")
    return stats
