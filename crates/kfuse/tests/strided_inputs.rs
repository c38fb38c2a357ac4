//! GPU tier: inputs that are views which are not contiguous (transposed, padded rows starting one
//! element in, every other element, broadcast with stride 0, rows sliced from wider rows), launched in place through
//! `Program::launch` and a bound launch, against the interpreter on the same values made
//! contiguous, at odd sizes, for row, column, elementwise and ragged kernels, in f32 and bf16.
//! Skips, saying why, without a GPU; fails instead with KFUSE_REQUIRE_GPU=1.

use kfuse::{DType, DeviceBuffer, DeviceTensor, Gpu, HostTensor, Program, Validation};
use kfuse_testing::{example, float_inputs_as, random_tensor, rel_l2_err as rel_err, Rng, SeedableRng, StdRng};

mod common;
use common::{device, Held};

/// A new seed every run, printed so that a failure can be replayed with KFUSE_TEST_SEED.
fn seed() -> u64 {
    let seed = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    println!("seed {seed} (replay with KFUSE_TEST_SEED={seed})");
    seed
}

/// How a view lays its elements out in its buffer.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// The axes in reverse order (a transpose of a contiguous tensor).
    Transposed,
    /// Rows padded by 3 elements, the view starting one element into its buffer.
    Padded,
    /// Every stride doubled (every other element).
    Doubled,
    /// The first axis broadcast (stride 0): every position along it reads the same elements.
    Broadcast,
    /// Rows that are a slice of rows `n` elements longer (`x[:, :d]` of a wider tensor), from the
    /// buffer's start: a last-axis stride of 1, rows starting on a vector where `n` is a multiple
    /// of it.
    Sliced(usize),
}

const LAYOUTS: [Layout; 4] = [Layout::Transposed, Layout::Padded, Layout::Doubled, Layout::Broadcast];

/// The strides (elements) and start offset of `layout` for `shape`.
fn strides_of(layout: Layout, shape: &[usize]) -> (Vec<usize>, usize) {
    let row_major = |dims: &[usize]| {
        let mut s = vec![1usize; dims.len()];
        for a in (0..dims.len().saturating_sub(1)).rev() {
            s[a] = s[a + 1] * dims[a + 1].max(1);
        }
        s
    };
    match layout {
        Layout::Transposed => {
            let mut s = vec![1usize; shape.len()];
            for a in 1..shape.len() {
                s[a] = s[a - 1] * shape[a - 1].max(1);
            }
            (s, 0)
        }
        Layout::Padded => {
            let mut dims = shape.to_vec();
            if let Some(last) = dims.last_mut() {
                *last += 3;
            }
            (row_major(&dims), 1)
        }
        Layout::Sliced(n) => {
            let mut dims = shape.to_vec();
            if let Some(last) = dims.last_mut() {
                *last += n;
            }
            (row_major(&dims), 0)
        }
        Layout::Doubled => (row_major(shape).iter().map(|s| 2 * s).collect(), 0),
        Layout::Broadcast => {
            let mut s = row_major(shape);
            if let Some(first) = s.first_mut() {
                *first = 0;
            }
            (s, 0)
        }
    }
}

/// The row-major positions of a tensor of `shape`, each as its element offset under `strides`.
fn positions(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut at = 0;
            for (&d, &s) in shape.iter().zip(strides).rev() {
                at += (flat % d) * s;
                flat /= d;
            }
            at
        })
        .collect()
}

