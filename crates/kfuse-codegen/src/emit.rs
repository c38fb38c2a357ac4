//! Expression emission: turns graph nodes, evaluated at a point of the iteration space, into
//! CUDA statements with named values (`v0`, `v1`, …).
//!
//! A node is evaluated at a *context*: one coordinate per axis of its own shape, each a domain
//! coordinate, a row-loop variable or a constant (a component index). Operands get their context
//! by NumPy broadcasting (right-aligned, size-1 axes pinned to 0), component access appends a
//! constant, stacking consumes one. Every (node, context) is computed once per scope (memoised),
//! so common subexpressions and shared loads are free.
//!
//! Code is built in a stack of blocks (the loop body, `if` branches, row loops). A value is placed
//! in the innermost block it may live in: never outside an `if` (so loads needed only under a
//! predicate stay lazy), but outside every row loop whose variable it does not use (so row
//! invariants are hoisted). Inputs whose small constant last axis is accessed by component are
//! loaded once per point as one vector (`float4`, `uint2`, …).
//!
//! Not handled here: kernel structure, accumulators' reduction across threads, parameters (see
//! `kernel`).

use std::collections::{BTreeSet, HashMap, HashSet};

use kfuse_ir::{
    BinaryOp, DType, Dim, Graph, Kind, Literal, NodeId, Op, ReduceAxis, ReduceOp, SymId, TernaryOp, UnaryOp,
};

use crate::analysis::{counts_every_element, full_reduce, Analysis};
use crate::cuda::{self, Helper};
use crate::row_cache::RowCache;
use crate::CodegenError;

mod gather;

/// One coordinate of an evaluation context.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Coord {
    /// Coordinate `axis` of the kernel's domain (derived from the flat index `i`).
    Dom(u32),
    /// The variable of row loop number `n` (`j<n>`).
    Loop(u32),
    Const(u64),
    /// A value computed at run time: a gather's index (`name`, a `long long`) or a slice's position
    /// in its operand (`(2 + 3 * j0)`), computed at a
    /// context that uses the row loops `loops`, and the domain's last coordinate (the column of a
    /// row-wise kernel) when `column`.
    Value {
        name: String,
        loops: Vec<u32>,
        column: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Node(NodeId, Vec<Coord>),
    /// A row cache group's array of an input read at the column alone (see `row_cache::Group`).
    ColumnGroup(NodeId),
    Vector(NodeId, Vec<Coord>),
    DomCoord(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    Root,
    Branch,
    Loop(u32),
    /// A row-wise body's block of columns (a loop over them, a group of them, or one): row
    /// mode places values that do not read the column outside it.
    Columns,
}

#[derive(Debug)]
struct Block {
    kind: BlockKind,
    header: String,
    lines: Vec<String>,
    memo: HashMap<Key, String>,
}

/// Where the emitted code runs, which decides how inputs and cross-kernel scalars are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Inside the grid-stride loop of kernel `kernel` (flat index `i`).
    Element { kernel: usize },
    /// In the epilogue of kernel `kernel` (thread 0 of the last block).
    Epilogue { kernel: usize },
    /// A `__device__` function whose inputs are scalar parameters `in<k>`.
    DeviceFn,
}

/// What the emitted code refers to, for the kernel's parameter list and helper section.
#[derive(Clone, Debug, Default)]
pub(crate) struct Uses {
    pub inputs: BTreeSet<u32>,
    pub temps_read: BTreeSet<usize>,
    pub syms: BTreeSet<SymId>,
    pub helpers: BTreeSet<Helper>,
    /// Outputs stored by earlier kernels and read here (see `Emitter::stored_outputs`).
    pub outputs_read: BTreeSet<usize>,
    /// The most operand elements one element's work reads through reductions computed where
    /// they are used (the extents of nested inline reduction loops multiplied; `u64::MAX` for a
    /// symbolic extent); 0 when it has none. Loops a row-wise kernel runs once per row count
    /// once for the row's columns.
    pub recompute: u64,
    /// The reductions computed where they are used that read more than
    /// [`crate::RECOMPUTED_EXTENT_LIMIT`] elements again per element (the planner stores them
    /// once instead, see `stages`).
    pub recomputed: BTreeSet<NodeId>,
}

impl Uses {
    /// Adds what another emitter's code uses (code that goes into the same kernel).
    pub fn absorb(&mut self, other: Uses) {
        self.inputs.extend(other.inputs);
        self.temps_read.extend(other.temps_read);
        self.syms.extend(other.syms);
        self.helpers.extend(other.helpers);
        self.outputs_read.extend(other.outputs_read);
        self.recompute = self.recompute.max(other.recompute);
        self.recomputed.extend(other.recomputed);
    }
}

pub(crate) struct Emitter<'a> {
    g: &'a Graph,
    an: Option<&'a Analysis>,
    mode: Mode,
    /// The kernel's domain (empty outside element mode).
    dims: Vec<Dim>,
    blocks: Vec<Block>,
    next_var: u32,
    next_loop: u32,
    /// Each open inline reduction loop's extent, and the extent it counts for in
    /// [`Uses::recompute`] (1 for a reduction evaluated once per result element), by loop number.
    reduce_extents: HashMap<u32, (Dim, Dim)>,
    pub uses: Uses,
    /// Epilogue mode: for each of this kernel's full reductions, the names of its final slots.
    pub slot_results: HashMap<NodeId, Vec<String>>,
    /// Row-structured element mode: the last domain coordinate is the column variable `col`
    /// and the others derive from the row number `row` (no per-element division).
    pub row_mode: bool,
    /// Row mode: vector stores are plain, not streaming (the rows plan's few valid elements,
    /// stored amid its fill warps' streaming stores: measured faster plain).
    pub plain_stores: bool,
    /// Element mode of a graph with lengths/offsets inputs: each lengths value read is checked
    /// against its bound when the kernel's error record is not null (a violation is recorded and
    /// sets `kf_bad`, see `check`), and float stores write NaN while `kf_bad` holds.
    pub checks: bool,
    /// Values fixed by the caller instead of computed (node → C expression), e.g. a scale
    /// factor replaced by `1.0f` when a kernel computes an unscaled gradient.
    pub substitutions: HashMap<NodeId, String>,
    /// The coordinates a reshape took a row-major position apart into (their names, in axis
    /// order), with the axes' sizes and the position: a later reshape that merges exactly those
    /// coordinates over the same sizes reads the position back instead of recomputing it.
    split_positions: HashMap<Vec<String>, (Vec<u64>, String)>,
    /// Nodes read from the output buffer an earlier kernel stored them in instead of computed
    /// (node → output index): a column reduction of an output (a bias gradient summed from the
    /// input gradient) reads that one tensor, not the ones it is computed from.
    pub stored_outputs: HashMap<NodeId, usize>,
    /// Grid-stride element mode with batched loads: `Some` collects every load the loop body
    /// makes for each element at the flat index `i` outside any branch; the body reads
    /// `kf_pf<k>[kf_u]` instead, and the kernel issues those loads for all of a thread's batched
    /// elements before the first use (several independent loads in flight per thread).
    pub prefetch: Option<Vec<Prefetch>>,
    /// While the body's first top-level branch is open (batched loops): its condition. Loads at
    /// the flat index directly inside it are prefetched too, each under that condition.
    pub prefetch_guard: Option<String>,
    /// The value number past which [`Emitter::eval`] refuses to go on (see
    /// [`crate::MAX_KERNEL_VALUES`]).
    pub max_values: u32,
    /// A row-wise kernel (see `shapes::row_wise`): `(k, cols)` where the first `k` domain axes
    /// number the rows (`row`) and `rowbase` is `row * cols`, so a tensor shaped like those axes
    /// times `cols`, read at the row and a loop variable, is read at `rowbase + j<l>`.
    pub row_base: Option<(usize, Dim)>,
    /// A row-wise kernel's cached branch (see `row_cache`): row-shaped inputs read in its row
    /// loops and its body's column loop come from the lane's registers.
    pub row_cache: Option<RowCache>,
    /// Row mode: the block the row's values live in (the root, or the block of a row loop's body
    /// of its own, see [`Emitter::open_row_block`]).
    row_depth: usize,
    /// Accumulators of float sums declared `float` (see [`Emitter::declare_lane_partial`]): an
    /// element is added to them in f32.
    f32_sums: HashSet<String>,
}

/// One load hoisted out of the loop body into the batched prefetch (see [`Emitter::prefetch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Prefetch {
    /// The C type of one loaded element or vector (a storage type, e.g. `float4`, `uint2`).
    pub ty: String,
    /// The load expression in terms of the flat index `i`.
    pub load: String,
    /// What it loads (for the comment).
    pub note: String,
    /// `Some(cond)`: issued only where `cond` (the body's first branch condition) holds.
    pub guard: Option<String>,
    /// The 32-bit registers that one element's load holds until the body uses it.
    pub regs: u32,
}

type R<T> = Result<T, CodegenError>;

impl<'a> Emitter<'a> {
    pub fn new(g: &'a Graph, an: Option<&'a Analysis>, mode: Mode, dims: Vec<Dim>, first_var: u32) -> Self {
        let root = Block { kind: BlockKind::Root, header: String::new(), lines: Vec::new(), memo: HashMap::new() };
        Emitter {
            g,
            an,
            mode,
            dims,
            blocks: vec![root],
            next_var: first_var,
            next_loop: 0,
            reduce_extents: HashMap::new(),
            uses: Uses::default(),
            slot_results: HashMap::new(),
            row_mode: false,
            plain_stores: false,
            checks: matches!(mode, Mode::Element { .. }) && !g.constraints.is_empty(),
            substitutions: HashMap::new(),
            split_positions: HashMap::new(),
            stored_outputs: HashMap::new(),
            prefetch: None,
            prefetch_guard: None,
            max_values: crate::MAX_KERNEL_VALUES,
            row_base: None,
            row_cache: None,
            f32_sums: HashSet::new(),
            row_depth: 0,
        }
    }

    /// The next unused value number (to continue numbering in another emitter).
    pub fn next_var(&self) -> u32 {
        self.next_var
    }

    /// The root block's lines; every other block must be closed.
    pub fn into_lines(mut self) -> (Vec<String>, Uses) {
        let root = self.blocks.swap_remove(0);
        (root.lines, self.uses)
    }

    pub fn fresh(&mut self, prefix: &str) -> String {
        let v = format!("{prefix}{}", self.next_var);
        self.next_var += 1;
        v
    }

