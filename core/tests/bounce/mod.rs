//! A network for the GPUDirect tests, without an RDMA NIC: the socket
//! network claiming `NCCL_PTR_CUDA` ("CudaBounce") or `NCCL_PTR_DMABUF`
//! ("DmaBufBounce"), which copies device buffers through host memory inside
//! its isend/irecv, as a NIC would read and write them over PCIe, and logs
//! every registration and transfer ([`LOG`]). A process chooses its network
//! once, so each of the two is tested in a binary of its own.

use std::sync::{Arc, Mutex};

use oxccl::cuda::{
    pointer_kind, Context, Device, DeviceBuffer, FillPattern, KernelSet, PinnedHost, PtrKind,
    Stream,
};
use oxccl::{Comm, CommConfig, DataType, InitState, Op, OpKind, RedOp};
use oxccl_net_socket::SocketNet;
use oxccl_plugin::{
    BuiltinNet, DmaBuf, ListenComm, MrHandle, Net, NetHandle, NetProperties, NetResult, PtrType,
    RecvComm, Request, SendComm,
};

/// (call, pointer, bytes, pointer type as registered, whether the driver
/// calls the pointer device memory).
pub type Entry = (&'static str, usize, usize, i32, bool);
/// Every call, in order.
pub static LOG: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
/// Registered CUDA regions (base, bytes).
pub static CUDA: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
const FAKE_MR: usize = 0x6764_7200;

fn is_cuda(p: usize) -> bool {
    CUDA.lock()
        .unwrap()
        .iter()
        .any(|&(b, n)| b <= p && p <= b + n)
}

fn log(call: &'static str, p: usize, n: usize, ty: i32) {
    let dev = pointer_kind(p as u64) == PtrKind::Device;
    LOG.lock().unwrap().push((call, p, n, ty, dev));
}

/// The socket network, claiming CUDA pointers or (`.1`) dma-buf.
struct Bounce(SocketNet, bool);
struct Listen(Box<dyn ListenComm>);
struct Send(Box<dyn SendComm>, Pool);
struct Recv(Box<dyn RecvComm>, Pool, Arc<Stream>);

/// Pinned host buffers of a connection, made with it (at communicator
/// creation): allocating or freeing pinned memory while kernels run can
/// wait for them (cuMemFreeHost synchronizes), and these kernels wait for
/// the proxy that would be waiting.
#[derive(Clone)]
struct Pool(Arc<Mutex<Vec<PinnedHost>>>);

/// Requests in flight per connection at most (8 step slots and a goodbye),
/// each at most a slot (NCCL_BUFFSIZE / 8 by default).
const POOL: usize = 9;
const BOUNCE_BYTES: usize = 1 << 20;

fn ctx() -> NetResult<Arc<Context>> {
    Context::primary(Device::get(0).map_err(net_err)?).map_err(net_err)
}

impl Pool {
    fn new() -> NetResult<Pool> {
        let ctx = ctx()?;
        let bufs = (0..POOL)
            .map(|_| PinnedHost::alloc(&ctx, BOUNCE_BYTES).map_err(net_err))
            .collect::<NetResult<Vec<_>>>()?;
        Ok(Pool(Arc::new(Mutex::new(bufs))))
    }

    fn take(&self, n: usize) -> NetResult<PinnedHost> {
        if n > BOUNCE_BYTES {
            return Err(oxccl_plugin::NetError::Internal(format!(
                "{n} bytes: larger than a bounce buffer"
            )));
        }
        self.0
            .lock()
            .unwrap()
            .pop()
            .ok_or_else(|| oxccl_plugin::NetError::Internal("bounce buffers exhausted".into()))
    }
}

fn register(p: *mut u8, n: usize, ty: PtrType) -> Option<MrHandle> {
    log("regMr", p as usize, n, ty as i32);
    (ty == PtrType::Cuda).then(|| {
        CUDA.lock().unwrap().push((p as usize, n));
        MrHandle(FAKE_MR)
    })
}

/// A regMrDmaBuf: logged as "regMrDmaBuf+" when `d.fd` is an open dma-buf
/// (as /proc names it), "regMrDmaBuf-" otherwise.
fn register_dmabuf(p: *mut u8, n: usize, ty: PtrType, d: DmaBuf) -> MrHandle {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", d.fd)).unwrap_or_default();
    let live = link.to_string_lossy().contains("dmabuf");
    log(
        if live { "regMrDmaBuf+" } else { "regMrDmaBuf-" },
        p as usize,
        n,
        ty as i32,
    );
    CUDA.lock().unwrap().push((p as usize, n));
    MrHandle(FAKE_MR)
}

/// Our own registrations need no undoing; the inner network's do.
fn deregister(mr: MrHandle, inner: impl FnOnce(MrHandle) -> NetResult<()>) -> NetResult<()> {
    if mr.0 == FAKE_MR {
        Ok(())
    } else {
        inner(mr)
    }
}

impl Net for Bounce {
    fn name(&self) -> &str {
        if self.1 {
            "DmaBufBounce"
        } else {
            "CudaBounce"
        }
    }
    fn devices(&self) -> NetResult<usize> {
        self.0.devices()
    }
    fn properties(&self, dev: usize) -> NetResult<NetProperties> {
        let mut p = self.0.properties(dev)?;
        p.ptr_support |= if self.1 {
            PtrType::Dmabuf
        } else {
            PtrType::Cuda
        } as i32;
        Ok(p)
    }
    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let (h, l) = self.0.listen(dev)?;
        Ok((h, Box::new(Listen(l))))
    }
    fn connect(&self, dev: usize, h: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        match self.0.connect(dev, h)? {
            Some(s) => Ok(Some(Box::new(Send(s, Pool::new()?)))),
            None => Ok(None),
        }
    }
}

