//! libibverbs, opened at run time: the only module of this crate that calls
//! into C, and the only one with `unsafe`.
//!
//! Why `dlopen` and not the `ibverbs` crate: that crate builds a vendored
//! rdma-core (cmake, libnl) at compile time, and links it, so a machine with
//! no libibverbs could not even load this plugin. NCCL opens
//! `libibverbs.so.1` at run time for the same reason; so do we. A missing
//! library is an error value (the network then has 0 devices), never a
//! failure to load the plugin.
//!
//! Two kinds of entry points:
//! - functions libibverbs exports (`ibv_open_device`, `ibv_create_qp`, …),
//!   found with `dlsym`. `dlsym` returns a symbol's default version, which for
//!   the calls below is `IBVERBS_1.1` (the one taking the current structs) —
//!   the version NCCL asks for explicitly. `ibv_query_port` is an inline
//!   wrapper in rdma-core's `verbs.h` (it tries the extended context first),
//!   but the exported `ibv_query_port@@IBVERBS_1.1` takes a
//!   `_compat_ibv_port_attr`, a prefix of `ibv_port_attr` that ends after
//!   `link_layer`/`flags`: everything we read. We pass the full struct, zeroed.
//! - the data-path calls `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq`,
//!   which `verbs.h` defines as `static inline` functions calling through
//!   the provider's table `qp->context->ops` (resp. `cq->context->ops`): they
//!   have no symbol. We do what the inline code does: read the context
//!   pointer (first field of `ibv_qp` and `ibv_cq`), then the function
//!   pointer at its fixed slot of `struct ibv_context_ops` (slot 11 for
//!   `poll_cq`, 25 for `post_send`, 26 for `post_recv`; the table sits right
//!   after `ibv_context.device`). These slots are part of rdma-core's stable
//!   ABI (the inline functions are compiled into every verbs application).
//!
//! Struct layouts follow rdma-core's `verbs.h` (as NCCL's `ibvcore.h`), with
//! size checks below for the ones we allocate.

#![allow(unsafe_code, reason = "the FFI to libibverbs lives here and only here")]

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::{null_mut, NonNull};
use std::sync::OnceLock;

/// The library NCCL opens (rdma-core's soname since its first release).
pub const LIBIBVERBS: &str = "libibverbs.so.1";

pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
pub const IBV_WR_RDMA_READ: c_int = 4;
pub const IBV_SEND_SIGNALED: c_int = 1 << 1;

pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_WITH_IMM: c_int = 1 << 1;

/// `union ibv_gid` (8-aligned in C: the union has a `uint64_t` view).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_int,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (rdma-core's current one; the compat prefix is
/// what `ibv_query_port@IBVERBS_1.1` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub active_speed_ex: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` as rdma-core lays it out (128 bytes: the trailing
/// union of `bind_mw`/`tso` included, which NCCL's copy omits; providers
/// only read it for those opcodes, but we allocate the full size anyway).
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_int,
    /// Network byte order.
    pub imm_data: u32,
    /// `wr.rdma` (remote_addr, rkey) in the first 12 bytes of the union.
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: u32,
    _bind_or_tso: [u64; 6],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_int,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// The first fields of `struct ibv_qp`.
#[repr(C)]
struct IbvQpHead {
    context: *mut IbvContextHead,
    qp_context: *mut c_void,
    pd: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    handle: u32,
    qp_num: u32,
}

/// The first field of `struct ibv_cq`.
#[repr(C)]
struct IbvCqHead {
    context: *mut IbvContextHead,
}

