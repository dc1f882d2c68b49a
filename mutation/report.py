"""The mutation score per module, from mutmut's results (``mutants/**/*.py.meta``) and
the committed record of earlier runs' verdicts (``mutation/ledger.json``, see
``mutation/ledger.py``).

    .venv/bin/mutmut run                      # all mutants (README, "Mutation testing")
    .venv/bin/python -m mutation.report       # the table, then the surviving mutants
    .venv/bin/python -m mutation.report --record   # first add mutants/'s verdicts to the ledger
    .venv/bin/python -m mutation.report --check-equivalent   # EQUIVALENT's names still right

Per module: the mutants mutmut made, how many the suite killed (a failing test, or a
timeout: a mutant that makes the suite hang is caught), how many survived, how many no
test reaches, how many were not run yet, the mutants named equivalent in
``EQUIVALENT`` (a mutation that cannot change any result, with the reason), and the
score ``killed / (total - equivalent - not run)``. Then every survivor that is not named
equivalent: the known gaps (``mutmut show NAME`` prints its diff). A mutant not judged in
``mutants/`` counts with its ledger verdict while its function's source is unchanged; on
a fresh clone (no ``mutants/``) the table is the ledger's alone.
"""

from __future__ import annotations

import argparse
import json
import signal
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from mutation import ledger

