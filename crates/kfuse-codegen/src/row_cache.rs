//! Rows kept in registers: a row-wise kernel whose rows fit its lanes' registers (at most
//! [`ROW_CACHE_SLOTS`] columns a lane, or [`ROW_CACHE_SLOTS_ONE_INPUT`] when one row-shaped
//! input is kept), whose row length is a multiple of the vector's columns
//! ([`RowCache::width`]: 4, or 8 of 2-byte dtypes) and whose buffers are aligned to vectors, loads each row-shaped input of a row once, a vector at
//! a time, into an array per lane; every phase's pass and the body read the array instead of
//! memory. The body runs the lane's columns in groups of a vector's consecutive ones: inputs
//! read at the column alone (a weight shaped like the row) are loaded once a group, and outputs
//! shaped like the rows are stored once a group, each as one vector.
//!
//! Slot `t` of a lane holds column `W * (lane + (t / W) * kf_g) + t % W` (`W` the width): the
//! group's lanes read consecutive vectors. A reduction adds a lane's columns in slot order, so
//! its bits depend on the row length, the block and whether the branch is taken (the alignment
//! of the buffers, which picks the entry point), and are the same from run to run.
//!
//! The emitter asks [`RowCache::slot`], [`Group`] and [`RowCache::group_load_lines`] at each
//! load and store; the shape puts the loads ([`RowCache::preload`]) before the passes once it
//! knows which inputs were read. The kernel is a second entry point beside the one for any row,
//! so that each is allocated its own registers; the executor picks it where the rows fit, their
//! length is a multiple of the width and the buffers in [`RowCache::vectors`] are aligned (see
//! `plan::RegisterRows`).
//!
//! Not handled here: the passes (see `shapes::row_wise`), the entry points (see `kernel`).

use std::collections::BTreeSet;

use kfuse_ir::{DType, Graph, Kind};

use crate::cuda;

/// The columns a lane keeps in registers, at most: rows of up to `kf_g * ROW_CACHE_SLOTS`
/// columns (4096 at 256 threads a block) can take the entry point for rows in registers.
pub const ROW_CACHE_SLOTS: u32 = 16;

/// The columns a lane keeps when a kernel with row reductions keeps one row-shaped input
/// (softmax, cross-entropy, a norm's forward): rows of up to 1024 columns are one warp's, whose
/// folds are shuffles with no barrier, and rows of up to 8192 fit a block of 256. Measured on an
/// H200 (`kfuse bench`, against 16 columns a lane): cross-entropy forward + backward at [67108,
/// 1000] 0.91x (f32) and 0.86x (bf16), at [16384, 4096] 0.84x; layer norm forward at [8192, 4096]
/// bf16 0.88x, f32 1.06x, at [8192, 8192] f32 0.70x (before: the entry for any row); small
/// launches lose a little (layer norm at [8192, 256] 1.08x, cross-entropy at [1024, 1000] 1.13x).
/// Kernels keeping two inputs (a norm's gradient) were 20-30% slower at 32: they keep 16.
pub const ROW_CACHE_SLOTS_ONE_INPUT: u32 = 32;

/// The threads a launch of a row-wise kernel's register entry aims at: where `rows` times the
/// fewest lanes that hold a row at [`ROW_CACHE_SLOTS_ONE_INPUT`] columns a lane is fewer, the
/// rows take lanes for [`ROW_CACHE_SLOTS`] columns instead (more threads; an H100 or H200 holds
/// about this many at once).
pub const ROW_SPREAD_THREADS: u64 = 1 << 18;

/// The bytes of one vector load or store: a group holds this many bytes of its widest buffer's
/// columns (4 columns of 4 bytes, 8 of 2 bytes; see [`RowCache::for_graph`]).
const VECTOR_BYTES: u32 = 16;

/// The row-shaped inputs a kernel keeps in registers, at most (each takes
/// [`RowCache::slots`] registers a lane); later ones are read from memory.
const MAX_CACHED_INPUTS: usize = 3;