    /// Appends a statement to the innermost block.
    pub fn push_stmt(&mut self, line: String) {
        if let Some(b) = self.blocks.last_mut() {
            b.lines.push(line);
        }
    }

    /// Opens `if (cond) {`; values computed inside stay inside.
    pub fn open_branch(&mut self, cond: &str) {
        self.open(BlockKind::Branch, format!("if ({cond}) {{"));
    }

    /// Opens a column loop of row mode (`header` is the whole `for (...) {` line); values
    /// computed inside stay inside, like a branch's.
    pub fn open_column_loop(&mut self, header: String) {
        self.open(BlockKind::Branch, header);
    }

    /// Opens a row-wise body's block of columns (`header` is its whole first line and any
    /// statements after it): values that do not read the column are placed outside it.
    pub fn open_columns(&mut self, header: String) {
        self.open(BlockKind::Columns, header);
    }

    /// Opens a loop over a row's columns, `for (long long j<l> = start; j<l> < end; j<l> +=
    /// step)`, unrolled `unroll` times, and returns `l`: values that do not use `j<l>` are placed
    /// outside it.
    pub fn open_row_loop(&mut self, start: &str, end: &str, step: &str, unroll: u32) -> u32 {
        let l = self.next_loop;
        self.next_loop += 1;
        let header = match &mut self.row_cache {
            Some(cache) => cache.loop_header(l),
            None => format!("#pragma unroll {unroll}\nfor (long long j{l} = {start}; j{l} < {end}; j{l} += {step}) {{"),
        };
        self.open(BlockKind::Loop(l), header);
        l
    }

    /// Binds `expr` as the value of `n` at `ctx` in the innermost block, where later uses in it and
    /// in blocks inside it find it (a row's fold at the top of its body, or a value valid only in
    /// one lane's branch).
    pub fn bind_here(&mut self, n: NodeId, ctx: Vec<Coord>, expr: String, note: &str) -> String {
        let ty = cuda::value_type(self.g.node(n).dtype);
        let depth = self.blocks.len() - 1;
        self.bind(depth, Key::Node(n, ctx), ty, expr, note)
    }

    /// The innermost block's depth (where [`Emitter::declare_accumulators`] puts what the
    /// statements pushed now use).
    pub fn depth(&self) -> usize {
        self.blocks.len() - 1
    }

    /// The value and loop numbers so far, for [`Emitter::renumber`].
    pub fn mark(&self) -> (u32, u32) {
        (self.next_var, self.next_loop)
    }

    /// Numbers values and loops again from `mark` (what was emitted since is dropped).
    pub fn renumber(&mut self, mark: (u32, u32)) {
        (self.next_var, self.next_loop) = mark;
    }

    /// Opens a block that holds a row loop's body of its own (see [`Emitter::take_row_block`]):
    /// the row's values are placed in it.
    pub fn open_row_block(&mut self) {
        self.open(BlockKind::Branch, String::new());
        self.row_depth = self.depth();
    }

    /// Closes the block [`Emitter::open_row_block`] opened and returns its lines, which go
    /// into a loop of their own.
    pub fn take_row_block(&mut self) -> Vec<String> {
        self.row_depth = 0;
        match self.blocks.len() > 1 {
            true => self.blocks.pop().map(|b| b.lines).unwrap_or_default(),
            false => Vec::new(),
        }
    }

    /// Opens `else {` right after a closed branch.
    pub fn open_else(&mut self) {
        self.open(BlockKind::Branch, "else {".to_string());
    }

    fn open(&mut self, kind: BlockKind, header: String) {
        self.blocks.push(Block { kind, header, lines: Vec::new(), memo: HashMap::new() });
    }

    /// Closes the innermost block into its parent (`} else {` when an else follows).
    pub fn close(&mut self) {
        if self.blocks.len() < 2 {
            return;
        }
        let Some(b) = self.blocks.pop() else { return };
        let Some(parent) = self.blocks.last_mut() else { return };
        if b.header == "else {" && parent.lines.last().is_some_and(|l| l == "}") {
            parent.lines.pop();
            parent.lines.push("} else {".to_string());
        } else {
            // A header may start with a `#pragma` line of its own, and end with indented
            // statements of the block.
            parent.lines.extend(b.header.lines().map(str::to_string));
        }
        parent.lines.extend(b.lines.into_iter().map(|l| format!("    {l}")));
        parent.lines.push("}".to_string());
    }

    fn lookup(&self, key: &Key) -> Option<String> {
        self.blocks.iter().rev().find_map(|b| b.memo.get(key).cloned())
    }

    /// The innermost block a value with context `ctx` may live in (see the module docs).
    fn target_depth(&self, ctx: &[Coord]) -> usize {
        let loop_depth = |l: u32| self.blocks.iter().position(|b| b.kind == BlockKind::Loop(l));
        let loops = ctx.iter().flat_map(|c| match c {
            Coord::Loop(l) => std::slice::from_ref(l),
            Coord::Value { loops, .. } => loops.as_slice(),
            Coord::Dom(_) | Coord::Const(_) => &[],
        });
        let dv = loops.filter_map(|l| loop_depth(*l)).max().unwrap_or(0);
        // Row mode: a value that reads neither the column nor a run-time coordinate (a gather's
        // index, computed where it is used) is the same for the whole row.
        let column = Coord::Dom(self.dims.len().saturating_sub(1) as u32);
        let per_row =
            self.row_mode && !ctx.iter().any(|c| *c == column || matches!(c, Coord::Value { column: true, .. }));
        let outside = |kind: BlockKind| match kind {
            BlockKind::Loop(_) => true,
            BlockKind::Columns => per_row,
            _ => false,
        };
        match (dv + 1..self.blocks.len()).find(|&d| outside(self.blocks[d].kind)) {
            Some(d) => d - 1,
            None => self.blocks.len() - 1,
        }
    }

    /// Records inline reduction loop `l` of extent `d` (just opened) in `uses.recompute`: the
    /// product of the extents of the reduction loops open around it, per element (divided by the
    /// columns a lane takes in a row-wise kernel's per-row code, outside its columns). A loop of a
    /// reduction evaluated once per element of its result (`own`) counts as 1: it reads its
    /// operand once, which is its own work, not work again.
    fn note_reduce_loop(&mut self, n: NodeId, l: u32, d: Dim, own: bool) {
        self.reduce_extents.insert(l, (d, if own { Dim::Const(1) } else { d }));
        let work = self.blocks.iter().try_fold(1u64, |acc, b| match b.kind {
            BlockKind::Loop(j) => match self.reduce_extents.get(&j) {
                Some((_, Dim::Const(e))) => Some(acc.saturating_mul(*e)),
                Some((_, Dim::Sym(_))) => None,
                None => Some(acc),
            },
            _ => Some(acc),
        });
        // A row-wise kernel's per-row code (outside its columns) runs in every lane of the row's
        // group: once for the columns a lane takes, about `ROW_COLS_PER_LANE` of them (the most
        // lanes a row may get, blocks of up to 1024 threads, counted).
        let per_row = self.row_mode && !self.blocks.iter().any(|b| b.kind == BlockKind::Columns);
        let work = match (work, self.dims.last()) {
            (Some(w), Some(Dim::Const(cols))) if per_row && *cols > 0 => {
                w / (cols / crate::row_lanes(*cols, 1024)).max(1)
            }
            (Some(w), _) => w,
            (None, _) => u64::MAX,
        };
        self.uses.recompute = self.uses.recompute.max(work);
        if !own && work > crate::RECOMPUTED_EXTENT_LIMIT {
            self.uses.recomputed.insert(n);
        }
    }

    /// Whether inline reduction `n`, about to open its loops, is evaluated once per element of
    /// its result: the domain's elements times the extents of the reduction loops open around it
    /// are at most its result's elements (a reduction the kernel stores, or one inside it whose
    /// every result element is read once).
    fn evaluated_once(&self, n: NodeId) -> bool {
        let mut evaluated = self.dims.clone();
        for b in &self.blocks {
            if let BlockKind::Loop(j) = b.kind {
                if let Some((d, _)) = self.reduce_extents.get(&j) {
                    evaluated.push(*d);
                }
            }
        }
        let evaluated = crate::SizeExpr::of(&evaluated);
        let result = crate::SizeExpr::of(self.g.node(n).shape.dims());
        matches!((evaluated, result), (Some(e), Some(r)) if e.at_most(&r))
    }

    /// Whether coordinate `c` reads the domain's last coordinate (a row-wise kernel's column):
    /// that coordinate itself, or a run-time value computed from it.
    pub(crate) fn reads_column(&self, c: &Coord) -> bool {
        match c {
            Coord::Dom(a) => *a as usize + 1 == self.dims.len(),
            Coord::Value { column, .. } => *column,
            Coord::Loop(_) | Coord::Const(_) => false,
        }
    }

    fn bind(&mut self, depth: usize, key: Key, ty: &str, expr: String, note: &str) -> String {
        let name = self.fresh("v");
        let b = &mut self.blocks[depth];
        b.lines.push(format!("const {ty} {name} = {expr}; // {note}"));
        b.memo.insert(key, name.clone());
        name
    }

    /// The name of a size symbol's parameter.
    pub fn sym(&mut self, s: SymId) -> String {
        self.uses.syms.insert(s);
        format!("sz{}", s.0)
    }

    pub fn dim(&mut self, d: Dim) -> String {
        match d {
            Dim::Const(c) => c.to_string(),
            Dim::Sym(s) => self.sym(s),
        }
    }

    /// The product of `dims` as a C expression (`1` when empty).
    pub fn product(&mut self, dims: &[Dim]) -> String {
        let parts: Vec<String> = dims.iter().filter(|d| **d != Dim::Const(1)).map(|&d| self.dim(d)).collect();
        if parts.is_empty() {
            "1".to_string()
        } else {
            parts.join(" * ")
        }
    }

