"""The static form of a model that keeps a recurrent state of its own instead of a transformers Cache:
Rwkv's ``state`` (a list of five ``[batch, hidden, layers]`` tensors), xLSTM's ``cache_params`` (an
``xLSTMCache`` whose ``rnn_state`` holds three tensors per layer). transformers' generate ignores
``cache_implementation`` for these (``_supports_default_dynamic_cache()`` is False) and passes, from the
second call on, the state object the previous call returned.

The step (``OwnStateStep``) takes one token a call (``input_ids`` ``[batch, 1]``, ``cache_position``
``[1]``), as the runner form of a static cache does, and carries every floating tensor of the state
object: as buffers of the program (``"buffers"``: dynamo, ExecuTorch, the program ExecuTorch's LLM runner
loads, which it prefills token by token) or as inputs ``past_state_<j>`` returned as ``present_state_<j>``
(``"inputs"``: ONNX). At position 0 the step starts from the state the model itself starts a sequence
from, kept in the program as a constant: Rwkv's is not zero (its running maximum starts at -1e30), so the
state is selected, not multiplied by a flag. Other tensors of the object (xLSTM's ``seqlen_offset``, a
counter no computation reads) are fresh copies of their first value at each call.

Where the one-token path does not compute what the model's prompt path does (Rwkv for a batch over 1: its one-token
branch broadcasts the shifted state ``[batch, hidden]`` against the token ``[batch, 1, hidden]`` into ``[batch, batch,
hidden]``, mixing the rows), fed one token a call the prompt gives other logits than eager ``generate``'s, which runs
the prompt through the model's multi-token path and only the later tokens through the one-token one.
static_prefill.py's ``prompt_path_differs`` measures this at export as it does for a cache step's linear-attention
states, and a ``prompt`` component (``own_state_prompt``: this step's forward over the whole prompt, from the starting
state, returning the state it leaves) runs the prompt; both then keep the state as inputs and outputs. Where the
one-token prompt agrees (one row of Rwkv, xLSTM), the step stays one program, the runner's.

The initial state is read off the model: the state object its forward hands to its first submodule that
takes it by the same argument name (Rwkv's blocks take ``state=``), else the object a one-token call returns,
after its own ``reset()`` (xLSTMCache). A model whose state is neither is refused by name, as is a
transformers Cache subclass of the model's own (its attention layers' keys grow, which needs the static cache's
slots: exporters/generation/static_caches.py builds the step's cache as such a class where it has an adapter,
MiniMax's ``MiniMaxCache``).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError

# the forward arguments generate passes a model's own state by (Rwkv: state; xLSTM: cache_params)
OWN_STATE_ARGS = ("state", "cache_params", "past_key_values")
# what generate passes besides the tokens and the state: flags the step sets itself
OWN_STATE_FLAGS = ("use_cache", "return_dict", "logits_to_keep", "output_attentions", "output_hidden_states")

Path = tuple[Any, ...]


def keeps_own_state(model: torch.nn.Module) -> bool:
    """Whether transformers says ``model`` keeps a state of its own rather than a Cache it builds
    (``_supports_default_dynamic_cache()`` False: Rwkv, xLSTM, MiniMax, XLNet, Reformer)."""
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    return supports is not None and not supports()


def own_state_argument(model: torch.nn.Module, calls: list[dict[str, Any]]) -> str | None:
    """The forward argument by which ``generate`` passes ``model`` a state of its own from the second call on,
    or None where the model takes a transformers Cache (``keeps_own_state``)."""
    if not keeps_own_state(model):
        return None
    params = inspect.signature(model.forward).parameters
    return next((arg for arg in OWN_STATE_ARGS if arg in params and len(calls) > 1 and arg not in calls[0]
                 and all(arg in call for call in calls[1:])), None)


def state_leaves(obj: Any, path: Path = (), top: bool = True) -> list[tuple[Path, torch.Tensor]]:
    """Every tensor of a state object with its path: list and tuple indices, dict keys, and the top object's
    attributes (``("rnn_state", 0, 1)``)."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, (list, tuple)):
        return [leaf for i, v in enumerate(obj) for leaf in state_leaves(v, (*path, i), False)]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in state_leaves(v, (*path, k), False)]
    if top and hasattr(obj, "__dict__"):
        return [leaf for k, v in vars(obj).items() for leaf in state_leaves(v, (*path, k), False)]
    return []


