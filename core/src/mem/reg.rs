//! Memory registrations of network connections (the ncclNet `regMr`).
//!
//! The ncclNet ABI makes a caller register every buffer with a connection
//! before it hands the buffer to that connection's `isend` or `irecv`, and
//! pass the handle along: production plugins (IB, aws-ofi-nccl) look up
//! their keys through it and crash on a NULL one. Registering is costly
//! there (it pins pages), so what lives long is registered once.
//!
//! A connection carries the registrations made with it ([`Conn`]), so that
//! they are released with the connection that made them and before it is
//! closed, whoever drops it.
#![deny(unsafe_code)]

use oxccl_plugin::{DmaBuf, MrHandle, NetResult, PtrType, RecvComm, SendComm};
use tracing::warn;

use super::Span;

/// How long a registration is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A buffer the communicator keeps between operations (a staging
    /// slot): registered the first time this connection uses it, released
    /// when the connection goes.
    Kept,
    /// The caller's memory. Released when the operation ends rather than
    /// cached by address: the application may free the memory and get the
    /// same addresses back for other pages, and a plugin that pinned the
    /// old pages would then move the wrong bytes. NCCL does not keep user
    /// buffers registered either unless told to (`ncclCommRegister`).
    Op,
    /// An operation's registration left when the operation failed with
    /// requests perhaps still posted (the ABI cannot cancel them): it is
    /// released only when the connection closes, and never used again.
    Orphan,
}

struct Entry {
    base: usize,
    len: usize,
    mr: MrHandle,
    scope: Scope,
}

/// The registration calls of one end of a connection.
pub trait Registrar {
    fn register(&mut self, ptr: *mut u8, len: usize, ty: PtrType) -> NetResult<MrHandle>;
    /// `regMrDmaBuf`: `len` bytes at `ptr`, which start at `d.offset` of the
    /// dma-buf `d.fd`.
    fn register_dmabuf(
        &mut self,
        ptr: *mut u8,
        len: usize,
        ty: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle>;
    fn deregister(&mut self, mr: MrHandle) -> NetResult<()>;
}

/// Both ends of a connection register alike: the net plugin's send and
/// receive sides carry the same three calls.
macro_rules! registrar_for {
    ($end:ty) => {
        impl Registrar for $end {
            fn register(&mut self, ptr: *mut u8, len: usize, ty: PtrType) -> NetResult<MrHandle> {
                self.reg_mr(ptr, len, ty)
            }
            fn register_dmabuf(
                &mut self,
                ptr: *mut u8,
                len: usize,
                ty: PtrType,
                d: DmaBuf,
            ) -> NetResult<MrHandle> {
                self.reg_mr_dma_buf(ptr, len, ty, d)
            }
            fn deregister(&mut self, mr: MrHandle) -> NetResult<()> {
                self.dereg_mr(mr)
            }
        }
    };
}
registrar_for!(dyn SendComm);
registrar_for!(dyn RecvComm);

/// One end of a connection with the registrations made through it.
pub struct Conn<C: ?Sized + Registrar> {
    comm: Box<C>,
    regs: Vec<Entry>,
    /// What requests left posted by a failed operation may still reach
    /// (their profiler handles): freed after `comm`, i.e. after the plugin
    /// closed the connection and can no longer use them.
    parked: Vec<Box<dyn Send>>,
}

pub type SendConn = Conn<dyn SendComm>;
pub type RecvConn = Conn<dyn RecvComm>;

impl<C: ?Sized + Registrar> Conn<C> {
    pub fn new(comm: Box<C>) -> Conn<C> {
        Conn {
            comm,
            regs: Vec::new(),
            parked: Vec::new(),
        }
    }

    /// The connection itself, for its transfers.
    pub fn comm(&mut self) -> &mut C {
        &mut self.comm
    }

    /// A live registration covering `span`; when there is none, `whole`
    /// (the buffer `span` lies in) is registered for `scope`. Whole
    /// buffers, so that the slices of one buffer share one registration.
    /// Memory the CPU reaches (the host executor's buffers and slots, the
    /// device path's host slots): `NCCL_PTR_HOST` to the plugin.
    pub fn mr(&mut self, span: Span, whole: Span, scope: Scope) -> NetResult<MrHandle> {
        self.mr_as(span, whole, scope, PtrType::Host)
    }

    /// As [`Conn::mr`], for memory of type `ty` (device memory the plugin
    /// reads and writes itself: GPUDirect).
    pub fn mr_as(
        &mut self,
        span: Span,
        whole: Span,
        scope: Scope,
        ty: PtrType,
    ) -> NetResult<MrHandle> {
        self.mr_with(span, whole, scope, |c| c.register(whole.ptr, whole.len, ty))
    }

    /// As [`Conn::mr_as`] for device memory registered through a dma-buf
    /// of it (`regMrDmaBuf`), `d.offset` being where `whole` starts in it.
    pub fn mr_dmabuf(
        &mut self,
        span: Span,
        whole: Span,
        scope: Scope,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        self.mr_with(span, whole, scope, |c| {
            c.register_dmabuf(whole.ptr, whole.len, PtrType::Cuda, d)
        })
    }

