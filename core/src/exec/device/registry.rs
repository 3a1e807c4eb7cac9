//! Buffers registered with a device communicator (NCCL's
//! `ncclCommRegister`), so that its peers read them where they lie: a
//! slice sent from a registered buffer to a peer that can address it posts
//! its address in the step slot instead of its bytes, and the peer's
//! kernel reads it from the user's buffer (see `direct_in` in
//! `kernels/cuda/coll.cu`).
//!
//! A registration is local, as NCCL's is: no peer takes part in it. It is
//! checked when made (device memory of this communicator's GPU, within one
//! allocation) and again at every operation that uses it (the allocation
//! is still the one registered: a buffer freed under its registration is
//! refused, never read). The same buffer registered twice is one
//! registration with two users, released by the second deregistration.
//!
//! The driver is asked through a [`Probe`], so that the table's rules are
//! tested without a GPU.

use crate::cuda::PtrKind;
use crate::error::{Error, Result};

/// What the driver says of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub kind: PtrKind,
    /// The allocation holding it: (start, bytes).
    pub range: Option<(u64, u64)>,
    /// The allocation's id, never reused in a process.
    pub id: Option<u64>,
    /// The GPU it is on (CUDA's ordinal).
    pub device: Option<usize>,
}

impl Probe {
    /// The driver's answers for `ptr`.
    pub fn of(ptr: u64) -> Probe {
        Probe {
            kind: crate::cuda::pointer_kind(ptr),
            range: crate::cuda::memory::address_range(ptr),
            id: crate::cuda::buffer_id(ptr),
            device: crate::cuda::memory::device_of(ptr),
        }
    }
}

/// One registered buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// What `ncclCommRegister` hands back; never 0.
    pub handle: u64,
    pub ptr: u64,
    pub len: usize,
    /// Its allocation's id when registered.
    id: Option<u64>,
    users: usize,
}

/// Handles count up from here, so that a stray pointer is not mistaken
/// for one and a handle is never NULL.
const FIRST_HANDLE: u64 = 0x0cc1_0000_0001;

/// The registrations of one rank of a communicator.
#[derive(Debug)]
pub struct Registry {
    regs: Vec<Registration>,
    next: u64,
    /// This rank's GPU: memory of another cannot be registered with it.
    device: usize,
}

impl Registry {
    pub fn new(device: usize) -> Registry {
        Registry {
            regs: Vec::new(),
            next: FIRST_HANDLE,
            device,
        }
    }

