"""torch.nn modules backed by kfuse."""

import json
import os

import torch

from . import _kfuse
from ._errors import InputError
from ._export import describe
from ._run import _from_host, _host_arg, _on_device, _raw_stream
from ._types import _KD

__all__ = ["FusedMLP"]


class FusedMLP(torch.nn.Module):
    """An MLP (Linear layers and elementwise activations) run as one fused kernel on CUDA inputs
    and through kfuse's CPU path on CPU inputs. Inference only: an input that requires grad is an
    error. Weights are read once, at construction (:meth:`from_torch`, :meth:`load`).

    On CUDA, inputs ``[..., in_features]`` in float32, float16 or bfloat16 give outputs of the
    same dtype, allocated by PyTorch on the input's device and computed on its current stream
    with no host synchronisation. The model is compiled once per device and dtype, on the first
    call, tiered: that call does not wait for the optimised kernel, which compiles in the
    background (:meth:`wait_optimized` waits for it, for benchmarks).
    """

    def __init__(self, native, path=None):
        super().__init__()
        self._native = native
        self.path = path
        self.in_features = native.in_features
        self.out_features = native.out_features

    @classmethod
    def from_torch(cls, module, dtype=torch.float16):
        """Reads the weights of `module` (what :func:`kfuse.export_mlp` accepts) in `dtype`
        (float16 or bfloat16), in memory: no file is written."""
        name = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(dtype)
        if name is None:
            raise InputError(f"FusedMLP weights are float16 or bfloat16, not {dtype}")
        desc, tensors = describe(module, name)
        # The description names no weights file: its tensors are passed along.
        text = json.dumps({**desc, "weights": ""})
        args = [_host_arg(n, t) for n, t in tensors.items()]
        return cls(_kfuse.Mlp.from_tensors(text, args, f"module {type(module).__name__}"))

    @classmethod
    def load(cls, json_path):
        """Loads a model exported by :func:`kfuse.export_mlp` (or ``tools/export_mlp.py``)."""
        path = os.fspath(json_path)
        return cls(_kfuse.Mlp.load(path), path)

    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise InputError(f"FusedMLP takes a torch.Tensor, not {type(x).__name__}")
        if x.requires_grad and torch.is_grad_enabled():
            raise InputError(
                "the input requires grad, but FusedMLP is for inference (it has no backward pass yet); "
                "call it under torch.no_grad() or pass x.detach()"
            )
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InputError(f"FusedMLP input has dtype {x.dtype}; it takes float32, float16 or bfloat16")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise InputError(
                f"FusedMLP input has shape {tuple(x.shape)}, but the model takes [..., {self.in_features}]"
            )
        lead = x.shape[:-1]
        if not (x.is_cuda or x.is_cpu):
            raise InputError(f"FusedMLP input is on {x.device}; it runs on CPU and CUDA tensors")
        if x.is_cuda:
            return self._forward_cuda(x, lead)
        rows = x.detach().reshape(-1, self.in_features).contiguous()
        if rows.shape[0] == 0:
            return x.new_empty((*lead, self.out_features))
        _, data, dtype, shape = _host_arg("x", rows)
        out, odt, oshape = self._native.run_cpu(data, dtype, shape)
        return _from_host(out, odt, oshape).reshape(*lead, self.out_features)

    def _forward_cuda(self, x, lead):
        rows = x.detach().reshape(-1, self.in_features)
        # Contiguous and 16-byte aligned (the kernel loads rows as vectors).
        if not rows.is_contiguous() or rows.data_ptr() & 15:
            rows = rows.clone(memory_format=torch.contiguous_format)
        n = rows.shape[0]
        out = torch.empty((n, self.out_features), dtype=x.dtype, device=x.device)
        if n:
            index = x.get_device()
            size = rows.element_size()
            _on_device(
                index,
                self._native.launch,
                index,
                _raw_stream(index),
                rows.data_ptr(),
                rows.numel() * size,
                out.data_ptr(),
                out.numel() * size,
                n,
                _KD[x.dtype],
            )
        return out.reshape(*lead, self.out_features)

    def wait_optimized(self):
        """Blocks until every device and dtype this module has run on uses the optimised kernel
        (the first call may run a quickly compiled form while it compiles); for benchmarks."""
        self._native.wait_optimized()
        return self

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"
