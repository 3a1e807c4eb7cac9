//! The verbs resources of one connection (completion queues, RC queue
//! pairs) and its two ends: `IbSend` posts each `isend` as one SEND with
//! immediate data (the tag) on QP k mod nqps, `IbRecv` posts each `irecv`
//! as one RECV on the same QP, and a request's `test` polls the completion
//! queues and asks the bookkeeping (`request`) whether it is done.
//!
//! Send/receive rather than NCCL's RDMA write with immediate: no "clear to
//! send" FIFO is needed (RC's receiver-not-ready retries, unbounded, cover
//! a send that arrives before its receive), at the cost of the receiver's
//! buffer size being checked by the NIC (a larger message fails the
//! receive) rather than negotiated.

use std::sync::{Arc, Mutex, MutexGuard};

use oxccl_plugin::{DmaBuf, MrHandle, NetError, NetResult, PtrType, RecvComm, Request, SendComm};

use crate::config::Config;
use crate::connection::{self, Hello, QpInfo};
use crate::device::VDev;
use crate::request::{Completion, Kind, Tracker, MAX_REQUESTS};
use crate::verbs::{self, Cq, IbvRecvWr, IbvSendWr, IbvSge, IbvWc, Mr, Qp};

fn sys(e: String) -> NetError {
    NetError::System(e)
}

/// A GPU-direct receive is only visible to the GPU once the NIC's writes
/// have left the PCIe path; an RDMA read from the buffer (through a QP
/// connected to itself) forces that, as NCCL's flush does. One per device
/// (protection domain) of the connection.
struct Flush {
    qp: Qp,
    /// The port whose registration keys the read.
    port: usize,
    /// Declared before `_buf`: deregistered before the memory goes.
    mr: Mr,
    _buf: Box<[u8; 64]>,
    addr: u64,
}

/// Field order is drop order: QPs before the CQs they complete on, both
/// before the device that owns the protection domain.
pub struct Resources {
    qps: Vec<(Qp, usize)>,
    /// Empty when receives need no flush (no GPU-direct, or
    /// NCCL_GDR_FLUSH_DISABLE=1).
    flush: Vec<Flush>,
    cqs: Vec<Cq>,
    dev: Arc<VDev>,
}

impl Resources {
    /// One CQ per port and `nqps` QPs spread over the ports, in INIT.
    pub fn create(dev: Arc<VDev>, nqps: usize, cfg: &Config) -> NetResult<Resources> {
        let cqe = (2 * MAX_REQUESTS * nqps + 8) as i32;
        let cqs = dev
            .ports
            .iter()
            .map(|p| p.ctx.create_cq(cqe))
            .collect::<Result<Vec<_>, _>>()
            .map_err(sys)?;
        let mut qps = Vec::with_capacity(nqps);
        for i in 0..nqps {
            let pi = i % dev.ports.len();
            let qp = dev.ports[pi]
                .pd
                .create_qp(&cqs[pi], MAX_REQUESTS as u32 + 1)
                .map_err(sys)?;
            let (mut a, mask) = connection::init_attr(&dev.ports[pi].local(), cfg);
            qp.modify(&mut a, mask).map_err(sys)?;
            qps.push((qp, pi));
        }
        Ok(Resources {
            qps,
            flush: Vec::new(),
            cqs,
            dev,
        })
    }

    fn info(&self, qp: &Qp, pi: usize) -> QpInfo {
        let p = &self.dev.ports[pi];
        QpInfo {
            qpn: qp.num(),
            lid: p.lid,
            link_layer: p.link_layer,
            mtu: p.active_mtu,
            gid: p.gid,
        }
    }

    pub fn hello(&self, magic: u64) -> Hello {
        Hello {
            magic,
            qps: self.qps.iter().map(|(q, pi)| self.info(q, *pi)).collect(),
        }
    }

    fn connect_qp(&self, qp: &Qp, pi: usize, remote: &QpInfo, cfg: &Config) -> NetResult<()> {
        let local = self.dev.ports[pi].local();
        let (mut a, mask) = connection::rtr_attr(&local, remote, cfg);
        qp.modify(&mut a, mask).map_err(sys)?;
        let (mut a, mask) = connection::rts_attr(cfg);
        qp.modify(&mut a, mask).map_err(sys)
    }

    /// QP i to RTR then RTS toward the peer's QP i.
    pub fn bring_up(&self, remote: &Hello, cfg: &Config) -> NetResult<()> {
        if remote.qps.len() != self.qps.len() {
            return Err(NetError::Remote(format!(
                "peer has {} QPs, this side {}",
                remote.qps.len(),
                self.qps.len()
            )));
        }
        for ((qp, pi), r) in self.qps.iter().zip(&remote.qps) {
            self.connect_qp(qp, *pi, r, cfg)?;
        }
        Ok(())
    }

