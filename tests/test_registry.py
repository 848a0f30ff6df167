"""Registry semantics of exporters/utils.py: registration, install/restore, fired log, fixes, leaks.

Every test registers into a fresh ``Registry()`` (``registry=``), so DEFAULT_REGISTRY is never touched.
Patch targets live in tests/_targets.py and are resolved by the dotted path ``_targets.<...>``.
"""

from __future__ import annotations

import _targets
import pytest
import torch
from _targets import Base, Child, Holder

from exporters.utils import (
    DEFAULT_REGISTRY,
    FiredLog,
    PatchTargetError,
    Registry,
    WorkaroundError,
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    find_leaked_patches,
    patch_targets_snapshot,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
)

T = "_targets"


@pytest.fixture
def reg():
    return Registry()


@pytest.fixture(autouse=True)
def _default_registry_untouched():
    before = [e.name for e in DEFAULT_REGISTRY.all_workarounds()]
    yield
    assert [e.name for e in DEFAULT_REGISTRY.all_workarounds()] == before


# ── what the factory receives ─────────────────────────────────────────────────


def test_factory_receives_original_method(reg):
    seen = []

    @register_patch("dynamo", f"{T}.Base.method", registry=reg)
    def factory(original):
        seen.append(original)
        return lambda self, x: ("patched",) + original(self, x)

    with apply_patches(reg.patches("dynamo")):
        assert Base().method(1) == ("patched", "base", 1)
    assert seen == [Base.__dict__["method"]]
    assert Base().method(1) == ("base", 1)


def test_factory_receives_original_module_function(reg):
    original_fn = _targets.plain
    seen = []

    @register_patch("onnx", f"{T}.plain", registry=reg)
    def factory(original):
        seen.append(original)
        return lambda x: original(x) * 10

    with apply_patches(reg.patches("onnx")):
        assert _targets.plain(1) == 20
    assert seen == [original_fn]
    assert _targets.plain is original_fn


def test_factory_receives_real_torch_where(reg):
    real = torch.where
    seen = []

    @register_patch("onnx", "torch.where", registry=reg)
    def factory(original):
        seen.append(original)
        return lambda *a, **k: original(*a, **k) + 1

    c, x, y = torch.tensor([True, False]), torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    with apply_patches(reg.patches("onnx")):
        assert torch.where is not real
        assert torch.equal(torch.where(c, x, y), torch.tensor([2.0, 5.0]))
    assert seen == [real]
    assert torch.where is real
    assert torch.equal(torch.where(c, x, y), torch.tensor([1.0, 4.0]))


def test_factory_receives_real_tensor_reshape(reg):
    real = torch.Tensor.reshape
    had_own = "reshape" in torch.Tensor.__dict__
    seen = []

    @register_patch("executorch", "torch.Tensor.reshape", registry=reg)
    def factory(original):
        seen.append(original)
        return lambda self, *shape: original(self, *shape) * 2

    t = torch.arange(4.0)
    with apply_patches(reg.patches("executorch")):
        assert torch.equal(t.reshape(2, 2), torch.arange(4.0).view(2, 2) * 2)
    assert seen == [real]
    assert torch.Tensor.reshape is real
    assert ("reshape" in torch.Tensor.__dict__) == had_own
    assert torch.equal(t.reshape(2, 2), torch.arange(4.0).view(2, 2))


def test_one_factory_for_several_paths(reg):
    seen = []

    @register_patch("dynamo", f"{T}.Base.method", f"{T}.plain", registry=reg)
    def factory(original):
        seen.append(original)
        return lambda *a: "shared"

    assert sorted(e.path for e in reg.patches("dynamo")) == sorted([f"{T}.Base.method", f"{T}.plain"])
    assert all(e.factory is factory for e in reg.patches("dynamo"))
    with apply_patches(reg.patches("dynamo")):
        assert Base().method(1) == "shared"
        assert _targets.plain(1) == "shared"
    assert set(map(id, seen)) == {id(Base.__dict__["method"]), id(_targets.plain)}
    assert _targets.plain(1) == 2 and Base().method(1) == ("base", 1)


# ── install and restore ───────────────────────────────────────────────────────


