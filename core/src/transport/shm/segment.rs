//! The unsafe room of the SHM transport: a POSIX shared-memory segment
//! mapped into this process (a [`Control`] block, then the slots), and the
//! caller's buffers that `isend`/`irecv` take as raw pointers.
//!
//! Each end also holds an OFD lock on one byte of the segment's file for as
//! long as it is open. The kernel drops it when the process dies however it
//! dies, so the other end can tell a killed peer from a slow one without a
//! pid (which would mislead across pid namespaces).
#![allow(unsafe_code)]

use std::fs::File;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::libc;
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::Mode;
use oxccl_plugin::{NetError, NetResult};

use super::ring::{Control, End, SlotMem, CONTROL_BYTES, STEPS};

/// Names are POSIX's, `/` then the file's name in /dev/shm.
fn sys(what: &str, name: &str, e: nix::Error) -> NetError {
    NetError::System(format!("shared memory: {what} /dev/shm{name}: {e}"))
}

/// A mapped segment: the control block and [`STEPS`] slots.
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
    slot_bytes: usize,
    /// Kept open for the OFD lock this end holds.
    file: File,
}

// SAFETY: the mapping is plain shared memory owned by this value until it
// is dropped; what threads (and the peer process) do with it goes through
// the atomics of `Control` and the copies those atomics order.
unsafe impl Send for Segment {}
// SAFETY: as for Send: `&Segment` gives only atomics and copies into slots
// that the ring's counters hand to one end at a time.
unsafe impl Sync for Segment {}

impl Segment {
    /// Bytes a segment of `slot_bytes`-byte slots takes.
    pub fn size(slot_bytes: usize) -> usize {
        CONTROL_BYTES + STEPS * slot_bytes
    }

    /// Creates `/dev/shm/<name>` for the receiving end, lays out its ring
    /// and takes the receiver's lock.
    pub fn create(name: &str, slot_bytes: usize) -> NetResult<Segment> {
        let fd = shm_open(
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| sys("cannot create", name, e))?;
        let file = File::from(fd);
        let len = Segment::size(slot_bytes);
        let made = super::reserve::reserve(&file, name, len)
            .map_err(NetError::System)
            .and_then(|()| Segment::map(file, name, len, slot_bytes));
        let seg = match made {
            Ok(s) => s,
            Err(e) => {
                let _ = shm_unlink(name);
                return Err(e);
            }
        };
        seg.control().init(slot_bytes);
        if let Err(e) = seg.lock(End::Recv) {
            let _ = shm_unlink(name);
            return Err(sys("cannot lock", name, e));
        }
        Ok(seg)
    }

