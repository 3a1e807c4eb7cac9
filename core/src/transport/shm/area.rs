//! Host memory the device path's kernels and proxy share: a rank's receive
//! area, either a named POSIX segment that the other processes of its host
//! map (SHM peers store into it from their GPUs), or private memory (a
//! net peer's send mirror, filled by this rank's kernel and read by its
//! proxy). The CUDA side maps either into the GPU (`crate::cuda`); this
//! module owns the mapping and the word accesses the proxy makes.
#![allow(unsafe_code)]

use std::fs::File;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, mmap_anonymous, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::Mode;

use crate::error::{Error, Result};

/// A page-aligned mapping of `len` bytes, zeroed when made.
pub struct Area {
    base: NonNull<u8>,
    len: usize,
    /// The segment's name, on the creator's side (which removes it).
    name: Option<String>,
}

// SAFETY: the mapping is plain memory owned by this value until it is
// dropped; who writes which bytes when is the step protocol's business
// (counters read and written with atomics), not the type's.
unsafe impl Send for Area {}
// SAFETY: as for Send: `&Area` gives atomic word accesses and raw addresses.
unsafe impl Sync for Area {}

fn sys(what: &str, name: &str, e: impl std::fmt::Display) -> Error {
    Error::System(format!(
        "shared memory /dev/shm{name}: {what}: {e} (is /dev/shm full or missing? NCCL_SHM_DISABLE=1 avoids it)"
    ))
}

impl Area {
    /// Creates `/dev/shm<name>` of `len` bytes and maps it; the name stays
    /// until [`Area::unlink`] (or the drop), for peers to open.
    pub fn create_shared(name: &str, len: usize) -> Result<Area> {
        let fd = shm_open(
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| sys("cannot create", name, e))?;
        let file = File::from(fd);
        let mapped = super::reserve::reserve(&file, name, len)
            .map_err(Error::System)
            .and_then(|()| Area::map(&file, name, len));
        match mapped {
            Ok(mut a) => {
                a.name = Some(name.to_string());
                Ok(a)
            }
            Err(e) => {
                let _ = shm_unlink(name);
                Err(e)
            }
        }
    }

