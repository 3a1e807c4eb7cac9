//! `ncclNet_v8_t` and `ncclCollNet_v8_t` (NCCL 2.20 onwards; still loaded by
//! 2.28 and 2.30). Frozen: a change makes a new version file.
//!
//! Compared with v7: `regIsGlobal`, `regMr` sizes become `size_t`, and
//! collnet gains all-gather and reduce-scatter; send and receive sizes are
//! still `int`. The plugin is initialised once per process.

use std::os::raw::{c_char, c_int, c_void};

use super::{DeviceHandle, NetDeviceType};
use crate::ffi::types::{DataType, Logger, NcclResult, RedOp};

/// Symbol of the network vtable ([`NetV8`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v8\0";
/// Symbol of the collective-network vtable ([`CollNetV8`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v8\0";

/// `ncclNetDeviceHandle_v8_t`.
pub type DeviceHandleV8 = DeviceHandle;

/// `ncclNetProperties_v8_t`, filled by `getProperties`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV8 {
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
}

/// `ncclNet_v8_t`: the point-to-point network.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV8 {
    /// Network name, used in logs and matched against `NCCL_NET`.
    pub name: *const c_char,
    /// Called once, before anything else, with NCCL's logger. An error makes
    /// NCCL ignore the plugin and fall back on its internal networks.
    pub init: Option<unsafe extern "C" fn(log_function: Logger) -> NcclResult>,
    /// Writes the number of devices; zero fails NCCL's init, so a plugin
    /// with no usable device should fail `init` instead.
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    /// Fills the properties of device `dev`.
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV8) -> NcclResult>,
    /// Receiver side: opens a listening comm on `dev` and writes into
    /// `handle` (NCCL's buffer of `NCCL_NET_HANDLE_MAXSIZE` bytes) what the
    /// sender needs to connect. Must not block; on success `*listen_comm` is
    /// never NULL.
    pub listen: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            listen_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Sender side: connects to the peer's `handle`. Must not block: success
    /// with `*send_comm == NULL` means "not yet", and NCCL calls again until
    /// it is set. When `*send_dev_comm` points to a handle, NCCL asks for
    /// device offload of this connection; a host-only plugin ignores it.
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            send_dev_comm: *mut *mut DeviceHandleV8,
        ) -> NcclResult,
    >,
    /// Receiver side: completes a connection on `listen_comm`. Must not
    /// block: success with `*recv_comm == NULL` means "the sender has not
    /// connected yet", and NCCL calls again. `recv_dev_comm` as in `connect`.
    pub accept: Option<
        unsafe extern "C" fn(
            listen_comm: *mut c_void,
            recv_comm: *mut *mut c_void,
            recv_dev_comm: *mut *mut DeviceHandleV8,
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
    /// `tag` picks the buffer of the peer's multi-receive.
    pub isend: Option<
        unsafe extern "C" fn(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: c_int,
            tag: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Posts `n` receive buffers (at most `max_recvs`) under one request.
    /// Must not block; `*request == NULL` means "retry later". A buffer may
    /// be larger than what is sent into it, never smaller.
    pub irecv: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
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
}

/// `ncclNetSGE_v8_t`: one piece of a scattered collnet buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SgeV8 {
    pub mhandle: *mut c_void,
    pub address: *mut c_void,
    pub size: u32,
}

