//! The plan: the value that the executor runs. It lists every device buffer a run needs and the
//! kernels to launch, in order, on one stream. Nothing here touches a GPU; the executor (crate
//! `kfuse`) allocates, binds and launches exactly what this describes.

use kfuse_ir::{DType, GraphHash, InputId, Interface, SymId};

/// Options that change the generated code (they are printed in each kernel's header comment).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    /// Threads per block of every generated kernel: a multiple of 32 in `32..=1024`. One
    /// exception: the rows plan ([`LengthsGradient::OnePass`] under a lengths mask) always runs
    /// 512 threads per block (its split of the warps into fill and compute roles is tuned for
    /// it). The default (256) stands for 512 there; 512 is honoured; any other value is refused
    /// with `CodegenError::RowsPlanBlockSize` (choose [`LengthsGradient::TwoKernels`] to run the
    /// gradient at that block size).
    pub block_size: u32,
    /// Elements each thread takes per iteration of a batched grid-stride loop (their loads are
    /// all issued before the first use): `1..=16`, for loads of up to 4 registers an element; a
    /// kernel whose elements load more takes fewer (see `shapes::grid_stride::batch`). Kernels
    /// without a batched loop (row mode, the rows plan, which takes 2 valid elements per compute
    /// thread and step) do not use it.
    pub elems_per_thread: u32,
    /// Threads per multiprocessor that a batched loop's launch bounds promise (and its grid
    /// fills): registers per thread are capped at 65536 / this. A multiple of `block_size` in
    /// `block_size..=2048`. Kernels without a batched loop do not use it (the rows plan promises
    /// two resident blocks of 512 threads).
    pub batched_threads_per_sm: u32,
    /// How a gradient masked by `mask(lengths)` and scaled by a full reduction is planned.
    pub lengths_gradient: LengthsGradient,
    /// The inputs (graph input indices, ascending) that the kernels read through strides given at
    /// launch ([`Param::Stride`]), so that a framework's views (transposed, sliced, expanded with
    /// stride 0) are read in place: any strides, with no recompile for a new pattern. The others
    /// are contiguous and row-major, read as flat arrays (vector loads, rows kept in registers).
    /// Lengths and offsets inputs are always contiguous (`CodegenError::StridedInput`).
    pub strided_inputs: Vec<u32>,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            block_size: 256,
            elems_per_thread: 4,
            batched_threads_per_sm: 1024,
            lengths_gradient: LengthsGradient::OnePass,
            strided_inputs: Vec::new(),
        }
    }
}

/// The plan of a scaled gradient under a lengths mask (e.g. `grad(loss, pred)` of a mean over
/// `mask(lengths)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LengthsGradient {
    /// A row-group kernel for the reductions, then a warp-per-row kernel that zero-fills each
    /// row's padding and computes the valid columns' gradient with the scale.
    TwoKernels,
    /// One cooperative launch, the rows plan (see `rows`): in each block, fill warps zero the
    /// padding of its rows while compute warps take the count from a grid-wide arrival word and
    /// compute the valid elements' gradient and the loss.
    #[default]
    OnePass,
}

/// Everything needed to run a graph on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `graph.stable_hash()`; kernel names carry its short form.
    pub graph_hash: GraphHash,
    /// The graph's inputs and outputs (names, dtypes, shapes in symbols, layout constraints): all
    /// the executor needs to bind run-time sizes, check inputs and size outputs, with no graph.
    pub interface: Interface,
    /// Every device buffer a run needs, referenced by index from [`Param::Buffer`]. The first
    /// `graph.inputs.len()` entries are the inputs in declaration order, then the outputs in
    /// `graph.outputs` order, then temporaries, partials and counters.
    pub buffers: Vec<BufferDecl>,
    /// The kernels, to be launched in this order on one stream (each may read what an earlier
    /// one wrote into a [`BufferKind::Temp`]).
    pub kernels: Vec<Kernel>,
    /// The inputs its kernels read through strides ([`CodegenOptions::strided_inputs`]); the
    /// others must be contiguous and row-major, and 16-byte aligned (see [`BufferDecl`]).
    pub strided_inputs: Vec<u32>,
}