    /// Maps a peer's segment, which must hold `len` bytes.
    pub fn open_shared(name: &str, len: usize) -> Result<Area> {
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty())
            .map_err(|e| sys("cannot open", name, e))?;
        let file = File::from(fd);
        let have = file.metadata().map_err(|e| sys("stat", name, e))?.len() as usize;
        if have < len {
            return Err(Error::Internal(format!(
                "shared memory /dev/shm{name} has {have} bytes, the device window needs {len}"
            )));
        }
        Area::map(&file, name, len)
    }

    /// Private memory (zeroed pages).
    pub fn private(len: usize) -> Result<Area> {
        let size =
            NonZeroUsize::new(len).ok_or_else(|| Error::Internal("an empty host area".into()))?;
        // SAFETY: a new anonymous mapping at an address the kernel picks;
        // nothing else refers to it yet.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(|e| Error::System(format!("cannot map {len} bytes of host memory: {e}")))?;
        Ok(Area {
            base: ptr.cast(),
            len,
            name: None,
        })
    }

    fn map(file: &File, name: &str, len: usize) -> Result<Area> {
        let size =
            NonZeroUsize::new(len).ok_or_else(|| Error::Internal("an empty shared area".into()))?;
        // SAFETY: a new shared mapping of the file's first `len` bytes (the
        // file holds them), at an address the kernel picks.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file,
                0,
            )
        }
        .map_err(|e| sys("cannot map", name, e))?;
        Ok(Area {
            base: ptr.cast(),
            len,
            name: None,
        })
    }

    /// Removes the segment's name: once every peer has mapped it, only the
    /// mappings hold the memory, so nothing is left behind whatever happens
    /// to the processes. Removing it again (the drop does) is harmless.
    pub fn unlink(&self) {
        if let Some(n) = &self.name {
            let _ = shm_unlink(n.as_str());
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `off`, `bytes` long.
    ///
    /// # Panics
    /// If the range is outside the area (a bug of the caller's layout).
    pub fn at(&self, off: usize, bytes: usize) -> *mut u8 {
        assert!(
            off.checked_add(bytes).is_some_and(|e| e <= self.len),
            "bytes {off}..+{bytes} outside an area of {}",
            self.len
        );
        self.base.as_ptr().wrapping_add(off)
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        assert_eq!(off % 8, 0, "word at unaligned offset {off}");
        let p = self.at(off, 8).cast::<u64>();
        // SAFETY: inside the live mapping (checked by `at`), 8-aligned (the
        // mapping is page-aligned, the offset a multiple of 8); other
        // writers (a GPU, a peer process) only ever store whole words.
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// Copies `data` to byte `off`; publish it with a later [`Area::store`].
    pub fn write_bytes(&self, off: usize, data: &[u8]) {
        let p = self.at(off, data.len());
        // SAFETY: inside the live mapping (checked by `at`); the protocol
        // using it gives these bytes one writer at a time.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
    }

    /// Copies the bytes at `off` into `out`, after an [`Area::load`] that
    /// saw their writer's publication.
    pub fn read_bytes(&self, off: usize, out: &mut [u8]) {
        let p = self.at(off, out.len());
        // SAFETY: as in `write_bytes`.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) }
    }

    /// The word at `off` as its writer (a GPU or a peer) last published it.
    pub fn load(&self, off: usize) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }

    /// Publishes `v` at `off` after everything this thread wrote before.
    pub fn store(&self, off: usize, v: u64) {
        self.word(off).store(v, Ordering::Release)
    }

    /// Sleeps while the low 32 bits of the word at `off` hold `expected`,
    /// at most `timeout`, until [`Area::wake`] on that word from any
    /// process mapping it (a futex on shared memory). May return early
    /// (a wake, a signal, or the word no longer `expected`): callers look
    /// again.
    pub fn sleep_while(&self, off: usize, expected: u32, timeout: std::time::Duration) {
        let word = self.word(off).as_ptr().cast::<u32>();
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `word` is the low half of an aligned word inside the live
        // mapping (little-endian: the first 4 bytes); FUTEX_WAIT (not the
        // private form: the mapping is shared with other processes) only
        // reads it and sleeps; `ts` outlives the call.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word,
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
            );
        }
    }

    /// Wakes every process and thread sleeping on the word at `off`.
    pub fn wake(&self, off: usize) {
        let word = self.word(off).as_ptr().cast::<u32>();
        // SAFETY: as in `sleep_while`; FUTEX_WAKE reads nothing.
        unsafe {
            libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX);
        }
    }
}

// SAFETY: the range is this value's own mapping, unmapped only by its drop.
unsafe impl crate::cuda::HostMapping for Area {
    fn host_range(&self) -> (*mut u8, usize) {
        (self.ptr(), self.len)
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: the mapping made at construction, unmapped once; the
        // owner (the window) stops every user (kernels, proxy, the CUDA
        // registration) before it drops the area.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_area_is_seen_through_a_second_mapping_and_unlinked() {
        let name = format!("/oxccl-area-test-{}", std::process::id());
        let a = Area::create_shared(&name, 1 << 16).unwrap();
        let b = Area::open_shared(&name, 1 << 16).unwrap();
        a.store(64, 0x1234);
        assert_eq!(b.load(64), 0x1234);
        assert_eq!(b.load(128), 0, "a new area is zeroed");
        a.unlink();
        assert!(
            Area::open_shared(&name, 1 << 16).is_err(),
            "the name is gone"
        );
        b.store(8, 7);
        assert_eq!(a.load(8), 7, "the mappings still share the memory");
        assert!(Area::open_shared("/oxccl-area-none", 8).is_err());
        let p = Area::private(4096).unwrap();
        p.store(4088, 1);
        assert_eq!(p.load(4088), 1);
    }
}
