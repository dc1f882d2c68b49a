"""The compiled counting trainer over a device mesh (``jax.sharding``).

The mesh has two axes: ``"seeds"`` splits independent runs across devices (the vmapped
seed axis, via ``vmap(..., spmd_axis_name="seeds")``), and ``"data"`` splits each run's
prompt groups across devices, whole groups per device, so the group advantages need no
communication; the parameters are replicated and XLA all-reduces their gradients over
``"data"``. The program is the same ``make_train`` as on one device: only shardings are
added, so the results agree with the single-device run up to float reassociation.

Several hosts: call ``jax.distributed.initialize()`` on each host first; ``jax.devices()``
then lists every host's devices and the same mesh spans them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from grpospec import CountingConfig, check_positive_int
from grpospec.lm import LMConfig


def make_trainer(cfg: CountingConfig | LMConfig, batch_sharding=None, progress_every: int = 0):
    """The chunkable trainer (``init``, ``run``) of ``cfg``'s program."""
    if isinstance(cfg, LMConfig):
        from jaxgrpo.lm import make_trainer as make_lm_trainer

        return make_lm_trainer(cfg, batch_sharding, progress_every)
    from jaxgrpo.counting import make_trainer as make_counting_trainer

    return make_counting_trainer(cfg, batch_sharding, progress_every)


def make_train(cfg: CountingConfig | LMConfig, batch_sharding=None):
    """The trainer of ``cfg``'s program: ``jaxgrpo.counting`` or ``jaxgrpo.lm``."""
    if isinstance(cfg, LMConfig):
        from jaxgrpo.lm import make_train as make_lm_train

        return make_lm_train(cfg, batch_sharding)
    from jaxgrpo.counting import make_train as make_counting_train

    return make_counting_train(cfg, batch_sharding)


def make_mesh(seeds: int = 1, data: int = 1, devices=None) -> Mesh:
    """A ``("seeds", "data")`` mesh of ``seeds * data`` devices (the first ones)."""
    seeds, data = check_positive_int("seeds", seeds), check_positive_int("data", data)
    devices = list(jax.devices() if devices is None else devices)
    if seeds * data > len(devices):
        raise ValueError(
            f"a mesh of seeds={seeds} x data={data} needs {seeds * data} devices, but only "
            f"{len(devices)} are available (on a CPU, start with XLA_FLAGS="
            f"--xla_force_host_platform_device_count={seeds * data} to simulate them)")
    return Mesh(np.asarray(devices[: seeds * data]).reshape(seeds, data), ("seeds", "data"))


def parse_mesh(spec: str) -> tuple[int, int]:
    """``"SxD"`` (e.g. ``"2x4"``) -> (seeds axis size, data axis size)."""
    try:
        s, d = (int(p) for p in spec.lower().split("x"))
    except ValueError:
        raise ValueError(f"mesh must look like SEEDSxDATA, e.g. 2x4, got {spec!r}") from None
    if s < 1 or d < 1:
        raise ValueError(f"mesh axis sizes must be >= 1, got {spec!r}")
    return s, d


def check_mesh_fits(cfg: CountingConfig | LMConfig, n_seeds: int, mesh: Mesh) -> None:
    """Seeds split evenly over ``"seeds"``; whole prompt groups over ``"data"``."""
    s, d = mesh.shape["seeds"], mesh.shape["data"]
    if n_seeds % s:
        raise ValueError(f"the number of seeds ({n_seeds}) must be a multiple of the mesh's "
                         f"seeds axis ({s})")
    if cfg.n_prompts % d:
        raise ValueError(f"n_prompts ({cfg.n_prompts}) must be a multiple of the mesh's data "
                         f"axis ({d}), so that each device holds whole groups")
    pool = cfg.n_prompts * (cfg.oversample if cfg.dynamic_sampling else 1)
    if pool % d:
        raise ValueError(f"the sampled pool ({pool} groups) must be a multiple of the data "
                         f"axis ({d})")


@functools.lru_cache(maxsize=16)
def sharded_train(cfg: CountingConfig | LMConfig, mesh: Mesh):
    """``jit(vmap(train))`` over keys (n_seeds,), with seeds on ``"seeds"`` and each
    run's batch on ``"data"``; returns ``(final state, metrics)`` with a seed axis."""
    batch = NamedSharding(mesh, P("data")) if mesh.shape["data"] > 1 else None
    by_seed = NamedSharding(mesh, P("seeds"))
    train = jax.vmap(make_train(cfg, batch_sharding=batch), spmd_axis_name="seeds")
    return jax.jit(train, in_shardings=by_seed, out_shardings=by_seed)


def train_counting_sharded(cfg: CountingConfig | LMConfig, seeds: list[int], mesh: Mesh):
    """Train ``seeds`` runs of ``cfg``'s program (the counting task or the LM lab) on
    ``mesh``; ``(final state, {metric: (n_seeds, steps)})``."""
    check_mesh_fits(cfg, len(seeds), mesh)
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    state, metrics = sharded_train(cfg, mesh)(keys)
    return state, {k: np.asarray(metrics[k]) for k in cfg.metric_names}