/// One device buffer.
///
/// Every buffer must start at a 16-byte aligned address (`cuMemAlloc` gives 256): kernels load
/// and store small trailing component axes as one 4-, 8- or 16-byte vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferDecl {
    /// What the buffer holds and who fills it.
    pub kind: BufferKind,
    /// The element type (its size in bytes is [`ElemType::size_bytes`]).
    pub elem: ElemType,
    /// The element count: for [`BufferKind::Partials`] it is the count *per block* (multiply by
    /// the grid size chosen for that kernel, see [`BufferDecl::elem_count`]); otherwise the total.
    pub elems: SizeExpr,
}

/// What a buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// A graph input: the executor uploads the user's tensor (in its storage dtype, row-major).
    Input(InputId),
    /// A graph output (index into `graph.outputs`), stored in the output node's dtype. Every
    /// element is written by the kernels; scalar outputs hold one element.
    Output(usize),
    /// A scalar value that one kernel writes and a later kernel reads (one element; no
    /// initialisation needed).
    Temp,
    /// Per-block partial accumulators of the full reductions of kernel `kernel`: `f64`,
    /// slot-major (`slot * gridDim.x + blockIdx.x`), `slots_per_block * grid` elements. No
    /// initialisation needed; allocate for the largest grid that kernel may be launched with.
    Partials { kernel: usize, slots_per_block: u32 },
    /// The `u32` counters of kernel `kernel`: its ticket (one); a compacted one-pass kernel's
    /// grid barrier (arrivals, departures: two); or a rows-plan kernel's ticket, a spare word and
    /// its 64-bit arrival word at byte 8 (four). The executor zeroes them ONCE when it allocates
    /// them; the kernel leaves them at 0 when it finishes, so repeated launches need no memset.
    /// Never launch two instances of the same kernel with the same counter concurrently.
    Counter { kernel: usize },
    /// The column partial sums that row-wise kernel `kernel`'s entry for rows in registers
    /// writes as it goes, one row of them per block: `elems` (the columns times the sums) per
    /// block, so `elems * grid` in all; the [`FoldEntry`] that reads them takes the row count as
    /// a [`Param::Grid`]. No initialisation needed: every block writes its whole row.
    ColumnPartials { kernel: usize },
    /// Working memory of kernel `kernel` (e.g. the compact list of a one-pass masked gradient,
    /// written before its grid barrier and read after it). No initialisation needed.
    Scratch { kernel: usize },
}

/// The element type of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemType {
    /// A tensor element in a graph dtype (`bool` is one byte, 0 or 1; f16/bf16 are raw bits).
    Tensor(DType),
    /// An IEEE double (partial accumulators).
    F64,
    /// A 32-bit unsigned integer (ticket counters).
    U32,
    /// A 64-bit unsigned integer (list indices and lengths).
    U64,
}

impl ElemType {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            ElemType::Tensor(d) => d.size_bytes() as u64,
            ElemType::F64 => 8,
            ElemType::U32 => 4,
            ElemType::U64 => 8,
        }
    }
}

impl BufferDecl {
    /// The element count for run-time `sizes` (indexed by [`SymId`]) and, for partials, the grid
    /// size (blocks) of the kernel that uses them; `grid_blocks` is ignored for other kinds.
    pub fn elem_count(&self, sizes: &[u64], grid_blocks: u64) -> Option<u64> {
        let n = self.elems.eval(sizes)?;
        match self.kind {
            BufferKind::Partials { .. } | BufferKind::ColumnPartials { .. } => n.checked_mul(grid_blocks),
            _ => Some(n),
        }
    }
}

/// A size: `constant * Π sizes[sym]` over `symbols` (a symbol may repeat).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SizeExpr {
    pub constant: u64,
    pub symbols: Vec<SymId>,
}

