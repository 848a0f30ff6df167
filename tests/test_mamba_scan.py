"""Mamba (v1) mixers' full-sequence scan from the cached state (exporters/workarounds/models/mamba_scan.py):
several tokens after a first call continue from its state, as onnxruntime-genai's one graph needs."""

from __future__ import annotations

import pytest
import torch


def _scan_args(length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    batch, channels, state = 2, 6, 4
    return dict(hidden_states=torch.randn(batch, channels, length, generator=g),
                dt=torch.randn(batch, channels, length, generator=g), A=-2 * torch.rand(channels, state, generator=g),
                B=torch.randn(batch, state, length, generator=g), C=torch.randn(batch, state, length, generator=g),
                D=torch.randn(channels, generator=g), z=torch.randn(batch, channels, length, generator=g),
                delta_bias=torch.randn(channels, generator=g), delta_softplus=True)


def _part(args, start, stop):
    return {k: (v[..., start:stop] if k in ("hidden_states", "dt", "B", "C", "z") else v) for k, v in args.items()}


def test_the_closed_form_scan_is_the_loop_from_zero_and_continues_a_split_sequence():
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan

    from exporters.workarounds.models.mamba_scan import scan_from

    args = _scan_args(9)
    full, last = mamba_selective_scan(**args, return_last_state=True)
    zero = torch.zeros(2, 6, 4)
    got, got_last = scan_from(zero, **args, return_last_state=True)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_last, last, atol=1e-5, rtol=1e-5)
    head, state = mamba_selective_scan(**_part(args, 0, 5), return_last_state=True)
    tail, tail_last = scan_from(state, **_part(args, 5, 9), return_last_state=True)
    torch.testing.assert_close(torch.cat([head, tail], dim=-1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tail_last, last, atol=1e-5, rtol=1e-5)
    # from zero instead of the state, the tail is another sequence's: what the unpatched mixer computed
    assert (scan_from(zero, **_part(args, 5, 9)) - full[..., 5:]).abs().max() > 1e-2


def _tiny(cls: str):
    """The zoo's model, its mixers' weights drawn wider: with the zoo's small ones a state stays ~1e-7 and its
    effect on the logits is below float32 rounding (Zamba)."""
    import copy

    from sweeps.runner import reference

    model = copy.deepcopy(reference(cls).tiny.model).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "mamba" in name.lower() or "mixer" in name:
                if param.dim() > 1 or "dt_proj" in name:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    return model


@pytest.mark.parametrize("cls", ["MambaForCausalLM", "ZambaForCausalLM"])
def test_tokens_after_a_first_call_match_the_whole_sequence_with_the_patch(cls):
    from exporters import get_exporter
    from exporters.generation.genai import model_patches
    from exporters.utils import FiredLog, apply_patches

    model = _tiny(cls)  # the zoo's: Zamba's mixer scans each of its heads separately
    cache_arg = "cache_params" if cls == "MambaForCausalLM" else "past_key_values"
    ids = torch.randint(0, int(model.config.vocab_size), (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits[:, 4:]

        def continued():
            first = model(input_ids=ids[:, :4], use_cache=True)
            return model(input_ids=ids[:, 4:], use_cache=True, **{cache_arg: getattr(first, cache_arg)}).logits

        unpatched = (continued() - want).abs().max().item()  # the defect: the tail scanned from a zero state
        fired = FiredLog()
        with apply_patches(model_patches(get_exporter("onnx")), fired):
            got = continued()
    error = (got - want).abs().max().item()
    # tiny random weights keep a state's effect on logits small: the patched error is float32 rounding, far
    # below the unpatched one
    assert error < 2e-6 and unpatched > 20 * error, (error, unpatched)
    assert any(name.endswith("mamba_selective_scan") for name in fired.names())
