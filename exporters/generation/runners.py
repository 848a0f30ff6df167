"""What the runtimes' own LLM runners read besides the model: ExecuTorch's LLM runner
(``executorch.extension.llm.runner.TextLLMRunner``) and a tokenizer for a tiny model.

ExecuTorch's runner (extension/llm/runner: constants.h, text_decoder_runner.cpp, util.h) loads a
``.pte`` whose ``forward`` takes ``(tokens [1, S] int64, cache positions [S] int64)`` (a second input
whose largest size is more than 1 is filled with ``start_pos .. start_pos + S - 1``), keeps the KV
cache inside the program, and reads these constant methods: ``get_max_seq_len``,
``get_max_context_len``, ``get_vocab_size``, ``get_bos_id``, ``get_eos_ids``, ``use_kv_cache``,
``use_sdpa_with_kv_cache``, ``enable_dynamic_shape``. A model without a cache runs in the runner's
no-cache form: ``use_kv_cache`` False and a ``forward`` of one input, the tokens ``[1, S]``, which the
runner feeds the prompt, then the prompt and every token generated so far (text_token_generator.h), taking
the last position's logits (exporters/generation/static_whole.py).

A tiny model has no tokenizer. ``word_tokenizer(vocab_size)`` builds one with the ``tokenizers``
library that the runners' own tokenizer code loads (ExecuTorch's C++ ``HFTokenizer`` takes a BPE model
with merges and a ``Split`` pre-tokenizer, and samples over the tokenizer's vocabulary, so the
vocabulary is exactly the model's): id ``i`` is the ``i``-th word of ``0-9A-Za-z`` strings in length
order (``0``..``z``, then ``00``..``zz``, ...), each longer word reachable by merges of its parts,
words separated by spaces. A prompt encodes to exactly the ids it names (``text_from_ids``), and each
piece a runner streams is one word, so the generated ids are exact (``ids_from_pieces``).
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterable, Mapping
from typing import Any

import torch

ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase


def llm_runner_methods(model: torch.nn.Module, generation: Mapping[str, Any], max_cache_len: int,
                       token_by_token: bool = False, use_kv_cache: bool = True) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads, for a static step of ``max_cache_len`` slots
    (``token_by_token``: a step of one token a call, which the runner then prefills token by token;
    ``use_kv_cache`` False: a step over the whole sequence, which the runner feeds every token so far)."""
    methods: dict[str, Any] = {
        "get_max_seq_len": max_cache_len,
        "get_max_context_len": max_cache_len,
        "get_vocab_size": vocab_size(model),
        "use_kv_cache": use_kv_cache,
        "use_sdpa_with_kv_cache": False,
        # True: the step takes a whole prompt at once (S from 1 to max_seq_len); False: one token a call
        "enable_dynamic_shape": not token_by_token,
    }
    if generation.get("bos_token_id") is not None:
        methods["get_bos_id"] = int(generation["bos_token_id"])
    eos = generation.get("eos_token_id")
    if eos is not None:
        methods["get_eos_ids"] = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return methods


def vocab_size(model: torch.nn.Module) -> int:
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "out_features"):
        return int(embeddings.out_features)
    return int(model.config.get_text_config(decoder=True).vocab_size)


def words(size: int) -> list[str]:
    """The word of every id below ``size``."""
    out: list[str] = []
    for length in itertools.count(1):
        for letters in itertools.product(ALPHABET, repeat=length):
            if len(out) == size:
                return out
            out.append("".join(letters))
    return out  # pragma: no cover - the loop returns


def width(size: int) -> int:
    """The word length of ``fixed_width_tokenizer(size)``: the smallest with 62**width >= size."""
    length = 1
    while len(ALPHABET) ** length < size:
        length += 1
    return length