    /// Opens and maps the segment `name` for the sending end, takes the
    /// sender's lock and removes the name: both ends now hold the memory,
    /// so nothing is left in /dev/shm whatever happens to either process.
    pub fn open(name: &str) -> NetResult<Segment> {
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty())
            .map_err(|e| sys("cannot open", name, e))?;
        // The name has served its purpose once this end has the file open.
        let _ = shm_unlink(name);
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| NetError::System(format!("shared memory /dev/shm{name}: {e}")))?
            .len() as usize;
        if len < CONTROL_BYTES {
            return Err(NetError::Internal(format!(
                "shared memory /dev/shm{name} has {len} bytes, less than its control block"
            )));
        }
        let mut seg = Segment::map(file, name, len, 0)?;
        let slot_bytes = seg.control().slot_bytes().ok_or_else(|| {
            NetError::Internal(format!(
                "shared memory /dev/shm{name} is not an oxccl ring (no magic)"
            ))
        })?;
        if Segment::size(slot_bytes) > len {
            return Err(NetError::Internal(format!(
                "shared memory /dev/shm{name}: {len} bytes cannot hold {STEPS} slots of {slot_bytes}"
            )));
        }
        seg.lock(End::Send)
            .map_err(|e| sys("cannot lock", name, e))?;
        seg.slot_bytes = slot_bytes;
        Ok(seg)
    }

    fn map(file: File, name: &str, len: usize, slot_bytes: usize) -> NetResult<Segment> {
        let size = NonZeroUsize::new(len).expect("a segment is never empty");
        // SAFETY: a new shared mapping of the whole file, at an address the
        // kernel picks; nothing else in this process refers to it yet.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &file,
                0,
            )
        }
        .map_err(|e| sys("cannot map", name, e))?;
        Ok(Segment {
            base: ptr.cast(),
            len,
            slot_bytes,
            file,
        })
    }

    pub fn control(&self) -> &Control {
        // SAFETY: the mapping starts page-aligned (Control needs 128) and
        // holds at least CONTROL_BYTES; Control is all atomics, valid for
        // any bytes, and lives as long as `self`.
        unsafe { self.base.cast::<Control>().as_ref() }
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn flock(end: End, kind: libc::c_short) -> libc::flock {
        // SAFETY: flock is plain integers; all-zero is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = match end {
            End::Recv => 0,
            End::Send => 1,
        };
        fl.l_len = 1;
        fl
    }

    /// Marks `end` alive for as long as this file stays open.
    fn lock(&self, end: End) -> nix::Result<()> {
        let fl = Segment::flock(end, libc::F_WRLCK as libc::c_short);
        fcntl(&self.file, FcntlArg::F_OFD_SETLK(&fl)).map(drop)
    }

    /// Whether the process of `end` still holds its lock (is alive). An
    /// error asking counts as alive: the timeout still bounds the wait.
    pub fn alive(&self, end: End) -> bool {
        let mut fl = Segment::flock(end, libc::F_WRLCK as libc::c_short);
        match fcntl(&self.file, FcntlArg::F_OFD_GETLK(&mut fl)) {
            Ok(_) => fl.l_type != libc::F_UNLCK as libc::c_short,
            Err(_) => true,
        }
    }

    fn slot(&self, i: usize, n: usize) -> *mut u8 {
        assert!(i < STEPS && n <= self.slot_bytes, "slot {i}, {n} bytes");
        let at = CONTROL_BYTES + i * self.slot_bytes;
        debug_assert!(at + n <= self.len);
        self.base.as_ptr().wrapping_add(at)
    }
}

impl SlotMem for Segment {
    fn put(&self, i: usize, src: &[u8]) {
        let dst = self.slot(i, src.len());
        // SAFETY: `slot` bounds the range inside the mapping; the ring hands
        // slot `i` to the sender alone until it publishes it, and `src` is
        // caller memory, never inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }

    fn get(&self, i: usize, dst: &mut [u8]) {
        let src = self.slot(i, dst.len());
        // SAFETY: as in `put`, with slot `i` the receiver's until it moves
        // `head` past it.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference
        // from `control()` outlives `self`.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

/// Removes a segment's name if it is still there (a listener whose sender
/// never came).
pub fn unlink(name: &str) {
    let _ = shm_unlink(name);
}

/// Bytes a caller handed to `isend`.
pub struct SendBuf {
    ptr: *const u8,
    len: usize,
}

impl SendBuf {
    /// # Safety
    /// As `SendComm::isend`: `ptr` is valid for reads of `len` bytes and
    /// unchanged until the request completes or is dropped (the transport
    /// drops a request's buffer then).
    pub unsafe fn new(ptr: *const u8, len: usize) -> SendBuf {
        SendBuf { ptr, len }
    }
}

impl AsRef<[u8]> for SendBuf {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the contract of `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

// SAFETY: the pointer is the caller's promise of memory left alone while the
// request runs, whichever thread drives it.
unsafe impl Send for SendBuf {}

/// Room a caller handed to `irecv`.
pub struct RecvBuf {
    ptr: *mut u8,
    len: usize,
}

impl RecvBuf {
    /// # Safety
    /// As `RecvComm::irecv`: `ptr` is valid for writes of `len` bytes and
    /// not otherwise accessed until the request completes or is dropped.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> RecvBuf {
        RecvBuf { ptr, len }
    }
}

impl AsMut<[u8]> for RecvBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the contract of `new`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// SAFETY: as for SendBuf.
unsafe impl Send for RecvBuf {}
