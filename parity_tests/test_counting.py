"""The counting task in both frameworks: same weights -> same logits, same update, both learn."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jaxgrpo
import torchref
from grpospec import END_TOKEN, CountingConfig

V, L = 8, 5


def _all_inputs():
    """Every (prompt, completion) pair: 8 * 8^5 = 262,144 rows."""
    grid = np.array(list(itertools.product(range(V), repeat=L + 1)), dtype=np.int64)
    return grid[:, 0], grid[:, 1:]


def _torch_policy(seed: int, cfg: CountingConfig | None = None) -> torchref.CounterPolicy:
    cfg = cfg or CountingConfig()
    torch.manual_seed(seed)
    policy = torchref.CounterPolicy(cfg.vocab_size, cfg.length, value_head=cfg.value_head)
    with torch.no_grad():  # move away from the near-uniform init so differences would show
        for p in policy.parameters():
            p.normal_(0.0, 1.0)
    return policy


@pytest.mark.parity
def test_weights_convert_both_ways_and_give_the_same_logits_on_every_input():
    prompts, completions = _all_inputs()
    t_policy = _torch_policy(0)
    j_policy = jaxgrpo.load_torch_state_dict(jaxgrpo.CounterPolicy(rngs=nnx.Rngs(1)),
                                             t_policy.state_dict())
    with torch.no_grad():
        t_logits = t_policy(torch.from_numpy(prompts), torch.from_numpy(completions)).numpy()
        t_logp = t_policy.token_logprobs(torch.from_numpy(prompts),
                                         torch.from_numpy(completions)).numpy()
    j_logits = np.asarray(j_policy(jnp.asarray(prompts), jnp.asarray(completions)))
    j_logp = np.asarray(j_policy.token_logprobs(jnp.asarray(prompts), jnp.asarray(completions)))
    np.testing.assert_allclose(j_logits, t_logits, rtol=0, atol=1e-6)
    np.testing.assert_allclose(j_logp, t_logp, rtol=0, atol=2e-6)

    with torch.no_grad():  # the JAX copy must not alias torch's memory
        t_policy.tok_emb.weight.add_(1.0)
    np.testing.assert_allclose(np.asarray(j_policy(jnp.asarray(prompts[:4]),
                                                   jnp.asarray(completions[:4]))),
                               t_logits[:4], atol=1e-6)
    with torch.no_grad():
        t_policy.tok_emb.weight.sub_(1.0)

    back = torchref.CounterPolicy()
    back.load_state_dict(jaxgrpo.torch_state_dict(j_policy))
    for name, tensor in t_policy.state_dict().items():
        np.testing.assert_allclose(back.state_dict()[name].numpy(), tensor.numpy(), atol=1e-6)


def test_bad_state_dict_gets_a_clear_error():
    model = jaxgrpo.CounterPolicy(rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="state_dict must have keys"):
        jaxgrpo.load_torch_state_dict(model, {"head.weight": torch.zeros(8, 8)})
    with pytest.raises(ValueError, match=r"state_dict\['tok_emb.weight'\] must have shape"):
        jaxgrpo.load_torch_state_dict(
            model, {"tok_emb.weight": torch.zeros(4, 8), "pos_emb.weight": torch.zeros(5, 8)})


def test_sampling_draws_from_the_policy(impl):
    """First-token frequencies over 40,000 draws match softmax(logits) within 4 std errors,
    and second tokens follow the conditional of the sampled first token."""
    t_policy = _torch_policy(3)
    n = 40_000
    prompts = np.full(n, 5)
    if impl.name == "jax":
        j_policy = jaxgrpo.load_torch_state_dict(jaxgrpo.CounterPolicy(rngs=nnx.Rngs(0)),
                                                 t_policy.state_dict())
        tokens, logps = jaxgrpo.sample_completions(j_policy, jnp.asarray(prompts),
                                                   jax.random.key(0))
        tokens = np.asarray(tokens)
        np.testing.assert_allclose(
            np.asarray(logps),
            np.asarray(j_policy.token_logprobs(jnp.asarray(prompts), jnp.asarray(tokens))),
            atol=1e-6)
    else:
        tokens = t_policy.sample(torch.from_numpy(prompts),
                                 torch.Generator().manual_seed(0)).numpy()
    assert tokens.shape == (n, L)
    w = t_policy.state_dict()
    probs = lambda prev, t: torch.softmax(w["tok_emb.weight"][prev] + w["pos_emb.weight"][t],  # noqa: E731
                                          -1).numpy()
    p0 = probs(5, 0)
    freq0 = np.bincount(tokens[:, 0], minlength=V) / n
    assert np.all(np.abs(freq0 - p0) < 4 * np.sqrt(p0 * (1 - p0) / n) + 1e-4)
    first = int(np.argmax(p0))
    rows = tokens[tokens[:, 0] == first]
    p1 = probs(first, 1)
    freq1 = np.bincount(rows[:, 1], minlength=V) / len(rows)
    assert np.all(np.abs(freq1 - p1) < 4 * np.sqrt(p1 * (1 - p1) / len(rows)) + 1e-4)


def _jax_copy(t_policy: torchref.CounterPolicy, cfg: CountingConfig) -> jaxgrpo.CounterPolicy:
    model = jaxgrpo.CounterPolicy(cfg.vocab_size, cfg.length, value_head=cfg.value_head,
                                  rngs=nnx.Rngs(0))
    return jaxgrpo.load_torch_state_dict(model, t_policy.state_dict())


def _rollouts(t_policy, cfg: CountingConfig, seed: int = 1):
    """Rollouts sampled once (by torch), with a correct answer planted in every other
    group so that most groups carry signal."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, V, (cfg.n_prompts,), generator=gen).repeat_interleave(
        cfg.group_size)
    completions = t_policy.sample(prompts, gen)
    first = prompts[:: 2 * cfg.group_size]
    if cfg.task == "variable":
        completions[:: 2 * cfg.group_size, 0] = (first + 1) % V
        completions[:: 2 * cfg.group_size, 1] = END_TOKEN
    else:
        completions[:: 2 * cfg.group_size] = (first[:, None] + torch.arange(1, cfg.length + 1)) % V
    return prompts, completions


