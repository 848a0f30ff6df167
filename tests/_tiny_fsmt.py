"""The tiny FSMT the static-cache tests share (``from _tiny_fsmt import tiny_fsmt``; tests/ is on sys.path): its
decoder takes no mask with a cache, so one call reads its prompt in both directions. init_std 0.5 gives it
context-dependent tokens; greedy search (FSMT's config asks for 5 beams, which the exported loop refuses)."""

from __future__ import annotations

import torch


def tiny_fsmt():
    """The model and encoder ids [2, 7]."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    torch.manual_seed(0)
    config = FSMTConfig(langs=["en", "de"], src_vocab_size=64, tgt_vocab_size=64, d_model=32, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, init_std=0.5)
    model = FSMTForConditionalGeneration(config).eval()
    model.generation_config.num_beams = 1
    return model, torch.randint(4, 64, (2, 7), generator=torch.Generator().manual_seed(1))
