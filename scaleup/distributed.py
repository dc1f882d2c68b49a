"""Several processes (``torchrun --nproc_per_node=K``): process group, DDP, rank helpers.

A run with K processes splits each step's B prompts into K shares of whole groups
(rank r gets prompts ``r*B/K .. (r+1)*B/K - 1`` of the step's list, each with its G
completions), samples them with its own torch RNG stream (``seed + rank``), and trains
one LoRA replica under :class:`~torch.nn.parallel.DistributedDataParallel`: DDP averages
the gradients over the K ranks once per optimizer step. The loss normaliser is global
(see :func:`scaleup.step.loss_normaliser`). Only rank 0 writes logs and checkpoints.

Without a process group (a plain ``python`` / ``grpo-scaleup`` run) every helper here
answers for a single process: rank 0 of world size 1, and the reductions are identities.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scaleup.config import ConfigError, TrainConfig
from scaleup.logprobs import completion_logprobs


def is_distributed() -> bool:
    """A process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """K, the number of processes (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    """Rank 0: the process that logs and checkpoints."""
    return rank() == 0


@dataclass
class DistSetup:
    """What :func:`init_distributed` did: ``device`` (this rank's), and whether this call
    created the process group (then :func:`finish_distributed` destroys it)."""

    device: str
    created: bool


def launched_world_size() -> int:
    """WORLD_SIZE set by ``torchrun`` / ``accelerate launch`` (1 when not launched so)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device: str) -> DistSetup:
    """Join the process group that ``torchrun`` describes in the environment (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), if any.

    The backend is NCCL when this rank trains on a GPU, else gloo. ``device`` is the
    run's ``--device``; on a GPU run each rank takes ``cuda:LOCAL_RANK`` (``auto`` and
    ``cuda`` both mean that), so one node's K processes use its K GPUs. Returns the
    device this rank should use. Without WORLD_SIZE > 1 nothing happens.
    """
    if dist.is_available() and dist.is_initialized():
        return DistSetup(_rank_device(device), created=False)
    if launched_world_size() <= 1:
        return DistSetup(device, created=False)
    if not dist.is_available():  # pragma: no cover - every standard torch build has it
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    dev = _rank_device(device)
    backend = "nccl" if dev.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(dev))
    dist.init_process_group(backend=backend)
    return DistSetup(dev, created=True)


def _rank_device(device: str) -> str:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cpu" or device.startswith("cuda:"):
        return device
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return f"cuda:{local}"
    return "cpu"


def finish_distributed(setup: DistSetup, ok: bool = True) -> None:
    """Destroy the process group if ``setup`` created it; after a normal end (``ok``) wait
    for every rank first (after an error the other ranks may never arrive)."""
    if setup.created and dist.is_initialized():
        if ok:
            dist.barrier()
        dist.destroy_process_group()


def check_divisible(cfg: TrainConfig, k: int | None = None) -> None:
    """Each of the K ranks samples whole groups: B must be a multiple of K."""
    k = world_size() if k is None else k
    if cfg.prompts_per_step % k:
        raise ConfigError(f"prompts_per_step (--prompts-per-step) = {cfg.prompts_per_step} "
                          f"must be divisible by the number of processes ({k}): each process "
                          "samples whole groups of an equal share of the prompts")


def rank_share(items: list, k: int | None = None, r: int | None = None) -> list:
    """Rank ``r``'s contiguous share of ``items`` (``len(items)`` divisible by ``k``)."""
    k = world_size() if k is None else k
    r = rank() if r is None else r
    if len(items) % k:
        raise ValueError(f"{len(items)} items do not split into {k} equal shares")
    n = len(items) // k
    return items[r * n:(r + 1) * n]


def all_reduce(values: list[float], op: str = "sum", device=None) -> list[float]:
    """Sum (or max) of each value over the ranks, in float64; identity in one process."""
    values = [float(v) for v in values]
    if not is_distributed():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def all_gather_cat(x: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D ``x`` (of any length) concatenated in rank order, on every rank;
    ``x`` itself in one process. (Lengths are gathered first, then padded tensors.)"""
    if not is_distributed():
        return x
    n = torch.tensor([x.numel()], dtype=torch.int64, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world_size())]
    dist.all_gather(sizes, n)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=x.dtype, device=x.device)
    padded[:x.numel()] = x
    parts = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:int(s)] for p, s in zip(parts, sizes, strict=True)])


def on_main_then_share(fn: Callable[[], object]):
    """Run ``fn`` on rank 0 only and give every rank its result, or raise its exception
    on every rank (so a refused output folder stops all ranks, not only rank 0)."""
    if not is_distributed():
        return fn()
    box: list = [None, None]
    if is_main():
        try:
            box[0] = fn()
        except Exception as e:  # re-raised below, on every rank
            box[1] = e
    dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise box[1]
    return box[0]


def gather_to_main(obj) -> list | None:
    """Every rank's ``obj``, in rank order, on rank 0 (``None`` elsewhere)."""
    if not is_distributed():
        return [obj]
    out = [None] * world_size() if is_main() else None
    dist.gather_object(obj, out, dst=0)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()


class LogprobModule(torch.nn.Module):
    """The training forward (:func:`scaleup.logprobs.completion_logprobs` of the policy)
    as a module, so that DDP wraps exactly the computation whose gradient it reduces."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask, chunk,
                with_entropy, entropy_grad=False):
        return completion_logprobs(self.policy, prompt_ids, prompt_mask, completion_ids,
                                   completion_mask, chunk, with_entropy, entropy_grad)


def wrap_ddp(policy, device: torch.device) -> DistributedDataParallel | None:
    """DDP over the policy's training forward when K > 1, else ``None`` (plain calls).

    Only the LoRA parameters need gradients, so only they are reduced; DDP checks at
    construction that every rank holds the same parameters (and broadcasts rank 0's).
    """
    if not is_distributed():
        return None
    ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    return DistributedDataParallel(LogprobModule(policy), device_ids=ids)
