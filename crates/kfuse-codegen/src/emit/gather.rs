//! `gather(x, index, axis)` at a context: the index is evaluated at the context, then `x` at the
//! same context with the gather axis's coordinate replaced by the index value
//! ([`Coord::Value`]), so that any source expression is evaluated at the gathered position only.
//! The source is evaluated under `if (index in range)`, so an index outside `0..size` reads
//! nothing; the result is NaN there (floats) or 0 (ints, `false`). The interpreter refuses such
//! an index; the generated code does not check it.

use kfuse_ir::{DType, Kind, NodeId, Op};

use super::{Block, Coord, Emitter, Key, Task, R};
use crate::{cuda, CodegenError};

/// A gather between its steps: its branch is open, the blocks it left are set aside.
pub(super) struct GatherRead {
    pub n: NodeId,
    ctx: Vec<Coord>,
    /// The block its result lives in.
    depth: usize,
    /// The blocks inside that one, put back when the branch closes.
    saved: Vec<Block>,
    /// The result variable, declared with the out-of-range value.
    result: String,
}

impl Emitter<'_> {
    /// With the index's value `index` known: declares the result and the in-range test in the
    /// block the result belongs to, opens the branch and queues the source's evaluation.
    pub(super) fn start_gather(&mut self, n: NodeId, ctx: Vec<Coord>, index: &str, tasks: &mut Vec<Task>) -> R<()> {
        let g = self.g;
        let node = g.node(n);
        let Op::Gather { x, index: index_node, axis } = node.op else {
            return Err(CodegenError::Internal { node: n.0, what: "a gather step for another op" });
        };
        let a = axis as usize;
        let size = *g
            .node(x)
            .shape
            .dims()
            .get(a)
            .ok_or(CodegenError::Internal { node: n.0, what: "a gather axis past the source's rank" })?;
        let size = self.dim(size);
        let depth = self.target_depth(&ctx);
        // The index as a `long long` (an `i32` one widened, so that offsets do not overflow).
        let at = match g.node(index_node).dtype {
            DType::I64 => index.to_string(),
            _ => {
                let at = self.fresh("v");
                let line = format!("const long long {at} = {index}; // n{} gathers at this index", n.0);
                self.blocks[depth].lines.push(line);
                at
            }
        };
        let (ok, result) = (self.fresh("v"), self.fresh("v"));
        let ty = cuda::value_type(node.dtype);
        let (missing, word) = match node.dtype.kind() {
            Kind::Float => ("__int_as_float(0x7fc00000)", "NaN"),
            Kind::Int if node.dtype == DType::I64 => ("0ll", "0"),
            Kind::Int => ("0", "0"),
            Kind::Bool => ("false", "false"),
        };
        let lines = &mut self.blocks[depth].lines;
        lines.push(format!(
            "const bool {ok} = (unsigned long long){at} < (unsigned long long)({size}); // the index is in 0..{size}"
        ));
        lines.push(format!(
            "{ty} {result} = {missing}; // n{} gathered along axis {a}: {word} where the index is out of range",
            n.0
        ));
        let saved = self.blocks.split_off(depth + 1);
        self.open_branch(&ok);
        let loops = ctx
            .iter()
            .flat_map(|c| match c {
                Coord::Loop(l) => vec![*l],
                Coord::Value { loops, .. } => loops.clone(),
                Coord::Dom(_) | Coord::Const(_) => Vec::new(),
            })
            .collect();
        // The index was read at `ctx`: a column of its own wherever `ctx` reads the column.
        let column = ctx.iter().any(|c| self.reads_column(c));
        let mut xctx = ctx.clone();
        xctx[a] = Coord::Value { name: at, loops, column };
        tasks.push(Task::GatherDone(Box::new(GatherRead { n, ctx, depth, saved, result })));
        tasks.push(Task::Eval(x, xctx));
        Ok(())
    }

    /// With the source's value `v` known: stores it, closes the branch, puts back the blocks set
    /// aside and binds the result.
    pub(super) fn finish_gather(&mut self, r: GatherRead, v: &str) -> String {
        self.push_stmt(format!("{} = {v};", r.result));
        self.close();
        self.blocks.extend(r.saved);
        self.blocks[r.depth].memo.insert(Key::Node(r.n, r.ctx), r.result.clone());
        r.result
    }
}
