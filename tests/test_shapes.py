"""sweeps.shapes: size groups, wrap-index resizing, --sizes parsing, and one real dynamic check.

Most tests use a fake artifact (only ``dynamic_dims`` and ``input_specs``, the two attributes
``size_groups``/``resize_inputs`` read); one exports a tiny hand-built BertModel with torch.export.
"""

from __future__ import annotations

import pytest
import torch

from sweeps.shapes import ShapeMismatch, check_dynamic_shapes, format_sizes, parse_sizes, resize_inputs, size_groups


class FakeArtifact:
    """``input_specs``: name -> (traced shape, dtype, {dim: {"symbol", "min", "max"}})."""

    def __init__(self, specs):
        self.input_specs = specs

    @property
    def dynamic_dims(self):
        return {name: dims for name, (_, _, dims) in self.input_specs.items() if dims}


def _dim(symbol, low, high):
    return {"symbol": symbol, "min": low, "max": high}


# ── size_groups ───────────────────────────────────────────────────────────────


def test_size_groups_intersects_bounds_of_dims_traced_at_the_same_size():
    art = FakeArtifact({
        "input_ids": ((2, 7), torch.long, {0: _dim("s0", 1, 5), 1: _dim("s1", 2, 12)}),
        "attention_mask": ((2, 7), torch.long, {0: _dim("s0", 2, 8), 1: _dim("s1", 3, None)}),
    })
    groups = size_groups(art)
    # batch: [1,5] & [2,8] -> [2,5]; sequence: [2,12] & [3, 7*2+6=20] -> [3,12]
    assert groups == {2: (2, 5), 7: (3, 12)}


def test_size_groups_unbounded_max_is_capped_near_the_traced_size():
    art = FakeArtifact({"x": ((3, 4), torch.float32, {0: _dim("s0", 0, None)})})
    # min 0 is raised to 1; no max -> traced * 2 + 6
    assert size_groups(art) == {3: (1, 12)}


def test_size_groups_drops_groups_that_only_allow_the_traced_size():
    art = FakeArtifact({
        "a": ((2, 7), torch.long, {0: _dim("s0", 2, 2), 1: _dim("s1", 2, 100)}),
        "b": ((5,), torch.long, {0: _dim("s2", 1, 9)}),
        "c": ((5,), torch.long, {0: _dim("s3", 5, 5)}),  # same traced size as b: the intersection is {5}
        "static": ((11,), torch.long, {}),
    })
    assert size_groups(art) == {7: (2, 20)}


def test_size_groups_drops_groups_whose_bounds_do_not_intersect():
    art = FakeArtifact({
        "a": ((4,), torch.long, {0: _dim("s0", 1, 3)}),
        "b": ((4,), torch.long, {0: _dim("s1", 6, 9)}),
    })
    assert size_groups(art) == {}


def test_size_groups_of_a_static_artifact_is_empty():
    art = FakeArtifact({"x": ((2, 7), torch.long, {})})
    assert art.dynamic_dims == {}
    assert size_groups(art) == {}


# ── resize_inputs ─────────────────────────────────────────────────────────────


def _fake_text_artifact():
    return FakeArtifact({
        "input_ids": ((2, 7), torch.long, {0: _dim("s0", 1, 8), 1: _dim("s1", 2, 20)}),
        "attention_mask": ((2, 7), torch.long, {0: _dim("s0", 1, 8), 1: _dim("s1", 2, 20)}),
        "pixel_values": ((2, 3, 7), torch.float32, {0: _dim("s0", 1, 8)}),  # dim 2 traced at 7 but static
        "scale": ((4,), torch.float32, {}),
    })


def _text_inputs():
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(0, 50, (2, 7), generator=g),
        "attention_mask": torch.tensor([[1] * 7, [1] * 5 + [0] * 2]),
        "pixel_values": torch.randn(2, 3, 7, generator=g),
        "scale": torch.randn(4, generator=g),
    }


