//! The network interface, modelled on NCCL's `ncclNet` (loaded at v6 to v12).
//!
//! Every call returns at once: an operation that cannot complete yet returns
//! `Ok(None)` and is called again by the core (a `Poll`-like contract, not a
//! status code). This is what lets one proxy thread drive many connections.
//!
//! The whole net kind lives in this folder: the trait for authors (here),
//! the frozen C layouts of each `ncclNet_vN` and `ncclCollNet_vN` ([`abi`],
//! also reachable as `ffi::net`), the export adapters that offer a Rust
//! [`Net`] through them ([`export`]) and the loader that drives a library's
//! vtable through this trait for the core ([`load`]), both generated from
//! one list of versions ([`versions`]).

use std::fmt;

pub use crate::net_prof::{NetEvent, NetProf};

pub mod abi;
pub mod export;
pub mod load;
pub mod versions;

/// Size of the opaque connection handle a listener hands to its peer
/// (NCCL's `NCCL_NET_HANDLE_MAXSIZE`).
pub const NET_HANDLE_MAXSIZE: usize = 128;

/// Opaque bytes produced by [`Net::listen`] and carried by the core (through
/// the bootstrap network) to the rank that calls [`Net::connect`]. The
/// connecting side may use it to store its connection state between calls, as
/// NCCL allows.
pub type NetHandle = [u8; NET_HANDLE_MAXSIZE];

/// Where a buffer lives (NCCL's `NCCL_PTR_HOST`, `NCCL_PTR_CUDA`, `NCCL_PTR_DMABUF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum PtrType {
    Host = 1,
    Cuda = 2,
    Dmabuf = 4,
}

/// Properties of one network device (NCCL's `ncclNetProperties_t`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetProperties {
    pub name: String,
    /// sysfs path of the PCI device, for topology detection.
    pub pci_path: String,
    /// Unique id of the NIC; ports of one NIC share it.
    pub guid: u64,
    /// Bit mask of [`PtrType`] values the device can send from and receive into.
    pub ptr_support: i32,
    /// Whether a registration is valid for every connection of the device.
    pub reg_is_global: bool,
    /// Port speed in Mbit/s.
    pub speed_mbps: i32,
    pub port: i32,
    /// One-way latency in microseconds.
    pub latency_us: f32,
    /// Connections the device can hold at once.
    pub max_comms: i32,
    /// Buffers one `irecv` may take (multi-receive); 1 when unsupported.
    pub max_recvs: i32,
    /// Largest single message the device carries.
    pub max_p2p_bytes: usize,
}

/// Failures a network reports; mapped onto NCCL's result codes at the C ABI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The caller passed something the plugin cannot use (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operating system refused (`ncclSystemError`): a socket, a device.
    #[error("system error: {0}")]
    System(String),
    /// The peer closed or broke the connection (`ncclRemoteError`).
    #[error("remote error: {0}")]
    Remote(String),
    /// A bug or inconsistent state inside the plugin (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller asked for something this network never offered, such as
    /// dma-buf memory from a network that does not report
    /// [`PtrType::Dmabuf`] (`ncclInvalidUsage`).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// The network does not implement this optional operation. NCCL's own
    /// networks answer `ncclInternalError` here (its socket transport's
    /// `iflush`), so that is the code this maps to.
    #[error("not supported: {0}")]
    Unsupported(String),
}

pub type NetResult<T> = Result<T, NetError>;

/// A registered memory region, opaque to the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrHandle(pub usize);

/// GPU memory exported as a dma-buf: the file descriptor and where the
/// buffer starts inside it (NCCL's `fd` and `offset` of `regMrDmaBuf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaBuf {
    pub fd: i32,
    pub offset: u64,
}

/// A form of a registration that the network's device code can use
/// (`getDeviceMr`); opaque to the core, which copies it to the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceMr(pub usize);

