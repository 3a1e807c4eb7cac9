//! `ncclNet_v10_t` (NCCL 2.25 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file. Entries and fields mean what
//! v12's do ([`super::v12`]).
//!
//! Compared with v9: `init` also takes the profiler callback, `connect`
//! takes the communicator's config (its traffic class), and `isend`/`irecv`
//! carry profiler handles. Properties and virtual NICs are v9's. The plugin
//! is still initialised once per process.

use std::os::raw::{c_char, c_int, c_void};

use super::v12::{CommConfigV12, PropertiesV12};
use super::v9::{MakeVDevice4Fn, PropertiesV9};
use super::*;
use crate::ffi::types::{DataType, RedOp};
use crate::ffi::types::{Logger, NcclResult, ProfilerCallback};

/// Symbol of the network vtable ([`NetV10`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v10\0";

/// `ncclNetVDeviceProps_v10_t`, v9's.
pub type VDevicePropsV10 = super::v9::VDevicePropsV9;
/// `ncclNetProperties_v10_t`, v9's.
pub type PropertiesV10 = PropertiesV9;
/// `ncclNetCommConfig_v10_t`, the same as v12's (v10 passes it to `connect`).
pub type CommConfigV10 = CommConfigV12;

/// `ncclNet_v10_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init:
        Option<unsafe extern "C" fn(log_function: Logger, prof: ProfilerCallback) -> NcclResult>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV10) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            config: *mut CommConfigV10,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            send_dev_comm: *mut *mut DeviceHandle,
        ) -> NcclResult,
    >,
    pub accept: Option<AcceptFn>,
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub isend: Option<IsendFn>,
    pub irecv: Option<IrecvFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub close_send: Option<CloseFn>,
    pub close_recv: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_vdevice: Option<MakeVDevice4Fn>,
}

// SAFETY: every method calls the entry of the same name: properties
// converted, no context; `connect` gets a config with the traffic class
// unset (oxccl has no per-communicator traffic class to pass).
unsafe impl Abi for NetV10 {
    abi_common!(10);
    as_newest!(listen_no_ctx, accept, reg_mr, isend, irecv, no_finalize);
    unsafe fn init(
        &self,
        ctx: *mut *mut c_void,
        _comm_id: u64,
        _config: *mut CommConfigV12,
        log: Logger,
        prof: ProfilerCallback,
    ) -> NcclResult {
        if !ctx.is_null() {
            // SAFETY: a non-NULL out-pointer (the caller's contract).
            unsafe { *ctx = std::ptr::null_mut() };
        }
        call!(self.init, log, prof)
    }
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, super::v9::up) }
    }
    unsafe fn connect(
        &self,
        _ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        send_comm: *mut *mut c_void,
        send_dev_comm: *mut *mut DeviceHandle,
    ) -> NcclResult {
        let mut config = CommConfigV10 {
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        call!(
            self.connect,
            dev,
            &mut config,
            handle,
            send_comm,
            send_dev_comm
        )
    }
}

unsafe extern "C" fn init<N: Newest>(log: Logger, prof: ProfilerCallback) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { init_once::<N>(10, log, prof) }
}

unsafe extern "C" fn get_properties<N: Newest>(
    dev: c_int,
    props: *mut PropertiesV10,
) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { props_via(N::VT.get_properties, dev, props, super::v9::down) }
}

/// `connect` through the newest: the config is dropped, since v11 and
/// later take it once, at `init` (which ran with none).
unsafe extern "C" fn connect<N: Newest>(
    dev: c_int,
    _config: *mut CommConfigV10,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut DeviceHandle,
) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { connect_no_ctx::<N>(dev, handle, send_comm, send_dev_comm) }
}

/// `N`'s vtable as `ncclNet_v10_t`.
pub const fn exported<N: Newest>() -> NetV10 {
    let v: v12::NetV12 = N::VT;
    NetV10 {
        name: v.name,
        init: Some(init::<N>),
        devices: v.devices,
        get_properties: Some(get_properties::<N>),
        listen: Some(listen_no_ctx::<N>),
        connect: Some(connect::<N>),
        accept: v.accept,
        reg_mr: v.reg_mr,
        reg_mr_dma_buf: v.reg_mr_dma_buf,
        dereg_mr: v.dereg_mr,
        isend: v.isend,
        irecv: v.irecv,
        iflush: v.iflush,
        test: v.test,
        close_send: v.close_send,
        close_recv: v.close_recv,
        close_listen: v.close_listen,
        get_device_mr: v.get_device_mr,
        irecv_consumed: v.irecv_consumed,
        make_vdevice: super::v9::make_vdevice_of::<N>(),
    }
}

// `ncclCollNet_v10_t`, exported beside `ncclNetPlugin_v10`. Compared
// with the version before: as v9, with v10's properties.

/// `ncclNetSGE_v10_t`.
pub type SgeV10 = super::v9::SgeV9;

/// Symbol of the collective-network vtable ([`CollNetV10`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v10\0";

/// `ncclCollNet_v10_t`. Entries mean what v12's do ([`super::v12::CollNetV12`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV10 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV10) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<collnet::CollConnectFn>,
    pub reduce_support: Option<collnet::ReduceSupportFn>,
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub iallreduce: Option<collnet::IallreduceFn>,
    pub iallgather: Option<
        unsafe extern "C" fn(
            coll_comm: *mut c_void,
            send_data: *mut c_void,
            n_recv_parts: c_int,
            recv_parts: *mut SgeV10,
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
            send_parts: *mut SgeV10,
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
    pub make_vdevice: Option<super::v9::MakeVDevice4Fn>,
}

// SAFETY: every method calls the entry of the same name, with sizes and
// properties converted as for this version's `ncclNet_v10_t`.
unsafe impl collnet::CollAbi for CollNetV10 {
    collnet::coll_common!(10);
    collnet::coll_no_ctx!();
    collnet::coll_reg_mr!();
    collnet::coll_iallreduce!(size);
    collnet::coll_gathers!(SgeV10, sge_same);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, super::v9::up) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_layout!(NetV10, 160, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128, get_device_mr @ 136, irecv_consumed @ 144,
            make_vdevice @ 152);
        assert_layout!(CollNetV10, 144, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iallgather @ 88,
            ireducescatter @ 96, iflush @ 104, test @ 112, close_coll @ 120, close_listen @ 128,
            make_vdevice @ 136);
    }
}
