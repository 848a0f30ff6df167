"""ExecuTorch program fix: carry complex tensors as real ones with a trailing (real, imag) axis.

The ExecuTorch runtime has no complex kernels: a program with a complex RoPE (DeepSeek-V2, Llama 4
text and vision: ``view_as_real(view_as_complex(x.reshape(..., -1, 2)) * freqs_cis)``, freqs_cis
built with ``torch.polar`` or stored as a complex buffer) lowers, then cannot load. This module
rewrites the whole program before lowering (the FFT ops' rules are in _complex_fft.py).
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from typing import Any

import torch
from torch._guards import detect_fake_mode

from exporters.utils import _SOURCE_META, register_fx_program_fix, set_fake_val
from exporters.workarounds.executorch._complex_common import _WRAPPERS, _is_complex, _rank, _real_dtype, _Unhandled, _val
from exporters.workarounds.executorch._complex_fft import _fft_1d, _fft_c2c, _fft_irfft, _fft_op, _fft_r2c

aten = torch.ops.aten

class _Rewriter:
    """Rewrites one graph: ``rep`` maps each complex-valued node to the node that now holds its
    value as a real tensor with a trailing axis of 2 (what view_as_real gives)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm, self.graph, self.rep = gm, gm.graph, {}
        self.node: torch.fx.Node | None = None

    # ── helpers that emit nodes before the node being rewritten ──
    def call(self, op, *args, **kwargs) -> torch.fx.Node:
        new = self.graph.call_function(op, args, kwargs)
        new.meta.update({k: v for k, v in self.node.meta.items() if k in _SOURCE_META})
        set_fake_val(new)
        if "val" not in new.meta:  # no tensor operand to take the fake mode from (arange)
            fake_mode = detect_fake_mode([_val(n) for n in self.graph.nodes if isinstance(_val(n), torch.Tensor)])
            vals, kwvals = torch.fx.node.map_arg((args, kwargs), _val)  # a SymInt node's value (arange(n))
            with fake_mode:
                new.meta["val"] = op(*vals, **kwvals)
        return new

    def parts(self, a: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
        return self.call(aten.select.int, a, -1, 0), self.call(aten.select.int, a, -1, 1)

    def pack(self, re: torch.fx.Node, im: torch.fx.Node) -> torch.fx.Node:
        return self.call(aten.stack.default, [re, im], -1)

    def cx(self, arg: Any) -> bool:
        return isinstance(arg, torch.fx.Node) and arg in self.rep

    def r(self, arg: Any) -> Any:
        return self.rep.get(arg, arg) if isinstance(arg, torch.fx.Node) else arg

    @staticmethod
    def dim(d: int, rank: int) -> int:
        """A dim of a complex tensor of ``rank`` dims, as a non-negative dim of its real form."""
        if not isinstance(d, int) or not -rank <= d < max(rank, 1):
            raise _Unhandled(f"dim {d!r} of a rank-{rank} complex tensor")
        return d % rank if rank else 0

    # ── the rewrite ──
    def run(self, complex_placeholders: set[str] = frozenset(), allow_complex_outputs: bool = False) -> list[bool]:
        """Rewrite the graph in place; returns, per output, whether it is a complex value now real."""
        for node in list(self.graph.nodes):
            self.node = node
            if node.op == "placeholder":
                if node.name in complex_placeholders:
                    self.rep[node] = node  # its value (and meta val) were made real by the caller
                elif _is_complex(_val(node)):
                    raise _Unhandled(f"complex input {node.name}")
            elif node.op == "call_function":
                with self.graph.inserting_before(node):
                    self.rewrite(node)
            elif node.op == "output":
                outs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
                flags = [self.cx(o) for o in outs]
                if any(flags) and not allow_complex_outputs:
                    raise _Unhandled("the program returns a complex tensor")
                node.args = (type(node.args[0])(self.r(o) for o in outs),) if isinstance(node.args[0], (list, tuple)) \
                    else (self.r(node.args[0]),)
            elif _is_complex(_val(node)) or any(self.cx(a) for a in node.all_input_nodes):
                raise _Unhandled(f"complex {node.op} {node.name}")
        for node in reversed(list(self.graph.nodes)):  # the complex originals, now without users
            if node in self.rep and self.rep[node] is not node:
                if node.users:
                    raise _Unhandled(f"{node.name} still has users")
                self.graph.erase_node(node)
        self.gm.recompile()
        return flags

    def rewrite(self, node: torch.fx.Node) -> None:
        val = _val(node)
        target = node.target
        complex_in = any(self.cx(a) for a in node.all_input_nodes)
        complex_out = _is_complex(val) or (isinstance(val, (tuple, list)) and any(_is_complex(v) for v in val))
        name = getattr(target, "__name__", str(target))
        if isinstance(target, torch._ops.HigherOrderOperator):
            return self.higher_order(node)
        if not complex_in and not complex_out:
            return
        if target is aten._assert_tensor_metadata.default:
            self.graph.erase_node(node)
            return
        if target is operator.getitem:
            raise _Unhandled(f"getitem of {node.args[0]}")
        handler = _HANDLERS.get(target)
        if handler is None:
            raise _Unhandled(f"no rewrite for {name}")
        out = handler(self, node, *node.args, **node.kwargs)
        if complex_out:
            self.rep[node] = out
        else:  # a real result (view_as_real, real, abs): the users take the new node
            out.meta["val"] = val
            node.replace_all_uses_with(out)
            self.graph.erase_node(node)

    def higher_order(self, node: torch.fx.Node) -> None:
        """Rewrite the subgraphs of a higher-order op; complex values may cross only the wrappers."""
        subs = [a for a in node.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
        wrapper = getattr(node.target, "__name__", "") in _WRAPPERS and len(subs) == 1
        operands = node.args[node.args.index(subs[0]) + 1:] if wrapper else []
        complex_in = [self.cx(a) for a in operands]
        if not wrapper and any(self.cx(a) for a in node.all_input_nodes):
            raise _Unhandled(f"complex operand of {node.target}")
        for sub_node in subs:
            sub = getattr(self.gm, sub_node.target)
            placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
            names = set()
            for ph, arg, is_cx in zip(placeholders, operands, complex_in):
                if is_cx:
                    ph.meta["val"] = _val(self.r(arg))
                    names.add(ph.name)
            flags = _Rewriter(sub).run(names, allow_complex_outputs=wrapper)
        if not wrapper:
            return
        node.args = tuple(self.r(a) for a in node.args)
        outs = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        val = _val(node)
        if isinstance(val, (tuple, list)):
            node.meta["val"] = type(val)(_val(o) if isinstance(o, torch.fx.Node) else v for o, v in zip(outs, val))
            for user in list(node.users):
                if user.target is operator.getitem and flags[user.args[1]]:
                    user.meta["val"] = node.meta["val"][user.args[1]]
                    self.rep[user] = user
        elif any(flags):
            raise _Unhandled(f"complex result of {node.target} that is not a tuple")


# ── one function per op: (rewriter, node, *args, **kwargs) -> the node holding the result ──


def _view_as_complex(rw, node, x):
    return x  # a real [..., 2] tensor is already the representation


def _view_as_real(rw, node, c):
    return rw.r(c)


def _polar(rw, node, magnitude, angle):
    if rw.cx(magnitude) or rw.cx(angle):
        raise _Unhandled("polar of a complex tensor")
    re = rw.call(aten.mul.Tensor, magnitude, rw.call(aten.cos.default, angle))
    im = rw.call(aten.mul.Tensor, magnitude, rw.call(aten.sin.default, angle))
    return rw.pack(re, im)


def _mul(rw, node, a, b):
    if rw.cx(a) and rw.cx(b):
        (ar, ai), (br, bi) = rw.parts(rw.r(a)), rw.parts(rw.r(b))
        re = rw.call(aten.sub.Tensor, rw.call(aten.mul.Tensor, ar, br), rw.call(aten.mul.Tensor, ai, bi))
        im = rw.call(aten.add.Tensor, rw.call(aten.mul.Tensor, ar, bi), rw.call(aten.mul.Tensor, ai, br))
        return rw.pack(re, im)
    c, other = (a, b) if rw.cx(a) else (b, a)
    if not rw.cx(c):
        raise _Unhandled("mul with a complex result from real operands")
    if isinstance(other, torch.fx.Node):
        if _is_complex(_val(other)):
            raise _Unhandled("mul by a complex tensor that is not rewritten")
        return rw.call(aten.mul.Tensor, rw.r(c), rw.call(aten.unsqueeze.default, other, -1))
    if isinstance(other, complex):
        raise _Unhandled("mul by a complex Python number")
    return rw.call(node.target, rw.r(c), other)


def _add_sub(rw, node, a, b, alpha=1):
    if not (rw.cx(a) and rw.cx(b)):
        raise _Unhandled(f"{node.target} of a complex and a real value")
    return rw.call(node.target, rw.r(a), rw.r(b), alpha=alpha)


def _real(rw, node, c):
    return rw.call(aten.select.int, rw.r(c), -1, 0)


def _imag(rw, node, c):
    return rw.call(aten.select.int, rw.r(c), -1, 1)


def _conj(rw, node, c):
    """conj / _conj / conj_physical: the imaginary part negated (Autoformer's autocorrelation,
    ``q_fft * torch.conj(k_fft)``; the runtime has no ``_conj_copy`` kernel)."""
    if not rw.cx(c):
        raise _Unhandled("conj of a complex tensor that is not rewritten")
    re, im = rw.parts(rw.r(c))
    return rw.pack(re, rw.call(aten.neg.default, im))


def _same_op(rw, node, c, *args, **kwargs):
    """clone, contiguous, alias, detach, and dtype conversions (complex dtype -> its real dtype; a real
    floating tensor cast to complex gets a zero imaginary part: ``fftn(x.to(torch.complex64))``)."""
    if not _is_complex(_val(node)):
        raise _Unhandled(f"{node.target} from complex to real drops the imaginary part")
    args = tuple(rw.r(_real_dtype(a)) for a in args)
    kwargs = {k: _real_dtype(v) for k, v in kwargs.items() if k != "memory_format" or v is not torch.channels_last}
    if not rw.cx(c):
        source = _val(c)
        if node.target not in _CASTS or not isinstance(source, torch.Tensor) or not source.is_floating_point():
            raise _Unhandled(f"{node.target} from real to complex")
        re = rw.call(node.target, c, *args, **kwargs)
        return rw.pack(re, rw.call(aten.zeros_like.default, re))
    return rw.call(node.target, rw.r(c), *args, **kwargs)


_CASTS = (aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default)


def _shape(rw, node, c, shape):
    return rw.call(aten.reshape.default, rw.r(c), [*shape, 2])


def _expand(rw, node, c, sizes, implicit=False):
    return rw.call(aten.expand.default, rw.r(c), [*sizes, 2])


def _unsqueeze(rw, node, c, d):
    return rw.call(aten.unsqueeze.default, rw.r(c), rw.dim(d, _rank(c) + 1))


def _squeeze_dims(rw, node, c, dims=None):
    if dims is None:  # squeeze every size-1 dim of the complex tensor, never the trailing 2
        dims = [i for i, s in enumerate(_val(c).shape) if s == 1]
    dims = [dims] if isinstance(dims, int) else dims
    return rw.call(aten.squeeze.dims, rw.r(c), [rw.dim(d, _rank(c)) for d in dims])


def _slice(rw, node, c, d=0, start=None, end=None, step=1):
    return rw.call(aten.slice.Tensor, rw.r(c), rw.dim(d, _rank(c)), start, end, step)


def _select(rw, node, c, d, index):
    return rw.call(aten.select.int, rw.r(c), rw.dim(d, _rank(c)), index)


def _transpose(rw, node, c, d0, d1):
    rank = _rank(c)
    return rw.call(aten.transpose.int, rw.r(c), rw.dim(d0, rank), rw.dim(d1, rank))


def _permute(rw, node, c, dims):
    rank = _rank(c)
    return rw.call(aten.permute.default, rw.r(c), [*(rw.dim(d, rank) for d in dims), rank])


def _cat(rw, node, tensors, d=0):
    if not all(rw.cx(t) for t in tensors):
        raise _Unhandled("cat of complex and real tensors")
    return rw.call(aten.cat.default, [rw.r(t) for t in tensors], rw.dim(d, _rank(tensors[0])))


def _stack(rw, node, tensors, d=0):
    if not all(rw.cx(t) for t in tensors):
        raise _Unhandled("stack of complex and real tensors")
    return rw.call(aten.stack.default, [rw.r(t) for t in tensors], rw.dim(d, _rank(tensors[0]) + 1))


def _type_as(rw, node, c, other):
    if not (rw.cx(c) and rw.cx(other)):
        raise _Unhandled("type_as between complex and real")
    return rw.r(c)


_HANDLERS = {
    aten.fft_irfft.default: _fft_irfft,
    aten.fft_fft.default: _fft_1d(),
    aten.fft_ifft.default: _fft_1d(inverse=True),
    aten.fft_rfft.default: _fft_1d(onesided=True),
    aten.fft_fft2.default: _fft_op(default_dim=[-2, -1]),
    aten.fft_ifft2.default: _fft_op(inverse=True, default_dim=[-2, -1]),
    aten.fft_rfft2.default: _fft_op(onesided=True, default_dim=[-2, -1]),
    aten.fft_fftn.default: _fft_op(),
    aten.fft_ifftn.default: _fft_op(inverse=True),
    aten.fft_rfftn.default: _fft_op(onesided=True),
    aten._fft_r2c.default: _fft_r2c,
    aten._fft_c2c.default: _fft_c2c,
    aten.view_as_complex.default: _view_as_complex,
    aten.view_as_real.default: _view_as_real,
    aten.polar.default: _polar,
    aten.mul.Tensor: _mul,
    aten.mul.Scalar: _mul,
    aten.add.Tensor: _add_sub,
    aten.sub.Tensor: _add_sub,
    aten.real.default: _real,
    aten.conj.default: _conj,
    aten._conj.default: _conj,
    aten.conj_physical.default: _conj,
    aten.imag.default: _imag,
    aten.clone.default: _same_op,
    aten.contiguous.default: _same_op,
    aten.alias.default: _same_op,
    aten.detach.default: _same_op,
    aten.to.dtype: _same_op,
    aten.to.dtype_layout: _same_op,
    aten.to.device: _same_op,
    aten._to_copy.default: _same_op,
    aten.type_as.default: _type_as,
    aten.view.default: _shape,
    aten.reshape.default: _shape,
    aten._unsafe_view.default: _shape,
    aten.expand.default: _expand,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dims: _squeeze_dims,
    aten.squeeze.dim: _squeeze_dims,
    aten.squeeze.default: _squeeze_dims,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.cat.default: _cat,
    aten.stack.default: _stack,
}


def _has_complex(gm: torch.fx.GraphModule) -> bool:
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                val = _val(node)
                if _is_complex(val) or (isinstance(val, (tuple, list)) and any(_is_complex(v) for v in val)):
                    return True
    return False


@register_fx_program_fix("executorch")
def _fix_complex_as_real(program, *, config):
    """The ExecuTorch runtime has no complex kernels: a complex RoPE (DeepSeek-V2, Llama 4) lowers
    (under no_grad; with grad on, "view_as_complex_copy does not support automatic differentiation
    for outputs with complex dtype"), then fails to load: "the ExecuTorch runtime has no kernel for
    aten::view_as_complex_copy.out". Carry every complex tensor as a real one with a trailing
    (real, imag) axis, which is what view_as_real gives; a program with a complex op not rewritten
    here (or a complex input or output) is left as it was.

    before: view_as_real(view_as_complex(x) * polar(r, theta))
    after:  x [..., 2], f = stack(r * cos(theta), r * sin(theta), -1);
            stack(x[..., 0] * f[..., 0] - x[..., 1] * f[..., 1], x[..., 0] * f[..., 1] + x[..., 1] * f[..., 0], -1)
            (complex buffers and constants become their view_as_real, shape ops get the trailing 2)

    FFTs over static lengths (FNet's ``fftn(h, dim=(1, 2)).real``: "no kernel for aten::_fft_c2c.out")
    become real DFTs: matmuls with in-graph cos / sin matrices over each transformed dim.
    """
    if not _has_complex(program.graph_module):
        return program, False
    gm = copy.deepcopy(program.graph_module)
    state_dict, constants = dict(program.state_dict), dict(program.constants)
    complex_placeholders = set()
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    try:
        for spec in program.graph_signature.input_specs:
            node = placeholders[spec.arg.name] if hasattr(spec.arg, "name") else None
            if node is None or not _is_complex(_val(node)):
                continue
            store = state_dict if spec.target in state_dict else constants if spec.target in constants else None
            if store is None:  # a user input: its caller passes a complex tensor
                raise _Unhandled(f"complex {spec.kind.name.lower()} {spec.arg.name}")
            value = torch.view_as_real(store[spec.target].detach()).clone()
            store[spec.target] = torch.nn.Parameter(value, requires_grad=False) \
                if isinstance(store[spec.target], torch.nn.Parameter) else value
            fake = node.meta["val"]
            with fake.fake_mode:
                node.meta["val"] = torch.view_as_real(fake).clone()
            complex_placeholders.add(node.name)
        _Rewriter(gm).run(complex_placeholders)
    except _Unhandled:
        return program, False
    return program._update(gm, _renamed_outputs(program.graph_signature, gm), state_dict=state_dict,
                           constants=constants), True


def _renamed_outputs(signature, gm: torch.fx.GraphModule):
    """The signature with each output named after the node that now computes it (an irfft or a
    view_as_real that was a program output has been replaced)."""
    from torch.export.graph_signature import ExportGraphSignature, TensorArgument

    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    specs = [
        dataclasses.replace(spec, arg=TensorArgument(name=node.name))
        if isinstance(spec.arg, TensorArgument) and isinstance(node, torch.fx.Node) and node.name != spec.arg.name
        else spec
        for spec, node in zip(signature.output_specs, outputs)
    ]
    return ExportGraphSignature(input_specs=list(signature.input_specs), output_specs=specs)
