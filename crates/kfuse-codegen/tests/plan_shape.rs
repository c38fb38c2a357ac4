//! Plan-shape tests: kernel counts, buffers, parameters, predicate hoisting, vector access, and
//! clear errors for what is not supported.

mod common;

use kfuse_codegen::{
    emit_device_function, plan, BufferKind, CodegenError, CodegenOptions, ElemType, GridSpec, Launch, LengthsGradient,
    Param, SizeExpr,
};
use kfuse_ir::{BinaryOp, DType, Dim, GraphBuilder, InputId, ReduceAxis, ReduceOp, Shape, SymId, UnaryOp};

fn opts() -> CodegenOptions {
    CodegenOptions::default()
}

/// The loop body of a kernel (from the grid-stride loop to the block reduction).
fn body(src: &str) -> &str {
    let start = ["for (kf_index i =", "for (kf_index kf_i0 =", "for (long long i =", "for (long long kf_i0 ="]
        .iter()
        .find_map(|l| src.find(l))
        .expect("grid-stride loop");
    let end = src.find("// Each block reduces").unwrap_or(src.len());
    &src[start..end]
}

#[test]
fn giou_is_one_kernel_with_lazy_pred_and_vector_loads() {
    let g = common::giou(DType::F32, DType::F32).expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    assert_eq!(k.name, format!("kf_{}_0", g.stable_hash().short()));
    let b = body(&k.source);
    // target is read first, as one float4; the branch on valid comes next; pred is read inside.
    let target_load = b.find("reinterpret_cast<const float4*>(in1)[i]").expect("target float4 load");
    let branch = b.find("if (v").expect("predicate branch");
    let pred_load = b.find("reinterpret_cast<const float4*>(in0)[i]").expect("pred float4 load");
    assert!(target_load < branch && branch < pred_load, "pred must be loaded inside the branch:\n{b}");
    assert_eq!(b.matches("in0").count(), 1, "pred is loaded exactly once");
    // One branch in the guarded prefetch (pred is loaded there, for all 4 elements), one in the body.
    assert_eq!(b.matches("if (v").count(), 2, "sum and count share one branch");
    assert!(
        b.contains("kf_pf1[kf_u] = reinterpret_cast<const float4*>(in0)[i];"),
        "pred prefetched under the predicate:\n{b}"
    );
    let branch = b.rfind("if (v").expect("body branch");
    // Batched loop: the target loads of the thread's 4 elements come before the first use.
    assert!(
        b.find("kf_pf0[kf_u] = reinterpret_cast<const float4*>(in1)[i];").expect("prefetch")
            < b.find("if (i >= n) break;").expect("body")
    );
    assert!(k.source.contains("__launch_bounds__(256, 4)"));
    // Both the masked sum and the count accumulate inside that branch.
    let inside = &b[branch..];
    assert!(inside.contains("acc0 +=") && inside.contains("acc1 += 1.0;"));
    // Buffers: 2 inputs, 1 output, partials (2 slots) and a counter.
    let kinds: Vec<BufferKind> = p.buffers.iter().map(|b| b.kind).collect();
    assert_eq!(
        kinds,
        vec![
            BufferKind::Input(InputId(0)),
            BufferKind::Input(InputId(1)),
            BufferKind::Output(0),
            BufferKind::Partials { kernel: 0, slots_per_block: 2 },
            BufferKind::Counter { kernel: 0 },
        ]
    );
    assert_eq!(p.buffers[3].elem, ElemType::F64);
    assert_eq!(p.buffers[4].elem, ElemType::U32);
    assert_eq!(p.buffers[0].elems, SizeExpr { constant: 4, symbols: vec![SymId(0), SymId(1)] });
    assert_eq!(
        k.params,
        vec![
            Param::Buffer(0),
            Param::Buffer(1),
            Param::Buffer(2),
            Param::Buffer(3),
            Param::Buffer(4),
            Param::Size(SymId(0)),
            Param::Size(SymId(1))
        ]
    );
    let GridSpec::Work { work, per_block, max_blocks_per_sm } = &k.grid else { panic!("a work grid: {:?}", k.grid) };
    assert_eq!(work, &SizeExpr { constant: 1, symbols: vec![SymId(0), SymId(1)] });
    assert_eq!((*per_block, *max_blocks_per_sm), (256, 4));
    // The grid formula: B=16384, N=256 on 132 SMs caps at 4 blocks per SM (all resident); B=N=1 still runs one.
    assert_eq!(k.grid.blocks(&[16384, 256], 132), Some(528));
    assert_eq!(k.grid.blocks(&[1024, 256], 132), Some(528));
    assert_eq!(k.grid.blocks(&[0, 256], 132), Some(1));
    assert_eq!(p.buffers[3].elem_count(&[1024, 256], 1024), Some(2048));
    // The ticket is reset by the last block.
    assert!(k.source.contains("*counter = 0u;"));
    assert!(k.source.contains("atomicAdd(counter, 1u)"));
    assert!(!k.source.contains("#include"));
}

#[test]
fn half_precision_inputs_use_8_byte_vectors_and_ptx_conversions() {
    for (dtype, conv) in [(DType::F16, "kf_f16_to_f32"), (DType::BF16, "kf_bf16_to_f32")] {
        let g = common::giou(dtype, dtype).expect("graph");
        let p = plan(&g, &opts()).expect("plan");
        let src = &p.kernels[0].source;
        assert!(src.contains("const unsigned short* __restrict__ in0"));
        assert!(src.contains("reinterpret_cast<const uint2*>(in1)[i]"));
        assert!(src.contains(conv));
        let b = body(src);
        assert!(b.find("if (v").expect("branch") < b.find("(in0)").expect("pred load"));
        assert!(!src.contains("#include") && !src.contains("__half"));
    }
}

