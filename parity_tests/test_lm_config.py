"""``grpospec.lm``'s configuration and sizes: every check names its field and what was
expected, in one line, and accepts the edges of its range; the derived properties by hand.

Independent truth: the messages and ranges written out here from the documented rules
(``LMConfig``'s and ``ModelSizes``' docstrings), not computed from the code.
"""

from __future__ import annotations

import re

import pytest

from grpospec.lm import LMConfig, ModelSizes, answer_width, prompt_length


def _raises(kind, message, **changes):
    with pytest.raises(kind, match="^" + re.escape(message) + "$"):
        LMConfig(**changes)


@pytest.mark.parametrize("name", ["digits", "completion_length", "pretrain_batch", "steps",
                                  "n_prompts", "group_size", "inner_epochs", "oversample"])
def test_positive_int_fields(name):
    _raises(ValueError, f"{name} must be an int >= 1, got 0", **{name: 0})
    _raises(TypeError, f"{name} must be an int >= 1, got float 2.0", **{name: 2.0})


@pytest.mark.parametrize("name", ["max_scratch", "pretrain_steps"])
def test_non_negative_int_fields(name):
    for bad in (-1, True, 1.0, "2"):
        _raises(ValueError, f"{name} must be an int >= 0, got {bad!r}", **{name: bad})
    assert getattr(LMConfig(**{name: 0}), name) == 0


def test_digits_and_room_for_the_answer():
    _raises(ValueError, "digits must be at most 4, got 5", digits=5)
    assert LMConfig(digits=4, completion_length=6).digits == 4
    _raises(ValueError, "completion_length must leave room for the answer and the end token: "
            "at least 4 for digits=2, got 3", digits=2, completion_length=3)
    assert LMConfig(digits=2, completion_length=4).completion_length == 4
    assert (answer_width(1), answer_width(4), prompt_length(1), prompt_length(3)) == (2, 5, 4, 8)


def test_base_seed_is_an_int_or_none():
    for bad in (True, 1.5, "0"):
        _raises(TypeError, f"base_seed must be an int or None, got {bad!r}", base_seed=bad)
    assert LMConfig(base_seed=None).base_seed is None
    assert LMConfig(base_seed=7).base_seed == 7


def test_corpus_shares():
    for name in ("base_accuracy", "base_near"):
        for bad in (-0.1, 1.1):
            _raises(ValueError, f"{name} must lie in [0, 1], got {bad!r}",
                    **{name: bad, ("base_near" if name == "base_accuracy" else
                                   "base_accuracy"): 0.0})
    _raises(ValueError, "base_accuracy + base_near must be at most 1, got 1.2",
            base_accuracy=0.6, base_near=0.6)
    edge = LMConfig(base_accuracy=0.5, base_near=0.5)
    assert (edge.corpus_accuracy, edge.corpus_near) == (0.5, 0.5)
    assert LMConfig(base_accuracy=1.0, base_near=0.0).corpus_accuracy == 1.0
    assert LMConfig(base_accuracy=0.0, base_near=1.0).corpus_near == 1.0
    # the tasks' defaults (the docstring's): arithmetic 0.1 right and 0.5 near, near 0 and 0.9
    arith, near = LMConfig(task="arithmetic"), LMConfig(task="near")
    assert (arith.corpus_accuracy, arith.corpus_near) == (0.1, 0.5)
    assert (near.corpus_accuracy, near.corpus_near) == (0.0, 0.9)


