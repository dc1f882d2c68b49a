"""One GRPO step on the tiny model: gradient accumulation, ratio, LoRA-only updates."""

from __future__ import annotations

import math

import pytest
import torch

from scaleup.logprobs import completion_logprobs
from scaleup.modeling import enable_activation_checkpointing
from scaleup.step import Batch, batch_logprobs, grpo_step, loss_backward, micro_batch_weight
from scaleup.tests.conftest import ParityTask, small_cfg
from scaleup.train import make_optimizer
from torchref import grpo_loss

CPU = torch.device("cpu")


def _random_batch(n=6, p=4, t=7, seed=0):
    """Rows of different prompt padding and response lengths, random advantages."""
    g = torch.Generator().manual_seed(seed)
    p_mask = torch.ones(n, p, dtype=torch.long)
    c_mask = torch.ones(n, t)
    for i in range(n):
        p_mask[i, : i % p] = 0
        c_mask[i, 1 + (3 * i) % t:] = 0
    return Batch(torch.randint(0, 256, (n, p), generator=g), p_mask,
                 torch.randint(0, 256, (n, t), generator=g), c_mask,
                 torch.randn(n, generator=g))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("agg", ["token", "seq", "constant"])
def test_accumulated_gradient_equals_the_full_batch_gradient(policy, agg):
    model, _ = policy
    gen = torch.Generator().manual_seed(0)  # not the global RNG: other tests move it
    with torch.no_grad():  # a non-zero adapter, so that every LoRA weight gets a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    batch = _random_batch()
    cfg = small_cfg(agg=agg, micro_batch_size=4, beta=0.1)
    batch.logp_old, _ = batch_logprobs(model, batch, 6, 3)
    batch.logp_old = batch.logp_old + 0.3 * torch.randn(batch.logp_old.shape,
                                                        generator=torch.Generator().manual_seed(2))
    batch.logp_ref = batch.logp_old - 0.2
    # reference: one grpo_loss over the whole batch, untrimmed, in one forward
    model.zero_grad()
    lp, _ = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                batch.completion_ids, batch.mask, chunk=100)
    full = grpo_loss(lp, batch.logp_old, batch.logp_ref, batch.adv, batch.mask, cfg.clip_eps,
                     cfg.beta, agg, max_len=cfg.max_new_tokens)
    full.backward()
    want = _grads(model)
    model.zero_grad()
    stats = loss_backward(model, batch, cfg)  # micro-batches of 4 + 2 rows
    got = _grads(model)
    assert stats["loss"] == pytest.approx(float(full.detach()), abs=1e-6)
    assert 0 < stats["clip_ratio/region_mean"] < 1
    # Micro-batches sum each gradient entry in another order: float32 rounding of the
    # tensor's scale, not of each entry (an entry can be a near-cancelling sum). Over 12
    # adapter draws x 3 aggregations the largest difference was 18 eps * max|grad|
    # (2.1e-7); the bound allows 64 (a wrong micro-batch weight moves entries by percents).
    eps = torch.finfo(torch.float32).eps
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4,
                                   atol=64 * eps * float(want[name].abs().max()))
    assert any(w.abs().max() > 0 for w in want.values())


def test_micro_batch_weights_by_hand():
    mask = torch.tensor([[1, 1, 1, 1.], [1, 0, 0, 0], [1, 1, 0, 0]])
    assert micro_batch_weight(mask[:2], mask, "token") == pytest.approx(5 / 7)
    assert micro_batch_weight(mask[2:], mask, "token") == pytest.approx(2 / 7)
    assert micro_batch_weight(mask[:2], mask, "seq") == pytest.approx(2 / 3)
    assert micro_batch_weight(mask[:2], mask, "constant") == pytest.approx(2 / 3)


def _lora_and_base(model):
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    return lora, base


@pytest.mark.parametrize("checkpointing", [False, True])
def test_full_step_runs_ratio_is_one_lora_moves_base_does_not(policy, tokenizer, checkpointing):
    model, stops = policy
    cfg = small_cfg(inner_epochs=2, beta=0.05, prompts_per_step=3,
                    gradient_checkpointing=checkpointing)
    if checkpointing:
        enable_activation_checkpointing(model)
    opt = make_optimizer(model, cfg)
    lora0, base0 = _lora_and_base(model)
    torch.manual_seed(0)
    m = grpo_step(model, tokenizer, opt, ParityTask(), 0, cfg, stops, CPU)
    # the first inner epoch is on-policy: logp_new == logp_old exactly
    assert m["first_epoch_max_abs_log_ratio"] == 0.0
    assert 0 < m["mean_reward"] < 1 and m["frac_reward_zero_std"] < 1
    for key in ("entropy", "kl", "loss", "step_time_s", "sample_tokens_per_s", "peak_mem_gb",
                "len_incorrect", "truncated_frac", "clip_ratio/region_mean"):
        assert math.isfinite(m[key]), key
    assert m["kl"] >= 0 and 0 < m["entropy"] <= math.log(len(tokenizer)) + 1e-3
    lora1, base1 = _lora_and_base(model)
    assert all(not torch.equal(lora0[n], lora1[n]) for n in lora0), "a LoRA weight did not move"
    assert all(torch.equal(base0[n], base1[n]) for n in base0), "a base weight moved"


def test_second_inner_epoch_is_off_policy_and_clips(policy, tokenizer):
    """With a large step the second epoch's ratio leaves the clip band."""
    model, stops = policy
    cfg = small_cfg(inner_epochs=2, learning_rate=0.5, max_grad_norm=0.0)
    opt = make_optimizer(model, cfg)
    torch.manual_seed(1)
    m = grpo_step(model, tokenizer, opt, ParityTask(), 0, cfg, stops, CPU)
    assert m["first_epoch_max_abs_log_ratio"] == 0.0
    assert m["clip_ratio/region_mean"] > 0


def test_zero_variance_groups_are_dropped_with_dynamic_sampling(policy, tokenizer):
    class AllWrong(ParityTask):
        def score(self, completion, problem):  # every group has zero variance
            return 0

    model, stops = policy
    cfg = small_cfg(dynamic_sampling=True)
    opt = make_optimizer(model, cfg)
    lora0, _ = _lora_and_base(model)
    m = grpo_step(model, tokenizer, opt, AllWrong(), 0, cfg, stops, CPU)
    assert m["frac_reward_zero_std"] == 1.0 and m["trained_rows"] == 0
    lora1, _ = _lora_and_base(model)
    assert all(torch.equal(lora0[n], lora1[n]) for n in lora0)  # no update at all
    assert math.isnan(m["loss"]) and math.isnan(m["kl"])