def rebuilt(obj: Any, values: Mapping[Path, torch.Tensor], path: Path = (), top: bool = True) -> Any:
    """``obj`` with the tensor at each path of ``values`` replaced (a fresh copy of every other tensor, which
    the model may count up in place), its containers new and its top object a shallow copy."""
    if isinstance(obj, torch.Tensor):
        return values[path] if path in values else obj.clone()
    if isinstance(obj, list):
        return [rebuilt(v, values, (*path, i), False) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(rebuilt(v, values, (*path, i), False) for i, v in enumerate(obj))
    if isinstance(obj, dict):
        return {k: rebuilt(v, values, (*path, k), False) for k, v in obj.items()}
    if top and hasattr(obj, "__dict__"):
        new = copy.copy(obj)
        for k, v in vars(obj).items():
            if state_leaves(v, (), False):
                setattr(new, k, rebuilt(v, values, (*path, k), False))
        return new
    return obj


def initial_state(model: torch.nn.Module, arg: str, batch: int) -> tuple[Any, dict[Path, torch.Tensor]]:
    """The state object a one-token call returns (the template the step rebuilds) and the values its carried
    tensors take at a sequence's start (module docstring)."""
    from transformers.cache_utils import Cache

    name = type(model).__name__
    handed: list[dict[Path, torch.Tensor]] = []

    def first_handed(module, args, kwargs):
        if not handed and kwargs.get(arg) is not None:
            handed.append({p: t.detach().clone() for p, t in state_leaves(kwargs[arg])})

    handles = [m.register_forward_pre_hook(first_handed, with_kwargs=True) for m in model.modules() if m is not model]
    try:
        with torch.no_grad():
            out = model(input_ids=torch.zeros(batch, 1, dtype=torch.long), use_cache=True, return_dict=True)
    finally:
        for handle in handles:
            handle.remove()
    returned = getattr(out, arg, None)
    if returned is None:
        raise GenerationError(f"{name}'s forward returns no {arg!r}; its generate passes one back to every call after "
                              "the first, which the state step carries")
    if isinstance(returned, Cache):
        raise GenerationError(f"{name} keeps its state in {type(returned).__name__}, a transformers Cache of its own class "
                              "whose layers grow along the sequence; the own-state step carries fixed-size state "
                              "tensors only (static cache slots for it are not built)")
    carried = {p: t for p, t in state_leaves(returned) if t.is_floating_point()}
    if not carried:
        raise GenerationError(f"{name}'s {arg} ({type(returned).__name__}) holds no floating tensors to carry")
    if handed:
        initial = handed[0]
    elif callable(getattr(returned, "reset", None)):
        fresh = copy.copy(returned)
        fresh.reset()
        initial = dict(state_leaves(fresh))
    else:
        raise GenerationError(f"{name}'s {arg} ({type(returned).__name__}): its starting value could not be read (no "
                              f"submodule takes it as {arg}=, and it has no reset())")
    missing = [p for p in carried if p not in initial or initial[p].shape != carried[p].shape]
    if missing:
        raise GenerationError(f"{name}'s {arg}: the starting state has no tensor of the returned state's shape at "
                              f"{missing[:3]}")
    return returned, {p: initial[p] for p in carried}


class OwnStateStep(torch.nn.Module):
    """``model`` one token a call over its own state (module docstring)."""

    takes_positions = takes_mask = embeds = False
    token_by_token = True
    deepstack = 0
    cross = None

    use_cache_asked: str | None = None  # why generate was asked for a cache its config turns off (static_step_for)

    def __init__(self, model: torch.nn.Module, arg: str, batch: int, max_cache_len: int, state: str):
        super().__init__()
        self.model, self.arg, self.state, self.max_cache_len, self.batch = model, arg, state, max_cache_len, batch
        self.extras: dict[str, str] = {}
        # what static_prefill.py's prompt component reads of a step: no inputs beside the tokens, none handed on, the
        # prompt fed whole (no prefill rule: static.py's ``_prompt_rule`` reads one off a cache step's calls only)
        self.prompt_inputs, self.passthrough, self.from_prompt, self.constants = (), (), {}, {}
        self.same: tuple[str, ...] = ()  # no unchanged caller inputs beside the tokens (static.py's ``same``)
        self.prompt_rule: str | None = None
        self.runner_form = batch == 1
        self.keeps_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.template, initial = initial_state(model, arg, batch)
        self.paths = list(initial)
        for j, path in enumerate(self.paths):
            self.register_buffer(f"initial_{j}", initial[path], persistent=False)
            if state == "buffers":
                self.register_buffer(f"state_{j}", initial[path].clone())

    def cache_shapes(self) -> dict[str, tuple[int, ...]]:
        """The state inputs ``past_state_<j>`` and their shapes (the outputs are ``present_state_<j>``)."""
        return {f"past_state_{j}": tuple(getattr(self, f"initial_{j}").shape) for j in range(len(self.paths))}

    def initial_cache(self) -> dict[str, torch.Tensor]:
        """Zeros for every state input: the call at position 0 replaces them with the model's starting state."""
        return {k: torch.zeros(shape, dtype=getattr(self, f"initial_{j}").dtype)
                for j, (k, shape) in enumerate(self.cache_shapes().items())}

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor, **given: torch.Tensor) -> dict[str, torch.Tensor]:
        going_on = cache_position[0] > 0  # position 0 starts a sequence from the model's own starting state
        values = {}
        for j, path in enumerate(self.paths):
            held = given[f"past_state_{j}"] if self.state == "inputs" else getattr(self, f"state_{j}")
            values[path] = torch.where(going_on, held, getattr(self, f"initial_{j}"))
        kwargs = {"logits_to_keep": 1} if self.keeps_last else {}
        out = self.model(input_ids=input_ids, **{self.arg: rebuilt(self.template, values)}, use_cache=True,
                         return_dict=True, **kwargs)
        new = dict(state_leaves(getattr(out, self.arg)))
        outputs = {"logits": out.logits[:, -1, :]}
        for j, path in enumerate(self.paths):
            if self.state == "inputs":
                outputs[f"present_state_{j}"] = new[path]
            else:
                getattr(self, f"state_{j}").copy_(new[path])
        return outputs