    /// The loopback QPs a receive end flushes GPU-direct data with: one on
    /// the first port of each device (ports of one device share its PCIe
    /// path and its protection domain).
    pub fn add_flush(&mut self, cfg: &Config) -> NetResult<()> {
        for pi in 0..self.dev.ports.len() {
            let p = &self.dev.ports[pi];
            if (0..pi).any(|j| Arc::ptr_eq(&self.dev.ports[j].pd, &p.pd)) {
                continue;
            }
            let qp =
                p.pd.create_qp(&self.cqs[pi], MAX_REQUESTS as u32 + 1)
                    .map_err(sys)?;
            let (mut a, mask) = connection::init_attr(&p.local(), cfg);
            qp.modify(&mut a, mask).map_err(sys)?;
            let me = self.info(&qp, pi);
            self.connect_qp(&qp, pi, &me, cfg)?;
            let buf = Box::new([0u8; 64]);
            let addr = buf.as_ptr() as u64;
            let mr = p.pd.reg_mr(addr as usize, buf.len()).map_err(sys)?;
            self.flush.push(Flush {
                qp,
                port: pi,
                mr,
                _buf: buf,
                addr,
            });
        }
        Ok(())
    }
}

struct Shared {
    res: Resources,
    tracker: Tracker,
}

impl Shared {
    /// Drains the completion queues into the bookkeeping.
    fn progress(&mut self) -> NetResult<()> {
        let v = verbs::verbs().map_err(sys)?;
        let mut wcs = [IbvWc::default(); 16];
        for cq in &self.res.cqs {
            loop {
                let n = cq.poll(&mut wcs).map_err(sys)?;
                for wc in &wcs[..n] {
                    self.tracker.complete(Completion {
                        wr_id: wc.wr_id,
                        status: if wc.status == verbs::IBV_WC_SUCCESS {
                            Ok(())
                        } else {
                            Err(format!(
                                "{} (status {}, vendor error {:#x})",
                                v.status_str(wc.status),
                                wc.status,
                                wc.vendor_err
                            ))
                        },
                        byte_len: wc.byte_len,
                        imm: (wc.wc_flags & verbs::IBV_WC_WITH_IMM != 0)
                            .then(|| u32::from_be(wc.imm_data)),
                    })?;
                }
                if n < wcs.len() {
                    break;
                }
            }
        }
        Ok(())
    }
}

fn lock(s: &Mutex<Shared>) -> NetResult<MutexGuard<'_, Shared>> {
    s.lock()
        .map_err(|_| NetError::Internal("IB connection state poisoned by a panic".into()))
}

struct IbRequest {
    shared: Arc<Mutex<Shared>>,
    id: u64,
    over: bool,
}

impl Request for IbRequest {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        let mut s = lock(&self.shared)?;
        let r = s.progress().and_then(|()| s.tracker.poll(self.id));
        self.over = !matches!(r, Ok(None));
        r.map(|o| o.map(|n| vec![n]))
    }
}

impl Drop for IbRequest {
    fn drop(&mut self) {
        if !self.over {
            if let Ok(mut s) = self.shared.lock() {
                s.tracker.forget(self.id);
            }
        }
    }
}

/// One end of a connection; both ends share the registration code.
struct End {
    shared: Arc<Mutex<Shared>>,
    dev: Arc<VDev>,
}

impl End {
    fn new(res: Resources, peer: String) -> End {
        let dev = Arc::clone(&res.dev);
        let nqps = res.qps.len();
        End {
            shared: Arc::new(Mutex::new(Shared {
                res,
                tracker: Tracker::new(nqps, peer),
            })),
            dev,
        }
    }

    fn reg_mr(&self, ptr: *mut u8, size: usize, ty: PtrType) -> NetResult<MrHandle> {
        if ty == PtrType::Cuda && self.dev.ptr_support & PtrType::Cuda as i32 == 0 {
            return Err(NetError::InvalidArgument(
                "GPU memory on an IB device without GPUDirect RDMA (load nvidia_peermem)".into(),
            ));
        }
        let mut mrs = self
            .dev
            .mrs
            .lock()
            .map_err(|_| NetError::Internal("IB registration cache poisoned".into()))?;
        let id = mrs.reg(ptr as usize, size, ty, |start, len| {
            self.dev.register(start, len)
        })?;
        Ok(MrHandle(id))
    }