/// `softmax(x, axis: -1)` over `[B, C]`: the maximum and the sum of exp (in one pass for rows
/// read from memory), then `y` at each element.
fn softmax_graph() -> kfuse_ir::Graph {
    let mut b = GraphBuilder::new();
    let (bs, cs) = (b.symbol("B"), b.symbol("C"));
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(cs)])).unwrap();
    let m = b.reduce(ReduceOp::Max, ReduceAxis::Last, x, None).unwrap();
    let m = b.expand_last(m);
    let z = b.binary(BinaryOp::Sub, x, m).unwrap();
    let e = b.unary(UnaryOp::Exp, z).unwrap();
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::Last, e, None).unwrap();
    let s = b.expand_last(s);
    let y = b.binary(BinaryOp::Div, e, s).unwrap();
    b.output("y", y).unwrap();
    b.finish().unwrap()
}

#[test]
fn softmax_cross_entropy_loops_over_rows_in_one_kernel() {
    let g = common::softmax_xent().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let src = &p.kernels[0].source;
    // One pass over each row by its lanes: the max with the sum-exp (a running maximum that
    // rescales the sum) and the picked logit. (It also has an entry for rows in registers: a
    // row read once streams faster from memory at 32,000 columns and slower at 1000, measured.)
    let k = &p.kernels[0];
    assert!(k.register_rows.is_some(), "an entry point for rows in registers");
    assert_eq!(src.matches("for (long long j").count(), 1, "{src}");
    assert_eq!(src.matches("in0[rowbase + j").count(), 1, "{src}");
    assert!(src.contains("1 row reduction phase(s) computed once per row"), "{src}");
    // The max and the exp-sum in the one loop, folded as pairs over the row's lanes.
    assert_eq!(src.matches("kf_online_add(om").count(), 1, "{src}");
    assert_eq!(src.matches("kf_row_online(om").count(), 1, "{src}");
    // The label's logit (a sum over the row of where(iota == label, x, 0)) is read once per row
    // at the label, not compared and added at every column; no other sum is folded.
    assert_eq!(src.matches("float p").count(), 0, "{src}");
    assert!(src.contains("gathered along axis 1"), "{src}");
    assert!(!src.contains("folds over the row's lanes"), "{src}");
    // The label is loaded once per row, outside the loops.
    assert_eq!(src.matches("in1[").count(), 1, "{src}");
}

#[test]
fn a_softmax_keeps_its_rows_in_registers_read_once_for_both_of_its_uses() {
    let g = softmax_graph();
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    // The entry point for any row reads the row in the statistics' pass and again for y; the
    // one for rows that fit the lanes' registers loads them once, 4 columns at a time, 32
    // columns a lane at most (x is the one row-shaped input kept).
    let k = &p.kernels[0];
    let src = &k.source;
    let regs = k.register_rows.as_ref().expect("an entry point for rows in registers");
    assert_eq!((regs.entry.as_str(), regs.cols_per_lane, regs.vector), (format!("{}_regs", k.name).as_str(), 32, 4));
    let (any, kept) = (src.as_str(), regs.source.as_str());
    // Its blocks grow for long rows up to 1024 threads, with the 64 registers a thread that 256
    // threads and 4 blocks a multiprocessor would have.
    assert!(kept.contains(&format!("void __launch_bounds__(1024, 1) {}(", regs.entry)), "{kept}");
    assert_eq!(regs.max_block, 1024);
    assert_eq!(any.matches("for (long long j").count(), 1, "the pass; y is the body at each element: {any}");
    assert_eq!(
        kept.matches("const float4 kf_w = *reinterpret_cast<const float4*>(in0 + rowbase + kf_j);").count(),
        1,
        "{kept}"
    );
    assert!(!kept.contains("in0[rowbase + j"), "{kept}");
    // x is read and y stored a vector at a time: the entry point needs both aligned to 16 bytes.
    assert_eq!(regs.aligned.len(), 2, "{regs:?}");
    let mut aligned: Vec<_> = regs.aligned.iter().map(|a| (k.params[a.0], a.1)).collect();
    aligned.sort_by_key(|a| format!("{:?}", a.0));
    assert_eq!(aligned, [(kfuse_codegen::Param::Buffer(0), 16), (kfuse_codegen::Param::Buffer(1), 16)], "{regs:?}");
    // From memory the maximum and the exp-sum take one pass (a running maximum); in registers
    // two passes over the registers, the exps against the row's maximum.
    assert_eq!(any.matches("kf_online_add(om").count(), 1, "{any}");
    assert_eq!(any.matches("kf_row_online(om").count(), 1, "{any}");
    assert!(!kept.contains("kf_online_add(om") && !kept.contains("kf_row_online(om"), "{kept}");
    assert_eq!(kept.matches("= kf_row_max(").count(), 1, "{kept}");
    assert_eq!(kept.matches("for (int t").count(), 2, "two passes over the registers: {kept}");
}

#[test]
fn reduction_feeding_elementwise_splits_into_two_kernels_through_a_temp() {
    let g = common::normalize().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 2);
    let temp = p.buffers.iter().position(|b| b.kind == BufferKind::Temp).expect("temp");
    assert_eq!(p.buffers[temp].elem, ElemType::Tensor(DType::F32));
    assert!(p.kernels[0].params.contains(&Param::Buffer(temp)));
    assert!(p.kernels[1].params.contains(&Param::Buffer(temp)));
    assert!(p.kernels[0].source.contains("tmp0[0] = "));
    assert!(p.kernels[1].source.contains("const float* __restrict__ tmp0"));
    // The second kernel has no reduction, hence no partials or counter.
    assert!(!p.kernels[1].source.contains("partials"));
    assert_eq!(p.kernels[1].name, format!("kf_{}_1", g.stable_hash().short()));
}

