//! GPU tier smoke test of the generated kernels with a minimal plan runner (the real executor
//! lives in crate `kfuse`): results against the CPU interpreter on odd sizes, poisoned outputs,
//! two launches (the self-resetting ticket; bit-identical results). Timings are printed, never
//! asserted. Skips with `SKIPPED:` when no GPU opens (fails under `KFUSE_REQUIRE_GPU=1`).

mod common;

use kfuse_codegen::{plan, BufferKind, CodegenOptions, Param, Plan};
use kfuse_ir::{Graph, HostTensor, TensorData};
use kfuse_runtime::{testing::gpu_or_skip, DeviceBuffer, Gpu, KernelArg, KernelLaunch};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32) / (1u64 << 24) as f32
    }
}

/// Runs every kernel of `p` once or more; returns the outputs' bytes after each round.
fn run(gpu: &Gpu, p: &Plan, sizes: &[u64], inputs: &[Vec<u8>], rounds: usize, time_iters: usize) -> Vec<Vec<Vec<u8>>> {
    let grids: Vec<u32> = p.grids(sizes, gpu.sm_count(), |_, blocks| blocks).expect("grid");
    let bufs: Vec<DeviceBuffer> = p
        .buffers
        .iter()
        .map(|b| {
            let grid = match b.kind {
                BufferKind::Partials { kernel, .. } | BufferKind::ColumnPartials { kernel } => u64::from(grids[kernel]),
                _ => 1,
            };
            let bytes = (b.elem_count(sizes, grid).expect("size") * b.elem.size_bytes()).max(16) as usize;
            match b.kind {
                BufferKind::Input(i) => {
                    let mut v = inputs[i.0 as usize].clone();
                    v.resize(v.len().max(16), 0);
                    gpu.upload(&v).expect("upload")
                }
                _ => gpu.alloc_zeroed(bytes).expect("alloc"),
            }
        })
        .collect();
    let funcs: Vec<_> = p.kernels.iter().map(|k| gpu.load_kernel(&k.source, &k.name).expect("load")).collect();
    let launch_all = || {
        for (k, kern) in p.kernels.iter().enumerate() {
            let args: Vec<KernelArg> = kern
                .params
                .iter()
                .map(|q| match q {
                    Param::Buffer(i) => KernelArg::Buffer(&bufs[*i]),
                    Param::Size(s) => KernelArg::I64(sizes[s.0 as usize] as i64),
                    Param::ErrorRecord => KernelArg::ErrorRecord(true),
                    Param::CheckTag => KernelArg::U32(0),
                    Param::Grid(j) => KernelArg::I64(i64::from(grids[*j])),
                    Param::Stride { .. } => panic!("these plans read every input as a contiguous array"),
                })
                .collect();
            gpu.launch(&gpu.default_stream(), &funcs[k], KernelLaunch::new(grids[k], kern.block), &args)
                .expect("launch");
        }
    };
    let mut results = Vec::new();
    for _ in 0..rounds {
        for (b, buf) in p.buffers.iter().zip(&bufs) {
            if matches!(b.kind, BufferKind::Output(_)) {
                gpu.fill(buf, 0xff).expect("poison"); // NaN / -1 everywhere
            }
        }
        launch_all();
        gpu.synchronize().expect("sync");
        results.push(
            p.buffers
                .iter()
                .zip(&bufs)
                .filter(|(b, _)| matches!(b.kind, BufferKind::Output(_)))
                .map(|(_, buf)| gpu.download(buf).expect("download"))
                .collect(),
        );
    }
    if time_iters > 0 {
        for _ in 0..5 {
            launch_all();
        }
        let mut times = Vec::new();
        for _ in 0..time_iters {
            let a = gpu.record_event().expect("event");
            launch_all();
            let b = gpu.record_event().expect("event");
            gpu.synchronize().expect("sync");
            times.push(gpu.elapsed_ms(&a, &b).expect("elapsed") * 1000.0);
        }
        times.sort_by(f32::total_cmp);
        println!("  sizes {sizes:?}: median {:.1} us over {time_iters} runs ({})", times[time_iters / 2], gpu.name());
    }
    results
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn check_against_interp(
    gpu: &Gpu,
    g: &Graph,
    sizes: &[u64],
    inputs: Vec<(&str, Vec<usize>, Vec<f32>)>,
    time_iters: usize,
) {
    let p = plan(g, &CodegenOptions::default()).expect("plan");
    let tensors: Vec<(&str, HostTensor)> =
        inputs.iter().map(|(n, s, v)| (*n, HostTensor::new(s.clone(), TensorData::F32(v.clone())))).collect();
    let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let expected = kfuse_interp::evaluate(g, &refs).expect("interp");
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|(_, _, v)| f32_bytes(v)).collect();
    let got = run(gpu, &p, sizes, &bytes, 2, time_iters);
    assert_eq!(got[0], got[1], "two launches differ (ticket not reset or nondeterminism)");
    for (o, exp) in expected.iter().enumerate() {
        let vals: Vec<f32> =
            got[0][o].chunks(4).take(exp.values.len()).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        for (j, (&gv, &ev)) in vals.iter().zip(&exp.values).enumerate() {
            let tol = 1e-4 * (1.0 + ev.abs());
            assert!(
                (gv as f64 - ev).abs() <= tol || (gv.is_nan() && ev.is_nan()),
                "{} [{j}] sizes {sizes:?}: gpu {gv} vs interp {ev}",
                exp.name
            );
        }
    }
}

