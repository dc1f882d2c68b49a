"""Specification mutants: one mistake planted in BOTH implementations at once.

A syntax mutant in one framework is killed by the parity tests for free. The question
that matters is the same mistake made in ``jaxgrpo`` and ``torchref`` alike (or in the
scale-up, which has one implementation): parity cannot see it, only an independent
truth can (a closed form, hand-worked numbers, finite differences, an invariance, a
statistical test against exact probabilities, learning itself).

Each mutant is a list of text patches (``old`` -> ``new``; every ``old`` must occur
exactly once in its file, so a patch that no longer applies is an error, not a silent
pass). The harness copies the checkout into a temporary folder per worker, applies a
mutant's patches there, and runs its tests with ``-m "not parity"``: the tests that
compare the two frameworks are left out, so a kill is always an independent truth's.
Exit 1 if a mutant survives or cannot be applied.

    .venv/bin/python -m mutation.spec_mutants                 # all of them, 2 workers
    .venv/bin/python -m mutation.spec_mutants --list          # names and mistakes
    .venv/bin/python -m mutation.spec_mutants k1-instead-of-k3 unbiased-std
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("jaxgrpo", "torchref", "grpospec", "scaleup", "parity_tests", "benchmarks",
          "conftest.py", "pyproject.toml")

J, T = "jaxgrpo", "torchref"
LOSS_TESTS = ("parity_tests/test_loss_truths.py", "parity_tests/test_lab.py",
              "parity_tests/test_properties.py", "parity_tests/test_errors.py")
ADV_TESTS = ("parity_tests/test_lab.py", "parity_tests/test_properties.py",
             "parity_tests/test_advantage_truths.py")
COUNTING_TESTS = ("parity_tests/test_counting.py", "parity_tests/test_counting_truths.py",
                  "parity_tests/test_lab.py")


@dataclass(frozen=True)
class Patch:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class SpecMutant:
    name: str
    mistake: str
    patches: tuple[Patch, ...]
    tests: tuple[str, ...]


def both(jax_old: str, jax_new: str, torch_old: str, torch_new: str, module: str
         ) -> tuple[Patch, Patch]:
    """The same mistake in ``jaxgrpo/<module>.py`` and ``torchref/<module>.py``."""
    return (Patch(f"{J}/{module}.py", jax_old, jax_new),
            Patch(f"{T}/{module}.py", torch_old, torch_new))


MUTANTS: tuple[SpecMutant, ...] = (
    # ---- the three the issue found
    SpecMutant("dual-clip-dropped", "dual-clip's lower bound c*A never applied", both(
        "surrogate = jnp.where(a < 0, jnp.maximum(surrogate, dual_clip * a), surrogate)",
        "surrogate = surrogate",
        "surrogate = torch.where(a < 0, torch.maximum(surrogate, dual_clip * a), surrogate)",
        "surrogate = surrogate", "loss"), LOSS_TESTS),
    SpecMutant("gspo-no-gradient", "GSPO's sequence log-ratio under stop-gradient", both(
        "return jnp.broadcast_to(seq, log_ratio.shape)",
        "return jnp.broadcast_to(jax.lax.stop_gradient(seq), log_ratio.shape)",
        "return seq.expand_as(log_ratio)", "return seq.detach().expand_as(log_ratio)",
        "loss"), LOSS_TESTS),
    SpecMutant("old-not-constant", "no stop_gradient/detach on logp_old", both(
        "old = jnp.where(valid, jax.lax.stop_gradient(logp_old).astype(dtype), 0)",
        "old = jnp.where(valid, logp_old.astype(dtype), 0)",
        "old = torch.where(valid, logp_old.detach().to(logp_new.dtype), zero)",
        "old = torch.where(valid, logp_old.to(logp_new.dtype), zero)", "loss"), LOSS_TESTS),
    SpecMutant("ref-not-constant", "no stop_gradient/detach on logp_ref", both(
        "ref = jnp.where(valid, jax.lax.stop_gradient(logp_ref).astype(dtype), 0)",
        "ref = jnp.where(valid, logp_ref.astype(dtype), 0)",
        "ref = torch.where(valid, logp_ref.detach().to(logp_new.dtype), zero)",
        "ref = torch.where(valid, logp_ref.to(logp_new.dtype), zero)", "loss"), LOSS_TESTS),
    SpecMutant("adv-not-constant", "no stop_gradient/detach on the advantages", both(
        "a = jax.lax.stop_gradient(adv).astype(dtype)\n    a = a[:, None] if",
        "a = adv.astype(dtype)\n    a = a[:, None] if",
        "a = adv.detach().to(logp_new.dtype)\n    a = a[:, None] if a.dim() == 1 else torch",
        "a = adv.to(logp_new.dtype)\n    a = a[:, None] if a.dim() == 1 else torch", "loss"),
        LOSS_TESTS),
    # ---- the lab's classic bugs
    SpecMutant("k1-instead-of-k3", "the KL penalty uses k1 = new - ref instead of k3", both(
        "return jnp.exp(d) - d - 1", "return -d",
        "return torch.exp(d) - d - 1", "return -d", "loss"), LOSS_TESTS),
    SpecMutant("unbiased-std", "GRPO divides by the sample std (G - 1), not the SPEC's "
               "population std", both(
                   "jnp.std(rewards, axis=1, keepdims=True)",
                   "jnp.std(rewards, axis=1, keepdims=True, ddof=1)",
                   "rewards.std(dim=1, unbiased=False, keepdim=True)",
                   "rewards.std(dim=1, unbiased=True, keepdim=True)", "advantages"),
               ADV_TESTS),
    SpecMutant("token-mean-over-NT", "the token mean divides by N*T instead of the valid "
               "token count", both(
                   "return jnp.sum(per_token) / jnp.maximum(jnp.sum(w), 1)",
                   "return jnp.sum(per_token) / per_token.size",
                   "return per_token.sum() / w.sum().clamp(min=1)",
                   "return per_token.sum() / per_token.numel()", "loss"), LOSS_TESTS),
    SpecMutant("reinforce-baseline-own-reward", "the REINFORCE baseline is the batch mean "
               "reward, which includes each sample's own reward (biased)", both(
                   "return jnp.mean((rewards[actions] - baseline)[:, None] * score, axis=0)",
                   "return jnp.mean((rewards[actions] - jnp.mean(rewards[actions]))[:, None]"
                   " * score, axis=0)",
                   "return ((rewards[actions] - b)[:, None] * score).mean(dim=0)",
                   "return ((rewards[actions] - rewards[actions].mean())[:, None] * score)"
                   ".mean(dim=0)", "bandit"),
               ("parity_tests/test_lab.py", "parity_tests/test_bandit_truths.py")),
    # ---- every variant
    SpecMutant("rloo-divides-by-G", "RLOO's leave-one-out mean divides by G, not G - 1",
               both("- rewards) / (g - 1)", "- rewards) / g",
                    "- rewards) / (g - 1)", "- rewards) / g", "advantages"), ADV_TESTS),
    SpecMutant("advantages-not-zeroed", "a group with equal rewards keeps its rounding "
               "noise / eps instead of exact zeros", both(
                   "    return jnp.where(all_equal, 0.0, centered)", "    return centered",
                   "return torch.where(all_equal, torch.zeros_like(centered), centered)",
                   "return centered", "advantages"), ADV_TESTS),
    SpecMutant("std-eps-inside-sqrt", "GRPO's eps added to the variance instead of the std",
               both("centered = centered / (jnp.std(rewards, axis=1, keepdims=True) + eps)",
                    "centered = centered / jnp.sqrt(jnp.var(rewards, axis=1, keepdims=True)"
                    " + eps)",
                    "centered = centered / (rewards.std(dim=1, unbiased=False, keepdim=True)"
                    " + eps)",
                    "centered = centered / (rewards.var(dim=1, unbiased=False, keepdim=True)"
                    " + eps).sqrt()", "advantages"), ADV_TESTS),
    SpecMutant("gae-no-lambda", "GAE drops lambda from the recursion (lambda = 1)", both(
        "adv_t = (delta + gamma * lam * next_valid * next_adv) * w_t",
        "adv_t = (delta + gamma * next_valid * next_adv) * w_t",
        "next_adv = (delta + gamma * lam * next_valid * next_adv) * w[:, t]",
        "next_adv = (delta + gamma * next_valid * next_adv) * w[:, t]", "advantages"),
        ADV_TESTS),
    SpecMutant("gae-undiscounted-bootstrap", "GAE's TD error bootstraps V_{t+1} without "
               "gamma", both(
                   "delta = r_t + gamma * next_value * next_valid - v_t",
                   "delta = r_t + next_value * next_valid - v_t",
                   "delta = r[:, t] + gamma * next_value * next_valid - v[:, t]",
                   "delta = r[:, t] + next_value * next_valid - v[:, t]", "advantages"),
               ADV_TESTS),
    SpecMutant("gae-returns-without-values", "the value targets are the advantages, not "
               "A + V", both(
                   "return adv, jnp.where(valid, adv + v, 0)",
                   "return adv, jnp.where(valid, adv, 0)",
                   "return adv, torch.where(valid, adv + v, zero)",
                   "return adv, torch.where(valid, adv, zero)", "advantages"), ADV_TESTS),
    SpecMutant("clip-higher-on-the-low-side", "eps_high widens the lower edge and eps_low "
               "the upper", both(
                   "jnp.clip(ratio, 1 - clip_eps, 1 + eps_high)",
                   "jnp.clip(ratio, 1 - eps_high, 1 + clip_eps)",
                   "torch.clamp(ratio, 1 - clip_eps, 1 + eps_high)",
                   "torch.clamp(ratio, 1 - eps_high, 1 + clip_eps)", "loss"), LOSS_TESTS),
    SpecMutant("optimistic-max", "the surrogate takes the max of the clipped and unclipped "
               "terms (optimistic, not PPO's pessimistic min)", both(
                   "surrogate = jnp.minimum(ratio * a,", "surrogate = jnp.maximum(ratio * a,",
                   "surrogate = torch.minimum(ratio * a,", "surrogate = torch.maximum(ratio * a,",
                   "loss"), LOSS_TESTS),
    SpecMutant("dual-clip-on-positive-advantages", "the dual-clip bound also applied where "
               "A > 0", both(
                   "jnp.where(a < 0, jnp.maximum(surrogate, dual_clip * a), surrogate)",
                   "jnp.maximum(surrogate, dual_clip * a)",
                   "torch.where(a < 0, torch.maximum(surrogate, dual_clip * a), surrogate)",
                   "torch.maximum(surrogate, dual_clip * a)", "loss"), LOSS_TESTS),
    SpecMutant("gspo-sum-not-mean", "GSPO's sequence ratio uses the sum of token "
               "log-ratios, not the length-normalised mean", both(
                   "seq = jnp.sum(log_ratio, axis=1, keepdims=True) / jnp.maximum(\n"
                   "        jnp.sum(w, axis=1, keepdims=True), 1)",
                   "seq = jnp.sum(log_ratio, axis=1, keepdims=True)",
                   "seq = log_ratio.sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True)"
                   ".clamp(min=1)",
                   "seq = log_ratio.sum(dim=1, keepdim=True)", "loss"), LOSS_TESTS),
    SpecMutant("seq-mean-over-T", "the per-sequence mean divides by T, not the row's length",
               both("jnp.sum(per_token, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1)",
                    "jnp.sum(per_token, axis=1) / per_token.shape[1]",
                    "(per_token.sum(dim=1) / w.sum(dim=1).clamp(min=1)).mean()",
                    "(per_token.sum(dim=1) / per_token.shape[1]).mean()", "loss"), LOSS_TESTS),
    SpecMutant("constant-divides-by-tokens", "Dr. GRPO's constant normaliser replaced by the "
               "valid-token count", both(
                   "return jnp.sum(per_token) / (new.shape[0] * (new.shape[1] if max_len is "
                   "None else max_len))",
                   "return jnp.sum(per_token) / jnp.maximum(jnp.sum(w), 1)",
                   "return per_token.sum() / (logp_new.shape[0] * (logp_new.shape[1] if "
                   "max_len is None\n                                                   else "
                   "max_len))",
                   "return per_token.sum() / w.sum().clamp(min=1)", "loss"), LOSS_TESTS),
    SpecMutant("mask-after-exp", "log-ratios exponentiated before masking (masked NaN/inf "
               "leak into the gradient)", both(
                   "new = jnp.where(valid, logp_new, 0)\n    old = jnp.where(valid, "
                   "jax.lax.stop_gradient(logp_old).astype(dtype), 0)",
                   "new = logp_new\n    old = jax.lax.stop_gradient(logp_old).astype(dtype)",
                   "new = torch.where(valid, logp_new, zero)\n    old = torch.where(valid, "
                   "logp_old.detach().to(logp_new.dtype), zero)",
                   "new = logp_new\n    old = logp_old.detach().to(logp_new.dtype)", "loss"),
               LOSS_TESTS),
    SpecMutant("ratio-inverted", "the importance ratio is pi_old / pi_new", both(
        "    log_ratio = new - old\n", "    log_ratio = old - new\n",
        "    log_ratio = new - old\n", "    log_ratio = old - new\n", "loss"), LOSS_TESTS),
    SpecMutant("kl-rewarded", "the KL term enters with the wrong sign (a bonus)", both(
        "per_token = per_token + beta * kl_estimate(new, ref, kl_estimator)",
        "per_token = per_token - beta * kl_estimate(new, ref, kl_estimator)",
        "per_token = per_token + beta * kl_estimate(new, ref, kl_estimator)",
        "per_token = per_token - beta * kl_estimate(new, ref, kl_estimator)", "loss"),
        LOSS_TESTS),
    SpecMutant("k3-wrong-direction", "k3 with d = new - ref (the estimator of the other "
               "KL direction)", both(
                   "d = logp_ref - logp_new\n    return jnp.exp(d)",
                   "d = logp_new - logp_ref\n    return jnp.exp(d)",
                   "d = logp_ref - logp_new\n    return torch.exp(d)",
                   "d = logp_new - logp_ref\n    return torch.exp(d)", "loss"), LOSS_TESTS),
    SpecMutant("clip-metric-ignores-sign", "clip_ratio/low_mean counts every ratio below "
               "the band, whatever the advantage's sign", both(
                   "low = (ratio < 1 - clip_eps) & (a < 0)", "low = ratio < 1 - clip_eps",
                   "low = (ratio < 1 - clip_eps) & (a < 0)", "low = ratio < 1 - clip_eps",
                   "loss"), LOSS_TESTS),
    SpecMutant("value-loss-without-half", "the value loss drops its 1/2", both(
        "return 0.5 * masked_mean(err**2, mask)", "return masked_mean(err**2, mask)",
        "return 0.5 * masked_mean(err**2, mask)", "return masked_mean(err**2, mask)", "loss"),
        LOSS_TESTS),
    SpecMutant("log-softmax-wrong-axis", "log-probs normalised over the wrong axis", both(
        "return picked - jax.nn.logsumexp(logits, axis=-1)",
        "return picked - jax.nn.logsumexp(logits, axis=0)",
        "return picked - torch.logsumexp(logits, dim=-1)",
        "return picked - torch.logsumexp(logits, dim=0)", "loss"), LOSS_TESTS),
    # ---- the second round of variants
    SpecMutant("cispo-weight-not-constant", "CISPO's importance weight carries a gradient "
               "(it is PPO without a clip, not CISPO)", both(
                   "policy = -jax.lax.stop_gradient(jnp.minimum(ratio, 1 + eps_high)) * a * new",
                   "policy = -jnp.minimum(ratio, 1 + eps_high) * a * new",
                   "policy = -torch.clamp(ratio, max=1 + eps_high).detach() * a * new",
                   "policy = -torch.clamp(ratio, max=1 + eps_high) * a * new", "loss"),
               LOSS_TESTS),
    SpecMutant("cispo-uncapped", "CISPO's weight is not truncated", both(
        "jax.lax.stop_gradient(jnp.minimum(ratio, 1 + eps_high))",
        "jax.lax.stop_gradient(ratio)",
        "torch.clamp(ratio, max=1 + eps_high).detach()", "ratio.detach()", "loss"),
        LOSS_TESTS),
    SpecMutant("sapo-temperatures-swapped", "SAPO uses the negative-advantage temperature "
               "where A > 0", both(
                   "tau = jnp.where(a > 0, sapo_pos, sapo_neg)",
                   "tau = jnp.where(a > 0, sapo_neg, sapo_pos)",
                   "tau = torch.where(a > 0, torch.as_tensor(sapo_temperature_pos",
                   "tau = torch.where(a <= 0, torch.as_tensor(sapo_temperature_pos", "loss"),
               LOSS_TESTS),
    SpecMutant("sapo-without-4-over-tau", "SAPO's gate without its 4 / tau scale (slope "
               "tau / 4 at ratio 1, not 1)", both(
                   "policy = -jax.nn.sigmoid(tau * (ratio - 1)) * 4 / tau * a",
                   "policy = -jax.nn.sigmoid(tau * (ratio - 1)) * a",
                   "policy = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a",
                   "policy = -torch.sigmoid(tau * (ratio - 1)) * a", "loss"), LOSS_TESTS),
    SpecMutant("top-entropy-keeps-the-lowest", "top_entropy_quantile keeps the lowest-entropy "
               "tokens (the q quantile, not 1 - q)", both(
                   "threshold = jnp.nanquantile(values, 1 - top_quantile)\n"
                   "    return valid & (entropy >= threshold)",
                   "threshold = jnp.nanquantile(values, top_quantile)\n"
                   "    return valid & (entropy <= threshold)",
                   "threshold = torch.quantile(entropy[valid], 1 - top_quantile)\n"
                   "    return valid & (entropy >= threshold)",
                   "threshold = torch.quantile(entropy[valid], top_quantile)\n"
                   "    return valid & (entropy <= threshold)", "loss"), LOSS_TESTS),
    SpecMutant("entropy-bonus-penalises", "the entropy bonus enters with the wrong sign", both(
        "per_token = per_token - entropy_coef * bonus",
        "per_token = per_token + entropy_coef * bonus",
        "per_token = per_token - entropy_coef * bonus",
        "per_token = per_token + entropy_coef * bonus", "loss"), LOSS_TESTS),
    SpecMutant("tis-weight-inverted", "the TIS weight is exp(sampler - old)", both(
        "policy = policy * jnp.minimum(jnp.exp(gap), tis_cap)",
        "policy = policy * jnp.minimum(jnp.exp(-gap), tis_cap)",
        "policy = policy * torch.clamp(torch.exp(gap), max=tis_cap)",
        "policy = policy * torch.clamp(torch.exp(-gap), max=tis_cap)", "loss"), LOSS_TESTS),
    SpecMutant("tis-not-truncated", "TIS weights are not capped", both(
        "policy = policy * jnp.minimum(jnp.exp(gap), tis_cap)", "policy = policy * jnp.exp(gap)",
        "policy = policy * torch.clamp(torch.exp(gap), max=tis_cap)",
        "policy = policy * torch.exp(gap)", "loss"), LOSS_TESTS),
    SpecMutant("k2-without-half", "k2 = r^2 instead of r^2 / 2", both(
        "return 0.5 * r**2", "return r**2", "return 0.5 * r**2", "return r**2", "loss"),
        LOSS_TESTS),
    SpecMutant("k1-sign", "k1 = ref - new", both(
        "    r = logp_new - logp_ref\n    if kind", "    r = logp_ref - logp_new\n    if kind",
        "    r = logp_new - logp_ref\n    if kind", "    r = logp_ref - logp_new\n    if kind",
        "loss"), LOSS_TESTS),
    SpecMutant("batch-scaling-uses-group-std", "scale_rewards='batch' divides by the group's "
               "std", both(
                   "centered = centered / (jnp.std(rewards) + eps)  # one std over",
                   "centered = centered / (jnp.std(rewards, axis=1, keepdims=True) + eps)  #",
                   "centered = centered / (rewards.std(unbiased=False) + eps)\n",
                   "centered = centered / (rewards.std(dim=1, unbiased=False, keepdim=True) + "
                   "eps)\n", "advantages"), ADV_TESTS),
    SpecMutant("reinforce-pp-group-baseline", "REINFORCE++ subtracts the group's mean, not "
               "the batch's", both(
                   "centered = rewards - jnp.mean(rewards)\n",
                   "centered = rewards - jnp.mean(rewards, axis=-1, keepdims=True)\n",
                   "return (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)",
                   "return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std("
                   "unbiased=False) + eps)", "advantages"), ADV_TESTS),
    SpecMutant("overlong-ramp-from-the-limit", "the overlong penalty's ramp ignores the "
               "buffer start (starts at max_len)", both(
                   "jnp.clip((max_len - buffer - lengths) / buffer, -1.0, 0.0)",
                   "jnp.clip((max_len - lengths) / buffer, -1.0, 0.0)",
                   "torch.clamp((max_len - buffer - lengths) / buffer, -1.0, 0.0)",
                   "torch.clamp((max_len - lengths) / buffer, -1.0, 0.0)", "advantages"),
               ADV_TESTS),
    SpecMutant("mask-truncated-inverted", "mask_truncated drops the completions that ended",
               both("loss_mask = mask * ended[:, None]", "loss_mask = mask * ~ended[:, None]",
                    "loss_mask = mask * ended[:, None].float()",
                    "loss_mask = mask * (~ended)[:, None].float()", "counting"),
               COUNTING_TESTS),
    # ---- the counting task, its trainer and dynamic sampling
    SpecMutant("ds-keeps-zero-variance-first", "dynamic sampling puts the zero-variance "
               "groups first", both(
                   "jnp.argsort(zero_var.astype(jnp.int32), stable=True)",
                   "jnp.argsort((~zero_var).astype(jnp.int32), stable=True)",
                   "torch.argsort(zero_var.to(torch.int8), stable=True)",
                   "torch.argsort((~zero_var).to(torch.int8), stable=True)", "counting"),
               COUNTING_TESTS),
    SpecMutant("counting-target-off-by-one", "the counting target is p + i, not p + i + 1",
               both("steps = jnp.arange(1, completions.shape[1] + 1)",
                    "steps = jnp.arange(completions.shape[1])",
                    "steps = torch.arange(1, completions.shape[1] + 1, device=completions.device)",
                    "steps = torch.arange(completions.shape[1], device=completions.device)",
                    "counting"), COUNTING_TESTS),
    SpecMutant("variable-mask-excludes-end", "the response mask stops before the end token "
               "instead of including it", both(
                   "mask = (jnp.arange(length)[None, :] <= end_idx[:, None])",
                   "mask = (jnp.arange(length)[None, :] < end_idx[:, None])",
                   "mask = (torch.arange(length)[None, :] <= end_idx[:, None])",
                   "mask = (torch.arange(length)[None, :] < end_idx[:, None])", "counting"),
               COUNTING_TESTS),
    SpecMutant("variable-correct-without-end", "a truncated answer (no end token) counts as "
               "correct", both(
                   "== (prompts + 1) % VOCAB_SIZE) & ended & (end_idx >= 1)",
                   "== (prompts + 1) % VOCAB_SIZE) & (end_idx >= 1)",
                   "== (prompts + 1) % VOCAB_SIZE) & ended & (end_idx >= 1)",
                   "== (prompts + 1) % VOCAB_SIZE) & (end_idx >= 1)", "counting"),
               COUNTING_TESTS),
    SpecMutant("sparse-partial-credit", "the sparse task pays partial credit", both(
        'rewards = per_position if task == "counting" else correct.astype(jnp.float32)',
        "rewards = per_position",
        'rewards = per_position if task == "counting" else correct.float()',
        "rewards = per_position", "counting"), COUNTING_TESTS),
    SpecMutant("gae-not-whitened", "PPO's GAE advantages are not centred before whitening",
               both("return jnp.where(mask != 0, (adv - mean) / (std + 1e-8), 0.0), returns",
                    "return jnp.where(mask != 0, adv / (std + 1e-8), 0.0), returns",
                    "return torch.where(mask != 0, (adv - mean) / (std + 1e-8), "
                    "torch.zeros(())), returns",
                    "return torch.where(mask != 0, adv / (std + 1e-8), torch.zeros(())), "
                    "returns", "advantages"), COUNTING_TESTS),
    SpecMutant("entropy-sign", "token entropy computed as sum p log p (negative)", both(
        "return -jnp.sum(jnp.exp(logp) * logp, axis=-1)",
        "return jnp.sum(jnp.exp(logp) * logp, axis=-1)",
        "return -(logp.exp() * logp).sum(-1)", "return (logp.exp() * logp).sum(-1)",
        "counting"), COUNTING_TESTS),
    SpecMutant("reference-is-the-current-policy", "the KL reference moves with the policy "
               "(KL always 0)", (
                   Patch(f"{J}/counting.py", "ref_model = nnx.merge(model_def, runner.ref)",
                         "ref_model = model"),
                   Patch(f"{T}/counting.py",
                         "ref_policy = copy.deepcopy(policy).requires_grad_(False)",
                         "ref_policy = policy")), COUNTING_TESTS),
)


def _check_applies(m: SpecMutant, root: Path = ROOT) -> list[str]:
    """Problems with ``m``'s patches against the checkout at ``root`` (empty: applies)."""
    problems = []
    for p in m.patches:
        text = (root / p.path).read_text()
        count = text.count(p.old)
        if count != 1:
            problems.append(f"{m.name}: {p.path}: the text to replace occurs {count} times, "
                            f"expected once: {p.old[:60]!r}")
    for t in m.tests:
        if not (root / t.split("::")[0]).exists():
            problems.append(f"{m.name}: test file {t} does not exist")
    return problems


