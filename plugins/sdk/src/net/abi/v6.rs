//! `ncclNet_v6_t` (NCCL 2.12 to 2.18; loaded by 2.28 and 2.30 for older
//! vendor plugins). Frozen: a change makes a new version file. Entries and
//! fields mean what v12's do ([`super::v12`]). oxccl loads it; it exports
//! v8 and later only.
//!
//! Compared with v7: no device offload: properties lack the device type
//! and version, `connect` and `accept` take no device handle, and there is
//! no `getDeviceMr` or `irecvConsumed`.

use std::os::raw::{c_char, c_int, c_void};

use super::v12::PropertiesV12;
use super::v7::RegMrIntFn;
use super::v8::{IrecvIntFn, IsendIntFn};
use super::*;
use crate::ffi::types::Logger;
use crate::ffi::types::NcclResult;
use crate::ffi::types::{DataType, RedOp};

/// Symbol of the network vtable ([`NetV6`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v6\0";

/// `ncclNetProperties_v6_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNet_v6_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV6 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV6) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> NcclResult,
    >,
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
}

/// v6's properties in the newest shape (NCCL's `net_v6.cc`: host-only).
pub fn up(p: &PropertiesV6, dev: c_int) -> PropertiesV12 {
    let mut devs = [0; v12::MAX_DEVS_PER_NIC_V12];
    devs[0] = dev;
    props!(p => PropertiesV12 {
        reg_is_global: 0,
        force_flush: 0,
        net_device_type: NCCL_NET_DEVICE_HOST,
        net_device_version: NCCL_NET_DEVICE_INVALID_VERSION,
        vprops: v12::VDevicePropsV12 { ndevs: 1, devs },
        max_p2p_bytes: MAX_NET_SIZE,
        max_coll_bytes: MAX_COLLNET_SIZE,
        max_multi_request_size: 1,
        rail_id: NCCL_NET_ID_UNDEF,
        plane_id: NCCL_NET_ID_UNDEF,
    })
}

// SAFETY: every method calls the entry of the same name with properties
// and sizes converted and the device handles (which v6 lacks) left out, as
// NCCL's net_v6.cc does.
unsafe impl Abi for NetV6 {
    fn version(&self) -> u32 {
        6
    }
    fn name(&self) -> *const c_char {
        self.name
    }
    fn null_entries(&self) -> Vec<&'static str> {
        null_entries!(self)
    }
    fn same(&self) -> Same {
        Same {
            devices: self.devices,
            reg_mr_dma_buf: self.reg_mr_dma_buf,
            dereg_mr: self.dereg_mr,
            iflush: self.iflush,
            test: self.test,
            close_send: self.close_send,
            close_recv: self.close_recv,
            close_listen: self.close_listen,
            get_device_mr: None,
            irecv_consumed: None,
        }
    }
    as_newest!(
        init_log,
        listen_no_ctx,
        reg_mr_int,
        isend_int,
        irecv_int,
        no_finalize
    );
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, |p| up(p, dev)) }
    }
    unsafe fn connect(
        &self,
        _ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        send_comm: *mut *mut c_void,
        _send_dev_comm: *mut *mut DeviceHandle,
    ) -> NcclResult {
        call!(self.connect, dev, handle, send_comm)
    }
    unsafe fn accept(
        &self,
        listen_comm: *mut c_void,
        recv_comm: *mut *mut c_void,
        _recv_dev_comm: *mut *mut DeviceHandle,
    ) -> NcclResult {
        call!(self.accept, listen_comm, recv_comm)
    }
}

// `ncclCollNet_v6_t`, exported beside `ncclNetPlugin_v6`: the oldest
// collnet oxccl loads. `regMr` sizes and the `iallreduce` count are `int`;
// no all-gather or reduce-scatter.

/// Symbol of the collective-network vtable ([`CollNetV6`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v6\0";

/// `ncclCollNet_v6_t`. Entries mean what v12's do ([`super::v12::CollNetV12`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV6 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV6) -> NcclResult>,
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
// properties converted as for this version's `ncclNet_v6_t`.
unsafe impl collnet::CollAbi for CollNetV6 {
    collnet::coll_common!(6);
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

    // Measured from NCCL 2.30.7's net_v6.h with gcc 12 on x86_64 (sizeof, offsetof).
    #[test]
    fn layouts() {
        assert_layout!(PropertiesV6, 48, 8, name @ 0, pci_path @ 8, guid @ 16,
            ptr_support @ 24, speed @ 28, port @ 32, latency @ 36, max_comms @ 40,
            max_recvs @ 44);
        assert_layout!(NetV6, 136, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128);
        assert_layout!(CollNetV6, 120, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iflush @ 88, test @ 96,
            close_coll @ 104, close_listen @ 112);
    }
}