/// The cached branch's state while it is emitted.
#[derive(Clone, Debug)]
pub(crate) struct RowCache {
    /// The columns of a group: one vector load or store of each buffer.
    pub width: u32,
    /// The columns a lane keeps, at most: [`ROW_CACHE_SLOTS`] or [`ROW_CACHE_SLOTS_ONE_INPUT`].
    pub slots: u32,
    /// The row loops (`l` of `j<l>`) whose column is the lane's slot `t<l>`.
    pub loops: Vec<u32>,
    /// In the body's column block: its slot (a literal).
    pub body: Option<String>,
    /// The inputs read through the cache, in first-use order.
    pub inputs: Vec<u32>,
    /// In the body: the group of columns being emitted.
    pub group: Option<Group>,
    /// The buffers accessed a vector at a time (`in<k>`, `out<o>`) with the vector's bytes:
    /// the entry point is launched only where they are aligned to it.
    pub vectors: Vec<(String, u64)>,
    /// The inputs read through their launch strides (see [`RowCache::with_strides`]).
    pub strided: BTreeSet<u32>,
    /// Each row axis's (product of the row axes after it, size), as C expressions: a strided
    /// input's row starts at the sum of the row's coordinates times the input's strides.
    leading: Vec<(String, String)>,
}

/// The group of columns of the body being emitted (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Group {
    /// The column of the group being emitted (`kf_j + q`).
    pub q: u32,
    /// The emitter's depth of the group's block and of its column's block (where an output's
    /// store is unconditional).
    pub depth: usize,
    pub column_depth: usize,
    /// The outputs stored through the group, with their dtypes.
    pub outputs: Vec<(usize, DType)>,
}

impl RowCache {
    /// The cache of a kernel of graph `g` keeping `slots` columns a lane: groups of 8 columns when
    /// every floating-point input and output is 2 bytes wide (16-byte vectors of f16 or bf16),
    /// else of 4.
    pub fn for_graph(g: &Graph, slots: u32) -> RowCache {
        let widest = g
            .inputs
            .iter()
            .map(|i| i.dtype)
            .chain(g.outputs.iter().map(|o| g.node(o.node).dtype))
            .filter(|d| d.kind() == Kind::Float)
            .map(|d| d.size_bytes() as u32)
            .max()
            .unwrap_or(4);
        RowCache {
            width: (VECTOR_BYTES / widest.max(1)).clamp(4, 8),
            slots,
            loops: Vec::new(),
            body: None,
            inputs: Vec::new(),
            group: None,
            vectors: Vec::new(),
            strided: BTreeSet::new(),
            leading: Vec::new(),
        }
    }

    /// The cache with `strided`, the inputs read through their launch strides (`st<k>_<axis>`),
    /// kept too: each row of one is loaded from its first element on, as a contiguous run (the
    /// entry point is taken only where their last-axis stride is 1 and every row starts on a
    /// vector, see `plan::RegisterRows::strided_rows`). `leading` gives each row axis's (product
    /// of the row axes after it, size), as C expressions.
    pub fn with_strides(mut self, strided: BTreeSet<u32>, leading: Vec<(String, String)>) -> RowCache {
        self.strided = strided;
        self.leading = leading;
        self
    }

    /// The cached inputs read through their launch strides.
    pub fn strided_rows(&self) -> Vec<u32> {
        self.inputs.iter().copied().filter(|k| self.strided.contains(k)).collect()
    }

    /// The element offset in strided input `k` of the first element of row `row` (a C
    /// expression): each row coordinate times its stride.
    fn row_start(&self, k: u32, row: &str) -> String {
        let terms: Vec<String> = self
            .leading
            .iter()
            .enumerate()
            .map(|(a, (inner, size))| {
                let mut e = row.to_string();
                if inner != "1" {
                    e = format!("({e} / ({inner}))");
                }
                if a > 0 {
                    e = format!("({e} % ({size}))");
                }
                format!("{e} * st{k}_{a}")
            })
            .collect();
        if terms.is_empty() {
            "0".to_string()
        } else {
            terms.join(" + ")
        }
    }

    /// The groups of [`RowCache::width`] columns a lane keeps.
    pub fn groups(&self) -> u32 {
        self.slots / self.width
    }

    /// The value of input `input` (of `dtype`) at slot `slot` (a literal or a loop's slot
    /// variable), from its registers, recording the input; `None` when the cache is full.
    pub fn slot(&mut self, input: u32, dtype: DType, slot: &str) -> Option<String> {
        if !self.inputs.contains(&input) {
            if self.inputs.len() == MAX_CACHED_INPUTS {
                return None;
            }
            self.inputs.push(input);
        }
        if !self.packs(dtype) {
            return Some(format!("kf_c{input}[{slot}]"));
        }
        // Two columns a word: slot t is the low (even t) or high half of word t / 2.
        let half =
            |word: String, high: String| cuda::load_conversion(dtype, &format!("(unsigned short)({word} >> {high})"));
        Some(match slot.parse::<u32>() {
            Ok(t) => half(format!("kf_c{input}[{}]", t / 2), (16 * (t % 2)).to_string()),
            Err(_) => half(format!("kf_c{input}[({slot}) >> 1]"), format!("((({slot}) & 1) * 16)")),
        })
    }

