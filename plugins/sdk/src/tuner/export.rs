//! Exports a Rust [`Tuner`] as NCCL's `ncclTunerPlugin_v2` … `_v6`, so one
//! implementation loads into NCCL 2.19 and later (2.28 takes v2 to v5, 2.30
//! adds v6) and into oxccl. What differs per version is adapted here:
//! v2 has no cost table (it returns an algorithm and protocol, so the glue
//! builds a table, lets the tuner edit it and reports the cheapest edited
//! cell); v4 adds `regBuff`; v5 moves the context to the first argument of
//! `init` and adds the communicator id, NVLink domains and constants; v6 adds
//! `getChunkSize` (NULL unless the tuner sets `Tuner::CHUNK_SIZE`).
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::abi::v2::TunerV2;
use super::abi::v3::TunerV3;
use super::abi::v4::TunerV4;
use super::abi::v5::{ConstantsV5, NvlDomainInfoV5, TunerV5};
use super::abi::v6::TunerV6;
use super::abi::{
    NCCL_ALGO_COLLNET_CHAIN, NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE,
    NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS,
};
use crate::ffi::types::*;
use crate::logger::NcclLogger;
use crate::plugin_error::{PluginError, PluginResult};
use crate::tuner::{CollInfoRequest, CollType, CostTable, NvlDomainInfo, Tuner, TunerInit};

/// What the `void* context` handed to NCCL points at.
struct Ctx<T> {
    tuner: T,
    logger: NcclLogger,
}

/// Runs a glue body: an error or a panic becomes a result code and a WARN
/// line, since neither may cross into C.
fn guard(logger: NcclLogger, what: &str, f: impl FnOnce() -> PluginResult<()>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => {
            logger.warn(&format!("tuner {what}: {e}"));
            e.code()
        }
        Err(_) => {
            logger.warn(&format!(
                "tuner {what}: panic inside the plugin (caught at the C boundary)"
            ));
            NCCL_INTERNAL_ERROR
        }
    }
}

fn null(what: &str) -> PluginError {
    PluginError::InvalidArgument(format!("{what} is NULL"))
}

/// # Safety
/// `ctx` is NULL or was produced by `init_common::<T>` and not destroyed.
unsafe fn ctx_ref<'a, T: Tuner>(ctx: *mut c_void) -> Option<&'a Ctx<T>> {
    // SAFETY: per the function contract; shared access only (T: Sync).
    unsafe { (ctx as *const Ctx<T>).as_ref() }
}

fn logger_of<T: Tuner>(ctx: Option<&Ctx<T>>) -> NcclLogger {
    ctx.map(|c| c.logger)
        .unwrap_or_else(|| NcclLogger::stderr(NCCL_TUNING))
}

/// # Safety
/// `out` is NULL or valid for one pointer write.
unsafe fn init_common<T: Tuner>(out: *mut *mut c_void, args: TunerInit) -> NcclResult {
    let logger = args.logger;
    guard(logger, "init", || {
        if out.is_null() {
            return Err(null("context"));
        }
        let tuner = T::init(&args)?;
        let ctx = Box::into_raw(Box::new(Ctx { tuner, logger }));
        // SAFETY: `out` checked non-null; NCCL passes a valid `void**`.
        unsafe { *out = ctx as *mut c_void };
        Ok(())
    })
}

/// # Safety
/// As `ctx_ref`; `table` is NULL or points at `num_algo * num_proto` floats;
/// `n_channels` is NULL or valid.
unsafe fn coll_info_common<T: Tuner>(
    ctx: *mut c_void,
    req: CollInfoRequest,
    table: *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    // SAFETY: per the function contract.
    let c = unsafe { ctx_ref::<T>(ctx) };
    guard(logger_of(c), "getCollInfo", || {
        let c = c.ok_or_else(|| null("context"))?;
        if table.is_null() {
            return Err(null("collCostTable"));
        }
        if n_channels.is_null() {
            return Err(null("nChannels"));
        }
        let (na, np) = (num_algo.max(0) as usize, num_proto.max(0) as usize);
        // SAFETY: NCCL's table is a contiguous `float[numAlgo][numProto]`
        // (passed as `float**` by cast), exclusively ours for this call.
        let cells = unsafe { std::slice::from_raw_parts_mut(table, na * np) };
        let mut view = CostTable::new(cells, na, np);
        // SAFETY: checked non-null; NCCL's in/out int.
        let nch = unsafe { &mut *n_channels };
        c.tuner.get_coll_info(&req, &mut view, nch)
    })
}