fn boxes(rng: &mut Rng, n: usize, valid_frac: f32) -> (Vec<f32>, Vec<f32>) {
    let (mut pred, mut target) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (x, y) = (rng.next() * 100.0, rng.next() * 100.0);
        let t = [x, y, x + 1.0 + rng.next() * 50.0, y + 1.0 + rng.next() * 50.0];
        let p = [
            t[0] + rng.next() * 10.0 - 5.0,
            t[1] + rng.next() * 10.0 - 5.0,
            t[2] + rng.next() * 10.0 - 5.0,
            t[3] + rng.next() * 10.0 - 5.0,
        ];
        let valid = rng.next() < valid_frac;
        pred.extend(p);
        target.extend(if valid { t } else { [0.0; 4] });
    }
    (pred, target)
}

#[test]
fn generated_kernels_match_the_interpreter_on_a_gpu() {
    let Some(gpu) = gpu_or_skip("generated_kernels_match_the_interpreter_on_a_gpu") else { return };
    let mut rng = Rng(42);
    let g = common::giou(kfuse_ir::DType::F32, kfuse_ir::DType::F32).expect("graph");
    for (b, n) in [(1usize, 1usize), (3, 255), (1, 1023), (7, 256), (0, 4)] {
        let (pred, target) = boxes(&mut rng, b * n, 0.3);
        check_against_interp(
            &gpu,
            &g,
            &[b as u64, n as u64],
            vec![("pred", vec![b, n, 4], pred), ("target", vec![b, n, 4], target)],
            0,
        );
    }
    println!("giou f32 forward:");
    for (b, n) in [(1024usize, 256usize), (16384, 256)] {
        let (pred, target) = boxes(&mut rng, b * n, 0.04);
        check_against_interp(
            &gpu,
            &g,
            &[b as u64, n as u64],
            vec![("pred", vec![b, n, 4], pred), ("target", vec![b, n, 4], target)],
            50,
        );
    }
    let g = common::normalize().expect("graph");
    for n in [1usize, 255, 1023, 100_000] {
        let x: Vec<f32> = (0..n).map(|_| rng.next() + 0.5).collect();
        check_against_interp(&gpu, &g, &[n as u64], vec![("x", vec![n], x)], 0);
    }
    let g = common::elementwise().expect("graph");
    for (b, n) in [(3usize, 255usize), (1, 1)] {
        let x: Vec<f32> = (0..b * n).map(|_| rng.next() * 4.0 - 2.0).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        let bx: Vec<f32> = (0..b * n * 4).map(|_| rng.next()).collect();
        let p = plan(&g, &CodegenOptions::default()).expect("plan");
        let bytes = vec![f32_bytes(&x), f32_bytes(&bias), f32_bytes(&bx)];
        let got = run(&gpu, &p, &[b as u64, n as u64], &bytes, 1, 0);
        let scaled: Vec<f32> = got[0][1].chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        for (j, v) in bx.iter().enumerate() {
            assert_eq!(scaled[j], v * 0.5, "scaled[{j}]");
        }
    }
}
