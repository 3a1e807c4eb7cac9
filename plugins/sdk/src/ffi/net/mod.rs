//! NCCL's network plugin ABI, `ncclNet_vN_t` (and `ncclCollNet_vN_t`), one
//! frozen file per version as NCCL keeps `net_v8.h` … `net_v12.h`.
//!
//! A library exports a vtable under [`v10::SYMBOL`] (`ncclNetPlugin_v10`) and
//! so on; a loader looks up the newest symbol it knows and steps down. NCCL
//! 2.28 loads v6 to v11, NCCL 2.30 adds v12.
//!
//! The contract common to every version:
//! - every call returns at once: "not yet" is success with a NULL out-pointer
//!   (`connect`, `accept`, `isend`, `irecv`) and NCCL calls again;
//! - connections are one-way: `listen` on the receiver gives a handle of up
//!   to [`NCCL_NET_HANDLE_MAXSIZE`] bytes that NCCL carries to the sender,
//!   which `connect`s with it; the receiver then `accept`s;
//! - sends and receives on one connection match in the order they were
//!   posted; tags only pick a buffer within one multi-receive;
//! - each send or receive comm holds up to [`NCCL_NET_MAX_REQUESTS`] requests
//!   in flight (times `max_recvs` on the send side).

use std::os::raw::{c_int, c_void};

pub mod v10;
pub mod v11;
pub mod v12;
pub mod v8;
pub mod v9;

/// `NCCL_NET_HANDLE_MAXSIZE`: bytes NCCL reserves for the handle `listen`
/// writes and the peer's `connect` reads.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;

/// `ptrSupport` bit and `type` of `regMr`: host memory.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `ptrSupport` bit and `type` of `regMr`: GPU memory (GPUDirect RDMA).
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `ptrSupport` bit: GPU memory registered through a dma-buf fd
/// (`regMrDmaBuf`).
pub const NCCL_PTR_DMABUF: c_int = 0x4;

/// `NCCL_NET_MAX_REQUESTS`: requests one comm must hold in flight.
pub const NCCL_NET_MAX_REQUESTS: usize = 32;

/// Value NCCL may put in `*request` before `irecv` (LL and LL128 protocols):
/// NCCL detects completion from flags in the data itself, so the plugin may
/// complete such a request early. It must still return a real request.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// `NCCL_NET_MULTI_REQUEST`: a request flag defined next to
/// [`NCCL_NET_OPTIONAL_RECV_COMPLETION`]; NCCL's core (2.28 to 2.30) does
/// not pass it yet. Kept so that the value is never reused.
pub const NCCL_NET_MULTI_REQUEST: usize = 0x2;