fn no_dma_buf() -> NetError {
    NetError::InvalidUsage(
        "regMrDmaBuf: this network does not take dma-buf memory (it does not report \
         NCCL_PTR_DMABUF); register the buffer with regMr instead"
            .into(),
    )
}

fn no_device_offload() -> NetError {
    NetError::Unsupported(
        "getDeviceMr: this network has no device offload (its netDeviceType is HOST)".into(),
    )
}

/// An outstanding `isend` or `irecv`.
pub trait Request: Send {
    /// `Ok(None)` while in flight; `Ok(Some(sizes))` once done, one size per
    /// buffer of the operation (the received size for a receive). Empty
    /// `sizes`: done, size not reported. A C plugin may leave `test`'s size
    /// unwritten (Google's Fast Socket does): NCCL never relies on it, since
    /// its kernels know every slice's size, so callers must not either.
    fn test(&mut self) -> NetResult<Option<Vec<usize>>>;

    /// [`Request::test`] reporting the first buffer's size alone (`None`
    /// inside: done, size not reported). Every caller of a single-buffer
    /// operation needs no more, and a network that answers it without
    /// building a `Vec` saves an allocation per completed request, a
    /// visible share of a small message's latency. The default asks
    /// `test`.
    fn test_first(&mut self) -> NetResult<Option<Option<usize>>> {
        Ok(self.test()?.map(|sizes| sizes.first().copied()))
    }
}

/// A network implementation (NCCL's `ncclNet_t`).
pub trait Net: Send + Sync {
    /// Name shown in logs and `oxccl info` (NCCL's `name`).
    fn name(&self) -> &str;
    /// Number of usable devices; 0 means "this network cannot run here".
    fn devices(&self) -> NetResult<usize>;
    fn properties(&self, dev: usize) -> NetResult<NetProperties>;
    /// Opens a listening endpoint on `dev`. The handle goes to the peer, which
    /// passes it to [`Net::connect`].
    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)>;
    /// Connects to the listener described by `handle`. Never blocks: returns
    /// `Ok(None)` until the connection is established, and is called again
    /// with the same handle (which it may modify to keep its progress).
    fn connect(&self, dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>>;
}

/// A listening endpoint.
pub trait ListenComm: Send {
    /// Never blocks: `Ok(None)` until a peer has connected.
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>>;
}

/// The sending end of a connection. Messages arrive in the order they are
/// sent; the core relies on that order and on nothing else for matching.
pub trait SendComm: Send {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, ptr_type: PtrType) -> NetResult<MrHandle>;
    /// Registers `size` bytes at `ptr` that the GPU driver exported as
    /// `dmabuf`; released with [`SendComm::dereg_mr`]. Only called by a
    /// caller that saw [`PtrType::Dmabuf`] in the device's `ptr_support`.
    fn reg_mr_dma_buf(
        &mut self,
        _ptr: *mut u8,
        _size: usize,
        _ptr_type: PtrType,
        _dmabuf: DmaBuf,
    ) -> NetResult<MrHandle> {
        Err(no_dma_buf())
    }
    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()>;
    /// The device-side form of `mr`, for networks whose device code moves
    /// data itself (NCCL calls it only when the network asked for offload).
    fn get_device_mr(&mut self, _mr: MrHandle) -> NetResult<DeviceMr> {
        Err(no_device_offload())
    }
    /// Starts sending `size` bytes at `data`. `Ok(None)` means "no resources
    /// now, try again later".
    ///
    /// # Safety
    /// `data` must be valid for reads of `size` bytes and left unchanged until
    /// the returned request has completed.
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>>;
    /// [`SendComm::isend`] with the operation's profiler handle (`None`
    /// when the profiler asked for no network events), under which a
    /// network reports events of its own (see [`crate::net_prof`]). The
    /// default ignores it.
    ///
    /// # Safety
    /// As [`SendComm::isend`].
    unsafe fn isend_profiled(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
        prof: Option<NetProf>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let _ = prof;
        // SAFETY: the caller's contract is isend's.
        unsafe { self.isend(data, size, tag, mr) }
    }
}

