"""GRPO's failure modes and their fixes, reproduced with many seeds on the toy tasks and
on the tiny Qwen2 language model (the ``lm-*`` experiments, ``jaxgrpo.lm``).

Each experiment trains a few *arms* (configurations) with ``seeds`` independent runs
each, vmapped in one compiled JAX program per arm, then writes a PNG of the curves (mean
over seeds with a 95% band) and a markdown table of final figures with 95% intervals.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpospec import CountingConfig
from grpospec.lm import LMConfig
from jaxgrpo.runs import RunResult, diff_ci, mean_ci, run_seeds, seed_means

LAST = 10  # "final" = the mean of the last LAST steps of each seed


@dataclass(frozen=True)
class Experiment:
    """One experiment: shared settings, the arms compared, what is plotted and tabled."""

    name: str
    question: str
    base: dict
    arms: dict[str, dict]
    panels: tuple[str, ...]
    table: tuple[str, ...]
    per_token: bool = False  # also plot reward against cumulative sampled tokens
    notes: dict = field(default_factory=dict)
    program: str = "counting"  # "counting" (CountingConfig) or "lm" (LMConfig)
    contrasts: tuple[tuple[str, str], ...] = ()  # (A, B): table rows of B - A, with CIs
    # a 2x2 design: ((factor 1, factor 2), (arm at (0, 0), (1, 0), (0, 1), (1, 1))): table
    # rows of each factor's main effect and of the interaction, with CIs (factorial_effects)
    factorial: tuple[tuple[str, str], tuple[str, str, str, str]] | None = None

    def config(self, arm: str) -> CountingConfig | LMConfig:
        """The configuration of ``arm``: the shared settings, then the arm's own."""
        cls = LMConfig if self.program == "lm" else CountingConfig
        return cls(**{**self.base, **self.arms[arm]})


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e for e in (
        Experiment(
            name="length-bias",
            question="Does GRPO's per-sequence normalisation (agg='seq' with std_norm) make "
                     "incorrect completions longer than the fix (agg='token', no std)?",
            base=dict(task="variable", completion_length=12, steps=200, learning_rate=0.02,
                      beta=0.0),
            arms={"GRPO (seq mean, std norm)": dict(agg="seq", estimator="grpo"),
                  "fix (token mean, no std)": dict(agg="token", estimator="dr_grpo")},
            panels=("len_incorrect", "len_correct", "mean_reward", "mean_length"),
            table=("len_incorrect", "len_correct", "mean_reward"),
        ),
        Experiment(
            name="length-2x2",
            question="The length-bias experiment's two arms change the aggregation (seq or "
                     "token mean) and the std normalisation (GRPO or Dr. GRPO advantages) at "
                     "once; the 2x2 design measures each factor on its own.",
            base=dict(task="variable", completion_length=12, steps=200, learning_rate=0.02,
                      beta=0.0),
            arms={"seq mean, std norm": dict(agg="seq", estimator="grpo"),
                  "token mean, std norm": dict(agg="token", estimator="grpo"),
                  "seq mean, no std": dict(agg="seq", estimator="dr_grpo"),
                  "token mean, no std": dict(agg="token", estimator="dr_grpo")},
            panels=("len_incorrect", "len_correct", "mean_reward", "mean_length"),
            table=("len_incorrect", "len_correct", "mean_length", "mean_reward"),
            factorial=(("seq mean (vs token mean)", "std norm (vs no std)"),
                       ("token mean, no std", "seq mean, no std", "token mean, std norm",
                        "seq mean, std norm")),
        ),
        Experiment(
            name="entropy",
            question="Does clip-higher (eps 0.2 / 0.28) keep token entropy up compared with "
                     "symmetric clipping (eps 0.2), and what does it do to the reward?",
            base=dict(steps=100, learning_rate=0.1, inner_epochs=4, beta=0.0),
            arms={"symmetric 0.2": dict(clip_eps=0.2),
                  "clip-higher 0.2/0.28": dict(clip_eps=0.2, clip_eps_high=0.28)},
            panels=("entropy", "mean_reward", "clip_ratio/region_mean"),
            table=("entropy", "mean_reward", "clip_ratio/region_mean"),
        ),
        Experiment(
            name="zero-signal",
            question="With sparse rewards most groups have zero variance and teach nothing; "
                     "does dynamic sampling (oversample x4, keep groups that vary) help?",
            base=dict(task="sparse", completion_length=4, steps=150),
            arms={"no dynamic sampling": dict(),
                  "dynamic sampling x4": dict(dynamic_sampling=True, oversample=4)},
            panels=("mean_reward", "frac_reward_zero_std", "ds_filled"),
            table=("mean_reward", "frac_reward_zero_std", "ds_filled"),
            per_token=True,
        ),
        Experiment(
            name="estimators",
            question="GRPO vs Dr. GRPO vs RLOO vs PPO with GAE (a learned value head) on "
                     "the counting task: reward per step and per sampled token.",
            base=dict(steps=80),
            arms={"GRPO": dict(estimator="grpo"), "Dr. GRPO": dict(estimator="dr_grpo"),
                  "RLOO": dict(estimator="rloo"), "PPO + GAE": dict(estimator="gae")},
            panels=("mean_reward", "entropy", "frac_reward_zero_std"),
            table=("mean_reward", "entropy"),
            per_token=True,
        ),
        Experiment(
            name="std-scale",
            question="Why does GRPO learn more slowly than Dr. GRPO on the counting task: "
                     "the overall scale of its advantages, or the per-prompt weights of its "
                     "group std? TRL's scale_rewards='batch' divides by one std for the "
                     "whole batch: GRPO's scale without its per-prompt weights.",
            base=dict(steps=80),
            arms={"group std (GRPO)": dict(estimator="grpo"),
                  "batch std": dict(estimator="grpo", scale_rewards="batch"),
                  "no std (Dr. GRPO)": dict(estimator="dr_grpo")},
            panels=("mean_reward", "entropy", "frac_reward_zero_std"),
            table=("mean_reward", "entropy"),
            contrasts=(("group std (GRPO)", "batch std"),
                       ("group std (GRPO)", "no std (Dr. GRPO)"),
                       ("no std (Dr. GRPO)", "batch std")),
        ),
        Experiment(
            name="lm-length-bias",
            question="On the tiny Qwen2 (arithmetic, free scratch tokens after the answer, "
                     "12 tokens at most): does GRPO's per-sequence normalisation make "
                     "incorrect completions longer than the fix (token mean, no std)?",
            base=dict(completion_length=12),
            arms={"GRPO (seq mean, std norm)": dict(agg="seq", estimator="grpo"),
                  "fix (token mean, no std)": dict(agg="token", estimator="dr_grpo")},
            panels=("len_incorrect", "len_correct", "mean_reward", "mean_length"),
            table=("len_incorrect", "len_correct", "mean_reward"),
            program="lm",
            contrasts=(("fix (token mean, no std)", "GRPO (seq mean, std norm)"),),
        ),
        Experiment(
            name="lm-entropy",
            question="On the tiny Qwen2's exploration task ('near': the base model answers "
                     "a+b+-1 for half credit 90% of the time, the exact sum about 1%): do "
                     "clip-higher (0.2 / 0.28) or an entropy bonus (0.01) keep entropy up "
                     "and find the exact answer more often than symmetric clipping (0.2)?",
            base=dict(task="near", pretrain_steps=2000, inner_epochs=4),
            arms={"symmetric 0.2": dict(),
                  "clip-higher 0.2/0.28": dict(clip_eps_high=0.28),
                  "entropy bonus 0.01": dict(entropy_coef=0.01)},
            panels=("entropy", "correct_frac", "mean_reward", "clip_ratio/high_mean"),
            table=("entropy", "correct_frac", "mean_reward", "clip_ratio/high_mean"),
            program="lm",
            contrasts=(("symmetric 0.2", "clip-higher 0.2/0.28"),
                       ("symmetric 0.2", "entropy bonus 0.01")),
        ),
        Experiment(
            name="lm-zero-signal",
            question="On the tiny Qwen2 (arithmetic): how many groups carry no signal, at "
                     "one-digit and at harder two-digit operands, and does dynamic sampling "
                     "(oversample x4, keep groups that vary) help?",
            base=dict(),
            arms={"1 digit": dict(),
                  "1 digit, dynamic sampling x4": dict(dynamic_sampling=True, oversample=4),
                  "2 digits": dict(digits=2),
                  "2 digits, dynamic sampling x4": dict(digits=2, dynamic_sampling=True,
                                                        oversample=4)},
            panels=("mean_reward", "frac_reward_zero_std", "ds_filled"),
            table=("mean_reward", "frac_reward_zero_std", "ds_filled"),
            per_token=True,
            program="lm",
            contrasts=(("1 digit", "1 digit, dynamic sampling x4"),
                       ("2 digits", "2 digits, dynamic sampling x4")),
        ),
        Experiment(
            name="lm-estimators",
            question="On the tiny Qwen2 (arithmetic): GRPO vs Dr. GRPO vs RLOO vs PPO with "
                     "GAE (a value head on the final hidden state).",
            base=dict(),
            arms={"GRPO": dict(estimator="grpo"), "Dr. GRPO": dict(estimator="dr_grpo"),
                  "RLOO": dict(estimator="rloo"), "PPO + GAE": dict(estimator="gae")},
            panels=("mean_reward", "entropy", "frac_reward_zero_std"),
            table=("mean_reward", "entropy"),
            per_token=True,
            program="lm",
            contrasts=(("GRPO", "Dr. GRPO"), ("GRPO", "RLOO"), ("GRPO", "PPO + GAE")),
        ),
    )
}