def test_resize_inputs_grows_by_wrapping_indices_and_keeps_values():
    art, inputs = _fake_text_artifact(), _text_inputs()
    out = resize_inputs(inputs, art, {2: 3, 7: 11})
    ids = out["input_ids"]
    assert ids.shape == (3, 11)
    assert ids.dtype == inputs["input_ids"].dtype
    for b in range(3):
        for s in range(11):
            assert ids[b, s] == inputs["input_ids"][b % 2, s % 7]
    # values stay within what the traced inputs contained (token ids in the vocabulary, mask 0/1)
    assert set(out["attention_mask"].unique().tolist()) <= {0, 1}
    assert torch.equal(out["attention_mask"][:2, :7], inputs["attention_mask"])


def test_resize_inputs_shrinks_to_a_prefix():
    art, inputs = _fake_text_artifact(), _text_inputs()
    out = resize_inputs(inputs, art, {2: 1, 7: 4})
    assert torch.equal(out["input_ids"], inputs["input_ids"][:1, :4])
    assert torch.equal(out["attention_mask"], inputs["attention_mask"][:1, :4])


def test_resize_inputs_changes_only_dynamic_dims_and_moves_shared_sizes_together():
    art, inputs = _fake_text_artifact(), _text_inputs()
    out = resize_inputs(inputs, art, {2: 5, 7: 9})
    # every dim traced at 2 is the batch: all move to 5 together
    assert out["input_ids"].shape == (5, 9)
    assert out["attention_mask"].shape == (5, 9)
    # pixel_values: batch is dynamic (moves), the trailing 7 is static (stays, although 7 is drawn)
    assert out["pixel_values"].shape == (5, 3, 7)
    assert torch.equal(out["pixel_values"][:2], inputs["pixel_values"])
    # an input with no dynamic dim is passed through untouched (same object)
    assert out["scale"] is inputs["scale"]
    # the caller's dict is not modified
    assert inputs["input_ids"].shape == (2, 7)


def test_resize_inputs_leaves_sizes_not_drawn_alone():
    art, inputs = _fake_text_artifact(), _text_inputs()
    out = resize_inputs(inputs, art, {7: 3})
    assert out["input_ids"].shape == (2, 3)
    assert out["pixel_values"].shape == (2, 3, 7)
    same = resize_inputs(inputs, art, {})
    assert all(torch.equal(same[k], inputs[k]) for k in inputs)


# ── parse_sizes / format_sizes ────────────────────────────────────────────────


def test_parse_sizes_round_trips_format_sizes():
    assert parse_sizes("2=3,7=11") == {2: 3, 7: 11}
    assert parse_sizes(" 7=11 , 2=3 ,") == {2: 3, 7: 11}
    assert parse_sizes("") == {}
    assert format_sizes({7: 11, 2: 3}) == "2=3,7=11"
    assert parse_sizes(format_sizes({7: 11, 2: 3})) == {2: 3, 7: 11}


@pytest.mark.parametrize("text, bad", [
    ("2:3", "2:3"),
    ("2=3,7", "7"),
    ("2=3=4", "2=3=4"),
    ("a=3", "a=3"),
    ("2=x", "2=x"),
    ("2=3,7=1.5", "7=1.5"),
])
def test_parse_sizes_rejects_bad_pairs_naming_the_part(text, bad):
    with pytest.raises(ValueError) as info:
        parse_sizes(text)
    message = str(info.value)
    assert "--sizes" in message and "TRACED=NEW" in message
    assert repr(bad) in message


# ── a real dynamic export ─────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def bert_dynamic():
    """A tiny BertModel exported once with DynamoExporter(dynamic=True)."""
    from transformers import BertConfig, BertModel

    from exporters import DynamoConfig, DynamoExporter

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa")
    model = BertModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(0, 100, (2, 7), generator=g),
              "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    artifact = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    return model, inputs, artifact


class _Perturbed:
    """An artifact whose outputs are off by 1 (at any shape): what a wrong export looks like."""

    def __init__(self, artifact):
        self._artifact = artifact
        self.input_specs = artifact.input_specs
        self.dynamic_dims = artifact.dynamic_dims

    def __call__(self, **inputs):
        return {k: v + 1 if v.is_floating_point() else v for k, v in self._artifact(**inputs).items()}


