"""kfuse programs on torch tensors: calls, autograd and torch.compile.

A :class:`Program` wraps the native ``_kfuse.Program`` (declared at the dtypes of its source). A
call picks the *variant* for the float dtypes of the tensors given (the program typed again at
those dtypes, by value), checks the inputs, and runs:

* CPU tensors through the reference interpreter (``run_cpu``), CUDA tensors through ``launch``
  on the current stream, outputs allocated by PyTorch on the inputs' device;
* with autograd when a float input requires grad: a program whose only float output is a scalar
  loss runs as the loss and its gradients in one program (``with_gradients``), and the backward
  scales the saved gradients by the upstream gradient; otherwise the backward runs the derived
  vector-Jacobian product program (``vjp``) of the outputs that received a gradient.
* under ``torch.compile`` the program is a custom operator (``torch.ops.kfuse.*``) with a shape
  function and a registered backward (the fused loss + gradients operator, or the forward and its
  VJP operator), so the graph has no break. Eager calls do not go through the dispatcher.

On CUDA the inputs are read in place (a view that does not start 16-byte aligned is copied), the
outputs are allocated by PyTorch on the inputs' device, and the kernels are queued on
``torch.cuda.current_stream()`` of that device with no host synchronisation; the first call on a
device loads the kernels (compiled once per architecture through the disk cache).
"""

import collections
import ctypes
import hashlib
import itertools
import os
import sys
import threading
import weakref

import torch

from . import _kfuse
from ._errors import DeviceError, InputError

TORCH_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "bool": torch.bool,
}
KFUSE_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}
_KD = KFUSE_DTYPES
FLOAT = ("f32", "f16", "bf16")


class Decl(tuple):
    """A declared tensor: ``name``, ``dtype`` (a torch dtype), ``kfuse_dtype`` (kfuse's name of
    it: ``"f32"``, ``"bf16"``, ...), ``shape`` (symbol names and constants) and, for inputs,
    ``layout`` (``None``, ``("lengths", dim)`` or ``("offsets", dim)``)."""

    __slots__ = ()

    def __new__(cls, name, dtype, shape, layout=None):
        return tuple.__new__(cls, (name, dtype, tuple(shape), layout))

    name = property(lambda self: self[0])
    kfuse_dtype = property(lambda self: self[1])
    dtype = property(lambda self: TORCH_DTYPES[self[1]])
    shape = property(lambda self: self[2])
    layout = property(lambda self: self[3])

    def __repr__(self):
        dims = ", ".join(str(d) for d in self.shape)
        text = f"{self.name}: {self.kfuse_dtype}[{dims}]"
        if self.layout is not None:
            text += f" as {self.layout[0]}({self.layout[1]})"
        return f"Decl({text})"


class Outputs(tuple):
    """A program's outputs in declaration order: a tuple of tensors (``loss, grad = prog(...)``)
    whose items are also found by name (``out.loss`` or ``out["loss"]``); ``keys()``, ``values()``,
    ``items()`` and ``_asdict()`` give the mapping view. Immutable, like any tuple.

    Each program's outputs are a ``collections.namedtuple`` of its output names with these methods
    added (so reading an output by name costs what a namedtuple field costs, and ``torch.compile``
    traces it as a namedtuple); this class is their common base. An output whose name is not a
    valid namedtuple field (a Python keyword, a leading underscore) or is one of these methods'
    names is reached by ``out["name"]``."""

    __slots__ = ()
    _names = ()

    def __getitem__(self, key):
        if key.__class__ is str:
            try:
                key = self._names.index(key)
            except ValueError:
                raise KeyError(f"no output named {key!r} (outputs: {', '.join(self._names)})") from None
        return tuple.__getitem__(self, key)

    def __getattr__(self, name):
        # Only reached for names that are not outputs (outputs are the namedtuple's fields).
        raise AttributeError(f"no output named {name!r} (outputs: {', '.join(self._names)})")

    def _read_only(self, *args, **kwargs):
        raise TypeError("kfuse outputs are read-only")

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _read_only

    def keys(self):
        """The output names, in declaration order."""
        return self._names

    def values(self):
        """The output tensors, in declaration order."""
        return tuple(self)

    def items(self):
        """``(name, tensor)`` pairs, in declaration order."""
        return tuple(zip(self._names, self))

    def _asdict(self):
        """The outputs as a new ``dict`` from name to tensor."""
        return dict(zip(self._names, self))

    def __repr__(self):
        return "Outputs(" + ", ".join(f"{k}={v!r}" for k, v in zip(self._names, self)) + ")"