/// # Safety
/// `ctx` as `ctx_ref`; NCCL never uses it again.
unsafe fn destroy_common<T: Tuner>(ctx: *mut c_void) -> NcclResult {
    if ctx.is_null() {
        return guard(NcclLogger::stderr(NCCL_TUNING), "destroy", || {
            Err(null("context"))
        });
    }
    // SAFETY: per the function contract, `ctx` came from Box::into_raw.
    let c = unsafe { Box::from_raw(ctx as *mut Ctx<T>) };
    let logger = c.logger;
    guard(logger, "destroy", move || c.tuner.destroy())
}

fn old_init(n_ranks: usize, n_nodes: usize, log: Logger) -> TunerInit {
    TunerInit {
        n_ranks,
        n_nodes,
        comm_id: None,
        nvl_domain: None,
        logger: NcclLogger::new(log, NCCL_TUNING),
    }
}

unsafe extern "C" fn init_v2<T: Tuner>(
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    ctx: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: `ctx` is NCCL's `void**` out-parameter (checked for NULL).
    unsafe { init_common::<T>(ctx, old_init(n_ranks, n_nodes, log)) }
}

unsafe extern "C" fn init_v5<T: Tuner>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    nvl: *mut NvlDomainInfoV5,
    _constants: *mut ConstantsV5,
) -> NcclResult {
    // SAFETY: NULL or NCCL's struct, valid for the call.
    let nvl_domain = unsafe { nvl.as_ref() }.map(|n| NvlDomainInfo {
        n_nvl_domains: n.n_nvl_domains,
        min_ranks_per_nvl_domain: n.min_ranks_per_nvl_domain,
        max_ranks_per_nvl_domain: n.max_ranks_per_nvl_domain,
    });
    let args = TunerInit {
        comm_id: Some(comm_id),
        nvl_domain,
        ..old_init(n_ranks, n_nodes, log)
    };
    // SAFETY: `ctx` is NCCL's `void**` out-parameter (checked for NULL).
    unsafe { init_common::<T>(ctx, args) }
}

/// v2: NCCL asks for an algorithm and protocol. The glue gives the tuner a
/// table whose usable cells hold a placeholder cost, and reports the
/// cheapest cell the tuner changed; if it changed none, the outputs are left
/// as NCCL set them (NCCL keeps its choice).
#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn coll_info_v2<T: Tuner>(
    ctx: *mut c_void,
    coll: Func,
    n_bytes: usize,
    coll_net_support: c_int,
    nvls_support: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    const PLACEHOLDER: f32 = 1.0e9;
    let mut cells = [PLACEHOLDER; NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS];
    let mut off = |algo: c_int| {
        let row = algo as usize * NCCL_NUM_PROTOCOLS;
        cells[row..row + NCCL_NUM_PROTOCOLS].fill(NCCL_ALGO_PROTO_IGNORE);
    };
    if coll_net_support == 0 {
        off(NCCL_ALGO_COLLNET_DIRECT);
        off(NCCL_ALGO_COLLNET_CHAIN);
    }
    if nvls_support == 0 {
        off(NCCL_ALGO_NVLS);
        off(NCCL_ALGO_NVLS_TREE);
    }
    let req = CollInfoRequest {
        coll: CollType::from_raw(coll),
        n_bytes,
        num_pipe_ops,
        reg_buff: None,
    };
    // SAFETY: `cells` is a local 7x3 table; the rest is NCCL's, as documented
    // on `coll_info_common`.
    let rc = unsafe {
        coll_info_common::<T>(
            ctx,
            req,
            cells.as_mut_ptr(),
            NCCL_NUM_ALGORITHMS as c_int,
            NCCL_NUM_PROTOCOLS as c_int,
            n_channels,
        )
    };
    if rc != NCCL_SUCCESS {
        return rc;
    }
    let best = cells
        .iter()
        .enumerate()
        .filter(|(_, &c)| c != PLACEHOLDER && c != NCCL_ALGO_PROTO_IGNORE)
        .min_by(|a, b| a.1.total_cmp(b.1));
    if let Some((i, _)) = best {
        if algorithm.is_null() || protocol.is_null() {
            // SAFETY: as above.
            let c = unsafe { ctx_ref::<T>(ctx) };
            return guard(logger_of(c), "getCollInfo", || {
                Err(null("algorithm or protocol"))
            });
        }
        // SAFETY: checked non-null; NCCL's out-parameters.
        unsafe {
            *algorithm = (i / NCCL_NUM_PROTOCOLS) as c_int;
            *protocol = (i % NCCL_NUM_PROTOCOLS) as c_int;
        }
    }
    NCCL_SUCCESS
}

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn coll_info_v3<T: Tuner>(
    ctx: *mut c_void,
    coll: Func,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    let req = CollInfoRequest {
        coll: CollType::from_raw(coll),
        n_bytes,
        num_pipe_ops,
        reg_buff: None,
    };
    // SAFETY: NCCL's arguments, as documented on `coll_info_common`.
    unsafe { coll_info_common::<T>(ctx, req, table as *mut f32, num_algo, num_proto, n_channels) }
}

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn coll_info_v4<T: Tuner>(
    ctx: *mut c_void,
    coll: Func,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    let req = CollInfoRequest {
        coll: CollType::from_raw(coll),
        n_bytes,
        num_pipe_ops,
        reg_buff: Some(reg_buff != 0),
    };
    // SAFETY: NCCL's arguments, as documented on `coll_info_common`.
    unsafe { coll_info_common::<T>(ctx, req, table as *mut f32, num_algo, num_proto, n_channels) }
}