def test_restored_when_body_raises(reg):
    before = Base.__dict__["method"], _targets.plain
    register_patch("dynamo", f"{T}.Base.method", f"{T}.plain", registry=reg)(lambda orig: lambda *a: None)
    with pytest.raises(KeyError, match="boom"):
        with apply_patches(reg.patches("dynamo")):
            assert Base().method(1) is None
            raise KeyError("boom")
    assert (Base.__dict__["method"], _targets.plain) == before


def test_earlier_patches_restored_when_a_later_install_fails(reg):
    before = _targets.plain
    register_patch("dynamo", f"{T}.plain", registry=reg)(lambda orig: lambda x: None)
    register_patch("dynamo", f"{T}.Base.does_not_exist", registry=reg)(lambda orig: orig)
    with pytest.raises(PatchTargetError):
        with apply_patches(reg.patches("dynamo")):
            pass
    assert _targets.plain is before


def test_two_patches_on_one_path_chain_and_restore_in_reverse(reg):
    """The same path patched for dynamo and onnx (an OnnxExporter installs both): the second factory
    gets the first replacement, and undo replays in reverse so the real function comes back."""
    before = _targets.plain
    order = []

    @register_patch("dynamo", f"{T}.plain", registry=reg)
    def first(original):
        order.append(("first", original))
        return lambda x: ("first", original(x))

    @register_patch("onnx", f"{T}.plain", registry=reg)
    def second(original):
        order.append(("second", original))
        return lambda x: ("second", original(x))

    with apply_patches(reg.patches("dynamo", "onnx")) as fired:
        assert _targets.plain(1) == ("second", ("first", 2))
        assert order[0] == ("first", before)
        assert order[1][1] is not before  # the second factory wraps what the first installed
    assert _targets.plain is before
    assert fired.names() == ["patch:onnx:_targets.plain", "patch:dynamo:_targets.plain"]


def test_undo_runs_in_reverse_order(reg, monkeypatch):
    """Record setattr calls on a module-like owner: undo must replay the records last-first."""
    from exporters import utils

    register_patch("dynamo", f"{T}.plain", registry=reg)(lambda o: lambda x: "a")
    register_patch("dynamo", f"{T}.Holder.value", registry=reg)(lambda o: 99)
    restores = []
    real_setattr = setattr

    with apply_patches(reg.patches("dynamo")):
        assert Holder.value == 99
        monkeypatch.setattr(utils, "setattr", lambda o, n, v: (restores.append(n), real_setattr(o, n, v)), raising=False)
    monkeypatch.undo()
    assert restores == ["value", "plain"]
    assert Holder.value == 3 and _targets.plain(1) == 2


def test_staticmethod_survives_round_trip(reg):
    before = Base.__dict__["static"]
    seen = []

    @register_patch("dynamo", f"{T}.Base.static", registry=reg)
    def factory(original):
        seen.append(original)
        return lambda x: ("patched", original(x))

    with apply_patches(reg.patches("dynamo")):
        assert isinstance(Base.__dict__["static"], staticmethod)
        assert Base.static(1) == ("patched", ("static", 1))
        assert Base().static(1) == ("patched", ("static", 1))
    assert seen == [before.__func__]
    assert Base.__dict__["static"] is before
    assert Base().static(2) == ("static", 2)


def test_classmethod_survives_round_trip(reg):
    before = Base.__dict__["klass"]

    @register_patch("dynamo", f"{T}.Base.klass", registry=reg)
    def factory(original):
        return lambda cls, x: ("patched", original(cls, x))

    with apply_patches(reg.patches("dynamo")):
        assert isinstance(Base.__dict__["klass"], classmethod)
        assert Base.klass(1) == ("patched", ("Base", 1))
        assert Child.klass(1) == ("patched", ("Child", 1))
        assert Child().klass(1) == ("patched", ("Child", 1))
    assert Base.__dict__["klass"] is before
    assert Child.klass(3) == ("Child", 3)


