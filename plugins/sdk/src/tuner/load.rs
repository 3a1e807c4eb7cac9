//! Loading a tuner plugin: its abi_stable root module
//! ([`super::stable`]) where it has one, else `ncclTuner_v2_t` …
//! `ncclTuner_v6_t`, behind one adapter, [`CTuner`], which the host
//! (oxccl's core) drives the same way whichever was taken.
//! One adapter; each entry whose signature changed has one match arm per
//! version. v2 predates the cost table: its chosen (algorithm, protocol) is
//! written into the table as cost 0, as NCCL's `tuner_v2.cc` does.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::null_mut;

use abi_stable::std_types::{RSliceMut, RSome};

use super::abi::{v2, v3, v4, v5, v6, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS};
use super::stable::{self as rs, TunerModRef};
use crate::ffi::types::Logger;
use crate::ffi::{Func, NCCL_SUCCESS};
use crate::loader::Lib;
use crate::stable::{host_sink, root_module, AbiChoice, SDK_VERSION};

/// NCCL's cost table as the host keeps it (`collCostTable`): estimated
/// microseconds per algorithm and protocol.
pub type Costs = [[f32; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS];

/// The symbol table, the vtable of each version and the cast from a
/// symbol's address, from the one list of versions.
macro_rules! loadable {
    ($([$n:literal, $sym:ident, $m:ident, $ty:ident, $var:ident, $f:ident])*) => {
        /// Tuner symbols, newest first, with the version loaded for each.
        pub const SYMBOLS: &[(&str, u32)] = &[$((stringify!($sym), $n),)*];

        #[derive(Clone, Copy)]
        enum Vt {
            $($var(&'static $m::$ty),)*
        }

        /// The vtable of `version` at `p`.
        ///
        /// # Safety
        /// `p` is the address of the symbol `SYMBOLS` gives for `version`,
        /// in a library that stays loaded for `'static`.
        unsafe fn vtable_at(version: u32, p: *const c_void) -> Option<Vt> {
            match version {
                // SAFETY: by the ABI the symbol `ncclTunerPlugin_vN` is an
                // `ncclTuner_vN_t` (the caller's contract).
                $($n => Some(Vt::$var(unsafe { &*(p as *const $m::$ty) })),)*
                _ => None,
            }
        }
    };
}
crate::tuner_versions!((loadable));

/// The functions a [`CTuner`] calls.
#[derive(Clone, Copy)]
enum Api {
    C(Vt),
    Stable(TunerModRef),
}

/// A loaded tuner (process-wide, like NCCL's).
pub struct CTuner {
    api: Api,
    _lib: Lib,
    pub name: String,
    /// The NCCL ABI version taken; 0 for the root module.
    pub version: u32,
}

// SAFETY: the vtable is immutable data of a library kept loaded by `_lib`;
// NCCL calls tuners from any thread as well.
unsafe impl Send for CTuner {}
// SAFETY: as above.
unsafe impl Sync for CTuner {}

/// A tuner's per-communicator context, with the structs `init` (v5+) was
/// handed: NCCL passes `&comm->nvlDomainInfo` and `&comm->tunerConstants`,
/// which live as long as the communicator, so a tuner may keep the
/// pointers. Boxed, they stay put until the context is dropped, after
/// `finalize`.
pub struct Ctx {
    ptr: *mut c_void,
    _nvl: Box<v5::NvlDomainInfoV5>,
    _constants: Box<v5::ConstantsV5>,
}
// SAFETY: the plugin's context, used under the communicator's own
// serialisation (one collective is planned at a time per communicator).
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

fn ok(what: &str, r: i32) -> Result<(), String> {
    if r == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} returned error {r}"))
    }
}

impl CTuner {
    /// The tuner in `lib`: its root module unless `abi` is
    /// [`AbiChoice::C`] or it has none, else the newest C version (see
    /// [`CTuner::negotiate`]). A root module built against another SDK is
    /// refused, not passed over: its message says what to rebuild.
    pub fn open(lib: &Lib, abi: AbiChoice) -> Result<CTuner, (Vec<&'static str>, String)> {
        match root_module::<TunerModRef>(lib, abi, rs::SYMBOL) {
            Ok(Some(m)) => Ok(CTuner {
                api: Api::Stable(m),
                _lib: lib.clone(),
                name: m.name()().as_str().to_string(),
                version: 0,
            }),
            Err(e) => Err((vec![rs::SYMBOL], e.to_string())),
            Ok(None) => Self::negotiate(lib),
        }
    }

    /// Which ABI was taken, for logs: the C symbol or the root module.
    pub fn loaded_as(&self) -> String {
        match self.api {
            Api::C(_) => format!("ncclTunerPlugin_v{}", self.version),
            Api::Stable(_) => format!("{}, oxccl-plugin {SDK_VERSION}", rs::SYMBOL),
        }
    }

    /// Whether the root module was taken.
    pub fn is_stable(&self) -> bool {
        matches!(self.api, Api::Stable(_))
    }

    /// The newest tuner version the library exports, with its required
    /// entries checked. `Err((found, reason))` when none is usable.
    pub fn negotiate(lib: &Lib) -> Result<CTuner, (Vec<&'static str>, String)> {
        let looked: Vec<&'static str> = SYMBOLS.iter().map(|s| s.0).collect();
        let found = lib.present(&looked);
        let Some(&(sym, version)) = SYMBOLS.iter().find(|(s, _)| found.contains(s)) else {
            return Err((
                found,
                "no tuner ABI version this oxccl loads (v2 to v6)".into(),
            ));
        };
        let p = lib.symbol(sym).expect("found above");
        // SAFETY: `p` is the address of `sym`, the symbol of `version` in
        // SYMBOLS; `lib` keeps it loaded for as long as we hold it.
        let Some(vt) = (unsafe { vtable_at(version, p as *const c_void) }) else {
            return Err((found, format!("{sym}: no vtable for version {version}")));
        };
        let (name, init, get, fin) = match vt {
            Vt::V2(v) => (
                v.name,
                v.init.is_some(),
                v.get_coll_info.is_some(),
                v.destroy.is_some(),
            ),
            Vt::V3(v) => (
                v.name,
                v.init.is_some(),
                v.get_coll_info.is_some(),
                v.destroy.is_some(),
            ),
            Vt::V4(v) => (
                v.name,
                v.init.is_some(),
                v.get_coll_info.is_some(),
                v.destroy.is_some(),
            ),
            Vt::V5(v) => (
                v.name,
                v.init.is_some(),
                v.get_coll_info.is_some(),
                v.finalize.is_some(),
            ),
            Vt::V6(v) => (
                v.name,
                v.init.is_some(),
                v.get_coll_info.is_some(),
                v.finalize.is_some(),
            ),
        };
        let null: Vec<&str> = [
            ("name", !name.is_null()),
            ("init", init),
            ("getCollInfo", get),
            (if version >= 5 { "finalize" } else { "destroy" }, fin),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n)
        .collect();
        if !null.is_empty() {
            return Err((found, format!("{sym} has NULL {}", null.join(", "))));
        }
        // SAFETY: checked non-null; a C string of the plugin.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        Ok(CTuner {
            api: Api::C(vt),
            _lib: lib.clone(),
            name,
            version,
        })
    }

    /// `init` for one communicator.
    /// `log`: the host's logger, which the plugin may call at any time
    /// until `finalize`.
    pub fn init(
        &self,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        log: Logger,
    ) -> Result<Ctx, String> {
        let mut ctx = null_mut();
        // Zeroed: we have no NVLink domains and no latency/bandwidth
        // constants of NCCL's model to share; a tuner only reads them.
        let mut nvl = Box::new(v5::NvlDomainInfoV5 {
            n_nvl_domains: 0,
            min_ranks_per_nvl_domain: 0,
            max_ranks_per_nvl_domain: 0,
        });
        // SAFETY: an all-zero block of f64 arrays is a valid value.
        let mut constants: Box<v5::ConstantsV5> = Box::new(unsafe { std::mem::zeroed() });
        let vt = match self.api {
            Api::C(vt) => vt,
            Api::Stable(m) => {
                let args = rs::InitArgs {
                    n_ranks: nranks,
                    n_nodes: nnodes,
                    comm_id: RSome(comm_id),
                    nvl_domain: RSome(rs::NvlDomain {
                        n_nvl_domains: 0,
                        min_ranks_per_nvl_domain: 0,
                        max_ranks_per_nvl_domain: 0,
                    }),
                    log: host_sink(log),
                };
                return match m.init()(&args).into_result() {
                    Ok(inst) => Ok(Ctx {
                        ptr: inst.0,
                        _nvl: nvl,
                        _constants: constants,
                    }),
                    Err(e) => Err(format!("init: {e}")),
                };
            }
        };
        // SAFETY: entries checked non-null at load; valid out-pointers and
        // structs of the version's types, boxed in the returned `Ctx` so
        // that they outlive `finalize` as NCCL's communicator fields do.
        let r = unsafe {
            match vt {
                Vt::V2(v) => v.init.expect("checked")(nranks, nnodes, log, &mut ctx),
                Vt::V3(v) => v.init.expect("checked")(nranks, nnodes, log, &mut ctx),
                Vt::V4(v) => v.init.expect("checked")(nranks, nnodes, log, &mut ctx),
                Vt::V5(v) => v.init.expect("checked")(
                    &mut ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    log,
                    &mut *nvl,
                    &mut *constants,
                ),
                Vt::V6(v) => v.init.expect("checked")(
                    &mut ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    log,
                    &mut *nvl,
                    &mut *constants,
                ),
            }
        };
        ok("init", r).map(|_| Ctx {
            ptr: ctx,
            _nvl: nvl,
            _constants: constants,
        })
    }

    /// `getCollInfo`: lets the tuner rewrite `table` and the channel count.
    pub fn get_coll_info(
        &self,
        ctx: &Ctx,
        func: Func,
        bytes: usize,
        table: &mut Costs,
        nchannels: &mut c_int,
    ) -> Result<(), String> {
        let vt = match self.api {
            Api::C(vt) => vt,
            Api::Stable(m) => {
                let req = rs::CollRequest {
                    coll: func,
                    n_bytes: bytes,
                    num_pipe_ops: 1,
                    reg_buff: RSome(false),
                    #[cfg(feature = "abi-skew-for-tests")]
                    skew: 0,
                };
                let cells = RSliceMut::from_mut_slice(table.as_flattened_mut());
                return m.get_coll_info()(
                    rs::Instance(ctx.ptr),
                    &req,
                    cells,
                    NCCL_NUM_ALGORITHMS,
                    NCCL_NUM_PROTOCOLS,
                    nchannels,
                )
                .into_result()
                .map_err(|e| format!("getCollInfo: {e}"));
            }
        };
        let (na, np) = (NCCL_NUM_ALGORITHMS as c_int, NCCL_NUM_PROTOCOLS as c_int);
        // NCCL passes its `float[NUM_ALGO][NUM_PROTO]` cast to `float**`;
        // tuners cast it back to rows of `numProto` floats.
        let t = table.as_mut_ptr() as *mut *mut f32;
        // SAFETY: entries checked non-null at load; `t` points at
        // NUM_ALGORITHMS x NUM_PROTOCOLS floats as announced; valid out-pointers.
        let r = unsafe {
            match vt {
                Vt::V2(v) => {
                    let (mut a, mut p) = (-1, -1);
                    let r = v.get_coll_info.expect("checked")(
                        ctx.ptr, func, bytes, 0, 0, 1, &mut a, &mut p, nchannels,
                    );
                    if (0..na).contains(&a) && (0..np).contains(&p) {
                        table[a as usize][p as usize] = 0.0;
                    }
                    r
                }
                Vt::V3(v) => {
                    v.get_coll_info.expect("checked")(ctx.ptr, func, bytes, 1, t, na, np, nchannels)
                }
                Vt::V4(v) => v.get_coll_info.expect("checked")(
                    ctx.ptr, func, bytes, 1, t, na, np, 0, nchannels,
                ),
                Vt::V5(v) => v.get_coll_info.expect("checked")(
                    ctx.ptr, func, bytes, 1, t, na, np, 0, nchannels,
                ),
                Vt::V6(v) => v.get_coll_info.expect("checked")(
                    ctx.ptr, func, bytes, 1, t, na, np, 0, nchannels,
                ),
            }
        };
        ok("getCollInfo", r)
    }

    /// `destroy` / `finalize` of a context.
    pub fn finalize(&self, ctx: &Ctx) {
        let vt = match self.api {
            Api::C(vt) => vt,
            Api::Stable(m) => {
                // As on the C path, a failing destroy leaves nothing to do.
                let _ = m.destroy()(rs::Instance(ctx.ptr));
                return;
            }
        };
        let f = match vt {
            Vt::V2(v) => v.destroy,
            Vt::V3(v) => v.destroy,
            Vt::V4(v) => v.destroy,
            Vt::V5(v) => v.finalize,
            Vt::V6(v) => v.finalize,
        };
        if let Some(f) = f {
            // SAFETY: the context `init` returned, finalized once (by Drop).
            let _ = unsafe { f(ctx.ptr) };
        }
    }
}
