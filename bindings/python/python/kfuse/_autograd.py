"""Eager autograd: the loss and its gradients in one run (`_Fused`), or the forward with the
derived VJP program as its backward (`_Derived`)."""

import torch

from . import _kfuse
from ._run import _current_device, _dense_views, _on_device, _raw_stream
from ._types import _KD

def _scale_in_place(g, up):
    """`g *= up` for a gradient `g` that kfuse computed and a one-element upstream gradient `up`.
    On CUDA a kernel on the current stream reads `up` on the device and writes nothing when it is
    1 (`loss.backward()`), so no pass over `g` and no synchronisation. Runs on autograd's device
    thread: integer device ordinals only, no torch.device objects."""
    index = g.get_device()
    if index >= 0 and up.get_device() == index and up.numel() == 1 and up.dtype in _KD:
        grad, upstream = (g.data_ptr(), _KD[g.dtype], g.numel()), (up.data_ptr(), _KD[up.dtype])
        if index == _current_device():
            _scale_by_upstream(index, _raw_stream(index), grad, upstream)
        else:
            _on_device(index, _scale_by_upstream, index, _raw_stream(index), grad, upstream)
    elif index >= 0 or float(up) != 1.0:
        g.mul_(up)


_scale_by_upstream = _kfuse.scale_by_upstream


class _Fused(torch.autograd.Function):
    """Eager autograd: the loss and its gradients in one run.

    The first backward scales the gradients in place by the loss's upstream gradient and hands
    them to autograd, which keeps them as ``.grad`` without a copy, so ``loss.backward()`` adds one
    small launch and no pass over the gradients. The gradients are kfuse's own tensors, held by
    the context until then (not through ``save_for_backward``: they are changed in place, and
    saved-tensor hooks would only move them). A second backward through a retained graph
    recomputes them with the derived VJP program from the saved inputs (PyTorch checks that they
    have not changed in place); a backward with ``create_graph=True`` multiplies out of place."""

    @staticmethod
    def forward(ctx, fusion, mode, *tensors):
        tensors = _dense_views(tensors)
        outs = fusion.kernels.run(tensors, mode)
        ctx.fusion = fusion
        ctx.mode = mode
        ctx.grads = [outs[i] for i in fusion.grad_index]
        # Only a second backward through a retained graph reads them; autograd frees them after a
        # backward that does not retain the graph.
        ctx.save_for_backward(*tensors)
        non_float = fusion.variant.non_float_outputs
        if non_float:
            ctx.mark_non_differentiable(*[outs[i] for i in non_float])
        return tuple(outs[: fusion.n_outputs])

    @staticmethod
    def backward(ctx, *grad_outputs):
        fusion = ctx.fusion
        up = grad_outputs[fusion.loss_index]
        got = ctx.grads
        if got is None:
            got = fusion.variant.backward(ctx.saved_tensors, (fusion.loss_index,), [up], fusion.wrt, ctx.mode)
        elif torch.is_grad_enabled():
            got = [g * up for g in got]
        else:
            # Handed over: no reference stays here, so autograd keeps them without a copy.
            ctx.grads = None
            for g in got:
                _scale_in_place(g, up)
        return fusion.place(got)


class _Derived(torch.autograd.Function):
    """Eager autograd: forward only; backward runs the derived VJP program."""

    @staticmethod
    def forward(ctx, variant, mode, wrt, *tensors):
        # Views kfuse would copy are copied here, once: the backward reads the saved copies.
        tensors = _dense_views(tensors)
        outs = variant.kernels.run(tensors, mode)
        ctx.variant = variant
        ctx.mode = mode
        ctx.wrt = wrt
        ctx.save_for_backward(*tensors)
        if variant.non_float_outputs:
            ctx.mark_non_differentiable(*[outs[i] for i in variant.non_float_outputs])
        ctx.set_materialize_grads(False)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        variant = ctx.variant
        tensors = ctx.saved_tensors
        used = tuple(i for i in variant.float_outputs if grad_outputs[i] is not None)
        grads = [None] * len(tensors)
        if used:
            got = variant.backward(tensors, used, [grad_outputs[i] for i in used], ctx.wrt, ctx.mode)
            for i, g in zip(ctx.wrt, got):
                grads[i] = g
        return (None, None, None, *grads)