    fn coord(&mut self, c: &Coord) -> String {
        match *c {
            Coord::Const(k) => k.to_string(),
            Coord::Loop(l) => format!("j{l}"),
            Coord::Value { ref name, .. } => name.clone(),
            Coord::Dom(a) => {
                let key = Key::DomCoord(a);
                if let Some(v) = self.lookup(&key) {
                    return v;
                }
                let dims = self.dims.clone();
                let a = a as usize;
                let last = dims.len().saturating_sub(1);
                if self.row_mode && a == last {
                    return "col".to_string();
                }
                // Row mode: the row number is the flat index over every axis but the last, so the
                // derivation is the same with `row` for `i` and the last axis left out.
                let (flat, end, depth) = if self.row_mode {
                    ("row", last, self.row_depth)
                } else {
                    ("i", dims.len(), self.target_depth(&[]))
                };
                let inner = self.product(&dims[a + 1..end]);
                if self.row_mode && inner == "1" && a == 0 {
                    return "row".to_string();
                }
                self.uses.helpers.insert(Helper::DivMod);
                let mut e = if inner == "1" { flat.to_string() } else { format!("kf_div({flat}, {inner})") };
                if a > 0 {
                    let d = self.dim(dims[a]);
                    e = format!("kf_mod({e}, {d})");
                }
                self.bind(depth, key, "long long", e, &format!("coordinate {a} of the domain"))
            }
        }
    }

    /// The coordinate `start + step * c` of a slice's operand at the slice's coordinate `c`: a
    /// constant stays one; any other is a run-time value ([`Coord::Value`], which no fast path
    /// takes for a domain coordinate).
    fn affine(&mut self, c: &Coord, start: u32, step: u32) -> Coord {
        let (start, step) = (u64::from(start), u64::from(step));
        if start == 0 && step == 1 {
            return c.clone();
        }
        let loops = match c {
            Coord::Const(k) => return Coord::Const(start + step * k),
            Coord::Loop(l) => vec![*l],
            Coord::Value { loops, .. } => loops.clone(),
            Coord::Dom(_) => Vec::new(),
        };
        let column = self.reads_column(c);
        let e = self.coord(c);
        let name = match (start, step) {
            (s, 1) => format!("({e} + {s})"),
            (0, k) => format!("({k} * {e})"),
            (s, k) => format!("({s} + {k} * {e})"),
        };
        Coord::Value { name, loops, column }
    }

    /// The context of a reshape's operand `x` for the reshape `n` at `ctx`: each group of constant
    /// axes ([`kfuse_ir::reshape_groups`]) takes the row-major position of its result coordinates
    /// apart into the operand's axes (divisions by constants); a whole axis keeps its coordinate.
    fn reshape_ctx(&mut self, n: NodeId, x: NodeId, ctx: &[Coord]) -> R<Vec<Coord>> {
        let internal = |what| CodegenError::Internal { node: n.0, what };
        let (from, to) = (self.g.node(x).shape.dims().to_vec(), self.g.node(n).shape.dims().to_vec());
        let groups = kfuse_ir::reshape_groups(&from, &to).ok_or(internal("a reshape whose axes do not regroup"))?;
        let konst = |d: &Dim| match d {
            Dim::Const(c) => Ok(*c),
            Dim::Sym(_) => Err(internal("a reshape splits or merges a symbolic axis")),
        };
        let mut out = Vec::with_capacity(from.len());
        for grp in groups {
            if grp.is_whole() {
                out.push(ctx.get(grp.to.start).cloned().ok_or(internal("a reshape's context is short"))?);
                continue;
            }
            let sizes = from[grp.from.clone()].iter().map(konst).collect::<R<Vec<u64>>>()?;
            let to_sizes = to[grp.to.clone()].iter().map(konst).collect::<R<Vec<u64>>>()?;
            let coords = ctx.get(grp.to.clone()).ok_or(internal("a reshape's context is short"))?;
            let column = coords.iter().any(|c| self.reads_column(c));
            // The group's row-major position among the result's axes: a constant, or an expression
            // of the coordinates (and the loops they use).
            let (mut flat, mut text, mut loops) = (0u64, String::new(), Vec::new());
            let mut stride = 1u64;
            let mut names = Vec::with_capacity(coords.len());
            for c in coords {
                if let Coord::Value { name, loops: ls, .. } = c {
                    loops.extend(ls);
                    names.push(name.clone());
                }
            }
            let merged = match self.split_positions.get(&names) {
                Some((sizes, p)) if names.len() == coords.len() && *sizes == to_sizes => Some(p.clone()),
                _ => None,
            };
            for (c, &size) in coords.iter().zip(&to_sizes).rev().filter(|_| merged.is_none()) {
                match c {
                    Coord::Const(k) => flat += k * stride,
                    _ if size == 1 => {}
                    c => {
                        if let Coord::Loop(l) = c {
                            loops.push(*l);
                        }
                        let e = self.coord(c);
                        let term = if stride == 1 { e } else { format!("{stride} * {e}") };
                        text = if text.is_empty() { term } else { format!("{term} + {text}") };
                    }
                }
                stride *= size;
            }
            loops.sort_unstable();
            loops.dedup();
            let position = match (merged, text.is_empty(), flat) {
                (Some(p), _, _) => Some(p),
                (None, true, _) => None,
                (None, false, 0) => Some(format!("({text})")),
                (None, false, k) => Some(format!("({text} + {k})")),
            };
            // A group that splits or merges has sizes of at least 1 (see `reshape_groups`).
            let mut inner: u64 = sizes.iter().product();
            let mut parts = Vec::with_capacity(sizes.len());
            for (m, &size) in sizes.iter().enumerate() {
                inner /= size;
                let coord = match &position {
                    _ if size == 1 => Coord::Const(0),
                    None => Coord::Const(flat / inner % size),
                    Some(p) => {
                        let mut e = p.clone();
                        if inner > 1 {
                            e = format!("({e} / {inner})");
                        }
                        if m > 0 {
                            e = format!("({e} % {size})");
                        }
                        parts.push(e.clone());
                        Coord::Value { name: e, loops: loops.clone(), column }
                    }
                };
                out.push(coord);
            }
            if let (Some(p), true) = (position, parts.len() == sizes.len()) {
                self.split_positions.insert(parts, (sizes, p));
            }
        }
        Ok(out)
    }

    /// The row-major element offset of `ctx` in a tensor of shape `dims` (the flat index `i`
    /// directly when the tensor's leading axes are the domain).
    fn offset(&mut self, dims: &[Dim], ctx: &[Coord]) -> String {
        let r = self.dims.len();
        if let Some((k, cols)) = self.row_base {
            let row_axes = ctx.len() == k + 1 && ctx[..k].iter().enumerate().all(|(a, c)| *c == Coord::Dom(a as u32));
            if let (true, Some(Coord::Loop(l))) =
                (row_axes && dims[..k] == self.dims[..k] && dims[k] == cols, ctx.last())
            {
                return format!("rowbase + j{l}");
            }
        }
        let aligned = matches!(self.mode, Mode::Element { .. })
            && dims.len() >= r
            && dims[..r] == self.dims[..]
            && ctx[..r].iter().enumerate().all(|(a, c)| *c == Coord::Dom(a as u32));
        let (mut acc, start) = if aligned { (Some("i".to_string()), r) } else { (None, 0) };
        for (d, c) in dims[start..].iter().zip(&ctx[start..]) {
            let c = self.coord(c);
            acc = Some(match acc {
                None => c,
                Some(a) => {
                    let a = if a.contains(' ') { format!("({a})") } else { a };
                    let d = self.dim(*d);
                    if c == "0" {
                        format!("{a} * {d}")
                    } else {
                        format!("{a} * {d} + {c}")
                    }
                }
            });
        }
        acc.unwrap_or_else(|| "0".to_string())
    }

    /// The context of operand `x` of a node with shape `dims` evaluated at `ctx` (broadcast).
    pub fn operand_ctx(&self, dims: &[Dim], ctx: &[Coord], x: NodeId) -> Vec<Coord> {
        let xd = self.g.node(x).shape.dims();
        let off = dims.len() - xd.len();
        xd.iter()
            .enumerate()
            .map(|(a, d)| {
                if *d == Dim::Const(1) && dims[off + a] != Dim::Const(1) {
                    Coord::Const(0)
                } else {
                    ctx[off + a].clone()
                }
            })
            .collect()
    }

    /// Emits whatever computes node `n` at context `ctx` and returns an expression for it (a
    /// value name or a literal).
    ///
    /// Operands are evaluated depth first, the first operand first, each value bound once its
    /// operands are (post order). The walk keeps its own stack of pending work ([`Task`]), so the
    /// depth of the graph costs heap, not the thread's stack.
    pub fn eval(&mut self, n: NodeId, ctx: &[Coord]) -> R<String> {
        let mut tasks = vec![Task::Eval(n, ctx.to_vec())];
        let mut values: Vec<String> = Vec::new();
        while let Some(task) = tasks.pop() {
            if self.next_var > self.max_values {
                return Err(CodegenError::TooLarge { node: n.0, limit: self.max_values });
            }
            match task {
                Task::Eval(n, ctx) => self.start(n, ctx, &mut tasks, &mut values)?,
                Task::Finish(n, ctx) => {
                    let v = self.finish(n, &ctx, &mut values)?;
                    values.push(v);
                }
                Task::FinishStack { n, ctx, sel, parts } => {
                    let vals = pop_values(&mut values, parts, n)?;
                    // The parts were evaluated last to first; the select chain nests from the last.
                    let mut e = String::new();
                    for (k, v) in (0..parts).rev().zip(vals) {
                        e = if e.is_empty() { v } else { format!("({sel} == {k} ? {v} : {e})") };
                    }
                    let depth = self.target_depth(&ctx);
                    let ty = cuda::value_type(self.g.node(n).dtype);
                    let note = format!("n{}", n.0);
                    values.push(self.bind(depth, Key::Node(n, ctx), ty, e, &note));
                }
                Task::GatherRead(n, ctx) => {
                    let [index] = pop_array(&mut values, n)?;
                    self.start_gather(n, ctx, &index, &mut tasks)?;
                }
                Task::GatherDone(r) => {
                    let [v] = pop_array(&mut values, r.n)?;
                    values.push(self.finish_gather(*r, &v));
                }
                Task::ReduceGuarded(r) => {
                    let mv = pop_values(&mut values, 1, r.n)?.remove(0);
                    self.open_branch(&mv);
                    self.reduce_element(r, &mut tasks);
                }
                Task::ReduceFinish(r) => {
                    let v = match update_needs_value(r.op, r.mask) {
                        true => Some(pop_values(&mut values, 1, r.n)?.remove(0)),
                        false => None,
                    };
                    let line = self.update_line(r.op, float_extremum(r.op, self.g.node(r.x).dtype), &r.accs, v);
                    self.push_stmt(line);
                    values.push(self.close_row_reduce(*r));
                }
            }
        }
        match (values.pop(), values.is_empty()) {
            (Some(v), true) => Ok(v),
            _ => Err(CodegenError::Internal { node: n.0, what: "the evaluation left no single value" }),
        }
    }