#: Mutants that cannot change any result: ``name: (the lines it changes, the reason)``
#: (checked by reading the diff: ``mutmut show NAME``). The lines are those of
#: ``mutated_lines``: ``--check-equivalent`` reports every name that mutmut, after an edit
#: of its function, now gives to another mutant (or no longer makes).
EQUIVALENT: dict[str, tuple[str, str]] = {
    'jaxgrpo.counting.x_token_entropy__mutmut_5': (
        'logp = jax.nn.log_softmax(logits.astype(jnp.float32), )',
        "jax.nn.log_softmax's axis defaults to -1: the same log-probs"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_125': (
        'ent = jax.lax.stop_gradient(jnp.where(valid, entropy, 1).astype(dtype))',
        "a masked position's entropy: high_entropy_mask sets it to nan before the quantile "
        "and ANDs its result with valid, the same keep mask"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_171': (
        'bonus = jnp.where(valid, entropy, 1).astype(dtype)',
        "a masked position's entropy bonus: per_token is masked again by where(valid) "
        "before any sum, value and gradient"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_67': (
        'surrogate = jnp.where(a <= 0, jnp.maximum(surrogate, dual_clip * a), surrogate)',
        'the dual-clip bound also at A = 0, where the surrogate and the bound are both 0 '
        'and neither depends on logp_new: the same value and a zero gradient'),
    'jaxgrpo.counting.x_sample_completions__mutmut_31': (
        ')',
        "the sampling scan's unroll=True dropped: a compilation choice, the same tokens from "
        "the same uniforms in the same order"),
    'scaleup.logprobs.x_completion_hidden__mutmut_36': (
        ').last_hidden_state',
        "use_cache left to the config (True for Qwen2): the decoder also returns a KV cache, "
        "which is dropped: the same hidden states (memory only)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_32': (
        'use_cache=None).last_hidden_state',
        "use_cache left to the config (True for Qwen2): the decoder also returns a KV cache, "
        "which is dropped: the same hidden states (memory only)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_30': (
        'hidden = decoder(input_ids=ids, attention_mask=None, position_ids=position_ids(attn),',
        "no mask in the single forward: transformers 5 then reads the sequences from the "
        "position ids (a position 0 starts one), so each left-padding position is a sequence "
        "of its own and the real tokens attend to none of it; after a completion's end the "
        "positions repeat and those (masked) positions attend to the padding: every valid "
        "position's value the same (the whole scale-up suite passes)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_34': (
        'hidden = decoder(input_ids=ids, position_ids=position_ids(attn),',
        "no mask in the single forward: as mutmut_30 (transformers 5 reads the left padding "
        "from the position ids; only masked positions change)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_6': (
        'attn = torch.cat([prompt_mask, completion_mask.to(None)], dim=1)',
        "the float 0/1 completion mask left float: the concatenated mask is then float 0/1, "
        "which transformers reads as the same mask, and position_ids casts it to long"),
    'jaxgrpo.loss.x_grpo_loss__mutmut_193': (
        'None if max_len is None else int(max_len), use_kl=b is not None or b != 0,',
        'use_kl also at beta 0: the jitted loss then replaces the reference by new itself '
        '(its guard for a traced beta of 0), a KL of exactly 0 with a zero gradient'),
    'jaxgrpo.counting.x_rollout_stats__mutmut_34': (
        '"frac_reward_zero_std": jnp.mean(zero_var, ),',
        'jnp.mean of a bool array is float32 in JAX 0.10, also under x64 '
        '(test_rollout_stats_ds_dropped_is_float32 checks every metric under x64)'),
    'scaleup.step.x_loss_backward__mutmut_91': (
        'adv, bonus = mb.adv, (ent if (entropy_grad) or True else None)',
        "the entropies handed to grpo_loss also at entropy_coef 0, where it skips the bonus "
        "(a zero-weight term is skipped, not multiplied); the top-entropy mask is keep's, "
        "not grpo_loss's"),
    'scaleup.step.x_loss_backward__mutmut_165': (
        'cfg.clip_eps_high, cfg.importance_level, )',
        "clip_metrics' dual_clip adds only pg_clipfrac_lower, which the step does not log "
        "(CLIP_KEYS)"),
    'scaleup.step.x_loss_backward__mutmut_250': (
        '[sums["max_abs_log_ratio"], sums[MISMATCH_KEYS[1]]], "XXmaxXX", device=total.device)',
        'all_reduce takes every op but "sum" as the max'),
    'scaleup.step.x_loss_backward__mutmut_263': (
        'sums[key] = float("NAN")',
        "float() reads 'NAN' as 'nan' (case-insensitive)"),
    'scaleup.step.x__update__mutmut_70': (
        'first_ratio = float("NAN") if reuse else stats["max_abs_log_ratio"]',
        "float() reads 'NAN' as 'nan' (case-insensitive)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_38': (
        'use_cache=True).last_hidden_state',
        'the decoder also returns a KV cache, which is dropped: the same hidden states '
        '(memory only)'),
    'jaxgrpo.counting.x_select_groups__mutmut_16': (
        'return jnp.argsort(zero_var.astype(jnp.int32), )[:n_keep]',
        "jnp.argsort's stable defaults to True (JAX 0.10): the same order"),
    'jaxgrpo.counting.x_select_groups__mutmut_17': (
        'return jnp.argsort(zero_var.astype(None), stable=True)[:n_keep]',
        'the 0/1 keys as float32 instead of int32: the same stable order'),
    'jaxgrpo.advantages.x__gae__mutmut_14': (
        'r = jnp.where(valid, rewards, 1).astype(values.dtype)',
        "a masked position's reward: its step's advantage is multiplied by w_t = 0, and"
        ' the step before reads it only through next_valid = 0'),
    'torchref.advantages.x_gae_advantages__mutmut_34': (
        'zero = torch.zeros((), )',
        "a 0-dim float zero takes the dimensioned operand's float dtype in torch.where "
        '(type promotion): the same values in every float dtype'),
    'scaleup.evaluate.x_evaluate_run__mutmut_184': (
        'write_atomic(out / "eval.json", json.dumps(result, indent=3) + "\\n")',
        "eval.json's indentation: the same JSON value, layout only"),
    'scaleup.distributed.x_all_gather_cat__mutmut_4': (
        'n = torch.tensor([x.numel()], dtype=None, device=x.device)',
        'a tensor of a Python int is int64 by default: the same count tensor'),
    'scaleup.tasks.x_extract_boxed__mutmut_45': (
        'start = text.find("\\\\boxed{", start + 2)',
        'the next \\boxed{ cannot start at start + 1 (that character is b, not a '
        'backslash): the same occurrences'),
    'torchref.bandit.x_reinforce_gradient__mutmut_60': (
        'score = torch.nn.functional.one_hot(actions, theta.shape[0]).to(None) - pi  # (n, K)',
        "one_hot's int64 minus pi (softmax of theta, in theta's float dtype) promotes to "
        "pi's dtype: the same score"),
    'jaxgrpo.loss.x_grpo_loss__mutmut_125': (
        'zeros = None',
        'the placeholders of an absent entropy and logp_sampler: the jitted loss reads '
        'entropy only for the bonus or the top-entropy mask and logp_sampler only with '
        'tis_cap (check_grpo_loss demands them then); jit takes None as an empty argument'),
    'jaxgrpo.loss.x_grpo_loss__mutmut_180': (
        'zeros if (logp_sampler is None) and False else logp_sampler, clip_eps, beta, agg, '
        'eps_high,',
        'logp_sampler is None only without tis_cap, when the jitted loss does not read it '
        '(check_grpo_loss demands it otherwise); jit takes None as an empty argument'),
    'jaxgrpo.loss.x_grpo_loss__mutmut_205': (
        'use_tis=tis_cap is not None, tis_cap=1.0 if (tis_cap is None) and False else '
        'tis_cap)',
        'the placeholder cap is read only with use_tis, False exactly when tis_cap is None; '
        'jit takes None as an empty argument'),
    'jaxgrpo.counting.x_grpo_update__mutmut_52': (
        'logp_new = jnp.take_along_axis(logp_new, completions[..., None], axis=-1)[..., 1]',
        'index 1 of a size-1 axis: JAX clamps an out-of-range index to the last element, '
        'the same element 0'),
    'jaxgrpo.counting.x_grpo_update__mutmut_119': (
        '_update_epoch, state, None, length=cfg.inner_epochs, )',
        "scan's unroll is a compilation choice: the same inner epochs in the same order"),
    'jaxgrpo.counting.x_steps_runner__mutmut_4': (
        'steps = jnp.asarray(start_step, None) + jnp.arange(n_steps, dtype=jnp.int32)',
        "the steps' integer dtype (int64 under x64): they only number the progress "
        "reports (report_progress(step + 1)), the same values"),
    'torchref.loss.x__masked_log_ratio__mutmut_3': (
        'zero = torch.zeros((), dtype=None, device=logp_new.device)',
        "a 0-dim float zero takes the dimensioned operand's float dtype in torch.where "
        "(type promotion): the same values in every float dtype"),
    'torchref.counting.x_rollout_stats__mutmut_19': (
        'nan = torch.tensor(float("NAN"))',
        "float() reads 'NAN' as 'nan' (case-insensitive)"),
    'scaleup.step.x_loss_backward__mutmut_127': (
        'w = micro_batch_weight(mb.mask, total, cfg.agg, normaliser, None)',
        "as mutant 132: the placeholder row is all masked, so its loss is exactly 0 with a "
        "zero gradient in every aggregation; its weight multiplies 0, and the normaliser, "
        "given, keeps the flag"),
    'scaleup.step.x__update__mutmut_52': (
        'optimizer.zero_grad(set_to_none=None)',
        "the zero_grad before each epoch's backward zeroes instead of freeing: every "
        "trainable (LoRA) parameter is in the loss's graph, so backward then writes each "
        "one's gradient onto zeros, the same values AdamW would get"),
    'jaxgrpo.loss.x_selective_log_softmax__mutmut_13': (
        'picked = jnp.take_along_axis(logits, index[..., None], )[..., 0]',
        "jnp.take_along_axis's axis defaults to -1 (JAX 0.10): the same gather"),
    'jaxgrpo.loss.x_value_loss__mutmut_21': (
        'err = jnp.where(mask != 0, values - jax.lax.stop_gradient(returns), 1)',
        "a masked position's error: masked_mean zeroes it again before the sum (value and"
        " gradient)"),
    'torchref.loss.x_value_loss__mutmut_24': (
        'err = torch.where(valid, values - returns.detach(), torch.zeros((), ))',
        "a 0-dim float zero takes the dimensioned operand's float dtype in torch.where "
        "(type promotion): the same values in every float dtype"),
    'grpospec.checks.x_check_rloo_rewards__mutmut_5': (
        'check_group_rewards(rewards_shape, 1.0)',
        'the eps handed to the shared shape check, which RLOO has none of: 0.0 and 1.0 '
        'both pass it'),
    'scaleup.evaluate.x_held_out_problems__mutmut_42': (
        'return task.sample(n, cfg.seed, None), {"rule": "none: the digit task has one prompt"}',
        'DigitTask.sample ignores step and stream: n copies of its one prompt'),
    'scaleup.evaluate.x_evaluate_run__mutmut_181': (
        'write_atomic(out / "eval.json", json.dumps(result, indent=None) + "\\n")',
        "eval.json's indentation: the same JSON value, layout only"),
    'scaleup.tasks.x_extract_answer__mutmut_12': (
        'return numbers[-1].rstrip("XX,XX")',
        '_LAST_NUMBER matches signs, digits, commas and a point only: no X to strip'),
    'scaleup.tasks.x_answers_match__mutmut_6': (
        'gold = parse(reference, )',
        "every reference is a plain number (str(int), or parse_gsm8k_answer's, which "
        "load_gsm8k requires), which math-verify's default configs parse as the "
        "expression config alone does (checked on integers, negatives, decimals, "
        "fractions, 1,000)"),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_15': (
        'rng = _rng(seed, 2, 0)',
        'another fixed stream of the run seed: other problems, as seeded, distinct and '
        'held out (training draws only problems outside the split; which held-out ones is'
        ' not a result the spec fixes)'),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_30': (
        'if len(seen) <= n and self.space() <= 4_000_000:  # a small space: take all of it',
        'with n problems already drawn the block adds rest[:n - n], nothing (it only '
        'costs the enumeration)'),
    'jaxgrpo.loss.x__grpo_loss__mutmut_187': (
        'ref = jnp.where(valid, jax.lax.stop_gradient(logp_ref).astype(dtype), 1)',
        'the fill value of masked positions of logp_ref: their (finite) KL term is masked '
        'again by where(valid) before use, value and gradient'),
    'scaleup.step.x_loss_backward__mutmut_215': (
        'if k >= 1:',
        'with one process all_reduce is the identity: the statistics are the same'),
    'torchref.advantages.x_gae_advantages__mutmut_32': (
        'zero = torch.zeros((), dtype=None)',
        "a 0-dim zero never sets the dtype of where() beside a dimensioned float tensor "
        "(the values' dtype wins): the same tensors"),
    'scaleup.step.x_loss_backward__mutmut_251': (
        '[sums["max_abs_log_ratio"], sums[MISMATCH_KEYS[1]]], "MAX", device=total.device)',
        "all_reduce sums only for op == 'sum': any other op, 'MAX' too, is the max"),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_29': (
        'if len(seen) < n or self.space() <= 4_000_000:  # a small space: take all of it',
        'with n problems already drawn the block adds rest[:n - n], nothing; fewer than n '
        'distinct ones from 50 n draws of a space over 4e6 (where or would enumerate it) '
        'does not occur for any n a run can ask'),
    'torchref.counting.x_train_counting__mutmut_42': (
        'prompts = torch.randint(VOCAB_SIZE, (pool,), generator=gen)',
        "torch.randint(high, size) is randint(0, high, size): the same draws from the "
        "same generator"),
    'scaleup.step.x_loss_backward__mutmut_258': (
        'sums["kl"] = float("NAN")',
        "float() reads 'NAN' as 'nan' (case-insensitive)"),
    'scaleup.step.x_grpo_step__mutmut_133': (
        '"len_correct": len_correct / n_correct if n_correct else float("NAN"),',
        "float() reads 'NAN' as 'nan' (case-insensitive)"),
    'scaleup.tasks.x_held_out__mutmut_11': (
        'return int.from_bytes(digest, ) % EVAL_SHARE == 0',
        "int.from_bytes' byteorder defaults to 'big' since Python 3.11 (the project's floor)"),
    'scaleup.step.x_loss_backward__mutmut_132': (
        'w = micro_batch_weight(mb.mask, total, cfg.agg, normaliser, )',
        "the placeholder row (a rank without rows) is all masked, so its loss is exactly 0 "
        "with a zero gradient in every aggregation: its weight (0, or 1 row / normaliser "
        "without the flag) multiplies 0; the normaliser keeps the flag"),
    'scaleup.tasks.x_load_gsm8k__mutmut_9': (
        'with path.open(encoding="UTF-8") as f:',
        "encoding 'UTF-8' is 'utf-8'"),
    'scaleup.tasks.x_question_key__mutmut_3': (
        'return " ".join(prompt.upper().split())',
        'upper() instead of lower(): the same question keys compare equal (both sides '
        'normalised alike)'),
    'jaxgrpo.advantages.x__gae__mutmut_23': (
        'v = jnp.where(valid, jax.lax.stop_gradient(values), 1)',
        'the value at a masked position (1 for 0) never counts: it enters only times '
        'next_valid = 0, times w_t = 0, or where(valid)'),
    'scaleup.tasks.x_question_key__mutmut_2': (
        'return "XX XX".join(prompt.lower().split())',
        "words joined by 'XX XX' instead of ' ': still one key per word list (the words hold "
        'no space), keys only compared'),
    'scaleup.tasks.x_parse_gsm8k_answer__mutmut_15': (
        'return str(value.numerator) if (value.denominator == 1) and False else str(value)',
        'str(Fraction(n, 1)) is already str(n): the integer branch and the fraction branch '
        'give the same text'),
    'scaleup.tasks.xǁDatasetTaskǁsample__mutmut_16': (
        'idx = _rng(seed, stream, step).choice(len(self.problems), size=n, replace=None)',
        'replace=None is falsy: the same sampling without replacement'),
    'torchref.loss.x_grpo_loss__mutmut_163': (
        'tau = torch.where(a >= 0, torch.as_tensor(sapo_temperature_pos, dtype=a.dtype),',
        "SAPO's temperature at A = 0 (> vs >=): the term is multiplied by A = 0, value and "
        'gradient'),
    'jaxgrpo.loss.x__grpo_loss__mutmut_146': (
        'gap = jax.lax.stop_gradient(jnp.where(valid, logp_old, 1).astype(dtype)',
        'the fill value of masked positions of the TIS gap: they are masked again before use'),
    'torchref.counting.x_rollout_stats__mutmut_32': (
        '"len_correct": (lengths * c).sum() / c.sum() if (c.sum() > 0) or True else nan,',
        'with no correct completion the float division is 0 / 0, already a nan tensor'),
    'torchref.counting.x_train_counting__mutmut_24': (
        'ref_policy = copy.deepcopy(policy).requires_grad_(True)',
        "the reference's log-probs are taken under torch.no_grad() and its parameters are "
        'in no optimizer: no gradient ever reaches them'),
    'jaxgrpo.loss.x__grpo_loss__mutmut_14': (
        'new = jnp.where(valid, logp_new, 1)',
        "the fill value of masked positions of logp_new (1 for 0, both finite): it reaches "
        "only per-token terms the final where(valid) zeroes, value and gradient"),
    'torchref.loss.x_grpo_loss__mutmut_68': (
        'zero = torch.zeros((), dtype=None, device=logp_new.device)',
        "a float32 0-dim zero in torch.where with a dimensioned tensor takes that tensor's "
        'dtype (0-dim tensors do not promote)'),
    'torchref.loss.x_grpo_loss__mutmut_198': (
        'keep = high_entropy_mask(ent, valid, top_entropy_quantile).to(None)',
        'the top-entropy mask stays bool; multiplying by a bool mask promotes to the other '
        "operand's dtype: the same values"),
    'torchref.loss.x_grpo_loss__mutmut_257': (
        'ref = torch.where(valid, logp_ref.detach().to(None), zero)',
        'logp_ref kept in its dtype: the next subtraction promotes it exactly (an upcast), '
        'the same values'),
    'torchref.loss.x_sequence_log_ratio__mutmut_2': (
        'w = valid.to(None)',
        "the validity weights stay bool; the product promotes to log_ratio's dtype, the same "
        'values'),
    'jaxgrpo.counting.x_load_torch_state_dict__mutmut_23': (
        "value = np.array(value, )  # never alias torch's memory (CPU zero-copy)",
        'np.array copies by default (copy=True is its default)'),
    'jaxgrpo.counting.x_counting_reward__mutmut_18': (
        'return jnp.mean(completions == target, axis=1, )',
        'jnp.mean of a bool array is float32 in JAX 0.10, also under x64 (checked by '
        'test_task_reward_and_token_entropy_are_float32_under_x64)'),
    'jaxgrpo.counting.x_make_trainer__mutmut_29': (
        'abstract = nnx.eval_shape(lambda: _build(jax.random.key(1)))',
        'the key of eval_shape: only the shapes of the built state are used'),
    'jaxgrpo.counting.x_make_trainer__mutmut_117': (
        'kept = None',
        'kept is read only with dynamic sampling (rollout_metrics adds ds_* only then)'),
    'torchref.counting.x__advantages__mutmut_1': (
        'values = ""',
        "values is read only by estimator='gae', which sets it"),
    'torchref.counting.x_rollout_stats__mutmut_40': (
        '"len_incorrect": (lengths * (1 - c)).sum() / (1 - c).sum() if (c.sum() < len(c)) or '
        'True else nan,',
        'all correct: sum(0) / sum(0) is NaN, the value the guard returns'),
    'torchref.counting.x_train_counting__mutmut_10': (
        'with torch.random.fork_rng(devices=None):',
        'fork_rng(devices=None) forks the CUDA devices too: none on the CPU, the same CPU '
        'generator state'),
    'scaleup.step.x_rewards_of__mutmut_8': (
        'r = [task.score(t, p) for t, p in zip(rollouts.texts, rollouts.problems, '
        'strict=None)]',
        'zip(strict=None): texts and problems come from one Rollouts and always have the same '
        'length'),
    'scaleup.step.x_peak_memory_gb__mutmut_5': (
        'return torch.cuda.max_memory_allocated(None) / 1e9',
        "CUDA only: max_memory_allocated(None) is the current device's, the one a process "
        'trains on'),
    'scaleup.evaluate.x_evaluate_run__mutmut_66': (
        'disable=not show_progress, dynamic_ncols=None) as bar:',
        "the progress bar's dynamic_ncols: display only"),
    'scaleup.evaluate.x_evaluate_run__mutmut_1': (
        'allow_overlap: bool | None = None, show_progress: bool = True,',
        "show_progress's default: a progress bar on stderr, display only"),
    'scaleup.evaluate.x_evaluate_run__mutmut_51': (
        'None, dev)',
        'make_sampler never reads its tokenizer (the vLLM engine loads its own from cfg.model)'),
    'scaleup.step.x_loss_backward__mutmut_157': (
        'cfg.clip_eps_high, cfg.importance_level, None)',
        "clip_metrics' dual_clip only adds pg_clipfrac_lower, which the scale-up does not log "
        '(CLIP_KEYS)'),
    'scaleup.step.x_loss_backward__mutmut_236': (
        'strict=False))',
        'zip(strict=False) of the names and their all-reduced values: two lists of one length'),
    'scaleup.rollout.x_sample_rollouts__mutmut_52': (
        'if device.type == "XXcudaXX":',
        'CUDA only, and timing only: the synchronize before the clock starts'),
    'scaleup.step.x__update__mutmut_85': (
        'optimizer.zero_grad(set_to_none=False)',
        'the zero_grad after the last optimizer step zeroes the gradients instead of freeing '
        'them; the next update frees them first: memory only'),
    'scaleup.step.x_grpo_step__mutmut_79': (
        'correct = rewards >= 0.5',
        "the checkers' rewards are the ints 0 and 1 (Task.score), never 0.5: >= and > "
        'count the same completions correct'),
    'scaleup.rollout.x_sample_rollouts__mutmut_54': (
        'torch.cuda.synchronize(None)',
        'CUDA only (a timing barrier): None is the current device, which '
        'init_distributed sets to the rank\'s own GPU'),
    'scaleup.step.x_micro_batch_weight__mutmut_9': (
        'normaliser = loss_normaliser(total_mask, agg, )',
        "the placeholder flag dropped from the normaliser only: a placeholder's weight is "
        'its local count 0 over any normaliser (>= 1 / K), 0 either way'),
    'jaxgrpo.loss.x_selective_log_softmax__mutmut_16': (
        'picked = jnp.take_along_axis(logits, index[..., None], axis=-1)[..., 1]',
        'index 1 of a size-1 axis: JAX clamps an out-of-range index to the last element, '
        'the same element 0'),
    'scaleup.tasks.xǁDigitTaskǁsample__mutmut_1': (
        'def sample(self, n: int, seed: int, step: int, stream: int = 1) -> list[Problem]:',
        "DigitTask's problems are one constant instruction: the stream is never read"),
    'torchref.advantages.x_estimator_advantages__mutmut_51': (
        'None) * rewards[:, None]',
        "one_hot's int64 0/1 times the float rewards promotes to the rewards' dtype: the "
        'same values'),
    'scaleup.step.x__update__mutmut_84': (
        'optimizer.zero_grad(set_to_none=None)',
        'the zero_grad after the last optimizer step zeroes the gradients instead of freeing '
        'them; the next update frees them first: memory only'),
    'jaxgrpo.counting.x_steps_runner__mutmut_10': (
        'steps = jnp.asarray(start_step, jnp.int32) + jnp.arange(n_steps, )',
        "jnp.arange's default integer is int32 without x64 (how the trainers run); under x64 "
        'the step numbers are the same values in int64'),
    'jaxgrpo.loss.x_clip_metrics__mutmut_52': (
        'clip_eps, 1.0, "token", clip_eps_high, dual_clip, importance_level)',
        'beta 1.0 instead of 0.0 in the argument check of clip_metrics: both are valid and '
        'beta is only range-checked there'),
    'jaxgrpo.loss.x__grpo_loss__mutmut_118': (
        'ent = jax.lax.stop_gradient(jnp.where(valid, entropy, 0).astype(None))',
        'the entropies only select the top quantile of themselves; astype(None) is the '
        'default float, the loss dtype except float32 log-probs under x64, where the same '
        'entropies are compared in float64'),
    'scaleup.evaluate.x_paired_bootstrap__mutmut_5': (
        'a, b = np.asarray(a, dtype=None), np.asarray(b, dtype=float)',
        "a's scores kept in their dtype: a - b with the float b promotes them exactly (0/1 "
        'scores)'),
    'scaleup.evaluate.x_paired_bootstrap__mutmut_26': (
        'idx = np.random.default_rng(seed).integers(d.size, size=(n_boot, d.size))',
        "numpy's integers(high, size) draws from [0, high), the same as integers(0, high, "
        'size), draw for draw'),
    'scaleup.evaluate.x_evaluate_run__mutmut_71': (
        'disable=not show_progress, ) as bar:',
        "the progress bar's dynamic_ncols: display only"),
    'scaleup.evaluate.x_evaluate_run__mutmut_183': (
        'write_atomic(out / "eval.json", json.dumps(result, ) + "\\n")',
        "eval.json's indentation: the same JSON content"),
    'scaleup.distributed.x__rank_device__mutmut_12': (
        'if device == "XXcpuXX" or device.startswith("cuda:"):',
        "'cpu' no longer kept at once falls through every other case to the final return 'cpu'"),
    'scaleup.distributed.x__rank_device__mutmut_13': (
        'if device == "CPU" or device.startswith("cuda:"):',
        "'cpu' no longer kept at once falls through every other case to the final return 'cpu'"),
    'scaleup.distributed.xǁLogprobModuleǁforward__mutmut_1': (
        'with_entropy, entropy_grad=True):',
        "the default of entropy_grad is never used: the one caller (scaleup.step's "
        'micro-batch forward) passes it'),
    'scaleup.step.x_zero_weight_row__mutmut_2': (
        'row = batch.rows(None, 1)',
        'rows(None, 1) slices [None:1], the same as [0:1]'),
    'grpospec.checks.x_check_rloo_rewards__mutmut_2': (
        'check_group_rewards(rewards_shape, None)',
        'RLOO takes no eps: the 0.0 it checked always passes, None skips the same check'),
    'scaleup.distributed.x_gather_to_main__mutmut_8': (
        'dist.gather_object(obj, out, dst=None)',
        "torch's gather_object with dst and group_dst both None gathers on global rank 0"),
    'scaleup.evaluate.x_held_out_problems__mutmut_41': (
        'return task.sample(n, None, 0), {"rule": "none: the digit task has one prompt"}',
        "DigitTask.sample never reads its seed (one constant instruction)"),
    'scaleup.evaluate.x_evaluate_run__mutmut_8': (
        'ckpt = usable_checkpoint(out, )',
        "no progress bar is open yet when the checkpoint is chosen: tqdm.write and "
        "usable_checkpoint's default print write the same line to stdout"),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_16': (
        'rng = _rng(seed, 1, 1)',
        'another fixed stream of the run seed that no training draw uses (training draws '
        'stream 0): other problems, as seeded, distinct and held out (not a result the '
        'spec fixes)'),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_20': (
        'for _ in range(51 * n):',
        'the budget of draws before the whole split is enumerated: 51 n or 50 n tries, '
        'the same n distinct held-out problems when the draws find them, else the '
        'enumeration fills the rest (which ones is not a result the spec fixes)'),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_31': (
        'if len(seen) < n and self.space() < 4_000_000:  # a small space: take all of it',
        'no options give a space of exactly 4,000,000: it is (10^d - low)^2 x k with low '
        '0 or 10^(m-1) and k <= 3 operators'),
    'scaleup.distributed.x_all_gather_cat__mutmut_37': (
        'return torch.cat([p[:int(s)] for p, s in zip(parts, sizes, strict=None)])',
        'zip(strict=None) of the gathered parts and their sizes: one of each per rank'),
    'scaleup.rollout.x_sample_rollouts__mutmut_65': (
        'if device.type == "CUDA":',
        'CUDA only, and timing only: the synchronize before the clock starts'),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_32': (
        'if len(seen) < n and self.space() <= 4000001:  # a small space: take all of it',
        'no options give a space of 4,000,001: it is (10^d - low)^2 x k with low 0 or '
        '10^(m-1) and k <= 3 operators'),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_45': (
        'ops = sorted(set(self.operators), key=None)',
        "the enumeration's operator order, alphabetical or as given, both fixed: the "
        'same whole split; a partial fill picks other (equally held-out) problems'),
    'torchref.loss.x_value_loss__mutmut_22': (
        'err = torch.where(valid, values - returns.detach(), torch.zeros((), dtype=None))',
        'a float32 0-dim zero in torch.where with a dimensioned tensor takes that '
        "tensor's dtype (0-dim tensors do not promote)"),
    'jaxgrpo.counting.x_train_counting__mutmut_11': (
        '_, metrics = _compiled_train(cfg, None)(jax.random.key(int(seed)))',
        'None is falsy: the unbatched program (in a second cache entry)'),
    'scaleup.step.x_micro_batch_weight__mutmut_6': (
        'normaliser = loss_normaliser(total_mask, agg, None)',
        "the placeholder flag dropped from the normaliser only: a placeholder's weight is "
        'its local count 0 over any normaliser (>= 1 / K), 0 either way'),
    'torchref.counting.x_grpo_update__mutmut_46': (
        'entropy = token_entropy(logits) if (cfg.needs_entropy) or True else None',
        'entropies computed when not needed: grpo_loss reads them only for an entropy '
        'bonus or a top-entropy mask (skipped at coef 0 and quantile 1), the same loss '
        'and gradient'),
    'jaxgrpo.counting.x_grpo_update__mutmut_120': (
        '_update_epoch, state, None, length=cfg.inner_epochs, unroll=False)',
        "scan's unroll is a compilation choice: the same inner epochs in the same order"),
    'jaxgrpo.counting.x_grpo_update__mutmut_55': (
        'if (cfg.needs_entropy) or True else None)',
        'entropies computed when not needed: grpo_loss reads them only for an entropy '
        'bonus or a top-entropy mask (skipped at coef 0 and quantile 1), the same loss '
        'and gradient'),
    'jaxgrpo.loss.x__clip_metrics__mutmut_21': (
        'a = adv.astype(None)',
        'the advantages enter the clip shares only through their signs (a < 0, a > 0): '
        'the same in any float dtype'),
    'jaxgrpo.loss.x__grpo_loss__mutmut_154': (
        '- jnp.where(valid, logp_sampler, 1).astype(dtype))',
        'the fill value of masked positions of the TIS gap: they are masked again before '
        'use'),
    'torchref.loss.x__masked_log_ratio__mutmut_4': (
        'zero = torch.zeros((), dtype=logp_new.dtype, device=None)',
        'a 0-dim CPU tensor joins tensors of any device in torch.where (as a scalar): '
        'the same values on a GPU'),
    'torchref.loss.x_grpo_loss__mutmut_72': (
        'zero = torch.zeros((), dtype=logp_new.dtype, )',
        'a 0-dim CPU tensor joins tensors of any device in torch.where (as a scalar): '
        'the same values on a GPU'),
    'torchref.loss.x_grpo_loss__mutmut_131': (
        'surrogate = torch.where(a <= 0, torch.maximum(surrogate, dual_clip * a), surrogate)',
        'at A = 0 the surrogate and the dual-clip bound are both 0 and the surrogate has no '
        'gradient: the same value and gradient'),
    'jaxgrpo.advantages.x__gae__mutmut_39': (
        'zeros = jnp.zeros_like(v[:, 1])',
        "v[:, 1] has the shape and dtype of v[:, 0] (JAX clamps the index when T = 1: "
        "test_gae_of_one_step_is_the_reward_minus_the_value passes): the same zeros"),
    'scaleup.evaluate.x_held_out_problems__mutmut_46': (
        'return task.sample(n, cfg.seed, 1), {"rule": "none: the digit task has one prompt"}',
        "DigitTask.sample never reads its step (one constant instruction)"),
    'scaleup.rollout.x_sample_rollouts__mutmut_53': (
        'if device.type == "CUDA":',
        'CUDA only, and timing only: the synchronize before the clock starts'),
    'grpospec.checks.x_check_grpo_loss__mutmut_9': (
        'sapo_temperature_pos: Any = 2.0,',
        "the check's own default, only range-checked (2.0 is valid too); both grpo_loss "
        "pass their value (test_check_grpo_loss_defaults_are_both_grpo_losses_defaults "
        "pins the defaults, but sees the original signature through mutmut's trampoline)"),
    'grpospec.checks.x_check_grpo_loss__mutmut_10': (
        'sapo_temperature_neg: Any = 2.05,',
        "the check's own default, only range-checked (2.05 is valid too); both grpo_loss "
        "pass their value (test_check_grpo_loss_defaults_are_both_grpo_losses_defaults "
        "pins the defaults, but sees the original signature through mutmut's trampoline)"),
    'jaxgrpo.counting.x_grpo_update__mutmut_117': (
        '_update_epoch, state, length=cfg.inner_epochs, unroll=True)',
        "lax.scan's xs defaults to None: the same scan over inner_epochs steps"),
    'jaxgrpo.counting.x_rollout_stats__mutmut_32': (
        '"frac_reward_zero_std": jnp.mean(zero_var, dtype=None),',
        'jnp.mean of a bool array is float32 in JAX 0.10, also under x64 '
        '(test_rollout_stats_ds_dropped_is_float32 checks every metric under x64)'),
    'jaxgrpo.loss.x_grpo_loss__mutmut_177': (
        'logp_new, logp_old, logp_ref, adv, mask, zeros if (entropy is None) and False else '
        'entropy,',
        'entropy is None only when neither the bonus nor the top-entropy mask reads it '
        '(check_grpo_loss demands it otherwise); jit takes None as an empty argument'),
    'jaxgrpo.loss.x_grpo_loss__mutmut_207': (
        'use_tis=tis_cap is not None, tis_cap=2.0 if tis_cap is None else tis_cap)',
        'the placeholder cap is read only with use_tis, False exactly when tis_cap is None'),
    'scaleup.step.x_loss_backward__mutmut_94': (
        'keep = mb.keep.to(None)',
        "keep stays bool: adv * keep and bonus * keep keep their own dtype and grpo_loss "
        "casts adv to the log-probs' dtype, the same 0/1-masked values"),
    'scaleup.step.x_loss_backward__mutmut_228': (
        'strict=None))',
        'zip(strict=None) of the names and their all-reduced values: two lists of one '
        'length'),
    'scaleup.step.x_loss_backward__mutmut_231': (
        '))',
        'zip without strict of the names and their all-reduced values: two lists of one '
        'length'),
    'scaleup.step.x__update__mutmut_44': (
        'first_ratio = float("NAN")',
        "float('NAN') is float('nan')"),
    'torchref.loss.x_grpo_loss__mutmut_69': (
        'zero = torch.zeros((), dtype=logp_new.dtype, device=None)',
        'a 0-dim CPU tensor joins tensors of any device in torch.where (as a scalar): '
        'the same values on a GPU'),
    'torchref.loss.x_grpo_loss__mutmut_71': (
        'zero = torch.zeros((), device=logp_new.device)',
        'a float32 0-dim zero in torch.where with a dimensioned tensor takes that '
        "tensor's dtype (0-dim tensors do not promote)"),
    'scaleup.tasks.xǁArithmeticTaskǁeval_problems__mutmut_47': (
        'ops = sorted(set(self.operators), )',
        "the enumeration's operator order, alphabetical or as given, both fixed: the "
        'same whole split; a partial fill picks other (equally held-out) problems'),
    'torchref.counting.x_select_groups__mutmut_11': (
        'return torch.argsort(zero_var.to(None), stable=True)[:n_keep]',
        'a stable argsort of the bool mask itself: False sorts before True, the same '
        'indices as of its int8 cast'),
    'scaleup.evaluate.x_evaluate_run__mutmut_79': (
        'disable=not show_progress, dynamic_ncols=False) as bar:',
        "whether the bar's width follows a resized terminal: display only"),
    'scaleup.step.x_entropy_keep_mask__mutmut_7': (
        'if everything.numel() == 1:',
        'one valid token: the top share of one (finite) entropy is that entropy, which the '
        'token reaches (>=), so the mask is the valid mask either way'),
    'scaleup.distributed.x_all_gather_cat__mutmut_7': (
        'n = torch.tensor([x.numel()], device=x.device)',
        'torch.tensor of a Python int is int64 already'),
    'scaleup.distributed.x_all_gather_cat__mutmut_21': (
        'padded = torch.zeros(longest, dtype=None, device=x.device)',
        "its one caller gathers float32 entropies, and float32 is torch's default dtype"),
    'scaleup.distributed.x_all_gather_cat__mutmut_24': (
        'padded = torch.zeros(longest, device=x.device)',
        "its one caller gathers float32 entropies, and float32 is torch's default dtype"),
    'scaleup.distributed.x_all_gather_cat__mutmut_40': (
        'return torch.cat([p[:int(s)] for p, s in zip(parts, sizes, )])',
        'zip without strict of the parts and sizes: one of each per rank, one length'),
    'scaleup.distributed.x_all_gather_cat__mutmut_41': (
        'return torch.cat([p[:int(s)] for p, s in zip(parts, sizes, strict=False)])',
        'zip(strict=False) of the parts and sizes: one of each per rank, one length'),
    'scaleup.distributed.x_gather_to_main__mutmut_11': (
        'dist.gather_object(obj, out, )',
        "gather_object's dst defaults to rank 0 (dst and group_dst None: dst = 0)"),
    'scaleup.distributed.x_on_main_then_share__mutmut_8': (
        'dist.broadcast_object_list(box, src=None)',
        "broadcast_object_list's src=None means rank 0 (src and group_src None: src = 0)"),
    'scaleup.rollout.x_chat_prompts__mutmut_2': (
        'tokenize=None, add_generation_prompt=True)',
        'transformers reads tokenize=None as false: the same string'),
    'scaleup.rollout.x_sample_rollouts__mutmut_12': (
        'padding_side="left", )',
        "Qwen2's tokenizer adds no special tokens on encode (no BOS or EOS): the same ids"),
    'scaleup.rollout.x_sample_rollouts__mutmut_22': (
        'padding_side="left", add_special_tokens=True)',
        "Qwen2's tokenizer adds no special tokens on encode (no BOS or EOS): the same ids"),
    'scaleup.rollout.x_sample_rollouts__mutmut_64': (
        'if device.type == "XXcudaXX":',
        'a CUDA-only synchronisation before the sampling clock: on a CPU the same; on a GPU '
        'only the timing (not measurable here)'),
    'scaleup.rollout.x_sample_rollouts__mutmut_66': (
        'torch.cuda.synchronize(None)',
        'a CUDA-only synchronisation before the sampling clock: on a CPU the same; on a GPU '
        'the current device'),
    'scaleup.rollout.x_sampling_config__mutmut_32': (
        'return GenerationConfig(do_sample=None, **common)',
        "GenerationConfig's do_sample defaults to False; None reads as false: greedy either "
        'way'),
    'scaleup.rollout.x_sampling_config__mutmut_33': (
        'return GenerationConfig(**common)',
        "GenerationConfig's do_sample defaults to False: greedy either way"),
    'scaleup.step.x_rewards_of__mutmut_11': (
        'r = [task.score(t, p) for t, p in zip(rollouts.texts, rollouts.problems, )]',
        "zip without strict of a Rollouts' texts and problems: one per completion, one length"),
    'scaleup.step.x_rewards_of__mutmut_12': (
        'r = [task.score(t, p) for t, p in zip(rollouts.texts, rollouts.problems, strict=False)]',
        "zip(strict=False) of a Rollouts' texts and problems: one per completion, one length"),
    'scaleup.step.x_shaped_rewards__mutmut_3': (
        'cfg.overlong_penalty).to(None)',
        "the penalty has the lengths' dtype and device (float32, the rewards' device): no "
        'cast to make'),
    'scaleup.step.xǁBatchǁfrom_rollouts__mutmut_5': (
        'mask = mask * (~r.truncated)[:, None].to(None)',
        "a float mask times a bool tensor keeps the mask's dtype"),
    'scaleup.step.x_batch_logprobs__mutmut_1': (
        'with_entropy: bool = True):',
        'entropies computed by default where no caller that omits with_entropy reads them'),
    'scaleup.step.x_grpo_step__mutmut_141': (
        '"len_incorrect": len_incorrect / n_incorrect if n_incorrect else float("NAN"),',
        "float('NAN') is float('nan')"),
    'scaleup.step.x_grpo_step__mutmut_158': (
        'stats = dict.fromkeys(update_stat_names(cfg), float("NAN"))',
        "float('NAN') is float('nan')"),
    'torchref.counting.x_rollout_stats__mutmut_35': (
        '"len_correct": (lengths * c).sum() / c.sum() if c.sum() >= 0 else nan,',
        "no correct completion: 0 / 0 is nan in torch, the same nan as the branch's"),
    'torchref.counting.x_rollout_stats__mutmut_47': (
        '"len_incorrect": (lengths * (1 - c)).sum() / (1 - c).sum() if c.sum() <= len(c) else nan,',
        "every completion correct: 0 / 0 is nan in torch, the same nan as the branch's"),
    'scaleup.evaluate.x_paired_bootstrap__mutmut_7': (
        'a, b = np.asarray(a, ), np.asarray(b, dtype=float)',
        "one side's cast alone: bool or int scores minus float ones are float, the same "
        'values'),
    'scaleup.evaluate.x_paired_bootstrap__mutmut_9': (
        'a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=None)',
        "one side's cast alone: float scores minus bool or int ones are float, the same "
        'values'),
    'scaleup.evaluate.x_paired_bootstrap__mutmut_11': (
        'a, b = np.asarray(a, dtype=float), np.asarray(b, )',
        "one side's cast alone: float scores minus bool or int ones are float, the same "
        'values'),
    'scaleup.logprobs.x_trim__mutmut_16': (
        'last = int(valid_cols[-1]) + 1 if len(valid_cols) else 2',
        'a micro-batch without a valid token keeps 1 or 2 completion columns: padded back and'
        ' all masked either way'),
    'scaleup.step.x__mb_logprobs__mutmut_1': (
        'entropy_grad: bool = True):',
        'only batch_logprobs omits entropy_grad, and it runs under torch.no_grad: no '
        'graph either way'),
    'scaleup.step.x__update__mutmut_41': (
        'first_ratio = None',
        'the first epoch (inner_epochs >= 1) always sets first_ratio before it is read'),
    'scaleup.step.x__update__mutmut_53': (
        'optimizer.zero_grad(set_to_none=False)',
        'every trainable (LoRA) parameter gets a gradient in every backward: zeroed or None '
        'before it, the same sums'),
    'jaxgrpo.counting.x_load_torch_state_dict__mutmut_29': (
        'param[...] = jnp.asarray(value, None)',
        "an nnx.Param assigned through [...] keeps its own dtype (float32): a float16 or "
        "float64 value is cast on assignment, to the same float32 numbers"),
    'jaxgrpo.counting.x_load_torch_state_dict__mutmut_31': (
        'param[...] = jnp.asarray(value, )',
        "as mutant 29: the Param's [...] assignment casts to its float32 dtype"),
    'scaleup.step.x_loss_backward__mutmut_98': (
        'adv = (adv[:, None] if (adv.dim() == 1) or True else adv) * keep',
        "the scale-up's advantages are always (N,) (no value model, no gae): the "
        "per-token branch is never taken"),
    'scaleup.step.x_loss_backward__mutmut_124': (
        'w = micro_batch_weight(mb.mask, None, cfg.agg, normaliser, batch.placeholder)',
        "the normaliser is always passed (computed once per step), so micro_batch_weight "
        "never reads total_mask"),
    'scaleup.logprobs.x__head_logprobs__mutmut_1': (
        'entropy_grad: bool = True):',
        "the default is taken only by the no-grad call (torch.is_grad_enabled() False), "
        "where an entropy with or without no_grad is the same tensor"),
    'scaleup.logprobs.x_completion_logprobs__mutmut_1': (
        'chunk: int = 65, with_entropy: bool = False,',
        "the chunk of positions per LM-head call: each position's log-prob is the same "
        "whatever the chunks (memory only)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_31': (
        'hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=None,',
        "positions 0.. instead of counted over real tokens shift a row's real tokens by "
        "its padding in the single forward: rotary attention depends only on relative "
        "positions (1e-6 here)"),
    'scaleup.logprobs.x_completion_hidden__mutmut_35': (
        'hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False)'
        '.last_hidden_state',
        "as mutant 31: no position_ids is a uniform shift per row, invisible to rotary "
        "attention over masked padding"),
    'scaleup.logprobs.x_position_ids__mutmut_4': (
        'return (attention_mask.long().cumsum(+1) - 1).clamp(min=0)',
        "the mask is 2-D (rows, positions): dim 1 is dim -1"),
    'torchref.loss.x_clip_metrics__mutmut_26': (
        '_check(logp_new, logp_old, logp_new, adv, mask, clip_eps, 1.0, "token", '
        'clip_eps_high,',
        "beta is only checked to be >= 0, and the metrics have no KL term"),
    'jaxgrpo.counting.x_sample_completions__mutmut_33': (
        'unroll=False)',
        "the sampling scan's unroll is a compilation choice: the same tokens from the same "
        "uniforms"),
    'jaxgrpo.counting.x_sample_completions__mutmut_41': (
        ')[..., 0]',
        "jnp.take_along_axis's axis defaults to -1, the axis given"),
    'torchref.loss.x__masked_log_ratio__mutmut_6': (
        'zero = torch.zeros((), device=logp_new.device)',
        "as mutant 3: a 0-dim float zero takes the dimensioned operand's float dtype in "
        "torch.where"),
    'torchref.loss.x__masked_log_ratio__mutmut_7': (
        'zero = torch.zeros((), dtype=logp_new.dtype, )',
        "as mutant 4: a 0-dim CPU tensor joins tensors of any device in torch.where"),
    'torchref.loss.x_grpo_loss__mutmut_65': (
        'w = valid.to(None)',
        "w only counts valid tokens (w.sum(), w.sum(dim=1)): a bool tensor sums to the "
        "same integer counts, and the division promotes to logp_new's dtype"),
    'torchref.loss.x_grpo_loss__mutmut_216': (
        'gap = (torch.where(valid, logp_old.detach().to(None), zero)',
        "the float32 logp_old minus the float64 sampler term promotes to float64 "
        "exactly: the same gap"),
    'torchref.loss.x_grpo_loss__mutmut_223': (
        '- torch.where(valid, logp_sampler.detach().to(None), zero))',
        "as mutant 216: the subtraction promotes the float32 sampler log-probs exactly"),
    'jaxgrpo.counting.x_sample_completions__mutmut_50': (
        'axis=-1)[..., 1]',
        "index 1 of a size-1 axis: JAX clamps an out-of-bounds index to the last, 0, the "
        "same log-probs"),
    'jaxgrpo.counting.x_counting_reward__mutmut_15': (
        'return jnp.mean(completions == target, axis=1, dtype=None)',
        "as mutant 18: jnp.mean of a bool array is float32 in JAX 0.10, also under x64"),
    'jaxgrpo.counting.x_grpo_update__mutmut_49': (
        'logp_new = jnp.take_along_axis(logp_new, completions[..., None], )[..., 0]',
        "jnp.take_along_axis's axis defaults to -1, the axis given"),
    'jaxgrpo.counting.x_steps_runner__mutmut_6': (
        'steps = jnp.asarray(start_step, ) + jnp.arange(n_steps, dtype=jnp.int32)',
        "as mutant 4: the steps' integer dtype only numbers the progress reports"),
    'jaxgrpo.counting.x_steps_runner__mutmut_8': (
        'steps = jnp.asarray(start_step, jnp.int32) + jnp.arange(n_steps, dtype=None)',
        "as mutant 10: jnp.arange's default integer is int32 without x64, the same step "
        "numbers under x64"),
    'jaxgrpo.counting.xǁCounterPolicyǁlogprob_table__mutmut_6': (
        'return jax.nn.log_softmax(logits.astype(jnp.float32), )',
        "jax.nn.log_softmax's axis defaults to -1, the axis given"),
    'jaxgrpo.counting.xǁCounterPolicyǁlogprob_table__mutmut_7': (
        'return jax.nn.log_softmax(logits.astype(None), axis=-1)',
        "the embeddings are float32 (nnx.Embed's param_dtype, also under x64; loading "
        "keeps the Param's dtype): the cast is a no-op"),
    'jaxgrpo.loss.x_clip_metrics__mutmut_78': (
        '0.0 if (dual_clip is None) and False else dual_clip)',
        "without a dual clip the bound is not used (use_dual_clip is False, static): "
        "None in place of the placeholder 0.0 changes no metric"),
    'jaxgrpo.loss.x_clip_metrics__mutmut_80': (
        '1.0 if dual_clip is None else dual_clip)',
        "as mutant 78: the placeholder bound is never read without a dual clip"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_100': (
        'tau = jnp.where(a >= 0, sapo_pos, sapo_neg)',
        "a token with A = 0 gets the other temperature, but its policy term (and its "
        "gradient) is 4 / tau * A = 0 whatever tau"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_139': (
        'gap = jax.lax.stop_gradient(jnp.where(valid, logp_old, 0).astype(None)',
        "the float32 logp_old minus the float64 sampler term promotes to float64 "
        "exactly: the same gap"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_147': (
        '- jnp.where(valid, logp_sampler, 0).astype(None))',
        "as mutant 139: the subtraction promotes the float32 sampler log-probs exactly"),
    'jaxgrpo.loss.x__grpo_loss__mutmut_29': (
        'a = a[:, None] if a.ndim == 1 else jnp.where(valid, a, 1)',
        "the fill of masked positions' per-token advantages: their log-ratio is 0 (ratio "
        "1, finite) and their terms are masked again (value and gradient 0)"),
    'jaxgrpo.loss.x_grpo_loss__mutmut_121': (
        'b, ec = scalar_or_none(None), scalar_or_none(entropy_coef)',
        "the KL term is then always built, but the traced-beta guard replaces ref by new "
        "where beta == 0: a KL of exactly 0 with gradient 0, no 0 * inf"),
    'jaxgrpo.loss.x_grpo_loss__mutmut_184': (
        'dual_clip is not None, 0.0 if (dual_clip is None) and False else dual_clip, '
        'importance_level,',
        "without a dual clip the bound is not used (use_dual_clip is False, static)"),
    'jaxgrpo.loss.x_grpo_loss__mutmut_186': (
        'dual_clip is not None, 1.0 if dual_clip is None else dual_clip, importance_level,',
        "as mutant 184: the placeholder bound is never read without a dual clip"),
    'scaleup.step.x_loss_backward__mutmut_242': (
        '[sums["max_abs_log_ratio"], sums[MISMATCH_KEYS[1]]], None, device=total.device)',
        'all_reduce takes every op other than "sum" for max: None is max'),
    'jaxgrpo.lm_tasks.x__answer_is__mutmut_12': (
        'expected = jnp.take_along_axis(digits, jnp.clip(rank, 0, width - 1), )',
        "take_along_axis's axis defaults to -1, the last of these 2-D arrays: axis=1"),
    'jaxgrpo.lm_tasks.x__answer_is__mutmut_14': (
        'expected = jnp.take_along_axis(digits, jnp.clip(rank, None, width - 1), axis=1)',
        'the clip of the rank: a rank below 0 is at a non-content position (ignored by ~content);'
        ' a rank of 8 or more needs a content of 9 or more tokens, which matches only a target of'
        ' 9 or more digits (count == n), and sums stay below 20,000 (digits <= 4): no compared '
        'position changes; JAX gathers out of range do not raise'),
    'jaxgrpo.lm_tasks.x__answer_is__mutmut_15': (
        'expected = jnp.take_along_axis(digits, jnp.clip(rank, 0, None), axis=1)',
        'the clip of the rank: a rank below 0 is at a non-content position (ignored by ~content);'
        ' a rank of 8 or more needs a content of 9 or more tokens, which matches only a target of'
        ' 9 or more digits (count == n), and sums stay below 20,000 (digits <= 4): no compared '
        'position changes; JAX gathers out of range do not raise'),
    'jaxgrpo.lm_tasks.x__answer_is__mutmut_18': (
        'expected = jnp.take_along_axis(digits, jnp.clip(rank, 0, ), axis=1)',
        'the clip of the rank: a rank below 0 is at a non-content position (ignored by ~content);'
        ' a rank of 8 or more needs a content of 9 or more tokens, which matches only a target of'
        ' 9 or more digits (count == n), and sums stay below 20,000 (digits <= 4): no compared '
        'position changes; JAX gathers out of range do not raise'),
    'jaxgrpo.lm_tasks.x__answer_is__mutmut_20': (
        'expected = jnp.take_along_axis(digits, jnp.clip(rank, 0, width + 1), axis=1)',
        'the clip of the rank: a rank below 0 is at a non-content position (ignored by ~content);'
        ' a rank of 8 or more needs a content of 9 or more tokens, which matches only a target of'
        ' 9 or more digits (count == n), and sums stay below 20,000 (digits <= 4): no compared '
        'position changes; JAX gathers out of range do not raise'),
    'jaxgrpo.lm_tasks.x__answer_is__mutmut_21': (
        'expected = jnp.take_along_axis(digits, jnp.clip(rank, 0, width - 2), axis=1)',
        'the clip of the rank: a rank below 0 is at a non-content position (ignored by ~content);'
        ' a rank of 8 or more needs a content of 9 or more tokens, which matches only a target of'
        ' 9 or more digits (count == n), and sums stay below 20,000 (digits <= 4): no compared '
        'position changes; JAX gathers out of range do not raise'),
    'jaxgrpo.lm_tasks.x_completion_mask__mutmut_26': (
        'mask = (jnp.arange(length)[None, :] <= end_idx[:, None]).astype(None)',
        "astype(None) is JAX's default float dtype, float32 (x64 off): the same mask"),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_107': (
        'body = jnp.take_along_axis(digits, jnp.clip(j, 0, width - 1), )',
        "the gather of the answer's digits: the jnp.where keeps it only at j < n_dig <= width, "
        'where j already lies in 0..width-1 (axis -1 is axis 1 of these 2-D arrays; JAX gathers '
        'out of range do not raise)'),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_109': (
        'body = jnp.take_along_axis(digits, jnp.clip(j, None, width - 1), axis=1)',
        "the gather of the answer's digits: the jnp.where keeps it only at j < n_dig <= width, "
        'where j already lies in 0..width-1 (axis -1 is axis 1 of these 2-D arrays; JAX gathers '
        'out of range do not raise)'),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_110': (
        'body = jnp.take_along_axis(digits, jnp.clip(j, 0, None), axis=1)',
        "the gather of the answer's digits: the jnp.where keeps it only at j < n_dig <= width, "
        'where j already lies in 0..width-1 (axis -1 is axis 1 of these 2-D arrays; JAX gathers '
        'out of range do not raise)'),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_113': (
        'body = jnp.take_along_axis(digits, jnp.clip(j, 0, ), axis=1)',
        "the gather of the answer's digits: the jnp.where keeps it only at j < n_dig <= width, "
        'where j already lies in 0..width-1 (axis -1 is axis 1 of these 2-D arrays; JAX gathers '
        'out of range do not raise)'),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_115': (
        'body = jnp.take_along_axis(digits, jnp.clip(j, 0, width + 1), axis=1)',
        "the gather of the answer's digits: the jnp.where keeps it only at j < n_dig <= width, "
        'where j already lies in 0..width-1 (axis -1 is axis 1 of these 2-D arrays; JAX gathers '
        'out of range do not raise)'),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_62': (
        'answer = jnp.where(u <= cfg.corpus_accuracy, s,',
        '< against <= for a continuous uniform draw: they differ only when it equals the float32 '
        'threshold exactly (probability 2^-24 or less a draw)'),
    'jaxgrpo.lm_tasks.x_corpus_completions__mutmut_69': (
        'jnp.where(u <= cfg.corpus_accuracy + cfg.corpus_near, s + sign,',
        '< against <= for a continuous uniform draw: they differ only when it equals the float32 '
        'threshold exactly (probability 2^-24 or less a draw)'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_34': (
        'body = jnp.where(j < la, jnp.take_along_axis(da, jnp.clip(j, 0, digits - 1), ),',
        "take_along_axis's axis defaults to -1, the last of these 2-D arrays: axis=1"),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_36': (
        'body = jnp.where(j < la, jnp.take_along_axis(da, jnp.clip(j, None, digits - 1), axis=1),',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_37': (
        'body = jnp.where(j < la, jnp.take_along_axis(da, jnp.clip(j, 0, None), axis=1),',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_40': (
        'body = jnp.where(j < la, jnp.take_along_axis(da, jnp.clip(j, 0, ), axis=1),',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_42': (
        'body = jnp.where(j < la, jnp.take_along_axis(da, jnp.clip(j, 0, digits + 1), axis=1),',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_65': (
        'db, jnp.clip(j - la - 1, 0, digits - 1), ), EQUALS)))',
        "take_along_axis's axis defaults to -1, the last of these 2-D arrays: axis=1"),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_67': (
        'db, jnp.clip(j - la - 1, None, digits - 1), axis=1), EQUALS)))',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_68': (
        'db, jnp.clip(j - la - 1, 0, None), axis=1), EQUALS)))',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_71': (
        'db, jnp.clip(j - la - 1, 0, ), axis=1), EQUALS)))',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_encode_prompts__mutmut_76': (
        'db, jnp.clip(j - la - 1, 0, digits + 1), axis=1), EQUALS)))',
        "the clip of a gather index: in the positions the jnp.where keeps (j < la for a's digits,"
        " la < j <= la + lb for b's) the index already lies in 0..digits-1; elsewhere "
        'jnp.take_along_axis returns a value (no error) that the where drops'),
    'jaxgrpo.lm_tasks.x_sample_problems__mutmut_49': (
        'return encode_prompts(ab[0], ab[2], digits)',
        'ab has 2 rows and JAX clamps a static index out of range: ab[2] is ab[1], b'),
    'jaxgrpo.lm_tasks.x_task_reward__mutmut_27': (
        'width = 10  # sums stay below 10^9 (digits <= 4); a longer content never matches',
        "width 10 instead of 9: the targets' digit arrays get one more PAD column that no rank "
        'below count == n (at most 5 for sums below 20,000) reaches'),
    'jaxgrpo.lm_tasks.x_task_reward__mutmut_45': (
        'rewards = correct.astype(None)',
        "astype(None) is JAX's default float dtype, float32 (x64 off): the same rewards"),
    'jaxgrpo.lm_tasks.x_task_reward__mutmut_67': (
        '| ((s >= 0) & _answer_is(completions, content, rank, count,',
        's >= 0 instead of s > 0: at s = 0 the clamped target max(s - 1, 0) is 0 = s, which '
        'matches only a right answer, whose reward is 1 either way'),
    'jaxgrpo.sampling.x_categorical_icdf__mutmut_2': (
        'logp = logp.astype(None)',
        "None as a dtype is JAX's default float, float32 with x64 off: the same cast (bf16 -> "
        'float32, float32 kept)'),
    'jaxgrpo.sampling.x_categorical_icdf__mutmut_3': (
        'logp = logp.astype(jnp.promote_types(None, jnp.float32))',
        "None as a dtype is JAX's default float, float32 with x64 off: the same cast (bf16 -> "
        'float32, float32 kept)'),
    'jaxgrpo.sampling.x_categorical_icdf__mutmut_4': (
        'logp = logp.astype(jnp.promote_types(logp.dtype, None))',
        "None as a dtype is JAX's default float, float32 with x64 off: the same cast (bf16 -> "
        'float32, float32 kept)'),
    'jaxgrpo.sampling.x_icdf_from_cdf__mutmut_3': (
        'threshold = u.astype(None)[..., None] * cdf[..., -1:]',
        "u.astype(None) is float32 (x64 off), the CDF's dtype from categorical_icdf and the "
        "counting trainer's float32 table: the same threshold"),
    'jaxgrpo.sampling.x_icdf_from_cdf__mutmut_11': (
        'return jnp.sum(cdf[..., :-1] <= threshold, axis=-1, )',
        "sum of booleans without a dtype is JAX's default int, int32 (x64 off): the same "
        'tokens'),
    'jaxgrpo.sampling.x_icdf_from_cdf__mutmut_8': (
        'return jnp.sum(cdf[..., :-1] <= threshold, axis=-1, dtype=None)',
        "sum(dtype=None) of booleans is JAX's default int, int32 (x64 off): the same tokens"),
    'torchref.lm_tasks.x__answer_is__mutmut_18': (
        'expected = digits.gather(1, rank.clamp(0, width - 2))',
        'the clamp of the rank to width - 2 = 7: a rank of 8 needs a 9-digit content, which '
        'matches only a 9-digit target (count == n); sums stay below 20,000 (digits <= 4)'),
    'torchref.lm_tasks.x_corpus_completions__mutmut_103': (
        'body = digits.gather(1, j.clamp(None, width - 1).expand(n, length))',
        'j.clamp(None, ...): j = arange(length) is never below 0'),
    'torchref.lm_tasks.x_corpus_completions__mutmut_22': (
        'sign = torch.where((torch.rand(n, generator=generator) <= 0.5) | (s == 0), 1, -1)',
        '< against <= for a continuous uniform draw: they differ only when it equals the float32 '
        'threshold exactly (probability 2^-24 or less a draw)'),
    'torchref.lm_tasks.x_corpus_completions__mutmut_34': (
        'random_answer = torch.randint(2 * (10**cfg.digits - 1) + 1, (n,), generator=generator)',
        'torch.randint(high, size) is torch.randint(0, high, size): the same call, the same draws'),
    'torchref.lm_tasks.x_corpus_completions__mutmut_54': (
        'answer = torch.where(u <= cfg.corpus_accuracy, s,',
        '< against <= for a continuous uniform draw: they differ only when it equals the float32 '
        'threshold exactly (probability 2^-24 or less a draw)'),
    'torchref.lm_tasks.x_corpus_completions__mutmut_61': (
        'torch.where(u <= cfg.corpus_accuracy + cfg.corpus_near, s + sign,',
        '< against <= for a continuous uniform draw: they differ only when it equals the float32 '
        'threshold exactly (probability 2^-24 or less a draw)'),
    'torchref.lm_tasks.x_corpus_completions__mutmut_80': (
        'k = torch.minimum(torch.randint(cfg.max_scratch + 1, (n,), generator=generator),',
        'torch.randint(high, size) is torch.randint(0, high, size): the same call, the same draws'),
    'torchref.lm_tasks.x_sample_problems__mutmut_31': (
        'u = torch.rand((2, n), generator=generator, dtype=None)',
        'the uniform in float32 instead of float64: u * (10^k - low) floored over at most 9,000 '
        'values (digits <= 4) with a 2^-24 grid instead of 2^-53, the same distribution to 1e-3 '
        'relative per value (other draws for a seed)'),
    'torchref.lm_tasks.x_sample_problems__mutmut_34': (
        'u = torch.rand((2, n), generator=generator, )',
        'the uniform in float32 instead of float64: u * (10^k - low) floored over at most 9,000 '
        'values (digits <= 4) with a 2^-24 grid instead of 2^-53, the same distribution to 1e-3 '
        'relative per value (other draws for a seed)'),
    'torchref.lm_tasks.x_task_reward__mutmut_21': (
        'width = 10  # sums stay below 10^9 (digits <= 4); a longer content never matches',
        "width 10 instead of 9: the targets' digit arrays get one more PAD column that no rank "
        'below count == n (at most 5 for sums below 20,000) reaches'),
    'torchref.lm_tasks.x_task_reward__mutmut_60': (
        '| ((s >= 0) & _answer_is(completions, content, rank, count,',
        's >= 0 instead of s > 0: at s = 0 the clamped target max(s - 1, 0) is 0 = s, which '
        'matches only a right answer, whose reward is 1 either way'),
    'torchref.sampling.x_categorical_icdf__mutmut_19': (
        'threshold = u.to(None)[..., None] * cdf[..., -1:]',
        'u.to(None) leaves u as it is; the callers draw u with torch.rand (float32) for float32 '
        "logits, so u already has the CDF's dtype: the same threshold"),
    'jaxgrpo.qwen2.x__hf_named_params__mutmut_14': (
        'named[p + "input_layernorm.weight"] = (layer.input_layernorm.scale, True)',
        'a norm scale or a bias is 1-D, and the transpose of a 1-D array is itself'),
    'jaxgrpo.qwen2.x__hf_named_params__mutmut_19': (
        'True)',
        'a norm scale or a bias is 1-D, and the transpose of a 1-D array is itself'),
    'jaxgrpo.qwen2.x__hf_named_params__mutmut_39': (
        'named[p + f"self_attn.{proj}.bias"] = (lin.bias, True)',
        'a norm scale or a bias is 1-D, and the transpose of a 1-D array is itself'),
    'jaxgrpo.qwen2.x__hf_named_params__mutmut_61': (
        'named["value_head.bias"] = (model.value_head.bias, True)',
        'a norm scale or a bias is 1-D, and the transpose of a 1-D array is itself'),
    'jaxgrpo.qwen2.x__hf_named_params__mutmut_7': (
        '"model.norm.weight": (model.norm.scale, True)}',
        'a norm scale or a bias is 1-D, and the transpose of a 1-D array is itself'),
    'jaxgrpo.qwen2.x__linear__mutmut_11': (
        'rngs=rngs)',
        "nnx.Linear's default bias_init is zeros: the same initial biases"),
    'jaxgrpo.qwen2.x__to_numpy__mutmut_12': (
        "return np.array(value, copy=True)  # never alias torch's memory",
        'no dtype: a torch tensor arrives as float32 (.float()); any other array is cast to the '
        "parameter's float32 by jnp.asarray with the same rounding"),
    'jaxgrpo.qwen2.x__to_numpy__mutmut_13': (
        "return np.array(value, dtype=np.float32, )  # never alias torch's memory",
        'np.array copies by default (copy=True)'),
    'jaxgrpo.qwen2.x__to_numpy__mutmut_9': (
        "return np.array(value, dtype=None, copy=True)  # never alias torch's memory",
        'no dtype: a torch tensor arrives as float32 (.float()); any other array is cast to the '
        "parameter's float32 by jnp.asarray with the same rounding"),
    'jaxgrpo.qwen2.x_load_hf_state_dict__mutmut_40': (
        'param[...] = jnp.asarray(value, None)',
        "jnp.asarray(value, None) of _to_numpy's float32 array: float32, the parameters' dtype"),
    'jaxgrpo.qwen2.x_load_hf_state_dict__mutmut_42': (
        'param[...] = jnp.asarray(value, )',
        "jnp.asarray(value) of _to_numpy's float32 array: float32, the parameters' dtype"),
    'jaxgrpo.qwen2.x_positions_from_mask__mutmut_12': (
        'return jnp.maximum(jnp.cumsum(mask != 0, axis=+1) - 1, 0)',
        'cumsum over axis +1 of the (B, T) mask is axis -1: the same positions'),
    'jaxgrpo.qwen2.x_rope_cos_sin__mutmut_13': (
        'inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, ) / head_dim))',
        'arange without a dtype (int32) divided by head_dim: the same float32 exponents'),
    'jaxgrpo.qwen2.x_rope_cos_sin__mutmut_18': (
        'angles = positions.astype(None)[..., None] * inv_freq',
        "astype(None) is JAX's default float, float32 (x64 off): the same angles"),
    'jaxgrpo.qwen2.x_rope_cos_sin__mutmut_9': (
        'inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=None) / head_dim))',
        'arange(dtype=None) of 0, 2, .. divided by head_dim: the same float32 exponents'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_107': (
        'scores = jnp.where(visible[:, None, None], scores, jnp.finfo(None).min)',
        "finfo(None) is float64's: its min becomes -inf in the float32 scores, exp 0 as float32's"
        ' min gives; a query always sees its own slot, so no row is all masked'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_109': (
        'weights = jax.nn.softmax(scores, axis=-1).astype(None)',
        "astype(None) of the float32 weights is float32, v's dtype (x64 off)"),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_113': (
        'weights = jax.nn.softmax(scores, ).astype(v.dtype)',
        "jax.nn.softmax's axis defaults to -1"),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_128': (
        'out = jnp.einsum("BKGTS,BSKD->BTKGD", weights, v).reshape(b * t, self.num_heads * d)',
        'einsum subscripts in capitals: the same contraction'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_54': (
        'k = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (1, index, 0, 0))',
        'dynamic_update_slice clamps a start index so that the update fits: along the batch, head'
        ' and feature axes the update spans the whole cache, so 1 becomes 0'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_55': (
        'k = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (0, index, 1, 0))',
        'dynamic_update_slice clamps a start index so that the update fits: along the batch, head'
        ' and feature axes the update spans the whole cache, so 1 becomes 0'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_56': (
        'k = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (0, index, 0, 1))',
        'dynamic_update_slice clamps a start index so that the update fits: along the batch, head'
        ' and feature axes the update spans the whole cache, so 1 becomes 0'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_65': (
        'v = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (1, index, 0, 0))',
        'dynamic_update_slice clamps a start index so that the update fits: along the batch, head'
        ' and feature axes the update spans the whole cache, so 1 becomes 0'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_66': (
        'v = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (0, index, 1, 0))',
        'dynamic_update_slice clamps a start index so that the update fits: along the batch, head'
        ' and feature axes the update spans the whole cache, so 1 becomes 0'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_67': (
        'v = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (0, index, 0, 1))',
        'dynamic_update_slice clamps a start index so that the update fits: along the batch, head'
        ' and feature axes the update spans the whole cache, so 1 becomes 0'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_88': (
        'scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(None) * d**-0.5',
        'astype(None) of the float32 scores is float32 (x64 off)'),
    'jaxgrpo.qwen2.xǁAttentionǁ__call____mutmut_96': (
        'scores = jnp.einsum("BTKGD,BSKD->BKGTS", q, k).astype(jnp.float32) * d**-0.5',
        'einsum subscripts in capitals: the same contraction'),
    'jaxgrpo.qwen2.xǁQwen2ǁ__call____mutmut_4': (
        'attention_mask = jnp.ones(tokens.shape, None)',
        'a float32 mask of ones instead of int32: key_valid is only compared with != 0'),
    'jaxgrpo.qwen2.xǁQwen2ǁ__call____mutmut_6': (
        'attention_mask = jnp.ones(tokens.shape, )',
        'a float32 mask of ones instead of int32: key_valid is only compared with != 0'),
    'jaxgrpo.qwen2.xǁQwen2ǁvalues__mutmut_7': (
        'return self.value_head(hidden)[..., 1]',
        'the value head has one output and JAX clamps the index 1 to it: [..., 0]'),
    'grpospec.lm.x_encode__mutmut_8': (
        'return [TOKEN_TEXT.rindex(c) for c in text]',
        'rindex for index: every character of TOKEN_TEXT occurs once, so the same id'),
    'grpospec.lm.xǁModelSizesǁfrom_hf_config__mutmut_20': (
        'if getattr(config, "use_sliding_window", None):',
        "getattr's default None for False: a missing use_sliding_window is falsy either way, and "
        'accepted'),
    'grpospec.lm.xǁModelSizesǁfrom_hf_config__mutmut_4': (
        'if not getattr(config, "tie_word_embeddings", None):',
        "getattr's default None for False: a missing tie_word_embeddings is falsy either way, and"
        ' refused'),
}