    /// As NCCL: the range is widened to whole pages, which the NIC sees at
    /// their own addresses (the iova), and the dma-buf offset moves back
    /// by as much as the start did.
    fn reg_mr_dma_buf(
        &self,
        ptr: *mut u8,
        size: usize,
        ty: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        if let Err(why) = &self.dev.dmabuf {
            return Err(NetError::InvalidUsage(format!(
                "regMrDmaBuf on IB device {}, which does not report NCCL_PTR_DMABUF ({why}); \
                 register with regMr (nvidia_peermem) instead",
                self.dev.name()
            )));
        }
        if ty == PtrType::Host {
            return Err(NetError::InvalidArgument(
                "regMrDmaBuf of host memory: a dma-buf is GPU memory (NCCL_PTR_CUDA)".into(),
            ));
        }
        if d.fd < 0 {
            return Err(NetError::InvalidArgument(format!(
                "regMrDmaBuf with fd {}: not a dma-buf file descriptor",
                d.fd
            )));
        }
        let mut mrs = self
            .dev
            .mrs
            .lock()
            .map_err(|_| NetError::Internal("IB registration cache poisoned".into()))?;
        let id = mrs.reg(ptr as usize, size, PtrType::Dmabuf, |start, len| {
            let lead = (ptr as usize - start) as u64;
            let offset = d.offset.checked_sub(lead).ok_or_else(|| {
                format!(
                    "the buffer starts {lead} bytes into its page but only {} bytes into the dma-buf",
                    d.offset
                )
            })?;
            self.dev.register_dmabuf(offset, len, start as u64, d.fd)
        })?;
        Ok(MrHandle(id))
    }

    fn dereg_mr(&self, mr: MrHandle) -> NetResult<()> {
        let released = self
            .dev
            .mrs
            .lock()
            .map_err(|_| NetError::Internal("IB registration cache poisoned".into()))?
            .dereg(mr.0)?;
        // Deregistered here, outside the lock (ibv_dereg_mr can be slow).
        drop(released);
        Ok(())
    }

    /// The lkey of registration `mr` on QP `qp`'s port.
    fn lkey(&self, mr: Option<MrHandle>, port: usize, what: &str) -> NetResult<u32> {
        let mr = mr.ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "{what} without a memory handle: the IB network needs buffers registered with regMr"
            ))
        })?;
        let mrs = self
            .dev
            .mrs
            .lock()
            .map_err(|_| NetError::Internal("IB registration cache poisoned".into()))?;
        mrs.get(mr.0)
            .and_then(|m| m.get(port))
            .map(|m| m.lkey())
            .ok_or_else(|| {
                NetError::InvalidArgument(format!(
                    "{what}: memory handle {:#x} is not registered",
                    mr.0
                ))
            })
    }

    fn request(&self, id: u64) -> Box<dyn Request> {
        Box::new(IbRequest {
            shared: Arc::clone(&self.shared),
            id,
            over: false,
        })
    }
}

fn check_size(size: usize) -> NetResult<u32> {
    u32::try_from(size).map_err(|_| {
        NetError::InvalidArgument(format!(
            "message of {size} bytes: one IB request carries at most 4 GiB - 1"
        ))
    })
}

pub struct IbSend(End);

impl IbSend {
    pub fn new(res: Resources, peer: String) -> IbSend {
        IbSend(End::new(res, peer))
    }
}

#[allow(
    unsafe_code,
    reason = "implements the SDK's unsafe isend; the FFI itself stays in verbs.rs"
)]
impl SendComm for IbSend {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, ty: PtrType) -> NetResult<MrHandle> {
        self.0.reg_mr(ptr, size, ty)
    }

    fn reg_mr_dma_buf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        ty: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        self.0.reg_mr_dma_buf(ptr, size, ty, d)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()> {
        self.0.dereg_mr(mr)
    }

    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let len = check_size(size)?;
        let mut s = lock(&self.0.shared)?;
        let Some(p) = s.tracker.post(Kind::Send, size)? else {
            return Ok(None);
        };
        let (qp, port) = (&s.res.qps[p.qp].0, s.res.qps[p.qp].1);
        let lkey = match self.0.lkey(mr, port, "isend") {
            Ok(k) => k,
            Err(e) => {
                s.tracker.unpost(p.id, e.to_string());
                return Err(e);
            }
        };
        let mut sge = IbvSge {
            addr: data as u64,
            length: len,
            lkey,
        };
        let mut wr = IbvSendWr::new(
            p.id,
            &mut sge,
            (len > 0) as i32,
            verbs::IBV_WR_SEND_WITH_IMM,
        );
        wr.imm_data = (tag as u32).to_be();
        // SAFETY: the caller keeps `data` valid and unchanged until the
        // request completes (isend's contract); it lies in registration `mr`.
        if let Err(e) = unsafe { qp.post_send(&mut wr) } {
            s.tracker.unpost(p.id, e.clone());
            return Err(sys(e));
        }
        drop(s);
        Ok(Some(self.0.request(p.id)))
    }
}

