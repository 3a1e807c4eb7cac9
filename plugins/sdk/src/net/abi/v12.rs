//! `ncclNet_v12_t` and `ncclCollNet_v12_t` (NCCL 2.30 onwards; 2.28 does not
//! know it). Frozen: a change makes a new version file. The newest: the
//! shape every older version converts to and from, and the one place each
//! entry's contract is written down.
//!
//! Compared with v11: a virtual NIC may fuse 8 devices instead of 4, and
//! properties gain the rail and plane of the device. The calls are those of
//! v11.

use std::os::raw::{c_char, c_int, c_void};

use super::{
    abi_common, as_newest, call, Abi, ConnectFn, DeviceHandle, InitFn, IrecvFn, IsendFn, ListenFn,
    NetDeviceType,
};
use crate::ffi::types::{DataType, Logger, NcclResult, RedOp};

/// Symbol of the network vtable ([`NetV12`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v12\0";
/// Symbol of the collective-network vtable ([`CollNetV12`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v12\0";

/// `ncclNetDeviceHandle_v12_t`.
pub type DeviceHandleV12 = DeviceHandle;

/// `NCCL_NET_MAX_DEVS_PER_NIC` of this version: physical devices one
/// virtual NIC may fuse.
pub const MAX_DEVS_PER_NIC_V12: usize = 8;

/// `ncclNetVDeviceProps_v12_t`: the physical devices fused into a virtual NIC.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevicePropsV12 {
    /// Entries of `devs` in use.
    pub ndevs: c_int,
    /// Indices of the fused devices, as numbered by `devices`.
    pub devs: [c_int; MAX_DEVS_PER_NIC_V12],
}

/// `ncclNetCommConfig_v12_t`: per-communicator network settings.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommConfigV12 {
    /// Plugin-defined QoS level; `NCCL_NET_TRAFFIC_CLASS_UNDEF` (-1) unless
    /// the application set one in its communicator config.
    pub traffic_class: c_int,
}

/// `ncclNetProperties_v12_t`, filled by `getProperties`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV12 {
    /// Device name, for logs; owned by the plugin and valid while it is loaded.
    pub name: *mut c_char,
    /// The PCI device's directory in sysfs (topology detection); NULL for a
    /// virtual interface.
    pub pci_path: *mut c_char,
    /// Identity of the NIC chip: devices with the same guid share one port
    /// to the fabric and are not used as independent rails.
    pub guid: u64,
    /// `NCCL_PTR_HOST`, `| NCCL_PTR_CUDA` with GPUDirect RDMA,
    /// `| NCCL_PTR_DMABUF` with `regMrDmaBuf`.
    pub ptr_support: c_int,
    /// Non-zero when a registration is valid on every comm of the device,
    /// so that re-registering a sub-range of a known buffer is cheap.
    pub reg_is_global: c_int,
    /// Non-zero to make NCCL flush after every receive into GPU memory, not
    /// only where the PCI topology needs it (NICs whose data and completions
    /// take different PCI paths).
    pub force_flush: c_int,
    /// Port speed in Mbit/s.
    pub speed: c_int,
    /// Port number (several ports behind one PCI function).
    pub port: c_int,
    /// Latency in microseconds (tuning).
    pub latency: f32,
    /// Most comms the device can open.
    pub max_comms: c_int,
    /// Most buffers one `irecv` may group (1: no multi-receive).
    pub max_recvs: c_int,
    /// Device offload offered; `NCCL_NET_DEVICE_HOST` for none.
    pub net_device_type: NetDeviceType,
    /// Offload version; must match NCCL's for the offload to be used.
    pub net_device_version: c_int,
    /// For a virtual NIC: the devices fused into it.
    pub vprops: VDevicePropsV12,
    /// Largest single point-to-point transfer; NCCL splits larger ones.
    pub max_p2p_bytes: usize,
    /// Largest single collective transfer (collnet).
    pub max_coll_bytes: usize,
    /// Most requests one multi-request may carry (1: none).
    pub max_multi_request_size: c_int,
    /// Rail of the device (`NCCL_NET_ID_UNDEF`, -1, when unknown).
    pub rail_id: i16,
    /// Plane of the device (`NCCL_NET_ID_UNDEF`, -1, when unknown).
    pub plane_id: i16,
}