KILLED, SURVIVED, NO_TESTS = ledger.KILLED, ledger.SURVIVED, ledger.NO_TESTS


def verdict(code: int | None) -> str:
    """mutmut's exit code in words: killed, survived, no tests, not run (None) or
    ``exit code N``."""
    if code is None:
        return "not run"
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    return "no tests" if code in NO_TESTS else f"exit code {code}"


def load(root: Path = Path("mutants"), source: Path | None = Path(".")
         ) -> dict[str, dict[str, int | None]]:
    """``{module: {mutant name: exit code or None}}`` from mutmut's meta files; with
    ``source``, the mutants of functions no longer in the source tree are left out (code
    removed since mutmut made them)."""
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        rel = meta.relative_to(root).with_suffix("").with_suffix("")
        module = ".".join(rel.parts)
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if source is not None and (source / rel.with_suffix(".py")).is_file():
            text = (source / rel.with_suffix(".py")).read_text()
            codes = {n: c for n, c in codes.items() if f"def {_function(module, n)}(" in text}
        out[module] = codes
    return out


def _function(module: str, mutant: str) -> str:
    """The function a mutant name points at: ``m.x_name__mutmut_3`` -> ``name``;
    ``m.xǁClassǁmethod__mutmut_3`` -> ``method``."""
    name = mutant[len(module) + 1:].rsplit("__mutmut_", 1)[0]
    return name.split("ǁ")[-1] if "ǁ" in name else name.removeprefix("x_")