def test_inherited_method_is_deleted_again_on_restore(reg):
    assert "inherited" not in Child.__dict__

    @register_patch("dynamo", f"{T}.Child.inherited", registry=reg)
    def factory(original):
        return lambda self, x: ("child-patched", original(self, x))

    with apply_patches(reg.patches("dynamo")):
        assert "inherited" in Child.__dict__
        assert Child().inherited(1) == ("child-patched", ("inherited", 1))
        assert Base().inherited(1) == ("inherited", 1)  # the base class is not touched
    assert "inherited" not in Child.__dict__
    assert Child().inherited(1) == ("inherited", 1)


@pytest.mark.parametrize("attr,replacement,expected", [
    ("inherited_static", lambda original: lambda x: ("patched", original(x)), ("patched", ("inherited_static", 1))),
    ("klass", lambda original: lambda cls, x: ("patched", original(cls, x)), ("patched", ("Child", 1))),
], ids=["staticmethod", "classmethod"])
def test_inherited_descriptor_keeps_its_kind_while_patched(reg, attr, replacement, expected):
    assert attr not in Child.__dict__
    register_patch("dynamo", f"{T}.Child.{attr}", registry=reg)(replacement)
    with apply_patches(reg.patches("dynamo")):
        assert getattr(Child(), attr)(1) == expected
    assert attr not in Child.__dict__


def test_non_callable_replacement_installed_and_restored(reg):
    register_patch("dynamo", f"{T}.Holder.value", registry=reg)(lambda original: original + 1)
    with apply_patches(reg.patches("dynamo")) as fired:
        assert Holder.value == 4
    assert Holder.value == 3
    assert fired.names() == ["patch:dynamo:_targets.Holder.value"]


# ── errors ────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "path",
    [f"{T}.Base.renamed_method", f"{T}.NoSuchClass.method", "no_such_package_xyz.module.fn", f"{T}.nope"],
)
def test_unresolvable_path_raises_naming_it(reg, path):
    register_patch("dynamo", path, registry=reg)(lambda orig: orig)
    with pytest.raises(PatchTargetError, match=path.replace(".", r"\.")):
        with apply_patches(reg.patches("dynamo")):
            pytest.fail("the body must not run when a patch target is missing")
    assert issubclass(PatchTargetError, AttributeError)


def test_optional_unresolvable_path_is_skipped(reg):
    register_patch("dynamo", f"{T}.Base.renamed_method", optional=True, registry=reg)(lambda orig: orig)
    register_patch("dynamo", f"{T}.plain", registry=reg)(lambda orig: lambda x: "patched")
    with apply_patches(reg.patches("dynamo")):
        assert _targets.plain(0) == "patched"
        assert not hasattr(Base, "renamed_method")
    assert _targets.plain(0) == 1


def test_model_family_patch_is_not_installed_until_its_module_is_imported(reg, monkeypatch):
    """A patch on a transformers modeling module that no model in the process uses is skipped
    without importing the module; once the module is loaded it resolves (typos still raise)."""
    import sys

    import transformers.models.llama.modeling_llama as llama

    module = "transformers.models.llama.modeling_llama"
    register_patch("dynamo", f"{module}.rotate_half", registry=reg)(lambda orig: lambda x: "patched")
    register_patch("dynamo", f"{module}.no_such_function", registry=reg)(lambda orig: orig)
    monkeypatch.delitem(sys.modules, module)
    with apply_patches(reg.patches("dynamo")):
        assert module not in sys.modules  # neither path was resolved, so nothing imported it
    monkeypatch.setitem(sys.modules, module, llama)
    with pytest.raises(PatchTargetError, match="no_such_function"):
        with apply_patches(reg.patches("dynamo")):
            pass
    assert llama.rotate_half is not None and llama.rotate_half.__name__ == "rotate_half"


def test_duplicate_path_for_one_backend_names_both_factories(reg):
    @register_patch("dynamo", f"{T}.plain", registry=reg)
    def first_factory(orig):
        return orig

    def second_factory(orig):
        return orig

    with pytest.raises(WorkaroundError) as info:
        register_patch("dynamo", f"{T}.plain", registry=reg)(second_factory)
    assert "first_factory" in str(info.value) and "second_factory" in str(info.value)
    assert f"{T}.plain" in str(info.value)
    # another backend may patch the same path
    register_patch("onnx", f"{T}.plain", registry=reg)(second_factory)
    assert [e.factory for e in reg.patches("dynamo")] == [first_factory]