    /// Registers `len` bytes at `ptr`; the handle. Refused (InvalidArgument,
    /// saying why) for memory that is not device memory of this GPU, or
    /// that runs past its allocation.
    pub fn register(&mut self, ptr: u64, len: usize, probe: &dyn Fn(u64) -> Probe) -> Result<u64> {
        if ptr == 0 || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "ncclCommRegister({ptr:#x}, {len} bytes): a buffer needs an address and a size"
            )));
        }
        let p = probe(ptr);
        let what = match p.kind {
            PtrKind::Device => None,
            PtrKind::Unknown => Some("memory CUDA does not know (pageable host memory, or freed)"),
            PtrKind::PinnedHost => Some("host memory (pinned by CUDA)"),
            PtrKind::Managed => Some("managed memory"),
        };
        if let Some(what) = what {
            return Err(Error::InvalidArgument(format!(
                "ncclCommRegister({ptr:#x}, {len} bytes): the buffer is {what}; registration lets peers read device memory where it lies, so only device memory (cudaMalloc, ncclMemAlloc) can be registered: pass host buffers unregistered"
            )));
        }
        if let Some(d) = p.device.filter(|&d| d != self.device) {
            return Err(Error::InvalidArgument(format!(
                "ncclCommRegister({ptr:#x}, {len} bytes): the buffer is on GPU {d}, this communicator's rank on GPU {}: register it with a communicator of its GPU",
                self.device
            )));
        }
        let end = ptr.checked_add(len as u64);
        if let (Some((base, size)), Some(end)) = (p.range, end) {
            if end > base + size {
                return Err(Error::InvalidArgument(format!(
                    "ncclCommRegister({ptr:#x}, {len} bytes): the buffer runs past its allocation ({size} bytes at {base:#x}) by {} bytes",
                    end - (base + size)
                )));
            }
        }
        if let Some(r) = self
            .regs
            .iter_mut()
            .find(|r| (r.ptr, r.len) == (ptr, len) && r.id == p.id)
        {
            r.users += 1;
            return Ok(r.handle);
        }
        let handle = self.next;
        self.next += 1;
        self.regs.push(Registration {
            handle,
            ptr,
            len,
            id: p.id,
            users: 1,
        });
        Ok(handle)
    }

    /// Releases one user of `handle`'s registration (the registration
    /// goes with its last); refused for a handle this table never gave or
    /// already released.
    pub fn deregister(&mut self, handle: u64) -> Result<()> {
        let Some(i) = self.regs.iter().position(|r| r.handle == handle) else {
            return Err(Error::InvalidArgument(format!(
                "ncclCommDeregister: handle {handle:#x} is no registration of this communicator (never made by its ncclCommRegister, or deregistered already)"
            )));
        };
        self.regs[i].users -= 1;
        if self.regs[i].users == 0 {
            self.regs.swap_remove(i);
        }
        Ok(())
    }

    /// The registration holding `len` bytes at `ptr`, if any; an error
    /// where that registration's memory was freed (or freed and handed
    /// to another allocation) while it was registered.
    pub fn covering(
        &self,
        ptr: u64,
        len: usize,
        probe: &dyn Fn(u64) -> Probe,
    ) -> Result<Option<Registration>> {
        if ptr == 0 || len == 0 {
            return Ok(None);
        }
        let end = ptr.saturating_add(len as u64);
        let Some(r) = self
            .regs
            .iter()
            .find(|r| r.ptr <= ptr && end <= r.ptr + r.len as u64)
        else {
            return Ok(None);
        };
        let now = probe(r.ptr);
        if now.kind != PtrKind::Device || now.id != r.id {
            return Err(Error::InvalidUsage(format!(
                "the buffer of {} bytes at {:#x} registered with this communicator (handle {:#x}) was freed while registered{}: call ncclCommDeregister before freeing a registered buffer",
                r.len,
                r.ptr,
                r.handle,
                if now.kind == PtrKind::Device { ", and its memory given to another allocation" } else { "" }
            )));
        }
        Ok(Some(*r))
    }

    /// Registrations held.
    pub fn len(&self) -> usize {
        self.regs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// One allocation of 1 MiB at 0x10_0000 on GPU 0, whose id the test
    /// changes (a free and another allocation in its place) or clears (a
    /// free).
    fn device(id: &Cell<Option<u64>>) -> impl Fn(u64) -> Probe + '_ {
        move |p| {
            let inside = (0x10_0000..0x20_0000).contains(&p);
            match id.get() {
                Some(i) if inside => Probe {
                    kind: PtrKind::Device,
                    range: Some((0x10_0000, 0x10_0000)),
                    id: Some(i),
                    device: Some(0),
                },
                _ => Probe {
                    kind: PtrKind::Unknown,
                    range: None,
                    id: None,
                    device: None,
                },
            }
        }
    }

    #[test]
    fn registers_device_memory_once_per_buffer() {
        let id = Cell::new(Some(7));
        let probe = device(&id);
        let mut r = Registry::new(0);
        let a = r.register(0x10_0000, 4096, &probe).unwrap();
        let b = r.register(0x10_0000, 4096, &probe).unwrap();
        let c = r.register(0x10_1000, 4096, &probe).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, 0);
        assert_eq!(r.len(), 2);
        // Slices of a registered buffer are covered; others are not.
        let got = r.covering(0x10_0800, 100, &probe).unwrap().unwrap();
        assert_eq!(got.handle, a);
        assert!(r.covering(0x10_0f00, 0x200, &probe).unwrap().is_none());
        // Two users: the first release keeps it.
        r.deregister(a).unwrap();
        assert!(r.covering(0x10_0000, 4096, &probe).unwrap().is_some());
        r.deregister(a).unwrap();
        assert!(r.covering(0x10_0000, 4096, &probe).unwrap().is_none());
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn refuses_what_cannot_be_registered() {
        let id = Cell::new(Some(7));
        let probe = device(&id);
        let mut r = Registry::new(0);
        let err = |e: Error| e.to_string();
        // Pageable host memory: CUDA does not know it.
        let e = err(r.register(0x5000, 64, &probe).unwrap_err());
        assert!(
            e.contains("pageable host memory") && e.contains("only device memory"),
            "{e}"
        );
        let pinned = |_| Probe {
            kind: PtrKind::PinnedHost,
            range: Some((0x5000, 64)),
            id: Some(1),
            device: None,
        };
        let e = err(r.register(0x5000, 64, &pinned).unwrap_err());
        assert!(e.contains("host memory (pinned by CUDA)"), "{e}");
        // Past the allocation's end.
        let e = err(r.register(0x1f_ff00, 0x200, &probe).unwrap_err());
        assert!(
            e.contains("runs past its allocation") && e.contains("by 256 bytes"),
            "{e}"
        );
        // Another GPU's memory.
        let mut other = Registry::new(1);
        let e = err(other.register(0x10_0000, 64, &probe).unwrap_err());
        assert!(e.contains("is on GPU 0") && e.contains("on GPU 1"), "{e}");
        // Null, empty.
        assert!(r.register(0, 64, &probe).is_err());
        assert!(r.register(0x10_0000, 0, &probe).is_err());
        // Unknown and released handles.
        let e = err(r.deregister(0x1234).unwrap_err());
        assert!(e.contains("handle 0x1234 is no registration"), "{e}");
        let h = r.register(0x10_0000, 64, &probe).unwrap();
        r.deregister(h).unwrap();
        assert!(matches!(r.deregister(h), Err(Error::InvalidArgument(_))));
        assert!(r.is_empty());
    }

    #[test]
    fn a_buffer_freed_under_its_registration_is_refused() {
        let id = Cell::new(Some(7));
        let probe = device(&id);
        let mut r = Registry::new(0);
        let h = r.register(0x10_0000, 4096, &probe).unwrap();
        // Freed, and the addresses given to another allocation.
        id.set(Some(8));
        let e = r.covering(0x10_0000, 4096, &probe).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)));
        let e = e.to_string();
        assert!(
            e.contains("freed while registered, and its memory given to another allocation")
                && e.contains("ncclCommDeregister"),
            "{e}"
        );
        // Freed.
        id.set(None);
        let e = r.covering(0x10_0000, 4096, &probe).unwrap_err().to_string();
        assert!(e.contains("freed while registered:"), "{e}");
        // Deregistering it is still fine, and a new registration there too.
        r.deregister(h).unwrap();
        id.set(Some(9));
        let h2 = r.register(0x10_0000, 4096, &probe).unwrap();
        assert_ne!(h, h2);
    }
}