/// `t` laid out as `layout`: the bytes of its buffer (garbage where the view does not reach), and
/// the values the view holds, contiguous (those of `t`, except that a broadcast axis holds the
/// values written last at each position).
fn lay_out(t: &HostTensor, layout: Layout, rng: &mut StdRng) -> (Vec<u8>, Vec<usize>, HostTensor) {
    let (strides, offset) = strides_of(layout, &t.shape);
    let size = t.dtype().size_bytes();
    let at = positions(&t.shape, &strides);
    let span = at.iter().max().map_or(0, |m| m + 1);
    let mut buffer: Vec<u8> = (0..(offset + span).max(1) * size).map(|_| rng.random()).collect();
    let bytes = t.to_bytes();
    for (k, &p) in at.iter().enumerate() {
        buffer[(offset + p) * size..(offset + p + 1) * size].copy_from_slice(&bytes[k * size..(k + 1) * size]);
    }
    let mut seen = Vec::with_capacity(bytes.len());
    for &p in &at {
        seen.extend_from_slice(&buffer[(offset + p) * size..(offset + p + 1) * size]);
    }
    let viewed = HostTensor::from_bytes(t.dtype(), t.shape.clone(), &seen).expect("the view's bytes");
    (buffer, strides, viewed)
}

/// One input of a launch: its buffer, where its view starts (elements), its strides, dtype and
/// shape.
struct View {
    name: String,
    owned: DeviceBuffer,
    offset: usize,
    strides: Vec<usize>,
    dtype: DType,
    shape: Vec<usize>,
}

impl View {
    /// The view borrowed as a device tensor.
    fn tensor(&self, gpu: &Gpu) -> DeviceTensor {
        let start = self.offset * self.dtype.size_bytes();
        // SAFETY: the view lies inside `owned`, a live allocation of this device that outlives
        // every launch of the test (each test synchronises before dropping it).
        let buffer = unsafe { gpu.borrow_memory(self.owned.address() + start as u64, self.owned.bytes() - start) };
        DeviceTensor { buffer, dtype: self.dtype, shape: self.shape.clone(), strides: Some(self.strides.clone()) }
    }
}

/// Runs `p` on `inputs`, every input laid out as a view (input `k` as
/// `layouts[(k + round) % layouts.len()]`, except lengths and offsets, contiguous), in place and
/// through a bound launch, and compares each output with the interpreter on the views' values.
fn check_views(
    gpu: &Gpu,
    p: &Program,
    inputs: &[(&str, HostTensor)],
    (layouts, round): (&[Layout], usize),
    rng: &mut StdRng,
    what: &str,
) {
    let stream = gpu.create_stream().unwrap();
    let mut views: Vec<View> = Vec::new();
    let mut reference: Vec<(&str, HostTensor)> = Vec::new();
    for (k, (name, t)) in inputs.iter().enumerate() {
        let contiguous = p.interface().input(name).is_some_and(|d| d.layout.is_some());
        let layout = layouts[(k + round) % layouts.len()];
        let (bytes, strides, viewed, offset) = if contiguous {
            (
                t.to_bytes(),
                kfuse::exec::contiguous_strides(&t.shape).iter().map(|&s| s as usize).collect(),
                t.clone(),
                0,
            )
        } else {
            let (bytes, strides, viewed) = lay_out(t, layout, rng);
            (bytes, strides, viewed, strides_of(layout, &t.shape).1)
        };
        let mut bytes = bytes;
        bytes.resize(bytes.len().max(16), 0);
        let owned = gpu.upload(&bytes).unwrap();
        views.push(View { name: name.to_string(), owned, offset, strides, dtype: t.dtype(), shape: t.shape.clone() });
        reference.push((name, viewed));
    }
    let named: Vec<(&str, &HostTensor)> = reference.iter().map(|(n, t)| (*n, t)).collect();
    let want = p.run_cpu(&named).unwrap_or_else(|e| panic!("{what}: interpreter: {e}"));
    let shapes: Vec<(&str, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.shape.as_slice())).collect();
    let outs: Vec<Held> =
        p.output_shapes(&shapes).unwrap().iter().map(|(_, dtype, shape)| Held::poisoned(gpu, *dtype, shape)).collect();
    let device_inputs: Vec<(&str, DeviceTensor)> = views.iter().map(|v| (v.name.as_str(), v.tensor(gpu))).collect();
    let device_outputs: Vec<DeviceTensor> = outs.iter().map(|h| h.borrowed(gpu)).collect();
    let typed: Vec<(&str, DType, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.dtype(), t.shape.as_slice())).collect();
    // Every view but lengths and offsets is read through its strides (a padded one that is
    // contiguous still starts off a 16-byte boundary).
    let strides: Vec<(&str, &[usize])> = views
        .iter()
        .filter(|v| p.interface().input(&v.name).is_some_and(|d| d.layout.is_none()))
        .map(|v| (v.name.as_str(), v.strides.as_slice()))
        .collect();
    let bound = p
        .bind_device_strided(gpu.ordinal(), &typed, &strides)
        .unwrap_or_else(|e| panic!("{what}: bind_device_strided: {e}"));
    println!("{what}, round {round}: {:?}", views.iter().map(|v| (&v.name, &v.strides, v.offset)).collect::<Vec<_>>());
    for launch in ["in place", "bound"] {
        for h in &outs {
            gpu.fill(&h.owned, 0x7f).unwrap();
        }
        gpu.synchronize().unwrap();
        if launch == "in place" {
            p.launch(gpu.ordinal(), &stream, &device_inputs, &device_outputs, Validation::Deferred)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        } else {
            // The bound launch takes the inputs in the order given to `bind_device_strided`.
            let buffers: Vec<DeviceBuffer> =
                views.iter().map(|v| v.tensor(gpu).buffer).chain(outs.iter().map(|h| h.borrowed(gpu).buffer)).collect();
            bound.launch(&stream, &buffers, Validation::Deferred).unwrap_or_else(|e| panic!("{what}: bound: {e}"));
        }
        stream.synchronize().unwrap();
        for ((name, w), h) in want.iter().zip(&outs) {
            let got = h.download(gpu);
            let tol = if got.dtype() == DType::F32 { 1e-5 } else { 1e-2 };
            let err = rel_err(&got, w);
            assert!(err <= tol, "{what} output {name} ({launch}, round {round}): error {err:.3e} > {tol:.0e}");
        }
    }
}