VARIANTS = {
    "default": CountingConfig(),
    "seq-drgrpo-cliphigher": CountingConfig(agg="seq", estimator="dr_grpo", clip_eps=0.1,
                                            clip_eps_high=0.3, beta=0.1, learning_rate=0.2,
                                            inner_epochs=3),
    "rloo-dualclip": CountingConfig(estimator="rloo", dual_clip=2.0, learning_rate=0.3,
                                    clip_eps=0.1),
    "gspo-constant": CountingConfig(importance_level="sequence", agg="constant",
                                    learning_rate=0.3, clip_eps=0.05),
    "ppo-gae": CountingConfig(estimator="gae", lam=0.9, gamma=0.95, vf_coef=0.7,
                              learning_rate=0.2),
    "sparse": CountingConfig(task="sparse", learning_rate=0.2),
    "variable-seq": CountingConfig(task="variable", agg="seq", learning_rate=0.2),
    "cispo-k2-batchscale": CountingConfig(loss_mode="cispo", kl_estimator="k2", beta=0.1,
                                          scale_rewards="batch", learning_rate=0.2),
    "sapo-k1-entropy": CountingConfig(loss_mode="sapo", kl_estimator="k1", beta=0.05,
                                      entropy_coef=0.05, top_entropy_quantile=0.5,
                                      learning_rate=0.2),
    "gpg-reinforcepp": CountingConfig(loss_mode="gpg", estimator="reinforce_pp",
                                      learning_rate=0.2),
    "variable-overlong-masktrunc": CountingConfig(task="variable", mask_truncated=True,
                                                  overlong_buffer=3, overlong_penalty=0.5,
                                                  learning_rate=0.2),
}


@pytest.mark.parity
@pytest.mark.parametrize("name", list(VARIANTS))
def test_one_grpo_update_leaves_the_same_parameters(name):
    """Identical weights and rollouts (sampled once, fed to both): reward, advantages,
    ``inner_epochs`` Adam steps. Parameters agree within 1e-5 (float32 throughout), and so
    do the update's metrics (within 1e-5) and the rollouts' metrics."""
    import optax

    cfg = VARIANTS[name]
    t_policy = _torch_policy(7, cfg)
    t_ref = _torch_policy(8, cfg).requires_grad_(False)
    j_policy, j_ref = _jax_copy(t_policy, cfg), _jax_copy(t_ref, cfg)
    prompts, completions = _rollouts(t_policy, cfg)

    t_opt = torch.optim.Adam(t_policy.parameters(), lr=cfg.learning_rate)
    j_opt = nnx.Optimizer(j_policy, optax.adam(cfg.learning_rate), wrt=nnx.Param)
    before = {k: v.clone() for k, v in t_policy.state_dict().items()}
    t_metrics = torchref.grpo_update(t_policy, t_ref, t_opt, prompts, completions, cfg)
    j_prompts, j_completions = jnp.asarray(prompts.numpy()), jnp.asarray(completions.numpy())
    j_metrics = jaxgrpo.grpo_update(j_policy, j_opt, j_ref, j_prompts, j_completions, cfg)
    after_jax = jaxgrpo.torch_state_dict(j_policy)
    for key, tensor in t_policy.state_dict().items():
        assert not torch.allclose(tensor, before[key])  # the update did something
        np.testing.assert_allclose(after_jax[key].numpy(), tensor.numpy(), atol=1e-5,
                                   err_msg=key)
    assert set(j_metrics) == set(t_metrics)
    # An advantage that is 0 in exact arithmetic can come out as 0 in one framework and
    # -3e-9 in the other (RLOO of tied rewards): such a sequence's tokens may count as
    # clipped in one of them only, so the clip shares may differ by their share.
    from torchref.counting import _advantages

    rewards, mask, _, lengths = torchref.task_reward(cfg.task, prompts, completions)
    adv = _advantages(cfg, t_policy, prompts, completions, rewards, mask, lengths)[0]
    adv = adv[:, None].expand_as(mask) if adv.dim() == 1 else adv
    tied_share = float(((adv.abs() < 1e-6) & (mask != 0)).sum() / mask.sum())
    for k in t_metrics:
        atol = 1e-5 + (tied_share if k.startswith(("clip_ratio", "pg_clipfrac")) else 0)
        np.testing.assert_allclose(float(j_metrics[k]), float(t_metrics[k]), atol=atol,
                                   err_msg=k)
    if name.startswith("seq") or name.startswith("rloo"):
        # the later epochs are off-policy: clipping acted
        assert t_metrics["clip_ratio/region_mean"] > 0

    kept = torch.arange(cfg.n_prompts)
    t_roll = torchref.rollout_metrics(cfg, prompts, completions, kept)
    j_roll = jaxgrpo.rollout_metrics(cfg, j_prompts, j_completions, jnp.arange(cfg.n_prompts))
    assert set(t_roll) | set(t_metrics) == set(cfg.metric_names)
    for k in t_roll:
        np.testing.assert_allclose(float(j_roll[k]), float(t_roll[k]), atol=1e-5, err_msg=k)


