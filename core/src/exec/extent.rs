//! Whether a buffer given by address (the C API's, the raw `enqueue`'s)
//! can hold the bytes its call claims, where that can be told cheaply: a
//! count far beyond its buffer (an int8 count of 2^40 on 256 bytes) would
//! otherwise pass every check and end the process in SIGSEGV, or fault a
//! GPU context for good.
//!
//! What can be told, and what cannot:
//! - Host memory: that every page of the claimed range lies in some
//!   mapping of this process (`msync(MS_ASYNC)`, which walks the mappings
//!   and touches no page, fails with ENOMEM on a hole). Not that the range
//!   is one allocation: a count too large for its `malloc` block whose
//!   bytes still lie in the heap's mapping passes, and the call reads or
//!   writes the neighbouring memory, as NCCL's would. Claims of one page
//!   or less are not looked at (see [`CHECKED_FROM`]).
//! - Device memory: that the claimed range lies in the allocations CUDA
//!   reports (their start and size), one after another where an
//!   allocation ends at the next one's start (virtual-memory mappings such
//!   as PyTorch's expandable segments).
//!
//! Both remember the ranges they found whole, per thread, so that a
//! buffer used again costs a few comparisons; memory unmapped and mapped
//! again smaller at the same address after a check is not seen.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::c_void;
use std::ptr::NonNull;

use nix::sys::mman::{msync, MsFlags};

/// Claims of more bytes than this are checked: below it a call would cost
/// a system call it cannot afford (an 8-byte all-reduce takes about a
/// microsecond), and a claim that small reaches at most one page past a
/// buffer.
pub const CHECKED_FROM: usize = 4096;

const PAGE: u64 = 4096;

/// Ranges found whole, most recent first.
#[derive(Default)]
struct Seen {
    ranges: Vec<(u64, u64)>,
}

impl Seen {
    const KEPT: usize = 8;

    fn holds(&self, start: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| s <= start && end <= e)
    }

    fn add(&mut self, start: u64, end: u64) {
        self.ranges.insert(0, (start, end));
        self.ranges.truncate(Seen::KEPT);
    }
}

thread_local! {
    static HOST: RefCell<Seen> = RefCell::default();
    static DEVICE: RefCell<Seen> = RefCell::default();
}

/// Whether all of `start..end` is mapped in this process.
fn mapped(start: u64, end: u64) -> bool {
    let from = start & !(PAGE - 1);
    let Some(addr) = NonNull::new(from as *mut c_void) else {
        return false;
    };
    // SAFETY: MS_ASYNC without MS_INVALIDATE changes nothing and touches
    // no page: Linux walks the mappings of the range and reports a hole
    // as ENOMEM; any address and length are safe to ask about.
    let r = unsafe { msync(addr, (end - from) as usize, MsFlags::MS_ASYNC) };
    // Any other answer (EINVAL, EBUSY) says nothing about holes.
    !matches!(r, Err(nix::errno::Errno::ENOMEM))
}

