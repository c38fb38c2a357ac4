#!/usr/bin/env python3
"""Export a PyTorch MLP to kfuse's model format: model.json + model.safetensors.
A command-line wrapper of kfuse.export_mlp (the Python package in bindings/python).

    python tools/export_mlp.py my_model.pt out/model.json            # a pickled nn.Module
    python tools/export_mlp.py my_pkg.models:build out/model.json    # a function returning one
    python tools/export_mlp.py --example out/model.json              # a small demo model

Accepted modules: an nn.Sequential of nn.Linear and activation modules, or any module whose
children (or one nn.ModuleList / list attribute) are such a sequence. Activations:
ReLU, LeakyReLU(slope), SiLU, GELU(approximate='none'|'tanh'), Sigmoid, Tanh,
Softplus(beta=1, threshold=20), Identity; nn.Dropout is skipped (inference).
Anything else is an error naming the module. Weights are saved as the state_dict tensors
(PyTorch's [out, in] layout) in the dtype asked for (--dtype f16|bf16, default f16).
"""
import argparse
import importlib
import importlib.util
import os
import sys


def fail(msg):
    print(f"export_mlp: error: {msg}", file=sys.stderr)
    sys.exit(2)


def exporter():
    """kfuse.export_mlp from the installed package, else from this checkout's package source."""
    try:
        from kfuse._export import ExportError, export_mlp
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, "..", "bindings", "python", "python", "kfuse", "_export.py")
        spec = importlib.util.spec_from_file_location("kfuse_export", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ExportError, export_mlp = mod.ExportError, mod.export_mlp
    return ExportError, export_mlp


def load_module(spec):
    import torch

    if os.path.exists(spec):
        obj = torch.load(spec, map_location="cpu", weights_only=False)
    elif ":" in spec:
        mod_name, fn = spec.split(":", 1)
        obj = getattr(importlib.import_module(mod_name), fn)()
    else:
        fail(f"{spec!r} is neither a file nor module:function")
    if isinstance(obj, dict):
        fail(f"{spec!r} holds a state_dict, not a module; pass a module (or module:function that builds it)")
    return obj


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="pickled nn.Module file, or module:function returning one")
    ap.add_argument("output", help="path of the model.json to write (weights go next to it)")
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--example", action="store_true", help="export a small random demo MLP")
    args = ap.parse_args()
    if args.example:
        import torch
        from torch import nn

        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    elif args.model is None:
        fail("give a model (or --example)")
    else:
        module = load_module(args.model)
    export_error, export = exporter()
    try:
        desc = export(module, args.output, args.dtype)
    except export_error as e:
        fail(str(e))
    print(f"wrote {args.output}: {len(desc['layers'])} layers, activations "
          f"{[l['activation'] for l in desc['layers']]}")


if __name__ == "__main__":
    main()
