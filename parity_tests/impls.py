"""One adapter per implementation, so each generic test is written once.

An adapter turns NumPy inputs into the framework's arrays, results back into NumPy,
and says how randomness is passed (a ``torch.Generator`` / a JAX key).
"""

from __future__ import annotations

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
            import jax

            value, grad = jax.value_and_grad(
                lambda x: self.mod.grpo_loss(x, *args[1:], **kw))(args[0])
            return float(value), np.asarray(grad)
        x = args[0].requires_grad_(True)
        value = self.mod.grpo_loss(x, *args[1:], **kw)
        value.backward()
        return float(value.detach()), x.grad.numpy()

    def reinforce_estimates(self, theta, rewards, n, baseline, repeats, seed):
        """``repeats`` independent estimates (repeats, K), all from one generator/key."""
        from jaxgrpo.runs import reinforce_estimates

        return reinforce_estimates(self.name, theta, rewards, n, baseline, repeats, seed)


IMPLS = {name: Impl(name) for name in ("jax", "torch")}