    /// The first step of evaluating `n` at `ctx`: a value that is known or needs no operand is
    /// pushed on `values`; otherwise the work it needs is pushed on `tasks` (the operands on top,
    /// the first operand topmost, so that it is evaluated first).
    fn start(&mut self, n: NodeId, ctx: Vec<Coord>, tasks: &mut Vec<Task>, values: &mut Vec<String>) -> R<()> {
        let g = self.g;
        let node = g.node(n);
        if let Op::Const(l) = node.op {
            values.push(cuda::literal(l, node.dtype));
            return Ok(());
        }
        if let Some(v) = self.substitutions.get(&n) {
            values.push(v.clone());
            return Ok(());
        }
        let key = Key::Node(n, ctx.clone());
        if let Some(v) = self.lookup(&key) {
            values.push(v);
            return Ok(());
        }
        if let Some(v) = self.eval_elsewhere(n, &key)? {
            values.push(v);
            return Ok(());
        }
        if let Some(v) = self.read_row_value(n, &key, &ctx) {
            values.push(v);
            return Ok(());
        }
        if let Some(&o) = self.stored_outputs.get(&n) {
            self.uses.outputs_read.insert(o);
            let off = self.offset(node.shape.dims(), &ctx);
            let e = cuda::load_conversion(node.dtype, &format!("out{o}[{off}]"));
            self.note_conversion(node.dtype);
            let depth = self.target_depth(&ctx);
            let note = format!("n{} output {}, stored by an earlier kernel", n.0, self.g.outputs[o].name);
            values.push(self.bind(depth, key, cuda::value_type(node.dtype), e, &note));
            return Ok(());
        }
        let dims = node.shape.dims();
        match node.op {
            Op::Const(_) => return Err(CodegenError::Internal { node: n.0, what: "constant reached the value path" }),
            Op::Component { x, index } => {
                let mut c = ctx;
                c.push(Coord::Const(u64::from(index)));
                tasks.push(Task::Eval(x, c));
            }
            Op::ExpandLast(x) => {
                let mut c = ctx;
                c.pop();
                tasks.push(Task::Eval(x, c));
            }
            Op::Unsqueeze { x, axes } => tasks.push(Task::Eval(x, squeeze_ctx(ctx, axes))),
            Op::Select { x, axis, index } => {
                let mut c = ctx;
                c.insert(axis as usize, Coord::Const(u64::from(index)));
                tasks.push(Task::Eval(x, c));
            }
            Op::Slice { x, axis, start, step } => {
                let mut c = ctx;
                let a = axis as usize;
                c[a] = self.affine(&c[a], start, step);
                tasks.push(Task::Eval(x, c));
            }
            Op::Transpose { x, a, b } => {
                let mut c = ctx;
                c.swap(a as usize, b as usize);
                tasks.push(Task::Eval(x, c));
            }
            Op::Reshape(x) => match self.cached_reshape(n, x, &ctx) {
                Some(v) => values.push(v),
                None => {
                    let c = self.reshape_ctx(n, x, &ctx)?;
                    tasks.push(Task::Eval(x, c));
                }
            },
            Op::Stack(l) => self.start_stack(n, l, dims, ctx, tasks)?,
            Op::Input(id) => values.push(self.load_input(n, id.0, &ctx)?),
            Op::Iota { axis } => {
                let expr = format!("(int){}", self.coord(&ctx[axis as usize]));
                let depth = self.target_depth(&ctx);
                values.push(self.bind(depth, key, cuda::value_type(node.dtype), expr, &format!("n{}", n.0)));
            }
            Op::Rand { seed } => {
                if self.mode == Mode::DeviceFn {
                    return Err(CodegenError::Unsupported {
                        node: n.0,
                        what: "rand_like inside a device function (it has no element index)".into(),
                    });
                }
                // The seed is a scalar, read once wherever the element is.
                tasks.push(Task::Finish(n, ctx));
                tasks.push(Task::Eval(seed, Vec::new()));
            }
            Op::Cast(x) | Op::Unary(_, x) => {
                let xc = self.operand_ctx(dims, &ctx, x);
                tasks.push(Task::Finish(n, ctx));
                tasks.push(Task::Eval(x, xc));
            }
            Op::Binary(_, a, b) => {
                let (ac, bc) = (self.operand_ctx(dims, &ctx, a), self.operand_ctx(dims, &ctx, b));
                // A widened i32 compared on 32 bits: its operand is the i32 value (see `finish`).
                let (a, b) = match widened_i32(g, n) {
                    Some((0, x)) => (x, b),
                    Some((_, x)) => (a, x),
                    None => (a, b),
                };
                tasks.push(Task::Finish(n, ctx));
                tasks.push(Task::Eval(b, bc));
                tasks.push(Task::Eval(a, ac));
            }
            Op::Ternary(_, a, b, c) => {
                let (ac, bc, cc) =
                    (self.operand_ctx(dims, &ctx, a), self.operand_ctx(dims, &ctx, b), self.operand_ctx(dims, &ctx, c));
                tasks.push(Task::Finish(n, ctx));
                tasks.push(Task::Eval(c, cc));
                tasks.push(Task::Eval(b, bc));
                tasks.push(Task::Eval(a, ac));
            }
            Op::Reduce { axis, x, .. } if counts_every_element(self.g, n) => {
                // The product of the reduced axes' sizes: no loop, no pass over the row.
                let xdims = self.g.node(x).shape.dims();
                let rank = xdims.len();
                let reduced: Vec<Dim> = (0..rank).filter(|&a| axis.reduces(a, rank)).map(|a| xdims[a]).collect();
                let expr = format!("({})({})", cuda::value_type(node.dtype), self.product(&reduced));
                let depth = self.target_depth(&ctx);
                values.push(self.bind(
                    depth,
                    key,
                    cuda::value_type(node.dtype),
                    expr,
                    &format!("n{} the count of every element", n.0),
                ));
            }
            Op::Reduce { op, axis, x, mask } => self.start_row_reduce(n, op, axis, x, mask, ctx, tasks)?,
            Op::Gather { index, .. } => {
                if self.mode == Mode::DeviceFn {
                    return Err(CodegenError::Unsupported {
                        node: n.0,
                        what: "gather inside a device function (its inputs are scalars)".into(),
                    });
                }
                let ic = self.operand_ctx(dims, &ctx, index);
                tasks.push(Task::GatherRead(n, ctx));
                tasks.push(Task::Eval(index, ic));
            }
        }
        Ok(())
    }

