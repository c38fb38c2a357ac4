"""kfuse from PyTorch: ``.kf`` programs and fused MLPs on torch tensors.

    import torch, kfuse

    giou = kfuse.load("examples/giou_lengths.kf")     # or kfuse.compile(source_text, name="giou")
    out = giou(pred=pred, target=target, lengths=lengths)
    out.loss.backward()                                # out["loss"] works too; pred.grad is filled

CPU tensors run through kfuse's reference interpreter, CUDA tensors through the fused kernels.
Gradients come from kfuse's own autodiff, and programs are custom operators under torch.compile.
"""

from . import _nvrtc
from ._errors import ConfigError, DeviceError, Error, InputError, ParseError

_nvrtc.locate()

from . import _kfuse  # noqa: E402  (after the runtime is told where libnvrtc is)

import atexit  # noqa: E402

# Kernels that first calls left compiling in the background finish (and reach the disk cache)
# before the interpreter exits, rather than being cut off.
atexit.register(_kfuse.wait_for_compiles)
from ._export import export_mlp  # noqa: E402
from ._program import Decl, Outputs, Program, check_errors, compile, load  # noqa: E402

__version__ = _kfuse.__version__


def cache_info():
    """Runtime figures of this process: ``compiles``, ``disk_hits`` and ``memory_hits`` of the
    kernel cache, ``cache_dir`` (``None`` without a disk folder), ``background_compiles`` (the
    optimised kernels still compiling behind first calls), and ``loaded_functions``: for each
    CUDA device ordinal opened so far, how many kernel functions are loaded on it (each kernel
    is loaded once per device)."""
    return _kfuse.cache_info()


def wait_for_compiles():
    """Blocks until the optimised kernels that first calls left compiling in the background are
    compiled (at once when none is). A first call that must compile launches quickly compiled
    kernels, which give the same results, and switches to the optimised ones when they are
    ready; a benchmark calls this before it times anything."""
    _kfuse.wait_for_compiles()

def explain(fn, *example_inputs, arch=None):
    """Compiles `fn` with ``torch.compile(fn, backend="kfuse")``, runs it on `example_inputs`
    (and its backward when the outputs require grad, leaving every ``.grad`` as it was) and
    returns what the backend did: ``report.kernels`` (per fused region: its aten ``ops``, its
    ``.kf`` ``source``, its CUDA ``kernels`` count, and ``builds``: how kfuse's kernel cache made
    each kernel ready and in how long), ``report.fallbacks`` (each op left to PyTorch with its
    ``reason``); ``print(report)`` shows both per graph. The kernels are built for the GPU of CUDA
    inputs, or for `arch` (such as ``"sm_90"``; NVRTC, no GPU) with CPU inputs."""
    from ._backend import explain as _explain  # imports torch._dynamo: only when asked

    return _explain(fn, *example_inputs, arch=arch)


__all__ = [
    "ConfigError",
    "Decl",
    "DeviceError",
    "Error",
    "InputError",
    "Outputs",
    "ParseError",
    "Program",
    "cache_info",
    "check_errors",
    "compile",
    "explain",
    "export_mlp",
    "load",
    "nn",
    "wait_for_compiles",
]


def __getattr__(name):
    # kfuse.nn imports torch.nn; load it on first use.
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'kfuse' has no attribute {name!r}")
