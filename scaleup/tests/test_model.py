"""Sampling, the response mask, log-probs and LoRA on the tiny Qwen2 model."""

from __future__ import annotations

import pytest
import torch

from scaleup.logprobs import completion_logprobs, position_ids
from scaleup.modeling import add_lora
from scaleup.rollout import response_mask, sample_rollouts, sampling_config
from scaleup.tasks import Problem
from scaleup.tests.conftest import small_cfg
from scaleup.tiny import IM_END, tiny_qwen2

CPU = torch.device("cpu")
PROBLEMS = [Problem("What is 3 + 4?", "7"), Problem("Hi", "")]


def _first_stop_mask(ids, stops):
    """The response mask written out with Python loops (a second implementation)."""
    out = []
    for row in ids.tolist():
        m, ended = [], False
        for t in row:
            m.append(0.0 if ended else 1.0)
            ended = ended or t in stops
        out.append(m)
    return torch.tensor(out)


def test_mask_stops_after_the_first_end_of_turn_token(tokenizer):
    eot = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[5, 7, eot, 9, eot, pad],   # stop at 2: later tokens are out
                        [eot, 1, 2, 3, 4, 5],       # stop first: only the stop token
                        [1, 2, 3, 4, 5, 6]])        # no stop: truncated, all in
    expected = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1.]])
    assert torch.equal(response_mask(ids, [eot]), expected)


def test_sampled_mask_and_truncation(policy, tokenizer):
    model, stops = policy
    torch.manual_seed(0)
    # make the end-of-turn token likely (embeddings are tied to the head) so that some
    # rows stop early and others do not
    with torch.no_grad():
        emb = model.get_base_model().get_input_embeddings().weight
        emb[stops[0]] = emb.std() * 3
    roll = sample_rollouts(model, tokenizer, PROBLEMS * 4, 4, 12, stops, CPU)
    expected = _first_stop_mask(roll.completion_ids, stops)
    assert torch.equal(roll.response_mask, expected)
    has_stop = torch.isin(roll.completion_ids, torch.tensor(stops)).any(1)
    assert torch.equal(roll.truncated, ~has_stop)
    assert 0 < int(roll.truncated.sum()) < len(roll.truncated)  # both kinds occur
    # the texts the checker scores: the completion up to its end, special tokens dropped
    for ids, m, text in zip(roll.completion_ids, roll.response_mask, roll.texts, strict=True):
        assert text == tokenizer.decode(ids[m != 0], skip_special_tokens=True)
        assert IM_END not in text and tokenizer.pad_token not in text
    # each prompt is one user turn with the assistant's turn opened
    for ids, m in zip(roll.prompt_ids, roll.prompt_mask, strict=True):
        assert tokenizer.decode(ids[m != 0]).endswith("<|im_start|>assistant\n")


def test_generate_samples_from_the_policy_itself(policy, tokenizer):
    """Processed scores equal the raw logits (no top-k/top-p/temperature warping) even
    when the model's generation config asks for Qwen-Instruct's warpers, and the
    training forward's log-probs equal generate's."""
    model, stops = policy
    gc = model.generation_config
    gc.top_k, gc.top_p, gc.temperature, gc.repetition_penalty = 20, 0.8, 0.7, 1.05
    enc = tokenizer(["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "a"],
                    padding=True, padding_side="left", return_tensors="pt")
    cfg = sampling_config(10, stops, tokenizer.pad_token_id)
    cfg.output_logits = cfg.output_scores = cfg.return_dict_in_generate = True
    torch.manual_seed(0)
    out = model.generate(**enc, generation_config=cfg)
    comp = out.sequences[:, enc["input_ids"].shape[1]:]
    mask = response_mask(comp, stops)
    raw = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)
    processed = torch.log_softmax(torch.stack(out.scores, 1).float(), -1)
    finite = torch.isfinite(processed).all()
    assert finite, "a warper masked tokens out"
    torch.testing.assert_close(processed, raw, rtol=0, atol=1e-5)
    lp_gen = raw.gather(-1, comp[..., None])[..., 0]
    lp, _ = completion_logprobs(model, enc["input_ids"], enc["attention_mask"], comp, mask,
                                chunk=3)
    torch.testing.assert_close(lp * mask, lp_gen * mask, rtol=0, atol=1e-4)