/// `ncclCollNet_v8_t`: a network that reduces in the fabric (SHARP-style).
/// oxccl's loader only looks it up to refuse it by name.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV8 {
    /// Name, for logs.
    pub name: *const c_char,
    /// Called once with NCCL's logger; an error disables collnet.
    pub init: Option<unsafe extern "C" fn(log_function: Logger) -> NcclResult>,
    /// Devices able to run collectives; with zero, every other field may be
    /// NULL.
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    /// Fills the properties of device `dev`.
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV8) -> NcclResult>,
    /// Opens a listening comm and writes this rank's handle (up to
    /// `NCCL_NET_HANDLE_MAXSIZE` bytes), gathered by NCCL from all ranks.
    pub listen: Option<
        unsafe extern "C" fn(
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
            count: c_int,
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
            recv_parts: *mut SgeV8,
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
            send_parts: *mut SgeV8,
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
}

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    // Every size, alignment and offset below was measured from NCCL's headers
    // (2.30.7; 2.28.9 gives the same for the versions it has) by a C++
    // program printing sizeof/alignof/offsetof, built with g++ 12 on x86_64
    // Linux. A nested path (`detail.coll.func`) is the offset from the start
    // of the outer struct, as offsetof gives it for an anonymous union.

    /// `ncclNetProperties_v8_t`.
    #[test]
    fn properties_v8_layout() {
        assert_eq!(size_of::<PropertiesV8>(), 64);
        assert_eq!(align_of::<PropertiesV8>(), 8);
        assert_eq!(offset_of!(PropertiesV8, name), 0);
        assert_eq!(offset_of!(PropertiesV8, pci_path), 8);
        assert_eq!(offset_of!(PropertiesV8, guid), 16);
        assert_eq!(offset_of!(PropertiesV8, ptr_support), 24);
        assert_eq!(offset_of!(PropertiesV8, reg_is_global), 28);
        assert_eq!(offset_of!(PropertiesV8, speed), 32);
        assert_eq!(offset_of!(PropertiesV8, port), 36);
        assert_eq!(offset_of!(PropertiesV8, latency), 40);
        assert_eq!(offset_of!(PropertiesV8, max_comms), 44);
        assert_eq!(offset_of!(PropertiesV8, max_recvs), 48);
        assert_eq!(offset_of!(PropertiesV8, net_device_type), 52);
        assert_eq!(offset_of!(PropertiesV8, net_device_version), 56);
    }

    /// `ncclNet_v8_t`.
    #[test]
    fn net_v8_layout() {
        assert_eq!(size_of::<NetV8>(), 152);
        assert_eq!(align_of::<NetV8>(), 8);
        assert_eq!(offset_of!(NetV8, name), 0);
        assert_eq!(offset_of!(NetV8, init), 8);
        assert_eq!(offset_of!(NetV8, devices), 16);
        assert_eq!(offset_of!(NetV8, get_properties), 24);
        assert_eq!(offset_of!(NetV8, listen), 32);
        assert_eq!(offset_of!(NetV8, connect), 40);
        assert_eq!(offset_of!(NetV8, accept), 48);
        assert_eq!(offset_of!(NetV8, reg_mr), 56);
        assert_eq!(offset_of!(NetV8, reg_mr_dma_buf), 64);
        assert_eq!(offset_of!(NetV8, dereg_mr), 72);
        assert_eq!(offset_of!(NetV8, isend), 80);
        assert_eq!(offset_of!(NetV8, irecv), 88);
        assert_eq!(offset_of!(NetV8, iflush), 96);
        assert_eq!(offset_of!(NetV8, test), 104);
        assert_eq!(offset_of!(NetV8, close_send), 112);
        assert_eq!(offset_of!(NetV8, close_recv), 120);
        assert_eq!(offset_of!(NetV8, close_listen), 128);
        assert_eq!(offset_of!(NetV8, get_device_mr), 136);
        assert_eq!(offset_of!(NetV8, irecv_consumed), 144);
    }

    /// `ncclNetSGE_v8_t`.
    #[test]
    fn sge_v8_layout() {
        assert_eq!(size_of::<SgeV8>(), 24);
        assert_eq!(align_of::<SgeV8>(), 8);
        assert_eq!(offset_of!(SgeV8, mhandle), 0);
        assert_eq!(offset_of!(SgeV8, address), 8);
        assert_eq!(offset_of!(SgeV8, size), 16);
    }

    /// `ncclCollNet_v8_t`.
    #[test]
    fn coll_net_v8_layout() {
        assert_eq!(size_of::<CollNetV8>(), 136);
        assert_eq!(align_of::<CollNetV8>(), 8);
        assert_eq!(offset_of!(CollNetV8, name), 0);
        assert_eq!(offset_of!(CollNetV8, init), 8);
        assert_eq!(offset_of!(CollNetV8, devices), 16);
        assert_eq!(offset_of!(CollNetV8, get_properties), 24);
        assert_eq!(offset_of!(CollNetV8, listen), 32);
        assert_eq!(offset_of!(CollNetV8, connect), 40);
        assert_eq!(offset_of!(CollNetV8, reduce_support), 48);
        assert_eq!(offset_of!(CollNetV8, reg_mr), 56);
        assert_eq!(offset_of!(CollNetV8, reg_mr_dma_buf), 64);
        assert_eq!(offset_of!(CollNetV8, dereg_mr), 72);
        assert_eq!(offset_of!(CollNetV8, iallreduce), 80);
        assert_eq!(offset_of!(CollNetV8, iallgather), 88);
        assert_eq!(offset_of!(CollNetV8, ireducescatter), 96);
        assert_eq!(offset_of!(CollNetV8, iflush), 104);
        assert_eq!(offset_of!(CollNetV8, test), 112);
        assert_eq!(offset_of!(CollNetV8, close_coll), 120);
        assert_eq!(offset_of!(CollNetV8, close_listen), 128);
    }
}
