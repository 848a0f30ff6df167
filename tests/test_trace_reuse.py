"""exporters.shared_traces: one torch.export trace shared across exports only where the patches agree."""

import torch
import torch.nn.functional as F

from exporters import DynamoExporter, shared_traces
from exporters.utils import Registry, register_patch

SOFTSIGN = "torch.nn.functional.softsign"


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return F.softsign(self.lin(x))


def _halving_registry(path: str = SOFTSIGN) -> Registry:
    registry = Registry()
    register_patch("dynamo", path, registry=registry)(lambda original: lambda x: x * 0.5)
    return registry


def _inputs():
    return {"x": torch.randn(2, 4)}


def _code(artifact) -> str:
    return artifact.program.graph_module.code


def test_same_patches_share_one_trace_and_the_program_is_the_same():
    torch.manual_seed(0)
    model, inputs = _Net().eval(), _inputs()
    alone = DynamoExporter(registry=Registry()).export(model, inputs)
    with shared_traces(registry=Registry()) as store:
        first = DynamoExporter(registry=Registry()).export(model, inputs)
        second = DynamoExporter(registry=Registry()).export(model, inputs)
    assert (store.misses, store.hits) == (1, 1)
    assert _code(first) == _code(second) == _code(alone)
    assert first.program is not second.program  # each export edits its own copy
    assert torch.equal(second(**inputs)["output"], model(**inputs))


def test_a_patch_that_acted_but_is_absent_later_forces_a_new_trace():
    model, inputs = _Net().eval(), _inputs()
    halving = _halving_registry()
    with shared_traces(registry=halving) as store:
        patched = DynamoExporter(registry=halving).export(model, inputs)
        plain = DynamoExporter(registry=Registry()).export(model, inputs)
    assert (store.misses, store.hits) == (2, 0)
    assert f"patch:dynamo:{SOFTSIGN}" in patched.workarounds_fired
    assert f"patch:dynamo:{SOFTSIGN}" not in plain.workarounds_fired
    assert torch.allclose(plain(**inputs)["output"], model(**inputs))
    assert torch.allclose(patched(**inputs)["output"], model.lin(inputs["x"]) * 0.5)


def test_a_patch_added_later_whose_target_the_first_trace_reached_forces_a_new_trace():
    model, inputs = _Net().eval(), _inputs()
    halving = _halving_registry()
    with shared_traces(registry=halving) as store:
        DynamoExporter(registry=Registry()).export(model, inputs)  # the probe on softsign records the call
        patched = DynamoExporter(registry=halving).export(model, inputs)
    assert (store.misses, store.hits) == (2, 0)
    assert torch.allclose(patched(**inputs)["output"], model.lin(inputs["x"]) * 0.5)


def test_a_patch_added_later_on_a_target_never_reached_keeps_the_trace():
    model, inputs = _Net().eval(), _inputs()
    unreached = _halving_registry("torch.nn.functional.softplus")
    softplus, softsign = F.softplus, F.softsign
    with shared_traces(registry=unreached) as store:
        DynamoExporter(registry=Registry()).export(model, inputs)
        assert F.softplus is softplus  # the probe is gone after the trace
        DynamoExporter(registry=unreached).export(model, inputs)
    assert (store.misses, store.hits) == (1, 1)
    assert (F.softplus, F.softsign) == (softplus, softsign)


def test_an_input_or_parameter_changed_in_place_is_a_new_trace():
    model, inputs = _Net().eval(), _inputs()
    with shared_traces(registry=Registry()) as store:
        DynamoExporter(registry=Registry()).export(model, inputs)
        inputs["x"].add_(1.0)
        DynamoExporter(registry=Registry()).export(model, inputs)
        with torch.no_grad():
            model.lin.bias.add_(1.0)
        DynamoExporter(registry=Registry()).export(model, inputs)
        DynamoExporter(registry=Registry()).export(model, {"x": torch.randn(3, 4)})
    assert (store.misses, store.hits) == (4, 0)


def test_the_kept_program_is_not_edited_by_an_export_that_took_a_copy():
    model, inputs = _Net().eval(), _inputs()
    with shared_traces(registry=Registry()) as store:
        first = DynamoExporter(registry=Registry()).export(model, inputs)
        before = _code(first)
        graph = first.program.graph_module.graph
        out = graph.output_node()
        (result,) = out.args[0]
        with graph.inserting_before(out):
            neg = graph.call_function(torch.ops.aten.neg.default, (result,))
        out.args = ((neg,),)
        first.program.graph_module.recompile()
        assert _code(first) != before
        second = DynamoExporter(registry=Registry()).export(model, inputs)
    assert store.hits == 1
    assert _code(second) == before


def test_outside_the_block_nothing_is_kept():
    from exporters.trace_reuse import active_store

    assert active_store() is None
    with shared_traces(registry=Registry()) as store:
        assert active_store() is store
    assert active_store() is None


