"""torch.nn modules backed by kfuse."""

import os
import tempfile

import torch

from . import _kfuse
from ._errors import DeviceError, InputError
from ._export import export_mlp
from ._program import _from_host, _host_arg

__all__ = ["FusedMLP"]


class FusedMLP(torch.nn.Module):
    """An MLP (Linear layers and elementwise activations) run as one fused kernel on CUDA inputs
    and through kfuse's CPU path on CPU inputs. Inference only: an input that requires grad is an
    error. Weights are read once, at construction (:meth:`from_torch`, :meth:`load`).
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
        (float16 or bfloat16)."""
        name = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(dtype)
        if name is None:
            raise InputError(f"FusedMLP weights are float16 or bfloat16, not {dtype}")
        with tempfile.TemporaryDirectory(prefix="kfuse-mlp-") as folder:
            path = os.path.join(folder, "model.json")
            export_mlp(module, path, name)
            native = _kfuse.Mlp.load(path)
        return cls(native)

    @classmethod
    def load(cls, json_path):
        """Loads a model exported by :func:`kfuse.export_mlp` (or ``tools/export_mlp.py``)."""
        return cls(_kfuse.Mlp.load(str(json_path)), str(json_path))

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
        if x.device.type == "cuda":
            raise DeviceError(
                "FusedMLP on CUDA tensors is not available in this build of kfuse; move the input to the CPU"
            )
        lead = x.shape[:-1]
        rows = x.detach().reshape(-1, self.in_features).contiguous()
        if rows.shape[0] == 0:
            return x.new_empty((*lead, self.out_features))
        _, data, dtype, shape = _host_arg("x", rows)
        out, odt, oshape = self._native.run_cpu(data, dtype, shape)
        return _from_host(out, odt, oshape).reshape(*lead, self.out_features)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"
