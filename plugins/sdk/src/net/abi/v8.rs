//! `ncclNet_v8_t` (NCCL 2.20 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file. Entries and fields mean what
//! v12's do ([`super::v12`]).
//!
//! Compared with v7: `regIsGlobal`, and `regMr` sizes become `size_t`;
//! send and receive sizes are still `int`. The plugin is initialised once
//! per process, with the logger only.

use std::os::raw::{c_char, c_int, c_void};

use super::v12::{PropertiesV12, SgeV12};
use super::*;
use crate::ffi::types::Logger;
use crate::ffi::types::NcclResult;
use crate::ffi::types::{DataType, RedOp};

/// Symbol of the network vtable ([`NetV8`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v8\0";

/// `ncclNetDeviceHandle_v8_t`.
pub type DeviceHandleV8 = DeviceHandle;

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
}

/// `isend` with an `int` size (v6 to v8).
pub type IsendIntFn = unsafe extern "C" fn(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `irecv` with `int` sizes (v6 to v8).
pub type IrecvIntFn = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;

/// `ncclNet_v8_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV8) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<ConnectNoCtxFn>,
    pub accept: Option<AcceptFn>,
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub isend: Option<IsendIntFn>,
    pub irecv: Option<IrecvIntFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub close_send: Option<CloseFn>,
    pub close_recv: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
}

/// v8's properties in the newest shape (NCCL's `net_v8.cc`: no forced
/// flush, the device alone in its virtual NIC, the size limits NCCL
/// assumes for plugins without them).
pub fn up(p: &PropertiesV8, dev: c_int) -> PropertiesV12 {
    let mut devs = [0; v12::MAX_DEVS_PER_NIC_V12];
    devs[0] = dev;
    props!(p => PropertiesV12 {
        reg_is_global: p.reg_is_global,
        force_flush: 0,
        net_device_type: p.net_device_type,
        net_device_version: p.net_device_version,
        vprops: v12::VDevicePropsV12 { ndevs: 1, devs },
        max_p2p_bytes: MAX_NET_SIZE,
        max_coll_bytes: MAX_COLLNET_SIZE,
        max_multi_request_size: 1,
        rail_id: NCCL_NET_ID_UNDEF,
        plane_id: NCCL_NET_ID_UNDEF,
    })
}

/// The newest properties as v8's.
pub fn down(p: &PropertiesV12) -> PropertiesV8 {
    props!(p => PropertiesV8 {
        reg_is_global: p.reg_is_global,
        net_device_type: p.net_device_type,
        net_device_version: p.net_device_version,
    })
}

// SAFETY: every method calls the entry of the same name, with properties
// and sizes converted (sizes above MAX_NET_SIZE refused, as NCCL's adapter
// does) and what v8 lacks left out.
unsafe impl Abi for NetV8 {
    abi_common!(8);
    as_newest!(
        init_log,
        listen_no_ctx,
        connect_no_ctx,
        accept,
        reg_mr,
        isend_int,
        irecv_int,
        no_finalize
    );
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, |p| up(p, dev)) }
    }
}

unsafe extern "C" fn get_properties<N: Newest>(dev: c_int, props: *mut PropertiesV8) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { props_via(N::VT.get_properties, dev, props, down) }
}

/// `isend` of v6 to v8 through the newest.
pub(crate) unsafe extern "C" fn isend<N: Newest>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let Ok(size) = usize::try_from(size) else {
        return crate::ffi::types::NCCL_INVALID_ARGUMENT;
    };
    // SAFETY: forwarded.
    unsafe { isend_no_phandle::<N>(send_comm, data, size, tag, mhandle, request) }
}

