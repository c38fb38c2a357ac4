"""Export a PyTorch MLP to kfuse's model format: model.json + model.safetensors.

Accepted modules: an nn.Sequential of nn.Linear and activation modules, or any module whose
children (or one nn.ModuleList / list attribute) are such a sequence. Activations:
ReLU, LeakyReLU(slope), SiLU, GELU(approximate='none'|'tanh'), Sigmoid, Tanh,
Softplus(beta=1, threshold=20), Identity; nn.Dropout is skipped (inference).
Anything else is an error naming the module. Weights are saved as the state_dict tensors
(PyTorch's [out, in] layout) in the dtype asked for (f16 or bf16).

It needs torch and nothing else (no safetensors or NumPy: the file is written here). This file
imports nothing of kfuse's native module, so ``tools/export_mlp.py`` can load it from a
checkout where the package is not installed.
"""
import ctypes
import json
import os
import struct

try:
    from ._errors import Error

    _BASES = (Error, ValueError)
except ImportError:  # loaded as a file by tools/export_mlp.py
    _BASES = (ValueError,)


class ExportError(*_BASES):
    """A module that kfuse's MLP format cannot describe; the message names the module."""


def fail(msg):
    raise ExportError(msg)


def activation_of(mod, nn, where):
    """The kfuse activation (a name or a .kf expression in x) for an activation module."""
    if isinstance(mod, nn.ReLU):
        return "relu"
    if isinstance(mod, nn.LeakyReLU):
        slope = float(mod.negative_slope)
        return "leaky_relu" if slope == 0.01 else f"where(x > 0, x, {slope!r} * x)"
    if isinstance(mod, nn.SiLU):
        return "silu"
    if isinstance(mod, nn.GELU):
        approx = getattr(mod, "approximate", "none")
        if approx == "none":
            return "gelu"
        if approx == "tanh":
            return "gelu_tanh"
        fail(f"{where}: GELU(approximate={approx!r}) is not supported; use 'none' or 'tanh'")
    if isinstance(mod, nn.Sigmoid):
        return "sigmoid"
    if isinstance(mod, nn.Tanh):
        return "tanh"
    if isinstance(mod, nn.Softplus):
        beta, threshold = float(mod.beta), float(mod.threshold)
        if beta == 1.0 and threshold == 20.0:
            return "softplus"
        # torch: x if beta*x > threshold else log(1 + exp(beta*x)) / beta
        return f"where({beta!r} * x > {threshold!r}, x, log(1 + exp({beta!r} * x)) / {beta!r})"
    if isinstance(mod, nn.Identity):
        return "none"
    return None


def flatten(module, nn):
    """The module's layers as a flat list of (path, module)."""
    if isinstance(module, (nn.Sequential, nn.ModuleList)):
        out = []
        for name, child in module.named_children():
            if isinstance(child, (nn.Sequential, nn.ModuleList)):
                out += [(f"{name}.{p}", m) for p, m in flatten(child, nn)]
            else:
                out.append((name, child))
        return out
    children = list(module.named_children())
    if len(children) == 1 and isinstance(children[0][1], (nn.Sequential, nn.ModuleList)):
        name, child = children[0]
        return [(f"{name}.{p}", m) for p, m in flatten(child, nn)]
    if not children:
        fail(f"{type(module).__name__} has no child modules; expected nn.Sequential of Linear and activations")
    return [(name, child) for name, child in children]


def describe(module, dtype="f16"):
    """The model description of `module` (model.json's content without the name of its weights
    file) and the tensors it names, ``{name: contiguous CPU tensor in dtype}``."""
    import torch
    from torch import nn

    if not isinstance(module, nn.Module):
        fail(f"expected a torch.nn.Module (an nn.Sequential of Linear and activations), not {type(module).__name__}")
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        fail(f"dtype must be f16 or bf16, not {dtype!r}")
    layers, tensors = [], {}
    for path, mod in flatten(module, nn):
        if isinstance(mod, nn.Linear):
            layer = {"weight": f"{path}.weight"}
            tensors[f"{path}.weight"] = mod.weight.detach().to("cpu", torch_dtype).contiguous()
            if mod.bias is not None:
                layer["bias"] = f"{path}.bias"
                tensors[f"{path}.bias"] = mod.bias.detach().to("cpu", torch_dtype).contiguous()
            layer["activation"] = "none"
            layers.append(layer)
        elif isinstance(mod, nn.Dropout):
            continue
        else:
            act = activation_of(mod, nn, f"module `{path}`")
            if act is None:
                fail(f"module `{path}` ({type(mod).__name__}) is not supported; kfuse MLPs are Linear layers "
                     "and elementwise activations (ReLU, LeakyReLU, SiLU, GELU, Sigmoid, Tanh, Softplus)")
            if not layers:
                fail(f"module `{path}` ({type(mod).__name__}) comes before any Linear layer")
            if layers[-1]["activation"] != "none":
                fail(f"module `{path}`: two activations in a row after `{layers[-1]['weight']}`")
            layers[-1]["activation"] = act
    if not layers:
        fail("the module holds no nn.Linear layers")
    return {"format": "kfuse-mlp/1", "dtype": dtype, "layers": layers}, tensors


def tensor_bytes(t):
    """The bytes of a contiguous CPU tensor (one copy, no NumPy)."""
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def write_safetensors(path, tensors, dtype):
    """Writes ``{name: tensor}`` (all of `dtype`, ``"f16"`` or ``"bf16"``) as a safetensors file:
    an 8-byte little-endian header length, the JSON header (padded to 8 bytes), then the data in
    header order. Written here so that exporting needs no package beyond torch."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = tensor_bytes(t)
        header[name] = {"dtype": dtype.upper(), "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def export_mlp(module, json_path, dtype="f16"):
    """Writes `module` as ``json_path`` (the description) and the weights beside it
    (``<stem>.safetensors``) in `dtype` (``"f16"`` or ``"bf16"``); returns the description."""
    if os.path.isdir(json_path):
        fail(f"`{json_path}` is a folder; give the path of the model.json to write (weights go beside it)")
    desc, tensors = describe(module, dtype)
    folder = os.path.dirname(os.path.abspath(json_path))
    os.makedirs(folder, exist_ok=True)
    stem = os.path.splitext(os.path.basename(json_path))[0]
    weights = f"{stem}.safetensors"
    write_safetensors(os.path.join(folder, weights), tensors, dtype)
    desc = {"format": desc["format"], "weights": weights, "dtype": dtype, "layers": desc["layers"]}
    with open(json_path, "w") as f:
        json.dump(desc, f, indent=2)
    return desc