type PollCqFn = unsafe extern "C" fn(*mut c_void, c_int, *mut IbvWc) -> c_int;
type PostSendFn = unsafe extern "C" fn(*mut c_void, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PostRecvFn = unsafe extern "C" fn(*mut c_void, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

const OPS_POLL_CQ: usize = 11;
const OPS_POST_SEND: usize = 25;
const OPS_POST_RECV: usize = 26;

/// `struct ibv_context` up to the end of the ops table slots we use: the
/// device pointer, then `struct ibv_context_ops`, an array of function
/// pointers (and, in rdma-core, `_compat_` placeholders of the same size).
#[repr(C)]
struct IbvContextHead {
    device: *mut c_void,
    ops: [*const c_void; OPS_POST_RECV + 1],
}

// Sizes and offsets checked against rdma-core 44's verbs.h with a C program
// (`sizeof`/`offsetof`); `ibv_port_attr` is 52 bytes there and 56 in newer
// rdma-core (`active_speed_ex`): we allocate the larger.
const _: () = {
    assert!(std::mem::size_of::<IbvDeviceAttr>() == 232);
    assert!(std::mem::size_of::<IbvPortAttr>() == 56);
    assert!(std::mem::size_of::<IbvQpAttr>() == 144);
    assert!(std::mem::size_of::<IbvAhAttr>() == 32);
    assert!(std::mem::size_of::<IbvSendWr>() == 128);
    assert!(std::mem::size_of::<IbvRecvWr>() == 32);
    assert!(std::mem::size_of::<IbvWc>() == 48);
    assert!(std::mem::size_of::<IbvQpInitAttr>() == 64);
    assert!(std::mem::offset_of!(IbvSendWr, remote_addr) == 40);
    assert!(std::mem::offset_of!(IbvQpHead, qp_num) == 52);
    assert!(std::mem::offset_of!(IbvContextHead, ops) == 8);
};

macro_rules! verbs_fns {
    (
        required {
            $($field:ident : fn($($arg:ty),*) -> $ret:ty;)*
        }
        optional {
            $($ofield:ident : fn($($oarg:ty),*) -> $oret:ty;)*
        }
    ) => {
        /// The exported entry points of libibverbs, resolved once; the
        /// optional ones are `None` in an rdma-core too old to have them.
        pub struct Verbs {
            _lib: libloading::Library,
            $($field: unsafe extern "C" fn($($arg),*) -> $ret,)*
            $($ofield: Option<unsafe extern "C" fn($($oarg),*) -> $oret>,)*
        }

        impl Verbs {
            fn load(soname: &str) -> Result<Verbs, String> {
                // SAFETY: loading libibverbs runs its constructors, which
                // only register providers; NCCL loads it the same way.
                let lib = unsafe { libloading::Library::new(soname) }
                    .map_err(|e| format!("{soname} not found ({e})"))?;
                Ok(Verbs {
                    $($field: {
                        let name = concat!(stringify!($field), "\0");
                        // SAFETY: the type is the C prototype of the symbol
                        // in rdma-core's verbs.h (default version IBVERBS_1.1).
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(name.as_bytes())
                        }
                        .map_err(|e| format!("{soname} lacks {}: {e}", stringify!($field)))?;
                        *s
                    },)*
                    $($ofield: {
                        let name = concat!(stringify!($ofield), "\0");
                        // SAFETY: as above, for the symbol's prototype in verbs.h.
                        unsafe {
                            lib.get::<unsafe extern "C" fn($($oarg),*) -> $oret>(name.as_bytes())
                        }
                        .ok()
                        .map(|s| *s)
                    },)*
                    _lib: lib,
                })
            }
        }
    };
}

verbs_fns! {
    required {
    ibv_get_device_list: fn(*mut c_int) -> *mut *mut c_void;
    ibv_free_device_list: fn(*mut *mut c_void) -> ();
    ibv_get_device_name: fn(*mut c_void) -> *const c_char;
    ibv_open_device: fn(*mut c_void) -> *mut c_void;
    ibv_close_device: fn(*mut c_void) -> c_int;
    ibv_query_device: fn(*mut c_void, *mut IbvDeviceAttr) -> c_int;
    ibv_query_port: fn(*mut c_void, u8, *mut IbvPortAttr) -> c_int;
    ibv_query_gid: fn(*mut c_void, u8, c_int, *mut IbvGid) -> c_int;
    ibv_alloc_pd: fn(*mut c_void) -> *mut c_void;
    ibv_dealloc_pd: fn(*mut c_void) -> c_int;
    ibv_reg_mr: fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr;
    ibv_dereg_mr: fn(*mut IbvMr) -> c_int;
    ibv_create_cq: fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
    ibv_destroy_cq: fn(*mut c_void) -> c_int;
    ibv_create_qp: fn(*mut c_void, *mut IbvQpInitAttr) -> *mut c_void;
    ibv_modify_qp: fn(*mut c_void, *mut IbvQpAttr, c_int) -> c_int;
    ibv_destroy_qp: fn(*mut c_void) -> c_int;
    ibv_wc_status_str: fn(c_int) -> *const c_char;
    }
    optional {
        // IBVERBS_1.12 (rdma-core 34, 2021): GPU memory exported by the
        // driver as a dma-buf, registered without a peer-memory module.
        ibv_reg_dmabuf_mr: fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut IbvMr;
    }
}

/// libibverbs, loaded on first use; the error says why it is unusable.
pub fn verbs() -> Result<&'static Verbs, String> {
    static V: OnceLock<Result<Verbs, String>> = OnceLock::new();
    V.get_or_init(|| Verbs::load(LIBIBVERBS))
        .as_ref()
        .map_err(Clone::clone)
}