/// `irecv` of v6 to v8 through the newest.
pub(crate) unsafe extern "C" fn irecv<N: Newest>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let mut wide = [0usize; MAX_RECVS];
    let count = usize::try_from(n).unwrap_or(usize::MAX);
    if count > MAX_RECVS || sizes.is_null() {
        return crate::ffi::types::NCCL_INVALID_ARGUMENT;
    }
    for (i, w) in wide.iter_mut().enumerate().take(count) {
        // SAFETY: NCCL passes `n` sizes.
        let s = unsafe { *sizes.add(i) };
        let Ok(s) = usize::try_from(s) else {
            return crate::ffi::types::NCCL_INVALID_ARGUMENT;
        };
        *w = s;
    }
    let w = wide.as_mut_ptr();
    // SAFETY: forwarded, with the sizes widened.
    unsafe { irecv_no_phandle::<N>(recv_comm, n, data, w, tags, mhandles, request) }
}

/// `N`'s vtable as `ncclNet_v8_t`.
pub const fn exported<N: Newest>() -> NetV8 {
    let v: v12::NetV12 = N::VT;
    NetV8 {
        name: v.name,
        init: Some(init_log::<N, 8>),
        devices: v.devices,
        get_properties: Some(get_properties::<N>),
        listen: Some(listen_no_ctx::<N>),
        connect: Some(connect_no_ctx::<N>),
        accept: v.accept,
        reg_mr: v.reg_mr,
        reg_mr_dma_buf: v.reg_mr_dma_buf,
        dereg_mr: v.dereg_mr,
        isend: Some(isend::<N>),
        irecv: Some(irecv::<N>),
        iflush: v.iflush,
        test: v.test,
        close_send: v.close_send,
        close_recv: v.close_recv,
        close_listen: v.close_listen,
        get_device_mr: v.get_device_mr,
        irecv_consumed: v.irecv_consumed,
    }
}

// `ncclCollNet_v8_t`, exported beside `ncclNetPlugin_v8`. Compared
// with the version before: `regMr` sizes become `size_t` and
// `iallgather`/`ireducescatter` appear (pieces of `uint32_t` size); the
// `iallreduce` count is still `int`.

/// `ncclNetSGE_v8_t`: one piece of a scattered collnet buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SgeV8 {
    pub mhandle: *mut c_void,
    pub address: *mut c_void,
    pub size: u32,
}

/// Symbol of the collective-network vtable ([`CollNetV8`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v8\0";

/// `ncclCollNet_v8_t`. Entries mean what v12's do ([`super::v12::CollNetV12`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV8 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV8) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<collnet::CollConnectFn>,
    pub reduce_support: Option<collnet::ReduceSupportFn>,
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub iallreduce: Option<collnet::IallreduceIntFn>,
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
    pub iflush: Option<collnet::CollIflushFn>,
    pub test: Option<TestFn>,
    pub close_coll: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
}

// SAFETY: every method calls the entry of the same name, with sizes and
// properties converted as for this version's `ncclNet_v8_t`.
unsafe impl collnet::CollAbi for CollNetV8 {
    collnet::coll_common!(8);
    collnet::coll_no_ctx!();
    collnet::coll_reg_mr!();
    collnet::coll_iallreduce!(int);
    collnet::coll_gathers!(SgeV8, sge_u32);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, |p| up(p, dev)) }
    }
}

/// v12's piece as v8 carries it (`uint32_t` size); `None` where it does not fit.
impl collnet::From8 for SgeV8 {
    fn from_v12(p: &SgeV12) -> Option<Self> {
        Some(Self {
            mhandle: p.mhandle,
            address: p.address,
            size: u32::try_from(p.size).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_layout!(PropertiesV8, 64, 8, name @ 0, pci_path @ 8, guid @ 16,
            ptr_support @ 24, reg_is_global @ 28, speed @ 32, port @ 36, latency @ 40,
            max_comms @ 44, max_recvs @ 48, net_device_type @ 52, net_device_version @ 56);
        assert_layout!(NetV8, 152, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128, get_device_mr @ 136, irecv_consumed @ 144);
        assert_layout!(CollNetV8, 136, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iallgather @ 88,
            ireducescatter @ 96, iflush @ 104, test @ 112, close_coll @ 120, close_listen @ 128);
        assert_layout!(SgeV8, 24, 8, mhandle @ 0, address @ 8, size @ 16);
    }
}
