//! Benchmarks of a program on the GPU: CUDA events, warm-up, the median of many runs, with the L2
//! cache flushed before each run (one figure) and back to back (another); agreement with the
//! interpreter; bytes moved against the card's copy bandwidth measured in the same run; optionally
//! a hand-written baseline kernel timed the same way.
//!
//! Speed is only ever claimed here, never in tests.

use std::fmt;
use std::time::Instant;

use kfuse_ir::{DType, Graph, HostTensor};
use kfuse_runtime::{DeviceBuffer, Gpu, GpuFunction, KernelArg};
use serde::Serialize;

use crate::exec::CudaProgram;
use crate::{Error, Program};

const HANDWRITTEN: &str = include_str!("baselines/giou_handwritten.cu");

/// How to bench.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Timed runs per figure (after warm-up).
    pub iters: usize,
    /// A hand-written baseline to time in the same run (`giou`).
    pub baseline: Option<String>,
}

/// Median, min and spread of a set of timings, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    pub median_us: f64,
    pub min_us: f64,
    pub p90_us: f64,
    pub runs: usize,
}

impl Timing {
    fn from_ms(mut ms: Vec<f32>) -> Timing {
        ms.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize] as f64 * 1000.0;
        Timing { median_us: at(0.5), min_us: at(0.0), p90_us: at(0.9), runs: ms.len() }
    }
}

/// One timed kernel set: the generated program or a baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Timed {
    pub name: String,
    pub launches: usize,
    pub l2_flushed: Timing,
    pub back_to_back: Timing,
    /// Bytes the run must move at least (see `must_touch_bytes`).
    pub bytes: u64,
    /// `bytes` over the back-to-back and flushed medians.
    pub gbps_back_to_back: f64,
    pub gbps_l2_flushed: f64,
    /// Worst relative error of any output against the interpreter.
    pub max_rel_err: f64,
}

impl Timed {
    fn new(name: &str, launches: usize, l2_flushed: Timing, back_to_back: Timing, bytes: u64, max_rel_err: f64) -> Timed {
        Timed {
            name: name.to_string(),
            launches,
            gbps_back_to_back: bytes as f64 / (back_to_back.median_us * 1e3),
            gbps_l2_flushed: bytes as f64 / (l2_flushed.median_us * 1e3),
            l2_flushed,
            back_to_back,
            bytes,
            max_rel_err,
        }
    }
}

/// Everything `kfuse bench` prints.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub file: String,
    pub device: String,
    pub date_utc: String,
    pub sizes: Vec<(String, u64)>,
    pub copy_bandwidth_gbps: f64,
    pub prepare_ms: f64,
    pub interpreter_ms: f64,
    pub outputs: Vec<OutputCheck>,
    pub kfuse: Timed,
    pub baseline: Option<Timed>,
    /// Inputs read only where a predicate holds, left out of `bytes`.
    pub masked_inputs: Vec<String>,
}

/// One output compared with the interpreter.
#[derive(Clone, Debug, Serialize)]
pub struct OutputCheck {
    pub name: String,
    pub gpu: Option<f64>,
    pub cpu: Option<f64>,
    pub rel_err: f64,
    pub max_abs_err: f64,
}

/// Random inputs for the given symbol sizes (see [`crate::testdata`] for what they hold).
pub fn random_inputs(graph: &Graph, sizes: &[(String, u64)], seed: u64) -> Result<Vec<(String, HostTensor)>, Error> {
    let mut vals = vec![None; graph.symbols.len()];
    for (name, v) in sizes {
        let s = graph.symbol(name).ok_or_else(|| Error::Exec(format!("--dim {name}: the program has no dimension `{name}` (it has: {})", graph.symbols.join(", "))))?;
        vals[s.0 as usize] = Some(*v);
    }
    let sizes: Vec<u64> = vals
        .iter()
        .zip(&graph.symbols)
        .map(|(v, n)| v.ok_or_else(|| Error::Exec(format!("give a size for dimension `{n}` with --dim {n}=SIZE"))))
        .collect::<Result<_, _>>()?;
    crate::testdata::random_inputs_for(graph, &sizes, seed)
}

