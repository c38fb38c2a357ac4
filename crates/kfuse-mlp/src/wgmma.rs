//! The generated parts of kernels whose hidden layers run on wgmma ([`crate::TensorInstructions::Wgmma`],
//! mlp_wgmma.cuh): the staging of those layers' weights into core-matrix order, the whole-width
//! `KfWgmma<N>` instructions (their operand lists depend on N), and the row form's layer chain,
//! which pipelines a warp's two row tiles across layers. Which layers take wgmma and which form
//! is chosen in kernel.rs. Pure string generation; deterministic.

use std::fmt::Write;

/// One hidden layer as the wgmma templates take it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WgLayer {
    /// Index of the layer in the model (its input fragments are `h<index>`).
    pub index: usize,
    /// k16 chunks of the padded input.
    pub kt: usize,
    /// k16 chunks of the padded output.
    pub nt16: usize,
    pub w_off: usize,
    /// Bias offset (0 without bias).
    pub b_off: usize,
    /// Real output width.
    pub n_real: usize,
    pub has_bias: bool,
    /// Eighths of the SiLU pairs on the FMA pipe (0: none).
    pub fma_eighths: usize,
}

/// `kf_stage_wgmma`: rewrites every wgmma layer's weights in shared memory (see mlp_wgmma.cuh).
pub(crate) fn stage_function(layers: &[WgLayer]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// The wgmma layers' weights from the blob's fragment order into core-matrix order (mlp_wgmma.cuh)."
    );
    let _ = writeln!(s, "__device__ __forceinline__ void kf_stage_wgmma(const unsigned* __restrict__ params, unsigned char* __restrict__ smem) {{");
    for l in layers {
        let _ = writeln!(s, "    kf_stage_wgmma_layer<{}, {}, {}>(params, smem);", l.kt, l.nt16, l.w_off);
    }
    s.push_str("}\n\n");
    s
}

/// `KfWgmma<N>` for each padded width in `widths` (ascending, distinct): d += A (64 x 16, registers)
/// * B (16 x N, shared memory), N / 2 f32 accumulators per thread.
pub(crate) fn instructions(widths: &[usize]) -> String {
    let mut s = String::new();
    for &n in widths {
        let acc = n / 2;
        let d: Vec<String> = (0..acc).map(|i| format!("%{i}")).collect();
        let a: Vec<String> = (acc..acc + 4).map(|i| format!("%{i}")).collect();
        let outs: Vec<String> = (0..acc).map(|i| format!("\"+f\"(d[{i}])")).collect();
        let _ = writeln!(s, "template <>\nstruct KfWgmma<{n}> {{");
        let _ = writeln!(s, "    static __device__ __forceinline__ void mma(float (&d)[{acc}], const unsigned (&a)[4], unsigned long long desc) {{");
        let _ = writeln!(
            s,
            "        asm volatile(\"wgmma.mma_async.sync.aligned.m64n{n}k16.\" KF_WG_TYPES \" {{{}}}, {{{}}}, %{}, 1, 1, 1, 0;\"",
            d.join(","),
            a.join(","),
            acc + 4
        );
        let _ = writeln!(s, "                     : {}", outs.join(", "));
        let _ = writeln!(s, "                     : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(desc)\n                     : \"memory\");");
        s.push_str("    }\n};\n");
    }
    s
}

/// The row form's hidden-layer chain for two row tiles (KF_R = 2), from `h<first>` to the last
/// hidden layer's output `h<last + 1>` (see mlp_wgmma.cuh for the schedule). `act(i)` names layer
/// i's activation struct.
pub(crate) fn row_form_chain(layers: &[WgLayer]) -> String {
    let mut s = String::new();
    let issue = |s: &mut String, l: &WgLayer, r: usize| {
        let _ = writeln!(
            s,
            "    kf_wg_issue<{}, {}, {}, {}, {}>(kf_d{}_{r}, h{}[{r}], smem, kf_desc0, lane);",
            l.kt,
            l.nt16,
            l.w_off,
            l.b_off,
            u8::from(l.has_bias),
            l.index,
            l.index
        );
    };
    let declare = |s: &mut String, l: &WgLayer| {
        let _ = writeln!(
            s,
            "    float kf_d{0}_0[{1}], kf_d{0}_1[{1}];  // layer {0}'s accumulators, row tiles 0 and 1",
            l.index,
            l.nt16 * 8
        );
        let _ = writeln!(s, "    unsigned h{}[KF_R][{}][4];", l.index + 1, l.nt16);
    };
    let Some(first) = layers.first() else { return s };
    declare(&mut s, first);
    issue(&mut s, first, 0);
    issue(&mut s, first, 1);
    for (n, l) in layers.iter().enumerate() {
        let next = layers.get(n + 1);
        if let Some(nx) = next {
            declare(&mut s, nx);
        }
        for r in 0..2 {
            // Pending groups: this layer's tiles r.. and, for r = 1, the next layer's tile 0.
            let wait = if r == 1 && next.is_none() { 0 } else { 1 };
            let _ = writeln!(s, "    kf_wg_wait<{wait}>();");
            let q = if l.fma_eighths > 0 { format!(", {}", l.fma_eighths) } else { String::new() };
            let _ = writeln!(
                s,
                "    kf_wg_act<{}, {}, KfAct{}{q}>(kf_d{}_{r}, h{}[{r}], lane);",
                l.nt16,
                l.n_real,
                l.index,
                l.index,
                l.index + 1
            );
            if let Some(nx) = next {
                issue(&mut s, nx, r);
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(index: usize, kt: usize, nt16: usize) -> WgLayer {
        WgLayer { index, kt, nt16, w_off: 1024 * index, b_off: 0, n_real: nt16 * 16, has_bias: false, fma_eighths: 0 }
    }

    #[test]
    fn chain_waits_for_the_older_group_and_issues_before_the_next_wait() {
        let src = row_form_chain(&[layer(0, 2, 4), layer(1, 4, 2)]);
        let lines: Vec<&str> = src.lines().map(str::trim).filter(|l| l.starts_with("kf_wg_")).collect();
        // Each call as `name(first argument`, e.g. `kf_wg_issue(kf_d0_0`.
        let kinds: Vec<String> = lines
            .iter()
            .map(|l| {
                let name = l.split('<').next().unwrap_or_default();
                let first = l.split(">(").nth(1).and_then(|a| a.split([',', ')']).next()).unwrap_or_default();
                format!("{name}({first}")
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "kf_wg_issue(kf_d0_0",
                "kf_wg_issue(kf_d0_1",
                "kf_wg_wait(",
                "kf_wg_act(kf_d0_0",
                "kf_wg_issue(kf_d1_0",
                "kf_wg_wait(",
                "kf_wg_act(kf_d0_1",
                "kf_wg_issue(kf_d1_1",
                "kf_wg_wait(",
                "kf_wg_act(kf_d1_0",
                "kf_wg_wait(",
                "kf_wg_act(kf_d1_1",
            ]
        );
        let waits: Vec<&str> = lines.iter().filter(|l| l.starts_with("kf_wg_wait")).copied().collect();
        assert_eq!(waits, ["kf_wg_wait<1>();", "kf_wg_wait<1>();", "kf_wg_wait<1>();", "kf_wg_wait<0>();"]);
    }

    #[test]
    fn instruction_operands_follow_the_width() {
        let s = instructions(&[16, 48]);
        assert!(s.contains("m64n16k16.\" KF_WG_TYPES \" {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;"));
        assert!(s.contains("float (&d)[24]") && s.contains("\"+f\"(d[23])") && s.contains("{%24,%25,%26,%27}, %28,"));
    }
}
