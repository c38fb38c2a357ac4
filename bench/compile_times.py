#!/usr/bin/env python3
"""Cold NVRTC compile time of each kernel of kfuse programs, with no GPU: `kfuse compile FILE --arch
ARCH` into a fresh kernel cache, `--runs` times per program; each kernel's (translation unit's)
time is the best of the runs. kfuse compiles a program's kernels in parallel, one per core, so the
slowest kernel bounds a cold first call on a machine with as many cores as kernels.

    python3 bench/compile_times.py [--kfuse BIN] [--arch sm_90] [--runs 3] [--out FILE.json] [FILE.kf ...]

With no files, every program in examples/. NVRTC must be found as kfuse finds it (a CUDA toolkit,
or the nvidia-cuda-nvrtc wheel on LD_LIBRARY_PATH).
"""
import argparse
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^(\S+) (sm_\d+\w*) key \S+ (?:miss|hit).*?\(([0-9.]+) ms")


def compile_once(kfuse, path, arch):
    """{kernel: ms} of one cold `kfuse compile`."""
    cache = tempfile.mkdtemp(prefix="kfuse-compile-times-")
    try:
        env = dict(os.environ, KFUSE_CACHE_DIR=cache)
        proc = subprocess.run([kfuse, "compile", path, "--arch", arch], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"compile_times: `kfuse compile {path}` failed:\n{proc.stderr.strip()}")
        times = {}
        for line in proc.stdout.splitlines() + proc.stderr.splitlines():
            m = LINE.match(line.strip())
            if m:
                times[m.group(1)] = float(m.group(3))
        if not times:
            raise SystemExit(f"compile_times: no kernel times in the output of `kfuse compile {path}`")
        return times
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help=".kf programs (default: examples/*.kf)")
    ap.add_argument("--kfuse", default=shutil.which("kfuse") or os.path.join(REPO, "target", "release", "kfuse"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    files = args.files or sorted(glob.glob(os.path.join(REPO, "examples", "*.kf")))
    rows = []
    for path in files:
        best = {}
        for _ in range(args.runs):
            for kernel, ms in compile_once(args.kfuse, path, args.arch).items():
                best[kernel] = min(ms, best.get(kernel, ms))
        slowest = max(best, key=best.get)
        rows.append({"program": os.path.relpath(path, REPO), "kernels": best, "slowest_kernel": slowest,
                     "slowest_ms": best[slowest], "sum_ms": sum(best.values())})
        print(f"{rows[-1]['program']:45s} {len(best)} kernels  slowest {best[slowest]:7.1f} ms  sum {rows[-1]['sum_ms']:7.1f} ms",
              flush=True)
    meta = {"arch": args.arch, "runs": args.runs, "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "kfuse": os.path.relpath(args.kfuse, REPO) if args.kfuse.startswith(REPO) else os.path.basename(args.kfuse)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "programs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
