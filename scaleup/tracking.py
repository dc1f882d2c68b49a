"""``--report-to``: the step metrics of ``log.jsonl`` sent to an experiment tracker too.

TRL's option name and values: ``tensorboard`` (event files in ``<output-dir>/tensorboard``,
through torch's ``SummaryWriter``; needs ``pip install -e ".[tracking]"``), ``wandb`` and
``trackio`` (their own ``init`` / ``log`` / ``finish``; install the package, and log in for
wandb). Every finite numeric metric of a step is logged under its ``log.jsonl`` key, at
the step's number.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from scaleup.config import ConfigError, TrainConfig

INSTALL = {"tensorboard": 'pip install -e ".[tracking]" (tensorboard)',
           "wandb": "pip install wandb", "trackio": "pip install trackio"}


def scalars(metrics: dict) -> dict[str, float]:
    """The finite numbers of a step's metrics (null / NaN ones, e.g. KL when it is not
    computed, are left out, as in the console line)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or k == "step":
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


class Tracker:
    """Log one step's metrics; close at the end."""

    def __init__(self, kind: str, cfg: TrainConfig, out: Path):
        self.kind = kind
        try:
            if kind == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                self._run = SummaryWriter(log_dir=str(out / "tensorboard"))
            elif kind == "wandb":
                import wandb

                self._run = wandb.init(project="grpo-scaleup", name=out.name, dir=str(out),
                                       config=dataclasses.asdict(cfg))
            elif kind == "trackio":
                import trackio

                self._run = trackio.init(project="grpo-scaleup", name=out.name,
                                         config=dataclasses.asdict(cfg))
            else:  # validate() refuses other values
                raise ConfigError(f"report_to {kind!r} is not a tracker")
        except ImportError as e:
            raise ConfigError(f"--report-to {kind} needs the {kind} package, which cannot be "
                              f"imported ({e}); install it with: {INSTALL[kind]}") from None

    def log(self, metrics: dict, step: int) -> None:
        values = scalars(metrics)
        if self.kind == "tensorboard":
            for k, v in values.items():
                self._run.add_scalar(k, v, step)
            self._run.flush()
        elif self.kind == "wandb":
            self._run.log(values, step=step)
        else:
            import trackio

            trackio.log(values, step=step)

    def close(self) -> None:
        if self.kind == "tensorboard":
            self._run.close()
        elif self.kind == "wandb":
            self._run.finish()
        else:
            import trackio

            trackio.finish()


def make_tracker(cfg: TrainConfig, out: Path) -> Tracker | None:
    """The tracker ``cfg.report_to`` names, or None for ``none``."""
    return None if cfg.report_to == "none" else Tracker(cfg.report_to, cfg, out)
