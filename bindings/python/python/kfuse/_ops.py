"""torch.compile: each program variant as custom operators (``torch.ops.kfuse.*``) with shape
functions and registered backwards, so a compiled graph has no break at kfuse."""

import hashlib
import threading

import torch

from ._types import TORCH_DTYPES

# ---------------------------------------------------------------------------------------------
# torch.compile: custom operators.

_LIB = None
_LIB_LOCK = threading.Lock()
_REGISTERED = {}


def _library():
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("kfuse", "FRAGMENT")
    return _LIB


def _sym_sources(inputs):
    """For each symbol, the first (input index, axis) that carries it."""
    src = {}
    for i, d in enumerate(inputs):
        for axis, dim in enumerate(d.shape):
            if isinstance(dim, str) and dim not in src:
                src[dim] = (i, axis)
    return src


def _fake_outputs(decls, inputs, sources, tensors):
    outs = []
    for d in decls:
        shape = []
        for dim in d.shape:
            if isinstance(dim, str):
                i, axis = sources[dim]
                shape.append(tensors[i].shape[axis])
            else:
                shape.append(dim)
        outs.append(tensors[0].new_empty(shape, dtype=TORCH_DTYPES[d.kfuse_dtype]))
    return outs


def _register(variant):
    """Defines ``kfuse::p<hash>`` (forward) and ``kfuse::p<hash>_vjp`` (backward w.r.t. every
    float input, upstream gradients for every float output), with shape functions and autograd."""
    key = hashlib.sha256(variant.native.graph_text().encode()).hexdigest()[:16]
    name = f"p{key}"
    with _LIB_LOCK:
        if name in _REGISTERED:
            return _REGISTERED[name]
        lib = _library()
        ins = variant.inputs
        outs = variant.outputs
        n_in = len(ins)
        wrt = tuple(variant.float_inputs)
        fl_out = tuple(variant.float_outputs)
        sources = _sym_sources(ins)
        args = ", ".join(f"Tensor in_{d.name}" for d in ins)
        ret = "(" + ", ".join("Tensor" for _ in outs) + ")" if len(outs) != 1 else "Tensor"
        lib.define(f"{name}({args}, int validate=1) -> {ret}")
        bargs = args + "".join(f", Tensor up_{outs[i].name}" for i in fl_out) + ", int validate=1"
        bret = "(" + ", ".join("Tensor" for _ in wrt) + ")" if len(wrt) != 1 else "Tensor"
        if wrt:
            lib.define(f"{name}_vjp({bargs}) -> {bret}")

        def single(values, n):
            return values[0] if n == 1 else tuple(values)

        def fwd_impl(*a):
            tensors, mode = list(a[:n_in]), (a[n_in] if len(a) > n_in else 1)
            return single(variant.kernels.run(tensors, mode), len(outs))

        def fwd_fake(*a):
            return single(_fake_outputs(outs, ins, sources, a[:n_in]), len(outs))

        lib.impl(name, fwd_impl, "CPU")
        lib.impl(name, fwd_impl, "CUDA")
        torch.library.register_fake(f"kfuse::{name}", fwd_fake, lib=lib)

        if wrt:
            vjp_op = getattr(torch.ops.kfuse, f"{name}_vjp")

            def bwd_impl(*a):
                n_up = len(fl_out)
                tensors, ups = list(a[:n_in]), a[n_in : n_in + n_up]
                mode = a[n_in + n_up] if len(a) > n_in + n_up else 1
                return single(variant.backward(tensors, fl_out, list(ups), wrt, mode), len(wrt))

            def bwd_fake(*a):
                return single([a[i].new_empty(a[i].shape) for i in wrt], len(wrt))

            lib.impl(f"{name}_vjp", bwd_impl, "CPU")
            lib.impl(f"{name}_vjp", bwd_impl, "CUDA")
            torch.library.register_fake(f"kfuse::{name}_vjp", bwd_fake, lib=lib)

            def setup_context(ctx, inputs, output):
                ctx.save_for_backward(*inputs[:n_in])
                ctx.mode = inputs[n_in] if len(inputs) > n_in else 1

            def backward(ctx, *grads):
                tensors = ctx.saved_tensors
                ups = []
                for i in fl_out:
                    g = grads[i]
                    ups.append(torch.zeros_like(_fake_like(outs[i], tensors, sources)) if g is None else g)
                got = vjp_op(*tensors, *ups, validate=ctx.mode)
                got = (got,) if len(wrt) == 1 else got
                result = [None] * (n_in + 1)
                for i, g in zip(wrt, got):
                    result[i] = g
                return tuple(result)

            torch.library.register_autograd(f"kfuse::{name}", backward, setup_context=setup_context, lib=lib)
        op = getattr(torch.ops.kfuse, name)
        _REGISTERED[name] = op
        return op


def _register_fused(variant, wrt):
    """Defines ``kfuse::p<hash>_g<inputs>``: the outputs of a program whose only float output is a
    scalar loss, followed by the loss's gradients with respect to the inputs `wrt` (one run of the
    ``with_gradients`` program). Its backward scales the saved gradients by the loss's upstream
    gradient, so forward and backward together are one launch."""
    key = hashlib.sha256(variant.native.graph_text().encode()).hexdigest()[:16]
    name = f"p{key}_g" + "_".join(str(i) for i in wrt)
    with _LIB_LOCK:
        if name in _REGISTERED:
            return _REGISTERED[name]
        lib = _library()
        ins, outs = variant.inputs, variant.outputs
        n_in, n_out = len(ins), len(outs)
        loss_index = variant.float_outputs[0]
        sources = _sym_sources(ins)
        fusion = variant.fusion(wrt)
        args = ", ".join(f"Tensor in_{d.name}" for d in ins)
        ret = "(" + ", ".join("Tensor" for _ in range(n_out + len(wrt))) + ")"
        lib.define(f"{name}({args}, int validate=1) -> {ret}")

        def impl(*a):
            tensors, mode = list(a[:n_in]), (a[n_in] if len(a) > n_in else 1)
            got = fusion.kernels.run(tensors, mode)
            return tuple(got[:n_out] + [got[i] for i in fusion.grad_index])

        def fake(*a):
            tensors = a[:n_in]
            return tuple(_fake_outputs(outs, ins, sources, tensors) + [tensors[i].new_empty(tensors[i].shape) for i in wrt])

        lib.impl(name, impl, "CPU")
        lib.impl(name, impl, "CUDA")
        torch.library.register_fake(f"kfuse::{name}", fake, lib=lib)

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*output[n_out:])

        def backward(ctx, *grads):
            result = [None] * (n_in + 1)
            up = grads[loss_index]
            if up is not None:
                for i, g in zip(wrt, ctx.saved_tensors):
                    result[i] = g * up.to(g.dtype)
            return tuple(result)

        torch.library.register_autograd(f"kfuse::{name}", backward, setup_context=setup_context, lib=lib)
        op = getattr(torch.ops.kfuse, name)
        _REGISTERED[name] = op
        return op


def _fake_like(decl, tensors, sources):
    return _fake_outputs([decl], None, sources, tensors)[0]
