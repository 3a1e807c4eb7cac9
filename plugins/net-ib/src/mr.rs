//! Memory registration cache, one per device (registrations are per
//! protection domain, so every connection of the device shares them: the
//! network reports `regIsGlobal`). Registering is slow (the kernel pins
//! pages), and the core registers the same buffers again and again, so a
//! range already registered is handed out again with a reference count,
//! as NCCL's IB cache does. Ranges are widened to whole pages, the unit
//! the NIC maps.
//!
//! Generic over what a registration is, so it is tested without a device.

use std::collections::BTreeMap;

use oxccl_plugin::{NetError, PtrType};

pub const PAGE: usize = 4096;

#[derive(Debug)]
struct Entry<R> {
    start: usize,
    end: usize,
    ty: PtrType,
    refs: usize,
    reg: R,
}

#[derive(Debug)]
pub struct MrCache<R> {
    /// By id; ids start at 1, since the C ABI reads a NULL handle as "none".
    entries: BTreeMap<usize, Entry<R>>,
    next_id: usize,
}

impl<R> Default for MrCache<R> {
    fn default() -> Self {
        MrCache {
            entries: BTreeMap::new(),
            next_id: 1,
        }
    }
}

/// `[addr, addr + len)` widened to pages.
pub fn page_range(addr: usize, len: usize) -> (usize, usize) {
    let start = addr & !(PAGE - 1);
    let end = addr.saturating_add(len.max(1)).saturating_add(PAGE - 1) & !(PAGE - 1);
    (start, end)
}

impl<R> MrCache<R> {
    /// Returns the id of a registration covering the range, registering it
    /// with `register(start, len)` (page-aligned) when none does.
    pub fn reg(
        &mut self,
        addr: usize,
        len: usize,
        ty: PtrType,
        register: impl FnOnce(usize, usize) -> Result<R, String>,
    ) -> Result<usize, NetError> {
        let (start, end) = page_range(addr, len);
        if let Some((id, e)) = self
            .entries
            .iter_mut()
            .find(|(_, e)| e.ty == ty && e.start <= start && end <= e.end)
        {
            e.refs += 1;
            return Ok(*id);
        }
        let reg = register(start, end - start).map_err(|e| {
            NetError::System(format!(
                "registering {len} bytes at {addr:#x} ({ty:?} memory) failed: {e}{}",
                match ty {
                    PtrType::Cuda => " (GPU memory needs the nvidia_peermem module)",
                    PtrType::Dmabuf =>
                        " (dma-buf registration needs Linux 5.12+ and a NIC driver that supports it)",
                    PtrType::Host => " (is the locked-memory limit, ulimit -l, too low?)",
                }
            ))
        })?;
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                start,
                end,
                ty,
                refs: 1,
                reg,
            },
        );
        Ok(id)
    }

    /// Drops one reference; returns the registration to release when it
    /// was the last.
    pub fn dereg(&mut self, id: usize) -> Result<Option<R>, NetError> {
        let e = self.entries.get_mut(&id).ok_or_else(|| {
            NetError::InvalidArgument(format!("memory handle {id:#x} is not registered"))
        })?;
        e.refs -= 1;
        if e.refs > 0 {
            return Ok(None);
        }
        Ok(self.entries.remove(&id).map(|e| e.reg))
    }

    pub fn get(&self, id: usize) -> Option<&R> {
        self.entries.get(&id).map(|e| &e.reg)
    }

    /// The registration covering `addr` (for a flush, which gets no handle).
    pub fn find(&self, addr: usize) -> Option<&R> {
        self.entries
            .values()
            .find(|e| e.start <= addr && addr < e.end)
            .map(|e| &e.reg)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_range_is_registered_once_and_released_last() {
        let mut c: MrCache<(usize, usize)> = MrCache::default();
        let mut calls = 0;
        let mut reg = |s, l| {
            calls += 1;
            Ok((s, l))
        };
        let a = c.reg(0x10010, 100, PtrType::Host, &mut reg).unwrap();
        // Inside the same page: a hit.
        let b = c.reg(0x10100, 50, PtrType::Host, &mut reg).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, 0, "0 would read as NULL at the C ABI");
        assert_eq!(c.get(a), Some(&(0x10000, PAGE)));
        // Same addresses, other memory type: its own registration.
        let g = c.reg(0x10010, 100, PtrType::Cuda, &mut reg).unwrap();
        assert_ne!(g, a);
        // Spilling past the registered pages: a new one.
        let d = c.reg(0x10010, PAGE, PtrType::Host, &mut reg).unwrap();
        assert_ne!(d, a);
        assert_eq!(calls, 3);
        assert_eq!(c.dereg(a).unwrap(), None);
        assert_eq!(c.dereg(a).unwrap(), Some((0x10000, PAGE)));
        assert!(c.dereg(a).is_err());
        assert_eq!(c.len(), 2);
        assert!(c.find(0x10fff).is_some() && c.find(0x30000).is_none());
    }

    #[test]
    fn failures_tell_what_to_check() {
        let mut c: MrCache<()> = MrCache::default();
        let e = c
            .reg(0x1000, 8, PtrType::Cuda, |_, _| Err("Bad address".into()))
            .unwrap_err();
        assert!(e.to_string().contains("nvidia_peermem"), "{e}");
        let e = c
            .reg(0x1000, 8, PtrType::Host, |_, _| {
                Err("Cannot allocate memory".into())
            })
            .unwrap_err();
        assert!(e.to_string().contains("ulimit -l"), "{e}");
        let e = c
            .reg(0x1000, 8, PtrType::Dmabuf, |_, _| {
                Err("Bad file descriptor".into())
            })
            .unwrap_err();
        assert!(e.to_string().contains("dma-buf"), "{e}");
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn page_ranges() {
        assert_eq!(page_range(0, 0), (0, PAGE));
        assert_eq!(page_range(PAGE, PAGE), (PAGE, 2 * PAGE));
        assert_eq!(page_range(PAGE - 1, 2), (0, 2 * PAGE));
    }
}
