//! Pure tier: the entry point for rows kept in registers, as a plan describes it, and the rule the
//! executor applies to pick it at launch (row length, lanes, vector width, buffer alignment).

use std::sync::Arc;

use kfuse::{DType, Engine, Program};

const LAYER_NORM: &str = "input x: f32[B, D]\ninput w: f32[D]\ninput b: f32[D]\n\
    let mu = mean(x, axis: -1, keepdim: true)\nlet d = x - mu\n\
    output y = d * rsqrt(mean(d * d, axis: -1, keepdim: true) + 0.00001) * w + b\n";

fn layer_norm(dtype: DType) -> Program {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    let p = Program::compile(&engine, LAYER_NORM, "layer norm").expect("compiles");
    p.with_input_dtypes(&[("x", dtype), ("w", dtype), ("b", dtype)]).expect("dtypes")
}

#[test]
fn a_row_wise_kernel_names_its_entry_point_for_rows_in_registers_and_the_buffers_it_reads_by_vectors() {
    for (dtype, width) in [(DType::F32, 4), (DType::BF16, 8), (DType::F16, 8)] {
        let p = layer_norm(dtype);
        let k = &p.plan().kernels[0];
        let r = k.register_rows.as_ref().expect("an entry point for rows in registers");
        assert_eq!(r.entry, format!("{}_regs", k.name));
        // Blocks of up to 1024 threads, one resident: its registers are capped at 64 a thread,
        // as for four blocks of 256.
        assert!(r.source.contains(&format!("void __launch_bounds__(1024, 1) {}(", r.entry)), "{}", r.source);
        assert_eq!(r.max_block, 1024);
        // One row-shaped input kept (x): 32 columns a lane at most.
        assert_eq!((r.cols_per_lane, r.vector), (32, width), "{dtype}");
        // x, w, b and y: four buffers read or written a vector (16 bytes) at a time.
        assert_eq!(r.aligned.len(), 4, "{dtype}: {r:?}");
        assert!(r
            .aligned
            .iter()
            .all(|&(p, bytes)| bytes == 16 && matches!(k.params[p], kfuse_codegen::Param::Buffer(_))));
    }
}

#[test]
fn the_executor_takes_the_entry_point_for_rows_in_registers_only_where_the_rows_fit_and_the_buffers_align() {
    let p = layer_norm(DType::BF16);
    let k = &p.plan().kernels[0];
    let r = k.register_rows.as_ref().expect("an entry point for rows in registers");
    let aligned = |_: usize| Some(0x7f00_0000_0000u64);
    // Up to 1024 lanes a row (the largest block), 32 columns a lane: rows of up to 32,768
    // columns, a multiple of 8; a block of 256 threads (the kernel's) up to 8192 columns, then
    // the smallest larger one that holds the row.
    for (rows, cols, takes, block) in [
        (8192, 4096, true, 256),
        (3, 8, true, 256),
        (1, 1000, true, 256),
        (5, 4100, false, 256),
        (2, 4104, true, 256),
        (7, 8192, true, 256),
        (3, 8200, true, 512),
        (3, 16392, true, 1024),
        (3, 32768, true, 1024),
        (3, 32776, false, 256),
        (4, 12, false, 256),
    ] {
        assert_eq!(r.applies(&k.grid, &[rows, cols], aligned, &[]), takes, "[{rows}, {cols}]");
        assert_eq!(k.launch_block(&[rows, cols]), block, "[{rows}, {cols}]");
    }
    // A buffer off its 16 bytes (a view at an odd offset) takes the entry point for any row.
    let first = r.aligned[0].0;
    let one_off = |p: usize| Some(if p == first { 0x7f00_0000_0008u64 } else { 0x7f00_0000_0000 });
    assert!(!r.applies(&k.grid, &[8192, 4096], one_off, &[]));
    assert!(!r.applies(&k.grid, &[8192, 4096], |_| None, &[]), "an unknown address never takes it");
}

#[test]
fn a_kernel_keeping_two_row_shaped_inputs_keeps_16_columns_a_lane() {
    // Layer norm's input gradient reads x and dy along the row: each lane keeps both.
    let src = "input x: f32[B, D]\ninput w: f32[D]\ninput dy: f32[B, D]\n\
        let mu = mean(x, axis: -1, keepdim: true)\nlet d = x - mu\n\
        let y = d * rsqrt(mean(d * d, axis: -1, keepdim: true) + 0.00001) * w\n\
        output dx = grad(sum(y * dy), x)\n";
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    let p = Program::compile(&engine, src, "layer norm gradient").expect("compiles");
    let k = &p.plan().kernels[0];
    let r = k.register_rows.as_ref().expect("an entry point for rows in registers");
    assert_eq!((r.cols_per_lane, r.vector), (16, 4));
    assert!(r.source.contains("float kf_c0[16];") && r.source.contains("float kf_c2[16];"), "{}", r.source);
    let aligned = |_: usize| Some(0x7f00_0000_0000u64);
    // 16 columns a lane: rows of up to 4096 columns in the kernel's block of 256, up to 16,384
    // in blocks of 1024.
    assert!(r.applies(&k.grid, &[8192, 4096], aligned, &[]));
    assert_eq!(k.launch_block(&[8192, 4096]), 256);
    assert!(r.applies(&k.grid, &[8192, 8192], aligned, &[]));
    assert_eq!(k.launch_block(&[8192, 8192]), 512);
    assert!(!r.applies(&k.grid, &[8192, 16388], aligned, &[]));
}