def own_state_step_for(model: torch.nn.Module, calls: list[dict[str, Any]], arg: str, max_cache_len: int, state: str,
                       batch: int) -> OwnStateStep:
    """The step of a model whose generate passes its own state by ``arg`` (``own_state_argument``), checked
    against every captured call: tokens and the state only (a mask where the forward does not name one, which
    it then takes into ``**kwargs`` unread: xLSTM)."""
    name = type(model).__name__
    step = OwnStateStep(model, arg, batch, max_cache_len, state).eval()  # refuses a state it cannot carry first
    params = inspect.signature(model.forward).parameters
    for i, call in enumerate(calls):
        other = sorted(k for k in call if k not in ("input_ids", arg, *OWN_STATE_FLAGS)
                       and not (k == "attention_mask" and k not in params))
        if other:
            raise GenerationError(f"{name}.generate passes {other} to forward (call {i}) beside its own state {arg!r}; "
                                  "the own-state step takes one token and the state only")
    return step


def own_state_prompt(step: OwnStateStep) -> OwnStateStep:
    """``step``'s prompt component (module docstring): the same forward over the whole prompt (``input_ids``
    ``[batch, prompt]``, ``cache_position`` ``[prompt]``), the model's multi-token path, from the starting state at
    position 0, its state as inputs and outputs (``past_state_<j>`` / ``present_state_<j>``) in ``step``'s layout."""
    prompt = OwnStateStep(step.model, step.arg, step.batch, step.max_cache_len, "inputs").eval()
    prompt.token_by_token = prompt.runner_form = False
    return prompt
