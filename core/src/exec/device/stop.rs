//! Ending a GPU communicator's operations now (a revoke, an abort,
//! `NCCL_SHRINK_ABORT`), before NCCL_TIMEOUT would end them with a trap.
//!
//! The host never waits for device work, so what runs is on the streams:
//! kernels that spin on a peer's FIFO counters, and (shared-GPU path)
//! stream memory waits on flag words that a peer's stream raises. A stop
//! reaches each where it waits: the kernels poll a word in mapped host
//! memory beside their clock and return without trapping (the context
//! stays usable); the host's waits on the shared-GPU mailbox poll an
//! atomic; and the stream waits, which poll nothing, are released by
//! storing the values they wait for, each in this rank's own flag words
//! only (every wait of that path is on the waiter's own memory, so a
//! release never forges a signal another rank reads).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::cuda::{Context, HostFlag};
use crate::error::Result;

/// The stop of one rank's device communicator, shared with the threads
/// that may be inside it (a revoke cannot take its lock while an enqueue
/// waits on the mailbox).
pub struct DeviceStop {
    /// Polled by the kernels (`CollArgs::abort`).
    word: HostFlag,
    /// Polled by the host's waits.
    raised: Arc<AtomicBool>,
}

impl DeviceStop {
    pub fn new(ctx: &Arc<Context>) -> Result<DeviceStop> {
        Ok(DeviceStop {
            word: HostFlag::new(ctx)?,
            raised: Arc::default(),
        })
    }

    /// Ends the waits of running kernels and of the host at once; stream
    /// waits need [`super::DeviceComm::settle`]. For good: the kernels'
    /// counters are left mid-operation.
    pub fn raise(&self) {
        self.raised.store(true, Ordering::SeqCst);
        self.word.store(1);
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// The word's device address, for the kernels' arguments.
    pub fn device_word(&self) -> u64 {
        self.word.device_ptr()
    }

    /// The flag the host's waits poll.
    pub fn host_flag(&self) -> Arc<AtomicBool> {
        self.raised.clone()
    }
}

/// The furthest value each of this rank's flag words (by offset) was
/// waited for on a stream: storing those releases every wait that may
/// still be pending. Values compare as the stream waits compare them,
/// 32-bit wrapping.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Awaited(BTreeMap<u64, u32>);

impl Awaited {
    /// A stream now waits until the word at `offset` reaches `value`.
    pub fn wait(&mut self, offset: u64, value: u32) {
        let v = self.0.entry(offset).or_insert(value);
        // `value` is ahead of `v` when it is less than half the ring past it.
        if (value.wrapping_sub(*v) as i32) > 0 {
            *v = value;
        }
    }

    /// (offset, value) pairs whose stores release every wait so far.
    pub fn releases(&self) -> Vec<(u64, u32)> {
        self.0.iter().map(|(&o, &v)| (o, v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_furthest_wait_of_each_word_is_released() {
        let mut a = Awaited::default();
        assert!(a.releases().is_empty(), "nothing waited: nothing to store");
        a.wait(64, 1);
        a.wait(64, 3);
        a.wait(64, 2);
        a.wait(4096 + 8, 7);
        assert_eq!(a.releases(), vec![(64, 3), (4096 + 8, 7)]);
    }

    #[test]
    fn values_wrap_as_the_stream_waits_compare_them() {
        let mut a = Awaited::default();
        a.wait(0, u32::MAX - 1);
        a.wait(0, 2);
        assert_eq!(a.releases(), vec![(0, 2)], "2 is past the wrap, ahead");
        a.wait(0, u32::MAX);
        assert_eq!(a.releases(), vec![(0, 2)], "MAX is behind 2 once wrapped");
    }
}