@pytest.mark.parametrize("name, bad, message", [
    ("learning_rate", 0.0, "learning_rate must be > 0, got 0.0"),
    ("pretrain_lr", -1.0, "pretrain_lr must be > 0, got -1.0"),
    ("clip_eps", 0.0, "clip_eps must lie in (0, 1), got 0.0"),
    ("clip_eps", 1.0, "clip_eps must lie in (0, 1), got 1.0"),
    ("clip_eps_high", 0.0, "clip_eps_high must be > 0 (or None), got 0.0"),
    ("beta", -0.1, "beta must be >= 0, got -0.1"),
    ("vf_coef", -1.0, "vf_coef must be >= 0, got -1.0"),
    ("dual_clip", 1.0, "dual_clip must be > 1 (or None), got 1.0"),
    ("max_grad_norm", 0.0, "max_grad_norm must be > 0 (or None), got 0.0"),
    ("gamma", 1.1, "gamma must lie in [0, 1], got 1.1"),
    ("lam", -0.1, "lam must lie in [0, 1], got -0.1"),
    ("agg", "mean", "agg must be one of ('token', 'seq', 'constant'), got 'mean'"),
    ("estimator", "ppo",
     "estimator must be one of ('grpo', 'dr_grpo', 'rloo', 'gae', 'reinforce_pp'), got 'ppo'"),
    ("task", "sum", "task must be one of ('arithmetic', 'near'), got 'sum'"),
    ("importance_level", "seq",
     "importance_level must be one of ('token', 'sequence'), got 'seq'"),
])
def test_range_checks(name, bad, message):
    _raises(ValueError, message, **{name: bad})


def test_range_edges_are_accepted():
    cfg = LMConfig(beta=0.0, vf_coef=0.0, gamma=0.0, lam=1.0, clip_eps=0.999,
                   clip_eps_high=5.0, dual_clip=1.001, max_grad_norm=1e-9, learning_rate=1e-9)
    assert cfg.gamma == 0.0 and cfg.lam == 1.0
    assert LMConfig(clip_eps_high=0.28).clip_eps_high == 0.28  # DAPO's clip-higher
    assert LMConfig(gamma=1.0, lam=0.0, clip_eps=1e-6, dual_clip=None, max_grad_norm=None,
                    clip_eps_high=None).clip_eps_high is None


def test_rloo_needs_two_completions_per_prompt():
    _raises(ValueError, "group_size must be >= 2 for estimator='rloo', got 1",
            estimator="rloo", group_size=1)
    assert LMConfig(estimator="rloo", group_size=2).group_size == 2
    assert LMConfig(estimator="grpo", group_size=1).group_size == 1


def test_the_variants_and_the_sizes_are_checked_too():
    _raises(ValueError, "loss_mode must be one of ('vanilla', 'cispo', 'sapo', 'gpg'), got "
            "'ppo'", loss_mode="ppo")
    _raises(ValueError, "num_heads (4) must be a multiple of num_kv_heads (3)", num_kv_heads=3)