#[test]
fn elementwise_outputs_fuse_and_store_vectors() {
    let g = common::elementwise().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let src = &p.kernels[0].source;
    assert!(src.contains("kf_st_cs(reinterpret_cast<float4*>(out1) + i, make_float4("), "{src}");
    assert!(src.contains("out0[i] = kf_f32_to_f16("), "{src}");
    // Elementwise by rows: the broadcast bias is read at the column, with no per-element division.
    assert!(src.contains("elementwise by rows of the last axis"), "{src}");
    assert!(src.contains("= in1[col]; // bias"), "{src}");
    assert!(!src.contains("kf_mod") && !src.contains("kf_div"), "{src}");
    // Rows in registers: x is loaded and the bias read a vector at a time, y stored 4 halves at once.
    let regs = p.kernels[0].register_rows.as_ref().expect("an entry point for rows in registers");
    assert_eq!(regs.vector, 4);
    let kept = &regs.source;
    assert!(kept.contains(&format!("{}(", regs.entry)), "{kept}");
    assert!(kept.contains("kf_p0[kf_v] = *reinterpret_cast<const float4*>(in0 + kf_base1 + kf_j)"), "{src}");
    assert!(kept.contains("*reinterpret_cast<const float4*>(in1 + kf_j)"), "{src}");
    assert!(kept.contains("*reinterpret_cast<uint2*>(out0 + rowbase + kf_j) = make_uint2("), "{src}");
    assert!(!src.contains("atomicAdd"));
}

#[test]
fn lengths_mask_runs_one_warp_per_row_over_column_ranges() {
    let g = common::masked_delta_lengths().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    // Kernel 0: the output and the masked sum and count share the mask, so one row-mode kernel.
    let k = &p.kernels[0];
    let src = &k.source;
    assert!(src.contains("const int v0 = in2[row];"), "the bound is read once per row:\n{src}");
    assert!(src.contains("for (long long col = lane; col < kf_hi; col += 32)"));
    // Padding is one zero byte range per row, 16-byte streaming stores, filled before the valid columns.
    let fill = src.find("const long long kf_za = rowbase + kf_hi, kf_zb = rowbase + sz1;").expect("zero fill");
    assert!(src.contains("for (long long e = kf_za + lane; e < kf_zb; e += 32) kf_st_cs(reinterpret_cast<uint4*>(out0) + e, make_uint4(0u, 0u, 0u, 0u));"));
    assert!(!src.contains("kf_div") && !src.contains("kf_mod") && !src.contains(" / (sz"), "no per-element division");
    // The valid range loads pred and target; the fill loads nothing.
    let valid = src.find("for (long long col = lane; col < kf_hi; col += 32)").expect("valid loop");
    assert!(fill < valid);
    let valid_loop = &src[valid..];
    assert!(valid_loop.contains("in0") && valid_loop.contains("in1") && valid_loop.contains("acc1 += 1.0;"));
    assert!(!src[fill..valid].contains("in0") && !src[fill..valid].contains("in1"));
    // The grid counts rows, 8 warps (rows) per 256-thread block.
    let GridSpec::Work { work, per_block, .. } = &k.grid else { panic!("a work grid: {:?}", k.grid) };
    assert_eq!(work, &SizeExpr { constant: 1, symbols: vec![SymId(0)] });
    assert_eq!(*per_block, 8);
    assert_eq!(k.lazy_inputs, vec![InputId(0), InputId(1)]);
}

/// Symbols `B`, `N` and inputs `pred`, `target` of f32 boxes `[B, N, 4]`.
fn padded_boxes(b: &mut GraphBuilder) -> (SymId, SymId, kfuse_ir::NodeId, kfuse_ir::NodeId) {
    let (bs, n) = (b.symbol("B"), b.symbol("N"));
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]);
    let pred = b.input("pred", DType::F32, shape.clone()).expect("input");
    let target = b.input("target", DType::F32, shape).expect("input");
    (bs, n, pred, target)
}

/// `1 / max(count(valid), 1)` in f32: a masked mean's scale.
fn unit_over_count(b: &mut GraphBuilder, valid: kfuse_ir::NodeId) -> kfuse_ir::NodeId {
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None).expect("count");
    let one_i = b.lit_int(1);
    let denom = b.binary(BinaryOp::Max, count, one_i).expect("max");
    let denom = b.cast(denom, DType::F32);
    let one = b.lit_float(1.0);
    b.binary(BinaryOp::Div, one, denom).expect("div")
}

/// `where(valid[.., None], (pred - target) * s^factors, 0)` with `s = 1 / max(count(valid), 1)`.
fn scaled_masked_delta(factors: u32) -> kfuse_ir::Graph {
    scaled_delta(factors, false)
}

/// The same with `valid = iota(N) < lengths[.., None]` (what `mask(lengths)` lowers to) when
/// `lengths`, else `valid = target[.., 3] != 0`.
fn scaled_delta(factors: u32, lengths: bool) -> kfuse_ir::Graph {
    let mut b = GraphBuilder::new();
    let (bs, n, pred, target) = padded_boxes(&mut b);
    let zero = b.lit_float(0.0);
    let valid = if lengths {
        let lengths = b.input("lengths", DType::I32, Shape(vec![Dim::Sym(bs)])).expect("input");
        let iota = b.iota(Shape(vec![Dim::Sym(bs), Dim::Sym(n)]), 1).expect("iota");
        let l1 = b.expand_last(lengths);
        b.binary(BinaryOp::Lt, iota, l1).expect("lt")
    } else {
        let y2 = b.component(target, 3).expect("component");
        b.binary(BinaryOp::Ne, y2, zero).expect("ne")
    };
    let s = unit_over_count(&mut b, valid);
    let mut v = b.binary(BinaryOp::Sub, pred, target).expect("sub");
    for _ in 0..factors {
        v = b.binary(BinaryOp::Mul, v, s).expect("mul");
    }
    let v1 = b.expand_last(valid);
    let out = b.select(v1, v, zero).expect("select");
    b.output("grad", out).expect("output");
    b.finish().expect("graph")
}

