//! NCCL's collective-network ABI, `ncclCollNet_vN_t` (v6 to v12), beside
//! the point-to-point one: a network that reduces in the fabric
//! (SHARP-style). The frozen `#[repr(C)]` vtables live in the version files
//! next to each `ncclNet_vN_t` (`v6::CollNetV6` … `v12::CollNetV12`, whose
//! fields carry the contract); this module holds what every version shares:
//!
//! - the entry types that did not change between versions;
//! - [`CollAbi`], a library's vtable called in v12's shape (each version
//!   widens its `int` sizes and counts, converts its properties and leaves
//!   out the context it lacks), for the entries a loader uses;
//! - [`COLL_LOADABLE`], the symbols a loader looks up, newest first.
//!
//! The contract common to every version (NCCL's `coll_net.cc` is the
//! caller): a library exports `ncclCollNetPlugin_vN` next to its
//! `ncclNetPlugin_vN`; `devices` of zero disables it (every other entry may
//! then be NULL). Each rank that talks to the fabric `listen`s on a device
//! and writes a handle of up to [`super::NCCL_NET_HANDLE_MAXSIZE`] bytes;
//! the handles of all those ranks are gathered and each calls `connect`
//! with all of them, its own place given by `rank`: `connect` is collective
//! and returns one comm for the group. Then `iallreduce` (and from v8
//! `iallgather`/`ireducescatter`) start collectives across the group that
//! complete through `test`; they must not block, and success with
//! `*request == NULL` means "retry later".

use std::os::raw::{c_char, c_int, c_void};

use super::v12::{CollNetV12, PropertiesV12, SgeV12};
use crate::ffi::types::{DataType, Logger, NcclResult, RedOp};

/// `connect` of every version: the group of `nranks` from all handles.
pub type CollConnectFn = unsafe extern "C" fn(
    handles: *mut *mut c_void,
    nranks: c_int,
    rank: c_int,
    listen_comm: *mut c_void,
    coll_comm: *mut *mut c_void,
) -> NcclResult;
/// `reduceSupport` of every version.
pub type ReduceSupportFn =
    unsafe extern "C" fn(data_type: DataType, red_op: RedOp, supported: *mut c_int) -> NcclResult;