impl ListenComm for Listen {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        match self.0.accept()? {
            Some(r) => {
                let s = Stream::new(&ctx()?).map_err(net_err)?;
                Ok(Some(Box::new(Recv(r, Pool::new()?, Arc::new(s)))))
            }
            None => Ok(None),
        }
    }
}

/// A transfer of device memory through a pinned host buffer of the pool,
/// which the request holds until it is dropped.
struct Bounced {
    inner: Box<dyn Request>,
    host: Option<PinnedHost>,
    pool: Pool,
    /// For a receive: where the data goes once it has arrived, and the
    /// connection's stream that copies it there (done before the receive
    /// is reported done).
    to: Option<(u64, Arc<Stream>)>,
}

impl Request for Bounced {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        let Some(sizes) = self.inner.test()? else {
            return Ok(None);
        };
        if let (Some((dst, s)), Some(&n), Some(h)) = (&self.to, sizes.first(), &self.host) {
            h.copy_to_device(*dst, 0, n, s.handle()).map_err(net_err)?;
            s.synchronize().map_err(net_err)?;
        }
        Ok(Some(sizes))
    }
}

impl Drop for Bounced {
    fn drop(&mut self) {
        if let Some(h) = self.host.take() {
            self.pool.0.lock().unwrap().push(h);
        }
    }
}

fn net_err(e: oxccl::Error) -> oxccl_plugin::NetError {
    oxccl_plugin::NetError::Internal(e.to_string())
}

