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

import itertools
import os
import sys
import threading
import weakref

import torch

from . import _kfuse
from ._autograd import _Derived, _Fused
from ._errors import DeviceError, InputError
from ._run import _mode, check_errors
from ._types import _KD, FLOAT, KFUSE_DTYPES, TORCH_DTYPES, Decl, Outputs, _decl_str, _outputs_type
from ._variant import _Variant

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

    def build_kernels(self, ordinal=None, arch=None):
        """Makes the kernels ready in kfuse's kernel cache for GPU `ordinal`, or for `arch` (such
        as ``"sm_90"``: NVRTC only, no GPU), one after the other: ``(kernel name, how, seconds)``
        each, `how` being ``"compiled"`` (by NVRTC just now), ``"disk"``, ``"memory"`` or
        ``"repaired"`` (a bad disk entry compiled again)."""
        return self._native.build_kernels(ordinal=ordinal, arch=arch)

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


def load(path):
    """Reads a ``.kf`` file into a :class:`Program` (raises :class:`kfuse.ParseError`)."""
    return Program(_kfuse.Program.load(os.fspath(path)))


def compile(source, name="<source>"):  # noqa: A001 - mirrors the language's own word
    """Parses ``.kf`` source into a :class:`Program`; `name` appears in error messages."""
    return Program(_kfuse.Program.compile(source, name))


__all__ = ["Program", "Outputs", "Decl", "load", "compile", "check_errors", "DeviceError"]