/// Relative error of `got` against `want`: ‖got − want‖₂ / ‖want‖₂ (absolute when `want` is 0),
/// and the largest absolute difference. NaN in the same places counts as agreement.
pub fn compare(got: &HostTensor, want: &HostTensor) -> (f64, f64) {
    if got.len() != want.len() {
        return (f64::INFINITY, f64::INFINITY);
    }
    let (g, w) = (got.to_f64(), want.to_f64());
    let (mut num, mut max_abs) = (0.0f64, 0.0f64);
    for (a, b) in g.iter().zip(&w) {
        if (a.is_nan() && b.is_nan()) || a == b {
            continue; // equal, or NaN in the same place, or the same infinity
        }
        let d = (a - b).abs();
        let d = if d.is_nan() { f64::INFINITY } else { d };
        num += d * d;
        max_abs = max_abs.max(d);
    }
    let den: f64 = w.iter().filter(|b| b.is_finite()).map(|b| b * b).sum();
    let rel = if den > 0.0 { num.sqrt() / den.sqrt() } else { num.sqrt() };
    (rel, max_abs)
}

/// Times `program` on `gpu` with `inputs`.
pub fn run(gpu: &Gpu, program: &Program, inputs: &[(String, HostTensor)], opts: &BenchOptions) -> Result<BenchReport, Error> {
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let iters = opts.iters.max(10);

    let t0 = Instant::now();
    let cpu = program.run_cpu(&named)?;
    let interpreter_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t0 = Instant::now();
    let prog = CudaProgram::prepare(gpu, program)?;
    let bound = prog.bind(&named)?;
    prog.launch(&bound)?;
    gpu.synchronize()?;
    let prepare_ms = t0.elapsed().as_secs_f64() * 1e3;

    // The checked run reuses the bound buffers, poisoned first, so an unwritten element shows.
    prog.poison_outputs(&bound, 0xff)?;
    prog.launch(&bound)?;
    let gpu_out = prog.download(&bound)?;
    let outputs: Vec<OutputCheck> = gpu_out
        .iter()
        .zip(&cpu)
        .map(|((name, g), (_, c))| {
            let (rel_err, max_abs_err) = compare(g, c);
            OutputCheck { name: name.clone(), gpu: g.shape.is_empty().then(|| g.to_f64()[0]), cpu: c.shape.is_empty().then(|| c.to_f64()[0]), rel_err, max_abs_err }
        })
        .collect();
    let max_rel_err = outputs.iter().map(|o| o.rel_err).fold(0.0, f64::max);

    let flush = gpu.alloc_zeroed((gpu.l2_bytes() * 2).max(64 << 20))?;
    let (bytes, masked_inputs) = must_touch_bytes(prog.plan(), &cpu, inputs, &program.graph);
    let (l2, b2b) = time(gpu, &flush, iters, || prog.launch(&bound))?;
    let kfuse = Timed::new("kfuse (generated)", prog.plan().kernels.len(), l2, b2b, bytes, max_rel_err);

    let copy_bandwidth_gbps = copy_bandwidth(gpu)?;
    let baseline = match opts.baseline.as_deref() {
        None => None,
        Some("giou") => Some(giou_baseline(gpu, &flush, inputs, &cpu, iters, bytes)?),
        Some(other) => return Err(Error::Exec(format!("unknown --baseline `{other}` (known: giou)"))),
    };
    Ok(BenchReport {
        file: program.origin.clone(),
        device: gpu.name(),
        date_utc: today_utc(),
        sizes: program.graph.symbols.iter().cloned().zip(bound.sizes().iter().copied()).collect(),
        copy_bandwidth_gbps,
        prepare_ms,
        interpreter_ms,
        outputs,
        kfuse,
        baseline,
        masked_inputs,
    })
}

