"""A generation component as a module with flat tensor inputs: the exporters trace this, not the model.

Tree inputs (a cache, encoder outputs) become one tensor input per leaf, named ``<tree>__<i>``; the
module rebuilds the tree from its leaves and the spec captured from ``generate`` before calling the
model. Outputs are the model's, flattened with the same leaf names as every artifact
(``logits``, ``past_key_values.0.key``...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import Call, unflatten_tree
from exporters.trace_reuse import fingerprint, module_identity, value_key


def leaf_input_name(tree: str, index: int) -> str:
    return f"{tree}__{index}"


class FlatComponent(torch.nn.Module):
    """``model(**call)`` with every tensor, tree leaf and constant of ``call`` as the captured call had them."""

    def __init__(self, model: torch.nn.Module, call: Call, baked: tuple[str, ...] = (), returned: tuple[str, ...] = ()):
        """``baked``: trees whose leaves are constants of the component (a fresh cache's initial scalars,
        the same for every prompt), kept as buffers instead of inputs. ``returned``: trees the model updates
        in place and does not return (step rule ``updated``), returned after the call under their name."""
        super().__init__()
        self.returned = tuple(returned)
        self.model = model
        self.tensor_names = list(call.tensors)
        self.tree_specs = {name: spec for name, (_, spec) in call.trees.items()}
        self.tree_sizes = {name: len(leaves) for name, (leaves, _) in call.trees.items()}
        self.baked = tuple(baked)
        for name in self.baked:
            for i, leaf in enumerate(call.trees[name][0]):
                self.register_buffer(f"_baked_{name}_{i}", leaf.clone(), persistent=False)
        self.constants = dict(call.constants)

    def trace_identity(self) -> tuple[torch.nn.Module, tuple]:
        """The model this component wraps and what the wrapper adds to it (exporters/trace_reuse.py): each
        backend's export of one captured call builds its own FlatComponent, and they trace alike."""
        owner, inner = module_identity(self.model)
        own = tuple((name, fingerprint(b)) for name, b in self.named_buffers(recurse=False))
        return owner, ("FlatComponent", inner, tuple(self.tensor_names), repr(self.tree_specs),
                       tuple(self.tree_sizes.items()), self.baked, self.returned,
                       tuple((k, value_key(v)) for k, v in self.constants.items()), own)

    def forward(self, **flat: torch.Tensor) -> Any:
        kwargs: dict[str, Any] = {name: flat[name] for name in self.tensor_names}
        for name, spec in self.tree_specs.items():
            if name in self.baked:
                leaves = [getattr(self, f"_baked_{name}_{i}").clone() for i in range(self.tree_sizes[name])]
            else:
                leaves = [flat[leaf_input_name(name, i)] for i in range(self.tree_sizes[name])]
            kwargs[name] = unflatten_tree(leaves, spec)
        out = self.model(**kwargs, **self.constants)
        if not self.returned:
            return out
        items = out.items() if isinstance(out, Mapping) else vars(out).items()
        return {**{k: v for k, v in items if k not in self.returned}, **{k: kwargs[k] for k in self.returned}}


class MethodCall(torch.nn.Module):
    """``owner.<method>(**kwargs)`` as a module (a multimodal model's ``get_image_features``, exported
    as the image encoder component); ``owner`` is a submodule, so its weights are the component's."""

    def __init__(self, owner: torch.nn.Module, method: str):
        super().__init__()
        self.owner, self.method = owner, method

    def trace_identity(self) -> tuple[torch.nn.Module, tuple]:
        owner, inner = module_identity(self.owner)
        return owner, ("MethodCall", inner, self.method)

    def forward(self, **kwargs: Any) -> Any:
        return getattr(self.owner, self.method)(**kwargs)


def component_module(owner: torch.nn.Module, method: str) -> torch.nn.Module:
    return owner if method == "forward" else MethodCall(owner, method)


def flat_call_inputs(call: Call, baked: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    return flat_inputs(call.tensors, {k: v[0] for k, v in call.trees.items() if k not in baked})


def flat_inputs(tensors: Mapping[str, torch.Tensor], trees: Mapping[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A component's flat inputs: its tensors, and each tree's leaves as ``<tree>__<i>``."""
    flat = dict(tensors)
    for name, leaves in trees.items():
        flat.update({leaf_input_name(name, i): leaf for i, leaf in enumerate(leaves)})
    return flat