/// `ncclNetCommAttr_v12_t`: flow hints for one direction of a
/// communicator's connections; `NCCL_NET_ATTR_UNDEF` (-1) where unknown.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommAttrV12 {
    pub max_concurrent_peers: i32,
    pub min_concurrent_peers: i32,
    pub max_flows_per_peer: i32,
    pub min_flows_per_peer: i32,
}

impl CommAttrV12 {
    /// Every attribute `NCCL_NET_ATTR_UNDEF`.
    pub const UNDEF: Self = Self {
        max_concurrent_peers: -1,
        min_concurrent_peers: -1,
        max_flows_per_peer: -1,
        min_flows_per_peer: -1,
    };
}

/// `ncclNetAttr_v12_t`: what NCCL is about to run on a context, passed to
/// `setNetAttr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetAttrV12 {
    pub send_comm_attr: CommAttrV12,
    pub recv_comm_attr: CommAttrV12,
    /// `ncclFunc_t` of the operation, or `u32::MAX` when unset.
    pub op: u32,
    /// `NCCL_ALGO_*`, or `u32::MAX` when unset.
    pub algo: u32,
    /// `NCCL_PROTO_*`, or `u32::MAX` when unset.
    pub proto: u32,
}

impl NetAttrV12 {
    /// `NCCL_NET_ATTR_INIT`: everything unset.
    pub const UNDEF: Self = Self {
        send_comm_attr: CommAttrV12::UNDEF,
        recv_comm_attr: CommAttrV12::UNDEF,
        op: u32::MAX,
        algo: u32::MAX,
        proto: u32::MAX,
    };
}

/// `ncclNet_v12_t`: the point-to-point network.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV12 {
    /// Network name, used in logs and matched against `NCCL_NET`.
    pub name: *const c_char,
    /// Called for every communicator (`comm_id` names it) before it uses the
    /// network; writes into `*ctx` a context that `listen`, `connect`,
    /// `set_net_attr` and `finalize` receive. `config` holds the
    /// communicator's settings (traffic class); the logger and the profiler
    /// callback are as in v10. An error makes NCCL ignore the plugin.
    pub init: Option<InitFn>,
    /// Writes the number of devices; zero fails NCCL's init, so a plugin
    /// with no usable device should fail `init` instead.
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    /// Fills the properties of device `dev`.
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV12) -> NcclResult>,
    /// Receiver side: opens a listening comm on `dev` and writes into
    /// `handle` (NCCL's buffer of `NCCL_NET_HANDLE_MAXSIZE` bytes) what the
    /// sender needs to connect. Must not block; on success `*listen_comm` is
    /// never NULL. `ctx` is the context from `init`.
    pub listen: Option<ListenFn>,
    /// Sender side: connects to the peer's `handle`. Must not block: success
    /// with `*send_comm == NULL` means "not yet", and NCCL calls again until
    /// it is set. When `*send_dev_comm` points to a handle, NCCL asks for
    /// device offload of this connection; a host-only plugin ignores it.
    /// `ctx` is the context from `init`.
    pub connect: Option<ConnectFn>,
    /// Receiver side: completes a connection on `listen_comm`. Must not
    /// block: success with `*recv_comm == NULL` means "the sender has not
    /// connected yet", and NCCL calls again. `recv_dev_comm` as in `connect`.
    pub accept: Option<
        unsafe extern "C" fn(
            listen_comm: *mut c_void,
            recv_comm: *mut *mut c_void,
            recv_dev_comm: *mut *mut DeviceHandleV12,
        ) -> NcclResult,
    >,
    /// Registers `size` bytes at `data` for use on `comm` (a send or a
    /// receive comm); `ty` is `NCCL_PTR_HOST` or `NCCL_PTR_CUDA`. The handle
    /// written to `*mhandle` comes back with every transfer on that buffer.
    pub reg_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// As `reg_mr`, for GPU memory exported as the dma-buf `fd` at `offset`.
    /// Used instead of `reg_mr` when `ptr_support` has `NCCL_PTR_DMABUF`;
    /// may be NULL otherwise.
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Releases a handle from `reg_mr` or `reg_mr_dma_buf`.
    pub dereg_mr:
        Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult>,
    /// Starts sending `size` bytes. Must not block: success with
    /// `*request == NULL` means "cannot start now", and NCCL retries later.
    /// `tag` picks the buffer of the peer's multi-receive. `phandle` is
    /// NCCL's profiler handle for this transfer, to pass to the profiler
    /// callback when reporting network-defined events.
    pub isend: Option<IsendFn>,
    /// Posts `n` receive buffers (at most `max_recvs`) under one request.
    /// Must not block; `*request == NULL` means "retry later". A buffer may
    /// be larger than what is sent into it, never smaller. `phandles`: one
    /// profiler handle per buffer, as for `isend`.
    pub irecv: Option<IrecvFn>,
    /// After a receive into GPU memory completes, makes the data visible to
    /// the GPU. `*request == NULL` on success: nothing to wait for.
    pub iflush: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Polls a request: sets `*done`; when done, writes the bytes moved into
    /// `sizes` (one per buffer of a multi-receive) unless it is NULL, and
    /// the request is freed: NCCL never tests it again.
    pub test: Option<
        unsafe extern "C" fn(
            request: *mut c_void,
            done: *mut c_int,
            sizes: *mut c_int,
        ) -> NcclResult,
    >,
    /// Closes a comm returned by `connect`.
    pub close_send: Option<unsafe extern "C" fn(send_comm: *mut c_void) -> NcclResult>,
    /// Closes a comm returned by `accept`.
    pub close_recv: Option<unsafe extern "C" fn(recv_comm: *mut c_void) -> NcclResult>,
    /// Closes a comm returned by `listen`.
    pub close_listen: Option<unsafe extern "C" fn(listen_comm: *mut c_void) -> NcclResult>,
    /// Device offload only (NULL otherwise): writes into `*dptr_mhandle` a
    /// form of `mhandle` the plugin's device code can use.
    pub get_device_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            mhandle: *mut c_void,
            dptr_mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Device offload only (NULL otherwise): the GPU has consumed the data
    /// of a completed receive request.
    pub irecv_consumed: Option<
        unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> NcclResult,
    >,
    /// Fuses the physical devices listed in `props` into a virtual NIC and
    /// writes its index into `*d`. NULL when the plugin cannot fuse NICs.
    pub make_vdevice:
        Option<unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV12) -> NcclResult>,
    /// Releases a context from `init`, once its communicator is done with
    /// the network.
    pub finalize: Option<unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult>,
    /// Hints about the operations NCCL is about to run on `ctx` (flows,
    /// peers, algorithm); the plugin may ignore them. May be NULL.
    pub set_net_attr:
        Option<unsafe extern "C" fn(ctx: *mut c_void, net_attr: *mut NetAttrV12) -> NcclResult>,
}

