"""Model patch (GIT): generate keeps the 2-D attention mask over a static cache, as over a dynamic one.

Cause. Over a compileable cache (a static one), ``GenerationMixin.prepare_inputs_for_generation`` (generation/utils.py,
step 4) turns the 2-D mask over the ids into a 4-D one over the cache's slots (``create_masks_for_generate``).
``GitModel.forward`` (models/git/modeling_git.py:836-852) then widens the mask over its image tokens itself, which it
does by concatenating a 2-D block of ones onto it (at the prompt, beside the image's positions; at a later call, over
the cached image positions): ``generate(cache_implementation='static')`` fails in eager, 'Tensors must have same
number of dimensions: got 2 and 4'. Git builds its own mask (image positions bidirectional, text causal) with
masking_utils' create_causal_mask over the cache it is given, so it needs the 2-D mask, not generate's 4-D one.

What this changes (only where generate converted a 2-D mask, or none, for a compileable cache). The model inputs
``prepare_inputs_for_generation`` returns keep the caller's 2-D ``attention_mask`` (none where it was given none),
as over a dynamic cache. Git's generate with a static cache of the image positions + prompt + new tokens slots then
gives the default generate's logits exactly (eager, the sweep's tiny model, max_new_tokens=5: 0.0 apart, unpadded and
with a row left-padded by 2; tests/test_git_static.py). Calls over a dynamic cache, or given a 4-D mask, are
unchanged.

    before: attention_mask = create_masks_for_generate(...)   [batch, 1, S, max_cache_len]
    after:  attention_mask = the caller's 2-D mask             [batch, ids so far] (or none)

Remove when: GitForCausalLM keeps its 2-D mask for a static cache in transformers (a create_masks_for_generate
of its own that returns the 2-D mask, as the models that widen their masks themselves do).
"""

from __future__ import annotations

import functools
import inspect

from exporters.utils import ActedFlag, register_patch


@register_patch("dynamo", "transformers.models.git.modeling_git.GitForCausalLM.prepare_inputs_for_generation")
def _patch_git_keeps_2d_mask(original):
    signature = inspect.signature(original)
    acted = ActedFlag()  # set only on the calls whose mask generate turned 4-D

    @functools.wraps(original)
    def prepare(self, *args, **kwargs):
        bound = signature.bind_partial(self, *args, **kwargs).arguments
        given, cache = bound.get("attention_mask"), bound.get("past_key_values")
        inputs = original(self, *args, **kwargs)
        if getattr(cache, "is_compileable", False) and (given is None or given.dim() == 2) and \
                inputs.get("attention_mask") is not given:  # generate's 4-D mask over the cache's slots
            acted.set()
            inputs.pop("attention_mask", None)
            if given is not None:
                inputs["attention_mask"] = given
        return inputs

    prepare.acted = acted
    return prepare