@pytest.mark.parametrize("register", [
    lambda reg: register_patch("tensorrt", f"{T}.plain", registry=reg)(lambda o: o),
    lambda reg: register_fx_node_fix("tflite", registry=reg)(lambda gm, n: False),
    lambda reg: register_fx_program_fix("coreml", registry=reg)(lambda p, *, config: (p, False)),
    lambda reg: reg.patches("dynamo", "mlx"),
])
def test_unknown_backend_raises(reg, register):
    with pytest.raises(WorkaroundError, match="unknown backend"):
        register(reg)
    assert reg.all_workarounds() == []


def test_register_patch_needs_a_path(reg):
    with pytest.raises(WorkaroundError):
        register_patch("dynamo", registry=reg)


def test_fresh_registries_are_independent(reg):
    other = Registry()
    register_patch("dynamo", f"{T}.plain", registry=reg)(lambda o: o)
    assert other.patches("dynamo") == []
    assert f"patch:dynamo:{T}.plain" not in [e.name for e in DEFAULT_REGISTRY.all_workarounds()]


# ── fired log ─────────────────────────────────────────────────────────────────


def test_fired_only_when_replacement_called(reg):
    register_patch("dynamo", f"{T}.plain", registry=reg)(lambda orig: lambda x: orig(x))
    register_patch("dynamo", f"{T}.Base.method", registry=reg)(lambda orig: lambda self, x: orig(self, x))
    with apply_patches(reg.patches("dynamo")) as fired:
        assert fired.names() == []
        _targets.plain(1)
        _targets.plain(2)
    assert fired.names() == [f"patch:dynamo:{T}.plain"]


def test_fired_log_passed_in_is_used_and_deduplicated():
    log = FiredLog()
    log.extend(["a", "b", "a"])
    log.add("b")
    assert log.names() == ["a", "b"]
    reg = Registry()
    register_patch("executorch", f"{T}.plain", registry=reg)(lambda orig: orig)
    with apply_patches(reg.patches("executorch"), log) as fired:
        assert fired is log
        _targets.plain(0)
    assert log.names() == ["a", "b", f"patch:executorch:{T}.plain"]


# ── fixes ─────────────────────────────────────────────────────────────────────


class _Net(torch.nn.Module):
    def forward(self, x):
        y = torch.neg(x)
        z = torch.relu(y)
        return z + 1


def _gm():
    return torch.fx.symbolic_trace(_Net())


def test_node_fix_modified_and_fired(reg):
    @register_fx_node_fix("onnx", registry=reg)
    def _fix_relu_to_sigmoid(gm, node):
        if node.op == "call_function" and node.target is torch.relu:
            node.target = torch.sigmoid
            return True
        return False

    gm = _gm()
    fired = FiredLog()
    x = torch.tensor([-1.0, 2.0])
    assert apply_fx_node_fixes(reg.fixes("onnx", "node"), gm, fired) is True
    assert torch.allclose(gm(x), torch.sigmoid(-x) + 1)  # recompiled
    assert fired.names() == ["fix:onnx:_fix_relu_to_sigmoid"]
    # second run: nothing left to change
    fired2 = FiredLog()
    assert apply_fx_node_fixes(reg.fixes("onnx", "node"), gm, fired2) is False
    assert fired2.names() == []


def test_node_fix_without_entries_is_unmodified():
    assert apply_fx_node_fixes([], _gm(), FiredLog()) is False


@pytest.mark.parametrize("bad", [None, 1, "yes", (True,)])
def test_node_fix_must_return_bool(reg, bad):
    @register_fx_node_fix("executorch", registry=reg)
    def _fix_bad(gm, node):
        return bad

    with pytest.raises(WorkaroundError, match="_fix_bad.*must return a bool"):
        apply_fx_node_fixes(reg.fixes("executorch", "node"), _gm(), FiredLog())


