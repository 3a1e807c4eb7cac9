//! `ncclNet_v8_t` (NCCL 2.19 onwards; loaded by NCCL 2.28 and 2.30). Frozen:
//! a later version gets a file of its own.

use std::os::raw::{c_char, c_int, c_void};

use super::Logger;

/// Exported symbol NCCL looks up.
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v8\0";

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV8 {
    /// For logs; must stay valid while the plugin is loaded.
    pub name: *mut c_char,
    /// sysfs path of the PCI device (topology detection).
    pub pci_path: *mut c_char,
    /// NIC identity: ports of one NIC share it.
    pub guid: u64,
    /// NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF.
    pub ptr_support: c_int,
    /// Registrations valid on every comm of the device.
    pub reg_is_global: c_int,
    /// Mbit/s.
    pub speed: c_int,
    pub port: c_int,
    /// Microseconds.
    pub latency: f32,
    pub max_comms: c_int,
    /// Buffers one `irecv` may carry.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`: 0 = host only, no device offload.
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetDeviceHandle_v8_t`, only passed through (we offer no offload).
#[repr(C)]
#[derive(Debug)]
pub struct DeviceHandleV8 {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

type R = i32;

/// `ncclNet_v8_t`. Every call returns at once; "not yet" is success with a
/// NULL out-pointer, and NCCL calls again.
#[repr(C)]
pub struct NetV8 {
    pub name: *const c_char,
    /// Called once with NCCL's logger before anything else.
    pub init: Option<unsafe extern "C" fn(logger: Logger) -> R>,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> R>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV8) -> R>,
    /// Writes up to 128 handle bytes for the peer and a listening comm.
    pub listen: Option<
        unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> R,
    >,
    /// Must not block: success with `*send_comm == NULL` means "call again".
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            dev_comm: *mut *mut DeviceHandleV8,
        ) -> R,
    >,
    /// Must not block: success with `*recv_comm == NULL` means "call again".
    pub accept: Option<
        unsafe extern "C" fn(
            listen_comm: *mut c_void,
            recv_comm: *mut *mut c_void,
            dev_comm: *mut *mut DeviceHandleV8,
        ) -> R,
    >,
    /// `comm` is a send or a receive comm; `type` a NCCL_PTR_* value.
    pub reg_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            mhandle: *mut *mut c_void,
        ) -> R,
    >,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> R,
    >,
    pub dereg_mr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> R>,
    /// `*request == NULL` on success means "no resources now, call again".
    pub isend: Option<
        unsafe extern "C" fn(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: c_int,
            tag: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> R,
    >,
    /// `n` buffers (at most the device's `maxRecvs`).
    pub irecv: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> R,
    >,
    /// Makes GPU-direct receives visible to the GPU; NULL request: nothing to wait for.
    pub iflush: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> R,
    >,
    /// Sets `*done`; when done, `sizes` (if not NULL) gets the bytes moved and the request is freed.
    pub test: Option<
        unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> R,
    >,
    pub close_send: Option<unsafe extern "C" fn(send_comm: *mut c_void) -> R>,
    pub close_recv: Option<unsafe extern "C" fn(recv_comm: *mut c_void) -> R>,
    pub close_listen: Option<unsafe extern "C" fn(listen_comm: *mut c_void) -> R>,
    /// Device offload only; NULL when the plugin offers none.
    pub get_device_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            mhandle: *mut c_void,
            dptr_mhandle: *mut *mut c_void,
        ) -> R,
    >,
    /// Device offload only; NULL when the plugin offers none.
    pub irecv_consumed:
        Option<unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> R>,
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// Sizes and offsets measured from NCCL's net_v8.h with offsetof on x86_64.
    #[test]
    fn layout_matches_nccl() {
        assert_eq!(size_of::<PropertiesV8>(), 64);
        assert_eq!(offset_of!(PropertiesV8, guid), 16);
        assert_eq!(offset_of!(PropertiesV8, ptr_support), 24);
        assert_eq!(offset_of!(PropertiesV8, latency), 40);
        assert_eq!(offset_of!(PropertiesV8, max_recvs), 48);
        assert_eq!(offset_of!(PropertiesV8, net_device_type), 52);
        assert_eq!(offset_of!(PropertiesV8, net_device_version), 56);
        assert_eq!(size_of::<NetV8>(), 152);
        assert_eq!(offset_of!(NetV8, init), 8);
        assert_eq!(offset_of!(NetV8, reg_mr_dma_buf), 64);
        assert_eq!(offset_of!(NetV8, isend), 80);
        assert_eq!(offset_of!(NetV8, test), 104);
        assert_eq!(offset_of!(NetV8, close_listen), 128);
        assert_eq!(offset_of!(NetV8, irecv_consumed), 144);
    }
}
