"""Finds libnvrtc in the ``nvidia-cuda-nvrtc`` wheel and tells kfuse's runtime where it is, so
that the runtime finds it without ``LD_LIBRARY_PATH``, loading it only when a kernel must compile."""

import glob
import os
import site
import sys
import sysconfig

_loaded = None


def _candidates():
    roots = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(path)
    try:
        roots += site.getsitepackages()
    except AttributeError:  # some virtual environments
        pass
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        roots.append(user)
    roots += [p for p in sys.path if p.endswith("site-packages")]
    seen = set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        # cu13 wheels put it under nvidia/cu13/lib, older ones under nvidia/cuda_nvrtc/lib.
        yield from sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so.1[3-9]")))
        yield from sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", "nvrtc64_1[3-9]*.dll")))


def library_path():
    """The path of the wheel's libnvrtc, or ``None`` when the wheel is not installed."""
    return next(iter(_candidates()), None)


def locate():
    """Tells kfuse's runtime where the wheel's libnvrtc is, without loading it: sets
    ``KFUSE_NVRTC_LIBRARY`` (unless already set), which the runtime reads when it first needs
    NVRTC, that is, when a kernel must compile; a warm kernel cache never loads it. Returns the
    path, or ``None`` when the wheel is not installed (a library on the system search path works
    as well)."""
    global _loaded
    if _loaded is None:
        _loaded = os.environ.get(ENV) or library_path() or ""
        if _loaded:
            os.environ.setdefault(ENV, _loaded)
    return _loaded or None


ENV = "KFUSE_NVRTC_LIBRARY"

MISSING = (
    "NVRTC is not available: install the CUDA 13.0 NVRTC wheel "
    "(pip install nvidia-cuda-nvrtc==13.0.88, a dependency of kfuse) or add the folder of "
    "libnvrtc.so.13 to LD_LIBRARY_PATH"
)