impl SizeExpr {
    /// A size that does not depend on the run.
    pub fn constant(c: u64) -> SizeExpr {
        SizeExpr { constant: c, symbols: Vec::new() }
    }
    /// The element count of `dims` (`None` on overflow).
    pub(crate) fn of(dims: &[kfuse_ir::Dim]) -> Option<SizeExpr> {
        let mut e = SizeExpr::constant(1);
        for d in dims {
            match *d {
                kfuse_ir::Dim::Const(c) => e.constant = e.constant.checked_mul(c)?,
                kfuse_ir::Dim::Sym(s) => e.symbols.push(s),
            }
        }
        Some(e)
    }
    /// Whether this size is at most `other` for every value of the symbols (each at least 1):
    /// its symbols are among `other`'s and its constant is no larger.
    pub fn at_most(&self, other: &SizeExpr) -> bool {
        let mut rest = other.symbols.clone();
        let among = self.symbols.iter().all(|s| match rest.iter().position(|o| o == s) {
            Some(p) => {
                rest.swap_remove(p);
                true
            }
            None => false,
        });
        among && self.constant <= other.constant
    }
    /// The value for run-time `sizes` (indexed by [`SymId`]); `None` on overflow or a missing
    /// symbol.
    pub fn eval(&self, sizes: &[u64]) -> Option<u64> {
        self.symbols.iter().try_fold(self.constant, |acc, s| acc.checked_mul(*sizes.get(s.0 as usize)?))
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The `extern "C"` entry point: `kf_<graph hash short>_<index>`.
    pub name: String,
    /// A whole header-free CUDA C++ translation unit defining `name` (compile it with NVRTC
    /// for the device's arch, sm_80 or newer).
    pub source: String,
    /// The kernel's parameters in order: buffers as device pointers, sizes as `long long`.
    pub params: Vec<Param>,
    /// Threads per block (`blockDim.x`; y and z are 1). The kernel uses only static shared
    /// memory (under 1 KiB).
    pub block: u32,
    /// How many blocks to launch (`gridDim.x`).
    pub grid: GridSpec,
    /// Inputs this kernel loads only inside a hoisted predicate's branch (e.g. `pred` under
    /// `target[.., 3] != 0`): their bytes are touched only for the elements where it holds.
    /// Benchmarks leave them out of the bytes a run must move.
    pub lazy_inputs: Vec<InputId>,
    /// How the executor launches it.
    pub launch: Launch,
    /// A row-wise kernel's second entry point, for rows that fit the lanes' registers.
    pub register_rows: Option<RegisterRows>,
    /// A column kernel's second entry point, for launches where an earlier row kernel took its
    /// entry for rows in registers and summed this kernel's columns as it went.
    pub fold: Option<FoldEntry>,
    /// Whether the source indexes its flat domain with 32 bits unless compiled with
    /// [`WIDE_INDEX_OPTION`] (a grid-stride kernel): the executor launches the default build only
    /// where [`Kernel::narrow_fits`], the wide build otherwise. Other kernels index with 64 bits
    /// in every build.
    pub narrow_index: bool,
    /// The most operand elements one element's work reads through reductions computed where
    /// they are used, again at every element (the extents of nested inline reduction loops
    /// multiplied; `u64::MAX` for a symbolic extent; 0 when it has none; a row-wise kernel's
    /// reductions computed once per row count once for the row's constant number of columns):
    /// above a few dozen, the kernel's work grows with the product of its domain and this.
    pub recompute: u64,
    /// The reductions (node numbers of the graph planned) that make [`Kernel::recompute`] exceed
    /// [`crate::RECOMPUTED_EXTENT_LIMIT`]; the planner stores them once and plans again, so a
    /// plan's kernels list one only where that could not be done.
    pub recomputed: Vec<u32>,
}

/// The NVRTC option that builds a kernel whose [`Kernel::narrow_index`] holds with a 64-bit flat
/// index (it defines `KF_WIDE_INDEX`): for launches where [`Kernel::narrow_fits`] does not hold.
pub const WIDE_INDEX_OPTION: &str = "-DKF_WIDE_INDEX";

/// A 32-bit flat index serves a launch whose domain and buffers all hold fewer elements than this:
/// an index below it plus one step of any grid stride (at most 16 elements a thread of a
/// resident grid) stays below 2^31.
pub const NARROW_INDEX_LIMIT: u64 = 1 << 30;

impl Kernel {
    /// Whether the default build of a [`Kernel::narrow_index`] kernel serves a launch at `sizes`
    /// whose buffer `b` (a [`Param::Buffer`] index) holds `elems(b)` elements: its domain and
    /// every buffer it takes hold fewer than [`NARROW_INDEX_LIMIT`] (an unknown count does not).
    /// False for every other kernel.
    pub fn narrow_fits(&self, sizes: &[u64], elems: impl Fn(usize) -> Option<u64>) -> bool {
        let GridSpec::Work { work, .. } = &self.grid else { return false };
        let below = |n: Option<u64>| n.is_some_and(|n| n < NARROW_INDEX_LIMIT);
        self.narrow_index
            && below(work.eval(sizes))
            && self.params.iter().all(|p| match p {
                Param::Buffer(b) => below(elems(*b)),
                _ => true,
            })
    }
}

/// A column kernel's entry point that folds the column partial sums an earlier row-wise kernel
/// (`after`) wrote as it went ([`BufferKind::ColumnPartials`]) instead of reading the rows: the
/// executor launches it in place of [`Kernel::name`] (the same partials and counter, its own
/// grid: [`FoldEntry::blocks`]) when kernel `after` took its [`RegisterRows`] entry, the only one
/// that writes them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FoldEntry {
    /// Its CUDA translation unit (the kernel's header and helpers and this entry point).
    pub source: String,
    /// The entry point's name: `<name>_fold`.
    pub entry: String,
    /// Its parameters, in order (the partial sums and the grid of `after` among them).
    pub params: Vec<Param>,
    /// The row-wise kernel whose entry for rows in registers writes the partial sums.
    pub after: usize,
}