def check_all_apply(root: Path = ROOT) -> list[str]:
    """Every problem of every mutant (names unique, patches apply once, tests exist)."""
    names = [m.name for m in MUTANTS]
    dup = sorted({n for n in names if names.count(n) > 1})
    problems = [f"duplicate mutant names: {dup}"] if dup else []
    for m in MUTANTS:
        problems += _check_applies(m, root)
    return problems


def _copy_checkout(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def _pytest(workdir: Path, args: list[str], timeout: float) -> tuple[int, str]:
    env = {**os.environ, "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    # -n 0: one process per mutant (the harness runs mutants in parallel itself, and under
    # xdist a -x stop exits with 2, which would read as an error, not a kill)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
           "-m", "not parity", "--tb=line", *args]
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        return -1, "timeout"


def run_mutant(m: SpecMutant, workdir: Path, timeout: float = 900) -> dict:
    """Apply ``m`` in ``workdir`` (a copy of the checkout), run its tests, restore.

    The tests run twice at most: first against torchref only (``--impl=torch``: both
    implementations carry the mistake, and torch's tests compile nothing, so most kills
    come in seconds), then, if that passed, the whole selection against both."""
    originals = {}
    for p in m.patches:
        path = workdir / p.path
        originals.setdefault(path, path.read_text())
        path.write_text(path.read_text().replace(p.old, p.new, 1))
    t0 = time.perf_counter()
    try:
        code, out = _pytest(workdir, ["--impl=torch", *m.tests], timeout)
        if code == 0:
            code, out = _pytest(workdir, list(m.tests), timeout)
    finally:
        for path, text in originals.items():
            path.write_text(text)
    failed = re.findall(r"^FAILED (\S+)", out, flags=re.M)
    status = {0: "SURVIVED", 1: "killed"}.get(code, "error")
    if status == "error":  # collection errors, a crash, a timeout: not a test's verdict
        failed = [out.strip().splitlines()[-1] if out.strip() else f"exit code {code}"]
    return {"name": m.name, "status": status, "by": failed[0] if failed else "",
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--jobs", type=int, default=2, help="parallel workers (default 2)")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:36s} {m.mistake}")
        return 0
    problems = check_all_apply()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        print(f"unknown mutants {unknown}; see --list", file=sys.stderr)
        return 2
    todo = [by_name[n] for n in args.names] if args.names else list(MUTANTS)
    if args.jobs < 1:
        print("--jobs must be >= 1", file=sys.stderr)
        return 2
    jobs: queue.Queue = queue.Queue()
    for m in todo:
        jobs.put(m)
    results: list[dict] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def worker(workdir: Path) -> None:
        while True:
            try:
                m = jobs.get_nowait()
            except queue.Empty:
                return
            r = run_mutant(m, workdir)
            with lock:
                results.append(r)
                print(f"{r['status']:8s} {r['name']:36s} {r['seconds']:6.1f} s  {r['by']}",
                      flush=True)

    with tempfile.TemporaryDirectory(prefix="spec-mutants-") as tmp:
        dirs = []
        for i in range(min(args.jobs, len(todo))):
            d = Path(tmp) / f"w{i}"
            d.mkdir()
            _copy_checkout(d)
            dirs.append(d)
        threads = [threading.Thread(target=worker, args=(d,)) for d in dirs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    killed = sum(r["status"] == "killed" for r in results)
    print(f"\n{killed} of {len(results)} specification mutants killed "
          f"in {time.perf_counter() - t0:.0f} s")
    bad = [r["name"] for r in results if r["status"] != "killed"]
    if bad:
        print("not killed: " + ", ".join(bad))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