/// Well-formed boxes (x1 < x2, y1 < y2), `shape` [.., 4].
fn boxes(rng: &mut StdRng, dtype: DType, shape: &[usize]) -> HostTensor {
    let rows: usize = shape.iter().product::<usize>() / 4;
    let mut v = Vec::with_capacity(rows * 4);
    for _ in 0..rows {
        let (x, y) = (rng.random_range(0.0..50.0), rng.random_range(0.0..50.0));
        let (w, h) = (rng.random_range(1.0..20.0), rng.random_range(1.0..20.0));
        v.extend([x, y, x + w, y + h]);
    }
    HostTensor::from_f64(dtype, shape.to_vec(), &v)
}

/// Random inputs of a row program at `[b, d]` (a 1-D input: `[d]`), uniform in [-1, 1), but a
/// cross-entropy's `targets`, a distribution over each row (non-negative, summing to 1): with
/// targets of mixed signs the loss is a cancellation whose f32 rounding no two evaluation orders
/// share (one seed put it 1.3e-3 off), with rows of targets that do not sum to 1 so is the
/// gradient `softmax * sum(targets) - targets`.
fn row_inputs<'p>(p: &'p Program, (b, d): (usize, usize), rng: &mut StdRng) -> Vec<(&'p str, HostTensor)> {
    p.interface()
        .inputs
        .iter()
        .map(|decl| {
            let shape = if decl.shape.len() == 2 { vec![b, d] } else { vec![d] };
            let t = random_tensor(decl.dtype, &shape, rng.random());
            let t = if decl.name == "targets" {
                let v: Vec<f64> = t.to_f64().iter().map(|v| v.abs() + 1e-3).collect();
                let rows: Vec<f64> = v
                    .chunks(d)
                    .flat_map(|row| {
                        let sum: f64 = row.iter().sum();
                        row.iter().map(move |x| x / sum)
                    })
                    .collect();
                HostTensor::from_f64(t.dtype(), shape, &rows)
            } else {
                t
            };
            (decl.name.as_str(), t)
        })
        .collect()
}

