//! `ncclNet_v7_t` (NCCL 2.19; loaded by 2.28 and 2.30 for older vendor
//! plugins). Frozen: a change makes a new version file. Entries and fields
//! mean what v12's do ([`super::v12`]). oxccl loads it; it exports v8 and
//! later only.
//!
//! Compared with v8: no `regIsGlobal`, and `regMr` takes an `int` size.
//! Compared with v6: device offload (`netDeviceType`/`Version`, the
//! device handles of `connect`/`accept`, `getDeviceMr`, `irecvConsumed`).

use std::os::raw::{c_char, c_int, c_void};

use super::v12::PropertiesV12;
use super::v8::{IrecvIntFn, IsendIntFn};
use super::*;
use crate::ffi::types::Logger;
use crate::ffi::types::NcclResult;
use crate::ffi::types::{DataType, RedOp};

/// Symbol of the network vtable ([`NetV7`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v7\0";

/// `ncclNetProperties_v7_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
}

/// `regMr` with an `int` size (v6 and v7).
pub type RegMrIntFn = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    ty: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult;

/// `ncclNet_v7_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV7 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV7) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<ConnectNoCtxFn>,
    pub accept: Option<AcceptFn>,
    pub reg_mr: Option<RegMrIntFn>,
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

/// v7's properties in the newest shape (NCCL's `net_v7.cc`: registrations
/// not global, no forced flush, the device alone in its virtual NIC, the
/// size limits NCCL assumes for plugins without them).
pub fn up(p: &PropertiesV7, dev: c_int) -> PropertiesV12 {
    let mut devs = [0; v12::MAX_DEVS_PER_NIC_V12];
    devs[0] = dev;
    props!(p => PropertiesV12 {
        reg_is_global: 0,
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

// SAFETY: every method calls the entry of the same name with properties
// and sizes converted (as NCCL's net_v7.cc does) and what v7 lacks left out.
unsafe impl Abi for NetV7 {
    abi_common!(7);
    as_newest!(
        init_log,
        listen_no_ctx,
        connect_no_ctx,
        accept,
        reg_mr_int,
        isend_int,
        irecv_int,
        no_finalize
    );
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, |p| up(p, dev)) }
    }
}

// `ncclCollNet_v7_t`, exported beside `ncclNetPlugin_v7`. Compared
// with the version before: as v6, with v7's properties.

/// Symbol of the collective-network vtable ([`CollNetV7`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v7\0";

/// `ncclCollNet_v7_t`. Entries mean what v12's do ([`super::v12::CollNetV12`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV7 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV7) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<collnet::CollConnectFn>,
    pub reduce_support: Option<collnet::ReduceSupportFn>,
    pub reg_mr: Option<super::v7::RegMrIntFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub iallreduce: Option<collnet::IallreduceIntFn>,
    pub iflush: Option<collnet::CollIflushFn>,
    pub test: Option<TestFn>,
    pub close_coll: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
}

// SAFETY: every method calls the entry of the same name, with sizes and
// properties converted as for this version's `ncclNet_v7_t`.
unsafe impl collnet::CollAbi for CollNetV7 {
    collnet::coll_common!(7);
    collnet::coll_no_ctx!();
    unsafe fn reg_mr(
        &self,
        coll_comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        ty: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { reg_mr_int(self.reg_mr, coll_comm, data, size, ty, mhandle) }
    }
    collnet::coll_iallreduce!(int);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, |p| up(p, dev)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Measured from NCCL 2.30.7's net_v7.h with gcc 12 on x86_64 (sizeof, offsetof).
    #[test]
    fn layouts() {
        assert_layout!(PropertiesV7, 56, 8, name @ 0, pci_path @ 8, guid @ 16,
            ptr_support @ 24, speed @ 28, port @ 32, latency @ 36, max_comms @ 40,
            max_recvs @ 44, net_device_type @ 48, net_device_version @ 52);
        assert_layout!(NetV7, 152, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128, get_device_mr @ 136, irecv_consumed @ 144);
        assert_layout!(CollNetV7, 120, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iflush @ 88, test @ 96,
            close_coll @ 104, close_listen @ 112);
    }
}