    /// The last step of evaluating an elementwise node whose operands' values are on top of
    /// `values`: its expression, bound to a new value name.
    fn finish(&mut self, n: NodeId, ctx: &[Coord], values: &mut Vec<String>) -> R<String> {
        let g = self.g;
        let node = g.node(n);
        let expr = match node.op {
            Op::Cast(x) => {
                let [v] = pop_array(values, n)?;
                cast(g.node(x).dtype, node.dtype, &v)
            }
            Op::Rand { .. } => {
                // The same value at the same element whatever the kernel's shape: the seed and
                // the element's flat row-major index in the node's own shape.
                let [seed] = pop_array(values, n)?;
                let off = self.offset(node.shape.dims(), ctx);
                self.uses.helpers.insert(Helper::Philox);
                format!("kf_philox_uniform({seed}, (long long)({off}))")
            }
            Op::Unary(op, _) => {
                let [v] = pop_array(values, n)?;
                if matches!(op, UnaryOp::Digamma | UnaryOp::Trigamma) {
                    self.uses.helpers.insert(Helper::Polygamma);
                }
                if op == UnaryOp::Rounded {
                    self.note_conversion(node.dtype);
                }
                unary(op, node.dtype, &v)
            }
            Op::Binary(op, a, b) => {
                let [va, vb] = pop_array(values, n)?;
                if let Some((k, _)) = widened_i32(g, n) {
                    // `(long long)i == w` as `w` fits in 32 bits and equals `i` there: the test of
                    // fitting reads `w` alone, so NVVM computes it once where `w` is the same for
                    // many elements (a row's label against each column's index).
                    let (w, i) = if k == 0 { (&vb, &va) } else { (&va, &vb) };
                    let fits = format!("(long long)(int)({w}) == ({w})");
                    let expr = match op {
                        BinaryOp::Eq => format!("({fits} && (int)({w}) == {i})"),
                        _ => format!("!({fits} && (int)({w}) == {i})"),
                    };
                    let depth = self.target_depth(ctx);
                    return Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), "bool", expr, &format!("n{}", n.0)));
                }
                let dtype = g.node(a).dtype;
                let kind = dtype.kind();
                if kind == Kind::Float && matches!(op, BinaryOp::Min | BinaryOp::Max) {
                    self.uses.helpers.insert(Helper::MinMaxF32);
                }
                if matches!(op, BinaryOp::Remainder | BinaryOp::FloorDiv | BinaryOp::Shl | BinaryOp::Shr)
                    || (op == BinaryOp::Fmod && kind == Kind::Int)
                {
                    self.uses.helpers.insert(match dtype {
                        DType::I64 => Helper::Int64DivShift,
                        _ if kind == Kind::Float => Helper::FloatDiv,
                        _ => Helper::IntDivShift,
                    });
                }
                if op.is_comparison() && matches!(dtype, DType::F16 | DType::BF16) {
                    // Compared as stored, rounded to their dtype, as the interpreter and PyTorch
                    // compare them (a loaded input already is).
                    self.note_conversion(dtype);
                    let stored = |x: NodeId, v: &str| {
                        if holds_its_dtype(g, x, dtype) {
                            v.to_string()
                        } else {
                            unary(UnaryOp::Rounded, dtype, v)
                        }
                    };
                    binary(op, dtype, &stored(a, &va), &stored(b, &vb))
                } else {
                    binary(op, dtype, &va, &vb)
                }
            }
            Op::Ternary(op, ..) => {
                let [va, vb, vc] = pop_array(values, n)?;
                match (op, node.dtype.kind()) {
                    (TernaryOp::Select, _) => format!("({va} ? {vb} : {vc})"),
                    (TernaryOp::Clamp, Kind::Float) => {
                        self.uses.helpers.insert(Helper::MinMaxF32);
                        format!("kf_minf(kf_maxf({va}, {vb}), {vc})")
                    }
                    (TernaryOp::Clamp, _) => {
                        let lo = binary(BinaryOp::Max, node.dtype, &va, &vb);
                        binary(BinaryOp::Min, node.dtype, &lo, &vc)
                    }
                    (TernaryOp::Fma, Kind::Float) => format!("fmaf({va}, {vb}, {vc})"),
                    (TernaryOp::Fma, _) if node.dtype == DType::I64 => format!(
                        "(long long)((unsigned long long){va} * (unsigned long long){vb} + (unsigned long long){vc})"
                    ),
                    (TernaryOp::Fma, _) => {
                        format!("(int)((unsigned int){va} * (unsigned int){vb} + (unsigned int){vc})")
                    }
                }
            }
            _ => return Err(CodegenError::Internal { node: n.0, what: "a node without operands was finished" }),
        };
        let depth = self.target_depth(ctx);
        let ty = cuda::value_type(node.dtype);
        Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), ty, expr, &format!("n{}", n.0)))
    }

    /// Scalars that another kernel (a Temp buffer) or this kernel's final reduction provides.
    fn eval_elsewhere(&mut self, n: NodeId, key: &Key) -> R<Option<String>> {
        let (Some(an), false) = (self.an, self.mode == Mode::DeviceFn) else { return Ok(None) };
        let node = self.g.node(n);
        let Some(h) = an.home[n.index()].filter(|_| node.shape.is_scalar()) else { return Ok(None) };
        let kernel = match self.mode {
            Mode::Element { kernel } | Mode::Epilogue { kernel } => kernel,
            Mode::DeviceFn => return Ok(None),
        };
        let depth = self.target_depth(&[]);
        if h < kernel {
            let t = *an
                .temps
                .get(&n)
                .ok_or(CodegenError::Internal { node: n.0, what: "cross-kernel scalar without a temp" })?;
            self.uses.temps_read.insert(t);
            let e = cuda::load_conversion(temp_dtype(node.dtype), &format!("tmp{t}[0]"));
            let ty = cuda::value_type(node.dtype);
            return Ok(Some(self.bind(depth, key.clone(), ty, e, &format!("n{} from an earlier kernel", n.0))));
        }
        if h > kernel || matches!(self.mode, Mode::Element { .. }) {
            return Err(CodegenError::Internal {
                node: n.0,
                what: "a scalar is needed before the kernel that computes it",
            });
        }
        let Some((op, x, _)) = full_reduce(self.g, n) else { return Ok(None) };
        let slots = self
            .slot_results
            .get(&n)
            .cloned()
            .ok_or(CodegenError::Internal { node: n.0, what: "reduction without slots" })?;
        let e = finish_reduce(op, self.g.node(x).dtype, &slots);
        Ok(Some(self.bind(depth, key.clone(), cuda::value_type(node.dtype), e, &format!("n{}", n.0))))
    }

    /// A row reduction that an earlier row-wise kernel stored, one value per row (see
    /// `Analysis::row_values`): loaded at its row instead of reduced again.
    fn read_row_value(&mut self, n: NodeId, key: &Key, ctx: &[Coord]) -> Option<String> {
        let (Some(an), Mode::Element { kernel }) = (self.an, self.mode) else { return None };
        let t = match (an.row_values.get(&n), an.temps.get(&n)) {
            (Some(&w), Some(&t)) if w < kernel => t,
            _ => return None,
        };
        self.uses.temps_read.insert(t);
        let node = self.g.node(n);
        let off = self.offset(node.shape.dims(), ctx);
        let e = cuda::load_conversion(temp_dtype(node.dtype), &format!("tmp{t}[{off}]"));
        let depth = self.target_depth(ctx);
        let note = format!("n{} per row, from an earlier kernel", n.0);
        Some(self.bind(depth, key.clone(), cuda::value_type(node.dtype), e, &note))
    }

    /// Starts a stack: at a constant index it is that part; at a run-time index every part is
    /// evaluated (the last first) and selected by the index.
    fn start_stack(
        &mut self,
        n: NodeId,
        l: kfuse_ir::ListId,
        dims: &[Dim],
        ctx: Vec<Coord>,
        tasks: &mut Vec<Task>,
    ) -> R<()> {
        let parts = self.g.list(l);
        let inner = &dims[..dims.len() - 1];
        let pctx = &ctx[..ctx.len() - 1];
        if let Some(Coord::Const(k)) = ctx.last() {
            let p = *parts
                .get(*k as usize)
                .ok_or(CodegenError::Internal { node: n.0, what: "stack index out of range" })?;
            tasks.push(Task::Eval(p, self.operand_ctx(inner, pctx, p)));
            return Ok(());
        }
        // A run-time index into the stacked axis: evaluate every part and select.
        let sel = self.coord(&ctx[ctx.len() - 1]);
        let part_tasks: Vec<Task> = parts.iter().map(|&p| Task::Eval(p, self.operand_ctx(inner, pctx, p))).collect();
        tasks.push(Task::FinishStack { n, ctx, sel, parts: parts.len() });
        tasks.extend(part_tasks);
        Ok(())
    }

    fn load_input(&mut self, n: NodeId, input: u32, ctx: &[Coord]) -> R<String> {
        if self.mode == Mode::DeviceFn {
            return Ok(format!("in{input}"));
        }
        self.uses.inputs.insert(input);
        let node = self.g.node(n);
        let (dtype, dims) = (node.dtype, node.shape.dims().to_vec());
        let name = format!("in{input}");
        if self.an.is_some_and(|an| an.strided.contains(&input)) {
            // Read through the launch's strides: from the row kept in registers (loaded from the
            // row's start through the strides, see `row_cache`), else one element at a time (no
            // vectors, no batched loads).
            self.note_conversion(dtype);
            let depth = self.target_depth(ctx);
            let note = format!("{} {dtype}, strided", self.g.inputs[input as usize].name);
            if let Some(e) = self.cached_load(input, &dims, ctx) {
                return Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note));
            }
            let off = self.strided_offset(input, ctx);
            let e = cuda::load_conversion(dtype, &format!("{name}[{off}]"));
            return Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note));
        }
        let lengths_bound = self.lengths_bound(input);
        if let (None, Some(Dim::Const(c)), Some(Coord::Const(k))) = (lengths_bound, dims.last(), ctx.last()) {
            if let Some(vty) = cuda::vector_type(dtype, *c) {
                let prefix = ctx[..ctx.len() - 1].to_vec();
                let vkey = Key::Vector(n, prefix.clone());
                let v = match self.lookup(&vkey) {
                    Some(v) => v,
                    None => {
                        let off = self.offset(&dims[..dims.len() - 1], &prefix);
                        let depth = self.target_depth(&prefix);
                        let e = format!("reinterpret_cast<const {vty}*>({name})[{off}]");
                        let note = format!("{} {c} x {dtype} at once", self.g.inputs[input as usize].name);
                        let e = self.prefetched(depth, &off, (vty, dtype.size_bytes() * *c as usize), e, &note);
                        self.bind(depth, vkey, vty, e, &note)
                    }
                };
                self.note_conversion(dtype);
                let e = cuda::vector_extract(&v, dtype, *c, *k);
                if dtype == DType::F32 {
                    return Ok(e); // a lane of a float4: nothing to compute
                }
                let depth = self.target_depth(ctx);
                let note = format!("{}[.., {k}]", self.g.inputs[input as usize].name);
                return Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note));
            }
        }
        let off = self.offset(&dims, ctx);
        self.note_conversion(dtype);
        let depth = self.target_depth(ctx);
        let note = format!("{} {dtype}", self.g.inputs[input as usize].name);
        if let Some(e) = self.cached_load(input, &dims, ctx) {
            return Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note));
        }
        if let Some(e) = self.group_load(n, input, dtype, &off) {
            return Ok(self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note));
        }
        let ty = (cuda::storage_type(dtype), dtype.size_bytes());
        let raw = self.prefetched(depth, &off, ty, format!("{name}[{off}]"), &note);
        let e = cuda::load_conversion(dtype, &raw);
        let v = self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note);
        if let Some(bound) = lengths_bound {
            let bound = self.dim(bound);
            self.uses.helpers.insert(Helper::Report);
            self.blocks[depth].lines.push(crate::check::lengths_check(input, &off, &v, &bound));
        }
        Ok(v)
    }

    /// The element offset of `ctx` in strided input `input`: each coordinate times its axis's
    /// stride argument (`st<input>_<axis>`, see `Param::Stride`).
    fn strided_offset(&mut self, input: u32, ctx: &[Coord]) -> String {
        let mut terms = Vec::with_capacity(ctx.len());
        for (a, c) in ctx.iter().enumerate() {
            if *c == Coord::Const(0) {
                continue;
            }
            let c = self.coord(c);
            let c = if c.contains(' ') { format!("({c})") } else { c };
            terms.push(format!("{c} * st{input}_{a}"));
        }
        if terms.is_empty() {
            "0".to_string()
        } else {
            terms.join(" + ")
        }
    }

    /// Reshape `n` of input `x` read from the row cache at `ctx`, when `x` is contiguous (not
    /// read through strides) and the reshape is shaped like the rows: a reshape keeps the
    /// elements' order, so its rows are the input's memory as the cache loads it (a row of merged
    /// trailing axes, kept in registers by a kernel that passes over it twice).
    fn cached_reshape(&mut self, n: NodeId, x: NodeId, ctx: &[Coord]) -> Option<String> {
        let Op::Input(id) = self.g.node(x).op else { return None };
        if self.mode == Mode::DeviceFn || self.an.is_some_and(|an| an.strided.contains(&id.0)) {
            return None;
        }
        let dims = self.g.node(n).shape.dims().to_vec();
        let e = self.cached_load(id.0, &dims, ctx)?;
        self.uses.inputs.insert(id.0);
        let dtype = self.g.node(n).dtype;
        self.note_conversion(dtype);
        let depth = self.target_depth(ctx);
        let note = format!("{} {dtype}, as rows of a reshape", self.g.inputs[id.0 as usize].name);
        Some(self.bind(depth, Key::Node(n, ctx.to_vec()), cuda::value_type(dtype), e, &note))
    }

    /// The register of the row cache that holds input `input` (of shape `dims`) at `ctx`, when
    /// the row cache is on, the input is shaped like the rows, and `ctx` is the row at a cached
    /// loop's column or at the body's column.
    fn cached_load(&mut self, input: u32, dims: &[Dim], ctx: &[Coord]) -> Option<String> {
        let (k, cols) = self.row_base?;
        let rows = |c: &[Coord]| c.iter().enumerate().all(|(a, c)| *c == Coord::Dom(a as u32));
        if dims.len() != k + 1 || dims[..k] != self.dims[..k] || dims[k] != cols || ctx.len() != k + 1 {
            return None;
        }
        if self.lengths_bound(input).is_some() {
            return None;
        }
        let row_mode = self.row_mode;
        let dtype = self.g.inputs[input as usize].dtype;
        let cache = self.row_cache.as_mut()?;
        let slot = match ctx[k] {
            Coord::Loop(l) if rows(&ctx[..k]) => cache.loop_slot(l)?,
            Coord::Dom(a) if a as usize == k && row_mode && rows(ctx) => cache.body.clone()?,
            _ => return None,
        };
        cache.slot(input, dtype, &slot)
    }

    /// In a cached row's group of columns: input `input` (node `n`) read at the column alone
    /// (offset `off` is `col`) comes from the group's array, loaded once a group.
    fn group_load(&mut self, n: NodeId, input: u32, dtype: DType, off: &str) -> Option<String> {
        let group = self.row_cache.as_ref()?.group.as_ref()?;
        if off != "col" || self.lengths_bound(input).is_some() {
            return None;
        }
        let (depth, q) = (group.depth, group.q);
        let key = Key::ColumnGroup(n);
        let name = match self.blocks[depth].memo.get(&key) {
            Some(name) => name.clone(),
            None => {
                let name = self.fresh("kf_d");
                let note = self.g.inputs[input as usize].name.clone();
                let lines = self.row_cache.as_mut()?.group_load_lines(input, dtype, &name, &note);
                let b = &mut self.blocks[depth];
                b.lines.extend(lines);
                b.memo.insert(key, name.clone());
                name
            }
        };
        Some(format!("{name}[{q}]"))
    }

    /// In a cached row's group of columns: the statement that keeps the value `v` of output
    /// `output` (of `dtype`, stored at the element) for the group's store, when the store is
    /// unconditional.
    pub fn group_store(&mut self, output: usize, dtype: DType, v: &str) -> Option<String> {
        let depth = self.depth();
        let cache = self.row_cache.as_mut()?;
        let w = cache.width;
        let group = cache.group.as_mut()?;
        if depth != group.column_depth {
            return None;
        }
        if !group.outputs.iter().any(|o| o.0 == output) {
            group.outputs.push((output, dtype));
            let ty = cuda::value_type(dtype);
            let d = group.depth;
            self.blocks[d].lines.push(format!("{ty} kf_o{output}[{w}]; // the group's values of output {output}"));
        }
        let q = self.row_cache.as_ref()?.group.as_ref()?.q;
        Some(format!("kf_o{output}[{q}] = {v};"))
    }

    /// The bound of input `input` when it is a lengths input whose reads this emitter checks.
    fn lengths_bound(&self, input: u32) -> Option<Dim> {
        if !self.checks {
            return None;
        }
        self.g.constraints.iter().find_map(|c| match *c {
            kfuse_ir::Constraint::Lengths { input: i, max } if i.0 == input => Some(max),
            _ => None,
        })
    }

    /// A load `load` of type `ty` placed in block `depth` at offset `off`: when it is one of the
    /// body's unconditional per-element loads and prefetching is on, it is recorded and the
    /// prefetched register (`kf_pf<k>[kf_u]`) is returned instead.
    fn prefetched(&mut self, depth: usize, off: &str, (ty, bytes): (&str, usize), load: String, note: &str) -> String {
        let guard = match depth {
            0 => None,
            1 if self.prefetch_guard.is_some() && self.blocks.len() == 2 => self.prefetch_guard.clone(),
            _ => return load,
        };
        match &mut self.prefetch {
            Some(list) if off == "i" => {
                // One register per load: a load under the branch and the same load outside it
                // share one, issued for every element.
                let same = |p: &Prefetch| p.load == load && (p.guard == guard || p.guard.is_none() || guard.is_none());
                let k = match list.iter().position(same) {
                    Some(k) => {
                        if guard.is_none() {
                            list[k].guard = None;
                        }
                        k
                    }
                    None => {
                        let regs = bytes.div_ceil(4).max(1) as u32;
                        list.push(Prefetch { ty: ty.to_string(), load, note: note.to_string(), guard, regs });
                        list.len() - 1
                    }
                };
                format!("kf_pf{k}[kf_u]")
            }
            _ => load,
        }
    }

    /// Records the conversion helper that loads or stores of `dtype` use.
    pub fn note_conversion(&mut self, dtype: DType) {
        match dtype {
            DType::F16 => {
                self.uses.helpers.insert(Helper::F16);
            }
            DType::BF16 => {
                self.uses.helpers.insert(Helper::BF16);
            }
            _ => {}
        }
    }

    /// Starts a reduction along the last axis or over a set of axes: one loop per reduced axis,
    /// nested in the operand's order, in the block the result belongs to (the reduced axes'
    /// coordinates are the loop variables; kept axes take the result's coordinates, 0 on the
    /// axes that `keepdim` left), then its guard (when it has one) and its element are
    /// evaluated inside.
    #[allow(clippy::too_many_arguments)]
    fn start_row_reduce(
        &mut self,
        n: NodeId,
        op: ReduceOp,
        axis: ReduceAxis,
        x: NodeId,
        mask: Option<NodeId>,
        ctx: Vec<Coord>,
        tasks: &mut Vec<Task>,
    ) -> R<()> {
        if self.mode == Mode::DeviceFn {
            return Err(CodegenError::Unsupported {
                node: n.0,
                what: "reductions inside a device function (its inputs are scalars)".into(),
            });
        }
        if full_reduce(self.g, n).is_some() {
            return Err(CodegenError::Internal { node: n.0, what: "a full reduction reached the row-loop path" });
        }
        let depth = self.target_depth(&ctx);
        let saved = self.blocks.split_off(depth + 1);
        let xd = self.g.node(x).dtype;
        let accs = self.declare_accumulators(depth, op, xd);
        let xdims = self.g.node(x).shape.dims();
        let rank = xdims.len();
        let own = self.evaluated_once(n);
        let mut xctx = Vec::with_capacity(rank);
        // The result's axis that the operand's next axis corresponds to.
        let mut next = 0;
        let mut loops = 0;
        for (a, &d) in xdims.iter().enumerate() {
            if !axis.reduces(a, rank) {
                let c = ctx
                    .get(next)
                    .ok_or(CodegenError::Internal { node: n.0, what: "a reduction's context is too short" })?;
                xctx.push(c.clone());
                next += 1;
                continue;
            }
            next += usize::from(axis.keepdim());
            let l = self.next_loop;
            self.next_loop += 1;
            let extent = self.dim(d);
            self.open(BlockKind::Loop(l), format!("for (long long j{l} = 0; j{l} < {extent}; ++j{l}) {{"));
            xctx.push(Coord::Loop(l));
            loops += 1;
            self.note_reduce_loop(n, l, d, own);
        }
        let guard = self.reduce_guard(op, x, mask, &xctx);
        let r = Box::new(RowReduce { n, op, x, mask, ctx, xctx, depth, saved, accs, loops, guarded: guard.is_some() });
        match guard {
            Some((m, mctx)) => {
                tasks.push(Task::ReduceGuarded(r));
                tasks.push(Task::Eval(m, mctx));
            }
            None => self.reduce_element(r, tasks),
        }
        Ok(())
    }

    /// Inside a row reduction's loop (and guard): evaluates its element, then adds it.
    fn reduce_element(&mut self, r: Box<RowReduce>, tasks: &mut Vec<Task>) {
        let element = update_needs_value(r.op, r.mask).then(|| Task::Eval(r.x, r.xctx.clone()));
        tasks.push(Task::ReduceFinish(r));
        tasks.extend(element);
    }

    /// Closes a row reduction's guard and loops, puts back the blocks it set aside, and binds
    /// its result in the block it belongs to.
    fn close_row_reduce(&mut self, r: RowReduce) -> String {
        if r.guarded {
            self.close();
        }
        for _ in 0..r.loops {
            self.close();
        }
        self.blocks.extend(r.saved);
        let xd = self.g.node(r.x).dtype;
        let e = finish_reduce(r.op, xd, &r.accs);
        let ty = cuda::value_type(self.g.node(r.n).dtype);
        let note = match self.g.node(r.n).op {
            Op::Reduce { axis: axis @ ReduceAxis::Axes { .. }, .. } => {
                let axes: Vec<String> = axis.axes(r.xctx.len()).iter().map(|a| a.to_string()).collect();
                format!("n{} {} over axes [{}]", r.n.0, r.op.name(), axes.join(", "))
            }
            _ => format!("n{} {} along the last axis", r.n.0, r.op.name()),
        };
        self.bind(r.depth, Key::Node(r.n, r.ctx), ty, e, &note)
    }

    /// Declares the f64 accumulators of a reduction in block `depth` and returns their names.
    pub fn declare_accumulators(&mut self, depth: usize, op: ReduceOp, xd: DType) -> Vec<String> {
        let n = crate::analysis::slots_of(op);
        let init = reduce_identity(op, xd);
        // A float maximum or minimum is exact in f32: its accumulator needs no f64 conversion per
        // element (its folds and partial slots still take it as a double).
        let ty = if float_extremum(op, xd) { "float" } else { "double" };
        (0..n)
            .map(|k| {
                let a = self.fresh("a");
                let v = if k == 0 { init.clone() } else { "0.0".to_string() };
                self.blocks[depth].lines.push(format!("{ty} {a} = {v};"));
                a
            })
            .collect()
    }

    /// Declares a float sum's f32 accumulator in block `depth`: the elements that
    /// [`Emitter::reduce_update`] adds to it are added in f32, with no conversion to f64 each.
    pub fn declare_lane_partial(&mut self, depth: usize) -> String {
        let p = self.fresh("p");
        self.blocks[depth].lines.push(format!("float {p} = 0.0f;"));
        self.f32_sums.insert(p.clone());
        p
    }

    /// Looks through `x[.., None]`, component access and stacking at a constant index, so that
    /// the same value reached two ways has one (node, context) key.
    pub fn canonical(&self, mut n: NodeId, mut ctx: Vec<Coord>) -> (NodeId, Vec<Coord>) {
        loop {
            let node = self.g.node(n);
            match node.op {
                Op::ExpandLast(x) => {
                    ctx.pop();
                    n = x;
                }
                Op::Unsqueeze { x, axes } => {
                    ctx = squeeze_ctx(ctx, axes);
                    n = x;
                }
                Op::Component { x, index } => {
                    ctx.push(Coord::Const(u64::from(index)));
                    n = x;
                }
                Op::Select { x, axis, index } => {
                    ctx.insert(axis as usize, Coord::Const(u64::from(index)));
                    n = x;
                }
                Op::Transpose { x, a, b } => {
                    ctx.swap(a as usize, b as usize);
                    n = x;
                }
                Op::Stack(l) => {
                    let Some(Coord::Const(k)) = ctx.last().cloned() else { return (n, ctx) };
                    let Some(&p) = self.g.list(l).get(k as usize) else { return (n, ctx) };
                    let dims = node.shape.dims().to_vec();
                    ctx = self.operand_ctx(&dims[..dims.len() - 1], &ctx[..ctx.len() - 1], p);
                    n = p;
                }
                _ => return (n, ctx),
            }
        }
    }

    /// The predicate under which a reduction element counts: its mask, or for an unmasked
    /// `count` the counted value itself (so `count(m)` shares the branch of everything masked by
    /// `m`). Returns the node and its context.
    pub fn reduce_guard(
        &self,
        op: ReduceOp,
        x: NodeId,
        mask: Option<NodeId>,
        xctx: &[Coord],
    ) -> Option<(NodeId, Vec<Coord>)> {
        let xdims = self.g.node(x).shape.dims().to_vec();
        match (op, mask) {
            (ReduceOp::Count, None) => Some(self.canonical(x, xctx.to_vec())),
            (_, Some(m)) => Some(self.canonical(m, self.operand_ctx(&xdims, xctx, m))),
            _ => None,
        }
    }

    /// Adds one element to the accumulators under the reduction's guard (see
    /// [`Emitter::reduce_guard`]), in a branch of its own when it has one.
    pub fn reduce_update_guarded(
        &mut self,
        op: ReduceOp,
        x: NodeId,
        mask: Option<NodeId>,
        xctx: &[Coord],
        accs: &[String],
    ) -> R<()> {
        match self.reduce_guard(op, x, mask, xctx) {
            Some((m, mctx)) => {
                let mv = self.eval(m, &mctx)?;
                self.open_branch(&mv);
                self.reduce_update(op, x, mask, xctx, accs)?;
                self.close();
                Ok(())
            }
            None => self.reduce_update(op, x, mask, xctx, accs),
        }
    }

    /// Adds one element to the accumulators, assuming its guard holds.
    pub fn reduce_update(
        &mut self,
        op: ReduceOp,
        x: NodeId,
        mask: Option<NodeId>,
        xctx: &[Coord],
        accs: &[String],
    ) -> R<()> {
        let v = match update_needs_value(op, mask) {
            true => Some(self.eval(x, xctx)?),
            false => None,
        };
        let line = self.update_line(op, float_extremum(op, self.g.node(x).dtype), accs, v);
        self.push_stmt(line);
        Ok(())
    }

    /// The statement that adds an element of value `v` (`None` for an unmasked count, which
    /// needs none) to the accumulators `accs` of reduction `op`.
    fn update_line(&mut self, op: ReduceOp, float: bool, accs: &[String], v: Option<String>) -> String {
        let a = &accs[0];
        let Some(v) = v else { return format!("{a} += 1.0;") };
        match op {
            ReduceOp::Max | ReduceOp::Min if float => {
                self.uses.helpers.insert(Helper::MinMaxF32);
                let f = if op == ReduceOp::Max { "kf_maxf" } else { "kf_minf" };
                format!("{a} = {f}({a}, {v});")
            }
            ReduceOp::Count => format!("{a} += {v} ? 1.0 : 0.0;"),
            ReduceOp::Sum | ReduceOp::Mean if self.f32_sums.contains(a) => match accs.get(1) {
                Some(c) => format!("{a} += {v}; {c} += 1.0;"),
                None => format!("{a} += {v};"),
            },
            ReduceOp::Sum => format!("{a} += (double){v};"),
            ReduceOp::Mean => format!("{a} += (double){v}; {} += 1.0;", accs[1]),
            ReduceOp::Prod => format!("{a} *= (double){v};"),
            ReduceOp::Max | ReduceOp::Min => {
                self.uses.helpers.insert(Helper::MinMaxF64);
                let f = if op == ReduceOp::Max { "kf_max_f64" } else { "kf_min_f64" };
                format!("{a} = {f}({a}, (double){v});")
            }
        }
    }
}