def test_real_dynamic_export_matches_eager_at_drawn_shapes(bert_dynamic):
    model, inputs, artifact = bert_dynamic
    groups = size_groups(artifact)
    assert 7 in groups, f"the sequence dim should be dynamic: {artifact.dynamic_dims}"
    checked = check_dynamic_shapes(artifact, model, inputs, "dynamo", "python -m sweeps.repro dynamo-dynamic-BertModel")
    assert checked > 0


@pytest.fixture
def no_shrinking():
    """Hypothesis without its shrink phase (each check is a forward pass: shrinking takes ~30 s)."""
    from hypothesis import Phase, settings

    previous = settings.get_current_profile_name()
    settings.register_profile("_test_no_shrink", parent=settings.get_profile(previous),
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("_test_no_shrink")
    yield
    settings.load_profile(previous)


def test_wrong_artifact_raises_shape_mismatch_with_repro_and_sizes(bert_dynamic, no_shrinking):
    model, inputs, artifact = bert_dynamic
    repro = "python -m sweeps.repro dynamo-dynamic-BertModel"
    with pytest.raises(ShapeMismatch) as info:
        check_dynamic_shapes(_Perturbed(artifact), model, inputs, "dynamo", repro)
    message = str(info.value)
    assert f"repro: {repro} --sizes " in message
    assert "last_hidden_state" in message
    # the --sizes in the repro parses and names drawn sizes for traced dims
    sizes = parse_sizes(message.split("--sizes ", 1)[1].split()[0])
    assert sizes and set(sizes) <= set(size_groups(artifact))


class _FirstCallOnly:
    """An artifact that misbehaves on its first call only (``effect(outputs)``), then answers right."""

    def __init__(self, artifact, effect):
        self._artifact, self._effect, self.calls = artifact, effect, 0
        self.input_specs = artifact.input_specs
        self.dynamic_dims = artifact.dynamic_dims

    def __call__(self, **inputs):
        self.calls += 1
        outputs = self._artifact(**inputs)
        return self._effect(outputs) if self.calls == 1 else outputs


def _timeout(outputs):
    pytest.fail("Timeout (>300.0s) from pytest-timeout.")  # what pytest-timeout raises mid-forward


def test_a_timeout_inside_a_draw_is_reraised_as_the_timeout_not_a_flaky_failure(bert_dynamic, no_shrinking):
    model, inputs, artifact = bert_dynamic
    with pytest.raises(pytest.fail.Exception, match="Timeout"):
        check_dynamic_shapes(_FirstCallOnly(artifact, _timeout), model, inputs, "dynamo", "repro")


def test_a_mismatch_that_does_not_recur_on_replay_is_reported_as_that_mismatch(bert_dynamic, no_shrinking):
    model, inputs, artifact = bert_dynamic
    wrong_once = _FirstCallOnly(artifact, lambda out: {k: v + 1 if v.is_floating_point() else v for k, v in out.items()})
    with pytest.raises(ShapeMismatch, match="did not recur") as info:
        check_dynamic_shapes(wrong_once, model, inputs, "dynamo", "python -m sweeps.repro dynamo-dynamic-BertModel")
    assert "--sizes " in str(info.value)


class _EightWide(torch.nn.Module):
    """Splits its last dim into groups of 8: torch.export records ``s1 == 8 * (s1 // 8)``."""

    def forward(self, x):
        b, n = x.shape
        return x.view(b, n // 8, 8).sum(-1)


def test_draws_respect_the_artifacts_recorded_guards():
    from exporters import DynamoConfig, DynamoExporter
    from sweeps.shapes import guard_refusal

    model, inputs = _EightWide(), {"x": torch.randn(2, 32)}
    artifact = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    assert "(x.size()[1] // 8)" in guard_refusal(artifact, {2: 3, 32: 37})
    assert guard_refusal(artifact, {2: 3, 32: 40}) == ""
    # one size in eight passes the guard: the draws find those instead of giving up on refusals
    assert check_dynamic_shapes(artifact, model, inputs, "dynamo", "repro") > 0


class _TiedToTokens(torch.nn.Module):
    """Idefics2 in small: the patch grid of ``pixels`` must hold exactly as many patches as the text
    has image tokens (16), so torch.export records ``(h // 8) * (w // 8) == 16``: the patch grid takes
    33..39 only. (Idefics2 itself ties more groups; there only one-group moves were admitted.)"""

    def forward(self, ids, pixels):
        b, h, w = pixels.shape
        torch._check((h // 8) * (w // 8) == 16)
        patches = pixels[:, : h // 8 * 8, : w // 8 * 8].reshape(b, 16, -1).mean(-1)
        return ids.float().sum(-1, keepdim=True) + patches


def test_draws_reach_shapes_where_a_guard_ties_one_group_to_the_others():
    from exporters import DynamoConfig, DynamoExporter

    model = _TiedToTokens()
    inputs = {"ids": torch.randint(0, 9, (2, 7)), "pixels": torch.randn(2, 32, 32)}
    artifact = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    assert check_dynamic_shapes(artifact, model, inputs, "dynamo", "repro") > 0


class _PinnedFrames(torch.nn.Module):
    """MusicFlamingo in small: the encoder's frames must downsample to 64 positions, so torch.export
    records ``1 + (frames - 1) // 2 == 64``: of [2, 262] only 127 (and the traced 128) pass."""

    def forward(self, x):
        torch._check(1 + (x.shape[1] - 1) // 2 == 64)
        return x * 2


def test_draws_find_the_few_sizes_a_guard_leaves_a_group():
    from exporters import DynamoConfig, DynamoExporter

    model, inputs = _PinnedFrames(), {"x": torch.randn(1, 128)}  # batch 1: only the frames are dynamic
    artifact = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    assert check_dynamic_shapes(artifact, model, inputs, "dynamo", "repro") > 0


def test_refused_shapes_fail_the_check_only_when_eager_runs_at_one():
    from sweeps.shapes import _raise_if_eager_takes_a_refused_shape

    artifact = FakeArtifact({"x": ((2, 7), torch.float32, {1: _dim("s0", 2, 20)})})
    artifact.input_names = ["x"]
    inputs = {"x": torch.randn(2, 7)}
    refused = [({7: 9}, "guard: x.size()[1] == 7")]

    def strict(x):  # eager takes only the traced width too
        if x.shape[1] != 7:
            raise ValueError("width must be 7")
        return x

    _raise_if_eager_takes_a_refused_shape(strict, inputs, artifact, refused, "repro")  # nothing to compare
    with pytest.raises(ShapeMismatch, match=r"eager runs at sizes 7=9, which they refuse: guard: x.size\(\)\[1\] == 7"):
        _raise_if_eager_takes_a_refused_shape(lambda x: x * 2, inputs, artifact, refused, "repro")


# ── size 1 ───────────────────────────────────────────────────────────────────


def test_size_one_is_checked_for_every_dynamic_dim(bert_dynamic):
    from sweeps.shapes import check_size_one

    model, inputs, artifact = bert_dynamic
    assert all(spec["min"] == 1 for dims in artifact.dynamic_dims.values() for spec in dims.values())
    assert check_size_one(artifact, model, inputs, "dynamo", "repro") == "all"
    with pytest.raises(ShapeMismatch, match=r"at size 1, sizes 2=1,7=1 .*\n.*repro: r --sizes 2=1,7=1"):
        check_size_one(_Perturbed(artifact), model, inputs, "dynamo", "r")


def test_size_one_refusals_are_reported_per_group_with_the_reason():
    """An artifact exported with torch's 0/1 specialization (min 2) refuses 1: each group says why."""
    from transformers import BertConfig, BertModel

    from exporters import DynamoConfig, DynamoExporter
    from sweeps.shapes import check_size_one

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=64)).eval()
    inputs = {"input_ids": torch.randint(0, 100, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    artifact = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True, accept_size_one=False))
    summary = check_size_one(artifact, model, inputs, "dynamo", "r")
    assert summary.startswith("2:artifact rejects (input 'input_ids' dim 0")
    assert "outside the exported bounds [2, 1024]" in summary and "; 7:artifact rejects" in summary