    fn mr_with(
        &mut self,
        span: Span,
        whole: Span,
        scope: Scope,
        register: impl FnOnce(&mut C) -> NetResult<MrHandle>,
    ) -> NetResult<MrHandle> {
        let (lo, hi) = (span.ptr as usize, span.ptr as usize + span.len);
        // A few entries per connection (staging slots and the operation's
        // buffers): a scan is cheaper than any index.
        if let Some(e) = self
            .regs
            .iter()
            .find(|e| e.scope != Scope::Orphan && e.base <= lo && hi <= e.base + e.len)
        {
            return Ok(e.mr);
        }
        let mr = register(&mut self.comm)?;
        self.regs.push(Entry {
            base: whole.ptr as usize,
            len: whole.len,
            mr,
            scope,
        });
        Ok(mr)
    }

    /// Ends an operation's registrations: released now when none of its
    /// requests can still be posted (`settled`), else kept as orphans until
    /// the connection closes. Every entry is handled even when one release
    /// fails; the first failure is returned.
    pub fn end_op(&mut self, settled: bool) -> NetResult<()> {
        let mut first = Ok(());
        let mut i = 0;
        while i < self.regs.len() {
            if self.regs[i].scope != Scope::Op {
                i += 1;
            } else if settled {
                let e = self.regs.swap_remove(i);
                let r = self.comm.deregister(e.mr);
                if first.is_ok() {
                    first = r;
                }
            } else {
                self.regs[i].scope = Scope::Orphan;
                i += 1;
            }
        }
        first
    }

    /// Keeps `what` until the connection is closed: memory that a request
    /// left posted (see [`Scope::Orphan`]) may still use.
    pub fn park(&mut self, what: Box<dyn Send>) {
        self.parked.push(what);
    }

    /// Registrations held now, for tests.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.regs.len()
    }
}

impl<C: ?Sized + Registrar> Drop for Conn<C> {
    fn drop(&mut self) {
        // Before `comm` is dropped (closed): a plugin frees a connection's
        // registrations' resources with it, and NCCL deregisters first too.
        for e in self.regs.drain(..) {
            if let Err(err) = self.comm.deregister(e.mr) {
                warn!(target: "oxccl::net", "deregMr of {} bytes at {:#x} before closing a connection: {err}", e.len, e.base);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Calls seen by a fake connection: ("reg", base, len) and ("dereg", handle).
    type Log = Arc<Mutex<Vec<(&'static str, usize, usize)>>>;

    struct Fake {
        log: Log,
        next: usize,
    }

    impl Registrar for Fake {
        fn register(&mut self, ptr: *mut u8, len: usize, _ty: PtrType) -> NetResult<MrHandle> {
            self.next += 1;
            self.log.lock().unwrap().push(("reg", ptr as usize, len));
            Ok(MrHandle(self.next))
        }
        fn register_dmabuf(
            &mut self,
            ptr: *mut u8,
            len: usize,
            _ty: PtrType,
            d: DmaBuf,
        ) -> NetResult<MrHandle> {
            self.next += 1;
            self.log
                .lock()
                .unwrap()
                .push(("regdmabuf", ptr as usize, d.offset as usize + len));
            Ok(MrHandle(self.next))
        }
        fn deregister(&mut self, mr: MrHandle) -> NetResult<()> {
            self.log.lock().unwrap().push(("dereg", mr.0, 0));
            Ok(())
        }
    }

    fn span(p: usize, len: usize) -> Span {
        Span {
            ptr: p as *mut u8,
            len,
        }
    }

    #[test]
    fn kept_once_op_until_the_end_orphans_until_close() {
        let log = Log::default();
        let mut c = Conn::new(Box::new(Fake {
            log: log.clone(),
            next: 0,
        }));
        let slot = span(0x1000, 256);
        // Slices of one slot share its one registration.
        let a = c.mr(span(0x1000, 10), slot, Scope::Kept).unwrap();
        let b = c.mr(span(0x1080, 128), slot, Scope::Kept).unwrap();
        assert_eq!((a, b), (MrHandle(1), MrHandle(1)));
        let user = span(0x9000, 64);
        assert_eq!(c.mr(span(0x9010, 8), user, Scope::Op).unwrap(), MrHandle(2));
        c.end_op(true).unwrap();
        // The user buffer again: a new registration, the slot's kept.
        assert_eq!(
            c.mr(span(0x9000, 64), user, Scope::Op).unwrap(),
            MrHandle(3)
        );
        assert_eq!(c.mr(span(0x1000, 1), slot, Scope::Kept).unwrap(), a);
        // A failed operation's registration is not released, nor reused.
        c.end_op(false).unwrap();
        assert_eq!(
            c.mr(span(0x9000, 64), user, Scope::Op).unwrap(),
            MrHandle(4)
        );
        c.end_op(true).unwrap();
        assert_eq!(c.held(), 2);
        drop(c);
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log,
            vec![
                ("reg", 0x1000, 256),
                ("reg", 0x9000, 64),
                ("dereg", 2, 0),
                ("reg", 0x9000, 64),
                ("reg", 0x9000, 64),
                ("dereg", 4, 0),
                // At close: the slot and the orphan.
                ("dereg", 1, 0),
                ("dereg", 3, 0),
            ]
        );
    }
}