#[test]
fn lengths_scaled_gradient_is_one_row_mode_pass() {
    // Lengths layout, asked for two kernels: row groups for the count, a warp per row for the
    // gradient.
    let two = CodegenOptions { lengths_gradient: LengthsGradient::TwoKernels, ..opts() };
    let p = plan(&scaled_delta(1, true), &two).expect("plan");
    assert_eq!(p.kernels.len(), 2);
    assert!(p.kernels.iter().all(|k| k.launch == Launch::Plain));
    // By default (one pass): the rows plan, one cooperative launch. The block splits its warps
    // after its first tile's bounds: fill warps store the padding only and never wait; compute
    // warps arrive with the block's count, load their first valid elements, wait for every
    // block, take the scale, then compute and store the valid elements.
    let one_pass = CodegenOptions { lengths_gradient: LengthsGradient::OnePass, ..opts() };
    let p = plan(&scaled_delta(1, true), &one_pass).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    assert_eq!(k.launch, Launch::Cooperative);
    assert_eq!(k.block, 512);
    let src = &k.source;
    assert!(!src.contains("list_index") && !src.contains("tmp0"), "no list, no temp:\n{src}");
    let split = src.find("const int kf_cw = kf_cws;").expect("the split of the warps");
    let fill_role = src.find("if (kf_w >= kf_cw) {").expect("the fill warps");
    let fill = src.find("if (kf_k0 >= kf_hb) kf_st_cs(kf_zp + kf_q, ").expect("zero fill of the padding only");
    let fill_end =
        src.find("kf_bar(2, kf_fn); // kf_hf is rewritten by the next tile").expect("the fill warps' own barrier");
    let arrive = src.find("atomicAdd(kf_arrive, (1ull << 40) | ").expect("the arrival with the block's count");
    let wait = src.find("while ((kf_x >> 40) < gridDim.x);").expect("the wait for every block");
    let scale = src.find("kf_c0 = ").expect("the scale from the count");
    let loads = src.find("kf_pf0[kf_u] = ").expect("the valid elements' loads");
    let store = src.find("reinterpret_cast<float4*>(out0)[i] = ").expect("the valid elements' stores");
    assert!(
        split < fill_role
            && fill_role < fill
            && fill < fill_end
            && fill_end < arrive
            && arrive < loads
            && loads < wait
            && wait < scale
            && scale < store,
        "{src}"
    );
    assert!(
        !src[fill_role..fill_end].contains("kf_c0") && !src[fill_role..fill_end].contains("kf_arrive"),
        "the fill never waits:\n{src}"
    );
    assert_eq!(
        src.matches("reinterpret_cast<float4*>(out0)[i] = ").count(),
        1,
        "each valid element is stored once:\n{src}"
    );
    // No loss: no partials, but the ticket that resets the arrival word.
    assert!(!src.contains("partials") && !src.contains("acc0"), "no partials:\n{src}");
    assert!(
        src.contains("kf_last = atomicAdd(counter, 1u) == gridDim.x - 1u;") && src.contains("*kf_arrive = 0ull;"),
        "{src}"
    );
    assert!(!p.buffers.iter().any(|b| matches!(b.kind, BufferKind::Partials { .. })), "no partials buffer");
    assert!(
        p.buffers.iter().any(|b| b.kind == BufferKind::Counter { kernel: 0 } && b.elems == SizeExpr::constant(4)),
        "ticket, spare, arrival word"
    );
    let GridSpec::Work { per_block, max_blocks_per_sm, .. } = &k.grid else { panic!("a work grid: {:?}", k.grid) };
    assert_eq!((*per_block, *max_blocks_per_sm), (8, 2));
    assert!(!p.buffers.iter().any(|b| matches!(b.kind, BufferKind::Scratch { .. })), "no list buffers");
}

#[test]
fn rows_plan_takes_the_count_from_the_arrival_word_with_no_partial_slot() {
    let g = common::lengths_mean_and_gradient(true).expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let src = &p.kernels[0].source;
    // One arrival per block, with the count of its rows (its first tile's prefix, and its further
    // rows summed by the compute warps).
    let decl = src.find("double kf_cntd = 0.0;").expect("the count at function scope");
    let further = src
        .find("for (long long kf_r = kf_ra + kf_nr0 + threadIdx.x; kf_r < kf_rb; kf_r += kf_cn) {")
        .expect("the further rows' bounds");
    let arrive = src.find("(unsigned long long)(kf_n + kf_hp[kf_nr0]));").expect("the arrival");
    let count =
        src.find("kf_cntd = (double)(long long)(kf_x & ((1ull << 40) - 1ull));").expect("the count from the word");
    assert!(decl < further && further < arrive && arrive < count, "{src}");
    assert_eq!(src.matches("atomicAdd(kf_arrive").count(), 1, "one arrival:\n{src}");
    // The count is neither accumulated per element nor given a partial slot: one slot (the
    // loss's sum), and the tail reads the last block's count after the fold.
    assert!(!src.contains("+= 1.0") && !src.contains("acc1") && !src.contains("partials[1u"), "no count slot:\n{src}");
    assert!(src.contains("double* __restrict__ partials, // 1 f64 partial slots per block"), "{src}");
    assert!(
        src.contains(": the count of the mask, each block's sum of the clamped bounds (kf_cntd), no partial slot"),
        "the sink header says so"
    );
    let fold = src.find("r0 = r0 + __shfl_xor_sync(0xffffffffu, r0, o);").expect("the fold of the loss's slot");
    let read = src.rfind("= (int)(long long)kf_cntd;").expect("the tail reads the count");
    assert!(fold < read, "{src}");
    assert!(
        p.buffers
            .iter()
            .any(|b| b.kind == BufferKind::Partials { kernel: 0, slots_per_block: 1 }
                && b.elems == SizeExpr::constant(1)),
        "host partials sized for one slot"
    );
    // Two kernels: the count keeps its slot there, accumulated per element; the loss's sum moves
    // into the gradient's kernel, which reads the boxes anyway.
    let two = plan(&g, &CodegenOptions { lengths_gradient: LengthsGradient::TwoKernels, ..opts() }).expect("plan");
    assert_eq!(two.kernels.len(), 2);
    assert!(
        two.kernels[0].source.contains("acc0 += 1.0;") && !two.kernels[0].source.contains("acc1"),
        "the count alone:\n{}",
        two.kernels[0].source
    );
    assert!(two.buffers.iter().any(|b| b.kind == BufferKind::Partials { kernel: 0, slots_per_block: 1 }));
    assert!(two.buffers.iter().any(|b| b.kind == BufferKind::Partials { kernel: 1, slots_per_block: 1 }));
}