def test_chunked_logprobs_equal_the_full_logits(policy):
    """Second implementation: the model's ordinary forward, full fp32 logits."""
    model, _ = policy
    g = torch.Generator().manual_seed(1)
    p_ids = torch.randint(0, 256, (3, 5), generator=g)
    p_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    c_ids = torch.randint(0, 256, (3, 7), generator=g)
    c_mask = torch.ones(3, 7)
    lp, ent = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk=2,
                                  with_entropy=True)
    attn = torch.cat([p_mask, c_mask.long()], 1)
    logits = model(input_ids=torch.cat([p_ids, c_ids], 1), attention_mask=attn,
                   position_ids=position_ids(attn)).logits[:, 4:-1].double()
    want = torch.log_softmax(logits, -1).gather(-1, c_ids[..., None])[..., 0]
    torch.testing.assert_close(lp.double(), want, rtol=0, atol=1e-5)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(ent.double(), -(p * p.log()).sum(-1), rtol=0, atol=1e-5)


def test_the_lm_head_multiplies_contiguous_rows(policy):
    """Each chunk of hidden states reaches the LM head contiguous (one 2-D product), with
    and without gradients and in the backward's recompute: a strided chunk makes
    F.linear expand the head's weight to every row (in bf16 a copy per row: for the
    0.5B model's 151,936-way head a micro-batch's forward and backward 3x slower). With
    gradients on this is the checkpointed path (``fused_head=False``, or a head that
    trains); the fused head's chunks: test_fused_head.py."""
    from scaleup.logprobs import causal_lm_parts

    model, _ = policy
    _, head = causal_lm_parts(model)
    seen = []
    hook = head.register_forward_pre_hook(lambda _, args: seen.append(
        (args[0].is_contiguous(), torch.is_grad_enabled())))
    g = torch.Generator().manual_seed(2)
    p_ids, c_ids = torch.randint(0, 256, (3, 4), generator=g), torch.randint(0, 256, (3, 6),
                                                                            generator=g)
    p_mask, c_mask = torch.ones(3, 4, dtype=torch.long), torch.ones(3, 6)
    try:
        with torch.no_grad():
            completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk=4)
        lp, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk=4,
                                    fused_head=False)
        lp.sum().backward()
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
    # 2 chunks without grad, 2 with, 2 recomputed in the backward (grad on there too)
    assert [grad for _, grad in seen] == [False, False, True, True, True, True]
    assert all(contiguous for contiguous, _ in seen)


def test_generate_feeds_the_frozen_head_contiguous_rows(policy, tokenizer):
    """``generate``'s prefill hands the head a strided slice of the hidden states (seen by a
    hook ahead of ``add_lora``'s); the head itself gets it contiguous, so no batched
    product with the frozen weight expanded (and, in bf16, copied) per row runs: the
    0.5B model's 64-prompt prefill made a 17 GB copy without it (``contiguous_input``)."""
    from torch.profiler import ProfilerActivity, profile

    from scaleup.logprobs import causal_lm_parts

    model, stops = policy
    _, head = causal_lm_parts(model)
    assert not head.weight.requires_grad  # the case where F.linear does not fold
    raw, seen = [], []
    hooks = [head.register_forward_pre_hook(lambda _, a: raw.append(a[0].is_contiguous()),
                                            prepend=True),
             head.register_forward_pre_hook(lambda _, a: seen.append(a[0].is_contiguous()))]
    problems = [Problem("1+2=", "3"), Problem("4+4=", "8")]
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            sample_rollouts(model, tokenizer, problems, 2, 3, stops, torch.device("cpu"))
    finally:
        for h in hooks:
            h.remove()
    assert False in raw and len(seen) == len(raw) == 3 and all(seen)
    vocab = head.weight.shape[0]
    batched = [e.input_shapes for e in prof.key_averages(group_by_input_shape=True)
               if e.key == "aten::bmm" and any(s and s[-1] == vocab for s in e.input_shapes)]
    assert batched == []


def test_disabled_adapter_equals_the_base_model(tokenizer):
    base = tiny_qwen2(0, tokenizer)  # an independent copy with the same weights
    model = add_lora(tiny_qwen2(0, tokenizer), small_cfg())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = base(input_ids=ids).logits
        with_adapter = model(input_ids=ids).logits
        with model.disable_adapter():
            without = model(input_ids=ids).logits
    assert (with_adapter - want).abs().max() > 1e-2  # the adapter does something
    assert torch.equal(without, want)


