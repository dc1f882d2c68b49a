"""The round-two variants in the scale-up: every option reaches the loss, gradient
accumulation stays exact for each, batch statistics, truncation, errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from scaleup.config import ConfigError, TrainConfig
from scaleup.logprobs import completion_logprobs, position_ids
from scaleup.rollout import Rollouts
from scaleup.step import (
    Batch,
    batch_logprobs,
    entropy_keep_mask,
    grpo_step,
    loss_backward,
    shaped_rewards,
    step_advantages,
)
from scaleup.tests.conftest import ParityTask, small_cfg
from scaleup.tests.test_step import _grads, _random_batch
from scaleup.train import make_optimizer
from torchref import (
    group_advantages,
    grpo_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    token_entropy,
)

CPU = torch.device("cpu")

# each loss option with one aggregation (all three aggregations are covered)
LOSS_CASES = [
    ("sequence", "token", dict(importance_level="sequence")),
    ("sequence-seq", "seq", dict(importance_level="sequence")),
    ("dual_clip", "token", dict(dual_clip=1.25)),
    ("cispo", "seq", dict(loss_mode="cispo", clip_eps_high=0.1)),
    ("sapo", "constant", dict(loss_mode="sapo", sapo_temperature_pos=0.5,
                              sapo_temperature_neg=2.0)),
    ("gpg", "token", dict(loss_mode="gpg")),
    ("k1", "seq", dict(kl_estimator="k1")),
    ("k2", "constant", dict(kl_estimator="k2")),
    ("entropy_coef", "token", dict(entropy_coef=0.5)),
    ("top_entropy", "seq", dict(top_entropy_quantile=0.4)),
    ("top_entropy+coef", "token", dict(top_entropy_quantile=0.6, entropy_coef=0.5)),
]


def _nonzero_adapter(model):
    gen = torch.Generator().manual_seed(0)  # not the global RNG: other tests move it
    with torch.no_grad():  # a non-zero adapter, so that every LoRA weight gets a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _off_policy(model, batch):
    batch.logp_old, _ = batch_logprobs(model, batch, 6, 3)
    noise = 0.3 * torch.randn(batch.logp_old.shape, generator=torch.Generator().manual_seed(2))
    batch.logp_old = batch.logp_old + noise
    batch.logp_ref = batch.logp_old - 0.2
    return batch


def _full_batch_loss(model, batch, agg, options, entropy_grad=True):
    """The reference: one ``torchref.grpo_loss`` over the whole batch, untrimmed, in one
    forward, the options passed by their ``grpo_loss`` names (not through the config),
    ``top_entropy_quantile`` applied by ``grpo_loss`` itself."""
    lp, ent = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                  batch.completion_ids, batch.mask, chunk=100, with_entropy=True,
                                  entropy_grad=entropy_grad)
    return grpo_loss(lp, batch.logp_old, batch.logp_ref, batch.adv, batch.mask, 0.2, 0.1, agg,
                     max_len=8, entropy=ent, **options)


@pytest.mark.parametrize("name, agg, options", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_accumulated_gradient_equals_the_full_batch_gradient_for_each_option(
        policy, name, agg, options):
    """Micro-batches of 4 + 2 rows == ``torchref.grpo_loss`` on the full batch with the
    option; and the option changes the loss or gradient (it reaches the loss)."""
    model, _ = policy
    _nonzero_adapter(model)
    batch = _off_policy(model, _random_batch())
    cfg = small_cfg(agg=agg, micro_batch_size=4, beta=0.1, **options)
    model.zero_grad()
    assert cfg.max_new_tokens == 8 and cfg.clip_eps == 0.2
    full = _full_batch_loss(model, batch, agg, options)
    full.backward()
    want = _grads(model)
    model.zero_grad()
    if cfg.top_entropy_quantile < 1:  # as _update: the mask from the no-grad pass
        _, ent_old = batch_logprobs(model, batch, cfg.micro_batch_size, 3, with_entropy=True)
        batch.keep = entropy_keep_mask(ent_old, batch.mask, cfg.top_entropy_quantile)
        share = float(batch.keep.sum() / (batch.mask != 0).sum())
        assert 0 < share < 1
    stats = loss_backward(model, batch, cfg)
    got = _grads(model)
    assert stats["loss"] == pytest.approx(float(full.detach()), abs=1e-6)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6)
    # the option reaches the loss: the default config on the same rows differs
    model.zero_grad()
    default = _full_batch_loss(model, batch, agg, {})
    default.backward()
    base = _grads(model)
    moved = max(float((want[k] - base[k]).abs().max()) for k in want)
    assert abs(float(full.detach()) - float(default.detach())) > 1e-4 or moved > 1e-4, name
    if cfg.entropy_coef:  # the bonus's gradient flows through the entropy itself
        model.zero_grad()
        _full_batch_loss(model, batch, agg, options, entropy_grad=False).backward()
        detached = _grads(model)
        assert max(float((want[k] - detached[k]).abs().max()) for k in want) > 1e-4


def test_entropy_gradient_of_the_chunked_path_equals_the_full_logits(policy):
    """Second implementation: ``token_entropy`` of the ordinary forward's full logits."""
    model, _ = policy
    _nonzero_adapter(model)
    g = torch.Generator().manual_seed(1)
    p_ids, c_ids = torch.randint(0, 256, (3, 5), generator=g), torch.randint(0, 256, (3, 7),
                                                                          generator=g)
    p_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    c_mask = torch.ones(3, 7)
    weights = torch.rand(3, 7, generator=g)
    model.zero_grad()
    _, ent = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk=2,
                                 with_entropy=True, entropy_grad=True)
    (ent * weights).sum().backward()
    got = _grads(model)
    model.zero_grad()
    attn = torch.cat([p_mask, c_mask.long()], 1)
    logits = model(input_ids=torch.cat([p_ids, c_ids], 1), attention_mask=attn,
                   position_ids=position_ids(attn)).logits[:, 4:-1]
    want_ent = token_entropy(logits)
    (want_ent * weights).sum().backward()
    want = _grads(model)
    torch.testing.assert_close(ent.detach(), want_ent.detach(), rtol=0, atol=1e-5)
    assert max(float(w.abs().max()) for w in want.values()) > 0
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6)
    _, no_grad = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk=2,
                                     with_entropy=True)
    assert not no_grad.requires_grad  # only computed with a gradient when asked