#[test]
fn scaled_masked_gradient_is_listed_in_one_pass() {
    // Linear in the crossing scale: one cooperative kernel queues the valid elements, computes
    // them with full sets of lanes and lists their unscaled values; past its grid barrier every
    // block folds the partials itself and rescales the entries it listed.
    let p = plan(&scaled_masked_delta(1), &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].launch, Launch::Cooperative);
    let k0 = &p.kernels[0].source;
    assert!(k0.contains("kf_q[atomicAdd(&kf_qn, 1)] = i;"), "the valid elements are queued:\n{k0}");
    assert!(k0.contains("if (kf_slot < KF_LCAP) {"), "the drain lists them in shared memory first:\n{k0}");
    assert!(!k0.contains("atomicAdd(list"), "no global list counter:\n{k0}");
    assert!(
        k0.contains("} else {") && k0.contains("make_float4(0.0f, 0.0f, 0.0f, 0.0f)"),
        "the zeros are written in the loop"
    );
    let arrive = k0.find("atomicAdd(counter, 1u); // grid barrier: arrive").expect("arrival");
    let wait = k0.find("while (((volatile unsigned int*)counter)[0] < gridDim.x)").expect("every block waits for all");
    let fold = k0.find("r0 += ((volatile double*)partials)").expect("every block folds");
    let rescale = k0.find("kf_s * kf_h[0]").expect("rescale");
    let leave = k0.find("atomicAdd(counter + 1, 1u) == gridDim.x - 1u").expect("the last to leave resets");
    assert!(
        arrive < wait && wait < fold && fold < rescale && rescale < leave,
        "the rescale runs past the barrier:\n{k0}"
    );
    assert!(
        k0.contains("for (int kf_j = threadIdx.x; kf_j < kf_ln; kf_j += blockDim.x)"),
        "each block walks its own list:\n{k0}"
    );
    assert!(p
        .buffers
        .iter()
        .any(|b| b.kind == BufferKind::Partials { kernel: 0, slots_per_block: 1 } && b.elem == ElemType::F64));
    assert!(
        p.buffers.iter().any(|b| b.kind == BufferKind::Counter { kernel: 0 } && b.elems == SizeExpr::constant(2)),
        "barrier arrivals and departures"
    );
    assert_eq!(p.buffers.iter().filter(|b| b.kind == BufferKind::Scratch { kernel: 0 }).count(), 2);
    // Quadratic in the scale: the two-kernel plan, whose second kernel re-reads the predicate.
    let p = plan(&scaled_masked_delta(2), &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 2);
    assert!(p.kernels.iter().all(|k| k.launch == Launch::Plain));
    assert!(!p.kernels[0].source.contains("kf_list_n"));
    assert!(p.kernels[1].source.contains("in1"), "{}", p.kernels[1].source);
    assert!(!p.buffers.iter().any(|b| matches!(b.kind, BufferKind::Scratch { .. })));
}

/// A masked mean and its gradient as a traced backward writes it: the mask applied to the scale
/// before the chain rule, `where(valid, s, 0)[.., None] * (pred - target)`, with the loss
/// `sum((pred - target)[.., 0]^2 where valid) * s` (`reads_sum`: the gradient scaled by the sum
/// too).
fn mask_inside(variant: &str) -> kfuse_ir::Graph {
    let mut b = GraphBuilder::new();
    let (_, _, pred, target) = padded_boxes(&mut b);
    let zero = b.lit_float(0.0);
    let y2 = b.component(target, 3).expect("component");
    let valid = b.binary(BinaryOp::Ne, y2, zero).expect("ne");
    let s = unit_over_count(&mut b, valid);
    let h = b.binary(BinaryOp::Sub, pred, target).expect("sub");
    let h0 = b.component(h, 0).expect("component");
    let per = b.binary(BinaryOp::Mul, h0, h0).expect("mul");
    let total = b.reduce(ReduceOp::Sum, ReduceAxis::All, per, Some(valid)).expect("sum");
    let loss = b.binary(BinaryOp::Mul, total, s).expect("mul");
    b.output("loss", loss).expect("output");
    let scale = if variant == "reads_sum" { b.binary(BinaryOp::Mul, s, total).expect("mul") } else { s };
    let w = b.select(valid, scale, zero).expect("select");
    let w1 = b.expand_last(w);
    let out = b.binary(BinaryOp::Mul, w1, h).expect("mul");
    b.output("grad", out).expect("output");
    b.finish().expect("graph")
}

