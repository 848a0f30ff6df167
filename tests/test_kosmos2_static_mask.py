"""Kosmos-2's text model over a static cache (exporters/workarounds/models/kosmos2.py): its mask over the keys the
cache returns, so a prompt and a step give what the dynamic cache gives; and the static form's capture, which reads
generate's calls under the export's model patches where the model's own static-cache generate fails without them
(exporters/generation/static.py's ``_forward_arguments``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from transformers import Kosmos2TextConfig
    from transformers.models.kosmos2.modeling_kosmos2 import Kosmos2TextForCausalLM

    torch.manual_seed(0)
    config = Kosmos2TextConfig(vocab_size=64, embed_dim=32, layers=2, ffn_dim=64, attention_heads=4,
                               max_position_embeddings=64)
    ids = torch.randint(4, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    return Kosmos2TextForCausalLM(config).eval(), ids


def _entries():
    from exporters.utils import DEFAULT_REGISTRY

    return [e for e in DEFAULT_REGISTRY.patches("dynamo") if ".kosmos2." in e.path]


def _prompt_then_steps(model, ids, cache, mask=None):
    """The prompt's logits, then two one-token calls' (greedy), each over ``cache``."""
    out = []
    with torch.no_grad():
        step = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        out.append(step.logits[:, -1])
        for _ in range(2):
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            step = model(input_ids=step.logits[:, -1:].argmax(-1), attention_mask=mask, past_key_values=cache,
                         use_cache=True)
            out.append(step.logits[:, -1])
    return out


def test_a_static_cache_gives_the_dynamic_caches_logits_with_the_patch(tiny):
    from transformers import DynamicCache, StaticCache

    from exporters.utils import apply_patches

    model, ids = tiny
    want = _prompt_then_steps(model, ids, DynamicCache(config=model.config))
    with pytest.raises(RuntimeError, match="must match the size"):  # the defect the patch removes
        _prompt_then_steps(model, ids, StaticCache(config=model.config, max_cache_len=16))
    with apply_patches(_entries()) as fired:
        got = _prompt_then_steps(model, ids, StaticCache(config=model.config, max_cache_len=16))
        # without a cache or over a dynamic one the original runs: bit for bit what it gave unpatched
        dynamic = _prompt_then_steps(model, ids, DynamicCache(config=model.config))
        with torch.no_grad():
            uncached = model(input_ids=ids, use_cache=False).logits
    assert fired
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
    for g, w in zip(dynamic, want, strict=True):
        assert torch.equal(g, w)
    with torch.no_grad():
        assert torch.equal(uncached, model(input_ids=ids, use_cache=False).logits)


def test_a_padded_prompt_over_a_static_cache_with_the_patch(tiny):
    from transformers import DynamicCache, StaticCache

    from exporters.utils import apply_patches

    model, ids = tiny
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    want = _prompt_then_steps(model, ids, DynamicCache(config=model.config), mask)
    with apply_patches(_entries()):
        got = _prompt_then_steps(model, ids, StaticCache(config=model.config, max_cache_len=16), mask)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_the_static_capture_reads_the_calls_under_the_model_patches(tiny):
    from exporters.generation.capture import GenerationError
    from exporters.generation.static import _forward_arguments

    model, ids = tiny
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with pytest.raises(GenerationError, match="must match the size"):  # as the model is: both static caches fail
        _forward_arguments(model, inputs)
    calls = _forward_arguments(model, inputs, patches=_entries())
    assert len(calls) == 3 and calls[0]["input_ids"].shape == ids.shape and calls[1]["input_ids"].shape == (2, 1)


def test_model_patches_lists_the_dynamo_backends_patches_once():
    """For the dynamo backend its patches are the dynamo ones: listed twice, a factory would wrap its own patch
    (packed_attention.py's refuses a forward without its flash branch)."""
    from exporters import get_exporter
    from exporters.generation.genai import model_patches

    paths = [entry.path for entry in model_patches(get_exporter("dynamo"))]
    assert len(paths) == len(set(paths))
    assert any(".kosmos2." in path for path in paths)


@pytest.mark.parametrize("bounds", [(0, None), (1, None)])
def test_a_step_after_the_prompt_traces_where_its_past_is_bounded_from_one(tiny, bounds):
    """Kosmos-2's forward branches on ``past_key_values_length > 0`` (it drops the image inputs after the prompt): over
    the step's past read with ``.item()`` that is a guard torch cannot decide unless the step says where its calls
    start (``past_bounds``: 1 on for the step after a prompt component, static_prefill.py)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from exporters.generation.static import StaticStep, step_dynamic_shapes, step_example
    from exporters.utils import apply_patches

    model, ids = tiny
    step = StaticStep(model, 2, 16, "buffers", takes_positions=False, takes_mask=False).eval()
    step.past_bounds = bounds
    example = step_example(step, ids, None)
    shapes = step_dynamic_shapes(step, example)
    with apply_patches(_entries()), torch.no_grad():
        if bounds[0] == 0:
            with pytest.raises(GuardOnDataDependentSymNode, match="> 0"):
                torch.export.export(step, (), example, dynamic_shapes=shapes, strict=False)
            return
        program = torch.export.export(step, (), example, dynamic_shapes=shapes, strict=False).module()
        first = step(**example)  # the prompt, eager: the cache it wrote goes to the program's buffers too
        for name, buffer in step.named_buffers():
            if name.startswith("cache_"):
                getattr(program, name).copy_(buffer)
        after = {"input_ids": first["logits"].argmax(-1, keepdim=True), "cache_position": torch.tensor([7])}
        got = program(**after)["logits"]
        want = step(**after)["logits"]
    torch.testing.assert_close(got, want)
    with torch.no_grad(), pytest.raises(RuntimeError, match="u0 >= 1"):  # slot 0: refused by the runtime assertion
        program(**{"input_ids": after["input_ids"], "cache_position": torch.tensor([0])})
