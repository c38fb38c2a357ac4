"""The call path: a native program run on torch tensors, on the CPU through the reference
interpreter or on CUDA in place on PyTorch's current stream, and the value checks' modes."""

import ctypes

import torch

from . import _kfuse
from ._errors import InputError
from ._types import _KD, KFUSE_DTYPES, TORCH_DTYPES

# ---------------------------------------------------------------------------------------------
# Host and device runs.


def _host_arg(name, t):
    """``(name, bytes, dtype, shape)`` of a CPU tensor, its elements in row-major order (one
    copy, no NumPy; a view that is not contiguous is made so first)."""
    t = t.contiguous()
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
    outputs and passes addresses only. An input that is a view which is not contiguous (sliced,
    expanded) is read in place: its strides join the signature, and the kernels that read it
    through strides compile once, for any strides. A view whose last axis is not dense (a
    transpose, a step along it) and lengths and offsets inputs are made contiguous. Outputs come from PyTorch's allocator on the inputs' device;
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
        # Views are read in place through their strides, except those whose last axis is not dense
        # (a transpose, a step): a warp would read its row one sector per element. Those are copied
        # each call (on an H200 a layer norm of a transposed x read in place took 3.8x the time of
        # the copy and the contiguous kernels; bench/RESULTS.md).
        copies = tuple(i for i, t in enumerate(tensors) if _copied(t))
        views = [
            (n, list(t.stride()))
            for i, (n, t) in enumerate(zip(self.names, tensors))
            if not t.is_contiguous() and i not in copies
        ]
        binding = self.native.bind([(n, _KD[t.dtype], t.shape) for n, t in zip(self.names, tensors)], views)
        # How each output is allocated: like the contiguous input of the same shape and dtype
        # where there is one (`torch.empty_like` parses no shape: the cheapest allocation PyTorch
        # has), else from the first input's device with its shape and dtype.
        specs = []
        for dtype, shape in binding.outputs:
            dt, shape = TORCH_DTYPES[dtype], tuple(shape)
            like = next(
                (i for i, t in enumerate(tensors) if t.dtype is dt and tuple(t.shape) == shape and t.is_contiguous()),
                None,
            )
            specs.append((like, shape, dt))
        hit = (binding, specs, copies)
        if len(self._bound) >= self.MAX_BOUND:
            self._bound.clear()
        self._bound[shapes] = hit
        return hit

    def run_cuda(self, tensors, mode):
        # The hot path of every eager CUDA call: list comprehensions, no helper calls.
        if self.layouts:
            tensors = self._contiguous_layouts(tensors)
        shapes = tuple([t.shape if t.is_contiguous() else (t.shape, t.stride()) for t in tensors])
        binding, specs, copies = self._bound.get(shapes) or self._bind(tensors, shapes)
        if copies:
            tensors = [t.contiguous() if i in copies else t for i, t in enumerate(tensors)]
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
            # kfuse's kernels load small trailing axes of contiguous inputs as vectors: one that
            # does not start 16-byte aligned is copied (the copies live until the launch is
            # queued). Views read through their strides need only element alignment.
            copies = [t.clone() if t.data_ptr() & 15 and t.is_contiguous() else t for t in tensors]
            addresses = [t.data_ptr() for t in copies] + [t.data_ptr() for t in outs]
            _on_device(index, binding.launch, index, _raw_stream(index), addresses, mode)
        return outs


    def _contiguous_layouts(self, tensors):
        """`tensors` with each lengths/offsets input contiguous (the kernels read their values as
        one array)."""
        if all(tensors[i].is_contiguous() for i in self.layouts):
            return tensors
        return [t.contiguous() if i in self.layouts else t for i, t in enumerate(tensors)]


def _dense_views(tensors):
    """`tensors` with each view whose last axis is not dense made contiguous: the copies a call
    makes (see `_Kernels._bind`), made once by an autograd forward so that its backward reads the
    copies it saved instead of copying again."""
    if any(_copied(t) for t in tensors):
        return [t.contiguous() if _copied(t) else t for t in tensors]
    return tensors


def _copied(t):
    """Whether a call copies `t`: a view that is not contiguous and whose last axis is not dense."""
    return not t.is_contiguous() and not _last_axis_dense(t)


def _last_axis_dense(t):
    """Whether `t`'s last axis is read in order: of stride 1 or 0 (broadcast), or of size 1."""
    return t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) in (0, 1)


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