/// `errno` after a failed verbs call (they set it, as NCCL's wrappers read).
fn last_os_error() -> String {
    std::io::Error::last_os_error().to_string()
}

/// A device found by `ibv_get_device_list`, opened.
pub struct Context {
    v: &'static Verbs,
    ptr: NonNull<c_void>,
    pub name: String,
}

// SAFETY: libibverbs contexts and the objects made from them may be used
// from any thread (rdma-core documents verbs as thread-safe); we never hand
// out the pointer itself.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only allows thread-safe verbs calls.
unsafe impl Sync for Context {}

impl Verbs {
    /// Opens every device libibverbs lists (a device that fails to open is
    /// reported and skipped, as NCCL does).
    pub fn open_all(&'static self) -> (Vec<Context>, Vec<String>) {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { (self.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            return (
                Vec::new(),
                vec![format!("ibv_get_device_list: {}", last_os_error())],
            );
        }
        let (mut ok, mut failed) = (Vec::new(), Vec::new());
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is a listed device; the name is a C string it owns.
            let name = unsafe { CStr::from_ptr((self.ibv_get_device_name)(dev)) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: as above; the context outlives the list (verbs.h allows
            // freeing the list once the devices one needs are open).
            let ctx = unsafe { (self.ibv_open_device)(dev) };
            match NonNull::new(ctx) {
                Some(ptr) => ok.push(Context { v: self, ptr, name }),
                None => failed.push(format!("ibv_open_device({name}): {}", last_os_error())),
            }
        }
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (self.ibv_free_device_list)(list) };
        (ok, failed)
    }

    /// The text libibverbs gives a completion status.
    pub fn status_str(&self, status: c_int) -> String {
        // SAFETY: returns a static string for any value.
        let p = unsafe { (self.ibv_wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null static C string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Context {
    pub fn query_device(&self) -> Result<IbvDeviceAttr, String> {
        // SAFETY: an all-zero IbvDeviceAttr is valid (integers and arrays).
        let mut a: IbvDeviceAttr = unsafe { std::mem::zeroed() };
        // SAFETY: open context, valid out-pointer of the documented type.
        let r = unsafe { (self.v.ibv_query_device)(self.ptr.as_ptr(), &mut a) };
        if r != 0 {
            return Err(format!("ibv_query_device({}): error {r}", self.name));
        }
        Ok(a)
    }

    pub fn query_port(&self, port: u8) -> Result<IbvPortAttr, String> {
        let mut a = IbvPortAttr::default();
        // SAFETY: open context; `a` is at least the compat struct's size.
        let r = unsafe { (self.v.ibv_query_port)(self.ptr.as_ptr(), port, &mut a) };
        if r != 0 {
            return Err(format!("ibv_query_port({}:{port}): error {r}", self.name));
        }
        Ok(a)
    }

    pub fn query_gid(&self, port: u8, index: i32) -> Result<IbvGid, String> {
        let mut g = IbvGid::default();
        // SAFETY: open context, valid out-pointer.
        let r = unsafe { (self.v.ibv_query_gid)(self.ptr.as_ptr(), port, index, &mut g) };
        if r != 0 {
            return Err(format!(
                "ibv_query_gid({}:{port}, index {index}): error {r}",
                self.name
            ));
        }
        Ok(g)
    }

    pub fn alloc_pd(&self) -> Result<Pd, String> {
        // SAFETY: open context.
        let p = unsafe { (self.v.ibv_alloc_pd)(self.ptr.as_ptr()) };
        NonNull::new(p)
            .map(|ptr| Pd { v: self.v, ptr })
            .ok_or_else(|| format!("ibv_alloc_pd({}): {}", self.name, last_os_error()))
    }

    pub fn create_cq(&self, cqe: i32) -> Result<Cq, String> {
        // SAFETY: open context; no completion channel, vector 0.
        let p =
            unsafe { (self.v.ibv_create_cq)(self.ptr.as_ptr(), cqe, null_mut(), null_mut(), 0) };
        NonNull::new(p)
            .map(|ptr| Cq { v: self.v, ptr })
            .ok_or_else(|| format!("ibv_create_cq({}, {cqe}): {}", self.name, last_os_error()))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, closed once; its PDs (which
        // borrow it through `Arc`s held by their owners) are gone.
        unsafe { (self.v.ibv_close_device)(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd {
    v: &'static Verbs,
    ptr: NonNull<c_void>,
}

// SAFETY: see `Context`.
unsafe impl Send for Pd {}
// SAFETY: see `Context`.
unsafe impl Sync for Pd {}

impl Pd {
    /// Registers `len` bytes at `addr` for local writes and remote reads
    /// and writes (what both directions and the GPU flush need).
    ///
    /// Safe to call: the kernel checks the range (EFAULT when unmapped) and
    /// pins its pages for as long as the registration lives, so no Rust
    /// memory is touched here. What the NIC later does with the memory is
    /// governed by `post_send`/`post_recv`, which are unsafe.
    pub fn reg_mr(&self, addr: usize, len: usize) -> Result<Mr, String> {
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // SAFETY: live PD; the kernel validates and pins the range.
        let p = unsafe { (self.v.ibv_reg_mr)(self.ptr.as_ptr(), addr as *mut c_void, len, access) };
        NonNull::new(p)
            .map(|ptr| Mr { v: self.v, ptr })
            .ok_or_else(|| format!("ibv_reg_mr({addr:#x}, {len} bytes): {}", last_os_error()))
    }

    /// Registers `len` bytes of the dma-buf `fd` from `offset`, seen by the
    /// NIC at address `iova`, with the same access as `reg_mr`.
    ///
    /// Safe to call for the same reason as `reg_mr`: the kernel checks the
    /// file descriptor and the range and pins the pages.
    pub fn reg_dmabuf_mr(&self, offset: u64, len: usize, iova: u64, fd: i32) -> Result<Mr, String> {
        let f = self.v.ibv_reg_dmabuf_mr.ok_or_else(|| {
            format!("{LIBIBVERBS} lacks ibv_reg_dmabuf_mr (rdma-core older than 34)")
        })?;
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // SAFETY: live PD; the kernel validates the descriptor and the range.
        let p = unsafe { f(self.ptr.as_ptr(), offset, len, iova, fd, access) };
        NonNull::new(p)
            .map(|ptr| Mr { v: self.v, ptr })
            .ok_or_else(|| {
                format!(
                    "ibv_reg_dmabuf_mr(fd {fd}, offset {offset:#x}, {len} bytes at {iova:#x}): {}",
                    last_os_error()
                )
            })
    }

    /// Whether this device registers dma-bufs, asked as NCCL does: a
    /// registration of fd -1 fails with EBADF where the kernel and driver
    /// support dma-buf, with EOPNOTSUPP or EPROTONOSUPPORT where they do not.
    pub fn dmabuf_supported(&self) -> Result<(), String> {
        let Some(f) = self.v.ibv_reg_dmabuf_mr else {
            return Err(format!(
                "{LIBIBVERBS} lacks ibv_reg_dmabuf_mr (rdma-core older than 34)"
            ));
        };
        // SAFETY: live PD; fd -1 can register nothing.
        let p = unsafe { f(self.ptr.as_ptr(), 0, 0, 0, -1, 0) };
        let err = std::io::Error::last_os_error();
        if !p.is_null() {
            // Not expected of fd -1; release it rather than leak it.
            drop(Mr {
                v: self.v,
                ptr: NonNull::new(p).expect("checked non-null"),
            });
            return Ok(());
        }
        const EOPNOTSUPP: i32 = 95;
        const EPROTONOSUPPORT: i32 = 93;
        match err.raw_os_error() {
            Some(EOPNOTSUPP | EPROTONOSUPPORT) => Err(format!(
                "the kernel or NIC driver refuses dma-buf registration ({err})"
            )),
            _ => Ok(()),
        }
    }

    /// Creates an RC queue pair whose sends and receives complete on `cq`.
    pub fn create_qp(&self, cq: &Cq, max_wr: u32) -> Result<Qp, String> {
        let mut attr = IbvQpInitAttr {
            qp_context: null_mut(),
            send_cq: cq.ptr.as_ptr(),
            recv_cq: cq.ptr.as_ptr(),
            srq: null_mut(),
            cap: IbvQpCap {
                max_send_wr: max_wr,
                max_recv_wr: max_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ of the same context; valid attributes.
        let p = unsafe { (self.v.ibv_create_qp)(self.ptr.as_ptr(), &mut attr) };
        NonNull::new(p)
            .map(|ptr| Qp { v: self.v, ptr })
            .ok_or_else(|| format!("ibv_create_qp: {}", last_os_error()))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once, after its MRs and QPs.
        unsafe { (self.v.ibv_dealloc_pd)(self.ptr.as_ptr()) };
    }
}

/// A memory registration.
pub struct Mr {
    v: &'static Verbs,
    ptr: NonNull<IbvMr>,
}

// SAFETY: see `Context`.
unsafe impl Send for Mr {}
// SAFETY: see `Context`.
unsafe impl Sync for Mr {}

impl Mr {
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live ibv_mr; lkey is set at registration and never changes.
        unsafe { self.ptr.as_ref() }.lkey
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { self.ptr.as_ref() }.rkey
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        unsafe { (self.v.ibv_dereg_mr)(self.ptr.as_ptr()) };
    }
}

/// A completion queue.
pub struct Cq {
    v: &'static Verbs,
    ptr: NonNull<c_void>,
}

// SAFETY: see `Context`; polling is serialized by its owner's mutex.
unsafe impl Send for Cq {}

impl Cq {
    /// `ibv_poll_cq`: fills `wc` with up to `wc.len()` completions.
    pub fn poll(&self, wc: &mut [IbvWc]) -> Result<usize, String> {
        // SAFETY: `ptr` is a live ibv_cq, whose first field is its context;
        // slot OPS_POLL_CQ of the context's ops table is `poll_cq`, exactly
        // what verbs.h's inline ibv_poll_cq calls.
        let n = unsafe {
            let ctx = (*(self.ptr.as_ptr() as *const IbvCqHead)).context;
            let f: PollCqFn = std::mem::transmute((*ctx).ops[OPS_POLL_CQ]);
            f(self.ptr.as_ptr(), wc.len() as c_int, wc.as_mut_ptr())
        };
        if n < 0 {
            return Err(format!("ibv_poll_cq: error {n}"));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once, after its QPs
        // (owners drop QPs first).
        unsafe { (self.v.ibv_destroy_cq)(self.ptr.as_ptr()) };
    }
}

/// A queue pair.
pub struct Qp {
    v: &'static Verbs,
    ptr: NonNull<c_void>,
}

// SAFETY: see `Context`.
unsafe impl Send for Qp {}

impl Qp {
    pub fn num(&self) -> u32 {
        // SAFETY: a live ibv_qp; qp_num is fixed at creation.
        unsafe { (*(self.ptr.as_ptr() as *const IbvQpHead)).qp_num }
    }

    pub fn modify(&self, attr: &mut IbvQpAttr, mask: c_int) -> Result<(), String> {
        // SAFETY: live QP, valid attributes for `mask`.
        let r = unsafe { (self.v.ibv_modify_qp)(self.ptr.as_ptr(), attr, mask) };
        if r != 0 {
            return Err(format!(
                "ibv_modify_qp to state {} failed: {}",
                attr.qp_state,
                std::io::Error::from_raw_os_error(r)
            ));
        }
        Ok(())
    }

    fn ops(&self, slot: usize) -> *const c_void {
        // SAFETY: a live ibv_qp's first field is its context, whose ops
        // table has this slot (see the module comment).
        unsafe { (*(*(self.ptr.as_ptr() as *const IbvQpHead)).context).ops[slot] }
    }

    /// `ibv_post_send` of one work request.
    ///
    /// # Safety
    /// The memory `wr`'s scatter list names must be registered and stay
    /// valid until the work request completes.
    pub unsafe fn post_send(&self, wr: &mut IbvSendWr) -> Result<(), String> {
        let mut bad = null_mut();
        // SAFETY: post_send's slot holds that function (verbs.h's inline
        // ibv_post_send calls it the same way); the caller keeps the data.
        let r = unsafe {
            let f: PostSendFn = std::mem::transmute(self.ops(OPS_POST_SEND));
            f(self.ptr.as_ptr(), wr, &mut bad)
        };
        if r != 0 {
            return Err(format!(
                "ibv_post_send: {}",
                std::io::Error::from_raw_os_error(r)
            ));
        }
        Ok(())
    }

    /// `ibv_post_recv` of one work request.
    ///
    /// # Safety
    /// As for `post_send`.
    pub unsafe fn post_recv(&self, wr: &mut IbvRecvWr) -> Result<(), String> {
        let mut bad = null_mut();
        // SAFETY: as in post_send, slot of post_recv.
        let r = unsafe {
            let f: PostRecvFn = std::mem::transmute(self.ops(OPS_POST_RECV));
            f(self.ptr.as_ptr(), wr, &mut bad)
        };
        if r != 0 {
            return Err(format!(
                "ibv_post_recv: {}",
                std::io::Error::from_raw_os_error(r)
            ));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once.
        unsafe { (self.v.ibv_destroy_qp)(self.ptr.as_ptr()) };
    }
}

impl IbvSendWr {
    pub fn new(wr_id: u64, sge: *mut IbvSge, num_sge: i32, opcode: c_int) -> IbvSendWr {
        IbvSendWr {
            wr_id,
            next: null_mut(),
            sg_list: sge,
            num_sge,
            opcode,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _qp_type: 0,
            _bind_or_tso: [0; 6],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_that_names_it() {
        let e = Verbs::load("libibverbs-absent.so.1").err().expect("absent");
        assert!(e.starts_with("libibverbs-absent.so.1 not found"), "{e}");
        // A library that lacks the verbs is refused by name too.
        if let Err(e) = Verbs::load("libc.so.6") {
            assert!(e.contains("lacks ibv_get_device_list"), "{e}");
        }
    }
}