def test_node_fix_not_called_on_erased_node(reg):
    @register_fx_node_fix("onnx", registry=reg)
    def _fix_drop_neg(gm, node):
        if node.op == "call_function" and node.target is torch.neg:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            return True
        return False

    seen_erased = []

    @register_fx_node_fix("onnx", registry=reg)
    def _fix_observe(gm, node):
        seen_erased.append(getattr(node, "_erased", False))
        return False

    gm = _gm()
    assert apply_fx_node_fixes(reg.fixes("onnx", "node"), gm, FiredLog()) is True
    assert not any(seen_erased)


def test_duplicate_fix_rejected(reg):
    def _fix_x(gm, node):
        return False

    register_fx_node_fix("onnx", registry=reg)(_fix_x)
    with pytest.raises(WorkaroundError, match="_fix_x"):
        register_fx_node_fix("onnx", registry=reg)(_fix_x)
    register_fx_node_fix("executorch", registry=reg)(_fix_x)  # another backend is fine
    assert len(reg.fixes("onnx", "node")) == 1


def test_program_fixes_return_program_and_modified(reg):
    @register_fx_program_fix("executorch", registry=reg)
    def _fix_wrap(program, *, config):
        return ("wrapped", program, config), True

    @register_fx_program_fix("executorch", registry=reg)
    def _fix_noop(program, *, config):
        return program, False

    fired = FiredLog()
    out = apply_fx_program_fixes(reg.fixes("executorch", "program"), "prog", fired, config="cfg")
    assert out == ("wrapped", "prog", "cfg")
    assert fired.names() == ["fix:executorch:_fix_wrap"]


@pytest.mark.parametrize("bad", ["program", ("program",), ("program", 1), ("program", True, 1), None])
def test_program_fix_must_return_program_and_bool(reg, bad):
    @register_fx_program_fix("executorch", registry=reg)
    def _fix_bad_program(program, *, config):
        return bad

    with pytest.raises(WorkaroundError, match="_fix_bad_program"):
        apply_fx_program_fixes(reg.fixes("executorch", "program"), "prog", FiredLog(), config=None)


def test_fix_and_patch_names(reg):
    register_patch("onnx", "torch.where", registry=reg)(lambda o: o)

    @register_fx_node_fix("onnx", registry=reg)
    def _fix_named(gm, node):
        return False

    assert [e.name for e in reg.all_workarounds()] == ["patch:onnx:torch.where", "fix:onnx:_fix_named"]


# ── leak detection ────────────────────────────────────────────────────────────


def test_snapshot_and_leak_detection(reg):
    register_patch("dynamo", f"{T}.plain", f"{T}.Child.own", f"{T}.Child.inherited", registry=reg)(
        lambda o: lambda *a: "leaked"
    )
    register_patch("dynamo", f"{T}.gone.away", optional=True, registry=reg)(lambda o: o)
    snap = patch_targets_snapshot("dynamo", registry=reg)
    assert set(snap) == {f"{T}.plain", f"{T}.Child.own", f"{T}.Child.inherited"}
    assert snap[f"{T}.plain"] is _targets.plain
    assert find_leaked_patches(snap) == []

    with apply_patches(reg.patches("dynamo")):
        assert sorted(find_leaked_patches(snap)) == sorted(snap)
    assert find_leaked_patches(snap) == []

    original = _targets.plain
    try:
        _targets.plain = lambda x: "leaked"  # a patch that was never restored
        assert find_leaked_patches(snap) == [f"{T}.plain"]
        Child.inherited = lambda self, x: "leaked"
        assert sorted(find_leaked_patches(snap)) == sorted([f"{T}.plain", f"{T}.Child.inherited"])
    finally:
        _targets.plain = original
        if "inherited" in Child.__dict__:
            del Child.inherited
    assert find_leaked_patches(snap) == []


def test_snapshot_only_covers_requested_backends(reg):
    register_patch("onnx", f"{T}.plain", registry=reg)(lambda o: o)
    assert patch_targets_snapshot("dynamo", registry=reg) == {}
    assert list(patch_targets_snapshot("onnx", registry=reg)) == [f"{T}.plain"]


def test_default_registry_has_no_leaks():
    assert find_leaked_patches(patch_targets_snapshot("dynamo", "onnx", "executorch")) == []