impl SendComm for Send {
    fn reg_mr(&mut self, p: *mut u8, n: usize, ty: PtrType) -> NetResult<MrHandle> {
        register(p, n, ty).map_or_else(|| self.0.reg_mr(p, n, ty), Ok)
    }
    fn reg_mr_dma_buf(
        &mut self,
        p: *mut u8,
        n: usize,
        ty: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        Ok(register_dmabuf(p, n, ty, d))
    }
    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()> {
        deregister(mr, |mr| self.0.dereg_mr(mr))
    }
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let cuda = is_cuda(data as usize);
        log("isend", data as usize, size, if cuda { 2 } else { 1 });
        if !cuda {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.0.isend(data, size, tag, mr) };
        }
        let host = self.1.take(size)?;
        // SAFETY: `data` is registered device memory of `size` bytes, left
        // unchanged until the request completes (the caller's contract);
        // `host` holds `size` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(host.host_ptr(), size) };
        // SAFETY: as above; a copy into pageable or pinned memory is
        // complete when the call returns.
        unsafe { oxccl::cuda::read_raw(data as u64, out) }.map_err(net_err)?;
        // SAFETY: `host` moves into the request, so it lives, unchanged,
        // until the inner request completes.
        let inner = unsafe { self.0.isend(host.host_ptr(), size, tag, None) }?;
        let pool = self.1.clone();
        Ok(inner.map(|inner| {
            Box::new(Bounced {
                inner,
                host: Some(host),
                pool,
                to: None,
            }) as Box<dyn Request>
        }))
    }
}

impl RecvComm for Recv {
    fn reg_mr(&mut self, p: *mut u8, n: usize, ty: PtrType) -> NetResult<MrHandle> {
        register(p, n, ty).map_or_else(|| self.0.reg_mr(p, n, ty), Ok)
    }
    fn reg_mr_dma_buf(
        &mut self,
        p: *mut u8,
        n: usize,
        ty: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        Ok(register_dmabuf(p, n, ty, d))
    }
    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()> {
        deregister(mr, |mr| self.0.dereg_mr(mr))
    }
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let cuda = is_cuda(data as usize);
        log("irecv", data as usize, size, if cuda { 2 } else { 1 });
        if !cuda {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.0.irecv(data, size, tag, mr) };
        }
        let host = self.1.take(size)?;
        // SAFETY: `host` moves into the request, so it lives, untouched,
        // until the inner request completes.
        let inner = unsafe { self.0.irecv(host.host_ptr(), size, tag, None) }?;
        let (pool, s) = (self.1.clone(), self.2.clone());
        Ok(inner.map(|inner| {
            Box::new(Bounced {
                inner,
                host: Some(host),
                pool,
                to: Some((data as u64, s)),
            }) as Box<dyn Request>
        }))
    }
}

fn bounce(dmabuf: bool) -> NetResult<Box<dyn Net>> {
    let socket = SocketNet::new(Some("lo"), oxccl_netif::Family::V4, 0, 1)?;
    Ok(Box::new(Bounce(socket, dmabuf)))
}

fn init() -> NetResult<Box<dyn Net>> {
    bounce(false)
}

fn init_dmabuf() -> NetResult<Box<dyn Net>> {
    bounce(true)
}

oxccl_plugin::inventory::submit! {
    BuiltinNet { name: "CudaBounce", priority: 1000, init, abi: None }
}

oxccl_plugin::inventory::submit! {
    BuiltinNet { name: "DmaBufBounce", priority: 999, init: init_dmabuf, abi: None }
}

pub const COUNT: usize = (3 << 20) + 5;
pub const NRANKS: usize = 2;

/// The transfers of `log` (sizes above 0), apart: those of the simple
/// slots, and those of the LL slots, which are the host memory registered
/// through `regMr` beside GPU slots.
pub fn transfers(log: &[Entry]) -> (Vec<Entry>, Vec<Entry>) {
    let ll: Vec<(usize, usize)> = log
        .iter()
        .filter(|e| e.0 == "regMr" && e.3 == 1)
        .map(|e| (e.1, e.2))
        .collect();
    let gpu_slots = log.iter().any(|e| e.0.starts_with("regMr") && e.3 != 1);
    log.iter()
        .filter(|e| !e.0.starts_with("regMr") && e.2 > 0)
        .partition(|e| !(gpu_slots && ll.iter().any(|&(b, n)| b <= e.1 && e.1 < b + n)))
}

