"""What the Python benchmark scripts share: the run's metadata, result files, timing as a PyTorch
user does it (CUDA events on the GPU, time.perf_counter on the CPU), the copy bandwidth and
error measures. Standard library only at import; the functions that time take the torch module.
"""
import datetime
import json
import os
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = 1


# ---------------------------------------------------------------------------------------------
# Run metadata and results.


def run_meta():
    """The device (nvidia-smi's first GPU, else unknown-device), driver, date, time and commit."""
    now = datetime.datetime.now(datetime.timezone.utc)
    device, driver = "unknown-device", "unknown"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()
        if out:
            device, driver = [s.strip() for s in out[0].split(",", 1)]
    except (OSError, subprocess.CalledProcessError):
        pass
    return {"device": device, "driver": driver, "date": now.strftime("%Y-%m-%d"),
            "time_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit()}


def commit():
    """The commit measured: $KFUSE_COMMIT (set from a bundle), else git (with -dirty), else unknown."""
    if os.environ.get("KFUSE_COMMIT"):
        return os.environ["KFUSE_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_result(folder, meta, suite, name, params, figures, command):
    """One measurement as FOLDER/SUITE--NAME.json, with bench/run's fields."""
    os.makedirs(folder, exist_ok=True)
    entry = {"schema": SCHEMA, "suite": suite, "name": name, "params": params, **meta, "command": command,
             "figures": figures}
    path = os.path.join(folder, f"{suite}--{name}.json")
    with open(path, "w") as f:
        json.dump(entry, f, indent=1)
        f.write("\n")
    return path


# ---------------------------------------------------------------------------------------------
# Timing.


def optimised_kernels():
    """Waits for the optimised kernels kfuse compiles in the background after a cold first call
    (when kfuse is imported), so that what follows times them, not the quick builds that serve
    until then. Every timing function below starts with it; first calls are timed before it."""
    import sys

    kfuse = sys.modules.get("kfuse")
    if kfuse is not None and hasattr(kfuse, "wait_for_compiles"):
        kfuse.wait_for_compiles()


def cuda_times_us(torch, fn, warmup, iters, cpu=False, before=None):
    """Median (and min, p90) of the times around each call after warm-up, and the mean per call of
    the whole loop. CUDA events around each call, calls back to back (`cpu`: time.perf_counter
    around each call instead). `before`, when given, runs ahead of each timed call, outside the
    timed span (an L2 flush); the loop mean then includes it."""
    optimised_kernels()
    for _ in range(warmup):
        fn()
    if cpu:
        times = []
        t_all = time.perf_counter()
        for _ in range(iters):
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        loop = (time.perf_counter() - t_all) * 1e6 / iters
    else:
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for a, b in zip(starts, ends):
            if before:
                before()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends)]
        loop = starts[0].elapsed_time(ends[-1]) * 1e3 / iters
    return summary_us(times, loop_mean_us=loop)


def summary_us(times, **extra):
    times = sorted(times)
    return {"median_us": times[len(times) // 2], "min_us": times[0], "p90_us": times[int(len(times) * 0.9)],
            "iters": len(times), **extra}


def interleaved_us(torch, fns, warmup, iters, rounds, cpu=False, before=None):
    """`cuda_times_us` of several functions, interleaved: `rounds` rounds, each timing every
    function for iters/rounds calls in turn, so that the clocks' and the host's drift reach them
    alike. Returns {name: summary over all its calls}."""
    per_round = max(1, iters // rounds)
    optimised_kernels()
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    got = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            s = cuda_times_us(torch, fn, 0, per_round, cpu=cpu, before=before)
            got[name].append(s)
    out = {}
    for name, runs in got.items():
        # The medians of the rounds' medians would hide a bimodal round; keep each round's median.
        meds = [r["median_us"] for r in runs]
        out[name] = {"median_us": sorted(meds)[len(meds) // 2], "min_us": min(r["min_us"] for r in runs),
                     "round_medians_us": meds, "iters": per_round * rounds}
    return out


def side_stream_warmup(torch, step, calls=3):
    """Runs `step` a few times on a side stream, as a CUDA graph capture wants before it starts."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            step()
    torch.cuda.current_stream().wait_stream(side)


def host_blocks(torch, fn, calls, blocks, cpu=False, warmup=20):
    """Host time per call of each of `blocks` blocks: time.perf_counter over `calls` calls with no
    synchronisation inside (the device synchronised before each block), in µs."""
    optimised_kernels()
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(blocks):
        if not cpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
    if not cpu:
        torch.cuda.synchronize()
    return out


def host_us(torch, fn, calls, cpu=False, warmup=20, blocks=1):
    """Host time per call: time.perf_counter over `calls` calls, no synchronisation inside; with
    `blocks` > 1, the best of that many such blocks: the host's own cost, without a block that the
    machine's other work or a garbage collection interrupted (one such pause in a single block of
    50 calls has made it read 8x)."""
    return min(host_blocks(torch, fn, calls, blocks, cpu=cpu, warmup=warmup))


def l2_flusher(torch, device):
    """A function that evicts the L2 cache (writes a buffer of twice its size), or None on the CPU."""
    if device.type != "cuda":
        return None
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
    buf = torch.empty(2 * size, dtype=torch.uint8, device=device)
    return lambda: buf.fill_(1)


def copy_bandwidth(torch, device, nbytes, warmup, iters, cpu=False):
    """A device-to-device `copy_` of `nbytes`: its median time and bandwidth (bytes read + written)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = cuda_times_us(torch, lambda: dst.copy_(src), warmup, iters, cpu=cpu)
    moved = 2 * src.numel() * 4
    return {"bytes": moved, "median_us": t["median_us"], "gb_per_s": moved / (t["median_us"] * 1e-6) / 1e9}


# ---------------------------------------------------------------------------------------------
# Errors.


def rel_err(torch, got, want):
    """Relative error: |got - want| / |want| in the 2-norm (for a scalar, the plain relative error)."""
    got, want = got.detach().double(), want.detach().double()
    den = torch.linalg.vector_norm(want).item()
    num = torch.linalg.vector_norm(got - want).item()
    return num / den if den > 0 else num


def max_rel_err(got, want):
    """max |got - want| / max |want| over the elements (the plain difference when want is all 0)."""
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    num = (got - want).abs().max().item() if got.numel() else 0.0
    den = want.abs().max().item() if want.numel() else 0.0
    return num / den if den > 0 else num


def exit_status(failures):
    """Prints the failures, if any; the exit status: 1 with failures, else 0."""
    if failures:
        print(f"\n{len(failures)} failures:\n  " + "\n  ".join(failures))
        return 1
    return 0
