"""Helpers shared by the generation test modules (imported as ``from _generation_check import ...``; tests/ is on
sys.path): a tiny generate-ready model, and the check that an exported generator matches eager greedy ``generate``."""

from __future__ import annotations

import torch


def tiny_for_generate(name: str):
    """The catalog's tiny ``name`` at the generate items' initializer range, and inputs ``generate`` takes."""
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference(name, init_range=0.2).tiny
    return tiny.model, generate_inputs(tiny.inputs)


def eager_generate(model, inputs, new: int):
    """Eager greedy ``generate`` of exactly ``new`` tokens, with its per-step logits."""
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              return_dict_in_generate=True, output_logits=True)


def assert_teacher_forced_match(generator, model, inputs, new: int):
    """``generator`` fed eager's tokens gives eager's logits at every step (1e-5) and, free-running, eager's tokens.
    Returns eager's output."""
    eager = eager_generate(model, inputs, new)
    out = generator.generate(**inputs, max_new_tokens=new, teacher_tokens=eager.sequences[:, -new:],
                             return_dict_in_generate=True, output_logits=True)
    for want, got in zip(eager.logits, out.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(out.sequences, eager.sequences)
    return eager