/// Pending work of [`Emitter::eval`]'s walk, on its own stack.
enum Task {
    /// Evaluate a node at a context and push its value.
    Eval(NodeId, Vec<Coord>),
    /// The operands' values are on top of the value stack: bind the node's expression.
    Finish(NodeId, Vec<Coord>),
    /// A stack at a run-time index `sel`: the values of its `parts` parts are on top, the first
    /// part's topmost.
    FinishStack { n: NodeId, ctx: Vec<Coord>, sel: String, parts: usize },
    /// A gather whose index value is on top: open the branch where it is in range, then evaluate
    /// the source at the gathered position.
    GatherRead(NodeId, Vec<Coord>),
    /// A gather whose source value is on top: store it and close the branch.
    GatherDone(Box<gather::GatherRead>),
    /// A row reduction whose guard's value is on top: open the branch, then the element.
    ReduceGuarded(Box<RowReduce>),
    /// A row reduction whose element's value (when it needs one) is on top: add it and close.
    ReduceFinish(Box<RowReduce>),
}

/// A row reduction between its steps: its loop is open, the blocks it left are set aside.
struct RowReduce {
    n: NodeId,
    op: ReduceOp,
    x: NodeId,
    mask: Option<NodeId>,
    ctx: Vec<Coord>,
    xctx: Vec<Coord>,
    /// The block its accumulators and result live in.
    depth: usize,
    /// The blocks inside that one, put back when the loop closes.
    saved: Vec<Block>,
    accs: Vec<String>,
    /// How many loops it opened (one per reduced axis).
    loops: usize,
    guarded: bool,
}