#[test]
fn a_loss_summed_beside_its_gradient_moves_into_the_gradient_kernel() {
    // The mask applied inside (`where(valid, s, 0) * h`) is not the one-pass form: two kernels.
    // The first computes only the count the scale needs, reading the targets; the loss's sum
    // moves into the second, which reads every box anyway, and each box is loaded once there.
    let p = plan(&mask_inside("masked"), &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 2);
    assert!(p.kernels.iter().all(|k| k.launch == Launch::Plain));
    let (k0, k1) = (&p.kernels[0].source, &p.kernels[1].source);
    assert!(k0.contains("acc0 += 1.0;") && !k0.contains("acc1"), "the count alone:\n{k0}");
    assert!(!body(k0).contains("(in0)"), "no prediction is read for the count:\n{k0}");
    assert!(k1.contains("double acc0 = 0.0; // sum"), "the loss's sum:\n{k1}");
    assert_eq!(body(k1).matches("(in0)[i]").count(), 1, "pred loaded once:\n{k1}");
    // The gradient (under no predicate) comes first; the loss's branch reuses its values.
    let b1 = body(k1);
    let (store, branch) = (b1.find("(out1)[i]").expect("the gradient's store"), b1.rfind("if (v").expect("the branch"));
    assert!(store < branch, "the gradient before the loss's branch:\n{k1}");
    let branch_body = &b1[branch..b1[branch..].find("acc0 +=").map_or(b1.len(), |e| branch + e)];
    assert!(branch_body.matches("const float").count() <= 2, "the branch computes the loss again:\n{k1}");
    assert!(p.buffers.iter().any(|b| b.kind == BufferKind::Partials { kernel: 1, slots_per_block: 1 }));
    // The count loads one float4 an element and takes the 4 elements a batch of the options; the
    // gradient loads two and takes 2, so that a batch's loads hold 16 registers in both.
    assert!(k0.contains("float4 kf_pf0[4]; // target"), "4 elements a batch:\n{k0}");
    assert!(k1.contains("float4 kf_pf1[2];") && !k1.contains("[4];"), "2 elements a batch:\n{k1}");
    // A sum that the gradient reads stays where it is.
    let p = plan(&mask_inside("reads_sum"), &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 2);
    assert!(p.kernels[0].source.contains("acc1"), "the count and the sum:\n{}", p.kernels[0].source);
}

#[test]
fn masked_tensor_output_shares_the_count_branch() {
    let g = common::masked_delta().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    let b = body(&p.kernels[0].source);
    assert_eq!(b.matches("if (v").count(), 2, "the guarded prefetch and the body share the predicate:\n{b}");
    assert!(b.contains("} else {"));
    assert!(b.find("if (v").expect("branch") < b.find("(in0)").expect("pred load"));
}

#[test]
fn odd_component_counts_fall_back_to_scalar_access() {
    let mut b = GraphBuilder::new();
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(n), Dim::Const(3)])).expect("input");
    let two = b.lit_float(2.0);
    let y = b.binary(BinaryOp::Mul, x, two).expect("mul");
    b.output("y", y).expect("output");
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None).expect("sum");
    b.output("s", s).expect("output");
    let g = b.finish().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let src = &p.kernels[0].source;
    assert!(src.contains("in0[i * 3 + 2]") && src.contains("out0[i * 3 + 2] = "), "{src}");
}

#[test]
fn constant_only_outputs_get_a_one_element_kernel() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, Shape::scalar()).expect("input");
    let y = b.unary(UnaryOp::Exp, x).expect("exp");
    b.output("y", y).expect("output");
    let g = b.finish().expect("graph");
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    assert!(p.kernels[0].source.contains("if (blockIdx.x == 0 && threadIdx.x == 0)"));
    assert!(p.kernels[0].source.contains("out0[0] = "));
}

#[test]
fn rows_plan_refuses_a_block_size_it_cannot_honour() {
    let g = common::lengths_mean_and_gradient(true).expect("graph");
    let with = |block_size, lengths_gradient| CodegenOptions { block_size, lengths_gradient, ..opts() };
    // The default block size stands for the rows plan's 512 threads; 512 itself is honoured.
    let default = plan(&g, &opts()).expect("plan");
    assert_eq!(default.kernels.len(), 1);
    assert_eq!(default.kernels[0].block, 512);
    assert!(default.kernels[0].source.contains("block_size=512"), "{}", default.kernels[0].source);
    assert_eq!(plan(&g, &with(512, LengthsGradient::OnePass)), Ok(default));
    // Any other block size is refused with a message that says what would work.
    for block_size in [128, 1024] {
        let err = plan(&g, &with(block_size, LengthsGradient::OnePass)).expect_err("refused");
        assert_eq!(err, CodegenError::RowsPlanBlockSize { block_size, rows_block: 512 });
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("block size {block_size}"))
                && msg.contains("--lengths-gradient two-kernels")
                && !msg.contains("TwoKernels"),
            "{msg}"
        );
        // The two-kernel plan honours it.
        let two = plan(&g, &with(block_size, LengthsGradient::TwoKernels)).expect("plan");
        assert!(two.kernels.iter().all(|k| k.block == block_size), "{two:?}");
    }
    // A graph without the rows plan takes any valid block size.
    let giou = common::giou(DType::F32, DType::F32).expect("graph");
    assert_eq!(plan(&giou, &with(128, LengthsGradient::OnePass)).expect("plan").kernels[0].block, 128);
}

