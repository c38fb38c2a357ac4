"""Kernel A/B by hand: CUDA sources of one kernel (as `kfuse emit` prints them, one translation
unit a file, edited or not) compiled by NVRTC for sm_90 as kfuse compiles them, each launched
alone on torch tensors with the driver API, CUDA-event medians. What a change to the generator
would buy, measured before it is written.

    python3 bench/ab/kernel_ab.py SPEC.json

SPEC.json is a list of cases: {"file", "entry", "grid", "block", "args", "bytes"?, "check"?,
"reps"?, "warmup"?, "opts"?, "batch"?} ("batch": launches back to back between two events, the
time divided by them; 1, each launch alone, by default); each arg is {"type": "ptr", "name",
"dtype", "shape", "kind"?: "zeros" | "positive" (in [0.5, 1.5)) | "labels" (with "high")}
(one tensor per name, shared by the cases; random normal otherwise), {"type": "i64" | "u32", "value"} or {"type": "null"}.
Prints one JSON line a case: the median and fastest µs, GB/s over `bytes`, the sums of the
`check` tensors (equal sums: the same results) and ptxas's register and spill line. Needs
torch with CUDA and libnvrtc (the nvidia-cuda-nvrtc wheel or a CUDA toolkit)."""
import ctypes, glob, json, os, sys, statistics
import torch

def find(names):
    pats = []
    import site
    for sp in site.getsitepackages():
        for n in names:
            pats += glob.glob(os.path.join(sp, "nvidia", "**", n), recursive=True)
    for n in names:
        pats += glob.glob("/usr/local/cuda*/lib64/" + n) + glob.glob("/usr/local/cuda*/targets/*/lib/" + n)
    return pats

nv = ctypes.CDLL(find(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"])[0])
cu = ctypes.CDLL("libcuda.so.1")

def nvrtc(src, opts):
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = nv.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log = ctypes.create_string_buffer(n.value); nv.nvrtcGetProgramLog(prog, log)
    if r != 0:
        raise RuntimeError(log.value.decode()[-4000:])
    n = ctypes.c_size_t(); nv.nvrtcGetCUBINSize(prog, ctypes.byref(n)); buf = ctypes.create_string_buffer(n.value); nv.nvrtcGetCUBIN(prog, buf)
    return buf.raw, log.value.decode()

torch.zeros(1, device="cuda")
ctx = ctypes.c_void_p(); cu.cuCtxGetCurrent(ctypes.byref(ctx)); assert ctx.value
spec = json.load(open(sys.argv[1]))
torch.manual_seed(0)
bufs = {}
def tensor(a):
    key = a["name"]
    if key not in bufs:
        dt = getattr(torch, a["dtype"])
        if a.get("kind") == "labels":
            t = torch.randint(0, a["high"], a["shape"], device="cuda", dtype=dt)
        elif a.get("kind") == "zeros":
            t = torch.zeros(a["shape"], device="cuda", dtype=dt)
        elif a.get("kind") == "positive":
            t = (0.5 + torch.rand(a["shape"], device="cuda", dtype=torch.float32)).to(dt)
        else:
            t = torch.randn(a["shape"], device="cuda", dtype=torch.float32).to(dt)
        bufs[key] = t
    return bufs[key]

for case in spec:
    src = open(case["file"]).read()
    cubin, log = nvrtc(src, ["--gpu-architecture=sm_90", "--std=c++17", "-default-device", "-Xptxas=-v"] + case.get("opts", []))
    mod = ctypes.c_void_p(); assert cu.cuModuleLoadData(ctypes.byref(mod), cubin) == 0
    f = ctypes.c_void_p(); assert cu.cuModuleGetFunction(ctypes.byref(f), mod, case["entry"].encode()) == 0, case["entry"]
    holders = []
    for a in case["args"]:
        if a["type"] == "ptr":
            holders.append(ctypes.c_uint64(tensor(a).data_ptr()))
        elif a["type"] == "i64":
            holders.append(ctypes.c_int64(a["value"]))
        elif a["type"] == "u32":
            holders.append(ctypes.c_uint32(a["value"]))
        elif a["type"] == "null":
            holders.append(ctypes.c_uint64(0))
    argv = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = torch.cuda.current_stream().cuda_stream
    g, b = case["grid"], case["block"]
    def launch():
        r = cu.cuLaunchKernel(f, g, 1, 1, b, 1, 1, case.get("shared", 0), ctypes.c_void_p(stream), argv, None)
        assert r == 0, r
    for _ in range(int(case.get("warmup", 5))): launch()
    torch.cuda.synchronize()
    times = []
    batch = int(case.get("batch", 1))
    for _ in range(int(case.get("reps", 40))):
        e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(batch): launch()
        e1.record(); e1.synchronize(); times.append(e0.elapsed_time(e1) * 1000 / batch)
    outs = {o: bufs[o].float().sum().item() for o in case.get("check", [])}
    regs = [l for l in log.splitlines() if "registers" in l or "spill" in l]
    row = {"file": case["file"], "grid": g, "block": b, "median_us": statistics.median(times), "min_us": min(times), "bytes": case.get("bytes"), "check": outs, "ptxas": regs[-2:]}
    if case.get("bytes"): row["gbps"] = case["bytes"] / row["median_us"] / 1e3
    print(json.dumps(row)); sys.stdout.flush()