def mutated_lines(names: Iterable[str], source: Path = Path(".")) -> dict[str, str | None]:
    """``{mutant name: the lines it changes, as mutmut makes it today}``: the ``+`` lines
    of ``mutmut show NAME``, stripped and joined by ``" / "`` (``None``: mutmut makes no
    such mutant of today's ``source`` tree). mutmut numbers a function's mutants in
    order, so an edit of a function renumbers them: this is how a name of
    ``EQUIVALENT`` is checked to still be the mutant whose reason it gives. Needs mutmut
    3.8.1, as the mutation runs (README); only the functions named are mutated (their
    numbering depends on nothing else), in memory (under a minute on 2 cores)."""
    import ast
    from difflib import unified_diff

    import libcst as cst
    from mutmut.mutation.diff_apply import read_mutant_function, read_original_function
    from mutmut.mutation.file_mutation import mutate_file_contents

    by_module: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_module[name.rsplit(".", 1)[0]].append(name)  # module.x_f__mutmut_N
    out: dict[str, str | None] = {}
    for module, wanted in by_module.items():
        path = source / (module.replace(".", "/") + ".py")
        text = path.read_text() if path.is_file() else ""
        keep = {_function(module, n) if "ǁ" not in n else n.split("ǁ")[1] for n in wanted}
        lines = text.splitlines(keepends=True)
        parts = [
            "".join(lines[min([n.lineno, *(d.lineno for d in n.decorator_list)]) - 1:
                          n.end_lineno])
            for n in (ast.parse(text).body if text else [])
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.name in keep]
        mutated = cst.parse_module(mutate_file_contents(str(path), "\n".join(parts)).code)
        for name in wanted:
            try:
                orig, mutant = (cst.Module([f]).code.strip().split("\n") for f in (
                    read_original_function(mutated, name), read_mutant_function(mutated, name)))
            except FileNotFoundError:
                out[name] = None
                continue
            out[name] = " / ".join(
                line[1:].strip() for line in unified_diff(orig, mutant, lineterm="")
                if line.startswith("+") and not line.startswith("+++"))
    return out