#: Groups of experiments the CLI accepts as NAME.
GROUPS = {
    "counting": tuple(n for n, e in EXPERIMENTS.items() if e.program == "counting"),
    "lm": tuple(n for n, e in EXPERIMENTS.items() if e.program == "lm"),
    "all": tuple(EXPERIMENTS),
}


def run_experiment(name: str, seeds: int = 64, seed: int = 0,
                   on_arm=None) -> dict[str, RunResult]:
    """Train every arm of experiment ``name`` over ``seeds`` seeds; ``{arm: result}``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment must be one of {sorted(EXPERIMENTS)}, got {name!r}")
    exp = EXPERIMENTS[name]
    results = {}
    for arm in exp.arms:
        results[arm] = run_seeds("jax", exp.config(arm), list(range(seed, seed + seeds)))
        if on_arm is not None:
            on_arm(arm)
    return results


def table_markdown(exp: Experiment, results: dict[str, RunResult]) -> str:
    """Final figures (mean of each seed's last LAST steps; the reward also averaged over
    all steps, a measure of speed), mean over seeds [95% interval]; then, for each of
    ``exp.contrasts`` (A, B), the difference B - A with its 95% interval."""
    cols = [f"{m} (final)" for m in exp.table] + ["mean_reward (all steps)"]
    lines = ["| arm | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]

    def per_seed(r: RunResult) -> list[np.ndarray | None]:
        return [seed_means(r.metrics[m], LAST) if m in r.metrics else None
                for m in exp.table] + [seed_means(r.metrics["mean_reward"])]

    for arm, r in results.items():
        cells = []
        for series in per_seed(r):
            if series is None:  # the arm does not log this metric (e.g. ds_* without DS)
                cells.append("n/a")
                continue
            mean, lo, hi = mean_ci(series)
            cells.append(f"{mean:.3f} [{lo:.3f}, {hi:.3f}]")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    for a, b in exp.contrasts:
        cells = []
        for sa, sb in zip(per_seed(results[a]), per_seed(results[b]), strict=True):
            if sa is None or sb is None:
                cells.append("n/a")
                continue
            d, lo, hi = diff_ci(sa, sb)
            cells.append(f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        lines.append(f"| {b} minus {a} | " + " | ".join(cells) + " |")
    if exp.factorial is not None:
        effects = {name: [factorial_effects(*(per_seed(results[arm])[i]
                                              for arm in exp.factorial[1]))[name]
                          for i in range(len(cols))]
                   for name in ("factor 1", "factor 2", "interaction")}
        labels = {"factor 1": f"effect of {exp.factorial[0][0]}",
                  "factor 2": f"effect of {exp.factorial[0][1]}",
                  "interaction": "interaction"}
        for name, cells in effects.items():
            lines.append(f"| {labels[name]} | " + " | ".join(
                "n/a" if c is None else f"{c[0]:+.3f} [{c[1]:+.3f}, {c[2]:+.3f}]"
                for c in cells) + " |")
    n = len(next(iter(results.values())).seeds)
    note = f"\n\n{n} seeds per arm; final = mean of the last {LAST} steps."
    if exp.factorial is not None:
        note += (" An effect is the mean over the other factor's two levels of the "
                 "difference it makes; the interaction is how much that difference "
                 "changes between the other factor's levels (half the difference of the "
                 "two differences); each +- 1.96 standard errors, real at the 95% level "
                 "when its interval excludes 0.")
    if exp.contrasts:
        note += (" A difference is real at the 95% level when its interval excludes 0 "
                 "(independent runs: +- 1.96 sqrt(SE_A^2 + SE_B^2)).")
    return "\n".join(lines) + note + "\n"


def factorial_effects(y00, y10, y01, y11) -> dict[str, tuple[float, float, float] | None]:
    """Main effects and interaction of a 2x2 design from per-seed values of its four arms
    (``y10``: factor 1 on, factor 2 off; ...), each ``(estimate, lo, hi)`` with a normal
    95% interval over independent runs; ``None`` if an arm has no values.

    ``factor 1`` = ((y10 - y00) + (y11 - y01)) / 2, ``factor 2`` likewise, and
    ``interaction`` = ((y11 - y01) - (y10 - y00)) / 2: each a contrast ``sum_k c_k mean_k``
    with ``|c_k| = 1/2``, so its standard error is ``sqrt(sum_k SE_k^2) / 2``.

    >>> e = factorial_effects(np.array([0.0, 2]), np.array([1.0, 3]), np.array([0.0, 2]),
    ...                       np.array([3.0, 5]))
    >>> [round(e[k][0], 3) for k in ("factor 1", "factor 2", "interaction")]
    [2.0, 1.0, 1.0]
    """
    arms = []
    for y in (y00, y10, y01, y11):
        if y is None:
            return {"factor 1": None, "factor 2": None, "interaction": None}
        y = np.asarray(y, dtype=np.float64)
        y = y[np.isfinite(y)]
        arms.append((y.mean(), y.std(ddof=1) / np.sqrt(len(y)) if len(y) > 1 else 0.0))
    (m00, _), (m10, _), (m01, _), (m11, _) = arms
    se = float(np.sqrt(sum(s**2 for _, s in arms)) / 2)
    out = {}
    for name, d in (("factor 1", ((m10 - m00) + (m11 - m01)) / 2),
                    ("factor 2", ((m01 - m00) + (m11 - m10)) / 2),
                    ("interaction", ((m11 - m01) - (m10 - m00)) / 2)):
        out[name] = (float(d), float(d - 1.96 * se), float(d + 1.96 * se))
    return out


def seed_finals_csv(exp: Experiment, results: dict[str, RunResult]) -> str:
    """Per-seed final values (mean of the last LAST steps) of the table's metrics, and the
    reward over all steps: one CSV row per arm and seed."""
    names = [*exp.table, "mean_reward (all steps)"]
    rows = [["arm", "seed", *names]]
    for arm, r in results.items():
        cols = [seed_means(r.metrics[m], LAST) if m in r.metrics else
                np.full(len(r.seeds), np.nan) for m in exp.table]
        cols.append(seed_means(r.metrics["mean_reward"]))
        for i, s in enumerate(r.seeds):
            rows.append([arm, s, *(f"{c[i]:.6g}" for c in cols)])
    return _csv(rows)


def _csv(rows: list[list]) -> str:
    """``rows`` as CSV text (arm names hold commas: they are quoted)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