def fixed_width_tokenizer(size: int):
    """The tokenizer onnxruntime-genai's tokenizer code (onnxruntime-extensions) reads: it keeps spaces
    as unknown tokens, so words are not separated; every id's word has the same width and the text is
    split into words of that width. The shorter strings the merges pass through get ids past ``size``
    (onnxruntime-genai samples over the model's logits, never over the tokenizer)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    n = width(size)
    table = ["".join(t) for t in itertools.islice(itertools.product(ALPHABET, repeat=n), size)]
    vocab = {w: i for i, w in enumerate(table)}
    for length in range(1, n):
        for letters in itertools.product(ALPHABET, repeat=length):
            vocab.setdefault("".join(letters), len(vocab))
    merges = [(w[:k], w[k:]) for w in vocab if len(w) > 1 for k in range(1, len(w))
              if w[:k] in vocab and w[k:] in vocab]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(f"[0-9A-Za-z]{{{n}}}"), behavior="isolated")
    return tokenizer


def fixed_width_text(ids: Iterable[int], size: int) -> str:
    n = width(size)
    return "".join("".join(t) for i in ids for t in [_nth(int(i), n)])


def _nth(index: int, n: int) -> str:
    letters = []
    for _ in range(n):
        index, digit = divmod(index, len(ALPHABET))
        letters.append(ALPHABET[digit])
    return "".join(reversed(letters))


def word_tokenizer(size: int):
    """A ``tokenizers.Tokenizer`` whose vocabulary is ``words(size)`` (see the module docstring)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(words(size))}
    merges = [(w[:k], w[k:]) for w in vocab if len(w) > 1 for k in range(1, len(w))
              if w[:k] in vocab and w[k:] in vocab]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    return tokenizer


def text_from_ids(ids: Iterable[int], size: int) -> str:
    table = words(size)
    return " ".join(table[int(i)] for i in ids)


def ids_from_pieces(pieces: Iterable[str], size: int) -> list[int]:
    """The ids of the pieces a runner streamed (one word each); a piece that is no word raises."""
    index = {w: i for i, w in enumerate(words(size))}
    unknown = [p for p in pieces if p not in index]
    if unknown:
        raise ValueError(f"the runner streamed pieces that are no word of the tokenizer: {unknown[:5]}")
    return [index[p] for p in pieces]


def run_executorch_llm(directory: str, prompt_ids: Iterable[int], max_new_tokens: int) -> tuple[list[int], dict[str, Any]]:
    """Greedy generation by ExecuTorch's own ``TextLLMRunner`` over a folder saved with
    ``save(runner=True)``: the new token ids (one per streamed piece) and the runner's stats."""
    import json
    import os

    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    with open(os.path.join(directory, "generator.json")) as f:
        size = int(json.load(f)["vocab_size"])
    runner = TextLLMRunner(os.path.join(directory, "model.pte"), os.path.join(directory, "tokenizer.json"))
    pieces: list[str] = []
    stats: list[Any] = []
    config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0)
    runner.generate(text_from_ids(prompt_ids, size), config, pieces.append, stats.append)
    report = {}
    if stats:
        report = {k: getattr(stats[-1], k) for k in ("num_prompt_tokens", "num_generated_tokens")}
    return ids_from_pieces(pieces, size), report


# the processors our loop applies (exporters/generation/processors.py) that the runners' greedy loops
# have no setting for: a model whose generation config switches one on would generate other tokens there
RUNNER_UNSUPPORTED = {"forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": None,
                      "begin_suppress_tokens": None, "min_new_tokens": 0, "min_length": 0,
                      "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0}


# the settings among those that name token ids: one naming no id of the vocabulary changes no logit
# (transformers' processors select the ids they name among the vocabulary's: SuppressTokensLogitsProcessor,
# SuppressTokensAtBeginLogitsProcessor, ForcedEOS / ForcedBOSTokenLogitsProcessor)
TOKEN_ID_SETTINGS = ("forced_bos_token_id", "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens")


def _names_a_token(value: Any, vocab: int | None) -> bool:
    if vocab is None:
        return True
    ids = value if isinstance(value, (list, tuple)) else [value]
    return any(0 <= int(i) < vocab for i in ids)


def check_runner_generation(generation: Mapping[str, Any], runner: str, vocab: int | None = None) -> None:
    """Raise a GenerationError naming the generation-config settings ``runner`` cannot apply. With the
    vocabulary size ``vocab``, a token-id setting whose ids all lie outside it acts on nothing and passes (a tiny
    Whisper's begin_suppress_tokens [220, 50256] over 128 ids)."""
    from exporters.generation.capture import GenerationError

    active = {k: generation.get(k) for k, neutral in RUNNER_UNSUPPORTED.items()
              if generation.get(k) not in (neutral, None, [], {})
              and (k not in TOKEN_ID_SETTINGS or _names_a_token(generation.get(k), vocab))}
    if active:
        raise GenerationError(f"the model's generation config sets {active}, which {runner}'s greedy loop has no "
                              "setting for: its tokens would differ from the model's generate")