def test_entropy_keep_mask_by_hand():
    ent = torch.tensor([[0.1, 0.5, 0.9, 7.0], [0.3, 0.7, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1.]])  # 7.0 is padding, never kept
    # valid values 0.1 0.5 0.9 0.3 0.7 0.2 0.0; the 0.5 quantile is 0.3: keep >= 0.3
    keep = entropy_keep_mask(ent, mask, 0.5)
    assert keep.tolist() == [[False, True, True, False], [True, True, False, False]]
    assert entropy_keep_mask(ent, mask, 1.0).tolist() == (mask != 0).tolist()


@pytest.mark.parametrize("estimator, scale", [
    ("grpo", None), ("grpo", "batch"), ("grpo", "none"), ("dr_grpo", None),
    ("dr_grpo", "group"), ("rloo", None), ("reinforce_pp", None)])
def test_step_advantages_equal_torchref_on_the_batch(estimator, scale):
    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 3, (12,), generator=g).float()
    rewards[4:8] = 1.0  # one group with all rewards equal
    cfg = small_cfg(estimator=estimator, scale_rewards=scale, group_size=4,
                    prompts_per_step=3)
    grouped = rewards.view(3, 4)
    if estimator == "rloo":
        want = rloo_advantages(grouped).view(-1)
    elif estimator == "reinforce_pp":
        want = reinforce_pp_advantages(rewards)
    else:
        default = "group" if estimator == "grpo" else "none"
        want = group_advantages(grouped, scale_rewards=scale or default).view(-1)
    torch.testing.assert_close(step_advantages(rewards, cfg), want)


def test_batch_statistics_by_hand():
    """[1,0,0,1 | 1,1,1,1]: batch mean 0.75, population std sqrt(3)/4."""
    r = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1])
    std = math.sqrt(3) / 4
    batch = step_advantages(r, small_cfg(scale_rewards="batch"))
    torch.testing.assert_close(batch, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
                               / (std + 1e-6))
    rpp = step_advantages(r, small_cfg(estimator="reinforce_pp"))
    torch.testing.assert_close(rpp, (r - 0.75) / (std + 1e-6))
    assert step_advantages(torch.ones(8), small_cfg(estimator="reinforce_pp")).eq(0).all()


def test_overlong_penalty_and_truncation_mask_by_hand():
    cfg = small_cfg(max_new_tokens=8, overlong_buffer=4, overlong_penalty=0.5)
    lengths = torch.tensor([3.0, 4, 6, 8])
    got = shaped_rewards(torch.tensor([1.0, 0, 1, 1]), lengths, cfg)
    torch.testing.assert_close(got, torch.tensor([1.0, 0, 0.75, 0.5]))
    assert torch.equal(shaped_rewards(torch.ones(4), lengths, small_cfg()), torch.ones(4))
    mask = torch.tensor([[1, 1, 0.], [1, 1, 1]])
    roll = Rollouts(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long),
                    torch.zeros(2, 3, dtype=torch.long), mask, torch.tensor([False, True]),
                    ["a", "b"], [None, None], 0.0)
    assert Batch.from_rollouts(roll, torch.ones(2), True).mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert torch.equal(Batch.from_rollouts(roll, torch.ones(2)).mask, mask)


STEP_CASES = [
    dict(estimator="dr_grpo"), dict(estimator="rloo"), dict(estimator="reinforce_pp"),
    dict(scale_rewards="batch"), dict(scale_rewards="none"),
    dict(importance_level="sequence"), dict(dual_clip=1.1), dict(loss_mode="cispo"),
    dict(loss_mode="sapo"), dict(loss_mode="sapo", sapo_temperature_neg=3.0),
    dict(loss_mode="gpg"), dict(kl_estimator="k1"), dict(kl_estimator="k2"),
    dict(entropy_coef=0.1), dict(top_entropy_quantile=0.5), dict(mask_truncated=True),
    dict(overlong_buffer=4), dict(overlong_buffer=4, overlong_penalty=3.0),
]