#[test]
fn views_of_row_and_column_programs_match_the_interpreter() {
    let Some((engine, gpu)) = device("views_of_row_and_column_programs_match_the_interpreter") else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    for stem in ["layer_norm_train", "rms_norm_train", "gelu_bias_train", "softmax_xent_train"] {
        let base = Program::compile(&engine, &example(stem), &format!("examples/{stem}.kf")).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let dtypes = float_inputs_as(base.interface(), dtype);
            let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
            let p = base.with_input_dtypes(&dtypes).unwrap();
            // (Short rows make a norm's input gradient a cancellation, whose f32 rounding no two
            // evaluation orders share: RMSNorm's is eps / r^3 at one column, layer norm's
            // normalised row is +-1 at two, and at three one seed put layer norm's dx 2.2e-5 off
            // on an H200. Rows of 7 are the shortest here; gpu_conformance bounds the short rows.)
            for (round, (b, d)) in [(1, 7), (3, 31), (33, 257), (1023, 33), (5, 4097)].into_iter().enumerate() {
                let inputs = row_inputs(&p, (b, d), &mut rng);
                check_views(&gpu, &p, &inputs, (&LAYOUTS, round), &mut rng, &format!("{stem} {dtype} [{b}, {d}]"));
            }
        }
    }
}

#[test]
fn row_views_with_a_unit_last_stride_match_the_interpreter_in_the_entry_for_rows_in_registers() {
    let Some((engine, gpu)) =
        device("row_views_with_a_unit_last_stride_match_the_interpreter_in_the_entry_for_rows_in_registers")
    else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(seed());
    // Rows sliced from rows 8 longer start on a vector of either width (the entry for rows in
    // registers); 4 longer, only on one of 4 columns (bf16 rows take the entry for any row). Row
    // lengths are multiples of 8, as that entry needs; a broadcast row (stride 0) and a
    // contiguous one beside.
    let layouts = [Layout::Sliced(8), Layout::Sliced(4), Layout::Broadcast, Layout::Sliced(0)];
    for stem in ["layer_norm_train", "rms_norm_train", "gelu_bias_train", "softmax_xent_train"] {
        let base = Program::compile(&engine, &example(stem), &format!("examples/{stem}.kf")).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let dtypes = float_inputs_as(base.interface(), dtype);
            let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
            let p = base.with_input_dtypes(&dtypes).unwrap();
            for (round, (b, d)) in [(1, 8), (3, 64), (33, 1024), (7, 4096), (2, 16384)].into_iter().enumerate() {
                let inputs = row_inputs(&p, (b, d), &mut rng);
                check_views(&gpu, &p, &inputs, (&layouts, round), &mut rng, &format!("{stem} {dtype} [{b}, {d}]"));
            }
        }
    }
}

