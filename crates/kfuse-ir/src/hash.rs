//! A stable structural hash of a graph: blake3 over a canonical byte encoding, identical across
//! runs, builds and machines (never `DefaultHasher`).

use std::fmt;

use crate::{Dim, Graph, Literal, Op, ReduceAxis, Shape};

/// The blake3 hash of a graph's canonical encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphHash(pub [u8; 32]);

impl GraphHash {
    /// The first 16 hex digits, as used in kernel names (`kf_<short>`).
    pub fn short(&self) -> String {
        self.to_string()[..16].to_string()
    }
}

impl fmt::Display for GraphHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GraphHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GraphHash({self})")
    }
}

struct Enc(blake3::Hasher);

impl Enc {
    fn u(&mut self, v: u64) {
        self.0.update(&v.to_le_bytes());
    }
    fn s(&mut self, v: &str) {
        self.u(v.len() as u64);
        self.0.update(v.as_bytes());
    }
    fn shape(&mut self, s: &Shape) {
        self.u(s.rank() as u64);
        for d in &s.0 {
            match d {
                Dim::Sym(x) => {
                    self.u(0);
                    self.u(x.0 as u64)
                }
                Dim::Const(c) => {
                    self.u(1);
                    self.u(*c)
                }
            }
        }
    }
}

impl Graph {
    /// The stable structural hash (names of inputs, outputs and symbols included, since they are
    /// part of the interface).
    pub fn stable_hash(&self) -> GraphHash {
        let mut e = Enc(blake3::Hasher::new());
        e.s("kfuse-graph/1");
        e.u(self.symbols.len() as u64);
        for s in &self.symbols {
            e.s(s);
        }
        e.u(self.inputs.len() as u64);
        for i in &self.inputs {
            e.s(&i.name);
            e.s(i.dtype.name());
            e.shape(&i.shape);
        }
        e.u(self.nodes.len() as u64);
        for n in &self.nodes {
            e.s(n.dtype.name());
            e.shape(&n.shape);
            // The Debug form of an op is made of names and plain integers only: stable.
            match n.op {
                Op::Const(Literal::Float(bits)) => e.s(&format!("const f {bits:016x}")),
                Op::Stack(l) => {
                    e.s("stack");
                    for p in self.list(l) {
                        e.u(p.0 as u64);
                    }
                }
                Op::Reduce { op, axis, x, mask } => {
                    // `All` and `Last` keep the encoding they had before `Axes` existed.
                    let axes = match axis {
                        ReduceAxis::All => "true".to_string(),
                        ReduceAxis::Last => "false".to_string(),
                        ReduceAxis::Axes { mask, keepdim } => format!("axes {mask} {keepdim}"),
                    };
                    e.s(&format!("reduce {} {axes} {} {}", op.name(), x.0, mask.map(|m| m.0 as i64).unwrap_or(-1)))
                }
                op => e.s(&format!("{op:?}")),
            }
        }
        e.u(self.outputs.len() as u64);
        for o in &self.outputs {
            e.s(&o.name);
            e.u(o.node.0 as u64);
        }
        // Encoded only when present, so that the hash (and every kernel name derived from it) of
        // a graph without ragged metadata is what it was before constraints existed.
        if !self.constraints.is_empty() {
            e.s("constraints");
            e.u(self.constraints.len() as u64);
            for c in &self.constraints {
                e.s(c.name());
                e.u(c.input().0 as u64);
                e.shape(&Shape(vec![c.dim()]));
            }
        }
        GraphHash(*e.0.finalize().as_bytes())
    }
}