/// The context of the operand of an [`Op::Unsqueeze`] at `ctx`: the new axes' coordinates left
/// out.
fn squeeze_ctx(ctx: Vec<Coord>, axes: u32) -> Vec<Coord> {
    ctx.into_iter().enumerate().filter(|(a, _)| *a >= 32 || axes >> a & 1 == 0).map(|(_, c)| c).collect()
}

/// Whether adding an element of reduction `op` reads its value (an unmasked count only counts).
fn update_needs_value(op: ReduceOp, mask: Option<NodeId>) -> bool {
    !(op == ReduceOp::Count && mask.is_none())
}

/// The last `k` values, in the order they were pushed.
fn pop_values(values: &mut Vec<String>, k: usize, n: NodeId) -> R<Vec<String>> {
    let at =
        values.len().checked_sub(k).ok_or(CodegenError::Internal { node: n.0, what: "an operand value is missing" })?;
    Ok(values.split_off(at))
}

/// The last `K` values, in the order they were pushed.
fn pop_array<const K: usize>(values: &mut Vec<String>, n: NodeId) -> R<[String; K]> {
    pop_values(values, K, n)?
        .try_into()
        .map_err(|_| CodegenError::Internal { node: n.0, what: "an operand value is missing" })
}

/// The storage dtype of a Temp buffer holding a scalar computed as `dtype` (floats stay f32:
/// a value crossing kernels is not rounded to f16/bf16; ints keep their width).
pub(crate) fn temp_dtype(dtype: DType) -> DType {
    match dtype.kind() {
        Kind::Float => DType::F32,
        Kind::Int => dtype,
        Kind::Bool => DType::Bool,
    }
}

/// Whether reduction `op` of `xd` values accumulates in f32: a maximum or minimum of floats.
fn float_extremum(op: ReduceOp, xd: DType) -> bool {
    matches!(op, ReduceOp::Max | ReduceOp::Min) && xd.kind() == Kind::Float
}

/// The starting value of a reduction's first accumulator (the empty result: -inf or +inf for a
/// float maximum or minimum, which accumulates in f32; for `i32` max/min the extreme `i32`, as
/// the interpreter gives; f64 otherwise).
pub(crate) fn reduce_identity(op: ReduceOp, xd: DType) -> String {
    match (op, xd.kind()) {
        (ReduceOp::Max, Kind::Float) => "__int_as_float(0xff800000)".into(),
        (ReduceOp::Min, Kind::Float) => "__int_as_float(0x7f800000)".into(),
        (ReduceOp::Max, Kind::Int) => "-2147483648.0".into(),
        (ReduceOp::Min, Kind::Int) => "2147483647.0".into(),
        (ReduceOp::Max, _) => "__longlong_as_double(0xfff0000000000000ll)".into(),
        (ReduceOp::Min, _) => "__longlong_as_double(0x7ff0000000000000ll)".into(),
        (ReduceOp::Prod, _) => "1.0".into(),
        _ => "0.0".into(),
    }
}

/// The reduction's result from its final f64 accumulators, in the result's computed type. An
/// `i32` sum saturates at the `i32` limits instead of wrapping; an `i64` result is exact while the
/// accumulator stays within ±2^53 (beyond, the conversion saturates at the `i64` limits).
pub(crate) fn finish_reduce(op: ReduceOp, xd: DType, accs: &[String]) -> String {
    let a = &accs[0];
    match (op, xd.kind()) {
        (ReduceOp::Count, _) => format!("(int)(long long){a}"),
        (ReduceOp::Mean, _) => format!("(float)({a} / {})", accs[1]),
        // Exact in f64 up to 2^53; a total outside the i32 range is clamped to its nearest limit
        // (a kernel cannot stop with an error; the interpreter refuses such a sum).
        (_, Kind::Int) if xd == DType::I64 => format!("(long long){a}"),
        (ReduceOp::Sum, Kind::Int) => format!("(int)fmin(fmax({a}, -2147483648.0), 2147483647.0)"),
        (_, Kind::Int) => format!("(int){a}"),
        _ => format!("(float){a}"),
    }
}

/// Whether node `x`, compared as `dtype` (f16 or bf16), holds a value of that dtype exactly: an
/// input of it, read through views, or a literal that it represents. Other values are computed in
/// f32.
fn holds_its_dtype(g: &Graph, mut x: NodeId, dtype: DType) -> bool {
    loop {
        match g.node(x).op {
            Op::Input(_) => return g.node(x).dtype == dtype,
            Op::Const(literal @ (Literal::Float(_) | Literal::Int(_))) => {
                let v = f64::from(literal.as_f64() as f32); // as the kernel holds it
                return dtype.round(v) == v || v.is_nan();
            }
            Op::Component { x: y, .. } | Op::Reshape(y) | Op::ExpandLast(y) => x = y,
            _ => return false,
        }
    }
}

