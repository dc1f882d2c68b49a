"""The mutation score per module, from mutmut's results (``mutants/**/*.py.meta``).

    .venv/bin/mutmut run                      # all mutants (README, "Mutation testing")
    .venv/bin/python -m mutation.report       # the table, then the surviving mutants

Per module: the mutants mutmut made, how many the suite killed (a failing test, or a
timeout: a mutant that makes the suite hang is caught), how many survived, how many no
test reaches, how many were not run yet, the mutants named equivalent in
``EQUIVALENT`` (a mutation that cannot change any result, with the reason), and the
score ``killed / (total - equivalent - not run)``. Then every survivor that is not named
equivalent: the known gaps (``mutmut show NAME`` prints its diff).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

#: Mutants that cannot change any result, each with the reason (checked by reading the
#: diff: ``mutmut show NAME``). A name here that mutmut no longer makes is reported.
EQUIVALENT: dict[str, str] = {
    "scaleup.tasks.x_load_gsm8k__mutmut_9": "encoding 'UTF-8' is 'utf-8'",
    "scaleup.tasks.x_question_key__mutmut_3": "upper() instead of lower(): the same "
    "question keys compare equal (both sides normalised alike)",
    "jaxgrpo.advantages.x__gae__mutmut_23": "the value at a masked position (1 for 0) "
    "never counts: it enters only times next_valid = 0, times w_t = 0, or where(valid)",
    "scaleup.tasks.x_question_key__mutmut_2": "words joined by 'XX XX' instead of ' ': "
    "still one key per word list (the words hold no space), keys only compared",
    "scaleup.tasks.x_parse_gsm8k_answer__mutmut_15": "str(Fraction(n, 1)) is already "
    "str(n): the integer branch and the fraction branch give the same text",
    "scaleup.tasks.xǁDatasetTaskǁsample__mutmut_16": "replace=None is falsy: the same "
    "sampling without replacement",
    "torchref.loss.x_grpo_loss__mutmut_163": "SAPO's temperature at A = 0 (> vs >=): the "
    "term is multiplied by A = 0, value and gradient",
    "jaxgrpo.loss.x__grpo_loss__mutmut_146": "the fill value of masked positions of the "
    "TIS gap: they are masked again before use",
    # torch's type promotion: the cast is exact (an upcast or a bool mask) and the next op
    # promotes to the same dtype, so every value is the same
    "torchref.loss.x_grpo_loss__mutmut_68": "a float32 0-dim zero in torch.where with a "
    "dimensioned tensor takes that tensor's dtype (0-dim tensors do not promote)",
    "torchref.loss.x_grpo_loss__mutmut_198": "the top-entropy mask stays bool; multiplying "
    "by a bool mask promotes to the other operand's dtype: the same values",
    "torchref.loss.x_grpo_loss__mutmut_257": "logp_ref kept in its dtype: the next "
    "subtraction promotes it exactly (an upcast), the same values",
    "torchref.loss.x_sequence_log_ratio__mutmut_2": "the validity weights stay bool; the "
    "product promotes to log_ratio's dtype, the same values",
    "torchref.bandit.x_reinforce_gradient__mutmut_55": "one_hot's int64 minus float pi "
    "promotes to pi's dtype: the same score",
    "jaxgrpo.bandit.x_reinforce_gradients__mutmut_59": "a Python float baseline without a "
    "dtype is weakly typed and takes theta's dtype",
    "jaxgrpo.counting.x_load_torch_state_dict__mutmut_23": "np.array copies by default "
    "(copy=True is its default)",
    "jaxgrpo.counting.x_counting_reward__mutmut_18": "the mean of a bool array is the "
    "default float dtype, float32 (the counting trainer does not run under x64)",
    "jaxgrpo.counting.x_task_reward__mutmut_62": "jnp.ones' default dtype is float32 (the "
    "counting trainer does not run under x64)",
    "jaxgrpo.counting.x_select_groups__mutmut_18": "XLA's CPU sort of a 0/1 key is stable "
    "with stable=False too (checked: test_select_groups_and_group_rows_by_hand passes)",
    "jaxgrpo.counting.x_make_trainer__mutmut_29": "the key of eval_shape: only the shapes "
    "of the built state are used",
    "jaxgrpo.counting.x_make_trainer__mutmut_117": "kept is read only with dynamic "
    "sampling (rollout_metrics adds ds_* only then)",
    "torchref.counting.x_counting_reward__mutmut_7": "arange's device: the CPU either way "
    "(the counting task runs on the CPU)",
    "torchref.counting.x__advantages__mutmut_1": "values is read only by estimator='gae', "
    "which sets it",
    "torchref.counting.x_rollout_stats__mutmut_40": "all correct: sum(0) / sum(0) is NaN, "
    "the value the guard returns",
    "torchref.counting.x_train_counting__mutmut_10": "fork_rng(devices=None) forks the "
    "CUDA devices too: none on the CPU, the same CPU generator state",
    "scaleup.step.x_rewards_of__mutmut_8": "zip(strict=None): texts and problems come "
    "from one Rollouts and always have the same length",
    "scaleup.step.x_peak_memory_gb__mutmut_5": "CUDA only: max_memory_allocated(None) is "
    "the current device's, the one a process trains on",
    "scaleup.step.x_grpo_step__mutmut_165": "float('NAN') is float('nan')",
    "scaleup.evaluate.x_evaluate_run__mutmut_67": "the progress bar's total: display only",
    "scaleup.evaluate.x_evaluate_run__mutmut_66": "the progress bar's dynamic_ncols: "
    "display only",
    "scaleup.evaluate.x_evaluate_run__mutmut_1": "show_progress's default: a progress bar "
    "on stderr, display only",
    "scaleup.evaluate.x_evaluate_run__mutmut_51": "make_sampler never reads its tokenizer "
    "(the vLLM engine loads its own from cfg.model)",
    "scaleup.step.x_loss_backward__mutmut_157": "clip_metrics' dual_clip only adds "
    "pg_clipfrac_lower, which the scale-up does not log (CLIP_KEYS)",
    "scaleup.step.x_loss_backward__mutmut_236": "zip(strict=False) of the names and their "
    "all-reduced values: two lists of one length",
    "scaleup.rollout.x_sampling_config__mutmut_43": "eta_cutoff None or 0.0: transformers "
    "adds no eta warper either way (test_generate_samples_from_the_policy_itself checks "
    "that the processed scores are the raw logits)",
    "scaleup.rollout.x_sampling_config__mutmut_49": "typical_p left at its default, 1.0: "
    "no typical warper, the same raw logits",
    "scaleup.rollout.x_sampling_config__mutmut_56": "top_p 2.0 or 1.0: transformers adds "
    "a top-p warper only below 1, the same raw logits",
    "scaleup.rollout.x_sample_rollouts__mutmut_52": "CUDA only, and timing only: the "
    "synchronize before the clock starts",
    "scaleup.step.x__update__mutmut_84": "the zero_grad after the last optimizer step "
    "zeroes the gradients instead of freeing them; the next update frees them first: "
    "memory only",
    "jaxgrpo.counting.x_steps_runner__mutmut_10": "jnp.arange's default integer is int32 "
    "without x64 (how the trainers run); under x64 the step numbers are the same values "
    "in int64",
    "jaxgrpo.loss.x_clip_metrics__mutmut_52": "beta 1.0 instead of 0.0 in the argument "
    "check of clip_metrics: both are valid and beta is only range-checked there",
    "jaxgrpo.loss.x__grpo_loss__mutmut_118": "the entropies only select the top quantile "
    "of themselves; astype(None) is the default float, the loss dtype except float32 "
    "log-probs under x64, where the same entropies are compared in float64",
    "scaleup.evaluate.x_paired_bootstrap__mutmut_5": "a's scores kept in their dtype: "
    "a - b with the float b promotes them exactly (0/1 scores)",
    "scaleup.evaluate.x_paired_bootstrap__mutmut_26": "numpy's integers(high, size) draws "
    "from [0, high), the same as integers(0, high, size), draw for draw",
    "scaleup.evaluate.x_evaluate_run__mutmut_71": "the progress bar's dynamic_ncols: "
    "display only",
    "scaleup.evaluate.x_evaluate_run__mutmut_183": "eval.json's indentation: the same "
    "JSON content",
    "scaleup.distributed.x__rank_device__mutmut_12": "'cpu' no longer kept at once falls "
    "through every other case to the final return 'cpu'",
    "scaleup.distributed.x__rank_device__mutmut_13": "'cpu' no longer kept at once falls "
    "through every other case to the final return 'cpu'",
    "scaleup.distributed.xǁLogprobModuleǁforward__mutmut_1": "the default of entropy_grad "
    "is never used: the one caller (scaleup.step's micro-batch forward) passes it",
    "scaleup.step.x_zero_weight_row__mutmut_2": "rows(None, 1) slices [None:1], the same "
    "as [0:1]",
}

KILLED = {1, 3, 36, 24, -24, 152, 255}  # a failing test, or a timeout
SURVIVED = {0}
NO_TESTS = {5, 33}


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


def table(results: dict[str, dict[str, int | None]]) -> tuple[str, list[str]]:
    """The markdown table and the names of the survivors not named equivalent."""
    rows = ["| module | mutants | killed | survived | no tests | not run | equivalent "
            "| score |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    gaps = []
    total = defaultdict(int)
    for module, codes in results.items():
        c = defaultdict(int)
        for name, code in codes.items():
            if name in EQUIVALENT:
                c["equivalent"] += 1
            elif code is None:
                c["not run"] += 1
            elif code in KILLED:
                c["killed"] += 1
            elif code in SURVIVED:
                c["survived"] += 1
                gaps.append(name)
            elif code in NO_TESTS:
                c["no tests"] += 1
                gaps.append(name)
            else:
                c["other"] += 1
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
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        raise SystemExit(f"error: --mutants {args.mutants} is not a folder: run "
                         "`.venv/bin/mutmut run` first")
    results = load(args.mutants)
    text, gaps = table(results)
    print(text)
    known = {n for codes in results.values() for n in codes}
    stale = sorted(set(EQUIVALENT) - known)
    if stale:
        print(f"\nnamed equivalent but no longer made by mutmut: {', '.join(stale)}")
    print(f"\n{len(gaps)} surviving mutants not named equivalent (mutmut show NAME):")
    for name in gaps:
        print(f"  {name}")


if __name__ == "__main__":
    main()