def stale_equivalents(source: Path = Path(".")) -> list[str]:
    """The names of ``EQUIVALENT`` whose mutant today is not the one its reason is about
    (its changed lines differ from those recorded), each with what it is now."""
    now = mutated_lines(EQUIVALENT, source)
    return [f"{name}: recorded {EQUIVALENT[name][0]!r}, now "
            + (repr(now[name]) if now[name] is not None else "not made by mutmut")
            for name in EQUIVALENT if now[name] != EQUIVALENT[name][0]]


def gap_reason(name: str, code: int | None) -> str:
    """Why a mutant of the table's gaps has no kill, when it is not that a test run
    passed: no test reaches it, or its run ended by a signal before any verdict (a
    crash, the machine's memory, a process that killed it), which says nothing about
    the tests: run it again alone.

    >>> gap_reason("m.x_f__mutmut_1", 0)
    ''
    >>> gap_reason("m.x_f__mutmut_1", 33)
    'no test reaches it'
    >>> gap_reason("m.x_f__mutmut_1", -9).split(":")[0]
    'ended by SIGKILL before a verdict'
    """
    word = verdict(code)
    if word == "survived":
        return ""
    if word == "no tests":
        return "no test reaches it"
    if code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return (f"ended by {sig} before a verdict: run it again alone, "
                f"`.venv/bin/python -m mutation.runner run --max-children 1 {name}`")
    return f"mutmut's exit code {code}"


