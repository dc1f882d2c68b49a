"""Per-token log-probs of completions from the training forward, in chunks.

The decoder runs over ``[prompt | completion]`` (one forward, or the two of a shared
prompt, below); the LM head and the log-softmax then run over ``chunk`` positions at a
time, so the full-vocabulary float32 logits of the whole batch never exist at once: at
most (rows, chunk, V) of them. With gradients on, a chunk runs under activation
checkpointing (its logits recomputed in the backward pass), or, for a frozen head, as
:class:`FrozenHeadLogprobs` (below).

A GRPO batch holds each prompt G times, in consecutive rows. The decoder then runs each
distinct prompt once and its completions on the prompt's keys and values, repeated for
each row (:func:`completion_hidden`): the same function (the gradient reaches the
prompt's positions through the repeated keys and values), with G - 1 of every G prompt
forwards saved.

When the LM head is a frozen linear map (LoRA leaves Qwen's tied head untouched), its
gradient is known in the forward pass: ``d logp_t / d h_t = w[y_t] - p_t W`` (the target
token's row of the head minus the probability-weighted mean row). :class:`FrozenHeadLogprobs`
computes it there, once per chunk, and keeps only that (rows, chunk, H) matrix for the
backward, which then multiplies it by the incoming gradient: no (rows, chunk, V) logits
are kept or recomputed, the head's product runs once forward and once for ``p_t W``
(where checkpointing ran it three times: forward, recompute, backward).
"""

from __future__ import annotations

import torch
from peft import PeftModel
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from torchref import selective_log_softmax, token_entropy