#: y-axis label (with units) of each metric the experiments plot, and its bounds: every
#: metric here is >= 0; the shares are also <= 1.
Y_LABELS = {
    "mean_reward": "mean reward (0 to 1)",
    "correct_frac": "share of completions correct",
    "entropy": "entropy (nats per token)",
    "kl": "KL to the reference (nats per token)",
    "frac_reward_zero_std": "share of groups with equal rewards",
    "ds_filled": "zero-variance groups kept (of 16)",
    "len_incorrect": "length (tokens)",
    "len_correct": "length (tokens)",
    "mean_length": "length (tokens)",
}
SHARES = ("mean_reward", "correct_frac", "frac_reward_zero_std")


def y_label(metric: str) -> str:
    """The y-axis label of ``metric``, with its unit."""
    if metric.startswith("clip_ratio/"):
        return "share of tokens clipped"
    return Y_LABELS.get(metric, metric)


def set_y_axis(ax, metric: str) -> None:
    """Label the y axis and show the whole range from 0 (and up to 1 for a share), so
    that the noise of a small quantity is not magnified into a feature."""
    ax.set_ylabel(y_label(metric))
    if metric in SHARES or metric.startswith("clip_ratio/"):
        ax.set_ylim(0, 1.02 if metric in SHARES else None)
    else:
        ax.set_ylim(bottom=0)


