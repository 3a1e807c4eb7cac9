//! The tuner plugin: `NCCL_TUNER_PLUGIN` as NCCL 2.30 reads it (a name, a
//! path, `none`; unset tries `libnccl-tuner.so`, then the tuner symbols of
//! the net plugin library): its abi_stable root module where it has one
//! (unless OXCCL_PLUGIN_ABI=c), else `ncclTunerPlugin_v6` down to `_v2`.
//! The core hands it NCCL's cost table before each collective (see
//! `algo::cost`), the same calls on either path.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::{info, warn};

use crate::algo::cost::CostTable;
use crate::algo::Coll;
use crate::error::{Error, Result};
use oxccl_plugin::loader::{self, Lib};
use oxccl_plugin::stable::AbiChoice;

pub use oxccl_plugin::tuner::load::SYMBOLS;
use oxccl_plugin::tuner::load::{CTuner, Ctx};
/// The symbol of a tuner's abi_stable root module, tried before `SYMBOLS`.
pub use oxccl_plugin::tuner::stable::SYMBOL as ROOT_SYMBOL;

pub use oxccl_plugin::loader::Outcome;

/// The library names tried for a setting.
pub fn candidates(setting: Option<&str>) -> Vec<String> {
    loader::candidates(loader::TUNER, setting)
}

fn refused(lib: &str, found: &[&str], reason: &str) -> String {
    let looked: Vec<&str> = std::iter::once(ROOT_SYMBOL)
        .chain(SYMBOLS.iter().map(|s| s.0))
        .collect();
    loader::refusal("tuner", lib, &looked, found, reason)
}

/// Finds and checks the tuner library. `net_lib` is the net plugin library,
/// searched when no tuner library is found and none was named.
pub fn load(setting: Option<&str>, net_lib: Option<Lib>) -> Result<(Option<Arc<CTuner>>, Outcome)> {
    let abi = AbiChoice::from_env().map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let search = loader::open(loader::TUNER, setting);
    let mut searched = search.tried.clone();
    let from_net = search.opened.is_none() && !loader::explicit(setting) && !searched.is_empty();
    let lib = match (search.opened, search.failed.first()) {
        (Some(l), _) => l,
        (None, Some((library, why))) => {
            let reason = format!("cannot be opened: {why}");
            warn!(target: "oxccl::init|tuning", "{}; no tuner", refused(library, &[], &reason));
            return Ok((
                None,
                Outcome::Refused {
                    library: library.clone(),
                    reason,
                    searched,
                },
            ));
        }
        (None, None) if loader::explicit(setting) => {
            return Err(Error::InvalidArgument(format!(
                "NCCL_TUNER_PLUGIN={}: no such library (tried {}); set it to a library name, a path, or none",
                setting.unwrap_or_default().trim(),
                searched.join(", ")
            )));
        }
        (None, None) => match net_lib.filter(|_| from_net) {
            Some(l) => {
                searched.push(format!("{} (net plugin library)", l.name()));
                // NCCL looks there silently: a net plugin without a tuner is normal.
                let mut syms: Vec<&str> = SYMBOLS.iter().map(|s| s.0).collect();
                syms.push(ROOT_SYMBOL);
                if l.present(&syms).is_empty() {
                    return Ok((None, Outcome::NotFound { searched }));
                }
                l
            }
            None => return Ok((None, Outcome::NotFound { searched })),
        },
    };
    match CTuner::open(&lib, abi) {
        Ok(t) => {
            info!(target: "oxccl::init|tuning",
                "loaded tuner plugin {} from {} ({})", t.name, lib.name(), t.loaded_as());
            // `oxccl info` prefixes a C version with its symbol's stem.
            let version = if t.is_stable() {
                t.loaded_as()
            } else {
                format!("v{}", t.version)
            };
            Ok((
                Some(Arc::new(t)),
                Outcome::Loaded {
                    library: lib.name().to_string(),
                    version,
                    searched,
                },
            ))
        }
        Err((found, reason)) => {
            warn!(target: "oxccl::init|tuning", "{}; no tuner", refused(lib.name(), &found, &reason));
            Ok((
                None,
                Outcome::Refused {
                    library: lib.name().to_string(),
                    reason,
                    searched,
                },
            ))
        }
    }
}

/// The process's tuner, loaded once (as NCCL shares one tuner library
/// between communicators).
pub fn shared(setting: Option<&str>) -> Result<Option<Arc<CTuner>>> {
    static TUNER: OnceLock<Option<Arc<CTuner>>> = OnceLock::new();
    if let Some(t) = TUNER.get() {
        return Ok(t.clone());
    }
    let (t, _) = load(setting, crate::plugin::net::opened_library())?;
    Ok(TUNER.get_or_init(|| t).clone())
}

