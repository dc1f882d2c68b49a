"""The frozen LM head's log-probs with their gradient computed in the forward pass
(``scaleup.logprobs.FrozenHeadLogprobs``): against finite differences, the plain
log-softmax, float64 in bfloat16, and the checkpointed chunks it replaces; and when
``completion_logprobs`` uses it."""

from __future__ import annotations

import pytest
import torch

import scaleup.logprobs as logprobs
from scaleup.logprobs import (
    FrozenHeadLogprobs,
    causal_lm_parts,
    completion_logprobs,
    frozen_head_forward,
    frozen_head_weight,
)
from scaleup.modeling import add_lora
from scaleup.tests.conftest import small_cfg
from scaleup.tiny import tiny_qwen2
from torchref import selective_log_softmax, token_entropy


def _head_inputs(dtype, n=2, t=3, h=5, v=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, t, h, generator=g, dtype=torch.float64) * 2).to(dtype)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64).to(dtype)
    ids = torch.randint(0, v, (n, t), generator=g)
    return hidden, weight, ids


@pytest.mark.parametrize("with_entropy", [False, True])
def test_the_gradient_equals_finite_differences(with_entropy):
    """Independent truth: central differences of the log-probs in float64
    (``torch.autograd.gradcheck``), through every position and hidden unit."""
    hidden, weight, ids = _head_inputs(torch.float64)
    hidden.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: FrozenHeadLogprobs.apply(x, weight, ids, with_entropy)[0], (hidden,))


def test_the_jacobian_is_the_target_row_minus_the_mean_row():
    """Hand-worked: with V = 2 rows and p the softmax, d logp[y] / d h = w[y] - p @ W."""
    weight = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    hidden = torch.tensor([[0.5, 0.25]], dtype=torch.float64)  # logits 0.5, 0.5: p = 1/2 each
    logp, _, jac = frozen_head_forward(hidden, weight, torch.tensor([1]), False)
    torch.testing.assert_close(logp, torch.tensor([-torch.log(torch.tensor(2.0)).item()],
                                                  dtype=torch.float64))
    torch.testing.assert_close(jac, torch.tensor([[-0.5, 1.0]], dtype=torch.float64))


def test_values_are_the_log_softmax_and_the_entropy():
    """float32: the log-probs are exactly ``selective_log_softmax``'s (the same operations),
    the entropy ``token_entropy``'s; the entropy takes no gradient."""
    hidden, weight, ids = _head_inputs(torch.float32, n=3, t=4, h=6, v=11, seed=1)
    hidden.requires_grad_(True)
    logp, entropy = FrozenHeadLogprobs.apply(hidden, weight, ids, True)
    logits = torch.nn.functional.linear(hidden.detach(), weight)
    torch.testing.assert_close(logp.detach(), selective_log_softmax(logits, ids), rtol=0,
                               atol=0)
    torch.testing.assert_close(entropy, token_entropy(logits), rtol=0, atol=1e-6)
    assert logp.requires_grad and not entropy.requires_grad
    assert FrozenHeadLogprobs.apply(hidden, weight, ids, False)[1] is None


def test_bfloat16_is_as_close_to_float64_as_the_checkpointed_head():
    """In bfloat16 the log-probs come in float32 and the hidden gradient in bfloat16, both
    near the float64 truth of the same bfloat16 inputs, as near as autograd's through
    the plain log-softmax."""
    hidden, weight, ids = _head_inputs(torch.bfloat16, n=4, t=8, h=32, v=500, seed=2)
    g = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))

    def grad_of(fn, dtype):
        x = hidden.detach().to(dtype).clone().requires_grad_(True)
        lp = fn(x)
        (lp * g.to(lp.dtype)).sum().backward()
        return lp.detach().double(), x.grad

    lp_f, grad_f = grad_of(lambda x: FrozenHeadLogprobs.apply(x, weight, ids, False)[0],
                           torch.bfloat16)
    lp_a, grad_a = grad_of(lambda x: selective_log_softmax(
        torch.nn.functional.linear(x, weight), ids), torch.bfloat16)
    lp_t, grad_t = grad_of(lambda x: selective_log_softmax(
        torch.nn.functional.linear(x, weight.double()), ids), torch.float64)
    assert grad_f.dtype == torch.bfloat16
    assert [x.dtype for x in frozen_head_forward(hidden, weight, ids, True)] == [
        torch.float32] * 3
    torch.testing.assert_close(lp_f, lp_a, rtol=0, atol=0)
    err_f = ((grad_f.double() - grad_t).norm() / grad_t.norm()).item()
    err_a = ((grad_a.double() - grad_t).norm() / grad_t.norm()).item()
    # both about 1% here, mostly the bfloat16 logits and gradient they share (within 3%
    # of each other over 9 sizes and seeds tried); a wrong term is O(1) off
    assert err_f < 2e-2 and err_f <= err_a * 1.1, (err_f, err_a)


