//! A small pool of freed value buffers, so that each node of a large graph reuses the memory of
//! one that died instead of asking the OS for fresh (page-faulting, zeroed) memory.
//!
//! A buffer taken from the pool holds stale values: every op writes each element of its output.
//! Buffers below `MIN_POOLED` elements are not kept (small ones are cheap to allocate).

use rayon::prelude::*;

/// Buffers smaller than this are left to the allocator.
const MIN_POOLED: usize = 1 << 12;
/// At most this many buffers wait in the pool.
const MAX_POOLED: usize = 16;

/// Freed `Vec<f64>` buffers awaiting reuse.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: Vec<Vec<f64>>,
}

impl BufferPool {
    /// A buffer of exactly `len` elements with unspecified (finite or stale) contents.
    pub(crate) fn take(&mut self, len: usize) -> Vec<f64> {
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut v = self.free.swap_remove(i);
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, 0.0);
                }
                v
            }
            None => {
                // Touch fresh memory on every thread: first-touch page faults dominate the cost of
                // a large new buffer, and they parallelise.
                let mut v = Vec::with_capacity(len);
                v.par_extend(rayon::iter::repeat_n(0.0, len));
                v
            }
        }
    }

    /// Returns a buffer for reuse (or lets it go when it is small or the pool is full).
    pub(crate) fn give(&mut self, v: Vec<f64>) {
        if v.capacity() >= MIN_POOLED {
            if self.free.len() == MAX_POOLED {
                // Keep the larger buffers: they are the expensive ones to fault in again.
                if let Some((i, _)) = self.free.iter().enumerate().min_by_key(|(_, b)| b.capacity()) {
                    if self.free[i].capacity() < v.capacity() {
                        self.free[i] = v;
                    }
                }
            } else {
                self.free.push(v);
            }
        }
    }
}
