#!/usr/bin/env python3
"""NVRTC's own phase times (its `--time` table: front end, NVVM optimizer, PTX translation) for
CUDA files compiled as kfuse compiles them (`--std=c++17 -default-device --minimal`), best of
`--runs`, through ctypes: where a cold compile's time goes, on any machine with libnvrtc.

    python3 bench/ab/nvrtc_phases.py [--arch sm_90] [--runs 3] [--opt OPTION ...] FILE.cu ...
"""
import argparse
import ctypes
import ctypes.util
import glob
import os
import tempfile
import time


def load_nvrtc():
    names = [ctypes.util.find_library("nvrtc")] + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("nvrtc_phases: libnvrtc not found (set LD_LIBRARY_PATH)")


def compile_once(lib, source, options):
    """(wall ms, {phase: ms}) of one compile to a cubin."""
    prog = ctypes.c_void_p()
    check = lambda r, what: r == 0 or (_ for _ in ()).throw(SystemExit(f"nvrtc_phases: {what} failed ({r})"))
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kfuse.cu", 0, None, None), "nvrtcCreateProgram")
    fd, table = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    os.unlink(table)
    opts = options + [f"--time={table}"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t = time.perf_counter()
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    ms = (time.perf_counter() - t) * 1e3
    if r != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise SystemExit(f"nvrtc_phases: compile failed:\n{log.value.decode(errors='replace')}")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    phases = {}
    if os.path.exists(table):
        for line in open(table).read().splitlines()[1:]:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) >= 3:
                phases[cells[1]] = phases.get(cells[1], 0.0) + float(cells[2])
        os.unlink(table)
    return ms, phases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--opt", action="append", default=[], help="an extra NVRTC option (repeatable)")
    args = ap.parse_args()
    lib = load_nvrtc()
    options = [f"--gpu-architecture={args.arch}", "--std=c++17", "-default-device", "--minimal"] + args.opt
    print(f"options: {' '.join(options)}; best of {args.runs} (wall ms; phases from the best run)")
    for path in args.files:
        source = open(path).read()
        best = min((compile_once(lib, source, options) for _ in range(args.runs)), key=lambda r: r[0])
        phases = ", ".join(f"{k} {v:.0f}" for k, v in best[1].items())
        print(f"{os.path.basename(path)}: {best[0]:.0f} ms ({phases})")


if __name__ == "__main__":
    main()