/// The receiving end of a connection.
pub trait RecvComm: Send {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, ptr_type: PtrType) -> NetResult<MrHandle>;
    /// As [`SendComm::reg_mr_dma_buf`].
    fn reg_mr_dma_buf(
        &mut self,
        _ptr: *mut u8,
        _size: usize,
        _ptr_type: PtrType,
        _dmabuf: DmaBuf,
    ) -> NetResult<MrHandle> {
        Err(no_dma_buf())
    }
    fn dereg_mr(&mut self, mr: MrHandle) -> NetResult<()>;
    /// As [`SendComm::get_device_mr`].
    fn get_device_mr(&mut self, _mr: MrHandle) -> NetResult<DeviceMr> {
        Err(no_device_offload())
    }
    /// Posts a receive of at most `size` bytes into `data`. A message larger
    /// than `size` is an error ("truncated"), a smaller one completes with its
    /// own size. `Ok(None)` means "try again later".
    ///
    /// # Safety
    /// `data` must be valid for writes of `size` bytes, and not otherwise
    /// accessed, until the returned request has completed.
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>>;
    /// [`RecvComm::irecv`] with the operation's profiler handle, as
    /// [`SendComm::isend_profiled`]. The default ignores it.
    ///
    /// # Safety
    /// As [`RecvComm::irecv`].
    unsafe fn irecv_profiled(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
        prof: Option<NetProf>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let _ = prof;
        // SAFETY: the caller's contract is irecv's.
        unsafe { self.irecv(data, size, tag, mr) }
    }
    /// Makes data that a completed receive wrote into GPU memory (`size`
    /// bytes at `data`, registered as `mr`) visible to the GPU, as NCCL's
    /// `iflush`. `Ok(None)` means "nothing to wait for" (already visible),
    /// not "try again": the caller then treats the flush as done.
    ///
    /// The default refuses, as NCCL's socket transport does: a network that
    /// never reports [`PtrType::Cuda`] is never asked to flush.
    fn iflush(
        &mut self,
        _data: *mut u8,
        _size: usize,
        _mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        Err(NetError::Unsupported(
            "iflush: this network has no GPU-direct receive to flush (it does not report \
             NCCL_PTR_CUDA)"
                .into(),
        ))
    }
    /// The GPU has consumed the data of `n` completed receives (device
    /// offload). NCCL calls this after every completed receive whenever the
    /// entry is present, so the default accepts and does nothing.
    fn irecv_consumed(&mut self, _n: usize) -> NetResult<()> {
        Ok(())
    }
}

/// A network linked into the binary, found by the core with `inventory`
/// without any file beside the library.
pub struct BuiltinNet {
    pub name: &'static str,
    /// Lower runs first when no network is named (NCCL tries IB before Socket).
    pub priority: i32,
    pub init: fn() -> NetResult<Box<dyn Net>>,
    /// The network's exported C vtables by symbol name (what
    /// `export_net_plugin!` emits as `__oxccl_net_symbol`). When present the
    /// core calls the built-in through the C ABI, exactly as a loaded
    /// library, so that every run exercises the ABI; `init` is then unused.
    pub abi: Option<fn(&str) -> Option<*const std::ffi::c_void>>,
}

impl fmt::Debug for BuiltinNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltinNet")
            .field("name", &self.name)
            .field("priority", &self.priority)
            .field("abi", &self.abi.is_some())
            .finish()
    }
}

inventory::collect!(BuiltinNet);

/// All networks linked into this binary, in order of preference.
pub fn builtin_nets() -> Vec<&'static BuiltinNet> {
    let mut v: Vec<_> = inventory::iter::<BuiltinNet>.into_iter().collect();
    v.sort_by_key(|b| b.priority);
    v
}
