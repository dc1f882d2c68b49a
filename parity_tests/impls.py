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
        """The GRPO loss and its gradient wrt ``logp_new``, both as NumPy. ``kw`` are
        ``grpo_loss``'s options; its array options (``entropy``, ``logp_sampler``) may be
        NumPy arrays."""
        value, grads = self.loss_and_grads(logp_new, logp_old, logp_ref, adv, mask, dtype,
                                           _wrt=(0,), **kw)
        return value, grads[0]

    def loss_and_grads(self, logp_new, logp_old, logp_ref, adv, mask, dtype=np.float64,
                       _wrt=(0, 1, 2, 3, 5), **kw):
        """The GRPO loss and its gradients wrt ``logp_new``, ``logp_old``, ``logp_ref``,
        ``adv`` and (when given) ``entropy``, as NumPy; ``None`` for an input no gradient
        reaches at all (torch's ``.grad`` of a detached input) or that was not given."""
        extra = {k: kw.pop(k) for k in ARRAY_OPTIONS if kw.get(k) is not None}
        kw = {k: v for k, v in kw.items() if k not in ARRAY_OPTIONS}
        inputs = [logp_new, logp_old, logp_ref, adv, mask, extra.get("entropy"),
                  extra.get("logp_sampler")]
        args = [None if a is None else self.array(a, dtype) for a in inputs]
        wrt = tuple(i for i in _wrt if args[i] is not None)
        if self.name == "jax":
            present = tuple(a is not None for a in args)
            value, grads = _jax_value_and_grad(tuple(sorted(kw.items())), wrt, present)(
                *[a for a in args if a is not None])
            by_index = dict(zip(wrt, grads, strict=True))
            return float(value), [None if by_index.get(i) is None else np.asarray(by_index[i])
                                  for i in _wrt]
        for i in wrt:
            args[i].requires_grad_(True)
        value = self.mod.grpo_loss(*args[:5], entropy=args[5], logp_sampler=args[6], **kw)
        value.backward()
        return float(value.detach()), [None if args[i] is None or args[i].grad is None
                                       else args[i].grad.numpy() for i in _wrt]

    def clip_metrics(self, logp_new, logp_old, adv, mask, dtype=np.float64, **kw):
        """``clip_metrics`` as ``{name: float}``."""
        out = self.mod.clip_metrics(*(self.array(a, dtype) for a in (logp_new, logp_old, adv,
                                                                       mask)), **kw)
        return {k: float(self.numpy(v)) for k, v in out.items()}

    def reinforce_estimates(self, theta, rewards, n, baseline, repeats, seed):
        """``repeats`` independent estimates (repeats, K), all from one generator/key."""
        from jaxgrpo.runs import reinforce_estimates

        return reinforce_estimates(self.name, theta, rewards, n, baseline, repeats, seed)


ARRAY_OPTIONS = ("entropy", "logp_sampler")


@functools.cache
def _jax_value_and_grad(kw_items: tuple, argnums: tuple, present: tuple):
    """``jax.jit(jax.value_and_grad(grpo_loss))`` for one set of options (all static, as a
    user's Python numbers are: a Python ``beta == 0`` drops the KL term statically), so
    each input shape compiles once, value and gradients together. ``present``: which of
    (new, old, ref, adv, mask, entropy, logp_sampler) are passed."""
    import jax

    import jaxgrpo

    kw = dict(kw_items)
    slots = [i for i, p in enumerate(present) if p]

    def loss(*given):
        full = dict(zip(slots, given, strict=True))
        return jaxgrpo.grpo_loss(*(full[i] for i in range(5)), entropy=full.get(5),
                                 logp_sampler=full.get(6), **kw)

    vg = jax.value_and_grad(loss, argnums=tuple(slots.index(i) for i in argnums))
    return jax.jit(lambda *args: vg(*args))


IMPLS = {name: Impl(name) for name in ("jax", "torch")}