def _outputs_type(names):
    """The outputs class of a program whose outputs are `names` (see :class:`Outputs`): a
    subclass of :class:`Outputs` and of the namedtuple of those names, in that order, so that
    Outputs' methods come first and ``torch.compile`` sees a namedtuple."""
    names = tuple(names)
    hidden = set(dir(Outputs)) - set(dir(tuple))
    fields = [f"_{i}" if n in hidden else n for i, n in enumerate(names)]
    base = collections.namedtuple("Outputs", fields, rename=True, module=__name__)
    return type("Outputs", (Outputs, base), {"__slots__": (), "_names": names, "__module__": __name__})


# ---------------------------------------------------------------------------------------------
# Host and device runs.


def _host_arg(name, t):
    """``(name, bytes, dtype, shape)`` of a contiguous CPU tensor (one copy, no NumPy)."""
    n = t.numel() * t.element_size()
    data = ctypes.string_at(t.data_ptr(), n) if n else b""
    return (name, data, KFUSE_DTYPES[t.dtype], list(t.shape))


def _from_host(data, dtype, shape):
    dt = TORCH_DTYPES[dtype]
    if not data:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape)


def _run_cpu(native, names, tensors):
    outs = native.run_cpu([_host_arg(n, t) for n, t in zip(names, tensors)])
    return [_from_host(data, dtype, shape) for _, data, dtype, shape in outs]


# torch's current raw stream of a device index, without making a torch.cuda.Stream object.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _raw_stream is None:  # pragma: no cover - older torch

    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


# The current CUDA device; CUDA tensors exist whenever this is called, so PyTorch's lazy
# initialisation check (`torch.cuda.current_device`) is not needed on the call path.
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_empty_like = torch.empty_like


def _on_device(index, launch, *args):
    """Calls `launch(*args)` with device `index` current, as PyTorch's own operators do: the
    kernels load and launch there, and PyTorch's current device is the caller's again after."""
    if index == _current_device():
        return launch(*args)
    with torch.cuda.device(index):
        return launch(*args)