def test_fresh_adapter_starts_as_the_base_model(tokenizer):
    base = tiny_qwen2(0, tokenizer)
    model = add_lora(tiny_qwen2(0, tokenizer), small_cfg())
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, base(input_ids=ids).logits,
                                   rtol=0, atol=1e-6)
    n_lora = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad)
    assert n_lora > 0
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("name", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                  "up_proj", "down_proj"])
def test_lora_on_all_linear_layers(policy, name):
    model, _ = policy
    assert any(f"{name}.lora_A" in n for n, _ in model.named_parameters())


def test_rollouts_select_keeps_every_field_of_the_chosen_rows():
    """Dynamic sampling drops groups with ``Rollouts.select``: each field of the result
    holds exactly the chosen rows, in order (texts and problems too), and the timing
    is kept."""
    import torch

    from scaleup.rollout import Rollouts
    from scaleup.tasks import Problem

    n = 4
    roll = Rollouts(torch.arange(n * 2).view(n, 2), torch.arange(n * 2).view(n, 2) % 2,
                    torch.arange(n * 3).view(n, 3) + 100, torch.arange(n * 3).view(n, 3) % 3,
                    torch.tensor([True, False, True, False]), [f"t{i}" for i in range(n)],
                    [Problem(f"p{i}", str(i)) for i in range(n)], 1.5)
    rows = torch.tensor([3, 1])
    sub = roll.select(rows)
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "response_mask", "truncated"):
        assert torch.equal(getattr(sub, name), getattr(roll, name)[rows]), name
    assert sub.texts == ["t3", "t1"]
    assert [p.prompt for p in sub.problems] == ["p3", "p1"]
    assert sub.sample_seconds == 1.5
    assert sub.logp_sampler is None
    # vLLM's rollouts carry the sampler's log-probs: the same rows of them
    roll.logp_sampler = -torch.arange(n * 3.0).view(n, 3)
    assert torch.equal(roll.select(rows).logp_sampler, roll.logp_sampler[rows])


def _runs_batch():
    """Seven rows whose prompts come in runs A A A B B C A (A left-padded, B and C not),
    completions with and without trailing padding."""
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(0, 256, (5,), generator=g) for _ in range(3))
    a[:2] = 0
    p_ids = torch.stack([a, a, a, b, b, c, a])
    p_mask = torch.ones(7, 5, dtype=torch.long)
    p_mask[[0, 1, 2, 6], :2] = 0
    c_ids = torch.randint(0, 256, (7, 6), generator=g)
    c_mask = torch.ones(7, 6)
    c_mask[1, 3:] = 0
    c_mask[4, 1:] = 0
    return p_ids, p_mask, c_ids, c_mask


def _decoder_calls(model):
    """A list that records the batch size of each decoder forward, and its hook."""
    from scaleup.logprobs import causal_lm_parts

    rows = []
    hook = causal_lm_parts(model)[0].register_forward_pre_hook(
        lambda _, args, kw: rows.append((args[0] if args else kw["input_ids"]).shape[0]),
        with_kwargs=True)
    return rows, hook