def curves_csv(exp: Experiment, results: dict[str, RunResult]) -> str:
    """Per-step curves of the plotted metrics: mean over seeds and its bootstrap 95%
    interval, one CSV row per arm and step (what the figure draws, as numbers)."""
    names = [m for m in dict.fromkeys((*exp.panels, *exp.table)) if m != "sampled_tokens"]
    rows = [["arm", "step", *(f"{m}{part}" for m in names for part in ("", " lo", " hi")),
             "cumulative sampled tokens"]]
    for arm, r in results.items():
        stats = []
        for m in names:
            if m in r.metrics:
                stats.append(mean_ci(r.metrics[m]))
            else:
                stats.append((np.full(r.metrics["mean_reward"].shape[1], np.nan),) * 3)
        tokens = np.cumsum(r.metrics["sampled_tokens"], axis=1).mean(axis=0)
        for t in range(len(tokens)):
            rows.append([arm, t, *(f"{x[t]:.6g}" for st in stats for x in st),
                         f"{tokens[t]:.6g}"])
    return _csv(rows)


def plot_experiment(exp: Experiment, results: dict[str, RunResult], path: Path) -> None:
    """Curves per metric (and reward per sampled token), mean over seeds, 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_panels = len(exp.panels) + int(exp.per_token)
    fig, axes = plt.subplots(1, n_panels, figsize=(4.3 * n_panels, 3.4), squeeze=False)
    color = {arm: f"C{i}" for i, arm in enumerate(results)}  # one colour per arm, every panel
    for ax, metric in zip(axes[0], exp.panels, strict=False):
        for arm, r in results.items():
            if metric not in r.metrics:
                continue
            mean, lo, hi = mean_ci(r.metrics[metric])
            steps = np.arange(len(mean))
            ax.plot(steps, mean, label=arm, color=color[arm])
            ax.fill_between(steps, lo, hi, alpha=0.2, color=color[arm])
        ax.set_title(metric)
        ax.set_xlabel("step")
        set_y_axis(ax, metric)
        ax.grid(alpha=0.3)
    if exp.per_token:
        ax = axes[0][-1]
        for arm, r in results.items():
            tokens = np.cumsum(r.metrics["sampled_tokens"], axis=1).mean(axis=0) / 1000
            mean, lo, hi = mean_ci(r.metrics["mean_reward"])
            ax.plot(tokens, mean, label=arm, color=color[arm])
            ax.fill_between(tokens, lo, hi, alpha=0.2, color=color[arm])
        ax.set_title("mean_reward per sampled token")
        ax.set_xlabel("cumulative sampled tokens (thousands)")
        set_y_axis(ax, "mean_reward")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    n = len(next(iter(results.values())).seeds)
    fig.suptitle(f"{exp.name}: mean over {n} seeds; band: bootstrap 95% interval of the mean "
                 "over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_experiment(exp: Experiment, results: dict[str, RunResult], out: Path) -> str:
    """Write ``out/<name>.png``, ``out/<name>.md`` and ``out/<name>-curves.csv`` (and, for
    a factorial design, the per-seed finals ``out/<name>.csv``); returns the table."""
    plot_experiment(exp, results, out / f"{exp.name}.png")
    table = table_markdown(exp, results)
    if exp.factorial is not None:
        (out / f"{exp.name}.csv").write_text(seed_finals_csv(exp, results))
    (out / f"{exp.name}-curves.csv").write_text(curves_csv(exp, results))
    (out / f"{exp.name}.md").write_text(f"### {exp.name}\n\n{exp.question}\n\n{table}")
    return table
