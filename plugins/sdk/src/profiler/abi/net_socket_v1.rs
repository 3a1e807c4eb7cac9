//! Version 1 of the events NCCL's socket net plugin reports through the
//! profiler callback (`net_socket_v1.h`): the `data` of a `netPlugin` event
//! whose id is `NCCL_PROFILER_NET_TYPE_SOCK | NET_SOCKET_VER`. Frozen.

use std::os::raw::c_int;

/// `NCCL_PROFILER_NET_SOCKET_VER`: the version part of the plugin id.
pub const NET_SOCKET_VER: u32 = 1;

/// `ncclProfileSocket`: `ty` of a socket operation.
pub const NCCL_PROFILE_SOCKET: u8 = 1 << 0;

/// `ncclProfilerNetSockDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetSockDescrV1 {
    /// Which member of `detail` is valid ([`NCCL_PROFILE_SOCKET`]).
    pub ty: u8,
    /// The per-type part (an anonymous union in C).
    pub detail: NetSockDetailV1,
}

/// The union of `ncclProfilerNetSockDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union NetSockDetailV1 {
    pub sock: NetSockOpDescrV1,
}

/// One socket send or receive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetSockOpDescrV1 {
    /// The socket.
    pub fd: c_int,
    /// The operation (the plugin's own send/receive code).
    pub op: c_int,
    /// Bytes moved.
    pub length: usize,
}

#[cfg(test)]
mod tests {
    use crate::ffi::assert_layout;

    use super::*;

    // Every size, alignment and offset below was measured from NCCL's headers
    // (2.30.7; 2.28.9 gives the same for the versions it has) by a C++
    // program printing sizeof/alignof/offsetof, built with g++ 12 on x86_64
    // Linux. A nested path (`detail.coll.func`) is the offset from the start
    // of the outer struct, as offsetof gives it for an anonymous union.

    /// `ncclProfilerNetSockDescr_v1_t`.
    #[test]
    fn net_sock_descr_v1_layout() {
        assert_layout!(NetSockDescrV1, 24, 8, ty @ 0, detail.sock @ 8, detail.sock.fd @ 8,
            detail.sock.op @ 12, detail.sock.length @ 16);
    }
}