pub struct IbRecv(End);

impl IbRecv {
    pub fn new(res: Resources, peer: String) -> IbRecv {
        IbRecv(End::new(res, peer))
    }
}

#[allow(
    unsafe_code,
    reason = "implements the SDK's unsafe irecv; the FFI itself stays in verbs.rs"
)]
impl RecvComm for IbRecv {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, ty: PtrType) -> NetResult<MrHandle> {
        self.0.reg_mr(ptr, size, ty)
    }

    fn reg_mr_dma_buf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        ty: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        self.0.reg_mr_dma_buf(ptr, size, ty, d)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()> {
        self.0.dereg_mr(mr)
    }

    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let len = check_size(size)?;
        let mut s = lock(&self.0.shared)?;
        let Some(p) = s.tracker.post(
            Kind::Recv {
                capacity: size,
                tag,
            },
            size,
        )?
        else {
            return Ok(None);
        };
        let (qp, port) = (&s.res.qps[p.qp].0, s.res.qps[p.qp].1);
        let lkey = match self.0.lkey(mr, port, "irecv") {
            Ok(k) => k,
            Err(e) => {
                s.tracker.unpost(p.id, e.to_string());
                return Err(e);
            }
        };
        let mut sge = IbvSge {
            addr: data as u64,
            length: len,
            lkey,
        };
        let mut wr = IbvRecvWr {
            wr_id: p.id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: (len > 0) as i32,
        };
        // SAFETY: the caller keeps `data` valid for writes, and untouched,
        // until the request completes (irecv's contract).
        if let Err(e) = unsafe { qp.post_recv(&mut wr) } {
            s.tracker.unpost(p.id, e.clone());
            return Err(sys(e));
        }
        drop(s);
        Ok(Some(self.0.request(p.id)))
    }

    /// NCCL's flush: when GPU-direct is in use and the receive carried
    /// data, read one byte of the buffer back through each device's
    /// loopback QP; the reads complete only once the NIC's writes before
    /// them are visible.
    fn iflush(
        &mut self,
        data: *mut u8,
        size: usize,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let mut s = lock(&self.0.shared)?;
        if s.res.flush.is_empty() || size == 0 {
            // No GPU-direct here (or the flush disabled), or nothing
            // received: nothing to wait for.
            return Ok(None);
        }
        let rkeys: Vec<u32> = {
            let mrs = self
                .0
                .dev
                .mrs
                .lock()
                .map_err(|_| NetError::Internal("IB registration cache poisoned".into()))?;
            // NCCL always passes the receive's handle; without one, the
            // registration covering the buffer serves.
            let reg = match mr {
                Some(m) => mrs.get(m.0),
                None => mrs.find(data as usize),
            };
            let Some(reg) = reg else {
                return Err(NetError::InvalidArgument(format!(
                    "iflush of {data:?}: {} is not registered with this IB device",
                    mr.map_or("the buffer".to_string(), |m| format!(
                        "memory handle {:#x}",
                        m.0
                    ))
                )));
            };
            s.res
                .flush
                .iter()
                .map(|f| reg.get(f.port).map(|m| m.rkey()))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    NetError::Internal("IB registration lacks a port of its device".into())
                })?
        };
        let reads = s.res.flush.len();
        let Some(p) = s.tracker.post(Kind::Flush { reads }, 0)? else {
            return Err(NetError::Internal(
                "IB flush refused by the request bookkeeping".into(),
            ));
        };
        for (i, rkey) in rkeys.into_iter().enumerate() {
            let f = &s.res.flush[i];
            let mut sge = IbvSge {
                addr: f.addr,
                length: 1,
                lkey: f.mr.lkey(),
            };
            let mut wr = IbvSendWr::new(p.id, &mut sge, 1, verbs::IBV_WR_RDMA_READ);
            wr.remote_addr = data as u64;
            wr.rkey = rkey;
            // SAFETY: the read lands in our own registered 64-byte buffer,
            // which lives as long as the QP; it reads one byte of a
            // registered buffer.
            if let Err(e) = unsafe { f.qp.post_send(&mut wr) } {
                s.tracker.unpost(p.id, e.clone());
                return Err(sys(e));
            }
        }
        drop(s);
        Ok(Some(self.0.request(p.id)))
    }
}