@pytest.mark.parametrize(("make", "frozen"), [
    (lambda: torch.nn.Linear(4, 6, bias=False).requires_grad_(False), True),
    (lambda: torch.nn.Linear(4, 6, bias=False), False),           # the head trains
    (lambda: torch.nn.Linear(4, 6).requires_grad_(False), False),  # a bias
    (lambda: type("Sub", (torch.nn.Linear,), {})(4, 6, bias=False).requires_grad_(False),
     False),                                                       # not a plain Linear
], ids=["frozen", "trainable", "bias", "subclass"])
def test_frozen_head_weight_by_case(make, frozen):
    head = make()
    assert frozen_head_weight(head) is (head.weight if frozen else None)


def _model_and_batch(tokenizer):
    model = add_lora(tiny_qwen2(0, tokenizer), small_cfg())
    with torch.no_grad():
        g = torch.Generator().manual_seed(4)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    g = torch.Generator().manual_seed(5)
    p_ids = torch.randint(0, 256, (4, 5), generator=g)
    p_mask = torch.tensor([[0, 0, 1, 1, 1]] * 2 + [[1] * 5] * 2)
    c_ids = torch.randint(0, 256, (4, 7), generator=g)
    c_mask = torch.tensor([[1.0] * 7, [1.0] * 4 + [0.0] * 3, [1.0] * 7, [1.0] * 2 + [0.0] * 5])
    return model, (p_ids, p_mask, c_ids, c_mask)


def _run(model, batch, **kw):
    lp, ent = completion_logprobs(model, *batch, chunk=3, with_entropy=True, **kw)
    weights = torch.linspace(-1, 1, lp.numel()).reshape(lp.shape) * batch[3]
    (lp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return lp.detach(), ent, grads


def test_completion_logprobs_equal_the_checkpointed_chunks(tokenizer):
    """The fused head gives the checkpointed head's log-probs, entropies and LoRA
    gradients (float32: log-probs bit for bit, gradients to rounding)."""
    model, batch = _model_and_batch(tokenizer)
    lp, ent, grads = _run(model, batch)
    lp_c, ent_c, grads_c = _run(model, batch, fused_head=False)
    torch.testing.assert_close(lp, lp_c, rtol=0, atol=0)
    torch.testing.assert_close(ent, ent_c, rtol=1e-6, atol=1e-5)
    assert grads.keys() == grads_c.keys() and len(grads) > 0
    assert all(g.abs().max() > 0 for g in grads.values())
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_c[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(("case", "fused"), [
    ("grad", True), ("no_grad", False), ("entropy_grad", False), ("off", False),
    ("trainable_head", False)])
def test_completion_logprobs_fuses_the_head_only_where_it_is_exact(tokenizer, monkeypatch,
                                                                   case, fused):
    """Used with gradients on and a frozen head; not without gradients (nothing to keep),
    not for an entropy that takes a gradient (the entropy bonus), not when turned off,
    not for a head that trains (its weight gets its gradient, through the checkpointed
    chunk), and each chunk reaches it contiguous."""
    model, batch = _model_and_batch(tokenizer)
    seen = []
    real = logprobs.frozen_head_forward
    monkeypatch.setattr(logprobs, "frozen_head_forward", lambda h, *a: (
        seen.append(h.is_contiguous()), real(h, *a))[1])
    head = causal_lm_parts(model)[1]
    if case == "trainable_head":
        head.weight.requires_grad_(True)
    kw = {"entropy_grad": True} if case == "entropy_grad" else {}
    if case == "off":
        kw["fused_head"] = False  # on by default
    with torch.set_grad_enabled(case != "no_grad"):
        lp, ent = completion_logprobs(model, *batch, chunk=3, with_entropy=True, **kw)
    assert seen == ([True] * 3 if fused else [])
    if case == "trainable_head":
        lp.sum().backward()
        assert head.weight.grad is not None and head.weight.grad.abs().max() > 0
