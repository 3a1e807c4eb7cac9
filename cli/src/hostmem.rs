//! Host buffers for `oxccl perf`: anonymous mappings, aligned to 2 MiB and
//! marked for transparent huge pages where at least that large.
//!
//! Between processes of one host the collectives copy straight from the
//! peers' buffers (`process_vm_readv`), and the kernel pins each source page
//! for the copy: with 4 KiB pages a good part of every copy is page walks.
//! On this repo's 2-core VM, 2 ranks, all_reduce 16-64 MiB: 2.0-4.1 GB/s
//! busbw from malloc's memory, 3.5-5.9 from huge pages (2026-11-27,
//! 14651a1). PyTorch gives its CPU tensors the same with
//! `THP_MEM_ALLOC_ENABLE=1` (`C10_THP_MEM_ALLOC_ENABLE=1` in later versions).
//! `OXCCL_PERF_HUGEPAGES=0` takes plain heap memory instead.

use std::num::NonZeroUsize;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};

const HUGE: usize = 2 << 20;

/// Whether perf's host buffers take huge pages (the default):
/// OXCCL_PERF_HUGEPAGES, declared in oxccl's settings table.
pub fn wanted() -> Result<bool, String> {
    oxccl::config::ox::perf_hugepages().map_err(|e| e.to_string())
}

/// Zeroed bytes of host memory.
pub enum HostBuf {
    Heap(Vec<u8>),
    /// The mapping (`map`, `map_len` bytes) and the buffer inside it.
    Mapped {
        map: NonNull<u8>,
        map_len: usize,
        at: usize,
        len: usize,
    },
}

// SAFETY: the mapping is owned by this value alone, as a Vec's memory is.
#[allow(unsafe_code)]
unsafe impl Send for HostBuf {}

impl HostBuf {
    /// `len` zeroed bytes: mapped and advised where `huge` and the buffer
    /// holds at least one huge page, else on the heap (also where mapping
    /// fails: the run goes on, slower).
    pub fn zeroed(len: usize, huge: bool) -> HostBuf {
        if !huge || len < HUGE {
            return HostBuf::Heap(vec![0; len]);
        }
        let map_len = len + HUGE;
        // At least HUGE bytes: never zero.
        let size = NonZeroUsize::MIN.saturating_add(map_len - 1);
        #[allow(unsafe_code)]
        // SAFETY: a new private anonymous mapping at an address the kernel
        // picks; nothing else refers to it.
        let mapped = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        };
        let Ok(map) = mapped else {
            return HostBuf::Heap(vec![0; len]);
        };
        let map = map.cast::<u8>();
        let at = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
        #[allow(unsafe_code)]
        // SAFETY: the range lies inside the mapping just made, whose pages
        // nothing has touched yet; the advice only changes how the kernel
        // backs them (huge pages where it can), never their contents.
        unsafe {
            let start = NonNull::new_unchecked(map.as_ptr().add(at)).cast();
            let _ = madvise(
                start,
                len.next_multiple_of(HUGE).min(map_len - at),
                MmapAdvise::MADV_HUGEPAGE,
            );
        }
        HostBuf::Mapped {
            map,
            map_len,
            at,
            len,
        }
    }
}

impl Deref for HostBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HostBuf::Heap(v) => v,
            #[allow(unsafe_code)]
            // SAFETY: `len` bytes at `at` lie inside the live mapping, which
            // only this value owns; shared access through `&self`.
            HostBuf::Mapped { map, at, len, .. } => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(*at), *len)
            },
        }
    }
}

impl DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            HostBuf::Heap(v) => v,
            #[allow(unsafe_code)]
            // SAFETY: as in `deref`, with exclusive access through `&mut self`.
            HostBuf::Mapped { map, at, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(map.as_ptr().add(*at), *len)
            },
        }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if let HostBuf::Mapped { map, map_len, .. } = *self {
            #[allow(unsafe_code)]
            // SAFETY: the mapping made in `zeroed`, unmapped once; no slice
            // of it outlives `self`.
            let _ = unsafe { munmap(map.cast(), map_len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_writable_and_huge_ones_aligned() {
        for (len, huge) in [(100, true), (3 << 20, true), (3 << 20, false), (0, true)] {
            let mut b = HostBuf::zeroed(len, huge);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                b[len - 1] = 7;
                assert_eq!(b[len - 1], 7);
            }
            if huge && len >= HUGE {
                assert!(matches!(b, HostBuf::Mapped { .. }));
                assert_eq!(b.as_ptr() as usize % HUGE, 0);
            }
        }
    }
}