def test_a_kept_trace_serves_one_lowering_export_and_only_a_non_lowering_export_keeps_one():
    """A copy shares the program's ShapeEnv, and a lowering re-traces in it: one lowering per kept trace."""
    from exporters.base import ExportConfig
    from exporters.tracing import trace
    from exporters.utils import FiredLog

    model, inputs = _Net().eval(), _inputs()
    with shared_traces(registry=Registry()) as store:
        trace(model, inputs, ExportConfig(), [], FiredLog())  # a lowering export's own trace: not kept
        DynamoExporter(registry=Registry()).export(model, inputs)  # kept
        trace(model, inputs, ExportConfig(), [], FiredLog())  # takes it, and it leaves the store
        trace(model, inputs, ExportConfig(), [], FiredLog())  # traces again
    assert (store.misses, store.hits) == (3, 1)


def test_inputs_are_told_apart_by_value_not_by_the_object_holding_them():
    model, inputs = _Net().eval(), _inputs()
    with shared_traces(registry=Registry()) as store:
        DynamoExporter(registry=Registry()).export(model, inputs)
        DynamoExporter(registry=Registry()).export(model, {"x": inputs["x"].clone()})  # equal values: shared
        DynamoExporter(registry=Registry()).export(model, {"x": inputs["x"] + 1})  # other values: traced
        DynamoExporter(registry=Registry()).export(model, {"x": inputs["x"].t().contiguous().t()})  # other strides
    assert (store.misses, store.hits) == (3, 1)


def test_a_fresh_generation_component_over_the_same_model_and_call_takes_the_kept_trace():
    """Each backend's generate export builds its own FlatComponent from its own capture of one eager generate."""
    from _tiny_llama import tiny_llama

    from exporters import OnnxExporter
    from exporters.generation.capture import Call
    from exporters.generation.component import FlatComponent
    from exporters.trace_reuse import trace_key, traced_model

    model = tiny_llama()
    ids = torch.tensor([[3, 5, 7, 9]])

    def component(ids):
        return FlatComponent(model, Call(tensors={"input_ids": ids.clone()}, trees={},
                                         constants={"use_cache": False})).eval()

    first, second = component(ids), component(ids)
    assert traced_model(first) is model
    key = trace_key(first, {"input_ids": ids}, {}, None, OnnxExporter().config_class())
    assert key == trace_key(second, {"input_ids": ids.clone()}, {}, None, OnnxExporter().config_class())
    other = FlatComponent(model, Call(tensors={"input_ids": ids}, trees={}, constants={"use_cache": True}))
    assert key != trace_key(other, {"input_ids": ids}, {}, None, OnnxExporter().config_class())
    with shared_traces() as store:
        kept = DynamoExporter().export(first, {"input_ids": ids})
        taken = OnnxExporter().export(second, {"input_ids": ids.clone()})
    assert (store.misses, store.hits) == (1, 1)
    expected = model(input_ids=ids, use_cache=False).logits
    assert torch.allclose(kept(input_ids=ids)["logits"], expected, atol=1e-5)
    assert torch.allclose(taken(input_ids=ids)["logits"], expected, atol=1e-4)


def test_the_store_keeps_the_traces_of_modules_the_model_holds_and_drops_another_models():
    from exporters.trace_reuse import Kept, TraceStore

    model, other = _Net(), _Net()
    store = TraceStore(Registry())
    for module, key in ((model.lin, "encoder"), (model, "prefill"), (model, "decode")):
        store.keep(Kept(module, (key,), None, frozenset(), (), frozenset(), frozenset()))
    assert [k.key for k in store._kept] == [("encoder",), ("prefill",), ("decode",)]
    store.keep(Kept(other, ("forward",), None, frozenset(), (), frozenset(), frozenset()))
    assert [k.key for k in store._kept] == [("forward",)]


def test_a_fingerprint_tells_values_layouts_and_aliasing_apart_and_never_raises():
    from exporters.trace_reuse import fingerprint, fingerprints

    x = torch.randn(2, 3)
    assert fingerprint(x) == fingerprint(x.clone()) != fingerprint(x + 1)
    assert fingerprint(x.to(torch.bfloat16)) != fingerprint(x)
    z = torch.randn(3, dtype=torch.complex64)
    assert fingerprint(z.conj()) != fingerprint(z.conj().resolve_conj())  # the conjugate bit is part of it
    sparse = x.to_sparse()
    assert fingerprint(sparse)[1] == "torch.sparse_coo"  # no strides to read: by identity
    assert fingerprint(torch.zeros(0, 4)) == fingerprint(torch.zeros(0, 4))
    a = torch.randn(4)
    assert [f[2] for f in fingerprints({"a": a, "b": a[1:], "c": a.clone()})] == [-1, 0, -1]


def test_a_probe_on_an_lru_cached_target_forwards_its_cache_clear():
    """ShapeEnv clears ``_maybe_evaluate_static``'s cache through whatever stands in its place."""
    import functools

    from exporters.trace_reuse import _probe

    calls = []

    @functools.cache
    def target(x):
        calls.append(x)
        return x * 2

    probe = _probe(target)
    assert probe(3) == 6 and probe(3) == 6 and calls == [3]
    probe.cache_clear()
    assert probe(3) == 6 and calls == [3, 3]
    assert probe.cache_info().misses == 1


def test_a_store_is_active_only_inside_its_block():
    from exporters.trace_reuse import TraceStore, activated, active_store

    store = TraceStore(Registry())
    assert active_store() is None
    with activated(store):
        assert active_store() is store
    assert active_store() is None