impl FoldEntry {
    /// Its grid: the column kernel's (`grid`, a [`GridSpec::Columns`]) over the `parts` rows of
    /// partial sums instead of the rows, so at most the column kernel's own grid (`parts` is a
    /// grid of kernel `after` over those rows), whose partials and counter it uses.
    pub fn blocks(grid: &GridSpec, sizes: &[u64], sm_count: u32, parts: u32) -> Option<u32> {
        let GridSpec::Columns { cols, lanes, .. } = grid else { return None };
        let rows = SizeExpr::constant(u64::from(parts));
        GridSpec::Columns { cols: cols.clone(), rows, lanes: *lanes }.blocks(sizes, sm_count)
    }
}

/// A row-wise kernel's entry point for rows kept in registers: each lane loads its columns of
/// each row-shaped input once, a vector at a time, and every pass reads them from there. The
/// executor launches it instead of [`Kernel::name`] (same parameters, same grid) when
/// [`RegisterRows::applies`], with [`Kernel::launch_block`] threads a block; the other entry
/// takes any row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RegisterRows {
    /// Its CUDA translation unit: the kernel's header and helpers and this entry point alone
    /// (compiled apart from [`Kernel::source`], so that the two compile in parallel).
    pub source: String,
    /// The entry point's name.
    pub entry: String,
    /// The columns a lane holds, at most.
    pub cols_per_lane: u64,
    /// The columns of one vector: the row length must be a multiple of it.
    pub vector: u64,
    /// The parameters (indices into [`Kernel::params`]) read or written a vector at a time,
    /// with the alignment in bytes their addresses need.
    pub aligned: Vec<(usize, u64)>,
    /// The most threads a block of it may have (its launch bound; a power of two times the
    /// kernel's block): a row longer than the kernel's block holds at `cols_per_lane` columns a
    /// lane is launched with the smallest block up to this one that holds it (see
    /// [`RegisterRows::block`]), with the same registers a thread.
    pub max_block: u32,
    /// The inputs read through their launch strides ([`Param::Stride`]) that it loads a row at a
    /// time, as a contiguous run from the row's first element: it is taken only where each of
    /// them has a last-axis stride of 1 and every other stride a multiple of
    /// [`RegisterRows::vector`] (every row starts on a vector; see [`RegisterRows::strides_fit`]).
    pub strided_rows: Vec<InputId>,
}

impl RegisterRows {
    /// Whether a launch of a kernel with `grid`, run-time `sizes`, parameter addresses
    /// `address(param index)` and the strides (elements) of each declared input, `strides[input]`,
    /// takes this entry point.
    pub fn applies(
        &self,
        grid: &GridSpec,
        sizes: &[u64],
        address: impl Fn(usize) -> Option<u64>,
        strides: &[Vec<i64>],
    ) -> bool {
        self.block(grid, sizes).is_some()
            && self.aligned.iter().all(|&(p, bytes)| address(p).is_some_and(|a| a % bytes.max(1) == 0))
            && self.strides_fit(strides)
    }