def test_derived_properties():
    cfg = LMConfig(digits=3, completion_length=9, hidden_size=48, intermediate_size=80,
                   num_layers=3, num_heads=6, num_kv_heads=3, rope_theta=50.0,
                   rms_norm_eps=1e-3, init_std=0.1)
    assert (cfg.prompt_length, cfg.length) == (8, 9)
    assert cfg.model == ModelSizes(hidden_size=48, intermediate_size=80, num_layers=3,
                                   num_heads=6, num_kv_heads=3, rope_theta=50.0,
                                   rms_norm_eps=1e-3, init_std=0.1)
    assert cfg.model.vocab_size == 15 and cfg.model.head_dim == 8
    assert LMConfig(estimator="gae").value_head and not LMConfig(estimator="rloo").value_head
    assert cfg.replace(steps=3).steps == 3 and cfg.steps == 120
    with pytest.raises(ValueError, match="^steps must be an int >= 1, got 0$"):
        cfg.replace(steps=0)  # a replaced config is checked again
    assert "clip_ratio/low_mean" in cfg.metric_names


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": 30}, "hidden_size (30) must be a multiple of num_heads (4)"),
    ({"num_kv_heads": 3}, "num_heads (4) must be a multiple of num_kv_heads (3)"),
    ({"hidden_size": 36, "num_heads": 4, "num_kv_heads": 2},
     "the head size hidden_size / num_heads must be even for rotary embeddings, got 9"),
    ({"rope_theta": 0.0}, "rope_theta must be > 0, got 0.0"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be > 0, got -1e-06"),
    ({"init_std": 0.0}, "init_std must be > 0, got 0.0"),
    ({"vocab_size": 0}, "vocab_size must be an int >= 1, got 0"),
    ({"num_layers": 0}, "num_layers must be an int >= 1, got 0"),
])
def test_model_sizes_checks(changes, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        ModelSizes(**changes)


def test_text_rules_by_hand():
    from grpospec.lm import decode, encode, parse_completion, reference_reward

    assert encode("12+3=#._") == [1, 2, 10, 3, 11, 12, 13, 14] and decode([1, 2, 12]) == "12#"
    with pytest.raises(ValueError, match=r"^text must use only the characters "
                                         r"'0123456789\+=#\._', got \['a', 'b'\]$"):
        encode("7ab")
    assert parse_completion("..12") == (None, 4, False)  # no end token: truncated
    assert parse_completion(".1.2#3") == (12, 5, True)
    assert parse_completion("012#") == (None, 4, True)  # not canonical
    with pytest.raises(ValueError, match=r"^task must be one of \('arithmetic', 'near'\), "
                                         r"got 'sum'$"):
        reference_reward("sum", 1, 2, "3#")


# --------------------------------------------------------------------------- transformers
SIZES = ModelSizes(vocab_size=15, hidden_size=48, intermediate_size=80, num_layers=3,
                   num_heads=6, num_kv_heads=3, rope_theta=50.0, rms_norm_eps=1e-3,
                   init_std=0.1)


def test_hf_config_kwargs_by_hand():
    assert SIZES.hf_config_kwargs() == dict(
        vocab_size=15, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=3, rope_theta=50.0, rms_norm_eps=1e-3,
        initializer_range=0.1, tie_word_embeddings=True, hidden_act="silu",
        use_sliding_window=False, attention_dropout=0.0, max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=12, pad_token_id=None)


def test_sizes_round_trip_through_a_transformers_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(**SIZES.hf_config_kwargs())
    assert ModelSizes.from_hf_config(config) == SIZES
    # head_dim given and consistent is accepted
    with_head_dim = transformers.Qwen2Config(**SIZES.hf_config_kwargs(), head_dim=8)
    assert ModelSizes.from_hf_config(with_head_dim) == SIZES


def _namespace(**changes):
    """A config-like object with Qwen2Config's fields of ``SIZES`` (attributes only)."""
    from types import SimpleNamespace

    fields = dict(vocab_size=15, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=3, rms_norm_eps=1e-3,
                  initializer_range=0.1, tie_word_embeddings=True)
    fields.update(changes)
    return SimpleNamespace(**{k: v for k, v in fields.items() if v is not None})


def test_from_hf_config_reads_the_rope_base_where_transformers_keeps_it():
    """transformers 5 keeps the base in ``rope_parameters``, older ones in ``rope_theta``;
    without either it is 10,000 (Qwen2's default); the rope type defaults to "default"."""
    read = ModelSizes.from_hf_config
    assert read(_namespace(rope_parameters={"rope_type": "default", "rope_theta": 50.0})
                ) == SIZES
    assert read(_namespace(rope_parameters={"rope_theta": 50.0})) == SIZES
    assert read(_namespace(rope_parameters={"rope_type": "default"}, rope_theta=50.0)
                ) == SIZES
    assert read(_namespace(rope_theta=50.0)) == SIZES
    assert read(_namespace()).rope_theta == 10000.0
    # a missing use_sliding_window is no sliding window
    assert read(_namespace(rope_theta=50.0, use_sliding_window=None)) == SIZES


@pytest.mark.parametrize("changes, message", [
    ({"tie_word_embeddings": False}, "the Qwen2 config must tie its embeddings "
     "(tie_word_embeddings=True): the model's head is the embedding"),
    ({"tie_word_embeddings": None}, "the Qwen2 config must tie its embeddings "
     "(tie_word_embeddings=True): the model's head is the embedding"),
    ({"use_sliding_window": True},
     "the Qwen2 config must not use a sliding window (use_sliding_window=False)"),
    ({"head_dim": 16}, "head_dim must be hidden_size / num_attention_heads, got 16"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 50.0}},
     "only default rotary embeddings are supported, got rope_type 'linear'"),
    ({"hidden_size": 50, "head_dim": 8}, "hidden_size (50) must be a multiple of num_heads (6)"),
])
def test_from_hf_config_refuses_what_the_decoder_does_not_implement(changes, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        ModelSizes.from_hf_config(_namespace(**changes))