/// A tuner bound to one communicator.
pub struct TunerComm {
    tuner: Arc<CTuner>,
    ctx: Ctx,
    /// (collective, log2 of size) already logged at INFO.
    logged: Mutex<HashSet<(&'static str, u32)>>,
}

impl TunerComm {
    /// The tuner of a new communicator; `None` (with one WARN line) when its
    /// `init` fails, as NCCL then runs without it.
    pub fn new(
        tuner: Arc<CTuner>,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
    ) -> Option<TunerComm> {
        match tuner.init(comm_id, nranks, nnodes, crate::plugin::ffi_log::logger()) {
            Ok(ctx) => Some(TunerComm {
                tuner,
                ctx,
                logged: Mutex::default(),
            }),
            Err(e) => {
                warn!(target: "oxccl::tuning", "tuner plugin {}: {e}; no tuner for this communicator", tuner.name);
                None
            }
        }
    }

    /// Lets the tuner change `table` and `nchannels` for one collective. A
    /// tuner error keeps the table as it was (NCCL's behaviour).
    pub fn tune(&self, coll: Coll, bytes: usize, table: &mut CostTable, nchannels: &mut i32) {
        let before = *table;
        if let Err(e) = self
            .tuner
            .get_coll_info(&self.ctx, func(coll), bytes, table, nchannels)
        {
            warn!(target: "oxccl::tuning", "tuner plugin {}: {e}; keeping the cost model's choice", self.tuner.name);
            *table = before;
        }
    }

    /// True the first time a (collective, size bucket) is seen: its decision
    /// is logged once at INFO.
    pub fn first_time(&self, coll: Coll, bytes: usize) -> bool {
        let bucket = usize::BITS - bytes.leading_zeros();
        self.logged
            .lock()
            .map(|mut s| s.insert((coll.name(), bucket)))
            .unwrap_or(false)
    }

    pub fn name(&self) -> &str {
        &self.tuner.name
    }
}

impl Drop for TunerComm {
    fn drop(&mut self) {
        self.tuner.finalize(&self.ctx);
    }
}

fn func(coll: Coll) -> oxccl_plugin::ffi::Func {
    use oxccl_plugin::ffi::*;
    match coll {
        Coll::AllReduce => NCCL_FUNC_ALL_REDUCE,
        Coll::Broadcast { .. } => NCCL_FUNC_BROADCAST,
        Coll::Reduce { .. } => NCCL_FUNC_REDUCE,
        Coll::AllGather => NCCL_FUNC_ALL_GATHER,
        Coll::ReduceScatter => NCCL_FUNC_REDUCE_SCATTER,
    }
}

/// The algorithm and channel count for one collective: the executor's cost
/// table (`table`, whose cheapest entry is the executor's own choice
/// `model`), changed by the tuner, the cheapest usable entry taken. The
/// decision is logged at INFO once per (collective, size bucket).
#[allow(
    clippy::too_many_arguments,
    reason = "the inputs of NCCL's getCollInfo"
)]
pub fn decide(
    t: &TunerComm,
    coll: Coll,
    bytes: usize,
    nranks: usize,
    mut table: crate::algo::cost::CostTable,
    model: crate::algo::Algo,
    nchannels: usize,
    max_channels: usize,
) -> (crate::algo::Algo, usize) {
    use crate::algo::cost;
    let mut nch = nchannels as i32;
    t.tune(coll, bytes, &mut table, &mut nch);
    let (algo, proto) = cost::pick(&table, coll).unwrap_or((model, 2));
    // A tuner may ask for any count; an executor channel is a thread and a
    // slice of the buffer, so at most one per element and a sane ceiling.
    let nch = if nch > 0 {
        (nch as usize).min(max_channels)
    } else {
        nchannels
    }
    .max(1);
    if t.first_time(coll, bytes) {
        let proto = ["LL", "LL128", "SIMPLE"].get(proto).copied().unwrap_or("?");
        info!(target: "oxccl::tuning",
            "tuner {}: {} of {bytes} B on {nranks} ranks -> {} (NCCL row {}, protocol {proto}, run as SIMPLE), {nch} channel(s); the model alone chose {}",
            t.name(), coll.name(), algo.name(), cost::nccl_row(algo), model.name());
    }
    (algo, nch)
}