/// Checks that `bytes` at host address `ptr` are mapped; the error says
/// how many are, from `ptr` on (found by halving, on the error path only).
pub fn host(ptr: u64, bytes: usize) -> Result<(), u64> {
    if bytes <= CHECKED_FROM || ptr == 0 {
        return Ok(());
    }
    let Some(end) = ptr.checked_add(bytes as u64) else {
        return Err(0);
    };
    if HOST.with(|s| s.borrow().holds(ptr, end)) {
        return Ok(());
    }
    if mapped(ptr, end) {
        HOST.with(|s| s.borrow_mut().add(ptr, end));
        return Ok(());
    }
    // The longest mapped prefix, to a page.
    let (mut lo, mut hi) = (0u64, bytes as u64);
    while hi - lo > PAGE {
        let mid = lo + (hi - lo) / 2;
        if mapped(ptr, ptr + mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Err(lo)
}

/// Walks the allocations `range_of` reports from `ptr` on, each starting
/// where the last ended, until `end`: `Err(at)` names the first address
/// none holds. After `steps` allocations it stops and says yes: a
/// buffer over that many is not worth its cost to prove.
fn covered(
    ptr: u64,
    end: u64,
    steps: usize,
    range_of: impl Fn(u64) -> Option<(u64, u64)>,
) -> Result<(), u64> {
    let mut at = ptr;
    for _ in 0..steps {
        let Some((base, size)) = range_of(at) else {
            return Err(at);
        };
        let stop = base.saturating_add(size);
        if base > at || stop <= at {
            // Not an allocation holding `at`: the driver's answer is not
            // one this walk can use.
            return Ok(());
        }
        if stop >= end {
            return Ok(());
        }
        at = stop;
    }
    Ok(())
}

/// Checks that `bytes` of device memory at `ptr` lie in allocations CUDA
/// knows, contiguous; the error is the first address outside them.
pub fn device(ptr: u64, bytes: usize) -> Result<(), u64> {
    if bytes == 0 || ptr == 0 {
        return Ok(());
    }
    let Some(end) = ptr.checked_add(bytes as u64) else {
        return Err(ptr);
    };
    if DEVICE.with(|s| s.borrow().holds(ptr, end)) {
        return Ok(());
    }
    covered(ptr, end, 1024, crate::cuda::memory::address_range)?;
    DEVICE.with(|s| s.borrow_mut().add(ptr, end));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ranges_past_their_mapping_are_found_with_what_is_mapped() {
        let v = vec![7u8; 1 << 20];
        let p = v.as_ptr() as u64;
        assert_eq!(host(p, v.len()), Ok(()));
        assert_eq!(host(p, 16), Ok(()), "small claims are not looked at");
        assert_eq!(host(p, v.len()), Ok(()), "remembered");
        // A private mapping of 3 pages with nothing right after it.
        let len = 3 * PAGE as usize;
        // SAFETY: a fresh anonymous mapping of 4 pages whose last page is
        // unmapped again at once, so that a hole follows the first 3.
        let base = unsafe {
            let m = nix::sys::mman::mmap_anonymous(
                None,
                std::num::NonZeroUsize::new(len + PAGE as usize).unwrap(),
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_PRIVATE,
            )
            .unwrap();
            nix::sys::mman::munmap(m.byte_add(len), PAGE as usize).unwrap();
            m.as_ptr() as u64
        };
        assert_eq!(host(base, len), Ok(()));
        let e = host(base + 100, 1 << 40).unwrap_err();
        assert!(
            (len as u64 - 100 - PAGE..=len as u64 - 100).contains(&e),
            "{e}"
        );
        assert_eq!(host(u64::MAX - 10, 1 << 20), Err(0));
        // SAFETY: the 3 pages mapped above, unmapped once.
        unsafe { nix::sys::mman::munmap(NonNull::new(base as *mut c_void).unwrap(), len) }.unwrap();
    }

    #[test]
    fn device_ranges_walk_allocations_that_follow_each_other() {
        // Allocations at [0x1000, 0x3000) and [0x3000, 0x5000), a hole after.
        let table = |p: u64| match p {
            0x1000..0x3000 => Some((0x1000, 0x2000)),
            0x3000..0x5000 => Some((0x3000, 0x2000)),
            _ => None,
        };
        assert_eq!(covered(0x1800, 0x2800, 8, table), Ok(()));
        assert_eq!(covered(0x1800, 0x4800, 8, table), Ok(()), "two in a row");
        assert_eq!(covered(0x1800, 0x5001, 8, table), Err(0x5000));
        assert_eq!(covered(0x9000, 0x9001, 8, table), Err(0x9000));
        assert_eq!(covered(0x1800, 0x4800, 1, table), Ok(()), "gave up");
        // A driver answer that does not hold the address proves nothing.
        assert_eq!(covered(0x1800, 0x9000, 8, |_| Some((0, 0x10))), Ok(()));
    }
}