/// `ncclNetSGE_v12_t`: one piece of a scattered collnet buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SgeV12 {
    pub mhandle: *mut c_void,
    pub address: *mut c_void,
    pub size: usize,
}

/// `ncclCollNet_v12_t`: a network that reduces in the fabric (SHARP-style),
/// exported beside `ncclNetPlugin_v12`; see [`super::collnet`] for how NCCL
/// and oxccl drive it. Compared with v11: v12's properties.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV12 {
    /// Name, for logs.
    pub name: *const c_char,
    /// Called for every communicator (`comm_id`), writing a context into
    /// `*ctx`; an error disables collnet.
    pub init: Option<
        unsafe extern "C" fn(
            ctx: *mut *mut c_void,
            comm_id: u64,
            log_function: Logger,
        ) -> NcclResult,
    >,
    /// Devices able to run collectives; with zero, every other field may be
    /// NULL.
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    /// Fills the properties of device `dev`.
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV12) -> NcclResult>,
    /// Opens a listening comm and writes this rank's handle (up to
    /// `NCCL_NET_HANDLE_MAXSIZE` bytes), gathered by NCCL from all ranks.
    pub listen: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listen_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Builds the group of `nranks` from every rank's handle; `rank` is the
    /// caller's place in it.
    pub connect: Option<
        unsafe extern "C" fn(
            handles: *mut *mut c_void,
            nranks: c_int,
            rank: c_int,
            listen_comm: *mut c_void,
            coll_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Writes 1 into `*supported` when the network can reduce `data_type`
    /// with `red_op`, else 0.
    pub reduce_support: Option<
        unsafe extern "C" fn(
            data_type: DataType,
            red_op: RedOp,
            supported: *mut c_int,
        ) -> NcclResult,
    >,
    /// Registers memory for the group (`ty`: `NCCL_PTR_HOST`/`NCCL_PTR_CUDA`).
    pub reg_mr: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Registers dma-buf memory; may be NULL without `NCCL_PTR_DMABUF`.
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Releases a registration.
    pub dereg_mr:
        Option<unsafe extern "C" fn(coll_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult>,
    /// Starts an all-reduce of `count` elements. Must not block;
    /// `*request == NULL` means "retry later".
    pub iallreduce: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            send_data: *mut c_void,
            recv_data: *mut c_void,
            count: usize,
            data_type: DataType,
            red_op: RedOp,
            send_mhandle: *mut c_void,
            recv_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Starts an all-gather into scattered receive pieces; the window
    /// (`window_offset`, `window_bytes`) selects the part of the
    /// `bytes_per_rank`-strided result this call covers.
    pub iallgather: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            send_data: *mut c_void,
            n_recv_parts: c_int,
            recv_parts: *mut SgeV12,
            bytes_per_rank: usize,
            window_offset: usize,
            window_bytes: usize,
            send_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Starts a reduce-scatter from scattered send pieces; window as in
    /// `iallgather`.
    #[allow(
        clippy::type_complexity,
        reason = "the C signature, kept in place like every other slot"
    )]
    pub ireducescatter: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            n_send_parts: c_int,
            send_parts: *mut SgeV12,
            recv_data: *mut c_void,
            bytes_per_rank: usize,
            window_offset: usize,
            window_bytes: usize,
            data_type: DataType,
            red_op: RedOp,
            recv_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Makes data received into GPU memory visible to the GPU.
    pub iflush: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            data: *mut c_void,
            size: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Polls a request; when done, `*size` (unless NULL) gets the bytes moved.
    pub test: Option<
        unsafe extern "C" fn(
            request: *mut c_void,
            done: *mut c_int,
            size: *mut c_int,
        ) -> NcclResult,
    >,
    /// Closes the group comm.
    pub close_coll: Option<unsafe extern "C" fn(coll_comm: *mut c_void) -> NcclResult>,
    /// Closes the listening comm.
    pub close_listen: Option<unsafe extern "C" fn(listen_comm: *mut c_void) -> NcclResult>,
    /// Fuses the physical devices listed in `props` into a virtual NIC and
    /// writes its index into `*d`.
    pub make_vdevice:
        Option<unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV12) -> NcclResult>,
    /// Releases a context from `init`.
    pub finalize: Option<unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult>,
}