#[test]
fn errors_are_values_that_say_what_is_wrong() {
    let g = common::giou(DType::F32, DType::F32).expect("graph");
    let with = |block_size, elems_per_thread| CodegenOptions { block_size, elems_per_thread, ..opts() };
    assert_eq!(plan(&g, &with(100, 4)), Err(CodegenError::BadBlockSize { block_size: 100 }));
    assert_eq!(plan(&g, &with(2048, 4)), Err(CodegenError::BadBlockSize { block_size: 2048 }));
    assert_eq!(plan(&g, &with(256, 0)), Err(CodegenError::BadElemsPerThread { elems_per_thread: 0 }));
    assert_eq!(plan(&g, &with(256, 17)), Err(CodegenError::BadElemsPerThread { elems_per_thread: 17 }));
    let threads = |batched_threads_per_sm| CodegenOptions { batched_threads_per_sm, ..opts() };
    assert_eq!(plan(&g, &threads(300)), Err(CodegenError::BadThreadsPerSm { threads: 300, block_size: 256 }));
    assert_eq!(plan(&g, &threads(4096)), Err(CodegenError::BadThreadsPerSm { threads: 4096, block_size: 256 }));
    let k = &plan(&g, &threads(768)).expect("plan").kernels[0];
    assert!(
        k.source.contains("__launch_bounds__(256, 3)") && k.source.contains("batched_threads_per_sm=768"),
        "{}",
        k.source
    );
    let GridSpec::Work { max_blocks_per_sm, .. } = &k.grid else { panic!("a work grid: {:?}", k.grid) };
    assert_eq!(*max_blocks_per_sm, 3);
    // Two float4 inputs an element: 8 elements requested are 4 (the batch's loads hold 32 registers).
    let eight = plan(&g, &with(256, 8)).expect("plan");
    assert!(
        eight.kernels[0].source.contains("elems_per_thread=8") && eight.kernels[0].source.contains("kf_pf0[4]"),
        "{}",
        eight.kernels[0].source
    );
    let empty = GraphBuilder::new().finish().expect("graph");
    assert_eq!(plan(&empty, &opts()), Err(CodegenError::NoOutputs));
    // A device function of a tensor graph names the offending input.
    match emit_device_function(&g, "f") {
        Err(CodegenError::DeviceFunctionInput { name, .. }) => assert_eq!(name, "pred"),
        other => panic!("expected DeviceFunctionInput, got {other:?}"),
    }
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, Shape::scalar()).expect("input");
    b.output("y", x).expect("output");
    let g = b.finish().expect("graph");
    assert!(matches!(emit_device_function(&g, "2bad"), Err(CodegenError::BadFunctionName { .. })));
    let msg = CodegenError::BadBlockSize { block_size: 100 }.to_string();
    assert!(msg.contains("multiple of 32"), "{msg}");
}

#[test]
fn device_function_is_a_header_free_float_function() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, Shape::scalar()).expect("input");
    let s = b.unary(UnaryOp::Sigmoid, x).expect("sigmoid");
    let y = b.binary(BinaryOp::Mul, x, s).expect("mul");
    b.output("silu", y).expect("output");
    let g = b.finish().expect("graph");
    let src = emit_device_function(&g, "act_silu").expect("device fn");
    expect_test::expect![[r#"
        // kfuse device function for graph e0ebfac400a7e7b86c3353db97dbc0a0b62965055ec25abd90a7da1a33081b93: output silu
        __device__ __forceinline__ float act_silu(float in0 /* x */) {
            const float v0 = 1.0f / (1.0f + expf(-in0)); // n1
            const float v1 = in0 * v0; // n2
            return v1;
        }
    "#]]
    .assert_eq(&src);
}

/// `x - max(x, axis: -1)[.., None]` over `[B, C]`, and `mean(-sum(t * x, axis: -1))` beside it.
fn row_graph() -> kfuse_ir::Graph {
    let mut b = GraphBuilder::new();
    let (bs, cs) = (b.symbol("B"), b.symbol("C"));
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(cs)]);
    let x = b.input("x", DType::F32, shape.clone()).unwrap();
    let t = b.input("t", DType::F32, shape).unwrap();
    let m = b.reduce(ReduceOp::Max, ReduceAxis::Last, x, None).unwrap();
    let m = b.expand_last(m);
    let z = b.binary(BinaryOp::Sub, x, m).unwrap();
    b.output("z", z).unwrap();
    let tz = b.binary(BinaryOp::Mul, t, z).unwrap();
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::Last, tz, None).unwrap();
    let l = b.reduce(ReduceOp::Mean, ReduceAxis::All, s, None).unwrap();
    b.output("loss", l).unwrap();
    b.finish().unwrap()
}

#[test]
fn a_row_reduction_used_again_in_its_row_is_computed_once_per_row() {
    let g = row_graph();
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1, "z over [B, C], the loss once per row in the same kernel");
    // The maximum, then the sum that reads it, each folded over the row's lanes once per row; the
    // loss's row result once per row by lane 0, into the mean; z at each element.
    let k = &p.kernels[0];
    let src = &k.source;
    assert!(src.contains("2 row reduction phase(s) computed once per row, then the body at each element"), "{src}");
    assert!(src.contains("into partial slot 0, once per row"), "{src}");
    assert!(src.contains("if (kf_live && lane == 0) {"), "{src}");
    assert_eq!(src.matches("kf_row_max(").count(), 2, "the helper and one call:\n{src}");
    let regs = &k.register_rows.as_ref().expect("an entry point for rows in registers").source;
    assert_eq!(regs.matches("kf_row_max(").count(), 2, "the helper and one call in its own unit:\n{regs}");
    assert!(!src.contains("for (long long j0 = 0;"), "no serial loop over a row:\n{src}");
    assert!(src.contains("in0[rowbase + j"), "rows are read at rowbase + column:\n{src}");
    assert!(regs.contains("*reinterpret_cast<const float4*>(in0 + rowbase + kf_j)"), "or kept in registers:\n{regs}");
    assert!(!src.contains("tmp0[row]"), "no row value goes to a later kernel:\n{src}");
    // Either entry: the sum of t * z adds a lane's columns in f32 and converts its partial once
    // for the f64 fold.
    for unit in [src, regs] {
        assert_eq!(unit.matches("float p").count(), 1, "one f32 partial:\n{unit}");
        assert!(unit.contains("(double)p") && unit.contains("// the lane's columns, added in f32"), "{unit}");
    }
    // Row groups are powers of two: a thread's row in its block is a shift, not a division.
    for unit in [src, regs] {
        assert!(unit.contains("(threadIdx.x >> kf_lg)") && !unit.contains("/ kf_g"), "{unit}");
    }
    // The grid follows the row length: 4 to 256 lanes a row.
    let GridSpec::Rows { rows, cols, block, max_blocks_per_sm } = &k.grid else { panic!("a rows grid: {:?}", k.grid) };
    assert_eq!(
        (rows, cols, *block),
        (&SizeExpr { constant: 1, symbols: vec![SymId(0)] }, &SizeExpr { constant: 1, symbols: vec![SymId(1)] }, 256)
    );
    assert_eq!(*max_blocks_per_sm, 8);
    // 4 lanes a row for 16 columns (64 rows a block), a whole block for 4096.
    assert_eq!(k.grid.blocks(&[6400, 16], 132), Some(100));
    assert_eq!(k.grid.blocks(&[100, 4096], 132), Some(100));
    assert_eq!(k.grid.blocks(&[1_000_000, 4096], 132), Some(8 * 132));
    assert_eq!(k.grid.blocks(&[0, 7], 132), Some(1), "one block at least");
}