/// The bytes a run must move: every output once, and every input that some kernel reads for
/// every element. Inputs that every kernel reads only under a hoisted predicate (`pred` of the
/// GIoU loss, read for valid boxes only) are left out, so the figure is a lower bound and the
/// GB/s derived from it never flatter the kernel.
fn must_touch_bytes(plan: &kfuse_codegen::Plan, outputs: &[(String, HostTensor)], inputs: &[(String, HostTensor)], graph: &Graph) -> (u64, Vec<String>) {
    use kfuse_codegen::{BufferKind, Param};
    let sz = |t: &HostTensor| (t.len() * t.dtype().size_bytes()) as u64;
    let mut full = std::collections::BTreeSet::new();
    let mut lazy_only = std::collections::BTreeSet::new();
    for k in &plan.kernels {
        for p in &k.params {
            if let Param::Buffer(b) = p {
                if let BufferKind::Input(id) = plan.buffers[*b].kind {
                    if k.lazy_inputs.contains(&id) {
                        lazy_only.insert(id);
                    } else {
                        full.insert(id);
                    }
                }
            }
        }
    }
    let ins: u64 = full
        .iter()
        .filter_map(|id| inputs.iter().find(|(n, _)| *n == graph.input(*id).name))
        .map(|(_, t)| sz(t))
        .sum();
    let skipped = lazy_only.difference(&full).map(|id| graph.input(*id).name.clone()).collect();
    (ins + outputs.iter().map(|(_, t)| sz(t)).sum::<u64>(), skipped)
}

/// Times `launch`: each run after an L2 flush, and runs back to back (medians of batches of 20).
fn time(gpu: &Gpu, flush: &DeviceBuffer, iters: usize, mut launch: impl FnMut() -> Result<(), Error>) -> Result<(Timing, Timing), Error> {
    for _ in 0..10 {
        launch()?;
    }
    gpu.synchronize()?;
    let mut flushed = Vec::with_capacity(iters);
    for i in 0..iters {
        gpu.fill(flush, (i & 0xff) as u8)?;
        let a = gpu.record_event()?;
        launch()?;
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        flushed.push(gpu.elapsed_ms(&a, &b)?);
    }
    let batch = 20;
    let mut b2b = Vec::new();
    for _ in 0..(iters / batch).max(5) {
        let a = gpu.record_event()?;
        for _ in 0..batch {
            launch()?;
        }
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        b2b.push(gpu.elapsed_ms(&a, &b)? / batch as f32);
    }
    Ok((Timing::from_ms(flushed), Timing::from_ms(b2b)))
}

fn load_handwritten(gpu: &Gpu, name: &str) -> Result<GpuFunction, Error> {
    Ok(gpu.load_kernel(HANDWRITTEN, name)?)
}

/// The card's device-to-device copy bandwidth (bytes read + written per second), in GB/s.
pub fn copy_bandwidth(gpu: &Gpu) -> Result<f64, Error> {
    let f = load_handwritten(gpu, "copy_bandwidth")?;
    let bytes: usize = 1 << 30;
    let (src, dst) = (gpu.alloc_zeroed(bytes)?, gpu.alloc_zeroed(bytes)?);
    let n = (bytes / 16) as i64;
    let grid = gpu.sm_count() * 8;
    let mut ms = Vec::new();
    for i in 0..13 {
        let a = gpu.record_event()?;
        gpu.launch(&f, grid, 256, 0, &[KernelArg::Buffer(&src), KernelArg::Buffer(&dst), KernelArg::I64(n)])?;
        let b = gpu.record_event()?;
        gpu.synchronize()?;
        if i >= 3 {
            ms.push(gpu.elapsed_ms(&a, &b)?);
        }
    }
    let t = Timing::from_ms(ms);
    Ok(2.0 * bytes as f64 / (t.median_us * 1e3))
}