// SAFETY: every method calls the entry of the same name with its arguments.
unsafe impl Abi for NetV12 {
    abi_common!(12);
    as_newest!(init, listen, connect, accept, reg_mr, isend, irecv, finalize);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        call!(self.get_properties, dev, props)
    }
}

#[cfg(test)]
mod tests {
    use super::super::assert_layout;
    use super::*;

    #[test]
    fn layouts() {
        assert_layout!(VDevicePropsV12, 36, 4, ndevs @ 0, devs @ 4);
        assert_layout!(CommConfigV12, 4, 4, traffic_class @ 0);
        assert_layout!(PropertiesV12, 128, 8, name @ 0, pci_path @ 8, guid @ 16,
            ptr_support @ 24, reg_is_global @ 28, force_flush @ 32, speed @ 36, port @ 40,
            latency @ 44, max_comms @ 48, max_recvs @ 52, net_device_type @ 56,
            net_device_version @ 60, vprops @ 64, max_p2p_bytes @ 104, max_coll_bytes @ 112,
            max_multi_request_size @ 120, rail_id @ 124, plane_id @ 126);
        assert_layout!(CommAttrV12, 16, 4, max_concurrent_peers @ 0, min_concurrent_peers @ 4,
            max_flows_per_peer @ 8, min_flows_per_peer @ 12);
        assert_layout!(NetAttrV12, 44, 4, send_comm_attr @ 0, recv_comm_attr @ 16, op @ 32,
            algo @ 36, proto @ 40);
        assert_layout!(NetV12, 176, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128, get_device_mr @ 136, irecv_consumed @ 144,
            make_vdevice @ 152, finalize @ 160, set_net_attr @ 168);
        assert_layout!(SgeV12, 24, 8, mhandle @ 0, address @ 8, size @ 16);
        assert_layout!(CollNetV12, 152, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iallgather @ 88,
            ireducescatter @ 96, iflush @ 104, test @ 112, close_coll @ 120,
            close_listen @ 128, make_vdevice @ 136, finalize @ 144);
    }
}