/// `NCCL_NET_ID_UNDEF`: `railId`/`planeId` (net v12) when unknown.
pub const NCCL_NET_ID_UNDEF: i16 = -1;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`: `trafficClass` left to the plugin.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// `NCCL_NET_ATTR_UNDEF`: a net attribute (v11 and later) NCCL leaves unset.
pub const NCCL_NET_ATTR_UNDEF: i32 = -1;

/// `MAX_NET_SIZE`: the transfer limit NCCL assumes for plugins before v9
/// (which have no `maxP2pBytes`): 1 GiB, a power of two below `INT_MAX`.
pub const MAX_NET_SIZE: usize = 1024 * 1024 * 1024;
/// `MAX_COLLNET_SIZE`: the same for collnet plugins before v9 (512 MiB).
pub const MAX_COLLNET_SIZE: usize = 512 * 1024 * 1024;
/// `NCCL_MAX_NET_SIZE_BYTES`: the largest `maxP2pBytes`/`maxCollBytes` NCCL
/// accepts (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;

/// `ncclNetDeviceType`: what device-side (GPU-initiated) networking a NIC
/// offers. A host-only plugin reports [`NCCL_NET_DEVICE_HOST`].
pub type NetDeviceType = c_int;
/// Host-driven networking only (no offload).
pub const NCCL_NET_DEVICE_HOST: NetDeviceType = 0;
/// GPU kernels unpack received data (the TCPX/devmem-style offload).
pub const NCCL_NET_DEVICE_UNPACK: NetDeviceType = 1;
/// GPU-initiated networking through a proxy (NCCL 2.28 and later).
pub const NCCL_NET_DEVICE_GIN_PROXY: NetDeviceType = 2;
/// GPU-initiated networking, GDAKI backend.
pub const NCCL_NET_DEVICE_GIN_GDAKI: NetDeviceType = 3;
/// GPU-initiated networking, GPI backend (NCCL 2.30).
pub const NCCL_NET_DEVICE_GIN_GPI: NetDeviceType = 4;

/// `netDeviceVersion` meaning "no device offload".
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0x0;
/// The unpack offload version NCCL's device code implements; a plugin
/// reporting [`NCCL_NET_DEVICE_UNPACK`] must report exactly this.
pub const NCCL_NET_DEVICE_UNPACK_VERSION: c_int = 0x7;

/// `ncclNetDeviceHandle_v7_t`, unchanged since v7 (NCCL's `_v8_t` …
/// `_v12_t` are typedefs of it; each version file aliases it under its
/// own name). Describes a connection's device-side half when NCCL asked
/// `connect`/`accept` for offload.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceHandle {
    /// Kind of offload ([`NCCL_NET_DEVICE_HOST`] …).
    pub net_device_type: NetDeviceType,
    /// Must equal the version NCCL's device code was built with.
    pub net_device_version: c_int,
    /// Device-side state of the connection, `size` bytes, copied to the GPU.
    pub handle: *mut c_void,
    pub size: usize,
    /// Non-zero when the proxy thread must still call `test` to progress
    /// transfers of this connection.
    pub needs_proxy_progress: c_int,
}

#[cfg(test)]
mod symbol_tests {
    use std::ffi::CStr;

    /// The names NCCL's loader looks up with dlsym (src/plugin/net/net_vN.cc).
    #[test]
    fn symbols_are_the_names_nccl_looks_up() {
        let all: [(&[u8], &str); 10] = [
            (super::v8::SYMBOL, "ncclNetPlugin_v8"),
            (super::v9::SYMBOL, "ncclNetPlugin_v9"),
            (super::v10::SYMBOL, "ncclNetPlugin_v10"),
            (super::v11::SYMBOL, "ncclNetPlugin_v11"),
            (super::v12::SYMBOL, "ncclNetPlugin_v12"),
            (super::v8::COLLNET_SYMBOL, "ncclCollNetPlugin_v8"),
            (super::v9::COLLNET_SYMBOL, "ncclCollNetPlugin_v9"),
            (super::v10::COLLNET_SYMBOL, "ncclCollNetPlugin_v10"),
            (super::v11::COLLNET_SYMBOL, "ncclCollNetPlugin_v11"),
            (super::v12::COLLNET_SYMBOL, "ncclCollNetPlugin_v12"),
        ];
        for (sym, name) in all {
            assert_eq!(CStr::from_bytes_with_nul(sym).unwrap().to_str(), Ok(name));
        }
    }

    /// `NCCL_NET_ATTR_INIT`: every field -1 (the unsigned ones as `(uint32_t)-1`).
    #[test]
    fn net_attr_undef_is_nccl_net_attr_init() {
        let a = super::v12::NetAttrV12::UNDEF;
        assert_eq!(
            a.send_comm_attr.max_concurrent_peers,
            super::NCCL_NET_ATTR_UNDEF
        );
        assert_eq!(
            a.recv_comm_attr.min_flows_per_peer,
            super::NCCL_NET_ATTR_UNDEF
        );
        assert_eq!(a.op, super::NCCL_NET_ATTR_UNDEF as u32);
        assert_eq!(a.proto, super::v11::NetAttrV11::UNDEF.proto);
    }
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

    /// `ncclNetDeviceHandle_v7_t`.
    #[test]
    fn device_handle_layout() {
        assert_eq!(size_of::<DeviceHandle>(), 32);
        assert_eq!(align_of::<DeviceHandle>(), 8);
        assert_eq!(offset_of!(DeviceHandle, net_device_type), 0);
        assert_eq!(offset_of!(DeviceHandle, net_device_version), 4);
        assert_eq!(offset_of!(DeviceHandle, handle), 8);
        assert_eq!(offset_of!(DeviceHandle, size), 16);
        assert_eq!(offset_of!(DeviceHandle, needs_proxy_progress), 24);
    }
}