def _logprobs_and_grads(model, batch, share):
    lp, ent = completion_logprobs(model, *batch, chunk=4, with_entropy=True,
                                  entropy_grad=True, share_prompts=share)
    ((lp + 0.1 * ent) * batch[3]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return lp.detach(), ent.detach(), grads


def _nonzero_adapter(model):
    """Give LoRA's B a value, so that its A has a gradient too."""
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("sliding", [False, True])
def test_a_repeated_prompt_runs_once_with_the_same_logprobs_and_gradients(tokenizer, sliding):
    """Consecutive rows with one prompt run it once (4 distinct runs of 7 rows: two
    decoder calls, 4 rows then 7), and give the ordinary forward's log-probs and
    entropies (independent truth: the model's own logits over the whole sequence) and
    the same gradient as one forward over every row; also with a sliding-window layer
    (a window of 3 positions, which changes the log-probs)."""
    sizes = dict(use_sliding_window=True, sliding_window=3, max_window_layers=1) if sliding \
        else {}
    model = add_lora(tiny_qwen2(0, tokenizer, **sizes), small_cfg())
    assert ("sliding_attention" in model.config.layer_types) == sliding
    _nonzero_adapter(model)
    model.train()
    batch = _runs_batch()
    p_ids, p_mask, c_ids, c_mask = batch
    rows, hook = _decoder_calls(model)
    try:
        lp, ent, grads = _logprobs_and_grads(model, batch, share=True)
        shared_calls = list(rows)
        rows.clear()
        lp_one, ent_one, grads_one = _logprobs_and_grads(model, batch, share=False)
        assert rows == [7]
    finally:
        hook.remove()
    assert shared_calls == [4, 7]
    valid = c_mask != 0
    attn = torch.cat([p_mask, c_mask.long()], 1)
    with torch.no_grad():
        logits = model(input_ids=torch.cat([p_ids, c_ids], 1), attention_mask=attn,
                       position_ids=position_ids(attn)).logits[:, 4:-1].double()
    want = torch.log_softmax(logits, -1).gather(-1, c_ids[..., None])[..., 0]
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(lp.double()[valid], want[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double()[valid], -(p * p.log()).sum(-1)[valid], rtol=0,
                               atol=1e-5)
    torch.testing.assert_close(lp[valid], lp_one[valid], rtol=0, atol=1e-5)
    # float32 rounding: here up to 4e-6 apart (the log-softmax runs in float32 either way);
    # a gradient that missed the prompt's share through the repeated cache is O(1) off
    assert grads.keys() == grads_one.keys() and all(g.abs().max() > 0 for g in grads.values())
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_one[name], rtol=1e-3, atol=1e-5, msg=name)


def test_a_one_token_completion_with_a_shared_prompt(policy):
    """T = 1: only the prompt's last position predicts; no completion forward."""
    model, _ = policy
    p_ids, p_mask, c_ids, c_mask = (x[:, :1] if i >= 2 else x
                                    for i, x in enumerate(_runs_batch()))
    rows, hook = _decoder_calls(model)
    try:
        with torch.no_grad():
            lp, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
            lp_one, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask,
                                            share_prompts=False)
    finally:
        hook.remove()
    assert rows == [4, 7]
    torch.testing.assert_close(lp, lp_one, rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", ["checkpointing", "dropout", "dropout_eval"])
def test_prompts_are_shared_only_where_the_forward_allows(tokenizer, case):
    """Under activation checkpointing transformers drops the key/value cache, and with
    dropout acting each row draws its own masks: then one forward over every row. In
    eval mode the dropout does not act, and the prompts are shared."""
    from scaleup.modeling import enable_activation_checkpointing

    cfg = small_cfg(lora_dropout=0.0 if case == "checkpointing" else 0.5)
    model = add_lora(tiny_qwen2(0, tokenizer), cfg)
    if case == "checkpointing":
        enable_activation_checkpointing(model)
    model.train(case != "dropout_eval")
    rows, hook = _decoder_calls(model)
    try:
        lp, _ = completion_logprobs(model, *_runs_batch())
        lp.sum().backward()
    finally:
        hook.remove()
    assert rows == ([4, 7] if case == "dropout_eval" else [7])


def test_the_default_head_chunk_is_64_positions(policy):
    """70 completion positions reach the LM head as chunks of 64 and 6."""
    model, _ = policy
    from scaleup.logprobs import causal_lm_parts

    seen = []
    hook = causal_lm_parts(model)[1].register_forward_pre_hook(
        lambda _, args: seen.append(args[0].shape[1]))
    g = torch.Generator().manual_seed(5)
    try:
        with torch.no_grad():
            completion_logprobs(model, torch.randint(0, 256, (2, 3), generator=g),
                                torch.ones(2, 3, dtype=torch.long),
                                torch.randint(0, 256, (2, 70), generator=g), torch.ones(2, 70))
    finally:
        hook.remove()
    assert seen == [64, 6]


class _Decoder(torch.nn.Module):
    """A stand-in decoder: a config, and modules that may checkpoint or drop out."""

    def __init__(self, config, *children):
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleList(children)


def _checkpointed():
    layer = torch.nn.Linear(2, 2)
    layer.gradient_checkpointing = True
    return layer


@pytest.mark.parametrize(("config", "children", "training", "shares"), [
    ({}, [], True, True),                                   # a config without the field
    ({"attention_dropout": 0.0}, [torch.nn.Dropout(0.0)], True, True),
    ({"attention_dropout": 0.5}, [], True, False),
    ({"attention_dropout": 0.5}, [], False, True),
    ({}, [torch.nn.Dropout(0.1)], True, False),
    ({}, [torch.nn.Dropout(0.1)], False, True),
    ({}, [_checkpointed()], False, False),
], ids=["no-field", "zero-dropouts", "attention-dropout", "attention-dropout-eval",
        "dropout", "dropout-eval", "checkpointing"])
def test_can_share_prompts_by_case(config, children, training, shares):
    from types import SimpleNamespace

    from scaleup.logprobs import can_share_prompts

    decoder = _Decoder(SimpleNamespace(**config), *children).train(training)
    assert can_share_prompts(decoder) is shares
