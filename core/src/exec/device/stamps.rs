//! GPU timestamps of kernel channels, for the profiler's KernelCh events:
//! a ring of launch slots in mapped pinned memory, each holding one
//! (start, end) globaltimer pair per channel, written by the kernel's
//! blocks (`oxccl_stamp` in kernels/cuda/coll.cu) and read by a host thread
//! while the kernel runs, as NCCL's proxy reads its kernels'
//! workStarted/workCompleted counters. A word is 0 until written: the
//! globaltimer never reads 0.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cuda::{Context, PinnedHost};
use crate::error::Result;

/// Launch slots in flight at most; a launch that finds its slot still
/// being read is not timed (the enqueuing thread never waits for the
/// profiler).
pub const SLOTS: usize = 256;

pub struct Stamps {
    mem: PinnedHost,
    /// Channels per slot: the most a launch of this communicator uses.
    maxch: usize,
    busy: Box<[AtomicBool]>,
    next: AtomicUsize,
}

impl Stamps {
    pub fn new(ctx: &Arc<Context>, maxch: usize) -> Result<Stamps> {
        let maxch = maxch.max(1);
        let mem = PinnedHost::alloc(ctx, SLOTS * maxch * 16)?;
        let stamps = Stamps {
            mem,
            maxch,
            busy: (0..SLOTS).map(|_| AtomicBool::new(false)).collect(),
            next: AtomicUsize::new(0),
        };
        stamps.mem.zero_u64(0..SLOTS * maxch * 2);
        Ok(stamps)
    }

    /// The slot for the next launch of `channels` blocks, or `None` (not
    /// timed) when it is still being read or the launch is too wide.
    pub fn claim(&self, channels: usize) -> Option<usize> {
        if channels > self.maxch {
            return None;
        }
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % SLOTS;
        self.busy[slot]
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| slot)
    }

    /// Where the kernel writes the slot's pairs (`CollArgs::stamps`).
    pub fn device_addr(&self, slot: usize) -> u64 {
        self.mem.device_ptr() + (slot * self.maxch * 16) as u64
    }

    /// Channel `ch`'s (start, end) in `slot`; 0 for what is not written yet.
    pub fn read(&self, slot: usize, ch: usize) -> (u64, u64) {
        let w = (slot * self.maxch + ch) * 2;
        (self.mem.load_u64(w), self.mem.load_u64(w + 1))
    }

    /// Makes a slot read (or abandoned) reusable; `channels`: those its
    /// launch had (the only words written).
    pub fn release(&self, slot: usize, channels: usize) {
        let w = slot * self.maxch * 2;
        self.mem.zero_u64(w..w + channels.min(self.maxch) * 2);
        self.busy[slot].store(false, Ordering::Release);
    }
}