#[test]
fn layer_norm_weight_gradients_are_summed_by_the_row_kernel_and_folded_by_a_second() {
    // dgamma and dbeta are sums over the rows of values the kernel of dx computes anyway: its
    // entry for rows in registers sums them per column as it goes (a row of partial sums per
    // block), and the column kernel's fold entry folds those rows, reading neither x nor dy
    // again. Where the rows take the other entry, the column kernel reads the rows itself.
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/layer_norm_train.kf"))
        .expect("example");
    let p = Program::compile(&engine, &src, "layer_norm_train.kf").expect("compiles");
    let kernels = &p.plan().kernels;
    assert_eq!(kernels.len(), 2, "{}", p.cuda_source());
    let (rows, columns) = (&kernels[0], &kernels[1]);
    let regs = rows.register_rows.as_ref().expect("an entry point for rows in registers");
    assert!(regs.source.contains("// sink: column sums of"), "{}", regs.source);
    assert!(regs.source.contains("float4 kf_t = *kf_q;"), "a vector of 4 columns at a time:\n{}", regs.source);
    assert!(regs.source.contains("kf_colp[(long long)blockIdx.x * 2 * cols + c] = v;"), "{}", regs.source);
    assert!(!rows.source.contains("kf_colp["), "the entry for any row sums nothing:\n{}", rows.source);
    assert!(columns.source.contains("const float* __restrict__ in0"), "{}", columns.source);
    let fold = columns.fold.as_ref().expect("a fold entry");
    assert_eq!((fold.entry.as_str(), fold.after), (format!("{}_fold", columns.name).as_str(), 0));
    assert!(fold.source.contains("folded from the column partial sums of kernel 1"), "{}", fold.source);
    assert!(!fold.source.contains("__restrict__ in"), "the fold reads no input:\n{}", fold.source);
    assert_eq!(fold.params.last(), Some(&kfuse_codegen::Param::Grid(0)), "its rows are the first kernel's blocks");
    let partials = p
        .plan()
        .buffers
        .iter()
        .position(|d| d.kind == kfuse_codegen::BufferKind::ColumnPartials { kernel: 0 })
        .expect("a buffer of column partial sums");
    assert!(rows.params.contains(&kfuse_codegen::Param::Buffer(partials)));
    assert!(fold.params.contains(&kfuse_codegen::Param::Buffer(partials)));
    assert!(!columns.params.contains(&kfuse_codegen::Param::Buffer(partials)));
    // The rows' grid is one wave of the entry's blocks (4 of 256 threads a multiprocessor, what
    // its bounds promise): 528 on 132 multiprocessors, a row of partial sums each.
    assert_eq!(p.plan().grids(&[8192, 1024], 132, |_, b| b), Ok(vec![528, 32 * 32]));
    // Two sums of D columns per block: 528 blocks of [8192, 1024] need 528 * 2048 floats.
    assert_eq!(p.plan().buffers[partials].elem_count(&[8192, 1024], 528), Some(528 * 2048));
    // The fold's grid splits the rows of partial sums (one per block of the rows' kernel), not the
    // rows: at [8192, 1024] on 132 multiprocessors, 32 tiles of 32 columns, each in 3 chunks of
    // at most 256 of the 528 rows of partial sums, against 32 chunks of the 8192 rows.
    let main = columns.grid.blocks(&[8192, 1024], 132).expect("the column kernel's grid");
    let folded = kfuse_codegen::FoldEntry::blocks(&columns.grid, &[8192, 1024], 132, 528).expect("the fold's grid");
    assert_eq!((main, folded), (32 * 32, 32 * 3));
    // Every entry point is built: the rows', its entry for rows in registers, the columns' and
    // their fold.
    let names: Vec<&str> = kernels.iter().flat_map(|k| k.entries()).map(|e| e.1).collect();
    assert_eq!(names.len(), 4, "{names:?}");
}

#[test]
fn rows_read_through_strides_take_the_entry_for_rows_in_registers_where_each_row_starts_on_a_vector() {
    for (dtype, width) in [(DType::F32, 4i64), (DType::BF16, 8)] {
        let p = layer_norm(dtype).reading_strided(&[0, 1]).expect("x and w read through strides");
        let k = &p.plan().kernels[0];
        let r = k.register_rows.as_ref().expect("an entry point for rows in registers");
        // x is kept, its rows loaded from each row's start through its strides; w is not
        // row-shaped (read at its stride, one element at a time).
        assert_eq!(r.strided_rows, vec![kfuse::InputId(0)], "{dtype}");
        assert!(r.source.contains("const long long kf_sb0 = row * st0_0;"), "{}", r.source);
        assert!(r.source.contains("in0 + kf_sb0 + kf_j"), "{}", r.source);
        assert!(k.source.contains("strided in0 kept where the last axis has stride 1"), "{}", k.source);
        let aligned = |_: usize| Some(0x7f00_0000_0000u64);
        let d = 4096i64;
        let with = |x: Vec<i64>| vec![x, vec![1], vec![1]];
        // Rows of a wider tensor sliced at a multiple of the vector, broadcast rows, contiguous
        // rows: the entry for rows in registers.
        for x in [vec![d + 2 * width, 1], vec![0, 1], vec![d, 1]] {
            assert!(r.applies(&k.grid, &[8192, d as u64], aligned, &with(x.clone())), "{dtype} {x:?}");
        }
        // A row that does not start on a vector, a last axis that is not dense, strides not
        // given: the entry for any row.
        for x in [vec![d + width / 2, 1], vec![1, 8192], vec![2 * d, 2]] {
            assert!(!r.applies(&k.grid, &[8192, d as u64], aligned, &with(x.clone())), "{dtype} {x:?}");
        }
        assert!(!r.applies(&k.grid, &[8192, d as u64], aligned, &[]), "strides not given");
    }
}