    /// Whether every input in [`RegisterRows::strided_rows`] has rows it can load a vector at a
    /// time: a last-axis stride of 1 and the other strides multiples of the vector's columns (a
    /// broadcast axis, stride 0, included). An input whose strides are not given does not fit.
    pub fn strides_fit(&self, strides: &[Vec<i64>]) -> bool {
        let vector = i64::try_from(self.vector.max(1)).unwrap_or(i64::MAX);
        self.strided_rows.iter().all(|input| {
            strides.get(input.0 as usize).is_some_and(|s| match s.split_last() {
                Some((&last, leading)) => last == 1 && leading.iter().all(|&st| st.rem_euclid(vector) == 0),
                None => false,
            })
        })
    }

    /// The threads a block of a launch of a kernel with `grid` at run-time `sizes` takes where
    /// its rows fit this entry: the kernel's block, doubled while it holds fewer columns than a
    /// row (at most [`RegisterRows::max_block`]). `None` when the rows do not fit (too long, or
    /// not a multiple of the vector).
    pub fn block(&self, grid: &GridSpec, sizes: &[u64]) -> Option<u32> {
        let GridSpec::Rows { cols, block, .. } = grid else { return None };
        let cols = cols.eval(sizes)?;
        let mut b = *block;
        while b < self.max_block && u64::from(b).saturating_mul(self.cols_per_lane) < cols {
            b <<= 1;
        }
        let fits = cols <= row_lanes(cols, b).saturating_mul(self.cols_per_lane) && cols % self.vector.max(1) == 0;
        fits.then_some(b)
    }
}

impl Plan {
    /// The grid of each kernel for run-time `sizes` on a device with `sm_count`
    /// multiprocessors, in launch order (see [`GridSpec::blocks`]); `None` for a kernel whose
    /// grid cannot be formed. `cap(k, blocks)` may lower kernel `k`'s grid (a cooperative launch
    /// holds at most one resident wave).
    pub fn grids(&self, sizes: &[u64], sm_count: u32, cap: impl Fn(usize, u32) -> u32) -> Result<Vec<u32>, usize> {
        let mut grids = Vec::with_capacity(self.kernels.len());
        for (k, kernel) in self.kernels.iter().enumerate() {
            let blocks = kernel.grid.blocks_of(sizes, sm_count, kernel.launch_block(sizes)).ok_or(k)?;
            grids.push(cap(k, blocks));
        }
        Ok(grids)
    }
}

impl Kernel {
    /// The threads a block of its launch at run-time `sizes` takes: [`Kernel::block`], or a
    /// larger block for rows its entry for rows in registers holds only so (see
    /// [`RegisterRows::block`]). Its grid is formed for that block ([`Plan::grids`]), whichever
    /// entry the launch takes (the other, launched with `block` threads, strides over the rows).
    pub fn launch_block(&self, sizes: &[u64]) -> u32 {
        self.register_rows.as_ref().and_then(|r| r.block(&self.grid, sizes)).unwrap_or(self.block)
    }

    /// Every entry point of the kernel as (CUDA translation unit, entry name): its own, then the
    /// one for rows in registers or the fold, if it has one. Loading the kernel compiles each unit.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((self.source.as_str(), self.name.as_str()))
            .chain(self.register_rows.iter().map(|r| (r.source.as_str(), r.entry.as_str())))
            .chain(self.fold.iter().map(|f| (f.source.as_str(), f.entry.as_str())))
    }

    /// What the kernel's header says of its plan: its domain line (how its threads cover the work:
    /// the kernel shape, and for a row-wise kernel its row phases), one line per sink (what it
    /// writes) and a column kernel's line on its fold entry, without the comment markers.
    pub fn plan_notes(&self) -> Vec<&str> {
        self.source
            .lines()
            .take_while(|l| l.starts_with("//"))
            .filter_map(|l| {
                l.strip_prefix("// domain: ")
                    .or_else(|| l.strip_prefix("// sink: ").map(|s| s.trim()))
                    .or_else(|| l.strip_prefix("// ").filter(|r| r.starts_with("entry ") && self.fold.is_some()))
            })
            .collect()
    }
}

/// How the executor launches a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launch {
    /// `cuLaunchKernel`: blocks may run in any order, a few at a time.
    Plain,
    /// `cuLaunchCooperativeKernel`, with the grid capped at the blocks the device holds at once
    /// for this kernel (occupancy times multiprocessors): the kernel waits on a grid-wide
    /// barrier, which needs every block resident. Any grid size is otherwise correct.
    Cooperative,
}