class _Kernels:
    """A native program run on torch tensors given in declaration order (`names`).

    On CUDA, the program bound to each input shape signature (a native ``Binding``: the checked
    shapes, the outputs' shapes) is kept, so that a call on shapes seen before allocates the
    outputs and passes addresses only. Outputs come from PyTorch's allocator on the inputs' device;
    the kernels queue on that device's current stream with no host synchronisation. `mode` is how
    lengths/offsets values are checked (see `_mode`): 1 by the kernels on the device, 2 also on
    the host first (a copy back, which synchronises), 0 not at all."""

    __slots__ = ("native", "names", "layouts", "_bound")

    # Shape signatures kept per program; a program called on ever new shapes starts over.
    MAX_BOUND = 256

    def __init__(self, native, names):
        self.native = native
        self.names = names
        self.layouts = native.layout_inputs
        self._bound = {}

    def run(self, tensors, mode):
        if tensors and tensors[0].is_cuda:
            return self.run_cuda(tensors, mode)
        return _run_cpu(self.native, self.names, tensors)

    def _bind(self, tensors, shapes):
        binding = self.native.bind([(n, _KD[t.dtype], t.shape) for n, t in zip(self.names, tensors)])
        # How each output is allocated: like the input of the same shape and dtype where there is
        # one (`torch.empty_like` parses no shape: the cheapest allocation PyTorch has), else from
        # the first input's device with its shape and dtype.
        specs = []
        for dtype, shape in binding.outputs:
            dt, shape = TORCH_DTYPES[dtype], tuple(shape)
            like = next((i for i, t in enumerate(tensors) if t.dtype is dt and tuple(t.shape) == shape), None)
            specs.append((like, shape, dt))
        hit = (binding, specs)
        if len(self._bound) >= self.MAX_BOUND:
            self._bound.clear()
        self._bound[shapes] = hit
        return hit

    def run_cuda(self, tensors, mode):
        # The hot path of every eager CUDA call: list comprehensions, no helper calls.
        shapes = tuple([t.shape for t in tensors])
        binding, specs = self._bound.get(shapes) or self._bind(tensors, shapes)
        if mode == 2 and self.layouts:
            binding.check_layouts([(self.names[i], _host_arg(self.names[i], tensors[i].cpu())[1]) for i in self.layouts])
        first = tensors[0]
        outs = [
            _empty_like(tensors[like]) if like is not None else first.new_empty(shape, dtype=dt)
            for like, shape, dt in specs
        ]
        addresses = [t.data_ptr() for t in tensors] + [t.data_ptr() for t in outs]
        index = first.get_device()
        try:
            if index == _current_device():
                binding.launch(index, _raw_stream(index), addresses, mode)
            else:
                _on_device(index, binding.launch, index, _raw_stream(index), addresses, mode)
        except InputError:
            if not any(a & 15 for a in addresses):
                raise
            # kfuse's kernels load small trailing axes as vectors: a view that does not start
            # 16-byte aligned is copied (the copies live until the launch is queued).
            copies = [t.clone() if t.data_ptr() & 15 else t for t in tensors]
            addresses = [t.data_ptr() for t in copies] + [t.data_ptr() for t in outs]
            _on_device(index, binding.launch, index, _raw_stream(index), addresses, mode)
        return outs


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
        ups = [u.to(TORCH_DTYPES[self.outputs[i].kfuse_dtype]).contiguous() for i, u in zip(outputs, upstream)]
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
            return single(variant.kernels.run([t.contiguous() for t in tensors], mode), len(outs))

        def fwd_fake(*a):
            return single(_fake_outputs(outs, ins, sources, a[:n_in]), len(outs))

        lib.impl(name, fwd_impl, "CPU")
        lib.impl(name, fwd_impl, "CUDA")
        torch.library.register_fake(f"kfuse::{name}", fwd_fake, lib=lib)

        if wrt:
            vjp_op = getattr(torch.ops.kfuse, f"{name}_vjp")

            def bwd_impl(*a):
                n_up = len(fl_out)
                tensors, ups = [t.contiguous() for t in a[:n_in]], a[n_in : n_in + n_up]
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
            tensors, mode = [t.contiguous() for t in a[:n_in]], (a[n_in] if len(a) > n_in else 1)
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


# ---------------------------------------------------------------------------------------------
# The public class.


