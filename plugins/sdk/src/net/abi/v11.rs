//! `ncclNet_v11_t` (NCCL 2.28 onwards; still loaded by 2.30). Frozen: a
//! change makes a new version file. Entries and fields mean what v12's do
//! ([`super::v12`]).
//!
//! Compared with v10: `init` takes a context out-pointer, the communicator
//! id and its config, once per communicator; `listen` and `connect` take
//! that context (the config left `connect`); properties gain
//! `maxMultiRequestSize`; `finalize` releases a context and `setNetAttr`
//! passes hints. v12 fuses 8 devices per virtual NIC instead of 4 and adds
//! the rail and plane to the properties.

use std::os::raw::{c_char, c_int, c_void};

use super::v12::{self, CommConfigV12, NetAttrV12, PropertiesV12};
use super::*;
use crate::ffi::types::{DataType, RedOp};
use crate::ffi::types::{Logger, NcclResult, ProfilerCallback};

/// Symbol of the network vtable ([`NetV11`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v11\0";

/// `ncclNetVDeviceProps_v11_t`: up to 4 devices, as v9's.
pub type VDevicePropsV11 = super::v9::VDevicePropsV9;
/// `ncclNetCommConfig_v11_t`, the same as v12's.
pub type CommConfigV11 = CommConfigV12;
/// `ncclNetAttr_v11_t`, the same as v12's.
pub type NetAttrV11 = NetAttrV12;

/// `ncclNetProperties_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
    pub vprops: VDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNet_v11_t`: v12's entries, with v11's properties and virtual NICs.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV11 {
    pub name: *const c_char,
    pub init: Option<InitFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV11) -> NcclResult>,
    pub listen: Option<ListenFn>,
    pub connect: Option<ConnectFn>,
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
    pub make_vdevice: Option<super::v9::MakeVDevice4Fn>,
    pub finalize: Option<CloseFn>,
    pub set_net_attr:
        Option<unsafe extern "C" fn(ctx: *mut c_void, net_attr: *mut NetAttrV11) -> NcclResult>,
}

/// v11's properties in the newest shape (NCCL's `net_v11.cc`: rail and
/// plane unknown).
pub fn up(p: &PropertiesV11) -> PropertiesV12 {
    props!(p => PropertiesV12 {
        reg_is_global: p.reg_is_global,
        force_flush: p.force_flush,
        net_device_type: p.net_device_type,
        net_device_version: p.net_device_version,
        vprops: p.vprops.up(),
        max_p2p_bytes: p.max_p2p_bytes,
        max_coll_bytes: p.max_coll_bytes,
        max_multi_request_size: p.max_multi_request_size,
        rail_id: NCCL_NET_ID_UNDEF,
        plane_id: NCCL_NET_ID_UNDEF,
    })
}

/// The newest properties as v11's.
pub fn down(p: &PropertiesV12) -> PropertiesV11 {
    props!(p => PropertiesV11 {
        reg_is_global: p.reg_is_global,
        force_flush: p.force_flush,
        net_device_type: p.net_device_type,
        net_device_version: p.net_device_version,
        vprops: VDevicePropsV11::down(&p.vprops),
        max_p2p_bytes: p.max_p2p_bytes,
        max_coll_bytes: p.max_coll_bytes,
        max_multi_request_size: p.max_multi_request_size,
    })
}

// SAFETY: every method calls the entry of the same name, converting the
// properties; the other arguments are v12's unchanged.
unsafe impl Abi for NetV11 {
    abi_common!(11);
    as_newest!(init, listen, connect, accept, reg_mr, isend, irecv, finalize);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, up) }
    }
}

unsafe extern "C" fn init<N: Newest>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut CommConfigV11,
    log: Logger,
    prof: ProfilerCallback,
) -> NcclResult {
    INIT_AS.store(11, std::sync::atomic::Ordering::Relaxed);
    call!(N::VT.init, ctx, comm_id, config, log, prof)
}

unsafe extern "C" fn get_properties<N: Newest>(
    dev: c_int,
    props: *mut PropertiesV11,
) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { props_via(N::VT.get_properties, dev, props, down) }
}

/// `N`'s vtable as `ncclNet_v11_t`.
pub const fn exported<N: Newest>() -> NetV11 {
    let v: v12::NetV12 = N::VT;
    NetV11 {
        name: v.name,
        init: Some(init::<N>),
        devices: v.devices,
        get_properties: Some(get_properties::<N>),
        listen: v.listen,
        connect: v.connect,
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
        finalize: v.finalize,
        set_net_attr: v.set_net_attr,
    }
}

// `ncclCollNet_v11_t`, exported beside `ncclNetPlugin_v11`. Compared
// with the version before: `init` makes a context per communicator
// (`commId`) that `listen` takes and `finalize` releases.

/// `ncclNetSGE_v11_t`.
pub type SgeV11 = super::v9::SgeV9;

/// Symbol of the collective-network vtable ([`CollNetV11`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v11\0";

/// `ncclCollNet_v11_t`. Entries mean what v12's do ([`super::v12::CollNetV12`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV11 {
    pub name: *const c_char,
    pub init: Option<collnet::CollInitFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV11) -> NcclResult>,
    pub listen: Option<ListenFn>,
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
            recv_parts: *mut SgeV11,
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
            send_parts: *mut SgeV11,
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
    pub finalize: Option<collnet::FinalizeFn>,
}

// SAFETY: every method calls the entry of the same name, with sizes and
// properties converted as for this version's `ncclNet_v11_t`.
unsafe impl collnet::CollAbi for CollNetV11 {
    collnet::coll_common!(11);
    collnet::coll_ctx!();
    collnet::coll_reg_mr!();
    collnet::coll_iallreduce!(size);
    collnet::coll_gathers!(SgeV11, sge_same);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, up) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_layout!(PropertiesV11, 112, 8, name @ 0, pci_path @ 8, guid @ 16,
            ptr_support @ 24, reg_is_global @ 28, force_flush @ 32, speed @ 36, port @ 40,
            latency @ 44, max_comms @ 48, max_recvs @ 52, net_device_type @ 56,
            net_device_version @ 60, vprops @ 64, max_p2p_bytes @ 88, max_coll_bytes @ 96,
            max_multi_request_size @ 104);
        assert_layout!(NetV11, 176, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128, get_device_mr @ 136, irecv_consumed @ 144,
            make_vdevice @ 152, finalize @ 160, set_net_attr @ 168);
        assert_layout!(CollNetV11, 152, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iallgather @ 88,
            ireducescatter @ 96, iflush @ 104, test @ 112, close_coll @ 120, close_listen @ 128,
            make_vdevice @ 136, finalize @ 144);
    }
}
