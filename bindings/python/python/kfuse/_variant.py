"""A program at one set of input dtypes, with the programs derived from it (the fused loss +
gradients, the vector-Jacobian products) and its custom operators, each built on first use."""

import threading

from ._ops import _register, _register_fused
from ._run import _Kernels
from ._types import FLOAT, TORCH_DTYPES, Decl

# ---------------------------------------------------------------------------------------------
# Variants: one program per combination of float input dtypes, with its derived programs.


class _Fusion:
    """The loss and its gradients with respect to the inputs `wrt` in one program: its kernels,
    where the gradients are among its outputs, and what the backward needs."""

    __slots__ = ("variant", "kernels", "grad_index", "wrt", "n_inputs", "n_outputs", "loss_index")

    def __init__(self, variant, wrt):
        self.variant = variant
        loss = variant.outputs[variant.float_outputs[0]].name
        native, pairs = variant.native.with_gradients(loss, [variant.names[i] for i in wrt])
        outs = [d[0] for d in native.outputs]
        self.kernels = _Kernels(native, variant.names)
        self.grad_index = [outs.index(g) for _, g in pairs]
        self.wrt = wrt
        self.n_inputs = len(variant.inputs)
        self.n_outputs = len(variant.outputs)
        self.loss_index = variant.float_outputs[0]

    def place(self, grads):
        """The backward's result: `grads` (one per input of `wrt`) in their inputs' places after
        the two non-tensor arguments of `_Fused.apply`, None elsewhere."""
        result = [None] * (2 + self.n_inputs)
        for i, g in zip(self.wrt, grads):
            result[2 + i] = g
        return tuple(result)


class _Variant:
    """The program at one set of input dtypes, and the programs derived from it (built lazily,
    once: derivation and planning happen on the first call that needs them)."""

    def __init__(self, native):
        self.native = native
        self.inputs = [Decl(*d) for d in native.inputs]
        self.outputs = [Decl(*d) for d in native.outputs]
        self.names = [d.name for d in self.inputs]
        self.kernels = _Kernels(native, self.names)
        self.float_inputs = [i for i, d in enumerate(self.inputs) if d.kfuse_dtype in FLOAT]
        self.float_outputs = [i for i, d in enumerate(self.outputs) if d.kfuse_dtype in FLOAT]
        self.non_float_outputs = [i for i, d in enumerate(self.outputs) if d.kfuse_dtype not in FLOAT]
        # The fused loss + gradient path: one float output, a scalar.
        self.scalar_loss = len(self.float_outputs) == 1 and len(self.outputs[self.float_outputs[0]].shape) == 0
        # Re-entrant: registering the fused operator derives the gradient program.
        self._lock = threading.RLock()
        self._fusions = {}
        self._vjps = {}
        self._ops = {}

    def fusion(self, wrt):
        """The fused loss + gradients w.r.t. `wrt` (float input indices), built on first use."""
        hit = self._fusions.get(wrt)
        if hit is None:
            with self._lock:
                hit = self._fusions.get(wrt)
                if hit is None:
                    hit = self._fusions[wrt] = _Fusion(self, wrt)
        return hit

    def vjp(self, outputs, wrt):
        """The vector-Jacobian product of the outputs `outputs` (indices) w.r.t. `wrt`: kernels
        whose inputs are this program's, then ``grad_<output>`` per output in `outputs`."""
        key = (outputs, wrt)
        with self._lock:
            hit = self._vjps.get(key)
            if hit is None:
                base = self.native
                if len(outputs) != len(self.float_outputs):
                    base = base.select_outputs([self.outputs[i].name for i in outputs])
                prog, _, _ = base.vjp([self.names[i] for i in wrt])
                names = self.names + ["grad_" + self.outputs[i].name for i in outputs]
                hit = self._vjps[key] = _Kernels(prog, names)
            return hit

    def backward(self, tensors, outputs, upstream, wrt, mode):
        """Gradients w.r.t. `wrt` given the upstream gradients of `outputs` (indices); the VJP
        program reads lengths/offsets too, and checks them on the device as the forward did
        (`mode` 2, the host check, is not repeated: the forward passed it)."""
        kernels = self.vjp(outputs, wrt)
        ups = [u.to(TORCH_DTYPES[self.outputs[i].kfuse_dtype]) for i, u in zip(outputs, upstream)]
        return kernels.run(list(tensors) + ups, 1 if mode else 0)

    def ops(self, fused=()):
        """The custom operator of this variant (registered on first use under torch.compile):
        the plain forward, or with `fused` (float input indices) the loss and its gradients with
        respect to those inputs in one operator whose backward scales them."""
        with self._lock:
            op = self._ops.get(fused)
            if op is None:
                op = _register_fused(self, fused) if fused else _register(self)
                self._ops[fused] = op
            return op