class Program:
    """A type-checked kfuse program, callable on torch tensors.

    ``program(name=tensor, ...)`` takes every declared input by keyword and returns the outputs,
    in declaration order, as an :class:`Outputs` mapping (``out["loss"]`` or ``out.loss``).
    Any batch size runs without recompiling. On CUDA, lengths/offsets values are checked by the
    kernels as they read them (``validate=True``, the default; no synchronisation): a bad value
    makes the outputs it reaches NaN (the loss) and is raised as :class:`kfuse.InputError` by the
    next kfuse call on that device or by :func:`kfuse.check_errors`. ``validate="sync"`` checks
    them on the host before launching (a copy back, which waits for the GPU) and raises at once;
    ``validate=False`` checks nothing. The CPU path always checks before running.
    """

    def __init__(self, native):
        self._native = native
        self._base = _Variant(native)
        self._variants = {}
        self._lock = threading.Lock()
        self._out_names = tuple(d.name for d in self._base.outputs)
        self._outputs = _outputs_type(self._out_names)
        self._spec = tuple((d.name, d.kfuse_dtype, d.kfuse_dtype in FLOAT) for d in self._base.inputs)
        with _PROGRAMS_LOCK:
            self._key = next(_KEYS)
            _PROGRAMS[self._key] = self

    @property
    def name(self):
        """Where the program came from (its file, or the name given to :func:`kfuse.compile`)."""
        return self._native.origin

    @property
    def inputs(self):
        """The declared inputs, as :class:`Decl` (name, dtype, shape, layout)."""
        return list(self._base.inputs)

    @property
    def outputs(self):
        """The declared outputs, in order, as :class:`Decl` (name, dtype, shape)."""
        return list(self._base.outputs)

    def cuda_source(self):
        """The generated CUDA of every kernel the program runs as."""
        return self._native.cuda_source()

    def with_input_dtypes(self, **dtypes):
        """The program with inputs declared at other dtypes (``pred="bf16"`` or torch dtypes)."""
        pairs = []
        for n, d in dtypes.items():
            if isinstance(d, torch.dtype):
                if d not in KFUSE_DTYPES:
                    raise InputError(f"input `{n}`: {d} is not a kfuse dtype; kfuse has {', '.join(TORCH_DTYPES)}")
                d = KFUSE_DTYPES[d]
            elif not isinstance(d, str):
                raise TypeError(f"the dtype of `{n}` is a name ('f32', 'bf16', ...) or a torch dtype, not {d!r}")
            pairs.append((n, d))
        return Program(self._native.with_input_dtypes(pairs))

    def vjp(self, *wrt):
        """The derived backward program: inputs are this program's plus ``grad_<output>`` per
        float output, outputs ``grad_<input>`` for each of `wrt`."""
        if not wrt:
            floats = ", ".join(d.name for d in self._base.inputs if d.kfuse_dtype in FLOAT)
            raise TypeError(f"vjp takes the inputs to differentiate with respect to (float inputs: {floats})")
        return Program(self._native.vjp(list(wrt))[0])

    def with_gradients(self, loss, *wrt):
        """This program with ``grad_<input>`` outputs: the gradient of the scalar output `loss`."""
        return Program(self._native.with_gradients(loss, list(wrt))[0])

    def __repr__(self):
        return repr(self._native)

    def _variant(self, dtypes):
        v = self._variants.get(dtypes)
        if v is None:
            with self._lock:
                v = self._variants.get(dtypes)
                if v is None:
                    changes = [
                        (d.name, got)
                        for d, got in zip(self._base.inputs, dtypes)
                        if got != d.kfuse_dtype and d.kfuse_dtype in FLOAT and got in FLOAT
                    ]
                    v = _Variant(self._native.with_input_dtypes(changes)) if changes else self._base
                    self._variants[dtypes] = v
        return v

    def __call__(self, *args, validate=True, **tensors):
        if args:
            raise TypeError(f"{self.name}: inputs are given by keyword ({', '.join(self._base.names)})")
        mode = 1 if validate is True else _mode(validate)
        ordered = []
        dtypes = []
        where = None  # -1 for the CPU, else the CUDA ordinal
        grad = False  # whether any input requires grad
        # The loop is the eager call's host cost: plain tuples, no torch.device objects.
        for name, declared, is_float in self._spec:
            t = tensors.get(name)
            kd = _KD.get(t.dtype) if isinstance(t, torch.Tensor) else None
            if kd != declared and not (is_float and kd in FLOAT):
                self._bad_input(name, t, tensors)
            w = t.get_device()  # the CUDA ordinal, -1 elsewhere
            if w < 0 and not t.is_cpu:
                raise InputError(f"input `{name}` is on {t.device}; kfuse runs on CPU and CUDA tensors")
            if where is None:
                where, first = w, name
            elif w != where:
                raise InputError(
                    f"inputs are on different devices: `{first}` is on {ordered[0].device}, `{name}` on {t.device}"
                )
            if not t.is_contiguous():
                t = t.contiguous()
            grad = grad or t.requires_grad
            ordered.append(t)
            dtypes.append(kd)
        if len(tensors) != len(ordered):
            unknown = [n for n in tensors if n not in self._base.names]
            raise InputError(f"unknown input `{unknown[0]}`; the inputs are: {', '.join(self._base.names)}")
        dtypes = tuple(dtypes)
        if torch.compiler.is_compiling():
            # Traced by Dynamo: the operator is found at trace time (a constant), then called.
            grad = torch.is_grad_enabled()
            requires_grad = tuple(grad and t.requires_grad for t in ordered)
            op = getattr(torch.ops.kfuse, _op_name(self._key, dtypes, requires_grad))
            out = op(*ordered, validate=mode)
            n = len(self._out_names)
            out = (out,) if n == 1 and not isinstance(out, (tuple, list)) else out
            return self._outputs(*out[:n])
        variant = self._variants.get(dtypes) or self._variant(dtypes)
        wrt = ()
        if grad and torch.is_grad_enabled():
            wrt = tuple(i for i in variant.float_inputs if ordered[i].requires_grad)
        if not wrt:
            # The outputs are new tensors that no autograd graph records.
            out = variant.kernels.run(ordered, mode)
        elif variant.scalar_loss:
            out = _Fused.apply(variant.fusion(wrt), mode, *ordered)
        else:
            out = _Derived.apply(variant, mode, wrt, *ordered)
        return self._outputs._make(out)

    def _bad_input(self, name, t, given):
        d = next(d for d in self._base.inputs if d.name == name)
        if name in given and t is None:
            raise InputError(f"input `{name}` is None; give a torch.Tensor ({_decl_str(d)})")
        if t is None:
            unknown = [n for n in given if n not in self._base.names]
            extra = f"; given but not inputs: {', '.join(f'`{n}`' for n in unknown)}" if unknown else ""
            raise InputError(f"missing input `{name}` (declared as {_decl_str(d)}){extra}")
        if not isinstance(t, torch.Tensor):
            raise InputError(f"input `{name}` must be a torch.Tensor, not {type(t).__name__}")
        hint = " (kfuse floats are float32, float16 and bfloat16)" if d.kfuse_dtype in FLOAT else ""
        raise InputError(f"input `{name}` has dtype {t.dtype}, but is declared as {_decl_str(d)}{hint}")