/// One kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// The device pointer of `Plan::buffers[index]`.
    Buffer(usize),
    /// The run-time size of a dimension symbol, passed as a signed 64-bit integer (`i64`).
    Size(SymId),
    /// The device address of the error record that the kernel's checks of lengths/offsets
    /// values write (`unsigned long long*`, 8 words, see [`ERROR_RECORD_WORDS`]), or 0 (a null
    /// pointer): no checks, the kernel runs as if it had none.
    ErrorRecord,
    /// The tag a violation is recorded with (`unsigned int`): the executor's number for the
    /// program, so that the host can name it.
    CheckTag,
    /// The grid size (blocks) of kernel `index` of the same launch, as a signed 64-bit integer:
    /// the rows of the [`BufferKind::ColumnPartials`] that kernel wrote (a [`FoldEntry`]'s).
    Grid(usize),
    /// The stride, in elements, of axis `axis` of input `input` (one of
    /// [`CodegenOptions::strided_inputs`]), as a signed 64-bit integer.
    Stride { input: InputId, axis: u32 },
}

/// The words (`u64`) of the error record a checking kernel writes ([`Param::ErrorRecord`]), in
/// order: 0 the claim (0 free; a kernel that finds a violation takes it with `atomicCAS` 0 -> 1,
/// so only the first violation is recorded), 1 the tag ([`Param::CheckTag`]), 2 the input's index
/// in the graph, 3 the kind ([`ViolationKind`] as its number), 4 the position (flat, row-major),
/// 5 the value (an `i32` sign-extended), 6 the bound it broke (the size, or for a decrease the
/// previous value), 7 ready (1 once words 1 to 6 are written and fenced with
/// `__threadfence_system`). The host reads ready first and resets ready, then the claim.
pub const ERROR_RECORD_WORDS: usize = 8;

/// What a recorded violation broke (word 3 of the error record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// A lengths value below 0.
    LengthNegative = 1,
    /// A lengths value above its bound.
    LengthTooLarge = 2,
    /// An offsets input whose first value is not 0.
    OffsetStart = 3,
    /// An offsets value below the previous one (the bound is the previous value).
    OffsetDecrease = 4,
    /// An offsets value above the packed size.
    OffsetPastEnd = 5,
    /// An offsets input whose last value is not the packed size.
    OffsetEnd = 6,
    /// An offsets input with no element.
    OffsetsEmpty = 7,
}

impl ViolationKind {
    /// The kind of record word 3 (`None` for a number no kernel writes).
    pub fn from_word(w: u64) -> Option<ViolationKind> {
        use ViolationKind::*;
        [LengthNegative, LengthTooLarge, OffsetStart, OffsetDecrease, OffsetPastEnd, OffsetEnd, OffsetsEmpty]
            .into_iter()
            .find(|k| *k as u64 == w)
    }
}

/// How the executor chooses the grid size.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GridSpec {
    /// `blocks = clamp(ceil(work / per_block), 1, max_blocks_per_sm * sm_count)`: the kernel
    /// loops over `work` items with a grid-stride loop, so any grid size is correct; at least one
    /// block always runs (it writes the results of empty reductions).
    Work { work: SizeExpr, per_block: u64, max_blocks_per_sm: u32 },
    /// A row-wise kernel's grid: `rows` rows of `cols` columns, each taking a group of
    /// [`row_lanes`]`(cols, block)` lanes, so a block of `block` threads takes `block / lanes`
    /// rows at a time: `blocks = clamp(ceil(rows / (block / lanes)), 1, max_blocks_per_sm *
    /// sm_count)` (the kernel strides over the rows, so any grid size is correct).
    Rows { rows: SizeExpr, cols: SizeExpr, block: u32, max_blocks_per_sm: u32 },
    /// A column kernel's grid: `cols` columns in tiles of 32, each tile's `rows` rows split in
    /// [`column_chunks`] chunks, exactly one block per tile and chunk (the kernel derives the
    /// chunk count from the grid, so the grid is never capped).
    Columns { cols: SizeExpr, rows: SizeExpr, lanes: u32 },
}