unsafe extern "C" fn destroy<T: Tuner>(ctx: *mut c_void) -> NcclResult {
    // SAFETY: NCCL destroys a context once, after its last use.
    unsafe { destroy_common::<T>(ctx) }
}

/// `ncclTuner_v2_t` of a tuner.
pub const fn vtable_v2<T: Tuner>() -> TunerV2 {
    TunerV2 {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T>),
        get_coll_info: Some(coll_info_v2::<T>),
        destroy: Some(destroy::<T>),
    }
}

/// `ncclTuner_v3_t` of a tuner.
pub const fn vtable_v3<T: Tuner>() -> TunerV3 {
    TunerV3 {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T>),
        get_coll_info: Some(coll_info_v3::<T>),
        destroy: Some(destroy::<T>),
    }
}

/// `ncclTuner_v4_t` of a tuner.
pub const fn vtable_v4<T: Tuner>() -> TunerV4 {
    TunerV4 {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T>),
        get_coll_info: Some(coll_info_v4::<T>),
        destroy: Some(destroy::<T>),
    }
}

/// `ncclTuner_v5_t` of a tuner.
pub const fn vtable_v5<T: Tuner>() -> TunerV5 {
    TunerV5 {
        name: T::NAME.as_ptr(),
        init: Some(init_v5::<T>),
        get_coll_info: Some(coll_info_v4::<T>),
        finalize: Some(destroy::<T>),
    }
}

/// `ncclTuner_v6_t` of a tuner.
pub const fn vtable_v6<T: Tuner>() -> TunerV6 {
    TunerV6 {
        name: T::NAME.as_ptr(),
        init: Some(init_v5::<T>),
        get_coll_info: Some(coll_info_v4::<T>),
        finalize: Some(destroy::<T>),
        get_chunk_size: if T::CHUNK_SIZE {
            Some(chunk_size::<T>)
        } else {
            None
        },
    }
}

unsafe extern "C" fn chunk_size<T: Tuner>(
    ctx: *mut c_void,
    coll: Func,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    out: *mut usize,
) -> NcclResult {
    // SAFETY: the context NCCL got from init.
    let c = unsafe { ctx_ref::<T>(ctx) };
    guard(logger_of(c), "getChunkSize", || {
        let c = c.ok_or_else(|| null("context"))?;
        if out.is_null() {
            return Err(null("chunkSize"));
        }
        let bad = |what: &str, v: c_int| {
            PluginError::InvalidArgument(format!("{what} {v} is not one this SDK knows"))
        };
        let a =
            crate::Algorithm::from_index(algo as usize).ok_or_else(|| bad("algorithm", algo))?;
        let p =
            crate::Protocol::from_index(proto as usize).ok_or_else(|| bad("protocol", proto))?;
        if let Some(size) =
            c.tuner
                .get_chunk_size(CollType::from_raw(coll), n_bytes, a, p, n_channels)?
        {
            // SAFETY: checked non-null; NCCL's in/out size_t.
            unsafe { *out = size };
        }
        Ok(())
    })
}

/// Exports every version [`crate::tuner_versions!`] lists
/// (`ncclTunerPlugin_v2` … `ncclTunerPlugin_v6`) for a type implementing
/// [`crate::Tuner`], and the tuner's abi_stable root module
/// ([`crate::tuner::stable::SYMBOL`]) that oxccl prefers.
#[macro_export]
macro_rules! export_tuner_plugin {
    ($tuner:ty) => {
        $crate::tuner_versions!(($crate::export_tuner_plugin) @each $tuner;);

        /// The tuner's abi_stable root module, which oxccl loads with the
        /// layout of every type checked (NCCL ignores it).
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static oxccl_tuner_root_module: $crate::abi_stable::library::LibHeader =
            $crate::tuner::stable::lib_header::<$tuner>();
    };
    (@each $tuner:ty; $([$n:literal, $sym:ident, $m:ident, $ty:ident, $var:ident, $f:ident])*) => {
        $($crate::export_tuner_plugin!(@one $tuner, $sym, $m, $ty, $f);)*
    };
    (@one $tuner:ty, $sym:ident, $m:ident, $ty:ident, $f:ident) => {
        #[doc = concat!("NCCL's tuner plugin symbol `", stringify!($sym), "`.")]
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static $sym: $crate::tuner::export::ExportedTuner<$crate::tuner::abi::$m::$ty> =
            $crate::tuner::export::ExportedTuner($crate::tuner::export::$f::<$tuner>());
    };
}