/// `iallreduce` with an `int` count (v6 to v8).
pub type IallreduceIntFn = unsafe extern "C" fn(
    coll_comm: *mut c_void,
    send_data: *mut c_void,
    recv_data: *mut c_void,
    count: c_int,
    data_type: DataType,
    red_op: RedOp,
    send_mhandle: *mut c_void,
    recv_mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `iallreduce` with a `size_t` count (v9 to v12).
pub type IallreduceFn = unsafe extern "C" fn(
    coll_comm: *mut c_void,
    send_data: *mut c_void,
    recv_data: *mut c_void,
    count: usize,
    data_type: DataType,
    red_op: RedOp,
    send_mhandle: *mut c_void,
    recv_mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `iflush` of every version (one buffer, an `int` size).
pub type CollIflushFn = unsafe extern "C" fn(
    coll_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `init` of v11 and v12 (a context per communicator, no config, no
/// profiler callback).
pub type CollInitFn =
    unsafe extern "C" fn(ctx: *mut *mut c_void, comm_id: u64, log_function: Logger) -> NcclResult;
/// `finalize` of v11 and v12.
pub type FinalizeFn = unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult;

/// A library's `ncclCollNet_vN_t` as a loader calls it: in v12's shape,
/// for the entries oxccl uses. The contract of each method is that of the
/// v12 entry of the same name ([`super::v12::CollNetV12`]).
///
/// # Safety
/// An implementation calls the vtable's entries with arguments converted
/// from those it was given, and nothing else.
pub unsafe trait CollAbi: 'static {
    /// N of `ncclCollNet_vN_t`.
    fn version(&self) -> u32;
    /// The vtable's `name` (a C string of the plugin, or NULL).
    fn name(&self) -> *const c_char;
    /// The entries a loader calls once `devices` reported some, by C name,
    /// that are NULL here.
    fn null_entries(&self) -> Vec<&'static str>;
    /// Whether `init` makes a context per communicator (v11 and later);
    /// before, `init` is once per process and `*ctx` stays NULL.
    fn has_context(&self) -> bool {
        self.version() >= 11
    }
    /// # Safety
    /// As `ncclCollNet_v12_t::init`.
    unsafe fn init(&self, ctx: *mut *mut c_void, comm_id: u64, log: Logger) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::devices`.
    unsafe fn devices(&self, ndev: *mut c_int) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::getProperties`.
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::listen`.
    unsafe fn listen(
        &self,
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        listen_comm: *mut *mut c_void,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::connect`.
    unsafe fn connect(
        &self,
        handles: *mut *mut c_void,
        nranks: c_int,
        rank: c_int,
        listen_comm: *mut c_void,
        coll_comm: *mut *mut c_void,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::reduceSupport`.
    unsafe fn reduce_support(
        &self,
        data_type: DataType,
        red_op: RedOp,
        supported: *mut c_int,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::regMr` (v6 and v7 refuse 2 GiB and more).
    unsafe fn reg_mr(
        &self,
        coll_comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        ty: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::deregMr`.
    unsafe fn dereg_mr(&self, coll_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::iallreduce` (v6 to v8 refuse a count an
    /// `int` cannot hold).
    #[allow(clippy::too_many_arguments, reason = "the C signature")]
    unsafe fn iallreduce(
        &self,
        coll_comm: *mut c_void,
        send_data: *mut c_void,
        recv_data: *mut c_void,
        count: usize,
        data_type: DataType,
        red_op: RedOp,
        send_mhandle: *mut c_void,
        recv_mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult;
    /// Whether `iallgather` and `ireducescatter` are there to call: v8 on,
    /// where the plugin left them non-NULL (v6 and v7 have neither).
    fn gathers(&self) -> (bool, bool) {
        (false, false)
    }
    /// Starts an all-gather: the group's result is `nranks *
    /// bytes_per_rank` bytes, member `r`'s block at `r * bytes_per_rank`;
    /// this call moves the window `[window_offset, window_offset +
    /// window_bytes)` of it into `recv_parts` (pieces, in order, whose sizes
    /// sum to `window_bytes`). `send_data` holds this member's part of the
    /// window: the window's overlap with its own block, from the overlap's
    /// start (or the block's start where they do not overlap), as NCCL's
    /// `coll_net.cc` passes it. Must not block; `*request == NULL` means
    /// "retry later".
    ///
    /// # Safety
    /// As `ncclCollNet_v12_t::iallgather` (v8 refuses a piece of 4 GiB or
    /// more).
    #[allow(clippy::too_many_arguments, reason = "the C signature")]
    unsafe fn iallgather(
        &self,
        coll_comm: *mut c_void,
        send_data: *mut c_void,
        n_recv_parts: c_int,
        recv_parts: *mut SgeV12,
        bytes_per_rank: usize,
        window_offset: usize,
        window_bytes: usize,
        send_mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        let _ = (
            coll_comm,
            send_data,
            n_recv_parts,
            recv_parts,
            bytes_per_rank,
            window_offset,
            window_bytes,
            send_mhandle,
            request,
        );
        super::NULL_ENTRY
    }
    /// Starts a reduce-scatter, the reverse of `iallgather`: `send_parts`
    /// hold the window `[window_offset, window_offset + window_bytes)` of
    /// this member's `nranks * bytes_per_rank`-byte input, and `recv_data`
    /// receives the reduced overlap of the window with this member's block
    /// (from the overlap's start, or the block's start where they do not
    /// overlap).
    ///
    /// # Safety
    /// As `ncclCollNet_v12_t::ireducescatter` (v8 refuses a piece of 4 GiB
    /// or more).
    #[allow(clippy::too_many_arguments, reason = "the C signature")]
    unsafe fn ireducescatter(
        &self,
        coll_comm: *mut c_void,
        n_send_parts: c_int,
        send_parts: *mut SgeV12,
        recv_data: *mut c_void,
        bytes_per_rank: usize,
        window_offset: usize,
        window_bytes: usize,
        data_type: DataType,
        red_op: RedOp,
        recv_mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        let _ = (
            coll_comm,
            n_send_parts,
            send_parts,
            recv_data,
            bytes_per_rank,
            window_offset,
            window_bytes,
            data_type,
            red_op,
            recv_mhandle,
            request,
        );
        super::NULL_ENTRY
    }
    /// # Safety
    /// As `ncclCollNet_v12_t::test`.
    unsafe fn test(&self, request: *mut c_void, done: *mut c_int, size: *mut c_int) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::closeColl`.
    unsafe fn close_coll(&self, coll_comm: *mut c_void) -> NcclResult;
    /// # Safety
    /// As `ncclCollNet_v12_t::closeListen`.
    unsafe fn close_listen(&self, listen_comm: *mut c_void) -> NcclResult;
    /// `finalize` of a context `init` made (v11+); success before v11.
    ///
    /// # Safety
    /// As `ncclCollNet_v12_t::finalize`.
    unsafe fn finalize(&self, ctx: *mut c_void) -> NcclResult;
}

/// One loadable collnet version.
pub type CollLoadable = super::Loadable<dyn CollAbi>;

/// Casts the address of a symbol to its vtable type.
///
/// # Safety
/// As [`super::Loadable::cast`].
unsafe fn cast<T: CollAbi>(p: *const c_void) -> &'static dyn CollAbi {
    // SAFETY: per the contract, `p` is a live `T`.
    unsafe { &*(p as *const T) }
}

/// [`COLL_LOADABLE`] from the one list of versions.
macro_rules! coll_loadable {
    ($([$n:literal, $sym:ident, $coll:ident, $m:ident, $ty:ident, $cty:ident,
        $export:ident, $nccl:literal])*) => {
        /// Every collnet version a loader can take, newest first (NCCL 2.31
        /// looks up the same names in the same order).
        pub const COLL_LOADABLE: &[CollLoadable] = &[$(
            CollLoadable {
                symbol: stringify!($coll),
                version: $n,
                cast: cast::<super::$m::$cty>,
            },
        )*];
    };
}
crate::net_versions!((coll_loadable));

/// `iallreduce` of v6 to v8 in the newest shape: a count above `INT_MAX`
/// is refused (the core splits collectives by `maxCollBytes`, which for
/// these versions is 512 MiB, so it never asks).
///
/// # Safety
/// As `iallreduce`'s caller.
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub(crate) unsafe fn iallreduce_int(
    f: Option<IallreduceIntFn>,
    coll_comm: *mut c_void,
    send_data: *mut c_void,
    recv_data: *mut c_void,
    count: usize,
    data_type: DataType,
    red_op: RedOp,
    send_mhandle: *mut c_void,
    recv_mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let Ok(count) = c_int::try_from(count) else {
        return crate::ffi::types::NCCL_INTERNAL_ERROR;
    };
    super::call!(
        f,
        coll_comm,
        send_data,
        recv_data,
        count,
        data_type,
        red_op,
        send_mhandle,
        recv_mhandle,
        request
    )
}

/// The [`CollAbi`] methods every version has with the same C types, and
/// the required-entry list (every version names them alike).
macro_rules! coll_common {
    ($v:literal) => {
        fn version(&self) -> u32 {
            $v
        }
        fn name(&self) -> *const c_char {
            self.name
        }
        fn null_entries(&self) -> Vec<&'static str> {
            [
                ("name", !self.name.is_null()),
                ("init", self.init.is_some()),
                ("devices", self.devices.is_some()),
                ("getProperties", self.get_properties.is_some()),
                ("listen", self.listen.is_some()),
                ("connect", self.connect.is_some()),
                ("reduceSupport", self.reduce_support.is_some()),
                ("regMr", self.reg_mr.is_some()),
                ("deregMr", self.dereg_mr.is_some()),
                ("iallreduce", self.iallreduce.is_some()),
                ("test", self.test.is_some()),
                ("closeColl", self.close_coll.is_some()),
                ("closeListen", self.close_listen.is_some()),
            ]
            .into_iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| n)
            .collect()
        }
        unsafe fn devices(&self, ndev: *mut c_int) -> NcclResult {
            $crate::net::abi::call!(self.devices, ndev)
        }
        unsafe fn connect(
            &self,
            handles: *mut *mut c_void,
            nranks: c_int,
            rank: c_int,
            listen_comm: *mut c_void,
            coll_comm: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.connect, handles, nranks, rank, listen_comm, coll_comm)
        }
        unsafe fn reduce_support(
            &self,
            data_type: DataType,
            red_op: RedOp,
            supported: *mut c_int,
        ) -> NcclResult {
            $crate::net::abi::call!(self.reduce_support, data_type, red_op, supported)
        }
        unsafe fn dereg_mr(&self, coll_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
            $crate::net::abi::call!(self.dereg_mr, coll_comm, mhandle)
        }
        unsafe fn test(
            &self,
            request: *mut c_void,
            done: *mut c_int,
            size: *mut c_int,
        ) -> NcclResult {
            $crate::net::abi::call!(self.test, request, done, size)
        }
        unsafe fn close_coll(&self, coll_comm: *mut c_void) -> NcclResult {
            $crate::net::abi::call!(self.close_coll, coll_comm)
        }
        unsafe fn close_listen(&self, listen_comm: *mut c_void) -> NcclResult {
            $crate::net::abi::call!(self.close_listen, listen_comm)
        }
    };
}
pub(crate) use coll_common;

/// `init`, `listen` and `finalize` of v6 to v10: one `init` per process
/// (the logger only), no context.
macro_rules! coll_no_ctx {
    () => {
        unsafe fn init(&self, _ctx: *mut *mut c_void, _comm_id: u64, log: Logger) -> NcclResult {
            $crate::net::abi::call!(self.init, log)
        }
        unsafe fn listen(
            &self,
            _ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listen_comm: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.listen, dev, handle, listen_comm)
        }
        unsafe fn finalize(&self, _ctx: *mut c_void) -> NcclResult {
            $crate::ffi::types::NCCL_SUCCESS
        }
    };
}
pub(crate) use coll_no_ctx;

/// `init`, `listen` and `finalize` of v11 and v12: a context per
/// communicator.
macro_rules! coll_ctx {
    () => {
        unsafe fn init(&self, ctx: *mut *mut c_void, comm_id: u64, log: Logger) -> NcclResult {
            $crate::net::abi::call!(self.init, ctx, comm_id, log)
        }
        unsafe fn listen(
            &self,
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listen_comm: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.listen, ctx, dev, handle, listen_comm)
        }
        unsafe fn finalize(&self, ctx: *mut c_void) -> NcclResult {
            $crate::net::abi::call!(self.finalize, ctx)
        }
    };
}
pub(crate) use coll_ctx;

/// `regMr` with a `size_t` size (v8 on) and `iallreduce` with a `size_t`
/// count (v9 on), called as they are.
macro_rules! coll_reg_mr {
    () => {
        unsafe fn reg_mr(
            &self,
            coll_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.reg_mr, coll_comm, data, size, ty, mhandle)
        }
    };
}
pub(crate) use coll_reg_mr;

/// `iallreduce` with an `int` count (v6 to v8) or a `size_t` one (v9 on).
macro_rules! coll_iallreduce {
    (int) => {
        unsafe fn iallreduce(
            &self,
            coll_comm: *mut c_void,
            send_data: *mut c_void,
            recv_data: *mut c_void,
            count: usize,
            data_type: DataType,
            red_op: RedOp,
            send_mhandle: *mut c_void,
            recv_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            // SAFETY: forwarded.
            unsafe {
                $crate::net::abi::collnet::iallreduce_int(
                    self.iallreduce,
                    coll_comm,
                    send_data,
                    recv_data,
                    count,
                    data_type,
                    red_op,
                    send_mhandle,
                    recv_mhandle,
                    request,
                )
            }
        }
    };
    (size) => {
        unsafe fn iallreduce(
            &self,
            coll_comm: *mut c_void,
            send_data: *mut c_void,
            recv_data: *mut c_void,
            count: usize,
            data_type: DataType,
            red_op: RedOp,
            send_mhandle: *mut c_void,
            recv_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(
                self.iallreduce,
                coll_comm,
                send_data,
                recv_data,
                count,
                data_type,
                red_op,
                send_mhandle,
                recv_mhandle,
                request
            )
        }
    };
}
pub(crate) use coll_iallreduce;

/// `iallgather` and `ireducescatter` (v8 on): pieces passed as they are
/// (`same`: v9 to v12, whose `ncclNetSGE_vN_t` is v12's layout) or copied
/// into v8's with `uint32_t` sizes (`u32`).
macro_rules! coll_gathers {
    ($sge:ty, $conv:ident) => {
        fn gathers(&self) -> (bool, bool) {
            (self.iallgather.is_some(), self.ireducescatter.is_some())
        }
        unsafe fn iallgather(
            &self,
            coll_comm: *mut c_void,
            send_data: *mut c_void,
            n_recv_parts: c_int,
            recv_parts: *mut $crate::net::abi::v12::SgeV12,
            bytes_per_rank: usize,
            window_offset: usize,
            window_bytes: usize,
            send_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            use $crate::net::abi::collnet::$conv as conv;
            // SAFETY: the caller's `n_recv_parts` pieces.
            let parts = unsafe { conv::<$sge>(recv_parts, n_recv_parts) };
            let Some(mut parts) = parts else {
                return $crate::ffi::types::NCCL_INTERNAL_ERROR;
            };
            $crate::net::abi::call!(
                self.iallgather,
                coll_comm,
                send_data,
                n_recv_parts,
                parts.as_mut_ptr(),
                bytes_per_rank,
                window_offset,
                window_bytes,
                send_mhandle,
                request
            )
        }
        unsafe fn ireducescatter(
            &self,
            coll_comm: *mut c_void,
            n_send_parts: c_int,
            send_parts: *mut $crate::net::abi::v12::SgeV12,
            recv_data: *mut c_void,
            bytes_per_rank: usize,
            window_offset: usize,
            window_bytes: usize,
            data_type: DataType,
            red_op: RedOp,
            recv_mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            use $crate::net::abi::collnet::$conv as conv;
            // SAFETY: the caller's `n_send_parts` pieces.
            let parts = unsafe { conv::<$sge>(send_parts, n_send_parts) };
            let Some(mut parts) = parts else {
                return $crate::ffi::types::NCCL_INTERNAL_ERROR;
            };
            $crate::net::abi::call!(
                self.ireducescatter,
                coll_comm,
                n_send_parts,
                parts.as_mut_ptr(),
                recv_data,
                bytes_per_rank,
                window_offset,
                window_bytes,
                data_type,
                red_op,
                recv_mhandle,
                request
            )
        }
    };
}
pub(crate) use coll_gathers;

/// A piece list of a version whose pieces are v12's (same layout): copied
/// as they are, so the plugin never sees the caller's array move.
///
/// # Safety
/// `parts` holds `n` pieces (none where `n` is 0); `T` has `SgeV12`'s
/// layout.
pub(crate) unsafe fn sge_same<T: Copy>(parts: *const SgeV12, n: c_int) -> Option<Vec<T>> {
    const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<SgeV12>()) };
    let n = usize::try_from(n).ok()?;
    if n == 0 {
        return Some(Vec::new());
    }
    // SAFETY: per the contract, `n` pieces of v12's layout, which `T` shares.
    Some(unsafe { std::slice::from_raw_parts(parts.cast::<T>(), n) }.to_vec())
}

/// v8's pieces (`uint32_t` sizes) from v12's; `None` where a size does
/// not fit.
///
/// # Safety
/// `parts` holds `n` pieces (none where `n` is 0).
pub(crate) unsafe fn sge_u32<T: From8>(parts: *const SgeV12, n: c_int) -> Option<Vec<T>> {
    let n = usize::try_from(n).ok()?;
    if n == 0 {
        return Some(Vec::new());
    }
    // SAFETY: per the contract.
    let v = unsafe { std::slice::from_raw_parts(parts, n) };
    v.iter().map(T::from_v12).collect()
}

/// v8's piece, made from v12's.
pub(crate) trait From8: Sized {
    fn from_v12(p: &SgeV12) -> Option<Self>;
}

// The newest version's table, whose types the trait speaks, is implemented
// here; older versions implement it in their own files.
// SAFETY: every method calls the entry of the same name with its arguments.
unsafe impl CollAbi for CollNetV12 {
    coll_common!(12);
    coll_ctx!();
    coll_reg_mr!();
    coll_iallreduce!(size);
    coll_gathers!(SgeV12, sge_same);
    unsafe fn get_properties(&self, dev: c_int, props: *mut PropertiesV12) -> NcclResult {
        super::call!(self.get_properties, dev, props)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names NCCL's loader looks up (src/plugin/net.cc), one per
    /// version, newest first, each cast to its own version's vtable.
    #[test]
    fn symbols_are_the_names_nccl_looks_up() {
        let versions: Vec<u32> = COLL_LOADABLE.iter().map(|l| l.version).collect();
        assert_eq!(versions, [12, 11, 10, 9, 8, 7, 6]);
        for l in COLL_LOADABLE {
            assert_eq!(l.symbol, format!("ncclCollNetPlugin_v{}", l.version));
        }
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    static SEEN: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn record_int(
        _c: *mut c_void,
        _s: *mut c_void,
        _r: *mut c_void,
        count: c_int,
        _d: DataType,
        _o: RedOp,
        _sm: *mut c_void,
        _rm: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        SEEN.store(count as usize, Ordering::SeqCst);
        // SAFETY: the caller's out-pointer.
        unsafe { *request = 8 as *mut c_void };
        crate::ffi::types::NCCL_SUCCESS
    }

    unsafe extern "C" fn props_v8(
        _dev: c_int,
        p: *mut super::super::v8::PropertiesV8,
    ) -> NcclResult {
        // SAFETY: the caller's struct.
        unsafe { (*p).speed = 1234 };
        crate::ffi::types::NCCL_SUCCESS
    }

    /// v8's `int` count is passed on where it fits and refused where not;
    /// its properties gain the collnet size NCCL assumes for it.
    #[test]
    fn v8_counts_and_properties_convert() {
        // SAFETY: all-NULL entries and name are a valid vtable value.
        let mut vt: super::super::v8::CollNetV8 = unsafe { std::mem::zeroed() };
        vt.iallreduce = Some(record_int);
        vt.get_properties = Some(props_v8);
        let abi: &dyn CollAbi = &vt;
        assert_eq!(abi.version(), 8);
        assert!(!abi.has_context());
        assert!(abi.null_entries().contains(&"init"));
        let mut req = std::ptr::null_mut();
        let n = std::ptr::null_mut();
        // SAFETY: the fake entry touches only `request`.
        let r = unsafe { abi.iallreduce(n, n, n, 1000, 7, 0, n, n, &mut req) };
        assert_eq!((r, SEEN.load(Ordering::SeqCst)), (0, 1000));
        // SAFETY: as above; refused before the call.
        let r = unsafe { abi.iallreduce(n, n, n, 1 << 31, 7, 0, n, n, &mut req) };
        assert_eq!(r, crate::ffi::types::NCCL_INTERNAL_ERROR);
        // SAFETY: all-zero is a valid properties value.
        let mut p: PropertiesV12 = unsafe { std::mem::zeroed() };
        // SAFETY: the fake entry fills the v8 struct it is given.
        assert_eq!(unsafe { abi.get_properties(0, &mut p) }, 0);
        assert_eq!(
            (p.speed, p.max_coll_bytes),
            (1234, super::super::MAX_COLLNET_SIZE)
        );
        // A NULL entry is an error, never a call.
        // SAFETY: `devices` is NULL here.
        assert_ne!(unsafe { abi.devices(&mut 0) }, 0);
    }

    static PIECE: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn gather_v8(
        _c: *mut c_void,
        _s: *mut c_void,
        n: c_int,
        parts: *mut super::super::v8::SgeV8,
        _per: usize,
        _off: usize,
        _w: usize,
        _sm: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        // SAFETY: the caller's `n` pieces and out-pointer.
        unsafe {
            let p = std::slice::from_raw_parts(parts, n as usize);
            PIECE.store(p.iter().map(|x| x.size as usize).sum(), Ordering::SeqCst);
            *request = 8 as *mut c_void;
        }
        crate::ffi::types::NCCL_SUCCESS
    }

    /// v8's pieces carry `uint32_t` sizes: converted where they fit,
    /// refused before the call where not; v6 and v7 offer no gathers.
    #[test]
    fn v8_gathers_convert_their_pieces() {
        // SAFETY: all-NULL entries and name are a valid vtable value.
        let mut vt: super::super::v8::CollNetV8 = unsafe { std::mem::zeroed() };
        assert_eq!(CollAbi::gathers(&vt), (false, false));
        vt.iallgather = Some(gather_v8);
        let abi: &dyn CollAbi = &vt;
        assert_eq!(abi.gathers(), (true, false));
        let n = std::ptr::null_mut();
        let mut parts = [
            SgeV12 {
                mhandle: n,
                address: n,
                size: 100,
            },
            SgeV12 {
                mhandle: n,
                address: n,
                size: 28,
            },
        ];
        let mut req = n;
        // SAFETY: the fake entry reads the two pieces and the out-pointer.
        let r = unsafe { abi.iallgather(n, n, 2, parts.as_mut_ptr(), 64, 0, 128, n, &mut req) };
        assert_eq!((r, PIECE.load(Ordering::SeqCst)), (0, 128));
        parts[1].size = 1 << 32;
        // SAFETY: refused before the call.
        let r = unsafe { abi.iallgather(n, n, 2, parts.as_mut_ptr(), 64, 0, 128, n, &mut req) };
        assert_eq!(r, crate::ffi::types::NCCL_INTERNAL_ERROR);
        // SAFETY: `ireducescatter` is NULL here.
        let r = unsafe {
            abi.ireducescatter(n, 1, parts.as_mut_ptr(), n, 64, 0, 64, 7, 0, n, &mut req)
        };
        assert_eq!(r, crate::ffi::types::NCCL_INTERNAL_ERROR);
        // SAFETY: all-NULL is a valid v7 vtable.
        let v7: super::super::v7::CollNetV7 = unsafe { std::mem::zeroed() };
        assert_eq!(CollAbi::gathers(&v7), (false, false));
    }
}
