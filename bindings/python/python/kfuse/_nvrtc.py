"""Finds libnvrtc in the ``nvidia-cuda-nvrtc`` wheel and loads it, so that kfuse's runtime (which
opens ``libnvrtc.so.13`` by name) finds it without ``LD_LIBRARY_PATH``."""

import ctypes
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


def load():
    """Loads the wheel's libnvrtc once (process-wide); returns its path or ``None``.

    A library already on the system search path works as well; ``None`` only means that the
    wheel's copy was not found.
    """
    global _loaded
    if _loaded is None:
        path = library_path()
        if path is None:
            _loaded = ""
        else:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                _loaded = path
            except OSError:
                _loaded = ""
    return _loaded or None


MISSING = (
    "NVRTC is not available: install the CUDA 13.0 NVRTC wheel "
    "(pip install nvidia-cuda-nvrtc==13.0.88, a dependency of kfuse) or add the folder of "
    "libnvrtc.so.13 to LD_LIBRARY_PATH"
)
