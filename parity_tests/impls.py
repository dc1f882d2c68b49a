"""One adapter per implementation, so each generic test is written once.

An adapter turns NumPy inputs into the framework's arrays, results back into NumPy,
and says how randomness is passed (a ``torch.Generator`` / a JAX key).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

import numpy as np


@dataclass(frozen=True)
class Impl:
    name: str

    @property
    def mod(self) -> ModuleType:
        if self.name == "jax":
            import jaxgrpo

            return jaxgrpo
        import torchref

        return torchref

    def array(self, x, dtype=np.float32):
        x = np.asarray(x, dtype=dtype)
        if self.name == "jax":
            import jax.numpy as jnp

            return jnp.asarray(x)
        import torch

        return torch.from_numpy(x.copy())

    def rng(self, seed: int):
        """The framework's randomness: a JAX key / a seeded ``torch.Generator``."""
        if self.name == "jax":
            import jax

            return jax.random.key(seed)
        import torch

        return torch.Generator().manual_seed(seed)

    @staticmethod
    def numpy(y) -> np.ndarray:
        if hasattr(y, "detach"):
            y = y.detach()
        return np.asarray(y)

    def loss_and_grad(self, logp_new, logp_old, logp_ref, adv, mask, dtype=np.float32, **kw):
        """The GRPO loss and its gradient wrt ``logp_new``, both as NumPy."""
        args = [self.array(a, dtype) for a in (logp_new, logp_old, logp_ref, adv, mask)]
        if self.name == "jax":
            value, grad = _jax_value_and_grad(tuple(sorted(kw.items())), 0)(*args)
            return float(value), np.asarray(grad)
        x = args[0].requires_grad_(True)
        value = self.mod.grpo_loss(x, *args[1:], **kw)
        value.backward()
        return float(value.detach()), x.grad.numpy()

    def loss_and_grads(self, logp_new, logp_old, logp_ref, adv, mask, dtype=np.float64, **kw):
        """The GRPO loss and its gradients wrt ``logp_new``, ``logp_old``, ``logp_ref`` and
        ``adv``, as NumPy (``None`` for an input no gradient reaches at all: torch's
        ``.grad`` of a detached input)."""
        args = [self.array(a, dtype) for a in (logp_new, logp_old, logp_ref, adv, mask)]
        if self.name == "jax":
            value, grads = _jax_value_and_grad(tuple(sorted(kw.items())), (0, 1, 2, 3))(*args)
            return float(value), [np.asarray(g) for g in grads]
        for a in args[:4]:
            a.requires_grad_(True)
        value = self.mod.grpo_loss(*args, **kw)
        value.backward()
        return float(value.detach()), [None if a.grad is None else a.grad.numpy()
                                       for a in args[:4]]

    def clip_metrics(self, logp_new, logp_old, adv, mask, dtype=np.float64, **kw):
        """``clip_metrics`` as ``{name: float}``."""
        out = self.mod.clip_metrics(*(self.array(a, dtype) for a in (logp_new, logp_old, adv,
                                                                       mask)), **kw)
        return {k: float(self.numpy(v)) for k, v in out.items()}

    def reinforce_estimates(self, theta, rewards, n, baseline, repeats, seed):
        """``repeats`` independent estimates (repeats, K), all from one generator/key."""
        from jaxgrpo.runs import reinforce_estimates

        return reinforce_estimates(self.name, theta, rewards, n, baseline, repeats, seed)


@functools.cache
def _jax_value_and_grad(kw_items: tuple, argnums):
    """``jax.jit(jax.value_and_grad(grpo_loss))`` for one set of options (all static, as a
    user's Python numbers are: a Python ``beta == 0`` drops the KL term statically), so
    each input shape compiles once, value and gradient together."""
    import jax

    import jaxgrpo

    kw = dict(kw_items)

    def loss(new, old, ref, adv, mask):
        return jaxgrpo.grpo_loss(new, old, ref, adv, mask, **kw)

    vg = jax.value_and_grad(loss, argnums=argnums)
    return jax.jit(lambda *args: vg(*args))


IMPLS = {name: Impl(name) for name in ("jax", "torch")}
