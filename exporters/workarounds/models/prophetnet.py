"""Model patches (ProphetNet): the decode step's position id without a Python ``int`` of the length; the decoder
over a static cache.

Model patch (ProphetNet): the decode step's position id without a Python ``int`` of the length.

Cause. ``ProphetNetPositionalEmbeddings.forward`` (models/prophetnet/modeling_prophetnet.py) computes
a decode step's position as ``torch.ones((1, 1)) * int(self.padding_idx + num_input_ids)``, where
``num_input_ids`` is the past length plus the new tokens. With a dynamic cache the ``int()`` turns the
symbolic length into the traced number, and torch.export keeps the guard ``past + new == 8``: the
exported decode step refuses every other length ("torch.export recorded the condition
past_key_values__0.size()[2] + input_ids.size()[1] == 8", test_generate dynamo/dynamic at 54a9425).

What this changes (while tracing only). The same position, left symbolic: ``padding_idx + past + new``
added to a ``[1, 1]`` tensor of zeros, so the value follows the length at run time. The prompt path
(no cache yet, positions from the mask) and calls with ``position_ids`` go to ``forward`` unchanged.

    before: torch.ones((1, 1)) * int(padding_idx + past + new)   (guard: past + new == 8)
    after:  torch.zeros((1, 1)) + (padding_idx + past + new)     (no guard)

Remove when: ``ProphetNetPositionalEmbeddings.forward`` drops the ``int()`` cast.

Model patch (ProphetNet): the decoder over a static cache, its masks and relative buckets laid over the cache's slots.

Cause. ``ProphetNetDecoder.forward`` (models/prophetnet/modeling_prophetnet.py:1142-1185) sizes everything to the
keys a dynamic cache holds: a call at past 0 builds its causal and n-gram stream masks and relative buckets over its
own ``seq`` tokens (``prepare_attention_mask``, ``prepare_predict_attention_mask``,
``compute_buffered_relative_buckets``), a later call (past > 0, one token) none, the attention then sizing its buckets
to the keys it gets and checking ``position_ids == key_length - 1``. Over a static cache the keys are
``max_cache_len`` slots: the model's own ``generate(cache_implementation='static')`` fails at the prompt (generate's 4D
mask over the slots meets the ``seq``-long one: "The size of tensor a (7) must match the size of tensor b (12) at
non-singleton dimension 5", ProphetNetForCausalLM, eager, the sweep's tiny model; 6 vs 11 for
ProphetNetForConditionalGeneration's decoder), and the unwritten slots would be attended; the branch on
``past_key_values_length != 0`` is a data-dependent guard in a step exported once for every past.

What this changes (only where the decoder's self-attention cache is a static one, its first layer with a
``cumulative_length`` tensor and a maximum length, and ``padding_idx`` is 0: with any other the model's own decode
step refuses its positions). The decoder's forward is run with the same embeddings and layers, its masks and
buckets built over the ``max_cache_len`` slots, the query at ``past + i`` (no Python branch on the past):

    main mask      [i, j]: causal (j <= past + i) + the caller's padding (past 0 only, as the original's prompt
                           mask; its later calls have none) + finfo.min on slots not written (j >= past + seq)
    predict mask   [s, i, j]: at past 0 the original's n-gram stream bias and padding, later calls 0 (none); the
                           unwritten slots finfo.min; the stream's own keys [i, k]: finfo.min where k != i
    main buckets   [i, j]: bucket(j - past - i)       (the original's j - i at past 0, j + 1 - position later)
    predict buckets[i, j]: bucket(j - past - i - 1) over the slots, bucket(k - i) over its own keys
    positions      padding_idx + past + 1 + i       (the original's: 1..seq at past 0, clamped; past + 1 later)

Each attended slot gets the value the dynamic cache's call gives it; the unwritten ones weigh exactly 0 (every row
has a written slot). The padding is read from a 2D mask's first ``seq`` columns, or from the last query row of a 4D
one (generate's own over a static cache). Without a cache, over a dynamic one, or with another ``padding_idx``, the
original forward runs.

    before: masks and buckets over seq (past 0) or none (later): 7 vs 12 at the prompt over a static cache
    after:  masks and buckets over max_cache_len slots, unwritten slots masked, one form for every past

Remove when: ProphetNet's decoder builds its masks and buckets over the cache's key length (for example from
masking_utils' ``create_causal_mask`` and ``cache_position``), so its generate runs with a static cache.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch
from exporters.workarounds.models._static_slots import static_self_layer


@register_patch("dynamo", "transformers.models.prophetnet.modeling_prophetnet.ProphetNetPositionalEmbeddings.forward")
def _patch_prophetnet_decode_position(original):
    @functools.wraps(original)
    def forward(self, inputs_shape, device, attention_mask=None, past_key_values=None, position_ids=None):
        if position_ids is None and self.padding_idx is not None and past_key_values is not None \
                and past_key_values.get_seq_length() != 0:
            length = inputs_shape[1] + past_key_values.get_seq_length()
            position_ids = torch.zeros((1, 1), dtype=torch.long, device=device) + (self.padding_idx + length)
            return torch.nn.Embedding.forward(self, position_ids), position_ids
        return original(self, inputs_shape, device, attention_mask, past_key_values, position_ids)

    return forward


def _prompt_padding(attention_mask, seq: int, slots: int, dtype, device) -> torch.Tensor:
    """``[batch or 1, 1, 1, slots]`` additive padding over the prompt's ``seq`` slots (zero beyond): a 2D mask's first
    ``seq`` columns as the original adds them, ``(1 - mask) * finfo.min``; a 4D mask's (generate's own over a static
    cache) last query row, the slots it does not allow finfo.min."""
    low = torch.finfo(dtype).min
    if attention_mask is None:
        return torch.zeros((1, 1, 1, slots), dtype=dtype, device=device)
    if attention_mask.dim() == 4:
        row = attention_mask[:, 0, -1, :seq]
        allowed = row if row.dtype == torch.bool else row == 0
        padding = torch.where(allowed, torch.zeros((), dtype=dtype, device=device),
                              torch.full((), low, dtype=dtype, device=device))
    else:
        padding = (1.0 - attention_mask[:, :seq].to(dtype)) * low
    padding = torch.nn.functional.pad(padding, (0, slots - seq))
    return padding[:, None, None, :]


def static_masks_and_buckets(decoder, past: torch.Tensor, seq: int, slots: int, attention_mask, dtype, device):
    """The main mask ``[b, 1, seq, slots]``, the predict mask ``[b, 1, ngram, seq, slots + seq]`` and the main and
    predict buckets ``[1, seq, slots]`` / ``[1, seq, slots + seq]`` of a call writing ``seq`` tokens after ``past``
    over a static cache of ``slots`` (see the module docstring)."""
    from transformers.models.prophetnet.modeling_prophetnet import compute_relative_buckets

    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    zero = torch.zeros((), dtype=dtype, device=device)
    past = past.reshape(()).to(device=device, dtype=torch.long)
    first = past == 0  # the original's prompt call: its masks; later calls have none
    rows = torch.arange(seq, device=device)[:, None]
    cols = torch.arange(slots, device=device)[None, :]
    queries = past + rows  # the slot each query writes
    unwritten = torch.where(cols >= past + seq, low, zero)  # [1, slots]
    padding = _prompt_padding(attention_mask, seq, slots, dtype, device) * first.to(dtype)  # [b, 1, 1, slots]

    main = torch.where(cols > queries, low, zero) + unwritten  # [seq, slots]
    main_mask = main[None, None] + padding

    streams = (1 - torch.arange(decoder.ngram, device=device)).view(-1, 1, 1)
    stream_bias = torch.where(((cols - rows)[None] >= streams) & (cols != 0)[None], low, zero)  # [ngram, seq, slots]
    left = stream_bias * first.to(dtype) + unwritten[None] + padding[:, :, 0][:, :, None]  # [b, ngram, seq, slots]
    own = torch.where(rows != torch.arange(seq, device=device)[None, :], low, zero)  # [seq, seq]
    right = own[None, None].expand(left.shape[0], decoder.ngram, seq, seq)
    predict_mask = torch.cat([left, right], dim=-1)[:, None]  # [b, 1, ngram, seq, slots + seq]

    def buckets(relative):
        return compute_relative_buckets(decoder.num_buckets, decoder.relative_max_distance, relative, False)

    main_buckets = buckets((cols - queries)[None])
    own_relative = torch.arange(seq, device=device)[None, :] - rows
    predict_buckets = torch.cat([buckets((cols - queries - 1)[None]), buckets(own_relative[None])], dim=-1)
    return main_mask, predict_mask, main_buckets, predict_buckets


def _static_decoder_forward(self, layer, input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask,
                            past_key_values, inputs_embeds, use_cache, output_attentions, output_hidden_states,
                            return_dict):
    """``ProphetNetDecoder.forward`` over a static cache: the original's steps, masks and buckets over the slots."""
    from transformers.models.prophetnet.modeling_prophetnet import ProphetNetDecoderModelOutput

    output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
    output_hidden_states = (output_hidden_states if output_hidden_states is not None
                            else self.config.output_hidden_states)
    return_dict = return_dict if return_dict is not None else self.config.return_dict
    if inputs_embeds is None:
        inputs_embeds = self.word_embeddings(input_ids)
    batch_size, sequence_length = inputs_embeds.shape[:2]
    device, dtype = inputs_embeds.device, inputs_embeds.dtype
    past = layer.cumulative_length.reshape(()).to(device=device, dtype=torch.long)

    # positions: 1..seq at past 0 (clamped, as the original's prompt), past + 1 later (its decode step)
    positions = self.position_embeddings.padding_idx + past + 1 + torch.arange(sequence_length, device=device)
    positions = torch.where(past == 0, positions.clamp(0, self.position_embeddings.max_length - 1), positions)
    position_ids = positions[None].expand(batch_size, sequence_length)
    main_stream_pos_embed = torch.nn.Embedding.forward(self.position_embeddings, position_ids)
    predicting_stream_pos_embed = self.position_embeddings._forward(position_ids + 1)
    hidden_states = inputs_embeds + main_stream_pos_embed
    ngram_embeddings = self.ngram_embeddings.weight
    ngram_hidden_states = [ngram_embeddings[ngram - 1] + predicting_stream_pos_embed for ngram in range(self.ngram)]

    main_mask, predict_mask, main_buckets, predict_buckets = static_masks_and_buckets(
        self, past, sequence_length, layer.max_cache_len, attention_mask, dtype, device)
    extended_attention_mask = main_mask.expand(batch_size, self.config.num_decoder_attention_heads, -1, -1)
    extended_predict_attention_mask = predict_mask.expand(batch_size, self.config.num_decoder_attention_heads,
                                                          -1, -1, -1)
    main_relative_position_buckets = main_buckets.repeat(batch_size, 1, 1)
    predict_relative_position_buckets = predict_buckets.repeat(batch_size, 1, 1)

    if encoder_attention_mask is not None:
        extended_encoder_attention_mask = (
            1.0 - encoder_attention_mask[:, None, None, :].repeat(1, self.config.num_decoder_attention_heads, 1, 1)
        ) * torch.finfo(self.dtype).min
        extended_encoder_attention_mask = extended_encoder_attention_mask.to(dtype)
    else:
        extended_encoder_attention_mask = None

    hidden_states = torch.cat([hidden_states] + ngram_hidden_states, 1)
    if self.embeddings_layer_norm:
        hidden_states = self.embeddings_layer_norm(hidden_states)
    hidden_states = torch.nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)

    all_main_stream_hidden_states = () if output_hidden_states else None
    all_ngram_stream_hidden_states = () if output_hidden_states and self.config.ngram > 0 else None
    all_main_stream_attns = () if output_attentions else None
    all_ngram_stream_attns = () if output_attentions else None
    all_cross_attns = () if output_attentions and self.config.add_cross_attention else None
    for decoder_layer in self.layers:
        if output_hidden_states:
            all_main_stream_hidden_states += (hidden_states[:, :sequence_length],)
            if self.config.ngram > 0:
                all_ngram_stream_hidden_states += (hidden_states[:, sequence_length:],)
        layer_outputs = decoder_layer(
            hidden_states, extended_attention_mask, encoder_hidden_states,
            encoder_attn_mask=extended_encoder_attention_mask,
            extended_predict_attention_mask=extended_predict_attention_mask,
            main_relative_position_buckets=main_relative_position_buckets,
            predict_relative_position_buckets=predict_relative_position_buckets,
            position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
            output_attentions=output_attentions,
        )
        hidden_states = layer_outputs[0]
        if output_attentions:
            all_main_stream_attns += (layer_outputs[1],)
            all_ngram_stream_attns += (layer_outputs[2],)
            if self.config.add_cross_attention:
                all_cross_attns += (layer_outputs[3],)
    if output_hidden_states:
        all_main_stream_hidden_states += (hidden_states[:, :sequence_length],)
        if self.config.ngram > 0:
            all_ngram_stream_hidden_states += (hidden_states[:, sequence_length:],)

    last_hidden_state = hidden_states[:, :sequence_length]
    last_hidden_state_ngram = hidden_states[:, sequence_length:] if self.config.ngram > 0 else None
    if not return_dict:
        return tuple(v for v in [last_hidden_state, last_hidden_state_ngram, past_key_values,
                                 all_main_stream_hidden_states, all_ngram_stream_hidden_states,
                                 all_main_stream_attns, all_ngram_stream_attns, all_cross_attns] if v is not None)
    return ProphetNetDecoderModelOutput(
        last_hidden_state=last_hidden_state, last_hidden_state_ngram=last_hidden_state_ngram,
        past_key_values=past_key_values, hidden_states=all_main_stream_hidden_states,
        hidden_states_ngram=all_ngram_stream_hidden_states, attentions=all_main_stream_attns,
        ngram_attentions=all_ngram_stream_attns, cross_attentions=all_cross_attns,
    )


@register_patch("dynamo", "transformers.models.prophetnet.modeling_prophetnet.ProphetNetDecoder.forward")
def _patch_prophetnet_static_decoder(original):
    @functools.wraps(original)
    def forward(self, input_ids=None, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                past_key_values=None, inputs_embeds=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        use = use_cache if use_cache is not None else self.config.use_cache
        layer = static_self_layer(past_key_values, 0) if use and not (self.gradient_checkpointing and self.training) \
            else None
        if layer is None or self.position_embeddings.padding_idx != 0 or (input_ids is None) == (inputs_embeds is None):
            return original(self, input_ids=input_ids, attention_mask=attention_mask,
                            encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask,
                            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                            return_dict=return_dict, **kwargs)
        return _static_decoder_forward(self, layer, input_ids, attention_mask, encoder_hidden_states,
                                       encoder_attention_mask, past_key_values, inputs_embeds, use, output_attentions,
                                       output_hidden_states, return_dict)

    return forward
