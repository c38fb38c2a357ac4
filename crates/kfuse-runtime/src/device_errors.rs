//! The error record of a device: 8 words of page-locked host memory mapped into the device's
//! address space, which kernels that check their inputs' values write on a violation (the first
//! violation only, see kfuse-codegen's `ERROR_RECORD_WORDS`) and the host reads with volatile
//! loads and no synchronisation. Allocated once per [`Gpu`](crate::Gpu), on first need; a
//! violation is reset once taken.
//!
//! Word layout: 0 claim, 1 tag, 2 input, 3 kind, 4 position, 5 value, 6 bound, 7 ready.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result as dresult, CudaContext};

/// Words of the record.
const WORDS: usize = 8;

/// A violation a kernel recorded on the device: the raw words, which the layer that generated
/// the kernel interprets (the tag names the program, `input` its input, `kind` the rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceViolation {
    /// The tag the kernel was launched with.
    pub tag: u32,
    /// The input's index in the program.
    pub input: u32,
    /// The rule it broke (the generator's number).
    pub kind: u32,
    /// The flat, row-major position of the value.
    pub position: u64,
    /// The value.
    pub value: i64,
    /// The bound it broke.
    pub bound: i64,
}

/// The mapped record of one device.
pub(crate) struct ErrorRecord {
    /// Host address of the 8 words (page-locked, device-mapped).
    host: *mut u64,
    /// Their device address.
    device: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the record is plain memory that lives until drop; every host access is a volatile load
// or store of a whole aligned word, so threads may share it (the device writes it concurrently
// and the protocol — claim, fields, system fence, ready — makes a torn record unreadable).
unsafe impl Send for ErrorRecord {}
// SAFETY: as above.
unsafe impl Sync for ErrorRecord {}

impl ErrorRecord {
    /// Allocates and zeroes the record in `ctx` (bound to the calling thread).
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<ErrorRecord, (&'static str, cudarc::driver::DriverError)> {
        ctx.bind_to_thread().map_err(|e| ("cuCtxSetCurrent", e))?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a fresh allocation of WORDS u64s; it is zeroed below before any use.
        let host = unsafe { dresult::malloc_host(WORDS * 8, flags) }.map_err(|e| ("cuMemHostAlloc", e))? as *mut u64;
        for w in 0..WORDS {
            // SAFETY: `host` holds WORDS aligned u64s (page-aligned allocation).
            unsafe { host.add(w).write_volatile(0) };
        }
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in this context; `device` is a valid out pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) };
        if r != CUresult::CUDA_SUCCESS {
            // SAFETY: `host` came from malloc_host and is not used after this.
            unsafe { dresult::free_host(host.cast()) }.ok();
            return Err(("cuMemHostGetDevicePointer", cudarc::driver::DriverError(r)));
        }
        Ok(ErrorRecord { host, device, ctx: ctx.clone() })
    }

    /// The device address kernels are given.
    pub(crate) fn device_address(&self) -> u64 {
        self.device
    }

    fn word(&self, w: usize) -> u64 {
        // SAFETY: w < WORDS; the memory lives as long as self.
        unsafe { self.host.add(w).read_volatile() }
    }

    fn set(&self, w: usize, v: u64) {
        // SAFETY: as in `word`.
        unsafe { self.host.add(w).write_volatile(v) }
    }

    /// The recorded violation, if one is ready, and the record reset for the next one. No
    /// synchronisation: a violation a kernel still writes is taken by a later call.
    pub(crate) fn take(&self) -> Option<DeviceViolation> {
        if self.word(7) == 0 {
            return None;
        }
        fence(Ordering::Acquire);
        let v = DeviceViolation {
            tag: self.word(1) as u32,
            input: self.word(2) as u32,
            kind: self.word(3) as u32,
            position: self.word(4),
            value: self.word(5) as i64,
            bound: self.word(6) as i64,
        };
        for w in (1..WORDS).rev() {
            self.set(w, 0);
        }
        fence(Ordering::Release);
        self.set(0, 0); // free: the next violation may claim it
        Some(v)
    }
}

impl Drop for ErrorRecord {
    fn drop(&mut self) {
        // The Gpu owning the record is dropped: no kernel of it is pending that could still write.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `host` came from malloc_host and is not used after this.
            unsafe { dresult::free_host(self.host.cast()) }.ok();
        }
    }
}