    /// Whether a cached input of `dtype` is kept as the raw words it was loaded as, two columns a
    /// word (f16 and bf16, loaded as vectors), rather than a float a column: half the registers,
    /// and each read unpacks its half with one instruction. Measured on an H200 (a hand-edited
    /// kernel, the same bits out): GELU(x + bias) forward + backward with the bias gradient at
    /// [16384, 4096] bf16 167 µs against 187 µs, its spills gone.
    fn packs(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F16 | DType::BF16) && cuda::vector_type(dtype, u64::from(self.width)).is_some()
    }

    /// The declaration of input `k`'s registers (of `dtype`, named `name`) for the lane's columns.
    fn declaration(&self, k: u32, dtype: DType, note: &str) -> String {
        if self.packs(dtype) {
            format!("unsigned int kf_c{k}[{}]; // {note}, two columns a word", self.slots / 2)
        } else {
            format!("{} kf_c{k}[{}]; // {note}", cuda::value_type(dtype), self.slots)
        }
    }

    /// The statements that put group `kf_v`'s vector `v` of input `k` (of `dtype`) into its
    /// registers: its words as they are where the input [`packs`](Self::packs), else each
    /// column unpacked.
    fn unpack_group(&self, k: u32, dtype: DType, v: &str) -> Vec<String> {
        let w = self.width;
        if self.packs(dtype) {
            let words = w / 2;
            return (0..words)
                .map(|j| format!("kf_c{k}[{words} * kf_v + {j}] = {v}.{};", ["x", "y", "z", "w"][j as usize]))
                .collect();
        }
        (0..w)
            .map(|q| {
                format!("kf_c{k}[{w} * kf_v + {q}] = {};", cuda::vector_extract(v, dtype, u64::from(w), u64::from(q)))
            })
            .collect()
    }

    /// The header of a cached loop `l` over the lane's slots `t<l>`, with the column `j<l>` of
    /// each; the loop stops at the first group past the row.
    pub fn loop_header(&mut self, l: u32) -> String {
        self.loops.push(l);
        let (t, w, slots) = (format!("t{l}"), self.width, self.slots);
        format!(
            "#pragma unroll\nfor (int {t} = 0; {t} < {slots}; ++{t}) {{\n    if ({w} * (lane + ({t} / {w}) * kf_g) >= kf_n) break;\n    const int j{l} = {w} * (lane + ({t} / {w}) * kf_g) + {t} % {w};"
        )
    }

    /// The slot variable of loop `l`, when it is a cached loop.
    pub fn loop_slot(&self, l: u32) -> Option<String> {
        self.loops.contains(&l).then(|| format!("t{l}"))
    }

    /// Records buffer `ptr` as accessed a vector of `dtype` at a time, and returns the vector
    /// type (`None` for a dtype without one: it is accessed a column at a time).
    fn vector(&mut self, ptr: String, dtype: DType) -> Option<&'static str> {
        let vty = cuda::vector_type(dtype, u64::from(self.width))?;
        if !self.vectors.iter().any(|(p, _)| *p == ptr) {
            self.vectors.push((ptr, u64::from(self.width) * dtype.size_bytes() as u64));
        }
        Some(vty)
    }

    /// The loads of a group's elements of `ptr` (of `dtype`) at `at` into `slot(q)`.
    fn group_loads(&mut self, dtype: DType, ptr: &str, at: &str, slot: impl Fn(u32) -> String) -> Vec<String> {
        let w = self.width;
        match self.vector(ptr.to_string(), dtype) {
            Some(vty) => {
                let mut lines = vec![format!("const {vty} kf_w = *reinterpret_cast<const {vty}*>({ptr} + {at});")];
                for q in 0..w {
                    let e = cuda::vector_extract("kf_w", dtype, u64::from(w), u64::from(q));
                    lines.push(format!("{} = {e};", slot(q)));
                }
                lines
            }
            None => (0..w)
                .map(|q| format!("{} = {};", slot(q), cuda::load_conversion(dtype, &format!("{ptr}[{at} + {q}]"))))
                .collect(),
        }
    }

    /// The cached inputs' loads: `(prologue, body)`, the lines before the row loop and at the
    /// start of each row.
    ///
    /// Not `ahead`: the body declares each input's registers `kf_c<k>` and loads the row into them,
    /// every load in flight before the first pass. `ahead`: the prologue declares each input's
    /// prefetch array `kf_p<k>` and issues the loads of the thread's first row; the body unpacks
    /// the arrays into `kf_c<k>`, then issues the loads of the thread's next row (one grid step
    /// on), in flight while this row is computed. A vector's worth is prefetched as the raw vector
    /// (a 2-byte row holds half the registers it unpacks to). Measured on an H200: 3-8% faster for
    /// elementwise rows (no passes), but 5-16% slower for rows with passes (cross-entropy, layer
    /// norm's gradient), whose extra registers cost resident blocks.
    pub fn preload(&mut self, g: &Graph, ahead: bool) -> (Vec<String>, Vec<String>) {
        if !ahead {
            return (Vec::new(), self.load_in_place(g));
        }
        let (w, groups, slots) = (self.width, self.groups(), self.slots);
        let mut prologue =
            vec!["// Rows kept in registers: each row-shaped input is loaded once, a row ahead.".to_string()];
        let (mut loads, mut body) =
            (Vec::new(), vec!["// This row's columns, from the loads issued a row ahead.".to_string()]);
        for k in self.inputs.clone() {
            let (dtype, name) = (g.inputs[k as usize].dtype, &g.inputs[k as usize].name);
            let ty = cuda::value_type(dtype);
            body.push(self.declaration(k, dtype, &format!("{name}: the lane's columns of the row")));
            let base = if self.strided.contains(&k) { format!("kf_sb{k}") } else { "kf_base1".to_string() };
            match self.vector(format!("in{k}"), dtype) {
                Some(vty) => {
                    prologue.push(format!("{vty} kf_p{k}[{groups}]; // {name}: the lane's vectors of its next row"));
                    loads.push(format!("kf_p{k}[kf_v] = *reinterpret_cast<const {vty}*>(in{k} + {base} + kf_j);"));
                    body.push("#pragma unroll".to_string());
                    body.push(format!("for (int kf_v = 0; kf_v < {groups}; ++kf_v) {{"));
                    body.extend(
                        self.unpack_group(k, dtype, &format!("kf_p{k}[kf_v]")).into_iter().map(|l| format!("    {l}")),
                    );
                    body.push("}".to_string());
                }
                None => {
                    prologue.push(format!("{ty} kf_p{k}[{slots}]; // {name}: the lane's columns of its next row"));
                    for q in 0..w {
                        let e = cuda::load_conversion(dtype, &format!("in{k}[{base} + kf_j + {q}]"));
                        loads.push(format!("kf_p{k}[{w} * kf_v + {q}] = {e};"));
                    }
                    body.push("#pragma unroll".to_string());
                    body.push(format!("for (int t = 0; t < {slots}; ++t) kf_c{k}[t] = kf_p{k}[t];"));
                }
            }
        }
        let issue = |first: &str| {
            let mut lines = vec![
                "{".to_string(),
                format!("    const long long kf_r1 = {first};"),
                "    const long long kf_rw1 = kf_r1 + (long long)(threadIdx.x >> kf_lg);".to_string(),
                "    const int kf_n1 = kf_rw1 < rows ? (int)cols : 0;".to_string(),
                "    const long long kf_base1 = (kf_rw1 < rows ? kf_rw1 : 0) * cols;".to_string(),
            ];
            for k in self.strided_rows() {
                let start = self.row_start(k, "(kf_rw1 < rows ? kf_rw1 : 0)");
                lines.push(format!("    const long long kf_sb{k} = {start}; // in{k}'s row, through its strides"));
            }
            lines.extend(self.group_loop("kf_n1", &loads).into_iter().map(|l| format!("    {l}")));
            lines.push("}".to_string());
            lines
        };
        prologue.extend(issue("(long long)blockIdx.x * kf_gpb"));
        body.push("// The next row's loads, in flight while this row is computed.".to_string());
        body.extend(issue("kf_r0 + (long long)gridDim.x * kf_gpb"));
        (prologue, body)
    }

    /// The declarations and the loads of the cached inputs at the row, issued together.
    fn load_in_place(&mut self, g: &Graph) -> Vec<String> {
        let mut lines = vec!["// The row fits the lanes' registers: each row-shaped input is loaded once.".to_string()];
        let mut loads = Vec::new();
        for k in self.inputs.clone() {
            let dtype: DType = g.inputs[k as usize].dtype;
            let note = format!("{} in registers: the lane's columns of the row", g.inputs[k as usize].name);
            lines.push(self.declaration(k, dtype, &note));
            let base = if self.strided.contains(&k) {
                let start = self.row_start(k, "row");
                lines.push(format!("const long long kf_sb{k} = {start}; // in{k}'s row, through its strides"));
                format!("kf_sb{k}")
            } else {
                "rowbase".to_string()
            };
            loads.push("{".to_string());
            let w = self.width;
            let body = match self.packs(dtype).then(|| self.vector(format!("in{k}"), dtype)).flatten() {
                Some(vty) => {
                    let mut body =
                        vec![format!("const {vty} kf_w = *reinterpret_cast<const {vty}*>(in{k} + {base} + kf_j);")];
                    body.extend(self.unpack_group(k, dtype, "kf_w"));
                    body
                }
                None => self.group_loads(dtype, &format!("in{k}"), &format!("{base} + kf_j"), |q| {
                    format!("kf_c{k}[{w} * kf_v + {q}]")
                }),
            };
            loads.extend(body.into_iter().map(|l| format!("    {l}")));
            loads.push("}".to_string());
        }
        lines.extend(self.group_loop("kf_n", &loads));
        lines
    }

    /// The loop over the lane's groups of a row of `bound` columns, running `loads` (which read
    /// the group's first column `kf_j`) for each group the row has.
    fn group_loop(&self, bound: &str, loads: &[String]) -> Vec<String> {
        let mut lines = vec![
            "#pragma unroll".to_string(),
            format!("for (int kf_v = 0; kf_v < {}; ++kf_v) {{", self.groups()),
            format!("    const int kf_j = {} * (lane + kf_v * kf_g);", self.width),
            format!("    if (kf_j >= {bound}) break;"),
        ];
        lines.extend(loads.iter().map(|l| format!("    {l}")));
        lines.push("}".to_string());
        lines
    }

    /// The header of the body's group `v` of columns, and its first statement.
    pub fn group_header(&self, v: u32) -> (String, String) {
        let w = self.width;
        (
            format!("if ({w} * (lane + {v} * kf_g) < kf_n) {{ // the lane's group {v} of {w} columns"),
            format!("const int kf_j = {w} * (lane + {v} * kf_g);"),
        )
    }

    /// The statements that start column `q` of the group.
    pub fn column_start(q: u32) -> Vec<String> {
        vec![format!("const int col = kf_j + {q};"), "const long long i = rowbase + col;".to_string()]
    }

    /// The declaration and loads of input `k` (of `dtype`, read at the column alone) at the
    /// group's columns into the array `name`.
    pub fn group_load_lines(&mut self, k: u32, dtype: DType, name: &str, note: &str) -> Vec<String> {
        let ty = cuda::value_type(dtype);
        let mut lines = vec![format!("{ty} {name}[{}]; // {note} at the group's columns", self.width)];
        lines.push("{".to_string());
        let loads = self.group_loads(dtype, &format!("in{k}"), "kf_j", |q| format!("{name}[{q}]"));
        lines.extend(loads.into_iter().map(|l| format!("    {l}")));
        lines.push("}".to_string());
        lines
    }

    /// The store of output `o` (of `dtype`) at the group's columns from the array `kf_o<o>`.
    pub fn group_stores(&mut self, o: usize, dtype: DType, note: &str) -> Vec<String> {
        let values: Vec<String> = (0..self.width).map(|q| format!("kf_o{o}[{q}]")).collect();
        match self.vector(format!("out{o}"), dtype) {
            Some(vty) => vec![format!(
                "*reinterpret_cast<{vty}*>(out{o} + rowbase + kf_j) = {}; // {note}",
                cuda::vector_pack(dtype, &values)
            )],
            None => (0..self.width)
                .map(|q| {
                    format!(
                        "out{o}[rowbase + kf_j + {q}] = {}; // {note}",
                        cuda::store_conversion(dtype, &values[q as usize])
                    )
                })
                .collect(),
        }
    }
}