def test_task_rewards_by_hand():
    prompts = np.array([3, 3, 6, 0])
    # variable task: answer (p + 1) % 8, then anything, then the end token 8
    completions = np.array([
        [4, 8, 1, 2, 3, 4, 5, 6],  # right answer, ends at index 1: correct, length 2
        [4, 1, 2, 8, 8, 0, 0, 0],  # right answer, ends at index 3: correct, length 4
        [7, 7, 7, 7, 7, 7, 7, 7],  # right answer, never ends: truncated, wrong, length 8
        [8, 1, 1, 1, 1, 1, 1, 1],  # ends at once, no answer: wrong, length 1
    ])
    for impl, arr in (("jax", jnp.asarray), ("torch", torch.from_numpy)):
        mod = jaxgrpo if impl == "jax" else torchref
        rewards, mask, correct, lengths = mod.task_reward("variable", arr(prompts),
                                                          arr(completions))
        np.testing.assert_array_equal(np.asarray(rewards), [1, 1, 0, 0])
        np.testing.assert_array_equal(np.asarray(correct), [True, True, False, False])
        np.testing.assert_array_equal(np.asarray(lengths), [2, 4, 8, 1])
        np.testing.assert_array_equal(np.asarray(mask).sum(1), [2, 4, 8, 1])
        # counting and sparse: 5 tokens, partial vs all-or-nothing credit
        p = np.array([2, 2])
        c = np.array([[3, 4, 5, 6, 7], [3, 4, 0, 6, 7]])
        r_count = mod.task_reward("counting", arr(p), arr(c))[0]
        r_sparse = mod.task_reward("sparse", arr(p), arr(c))[0]
        np.testing.assert_allclose(np.asarray(r_count), [1.0, 0.8])
        np.testing.assert_allclose(np.asarray(r_sparse), [1.0, 0.0])


def test_jax_learns_on_several_seeds_at_once():
    metrics = jaxgrpo.train_counting(seeds=[11, 12, 13, 14])
    reward = metrics["mean_reward"]
    assert reward.shape == (4, 80)
    assert np.all(reward[:, 0] < 0.3)
    assert np.all(reward[:, -5:].mean(axis=1) > 0.7), reward[:, -5:].mean(axis=1)
    assert set(metrics) == set(CountingConfig().metric_names)
    for k in metrics:
        assert metrics[k].shape == (4, 80), k
        if k not in ("len_correct", "len_incorrect"):
            assert np.all(np.isfinite(metrics[k])), k
    # the per-class lengths are undefined (NaN) exactly when the class is empty
    np.testing.assert_array_equal(np.isnan(metrics["len_correct"]), metrics["correct_frac"] == 0)
    np.testing.assert_array_equal(np.isnan(metrics["len_incorrect"]),
                                  metrics["correct_frac"] == 1)


@pytest.mark.parametrize("seed", [11, 12])
def test_torch_learns_on_several_seeds(seed):
    reward = torchref.train_counting(seed=seed)["mean_reward"]
    assert reward[0] < 0.3 and reward[-5:].mean() > 0.7


def test_vmapped_seed_equals_the_single_run():
    """A seed run in a vmapped batch is the run of that seed alone, also for a seed above
    2^31 (seeds are uint32 keys), for the steps asked."""
    big = 2**31 + 5
    single = jaxgrpo.train_counting(seed=big, steps=20)
    batched = jaxgrpo.train_counting(seed=0, steps=20, seeds=[9, big])
    assert single["mean_reward"].shape == (20,) and batched["mean_reward"].shape == (2, 20)
    for k in single:
        np.testing.assert_allclose(batched[k][1], single[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert not np.allclose(batched["mean_reward"][0], single["mean_reward"])


def test_bad_training_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="agg must be one of"):
        jaxgrpo.train_counting(agg="mean")
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        torchref.train_counting(steps=0)
    with pytest.raises(ValueError, match="seeds must be an int >= 1"):
        jaxgrpo.train_counting(seeds=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        jaxgrpo.train_counting(learning_rat=0.1)