#[test]
fn row_groups_take_about_eight_columns_a_lane() {
    use kfuse_codegen::row_lanes;
    assert_eq!(row_lanes(0, 256), 4);
    assert_eq!(row_lanes(16, 256), 4);
    assert_eq!(row_lanes(33, 256), 8);
    assert_eq!(row_lanes(1000, 256), 128);
    assert_eq!(row_lanes(1024, 256), 128);
    assert_eq!(row_lanes(4096, 256), 256, "at most the block");
    assert_eq!(row_lanes(u64::MAX, 1024), 1024);
}

#[test]
fn a_leading_axis_reduction_is_split_over_chunks_of_rows_per_tile_of_columns() {
    use kfuse_codegen::column_chunks;
    let mut b = GraphBuilder::new();
    let (bs, ds) = (b.symbol("B"), b.symbol("D"));
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(ds)])).unwrap();
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::Axes { mask: 1, keepdim: false }, x, None).unwrap();
    b.output("s", s).unwrap();
    let g = b.finish().unwrap();
    let p = plan(&g, &opts()).expect("plan");
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    assert!(k.source.contains("1 reduction(s) over the leading axis split in chunks of rows"), "{}", k.source);
    assert!(!k.source.contains("for (long long j0 = 0;"), "no thread walks every row:\n{}", k.source);
    // Partials per block (32 columns of one accumulator) and a ticket per tile.
    let partials = p.buffers.iter().find(|d| matches!(d.kind, BufferKind::Partials { .. })).expect("partials");
    assert_eq!(partials.kind, BufferKind::Partials { kernel: 0, slots_per_block: 32 });
    let GridSpec::Columns { lanes, .. } = &k.grid else { panic!("a columns grid: {:?}", k.grid) };
    assert_eq!(*lanes, 8);
    // 132 SMs: 16 blocks each over the tiles, no chunk under 256 rows, one chunk at least.
    assert_eq!(column_chunks(4096, 8192, 132), 17); // 128 tiles: 2112 / 128 -> 17 chunks of 482 rows
    assert_eq!(column_chunks(1024, 8192, 132), 32); // 32 tiles: 66 wanted, 32 chunks of 256 rows
    assert_eq!(column_chunks(64, 600, 132), 3); // 2 tiles, 600 rows: 3 chunks of 256 at most
    assert_eq!(column_chunks(64, 100, 132), 1);
    assert_eq!(column_chunks(1_000_000, 8192, 132), 1);
    assert_eq!(column_chunks(0, 0, 132), 1);
    assert_eq!(k.grid.blocks(&[8192, 4096], 132), Some(128 * 17));
    assert_eq!(k.grid.blocks(&[8192, 0], 132), Some(1));
}

#[test]
fn rows_longer_than_a_block_holds_in_registers_take_a_larger_block_and_a_grid_for_it() {
    let g = softmax_graph();
    let p = plan(&g, &opts()).expect("plan");
    let k = &p.kernels[0];
    assert_eq!(k.block, 256);
    let sym = |name: &str| g.symbols.iter().position(|s| s == name).expect("symbol");
    let (b, c) = (sym("B"), sym("C"));
    let at = |rows: u64, cols: u64| {
        let mut sizes = vec![0u64; g.symbols.len()];
        (sizes[b], sizes[c]) = (rows, cols);
        sizes
    };
    // (cols, the launch's block): 32 columns a lane, 4 a vector; a row that does not fit any
    // block of the entry, or is not a whole number of vectors, keeps the kernel's block.
    for (cols, block) in
        [(1000, 256), (8192, 256), (8196, 512), (16384, 512), (32000, 1024), (32768, 1024), (32772, 256), (32001, 256)]
    {
        assert_eq!(k.launch_block(&at(2097, cols)), block, "{cols} columns");
    }
    // One row a block of 1024 at 32,000 columns, two blocks a multiprocessor (the threads a
    // multiprocessor of the kernel's 256-thread blocks): 264 blocks on 132; the other entry
    // strides over the rows with the same grid.
    let grids = p.grids(&at(2097, 32000), 132, |_, b| b).expect("grids");
    assert_eq!(grids, vec![264]);
    assert_eq!(
        p.grids(&at(2097, 1000), 132, |_, b| b).expect("grids"),
        vec![k.grid.blocks(&at(2097, 1000), 132).unwrap()]
    );
}