/// The fewest rows a chunk of a column kernel takes: fewer leave its row lanes idle, and each
/// block's fold and ticket cost more than its rows (measured on an H200 against 64 rows, layer
/// norm's gradient at [8192, 256]: 20% less time; at [8192, 1024] 2%; no row slower).
pub const COLUMN_MIN_CHUNK_ROWS: u64 = 256;
/// The blocks a column kernel aims at per multiprocessor (two waves of eight).
pub const COLUMN_BLOCKS_PER_SM: u64 = 16;

/// The chunks of rows a column kernel splits each tile of 32 columns in, for `cols` columns of
/// `rows` rows on `sm_count` multiprocessors: enough blocks for [`COLUMN_BLOCKS_PER_SM`], but no
/// chunk under [`COLUMN_MIN_CHUNK_ROWS`] rows (at least one chunk).
pub fn column_chunks(cols: u64, rows: u64, sm_count: u32) -> u64 {
    let tiles = cols.div_ceil(32).max(1);
    let wanted = (COLUMN_BLOCKS_PER_SM * u64::from(sm_count)).div_ceil(tiles);
    wanted.min(rows.div_ceil(COLUMN_MIN_CHUNK_ROWS)).max(1)
}

/// The fewest lanes of a row group in a row-wise kernel.
pub const ROW_MIN_LANES: u64 = 4;
/// The columns a lane of a row group takes, about: the group grows until it has this few.
pub const ROW_COLS_PER_LANE: u64 = 8;

/// The lanes of a row-wise kernel's row group for rows of `cols` columns in blocks of `block`
/// threads: the power of two from [`ROW_MIN_LANES`] up to `block` with about
/// [`ROW_COLS_PER_LANE`] columns a lane (the generated kernel computes the same).
pub fn row_lanes(cols: u64, block: u32) -> u64 {
    let mut g = ROW_MIN_LANES;
    while g < u64::from(block) && g.saturating_mul(ROW_COLS_PER_LANE) < cols {
        g <<= 1;
    }
    g
}

impl GridSpec {
    /// The grid size for run-time `sizes` on a device with `sm_count` multiprocessors (the
    /// formula above; `None` when a size is missing or overflows).
    pub fn blocks(&self, sizes: &[u64], sm_count: u32) -> Option<u32> {
        self.blocks_of(sizes, sm_count, 0)
    }

    /// [`GridSpec::blocks`] for blocks of `threads` threads: a [`GridSpec::Rows`] grid forms its
    /// row groups in such blocks (its own, where `threads` is fewer), at most as many threads a
    /// multiprocessor as its own blocks take (the other grids ignore `threads`).
    pub fn blocks_of(&self, sizes: &[u64], sm_count: u32, threads: u32) -> Option<u32> {
        match self {
            GridSpec::Work { work, per_block, max_blocks_per_sm } => {
                let wanted = work.eval(sizes)?.div_ceil((*per_block).max(1));
                clamp_blocks(wanted, *max_blocks_per_sm, sm_count)
            }
            GridSpec::Columns { cols, rows, .. } => column_blocks(cols.eval(sizes)?, rows.eval(sizes)?, sm_count),
            GridSpec::Rows { rows, cols, block, max_blocks_per_sm } => {
                let threads = threads.max(*block);
                let per_block = (u64::from(threads) / row_lanes(cols.eval(sizes)?, threads)).max(1);
                let per_sm = (*max_blocks_per_sm * *block / threads).max(1);
                clamp_blocks(rows.eval(sizes)?.div_ceil(per_block), per_sm, sm_count)
            }
        }
    }
}

/// A column kernel's blocks: a tile of 32 columns times its chunks of rows.
fn column_blocks(cols: u64, rows: u64, sm_count: u32) -> Option<u32> {
    if cols == 0 {
        return Some(1); // it returns at once: no column to write
    }
    let blocks = cols.div_ceil(32).max(1).checked_mul(column_chunks(cols, rows, sm_count))?;
    u32::try_from(blocks).ok().filter(|&b| b <= i32::MAX as u32)
}

/// `wanted` blocks, at least one, at most `max_blocks_per_sm` on each of `sm_count`
/// multiprocessors.
fn clamp_blocks(wanted: u64, max_blocks_per_sm: u32, sm_count: u32) -> Option<u32> {
    let cap = u64::from(max_blocks_per_sm).checked_mul(u64::from(sm_count))?.max(1);
    u32::try_from(wanted.clamp(1, cap)).ok()
}