def causal_lm_parts(model):
    """``(decoder, lm_head)`` of a causal LM, looking through a peft wrapper (the LoRA
    layers live inside them, so they stay active unless the adapter is disabled)."""
    lm = model.get_base_model() if isinstance(model, PeftModel) else model
    return lm.base_model, lm.get_output_embeddings()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, as ``generate`` does with left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def prompt_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Runs of consecutive rows with the same prompt (ids and mask).

    Returns ``(first, run)``: ``first`` (U,) the first row of each run, ``run`` (N,) the
    run of each row (so ``prompt_ids[first][run]`` is ``prompt_ids``); ``None`` when no
    row repeats the prompt of the row before it (nothing to share).
    """
    same = ((prompt_ids[1:] == prompt_ids[:-1]).all(1)
            & (prompt_mask[1:] == prompt_mask[:-1]).all(1))
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero()[:, 0], starts.long().cumsum(0) - 1


def can_share_prompts(decoder) -> bool:
    """Whether :func:`completion_hidden` may run a repeated prompt once: not under
    activation checkpointing (transformers then drops the key/value cache the completions
    read), and no dropout that acts (with it each row draws its own masks at the prompt's
    positions, which one shared forward would not)."""
    for m in decoder.modules():
        # transformers sets the flag on each module it checkpoints (and on the decoder)
        if vars(m).get("gradient_checkpointing") is True:
            return False
        if decoder.training and isinstance(m, torch.nn.Dropout) and m.p > 0:
            return False
    return not (decoder.training and getattr(decoder.config, "attention_dropout", 0) > 0)


def completion_hidden(decoder, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                      share_prompts: bool) -> torch.Tensor:
    """The decoder's last hidden states (N, T, H) that predict each completion token:
    position ``P - 1 + t`` of ``[prompt | completion]`` predicts completion token ``t``.

    Positions are counted over real tokens (:func:`position_ids`). With ``share_prompts``
    (and :func:`can_share_prompts`), when consecutive rows repeat a prompt
    (:func:`prompt_runs`), the decoder runs each distinct prompt once with a key/value
    cache, the cache's rows are repeated for the rows of each run, and the completions
    (all but their last token, which predicts nothing) run on it. Otherwise one forward
    over ``[prompt | completion]``. The two are the same function, equal up to rounding.
    """
    attn = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    n_prompt, n_comp = prompt_ids.shape[1], completion_ids.shape[1]
    runs = prompt_runs(prompt_ids, prompt_mask) if share_prompts else None
    if runs is None or not can_share_prompts(decoder):
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn),
                         use_cache=False).last_hidden_state
        return hidden[:, n_prompt - 1: n_prompt - 1 + n_comp]
    first, run = runs
    # the forward fills the cache it is given, the 4th positional argument (transformers
    # 5.2x renamed it from past_key_values to cache); a plain DynamicCache keeps every
    # position of every layer, which is right for sliding-window layers too
    cache = DynamicCache()
    hidden = decoder(prompt_ids[first], prompt_mask[first], position_ids(prompt_mask[first]),
                     cache).last_hidden_state
    last = hidden[run, -1:]  # the last prompt position predicts completion token 0
    if n_comp == 1:
        return last
    cache.batch_select_indices(run)  # each run's keys and values, once per row
    tail = decoder(completion_ids[:, :-1], attn[:, :-1], position_ids(attn)[:, n_prompt:-1],
                   cache).last_hidden_state
    return torch.cat([last, tail], dim=1)


def _head_logprobs(head, hidden: torch.Tensor, ids: torch.Tensor, with_entropy: bool,
                   entropy_grad: bool = False):
    # A chunk is a strided slice of the (N, L, H) hidden states. Given that, F.linear
    # runs a batched product with the head's weight expanded to N rows, which bf16
    # copies (N x 272 MB for Qwen2.5-0.5B's 151,936 x 896 head: 24x slower than one
    # (N*chunk, H) x (H, V) product, a micro-batch's forward and backward 3x slower).
    logits = head(hidden.contiguous())
    logp = selective_log_softmax(logits, ids)
    if not with_entropy:
        return logp, None
    if entropy_grad:  # the entropy bonus differentiates it (recomputed in the backward too)
        return logp, token_entropy(logits)
    with torch.no_grad():
        return logp, token_entropy(logits)


def frozen_head_weight(head):
    """The weight (V, H) of ``head`` when it is a plain bias-free ``nn.Linear`` whose weight
    takes no gradient (:class:`FrozenHeadLogprobs` applies); else ``None``."""
    if type(head) is torch.nn.Linear and head.bias is None and not head.weight.requires_grad:
        return head.weight
    return None


def frozen_head_forward(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
                        with_entropy: bool):
    """Log-probs of ``ids`` under ``softmax(hidden @ weight.T)`` and their gradient.

    Args:
      hidden: (..., H) hidden states; weight: (V, H) the head; ids: (...) token ids.
      with_entropy: also the entropy of each position's distribution.
    Returns:
      ``(logp, entropy, jac)``, in float32 (float64 for a float64 weight): logp (...)
      ``log p[y] = z[y] - logsumexp(z)`` with ``z = hidden @ weight.T`` (the operations of
      :func:`torchref.selective_log_softmax`, so the same values); entropy (...)
      ``-sum_v p_v log p_v``, or ``None``; jac (..., H) ``d logp / d hidden = weight[y] -
      p @ weight``, ``p = softmax(z)`` (its product with the weight in the weight's dtype).
    """
    wide = torch.promote_types(weight.dtype, torch.float32)  # float64 stays (gradcheck)
    logp_all = torch.nn.functional.linear(hidden, weight).to(wide)
    logp_all -= torch.logsumexp(logp_all, dim=-1, keepdim=True)
    logp = logp_all.gather(-1, ids[..., None]).squeeze(-1)
    probs = logp_all.exp()
    entropy = -(probs * logp_all).sum(-1) if with_entropy else None
    del logp_all
    jac = weight[ids].to(wide) - probs.to(weight.dtype) @ weight  # promoted to ``wide``
    return logp, entropy, jac


class FrozenHeadLogprobs(torch.autograd.Function):
    """:func:`frozen_head_forward` as an autograd op: the gradient flows to ``hidden``
    only (``grad_hidden = grad_logp * jac``, in ``hidden``'s dtype); the head's weight is
    frozen and the entropy has no gradient. ``apply(hidden, weight, ids, with_entropy)``
    returns ``(logp, entropy)``."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, with_entropy):
        logp, entropy, jac = frozen_head_forward(hidden, weight, ids, with_entropy)
        ctx.save_for_backward(jac)
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        (jac,) = ctx.saved_tensors
        # autograd casts a gradient to its input's dtype (bfloat16 hidden: bfloat16)
        return grad_logp[..., None] * jac, None, None, None


def completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                        chunk: int = 64, with_entropy: bool = False,
                        entropy_grad: bool = False, share_prompts: bool = True,
                        fused_head: bool = True):
    """Log-probs (and optionally entropies) of each completion token under ``model``.

    Args:
      model: a causal LM (peft-wrapped or not).
      prompt_ids, prompt_mask: (N, P) left-padded prompts.
      completion_ids, completion_mask: (N, T) completions and their response mask.
      chunk: positions per LM-head chunk.
      with_entropy: also return the entropy ``H_t = -sum_v p_v log p_v`` of each
        position's distribution (no grad unless ``entropy_grad``).
      entropy_grad: the entropy keeps its gradient (for an entropy bonus in the loss); it
        is computed per chunk under the same checkpoint as the log-probs, so its (rows,
        chunk, V) logits are recomputed in the backward pass, never all kept.
      share_prompts: run a prompt repeated in consecutive rows once
        (:func:`completion_hidden`).
      fused_head: with gradients on, a frozen head (:func:`frozen_head_weight`) and no
        entropy gradient, compute the head's gradient in the forward pass
        (:class:`FrozenHeadLogprobs`) instead of checkpointing the chunk.
    Returns:
      ``(logp, entropy)``: (N, T) float32 each (``entropy`` is ``None`` unless asked).
      Values at masked positions are meaningless; mask them.
    """
    decoder, head = causal_lm_parts(model)
    hidden = completion_hidden(decoder, prompt_ids, prompt_mask, completion_ids,
                               completion_mask, share_prompts)
    n_comp = completion_ids.shape[1]
    weight = (frozen_head_weight(head) if fused_head and torch.is_grad_enabled()
              and not entropy_grad else None)
    logps, ents = [], []
    for start in range(0, n_comp, chunk):
        h, tgt = hidden[:, start:start + chunk], completion_ids[:, start:start + chunk]
        if weight is not None:
            lp, ent = FrozenHeadLogprobs.apply(h.contiguous(), weight, tgt, with_entropy)
        elif torch.is_grad_enabled():
            lp, ent = checkpoint(_head_logprobs, head, h, tgt, with_entropy, entropy_grad,
                                 use_reentrant=False)
        else:
            lp, ent = _head_logprobs(head, h, tgt, with_entropy)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps, dim=1)
    return logp, (torch.cat(ents, dim=1) if with_entropy else None)


def trim(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Drop the columns that are padding in every row: leading prompt padding and trailing
    completion positions after every row's end. Returns the four tensors sliced."""
    first = int(prompt_mask.any(0).float().argmax())
    valid_cols = completion_mask.any(0).nonzero()
    last = int(valid_cols[-1]) + 1 if len(valid_cols) else 1
    return (prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :last],
            completion_mask[:, :last])
