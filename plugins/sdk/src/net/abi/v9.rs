//! `ncclNet_v9_t` (NCCL 2.24 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file. Entries and fields mean what
//! v12's do ([`super::v12`]).
//!
//! Compared with v8: send and receive sizes become `size_t`; properties
//! gain `forceFlush`, the devices fused into a virtual NIC (up to 4),
//! `maxP2pBytes` and `maxCollBytes`; `makeVDevice` fuses NICs. The plugin
//! is still initialised once per process, with the logger only.

use std::os::raw::{c_char, c_int, c_void};

use super::v12::{PropertiesV12, VDevicePropsV12};
use super::*;
use crate::ffi::types::Logger;
use crate::ffi::types::NcclResult;
use crate::ffi::types::{DataType, RedOp};

/// Symbol of the network vtable ([`NetV9`]).
pub const SYMBOL: &[u8] = b"ncclNetPlugin_v9\0";

/// `NCCL_NET_MAX_DEVS_PER_NIC` of v9 to v11.
pub const MAX_DEVS_PER_NIC_V9: usize = 4;

/// `ncclNetVDeviceProps_v9_t` (v10's and v11's are the same).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevicePropsV9 {
    pub ndevs: c_int,
    pub devs: [c_int; MAX_DEVS_PER_NIC_V9],
}

impl VDevicePropsV9 {
    /// The newest's (room for 8 devices).
    pub fn up(&self) -> VDevicePropsV12 {
        let mut devs = [0; v12::MAX_DEVS_PER_NIC_V12];
        devs[..MAX_DEVS_PER_NIC_V9].copy_from_slice(&self.devs);
        VDevicePropsV12 {
            ndevs: self.ndevs.clamp(0, MAX_DEVS_PER_NIC_V9 as c_int),
            devs,
        }
    }

    /// The newest's first 4 devices.
    pub fn down(p: &VDevicePropsV12) -> Self {
        let mut devs = [0; MAX_DEVS_PER_NIC_V9];
        devs.copy_from_slice(&p.devs[..MAX_DEVS_PER_NIC_V9]);
        VDevicePropsV9 {
            ndevs: p.ndevs.clamp(0, MAX_DEVS_PER_NIC_V9 as c_int),
            devs,
        }
    }
}

/// `ncclNetProperties_v9_t` (v10's is the same).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV9 {
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
    pub vprops: VDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNet_v9_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV9) -> NcclResult>,
    pub listen: Option<ListenNoCtxFn>,
    pub connect: Option<ConnectNoCtxFn>,
    pub accept: Option<AcceptFn>,
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub isend: Option<
        unsafe extern "C" fn(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub close_send: Option<CloseFn>,
    pub close_recv: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_vdevice: Option<MakeVDevice4Fn>,
}

/// `makeVDevice` of v9 to v11 (up to 4 devices).
pub type MakeVDevice4Fn =
    unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV9) -> NcclResult;

/// v9's (and v10's) properties in the newest shape (NCCL's `net_v9.cc`).
pub fn up(p: &PropertiesV9) -> PropertiesV12 {
    props!(p => PropertiesV12 {
        reg_is_global: p.reg_is_global,
        force_flush: p.force_flush,
        net_device_type: p.net_device_type,
        net_device_version: p.net_device_version,
        vprops: p.vprops.up(),
        max_p2p_bytes: p.max_p2p_bytes,
        max_coll_bytes: p.max_coll_bytes,
        max_multi_request_size: 1,
        rail_id: NCCL_NET_ID_UNDEF,
        plane_id: NCCL_NET_ID_UNDEF,
    })
}

/// The newest properties as v9's.
pub fn down(p: &PropertiesV12) -> PropertiesV9 {
    props!(p => PropertiesV9 {
        reg_is_global: p.reg_is_global,
        force_flush: p.force_flush,
        net_device_type: p.net_device_type,
        net_device_version: p.net_device_version,
        vprops: VDevicePropsV9::down(&p.vprops),
        max_p2p_bytes: p.max_p2p_bytes,
        max_coll_bytes: p.max_coll_bytes,
    })
}

// SAFETY: every method calls the entry of the same name, with the
// properties converted and the context, config and profiler handles
// (which v9 lacks) left out.
unsafe impl Abi for NetV9 {
    abi_common!(9);
    as_newest!(
        init_log,
        listen_no_ctx,
        connect_no_ctx,
        accept,
        reg_mr,
        no_finalize
    );
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        // SAFETY: forwarded.
        unsafe { props_via(self.get_properties, dev, props, up) }
    }
    unsafe fn isend(
        &self,
        send_comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mhandle: *mut c_void,
        _phandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        call!(self.isend, send_comm, data, size, tag, mhandle, request)
    }
    unsafe fn irecv(
        &self,
        recv_comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        _phandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        call!(self.irecv, recv_comm, n, data, sizes, tags, mhandles, request)
    }
}

