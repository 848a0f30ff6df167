"""The greedy-search logits processors a generation config can switch on, applied by the exported loop
as ``generate`` applies them (transformers.generation.logits_process): the token chosen at a step
depends on them, the raw logits do not. A config that switches on a processor not listed here is
refused at export, naming the setting, rather than generating other tokens than eager."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError

APPLIED = ("forced_bos_token_id", "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens",
           "min_new_tokens", "min_length", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size")
# settings that change greedy tokens and that this loop does not apply, with their neutral value
NOT_APPLIED = {"repetition_penalty": 1.0, "bad_words_ids": None, "sequence_bias": None, "exponential_decay_length_penalty": None,
               "forced_decoder_ids": None, "renormalize_logits": False, "epsilon_cutoff": 0.0,
               "diversity_penalty": 0.0, "num_beams": 1, "do_sample": False, "watermarking_config": None,
               "logits_processor": None}


def check_supported(generation: Mapping[str, Any], model_name: str) -> None:
    active = [k for k, neutral in NOT_APPLIED.items() if generation.get(k, neutral) not in (neutral, None, [], {})]
    if active:
        raise GenerationError(f"{model_name}'s generation config sets {active}, which change the chosen tokens and "
                              "which the exported loop does not apply (exporters/generation/processors.py)")


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _banned_ngram_tokens(source: list[int], sequence: list[int], size: int) -> list[int]:
    """The tokens that would complete, after ``sequence``'s last ``size - 1`` tokens, an n-gram of
    ``size`` that occurs in ``source`` (transformers' _get_ngrams / _get_generated_ngrams)."""
    if size < 1 or len(sequence) + 1 < size:
        return []
    tail = tuple(sequence[len(sequence) + 1 - size:]) if size > 1 else ()
    return [source[i + size - 1] for i in range(len(source) - size + 1) if tuple(source[i:i + size - 1]) == tail]


def _ban_ngrams(generation: Mapping[str, Any], scores: torch.Tensor, sequence: torch.Tensor | None,
                encoder_ids: torch.Tensor | None) -> None:
    """``no_repeat_ngram_size``: a token that would repeat an n-gram of the sequence so far is banned;
    ``encoder_no_repeat_ngram_size``: one that would complete an n-gram of the encoder's input ids."""
    own, enc = generation.get("no_repeat_ngram_size") or 0, generation.get("encoder_no_repeat_ngram_size") or 0
    if not own and not enc:
        return
    if sequence is None or (enc and encoder_ids is None):
        raise GenerationError("the generation config bans repeated n-grams (no_repeat_ngram_size="
                              f"{own}, encoder_no_repeat_ngram_size={enc}); this loop was not given the "
                              "sequence so far or the encoder's input ids to apply it")
    for row in range(scores.shape[0]):
        tokens = sequence[row].tolist()
        banned = _banned_ngram_tokens(tokens, tokens, int(own)) if own else []
        if enc:
            banned += _banned_ngram_tokens(encoder_ids[row].tolist(), tokens, int(enc))
        if banned:
            scores[row, banned] = -float("inf")


def process(generation: Mapping[str, Any], scores: torch.Tensor, length: int, prompt_length: int,
            max_length: int, sequence: torch.Tensor | None = None,
            encoder_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``scores`` ([batch, vocab]) after the processors ``generate`` switches on, for the token at
    position ``length`` of sequences whose prompt is ``prompt_length`` long and at most ``max_length``;
    ``sequence``: the tokens so far ([batch, length]), ``encoder_ids``: an encoder-decoder's input ids
    (the n-gram bans need them)."""
    scores = scores.clone()
    _ban_ngrams(generation, scores, sequence, encoder_ids)
    neg = torch.finfo(scores.dtype).min
    eos = _ids(generation.get("eos_token_id"))
    min_new = generation.get("min_new_tokens")
    min_length = generation.get("min_length") or 0
    # generate masks these by torch.isin over the vocabulary: an id past the vocabulary (Whisper's
    # suppress_tokens on a tiny vocabulary) masks nothing
    vocab = scores.shape[-1]
    if eos and ((min_new and length - prompt_length < min_new) or length < min_length):
        scores[:, [i for i in eos if i < vocab]] = neg
    if generation.get("suppress_tokens"):
        scores[:, [i for i in _ids(generation["suppress_tokens"]) if i < vocab]] = neg
    if generation.get("begin_suppress_tokens") and length == prompt_length:
        scores[:, [i for i in _ids(generation["begin_suppress_tokens"]) if i < vocab]] = neg
    bos = generation.get("forced_bos_token_id")
    if bos is not None and length == 1:
        scores[:] = neg
        scores[:, int(bos)] = 0
    forced_eos = _ids(generation.get("forced_eos_token_id"))
    if forced_eos and length == max_length - 1:
        scores[:] = neg
        scores[:, forced_eos] = 0
    return scores


def end_and_pad(generation: Mapping[str, Any], eos_token_id=None, pad_token_id=None) -> tuple[list[int], int | None]:
    """The end ids and the pad id a loop uses: the call's, else the generation config's; the pad falls
    back to the first end id (as ``generate`` does)."""
    eos = _ids(eos_token_id if eos_token_id is not None else generation.get("eos_token_id"))
    pad = pad_token_id if pad_token_id is not None else generation.get("pad_token_id")
    return eos, (eos[0] if pad is None and eos else pad)


def greedy_token(generation: Mapping[str, Any], logits: torch.Tensor, *, length: int, prompt_length: int,
                 max_length: int, eos: list[int], pad: int | None, unfinished: torch.Tensor,
                 teacher: torch.Tensor | None = None, sequence: torch.Tensor | None = None,
                 encoder_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The token of one greedy step: the argmax of the processed ``logits`` (or ``teacher``'s token),
    ``pad`` for sequences already finished; marks in ``unfinished`` (in place) those that end here."""
    token = process(generation, logits, length, prompt_length, max_length, sequence, encoder_ids).argmax(-1) \
        if teacher is None else teacher
    if pad is not None and eos:
        token = torch.where(unfinished, token, torch.full_like(token, pad))
    if eos:
        unfinished &= ~torch.isin(token, torch.tensor(eos))
    return token