/// A tuner vtable in a `static`.
#[repr(transparent)]
pub struct ExportedTuner<T>(pub T);

// SAFETY: the wrapped vtables hold pointers only to 'static C strings and
// functions, never mutated.
unsafe impl<T> Sync for ExportedTuner<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Picks tree/ll128 for every call and panics on 13-byte calls.
    struct Fixed;
    impl Tuner for Fixed {
        const NAME: &'static std::ffi::CStr = c"fixed";
        const CHUNK_SIZE: bool = true;
        fn get_chunk_size(
            &self,
            _coll: CollType,
            n_bytes: usize,
            algo: crate::Algorithm,
            _proto: crate::Protocol,
            n_channels: i32,
        ) -> PluginResult<Option<usize>> {
            Ok((algo == crate::Algorithm::Ring).then_some(n_bytes / n_channels as usize))
        }
        fn init(args: &TunerInit) -> PluginResult<Self> {
            if args.n_ranks == 0 {
                return Err(PluginError::InvalidUsage("no ranks".into()));
            }
            Ok(Fixed)
        }
        fn get_coll_info(
            &self,
            req: &CollInfoRequest,
            table: &mut CostTable<'_>,
            n_channels: &mut i32,
        ) -> PluginResult<()> {
            assert_ne!(req.n_bytes, 13, "boom");
            table.set(crate::Algorithm::Tree, crate::Protocol::Ll128, 0.0);
            *n_channels = 5;
            Ok(())
        }
    }

    #[test]
    fn v2_reports_the_cell_the_tuner_chose_and_catches_panics() {
        let vt = vtable_v2::<Fixed>();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { vt.init.unwrap()(4, 1, None, &mut ctx) };
        assert_eq!(rc, NCCL_SUCCESS);
        let (mut a, mut p, mut c) = (-1, -1, 1);
        // SAFETY: the context from init, valid out-pointers.
        let rc = unsafe {
            vt.get_coll_info.unwrap()(
                ctx,
                NCCL_FUNC_ALL_REDUCE,
                64,
                0,
                0,
                1,
                &mut a,
                &mut p,
                &mut c,
            )
        };
        assert_eq!((rc, a, p, c), (NCCL_SUCCESS, 0, 1, 5));
        // SAFETY: as above.
        let rc = unsafe {
            vt.get_coll_info.unwrap()(
                ctx,
                NCCL_FUNC_ALL_REDUCE,
                13,
                0,
                0,
                1,
                &mut a,
                &mut p,
                &mut c,
            )
        };
        assert_eq!(rc, NCCL_INTERNAL_ERROR);
        // SAFETY: the context from init, destroyed once.
        let rc = unsafe { vt.destroy.unwrap()(ctx) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: valid out-pointer; the init error is the test.
        let rc = unsafe { vt.init.unwrap()(0, 1, None, &mut ctx) };
        assert_eq!(rc, NCCL_INVALID_USAGE);
    }

    #[test]
    fn v6_chunk_size_only_when_the_tuner_has_one() {
        assert!(vtable_v6::<Fixed>().get_chunk_size.is_some());
        let vt = vtable_v6::<Fixed>();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer; NULL logger, NVLink info and constants.
        let rc = unsafe {
            vt.init.unwrap()(
                &mut ctx,
                1,
                4,
                1,
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, NCCL_SUCCESS);
        let f = vt.get_chunk_size.unwrap();
        let mut chunk = 7usize;
        // SAFETY: the context from init, a valid out-pointer.
        let rc = unsafe { f(ctx, NCCL_FUNC_ALL_REDUCE, 4096, 1, 2, 4, &mut chunk) };
        assert_eq!((rc, chunk), (NCCL_SUCCESS, 1024));
        // Tree: the tuner has no opinion, NCCL's value stays.
        // SAFETY: as above.
        let rc = unsafe { f(ctx, NCCL_FUNC_ALL_REDUCE, 4096, 0, 2, 4, &mut chunk) };
        assert_eq!((rc, chunk), (NCCL_SUCCESS, 1024));
        // SAFETY: as above; algorithm 42 is the error tested.
        let rc = unsafe { f(ctx, NCCL_FUNC_ALL_REDUCE, 4096, 42, 2, 4, &mut chunk) };
        assert_eq!(rc, NCCL_INVALID_ARGUMENT);
        // SAFETY: the context from init, finalized once.
        let rc = unsafe { vt.finalize.unwrap()(ctx) };
        assert_eq!(rc, NCCL_SUCCESS);
    }
}