@pytest.fixture(scope="module")
def frequent_stops(tokenizer):
    """End-of-turn ids plus every 5th byte: completions of 1 to 8 tokens, some truncated."""
    from scaleup.modeling import stop_token_ids
    from scaleup.tiny import tiny_qwen2

    return sorted(set(stop_token_ids(tokenizer, tiny_qwen2(0, tokenizer))) | set(range(0, 256, 5)))


def _step(tokenizer, stops, **options):
    from scaleup.modeling import add_lora
    from scaleup.tiny import tiny_qwen2

    cfg = small_cfg(inner_epochs=2, learning_rate=0.3, max_grad_norm=0.0, beta=0.05,
                    prompts_per_step=3, **options)
    model = add_lora(tiny_qwen2(0, tokenizer), cfg)
    torch.manual_seed(0)
    return grpo_step(model, tokenizer, make_optimizer(model, cfg), ParityTask(), 0, cfg, stops,
                     CPU)


@pytest.fixture(scope="module")
def default_step(tokenizer, frequent_stops):
    return _step(tokenizer, frequent_stops)


@pytest.mark.parametrize("options", STEP_CASES, ids=lambda o: ",".join(f"{k}={v}"
                                                                         for k, v in o.items()))
def test_one_grpo_step_with_each_option_runs_and_changes_the_loss(
        tokenizer, frequent_stops, default_step, options):
    """Same seed, same rollouts: the second inner epoch's loss differs from the default's."""
    m = _step(tokenizer, frequent_stops, **options)
    d = default_step
    assert 0 < d["truncated_frac"] < 1 and 0 < d["mean_reward"] < 1  # mixed rollouts
    assert m["mean_reward"] == d["mean_reward"] and m["len_correct"] == d["len_correct"]
    assert m["first_epoch_max_abs_log_ratio"] == 0.0
    for key in ("loss", "entropy", "kl", "clip_ratio/region_mean"):
        assert math.isfinite(m[key]), key
    assert abs(m["loss"] - d["loss"]) > 1e-6, options


@pytest.mark.parametrize("options, message", [
    (dict(estimator="gae"), "estimator must be one of ('grpo', 'dr_grpo', 'rloo', "
                            "'reinforce_pp'), got 'gae'"),
    (dict(scale_rewards="std"), "scale_rewards must be one of ('group', 'batch', 'none')"),
    (dict(estimator="rloo", scale_rewards="batch"),
     "scale_rewards applies to estimator 'grpo' or 'dr_grpo', got estimator 'rloo'"),
    (dict(estimator="rloo", group_size=1), "group_size must be >= 2 for estimator 'rloo'"),
    (dict(importance_level="seq"), "importance_level must be one of ('token', 'sequence')"),
    (dict(dual_clip=1.0), "dual_clip must be a number in (1, inf], got 1.0"),
    (dict(dual_clip=3.0, loss_mode="gpg"), "dual_clip needs loss_mode 'vanilla', got 'gpg'"),
    (dict(loss_mode="ppo"), "loss_mode must be one of ('vanilla', 'cispo', 'sapo', 'gpg')"),
    (dict(sapo_temperature_pos=0.0), "sapo_temperature_pos must be a number in (0, inf]"),
    (dict(sapo_temperature_neg=-1.0), "sapo_temperature_neg must be a number in (0, inf]"),
    (dict(kl_estimator="k4"), "kl_estimator must be one of ('k1', 'k2', 'k3')"),
    (dict(entropy_coef=-0.1), "entropy_coef must be a number in [0, inf], got -0.1"),
    (dict(top_entropy_quantile=0.0), "top_entropy_quantile must be a number in (0, 1]"),
    (dict(top_entropy_quantile=1.5), "top_entropy_quantile must be a number in (0, 1]"),
    (dict(overlong_buffer=0), "overlong_buffer must be an int >= 1"),
    (dict(overlong_buffer=9, max_new_tokens=8), "overlong_buffer must be <= max_new_tokens (8)"),
    (dict(overlong_buffer=4, overlong_penalty=-1.0), "overlong_penalty must be a finite number"),
    (dict(overlong_penalty=math.nan), "overlong_penalty must be a number in [0, inf]"),
])
def test_bad_variant_options_name_the_option(options, message):
    with pytest.raises(ConfigError) as e:
        small_cfg(**options).validate()
    assert message in str(e.value), str(e.value)


def test_old_configs_with_std_norm_still_load(tmp_path):
    for std_norm, estimator in ((True, "grpo"), (False, "dr_grpo")):
        data = {k: v for k, v in json.loads(json.dumps(small_cfg().__dict__)).items()
                if k != "estimator"}
        data["std_norm"] = std_norm
        path = tmp_path / f"{std_norm}.json"
        path.write_text(json.dumps(data))
        cfg = TrainConfig.from_json(path)
        assert cfg.estimator == estimator and cfg.validate() is cfg
    small_cfg(estimator="rloo").to_json(tmp_path / "new.json")
    assert TrainConfig.from_json(tmp_path / "new.json").estimator == "rloo"