#[test]
fn views_of_cross_entropy_and_ragged_giou_match_the_interpreter() {
    let Some((engine, gpu)) = device("views_of_cross_entropy_and_ragged_giou_match_the_interpreter") else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let xent = Program::compile(&engine, &example("cross_entropy_train"), "examples/cross_entropy_train.kf").unwrap();
    for (round, (b, c)) in [(1, 16), (3, 1000), (1023, 17), (7, 32001)].into_iter().enumerate() {
        let labels: Vec<f64> =
            (0..b).map(|i| if i % 5 == 1 { -100.0 } else { f64::from(rng.random_range(0..c as i32)) }).collect();
        let inputs = [
            ("logits", random_tensor(DType::F32, &[b, c], rng.random())),
            ("labels", HostTensor::from_f64(DType::I64, vec![b], &labels)),
        ];
        check_views(&gpu, &xent, &inputs, (&LAYOUTS, round), &mut rng, &format!("cross_entropy_train [{b}, {c}]"));
    }
    let giou = Program::compile(&engine, &example("giou_train_lengths"), "examples/giou_train_lengths.kf").unwrap();
    for (round, (b, n)) in [(1, 1), (3, 5), (257, 7), (1023, 33)].into_iter().enumerate() {
        let lengths: Vec<f64> =
            (0..b).map(|i| if i == 0 { n as f64 } else { rng.random_range(0..=n) as f64 }).collect();
        let inputs = [
            ("pred", boxes(&mut rng, DType::F32, &[b, n, 4])),
            ("target", boxes(&mut rng, DType::F32, &[b, n, 4])),
            ("lengths", HostTensor::from_f64(DType::I32, vec![b], &lengths)),
        ];
        check_views(&gpu, &giou, &inputs, (&LAYOUTS, round), &mut rng, &format!("giou_train_lengths [{b}, {n}]"));
    }
}

#[test]
fn a_view_given_to_kernels_that_read_it_contiguous_is_refused() {
    let Some((engine, gpu)) = device("a_view_given_to_kernels_that_read_it_contiguous_is_refused") else { return };
    let p = Program::compile(&engine, &example("gelu_bias_train"), "examples/gelu_bias_train.kf").unwrap();
    let exec = kfuse::exec::CudaProgram::prepare(&gpu, &p).unwrap();
    // x [3, 4] is the transpose of a contiguous [4, 3].
    let (x, dy, bias) = (
        Held::zeros(&gpu, DType::F32, &[4, 3]),
        Held::zeros(&gpu, DType::F32, &[3, 4]),
        Held::zeros(&gpu, DType::F32, &[4]),
    );
    let mut transposed = x.borrowed(&gpu);
    transposed.shape = vec![3, 4];
    transposed.strides = Some(vec![1, 3]);
    let outs: Vec<Held> = [vec![3, 4], vec![3, 4], vec![4]].iter().map(|s| Held::zeros(&gpu, DType::F32, s)).collect();
    let mut workspace = kfuse::exec::Workspace::default();
    let err = exec
        .launch_device(
            &gpu.default_stream(),
            &[("x", transposed), ("bias", bias.borrowed(&gpu)), ("dy", dy.borrowed(&gpu))],
            &outs.iter().map(|h| h.borrowed(&gpu)).collect::<Vec<_>>(),
            &mut workspace,
            Validation::Deferred,
        )
        .unwrap_err();
    assert!(err.to_string().contains("input `x`: this view is not contiguous"), "{err}");
    // A contiguous input that starts off a 16-byte boundary: refused by kernels that read it as
    // a contiguous array, read through its strides by `Program::launch`.
    let wide = Held::zeros(&gpu, DType::F32, &[13]);
    let shifted_again = || {
        // SAFETY: 4 bytes into a live allocation of 52 bytes, which outlives the launches.
        let shifted = unsafe { gpu.borrow_memory(wide.owned.address() + 4, 48) };
        DeviceTensor::contiguous(shifted, DType::F32, vec![3, 4])
    };
    let inputs = |x: DeviceTensor| [("x", x), ("bias", bias.borrowed(&gpu)), ("dy", dy.borrowed(&gpu))];
    let outputs: Vec<DeviceTensor> = outs.iter().map(|h| h.borrowed(&gpu)).collect();
    let err = exec
        .launch_device(&gpu.default_stream(), &inputs(shifted_again()), &outputs, &mut workspace, Validation::Deferred)
        .unwrap_err();
    assert!(err.to_string().contains("not 16-byte aligned"), "{err}");
    p.launch(gpu.ordinal(), &gpu.default_stream(), &inputs(shifted_again()), &outputs, Validation::Deferred)
        .unwrap_or_else(|e| panic!("a shifted contiguous input is read through its strides: {e}"));
    gpu.synchronize().unwrap();
}