unsafe extern "C" fn get_properties<N: Newest>(dev: c_int, props: *mut PropertiesV9) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { props_via(N::VT.get_properties, dev, props, down) }
}

/// `makeVDevice` of v9 to v11 through the newest's: at most 4 devices, as
/// NCCL's safe cast the other way (`devs` ends the struct).
pub(crate) unsafe extern "C" fn make_vdevice<N: Newest>(
    d: *mut c_int,
    props: *mut VDevicePropsV9,
) -> NcclResult {
    if props.is_null() {
        return crate::ffi::types::NCCL_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; NCCL's struct.
    let mut p = unsafe { &*props }.up();
    call!(N::VT.make_vdevice, d, &mut p)
}

/// `makeVDevice` for a 4-device version if `N` has one.
pub(crate) const fn make_vdevice_of<N: Newest>() -> Option<MakeVDevice4Fn> {
    if N::VT.make_vdevice.is_some() {
        Some(make_vdevice::<N>)
    } else {
        None
    }
}

/// `N`'s vtable as `ncclNet_v9_t`.
pub const fn exported<N: Newest>() -> NetV9 {
    let v: v12::NetV12 = N::VT;
    NetV9 {
        name: v.name,
        init: Some(init_log::<N, 9>),
        devices: v.devices,
        get_properties: Some(get_properties::<N>),
        listen: Some(listen_no_ctx::<N>),
        connect: Some(connect_no_ctx::<N>),
        accept: v.accept,
        reg_mr: v.reg_mr,
        reg_mr_dma_buf: v.reg_mr_dma_buf,
        dereg_mr: v.dereg_mr,
        isend: Some(isend_no_phandle::<N>),
        irecv: Some(irecv_no_phandle::<N>),
        iflush: v.iflush,
        test: v.test,
        close_send: v.close_send,
        close_recv: v.close_recv,
        close_listen: v.close_listen,
        get_device_mr: v.get_device_mr,
        irecv_consumed: v.irecv_consumed,
        make_vdevice: make_vdevice_of::<N>(),
    }
}

// `ncclCollNet_v9_t`, exported beside `ncclNetPlugin_v9`. Compared
// with the version before: the `iallreduce` count and the piece sizes
// become `size_t`; `makeVDevice` appears.

/// `ncclNetSGE_v9_t` (v10's and v11's are the same).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SgeV9 {
    pub mhandle: *mut c_void,
    pub address: *mut c_void,
    pub size: usize,
}

/// Symbol of the collective-network vtable ([`CollNetV9`]).
pub const COLLNET_SYMBOL: &[u8] = b"ncclCollNetPlugin_v9\0";

/// `ncclCollNet_v9_t`. Entries mean what v12's do ([`super::v12::CollNetV12`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollNetV9 {
    pub name: *const c_char,
    pub init: Option<InitLogFn>,
    pub devices: Option<DevicesFn>,
    pub get_properties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV9) -> NcclResult>,
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
            recv_parts: *mut SgeV9,
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
            send_parts: *mut SgeV9,
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
// properties converted as for this version's `ncclNet_v9_t`.
unsafe impl collnet::CollAbi for CollNetV9 {
    collnet::coll_common!(9);
    collnet::coll_no_ctx!();
    collnet::coll_reg_mr!();
    collnet::coll_iallreduce!(size);
    collnet::coll_gathers!(SgeV9, sge_same);
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
        assert_layout!(VDevicePropsV9, 20, 4, ndevs @ 0, devs @ 4);
        assert_layout!(PropertiesV9, 104, 8, name @ 0, pci_path @ 8, guid @ 16,
            ptr_support @ 24, reg_is_global @ 28, force_flush @ 32, speed @ 36, port @ 40,
            latency @ 44, max_comms @ 48, max_recvs @ 52, net_device_type @ 56,
            net_device_version @ 60, vprops @ 64, max_p2p_bytes @ 88, max_coll_bytes @ 96);
        assert_layout!(NetV9, 160, 8, name @ 0, init @ 8, devices @ 16, get_properties @ 24,
            listen @ 32, connect @ 40, accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64,
            dereg_mr @ 72, isend @ 80, irecv @ 88, iflush @ 96, test @ 104, close_send @ 112,
            close_recv @ 120, close_listen @ 128, get_device_mr @ 136, irecv_consumed @ 144,
            make_vdevice @ 152);
        assert_layout!(CollNetV9, 144, 8, name @ 0, init @ 8, devices @ 16,
            get_properties @ 24, listen @ 32, connect @ 40, reduce_support @ 48, reg_mr @ 56,
            reg_mr_dma_buf @ 64, dereg_mr @ 72, iallreduce @ 80, iallgather @ 88,
            ireducescatter @ 96, iflush @ 104, test @ 112, close_coll @ 120, close_listen @ 128,
            make_vdevice @ 136);
        assert_layout!(SgeV9, 24, 8, mhandle @ 0, address @ 8, size @ 16);
    }
}
