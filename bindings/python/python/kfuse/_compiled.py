"""The fused graphs the ``torch.compile`` backend hands AOTAutograd, kept in PyTorch's
AOTAutograd cache: a new process with a warm cache skips AOTAutograd's tracing of the joint graph,
its partition and kfuse's fusion (about two thirds of a warm first call), as Inductor's do.

A fused graph (:class:`FusedGraph`) is an fx ``GraphModule`` whose fused regions are kfuse
programs and whose other nodes are aten ops. The cache stores it "bundled" (the entry holds the
graphs themselves): the module pickled by ``torch.fx._graph_pickler.GraphPickler`` without node
metadata (nothing at run time reads it), each region as its ``.kf`` text and call details, which
are compiled again when the entry is loaded (parsing and planning: milliseconds; the kernels come
from kfuse's kernel cache). The entries live beside Inductor's, under
``$TORCHINDUCTOR_CACHE_DIR/aotautograd``, and PyTorch's switches turn them off
(``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``).

An entry's key (:func:`_key`) is PyTorch's own for AOTAutograd (the Dynamo graph and its
constants, the example inputs' metadata, the grad, autocast and determinism modes, AOTAutograd's
configuration, hashed by PyTorch's pickler for that key) with torch's version and kfuse's
(:func:`kfuse_key`) in place of what PyTorch hashes for Inductor (its configuration, the sources
of torch and Triton, the machine: half a second of each first call, for a compiler kfuse does not
run). So an entry that Inductor wrote, or another kfuse, is never read.
"""

import contextlib
import glob
import hashlib
import os
import unittest.mock

import torch
from torch._inductor.output_code import OutputCode

from . import _kfuse

_KFUSE_KEY = None


def kfuse_key():
    """kfuse's part of the cache key: its version, the native module's size and modification
    time, and a hash of the package's Python sources (the decompositions, the lowering, the
    partition and the calls)."""
    global _KFUSE_KEY
    if _KFUSE_KEY is None:
        h = hashlib.sha256(_kfuse.__version__.encode())
        native = getattr(_kfuse, "__file__", None)
        if native:
            st = os.stat(native)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        for path in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))):
            with open(path, "rb") as f:
                h.update(os.path.basename(path).encode() + b"\0" + f.read())
        _KFUSE_KEY = "kfuse-" + h.hexdigest()
    return _KFUSE_KEY


class FusedGraph(OutputCode):
    """A fused forward, backward or inference graph, called as AOTAutograd calls a compiled
    graph (with the list of its inputs), and stored in PyTorch's AOTAutograd cache."""

    def __init__(self, gm):
        super().__init__()
        self._gm = gm
        self._pickled = None
        # An attribute of the instance: the wrapper that keeps Dynamo out of a backward copies it.
        self._boxed_call = True

    def __call__(self, inputs):
        return self._gm(*inputs)

    def prepare_for_serialization(self):
        from torch.fx._graph_pickler import GraphPickler, Options

        if self._gm is not None:
            options = Options(ops_filter=_ops_filter, node_metadata_key_filter=_no_metadata)
            self._pickled = GraphPickler.dumps(self._gm, options)
            self._gm = None

    def post_compile(self, example_inputs, constants, graph_kwargs):
        if self._gm is not None:
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler

        # No fake tensor was pickled (no metadata): any fake mode reads the entry.
        gm = GraphPickler.loads(self._pickled, detect_fake_mode(example_inputs) or FakeTensorMode())
        gm.recompile()
        self._gm = gm

    def set_triton_bundle(self, triton_bundle):
        pass


def _no_metadata(key):
    return False


def _ops_filter(name):
    """The ops a stored graph may call: PyTorch's own, and kfuse's (`kfuse::scale_loss_grad`, which
    `import kfuse._backend` defines before an entry is loaded)."""
    return name.startswith(("torch.ops.aten.", "torch.ops.prims.", "torch.ops.kfuse.scale_loss_grad"))


class _KeyDetails:
    """What a fused graph depends on, as the fields PyTorch's pickler hashes into the key."""

    def __init__(self, gm, example_inputs, aot_config):
        from torch._functorch._aot_autograd import autograd_cache

        self.gm = gm
        self.example_inputs = example_inputs
        self.aot_config = aot_config
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = torch._C._is_any_autocast_enabled()
        self.deterministic_algorithms = torch.are_deterministic_algorithms_enabled()
        self.autograd_config = torch._functorch.config.save_config()
        # Selective activation checkpointing's policies, as PyTorch's key has them.
        self.sac_context_fn_hashes = autograd_cache._collect_context_fn_hashes(gm)
        self.torch = torch.__version__
        self.kfuse = kfuse_key()


def _key(gm, example_inputs, aot_config, fx_config):
    """The AOTAutograd cache key of a Dynamo graph that kfuse compiles (see the module's text);
    the signature of PyTorch's ``autograd_cache_key``, which it stands in for while kfuse
    compiles."""
    from torch._functorch._aot_autograd import autograd_cache

    autograd_cache.check_cacheable(gm)
    if hasattr(gm, "saved_tensors_hooks_pack_0"):
        raise autograd_cache.BypassAOTAutogradCache("kfuse does not cache graphs with saved-tensor hooks")
    details = _KeyDetails(gm, example_inputs, aot_config)
    return "a" + autograd_cache.AOTAutogradCachePickler(gm).get_hash(details), []


@contextlib.contextmanager
def caching():
    """Compiling under this stores the fused graphs in PyTorch's AOTAutograd cache and looks them
    up there, when PyTorch's settings leave the cache on: entries bundled (holding the graphs),
    the backward fused with the forward (so that one entry holds both), and kfuse's key."""
    from torch._functorch._aot_autograd import autograd_cache

    if not autograd_cache.should_use_local_autograd_cache():
        yield
        return
    config = torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True)
    with config, unittest.mock.patch.object(autograd_cache, "autograd_cache_key", _key):
        yield