fn cast(from_dtype: DType, to_dtype: DType, v: &str) -> String {
    let (from, to) = (from_dtype.kind(), to_dtype.kind());
    match (from_dtype, to_dtype) {
        (DType::I64, DType::I64) => return v.to_string(),
        // Keeps the low 32 bits (two's complement), as the interpreter does.
        (DType::I64, DType::I32) => return format!("(int)(unsigned int)(unsigned long long){v}"),
        // From a float: cvt.rzi.s64 truncates and saturates at the i64 range, but gives the
        // lowest i64 for NaN (measured on an H200), so NaN is mapped to 0 first.
        (_, DType::I64) if from == Kind::Float => return format!("({v} != {v} ? 0ll : (long long){v})"),
        (_, DType::I64) if from == Kind::Int => return format!("(long long){v}"),
        _ => {}
    }
    match (from, to) {
        // Float to float is exact: no rounding inside a graph.
        (Kind::Float, Kind::Float) | (Kind::Int, Kind::Int) | (Kind::Bool, Kind::Bool) => v.to_string(),
        (Kind::Float, Kind::Int) => format!("(int){v}"), // cvt.rzi: truncates, saturates, NaN -> 0
        (Kind::Float, Kind::Bool) => format!("({v} != 0.0f)"),
        (Kind::Int, Kind::Bool) => format!("({v} != 0)"),
        (Kind::Int, Kind::Float) => format!("(float){v}"),
        (Kind::Bool, Kind::Float) => format!("({v} ? 1.0f : 0.0f)"),
        (Kind::Bool, _) => format!("({v} ? 1 : 0)"),
    }
}

fn unary(op: UnaryOp, dtype: DType, v: &str) -> String {
    let kind = dtype.kind();
    match (op, dtype) {
        (UnaryOp::Neg, DType::I64) => return format!("(long long)(0ull - (unsigned long long){v})"),
        (UnaryOp::Abs, DType::I64) => return format!("({v} < 0 ? (long long)(0ull - (unsigned long long){v}) : {v})"),
        (UnaryOp::Sign, DType::I64) => return format!("(long long)(({v} > 0) - ({v} < 0))"),
        _ => {}
    }
    match (op, kind) {
        (UnaryOp::Neg, Kind::Int) => format!("(int)(0u - (unsigned int){v})"),
        (UnaryOp::Abs, Kind::Int) => format!("({v} < 0 ? (int)(0u - (unsigned int){v}) : {v})"),
        (UnaryOp::Neg, _) => format!("-{v}"),
        (UnaryOp::Not, _) => format!("!{v}"),
        (UnaryOp::Abs, _) => format!("fabsf({v})"),
        (UnaryOp::Exp, _) => format!("expf({v})"),
        (UnaryOp::Log, _) => format!("logf({v})"),
        (UnaryOp::Sqrt, _) => format!("sqrtf({v})"),
        (UnaryOp::Rsqrt, _) => format!("rsqrtf({v})"),
        (UnaryOp::Sigmoid, _) => format!("1.0f / (1.0f + expf(-{v}))"),
        (UnaryOp::Tanh, _) => format!("tanhf({v})"),
        (UnaryOp::Erf, _) => format!("erff({v})"),
        (UnaryOp::Sin, _) => format!("sinf({v})"),
        (UnaryOp::Cos, _) => format!("cosf({v})"),
        (UnaryOp::Floor, _) => format!("floorf({v})"),
        (UnaryOp::Log1p, _) => format!("log1pf({v})"),
        (UnaryOp::Expm1, _) => format!("expm1f({v})"),
        (UnaryOp::Sign, Kind::Int) => format!("(({v} > 0) - ({v} < 0))"),
        (UnaryOp::Sign, _) => format!("({v} > 0.0f ? 1.0f : ({v} < 0.0f ? -1.0f : 0.0f))"),
        (UnaryOp::Round, _) => format!("rintf({v})"), // round half to even
        (UnaryOp::Trunc, _) => format!("truncf({v})"),
        (UnaryOp::Ceil, _) => format!("ceilf({v})"),
        (UnaryOp::IsNan, _) => format!("({v} != {v})"),
        (UnaryOp::IsInf, _) => format!("(fabsf({v}) == __int_as_float(0x7f800000))"),
        (UnaryOp::IsFinite, _) => format!("(fabsf({v}) < __int_as_float(0x7f800000))"),
        (UnaryOp::Atan, _) => format!("atanf({v})"),
        (UnaryOp::Tan, _) => format!("tanf({v})"),
        (UnaryOp::Asin, _) => format!("asinf({v})"),
        (UnaryOp::Acos, _) => format!("acosf({v})"),
        (UnaryOp::Sinh, _) => format!("sinhf({v})"),
        (UnaryOp::Asinh, _) => format!("asinhf({v})"),
        (UnaryOp::Acosh, _) => format!("acoshf({v})"),
        (UnaryOp::Atanh, _) => format!("atanhf({v})"),
        (UnaryOp::Lgamma, _) => format!("lgammaf({v})"),
        (UnaryOp::Digamma, _) => format!("kf_digammaf({v})"),
        (UnaryOp::Trigamma, _) => format!("kf_trigammaf({v})"),
        (UnaryOp::Erfinv, _) => format!("erfinvf({v})"),
        (UnaryOp::Erfc, _) => format!("erfcf({v})"),
        (UnaryOp::Cosh, _) => format!("coshf({v})"),
        (UnaryOp::BitNot, _) => format!("~{v}"),
        (UnaryOp::Detach, _) => v.to_string(),
        (UnaryOp::Rounded, _) => match dtype {
            DType::F16 | DType::BF16 => cuda::load_conversion(dtype, &cuda::store_conversion(dtype, v)),
            _ => v.to_string(),
        },
    }
}

fn binary(op: BinaryOp, dtype: DType, a: &str, b: &str) -> String {
    use BinaryOp::*;
    let kind = dtype.kind();
    if dtype == DType::I64 {
        match op {
            Remainder => return format!("kf_rem_i64({a}, {b})"),
            Fmod => return format!("kf_fmod_i64({a}, {b})"),
            FloorDiv => return format!("kf_floordiv_i64({a}, {b})"),
            Shl => return format!("kf_shl_i64({a}, {b})"),
            Shr => return format!("kf_shr_i64({a}, {b})"),
            _ => {}
        }
    }
    let sym = match op {
        Add => "+",
        Sub => "-",
        Mul => "*",
        Div => "/",
        Eq => "==",
        Ne => "!=",
        Lt => "<",
        Le => "<=",
        Gt => ">",
        Ge => ">=",
        And => "&&",
        Or => "||",
        BitAnd => "&",
        BitOr => "|",
        BitXor => "^",
        Pow => return format!("powf({a}, {b})"),
        Atan2 => return format!("atan2f({a}, {b})"),
        Remainder if kind == Kind::Float => return format!("kf_remf({a}, {b})"),
        Remainder => return format!("kf_rem_i32({a}, {b})"),
        Fmod if kind == Kind::Float => return format!("fmodf({a}, {b})"),
        Fmod => return format!("kf_fmod_i32({a}, {b})"),
        Hypot => return format!("hypotf({a}, {b})"),
        Copysign => return format!("copysignf({a}, {b})"),
        FloorDiv if kind == Kind::Float => return format!("kf_floordivf({a}, {b})"),
        FloorDiv => return format!("kf_floordiv_i32({a}, {b})"),
        Shl => return format!("kf_shl_i32({a}, {b})"),
        Shr => return format!("kf_shr_i32({a}, {b})"),
        Min if kind == Kind::Float => return format!("kf_minf({a}, {b})"),
        Max if kind == Kind::Float => return format!("kf_maxf({a}, {b})"),
        Min => return format!("({a} < {b} ? {a} : {b})"),
        Max => return format!("({a} > {b} ? {a} : {b})"),
    };
    if dtype == DType::I64 && matches!(op, Add | Sub | Mul) {
        // i64 arithmetic wraps too, through unsigned long long.
        return format!("(long long)((unsigned long long){a} {sym} (unsigned long long){b})");
    }
    if kind == Kind::Int && matches!(op, Add | Sub | Mul) {
        // i32 arithmetic wraps (as the interpreter's does); signed overflow is undefined in C++.
        return format!("(int)((unsigned int){a} {sym} (unsigned int){b})");
    }
    format!("{a} {sym} {b}")
}

/// For `==` or `!=` of two i64 values one of which widens an i32 (a column's index compared with
/// an i64 label): which operand (0 or 1) it is and the i32 node it widens. Emitted as a 32-bit
/// comparison (see `Emitter::finish`).
fn widened_i32(g: &Graph, n: NodeId) -> Option<(usize, NodeId)> {
    let Op::Binary(BinaryOp::Eq | BinaryOp::Ne, a, b) = g.node(n).op else { return None };
    if g.node(a).dtype != DType::I64 {
        return None;
    }
    [a, b].into_iter().enumerate().find_map(|(k, o)| match g.node(o).op {
        Op::Cast(x) if g.node(x).dtype == DType::I32 => Some((k, x)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use kfuse_ir::{BinaryOp, DType, GraphBuilder, Shape};

    use super::{Emitter, Mode};
    use crate::CodegenError;

    #[test]
    fn an_emitter_stops_at_its_value_limit_with_an_error_naming_it() {
        let mut b = GraphBuilder::new();
        let mut v = b.input("x", DType::F32, Shape::scalar()).unwrap();
        for _ in 0..5000 {
            let one = b.lit_float(1.5);
            v = b.binary(BinaryOp::Mul, v, one).unwrap();
        }
        b.output("y", v).unwrap();
        let g = b.finish().unwrap();
        let out = g.outputs[0].node;
        let mut em = Emitter::new(&g, None, Mode::DeviceFn, Vec::new(), 0);
        em.max_values = 1000;
        let err = em.eval(out, &[]).unwrap_err();
        assert!(matches!(err, CodegenError::TooLarge { limit: 1000, .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("more than 1000 values") && message.contains("split the program"), "{message}");
        // Within the limit the same chain is emitted, one value per node.
        let mut em = Emitter::new(&g, None, Mode::DeviceFn, Vec::new(), 0);
        assert_eq!(em.eval(out, &[]).unwrap(), "v4999");
    }
}