fn giou_baseline(gpu: &Gpu, flush: &DeviceBuffer, inputs: &[(String, HostTensor)], cpu: &[(String, HostTensor)], iters: usize, bytes: u64) -> Result<Timed, Error> {
    let get = |name: &str| {
        inputs
            .iter()
            .find(|(n, t)| n == name && t.dtype() == DType::F32 && t.shape.last() == Some(&4))
            .map(|(_, t)| t)
            .ok_or_else(|| Error::Exec(format!("--baseline giou needs an f32 input `{name}` of shape [.., 4]")))
    };
    let (pred, target) = (get("pred")?, get("target")?);
    let n = (target.len() / 4) as i64;
    let f = load_handwritten(gpu, "giou_handwritten")?;
    let (p, t) = (gpu.upload(&pred.to_bytes())?, gpu.upload(&target.to_bytes())?);
    let (acc, ticket, loss) = (gpu.alloc_zeroed(8)?, gpu.alloc_zeroed(4)?, gpu.alloc_zeroed(4)?);
    let grid = u32::try_from((n as u64).div_ceil(256).max(1)).map_err(|_| Error::Exec("batch too large for the baseline".into()))?;
    let launch = || -> Result<(), Error> {
        let args = [KernelArg::Buffer(&p), KernelArg::Buffer(&t), KernelArg::I64(n), KernelArg::Buffer(&acc), KernelArg::Buffer(&ticket), KernelArg::Buffer(&loss)];
        Ok(gpu.launch(&f, grid, 256, 0, &args)?)
    };
    launch()?;
    gpu.synchronize()?;
    let got = HostTensor::from_bytes(DType::F32, vec![], &gpu.download(&loss)?).ok_or_else(|| Error::Exec("baseline loss".into()))?;
    let want = cpu.iter().find(|(n, _)| n == "loss").map(|(_, t)| t).ok_or_else(|| Error::Exec("--baseline giou needs an output `loss`".into()))?;
    let (max_rel_err, _) = compare(&got, want);
    let (l2, b2b) = time(gpu, flush, iters, launch)?;
    Ok(Timed::new("hand-written CUDA (one thread per box)", 1, l2, b2b, bytes, max_rel_err))
}

/// Today's date in UTC as YYYY-MM-DD (civil-from-days, no time crate needed).
pub fn today_utc() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let z = (secs / 86400) as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02}")
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<String> = self.sizes.iter().map(|(n, v)| format!("{n}={v}")).collect();
        writeln!(f, "{} on {} ({}), {}", self.file, self.device, self.date_utc, sizes.join(" "))?;
        writeln!(f, "copy bandwidth (device-to-device, read+write): {:.0} GB/s", self.copy_bandwidth_gbps)?;
        writeln!(f, "first run incl. compile/load: {:.1} ms; interpreter: {:.1} ms", self.prepare_ms, self.interpreter_ms)?;
        for o in &self.outputs {
            match (o.gpu, o.cpu) {
                (Some(g), Some(c)) => writeln!(f, "  {} = {g:.9} (gpu) vs {c:.9} (interpreter), rel err {:.2e}", o.name, o.rel_err)?,
                _ => writeln!(f, "  {}: rel err {:.2e}, max abs err {:.2e} vs interpreter", o.name, o.rel_err, o.max_abs_err)?,
            }
        }
        writeln!(f, "{:<42} {:>8} {:>12} {:>12} {:>10} {:>10} {:>9}", "kernel", "launches", "b2b med µs", "flush med µs", "b2b GB/s", "flush GB/s", "% copy bw")?;
        for t in std::iter::once(&self.kfuse).chain(self.baseline.as_ref()) {
            writeln!(
                f,
                "{:<42} {:>8} {:>12.2} {:>12.2} {:>10.0} {:>10.0} {:>8.0}%",
                t.name,
                t.launches,
                t.back_to_back.median_us,
                t.l2_flushed.median_us,
                t.gbps_back_to_back,
                t.gbps_l2_flushed,
                100.0 * t.gbps_l2_flushed / self.copy_bandwidth_gbps
            )?;
        }
        let skipped = if self.masked_inputs.is_empty() { String::new() } else { format!(" (not counted: {}, read only where the predicate holds)", self.masked_inputs.join(", ")) };
        writeln!(f, "bytes a run must move: every output once and every input read for all elements once = {} bytes{skipped}", self.kfuse.bytes)
    }
}