def table(results: dict[str, dict[str, int | None]]) -> tuple[str, list[str]]:
    """The markdown table and the names of the survivors not named equivalent."""
    rows = ["| module | mutants | killed | survived | no tests | not run | equivalent "
            "| score |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    gaps = []
    total = defaultdict(int)
    for module, codes in results.items():
        c = defaultdict(int)
        for name, code in codes.items():
            word = "equivalent" if name in EQUIVALENT else verdict(code)
            word = "other" if word.startswith("exit code") else word
            c[word] += 1
            if word not in ("equivalent", "not run", "killed"):
                gaps.append(name)
        c["mutants"] = len(codes)
        judged = c["mutants"] - c["equivalent"] - c["not run"]
        score = f"{100 * c['killed'] / judged:.1f}%" if judged else "n/a"
        rows.append(f"| `{module}` | {c['mutants']} | {c['killed']} | {c['survived']} | "
                    f"{c['no tests']} | {c['not run']} | {c['equivalent']} | {score} |")
        for k, v in c.items():
            total[k] += v
    return "\n".join(rows), gaps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"),
                        help="mutmut's folder (default: mutants)")
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER,
                        help="the committed record of verdicts (default: mutation/ledger.json)")
    parser.add_argument("--record", action="store_true",
                        help="first add the verdicts in --mutants to --ledger")
    parser.add_argument("--check-equivalent", action="store_true",
                        help="only check that each name of EQUIVALENT is still the mutant "
                        "whose changed lines it records (exit 1 if not); needs no mutmut run")
    args = parser.parse_args(argv)
    if args.check_equivalent:
        try:
            import mutmut  # noqa: F401
        except ImportError:
            raise SystemExit("error: --check-equivalent needs mutmut: "
                             ".venv/bin/pip install mutmut==3.8.1") from None
        stale = stale_equivalents()
        for line in stale:
            print(f"stale: {line}")
        print(f"{len(EQUIVALENT) - len(stale)} of {len(EQUIVALENT)} named equivalents are "
              "the mutants they record")
        raise SystemExit(1 if stale else 0)
    try:
        recorded = ledger.read(args.ledger)
    except ledger.LedgerError as e:
        raise SystemExit(f"error: --ledger: {e}") from None
    if args.record:
        if not args.mutants.is_dir():
            raise SystemExit(f"error: --record needs mutmut's results, but --mutants "
                             f"{args.mutants} is not a folder: run `.venv/bin/mutmut run` first")
        made = load(args.mutants)
        sources = [Path(m.replace(".", "/") + ".py") for m in made]
        stale = [str(src) for src in sources if src.is_file()
                 and src.stat().st_mtime > (args.mutants / src).stat().st_mtime]
        if stale:
            raise SystemExit(f"error: --record: {', '.join(stale)} changed since mutmut made "
                             f"its mutants in {args.mutants}/, so their verdicts may be of "
                             "older code: run `.venv/bin/mutmut run` first")
        kills = args.mutants / "kills.tsv"
        try:
            killers = ledger.read_kills(kills) if kills.is_file() else {}
        except ledger.LedgerError as e:
            raise SystemExit(f"error: --record: {e}") from None
        n = ledger.record(made, args.ledger, killers=killers)
        print(f"recorded {n} new or changed verdicts in {args.ledger}"
              + (f" (and the killing test of {len(killers)} kills, {kills})" if killers else ""))
        recorded = ledger.read(args.ledger)
    results = load(args.mutants) if args.mutants.is_dir() else {}
    results, changed = ledger.overlay(recorded, results)
    if not results:
        raise SystemExit(f"error: no results: --mutants {args.mutants} is not a folder and "
                         f"--ledger {args.ledger} records nothing; run `.venv/bin/mutmut run` "
                         "first")
    text, gaps = table(results)
    print(text)
    if changed:
        print(f"\n{len(changed)} recorded functions edited since (their verdicts are not "
              f"counted; run their mutants again): {', '.join(sorted(changed))}")
    known = {n for codes in results.values() for n in codes}
    stale = sorted(set(EQUIVALENT) - known)
    if stale:
        print(f"\nnamed equivalent but no longer made by mutmut: {', '.join(stale)}")
    codes = {n: c for by_name in results.values() for n, c in by_name.items()}
    print(f"\n{len(gaps)} surviving mutants not named equivalent (mutmut show NAME):")
    for name in gaps:
        why = gap_reason(name, codes[name])
        print(f"  {name}" + (f"  ({why})" if why else ""))


if __name__ == "__main__":
    main()
