"""The static step over a reference sliding-window layer (R-SWA, UnlimitedOcr's: the prompt's keys kept whole, the
decoded ones in a window): its form in the step (exporters/generation/static_layers.py's ``_reference_layer_class``)
keeps every slot and the prompt's length as a carried 0-d tensor the model's own mask reads, set by the call from
slot 0. Checked against eager's dynamic layer well past the window, eager and exported, and for a second prompt of
another length through the same program (eager's layer sizes its buffers to the first prompt's length)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

WINDOW, PROMPT, NEW, SLOTS = 3, 5, 8, 16


class _ReferenceLM(torch.nn.Module):
    """UnlimitedOcr's text model (every layer a reference sliding-window one, window 3) with a head: the calls a
    static step makes of a causal LM."""

    def __init__(self):
        super().__init__()
        from transformers.models.unlimited_ocr.configuration_unlimited_ocr import UnlimitedOcrTextConfig
        from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrTextModel

        torch.manual_seed(0)
        cfg = UnlimitedOcrTextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                     sliding_window=WINDOW, initializer_range=0.2, max_position_embeddings=64)
        cfg._attn_implementation = "sdpa"
        self.model = UnlimitedOcrTextModel(cfg).eval()
        self.config = cfg
        self.lm_head = torch.nn.Linear(32, 64, bias=False)

    def forward(self, input_ids=None, position_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0,
                **_):
        if position_ids is None:
            position_ids = _positions(input_ids, past_key_values)
        hidden = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=past_key_values,
                            use_cache=use_cache).last_hidden_state
        return SimpleNamespace(logits=self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden))


def _positions(ids, cache):
    past = 0 if cache is None else int(cache.get_seq_length())
    return (torch.arange(ids.shape[1]) + past)[None].expand(ids.shape[0], -1)


@pytest.fixture(scope="module")
def lm():
    return _ReferenceLM().eval()


def _ids(length, seed=1):
    return torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(seed))


def _eager(lm, ids, prompt, prefill_length=None):
    """Eager's logits over its own dynamic reference layers: the prompt in one call, then one token a call (the
    ids teacher-forced), the prompt's length declared first as generate's ``_prefill`` does."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=lm.config)
    for layer in cache.layers:
        layer.set_prefill_length(prompt if prefill_length is None else prefill_length)
    out = []
    with torch.no_grad():
        for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, ids.shape[1]))]:
            positions = torch.arange(start, end)[None].expand(ids.shape[0], -1)
            out.append(lm(input_ids=ids[:, start:end], position_ids=positions, past_key_values=cache,
                          use_cache=True, logits_to_keep=1).logits[:, -1])
    return torch.stack(out)


def _stepped(step, ids, prompt):
    """The step's logits, called as the static loop calls it: the prompt from slot 0, then one token a slot."""
    out = []
    with torch.no_grad():
        for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, ids.shape[1]))]:
            slots = torch.arange(start, end)
            out.append(step(input_ids=ids[:, start:end], cache_position=slots,
                            position_ids=slots[None].expand(ids.shape[0], -1))["logits"])
    return torch.stack(out)


def test_the_window_bites_at_these_sizes(lm):
    """Past the window, eager's logits differ from those of a layer that shows every past position (the prompt's
    length taken as the whole sequence): a step that ignored the window would fail the tests below."""
    ids = _ids(PROMPT + NEW)
    want = _eager(lm, ids, PROMPT)
    every = _eager(lm, ids, PROMPT, prefill_length=PROMPT + NEW)
    torch.testing.assert_close(every[:WINDOW + 1], want[:WINDOW + 1])  # no decoded key out of the window yet
    assert (every[WINDOW + 1:] - want[WINDOW + 1:]).abs().amax() > 1e-2


def test_the_step_keeps_the_prompt_length_as_a_carried_tensor_and_computes_eagers_logits(lm):
    from exporters.generation.static import StaticStep
    from exporters.generation.static_layers import is_reference

    step = StaticStep(lm, 2, SLOTS, "buffers", takes_positions=True, takes_mask=False).eval()
    assert all(is_reference(layer) for layer in step._cache.layers)
    assert step._parts[0] == ["key", "value", "prefill_length"]
    assert step.cache_shapes()["past_0_prefill_length"] == ()
    ids = _ids(PROMPT + NEW)
    torch.testing.assert_close(_stepped(step, ids, PROMPT), _eager(lm, ids, PROMPT), atol=1e-5, rtol=1e-5)
    assert float(step.cache_0_prefill_length) == PROMPT and float(step.cache_1_prefill_length) == PROMPT
    # a new sequence over what the last one left: its call from slot 0 sets the length again
    other = _ids(4 + NEW, seed=2)
    torch.testing.assert_close(_stepped(step, other, 4), _eager(lm, other, 4), atol=1e-5, rtol=1e-5)
    assert float(step.cache_0_prefill_length) == 4


def test_one_exported_step_serves_prompts_of_any_length(lm):
    """Exported once (at a prompt of 5), the program runs a prompt of 5 and then one of 3 as eager does: the
    prompt's length is the program's state, not a constant of its trace."""
    from exporters.generation.static import StaticStep, step_dynamic_shapes, step_example

    step = StaticStep(lm, 2, SLOTS, "buffers", takes_positions=True, takes_mask=False).eval()
    ids = _ids(PROMPT + NEW)
    example = step_example(step, ids[:, :PROMPT].contiguous(), None)  # (a slice: strides a guard on S)
    with torch.no_grad():
        program = torch.export.export(step, (), example, dynamic_shapes=step_dynamic_shapes(step, example),
                                      strict=False).module()
    torch.testing.assert_close(_stepped(program, ids, PROMPT), _eager(lm, ids, PROMPT), atol=1e-5, rtol=1e-5)
    other = _ids(3 + NEW, seed=3)
    torch.testing.assert_close(_stepped(program, other, 3), _eager(lm, other, 3), atol=1e-5, rtol=1e-5)


def test_inputs_form_carries_the_length_as_an_input_and_output(lm):
    from exporters.generation.static import StaticStep

    step = StaticStep(lm, 2, SLOTS, "inputs", takes_positions=True, takes_mask=False).eval()
    cache = {k: torch.zeros(s) for k, s in step.cache_shapes().items()}  # the loop's zeros: floats
    ids = _ids(PROMPT + NEW)
    with torch.no_grad():
        out = step(input_ids=ids[:, :PROMPT], cache_position=torch.arange(PROMPT),
                   position_ids=torch.arange(PROMPT)[None].expand(2, -1), **cache)
        assert float(out["present_0_prefill_length"]) == PROMPT
        cache = {k: out["present" + k.removeprefix("past")] for k in cache}
        out = step(input_ids=ids[:, PROMPT:PROMPT + 1], cache_position=torch.tensor([PROMPT]),
                   position_ids=torch.tensor([[PROMPT]] * 2), **cache)
    assert float(out["present_1_prefill_length"]) == PROMPT