fn pattern(rank: usize) -> FillPattern {
    FillPattern {
        seed: rank as u64 + 3,
        modulus: 17,
        offset: -8,
    }
}

fn op(kind: OpKind, input: u64, output: u64, stream: &Stream) -> Op {
    Op {
        kind,
        input: input as usize as *const u8,
        output: output as usize as *mut u8,
        count: COUNT,
        dtype: DataType::Float32,
        redop: RedOp::Sum,
        stream: stream.handle().raw(),
        user_tag: 0,
        call: Default::default(),
    }
}

/// all_reduce then all_gather of its result, two ranks on GPU 0, every
/// byte through the network `net`, with NCCL_PROTO `proto` (empty: unset);
/// returns the wrong elements.
pub fn run(net: &str, level: &str, dmabuf_enable: &str, proto: &str) -> usize {
    let cfg = CommConfig::default()
        .with("PROTO", proto)
        .with("P2P_DISABLE", "1")
        .with("SHM_DISABLE", "1")
        .with("NET", net)
        .with("NET_GDR_LEVEL", level)
        .with("DMABUF_ENABLE", dmabuf_enable)
        .with("TIMEOUT", "30");
    let comms = Comm::init_all_devices(&[0; NRANKS], &cfg).expect("communicators");
    let ctx = Context::primary(Device::get(0).unwrap()).unwrap();
    let kernels = KernelSet::new(&ctx).unwrap();
    let bytes = COUNT * 4;
    let alloc = |n| {
        let b = DeviceBuffer::alloc(&ctx, n).unwrap();
        b.fill_bytes(0xff).unwrap();
        b
    };
    let bufs: Vec<_> = (0..NRANKS)
        .map(|_| {
            (
                Stream::new(&ctx).unwrap(),
                alloc(bytes),
                alloc(bytes),
                alloc(bytes * NRANKS),
            )
        })
        .collect();
    for (r, (s, input, _, _)) in bufs.iter().enumerate() {
        kernels
            .fill(
                input.ptr(),
                COUNT,
                DataType::Float32,
                pattern(r),
                s.handle(),
            )
            .unwrap();
        s.synchronize().unwrap();
    }
    oxccl::group_start();
    for (comm, (s, input, output, _)) in comms.iter().zip(&bufs) {
        let ar = op(OpKind::AllReduce, input.ptr(), output.ptr(), s);
        // SAFETY: device buffers sized for the op, alive until the streams
        // are synchronised below.
        unsafe { comm.enqueue(ar) }.unwrap();
    }
    oxccl::group_end().unwrap();
    oxccl::group_start();
    for (comm, (s, _, output, gathered)) in comms.iter().zip(&bufs) {
        let ag = op(OpKind::AllGather, output.ptr(), gathered.ptr(), s);
        // SAFETY: as above.
        unsafe { comm.enqueue(ag) }.unwrap();
    }
    oxccl::group_end().unwrap();
    let mut wrong = 0;
    for (comm, (s, _, output, gathered)) in comms.iter().zip(&bufs) {
        s.synchronize().unwrap();
        assert!(matches!(comm.async_error(), Ok(InitState::Ready)));
        let mut got = vec![0u8; bytes];
        output.read(0, &mut got).unwrap();
        let mut all = vec![0u8; bytes * NRANKS];
        gathered.read(0, &mut all).unwrap();
        let f = |b: &[u8], i: usize| f32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
        for i in 0..COUNT {
            let want: f32 = (0..NRANKS).map(|p| pattern(p).value(i) as f32).sum();
            wrong += usize::from(f(&got, i) != want);
            wrong += (0..NRANKS)
                .filter(|p| f(&all, p * COUNT + i) != want)
                .count();
        }
    }
    for c in comms {
        c.destroy().unwrap();
    }
    wrong
}
