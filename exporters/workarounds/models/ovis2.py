"""Model patch (Ovis2): the visual indicator embeddings written with ``torch.where``, without the
Python branch on whether the prompt holds each indicator token.

Cause. ``Ovis2Model.forward`` (models/ovis2/modeling_ovis2.py:575-585) writes each visual indicator's
embedding into ``inputs_embeds`` under ``if mask.any(): inputs_embeds[mask] = features[i]``, a Python
branch on token values, which torch.export cannot take ("Could not guard on data-dependent expression
Eq(u1, 1)").

What this changes (while tracing only). Before ``forward`` runs, the embeddings are looked up and
every indicator position set with ``torch.where(input_ids == token, features[i], embeds)``, a no-op
where the token is absent, exactly what the branch did when it was taken or not. ``forward`` then
gets those embeddings (``inputs_embeds``) and the image features it would have computed
(``mm_encoder_outputs``), with its indicator list emptied for the call so it writes nothing twice;
the image tokens are found from the embeddings as ``forward`` does when given no ids. Calls without
ids or without an image go to ``forward`` unchanged.

    before: for i, t in enumerate(ids): mask = input_ids == t; if mask.any(): embeds[mask] = f[i]
    after:  for i, t in enumerate(ids): embeds = where((input_ids == t)[..., None], f[i], embeds)

Remove when: ``Ovis2Model.forward`` writes the indicator embeddings with ``torch.where`` (or
``masked_scatter``) instead of under ``if mask.any()`` (transformers' modeling_ovis2.py).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch


def with_indicators(embeds: torch.Tensor, input_ids: torch.Tensor, tokens, features: torch.Tensor) -> torch.Tensor:
    """``embeds`` with each position holding ``tokens[i]`` set to ``features[i]``."""
    for i, token in enumerate(tokens):
        embeds = torch.where((input_ids == token)[..., None], features[i].to(embeds.dtype), embeds)
    return embeds


@register_patch("dynamo", "transformers.models.ovis2.modeling_ovis2.Ovis2Model.forward")
def _patch_visual_indicators_without_branch(original):
    @functools.wraps(original)
    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, labels=None, use_cache=None, mm_encoder_outputs=None,
                **kwargs):
        rest = dict(attention_mask=attention_mask, position_ids=position_ids, past_key_values=past_key_values,
                    labels=labels, use_cache=use_cache, **kwargs)
        tokens = list(self.visual_indicator_token_ids)
        if (input_ids is None or inputs_embeds is not None or not tokens
                or (pixel_values is None and mm_encoder_outputs is None)
                or (pixel_values is not None and mm_encoder_outputs is not None)):
            return original(self, input_ids=input_ids, pixel_values=pixel_values, inputs_embeds=inputs_embeds,
                            mm_encoder_outputs=mm_encoder_outputs, **rest)
        encoded = dict(mm_encoder_outputs or {})
        if encoded.get("image") is None:
            encoded["image"] = self.get_image_features(pixel_values=pixel_values, return_dict=True)
        embeds = with_indicators(self.get_input_embeddings()(input_ids), input_ids, tokens,
                                 encoded["image"].visual_indicator_features)
        self.visual_indicator_token_ids = []
        try:
            return original(self, input_ids=None, pixel_values=None, inputs_embeds=embeds,
                            mm_encoder_outputs=encoded, **rest)
        finally:
            self.visual_indicator_token_ids = tokens

    return forward