# Live programs by key, for the operator lookup under torch.compile (which sees only constants).
_PROGRAMS = weakref.WeakValueDictionary()
_KEYS = itertools.count()
_PROGRAMS_LOCK = threading.Lock()


def _op_name(key, dtypes, requires_grad):
    """The name of the custom operator of program `key` at input dtypes `dtypes`, registered on
    first use: for a scalar loss whose gradient is wanted (`requires_grad` per input), the fused
    loss + gradients operator. Dynamo runs this at trace time and keeps the result a constant."""
    variant = _PROGRAMS[key]._variant(dtypes)
    fused = ()
    if variant.scalar_loss:
        fused = tuple(i for i in variant.float_inputs if requires_grad[i])
    return variant.ops(fused)._qualified_op_name.split("::", 1)[1]


# What `torch.compiler.assume_constant_result` does (Dynamo runs the function at trace time and
# keeps its result as a constant), without importing torch._dynamo: that import takes seconds, and
# `import kfuse` must not pay it. The decorator itself is used when Dynamo is loaded already; the
# torch.compile tests check the marker still works.
if "torch._dynamo" in sys.modules:
    _op_name = torch.compiler.assume_constant_result(_op_name)
else:
    _op_name._dynamo_marked_constant = True


def _mode(validate):
    """The check mode of a `validate` argument: 1 (True) on the device, 2 ("sync") on the host
    before launching, 0 (False) none."""
    if validate is True:
        return 1
    if validate is False:
        return 0
    if isinstance(validate, str):
        if validate == "sync":
            return 2
        raise ValueError(f"validate={validate!r}: the choices are True (check on the device, the default), \"sync\" (check on the host before launching) and False (no check)")
    raise TypeError(f"validate must be True, False or \"sync\", not {type(validate).__name__} {validate!r}")


def check_errors():
    """Waits for every CUDA device kfuse launched on and raises the violation of a
    lengths/offsets layout that its kernels found since the last one was raised
    (:class:`kfuse.InputError`, naming the program, input, position and value); returns None when
    there is none (and always without a GPU)."""
    _kfuse.check_errors()


def _decl_str(d):
    s = f"{d.kfuse_dtype}[{', '.join(str(x) for x in d.shape)}]"
    if d.layout is not None:
        s += f" as {d.layout[0]}({d.layout[1]})"
    return s


def load(path):
    """Reads a ``.kf`` file into a :class:`Program` (raises :class:`kfuse.ParseError`)."""
    return Program(_kfuse.Program.load(os.fspath(path)))


def compile(source, name="<source>"):  # noqa: A001 - mirrors the language's own word
    """Parses ``.kf`` source into a :class:`Program`; `name` appears in error messages."""
    return Program(_kfuse.Program.compile(source, name))


__all__ = ["Program", "Outputs", "Decl", "load", "compile", "check_errors", "DeviceError"]
