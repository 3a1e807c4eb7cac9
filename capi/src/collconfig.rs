//! NCCL 2.31's per-call configuration (`ncclCollConfig_t`) read into
//! oxccl's [`CallOptions`], field by field:
//!
//! - `size`, `magic`, `version`: checked; a config not made with
//!   `NCCL_COLLCONFIG_INITIALIZER` is refused, saying so.
//! - `minCTAs`, `maxCTAs`: narrow the communicator's CTA (channel) bounds
//!   for this call; the maximum never exceeds the communicator's, a
//!   minimum above the maximum is dropped, values outside 1..=128 are
//!   ignored and NCCL_MIN_CTAS / NCCL_MAX_CTAS, where set, win (NCCL's
//!   order: environment, then the call, then the communicator). All-to-all,
//!   gather and scatter run as grouped sends and receives: their kernels
//!   take the bounds too, as long as the group's messages of a size all
//!   carry the same (see `oxccl::comm::on_device`).
//! - `algSelection`, `forceAlgSelection`: NCCL's selection grammar; the
//!   RING and TREE rows are oxccl's ring and trees, and their protocol
//!   suffix (`_LL`, `_SIMPLE`) holds the call to that protocol on the GPU
//!   path where the entries left name one; LL128 alone is refused when
//!   forced (oxccl has LL and Simple), else falls back. A selection left with
//!   neither for the collective is an error naming it when forced, else
//!   the call falls back to the automatic choice (an INFO says so).
//! - `cgaClusterSize`: the CTAs per thread-block cluster of the call's
//!   kernels (0..=8; outside, ignored with an INFO), as NCCL.
//! - `CTAPolicy`: checked as NCCL checks it; the call runs with the
//!   DEFAULT policy (a WARN says so once).
//! - `nvlsCTAs`: accepted; a WARN says once that oxccl runs no NVLS.
//! - `ext`: vendor options, ignored as NCCL ignores them (an INFO says so).
//! - `userProfilerTag`: read into [`PerCall::user_tag`], which becomes the
//!   call's `Op::user_tag`, delivered to a v7 profiler plugin.

use std::os::raw::c_int;
use std::sync::Once;

use oxccl::algo::Algo;
use oxccl::exec::device::config::MAX_CHANNELS;
use oxccl::transport::layout::Proto;
use oxccl::{CallOptions, Error};

use crate::types::*;

/// The smallest `ncclCollConfig_t` there is: 2.31's (`ncclCollConfig_v23100`).
const V23100_BYTES: usize = std::mem::size_of::<ncclCollConfig_t>();

/// The collectives of the `nccl*Config` calls, by NCCL's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
}

impl Func {
    fn name(self) -> &'static str {
        match self {
            Func::AllReduce => "AllReduce",
            Func::Broadcast => "Broadcast",
            Func::Reduce => "Reduce",
            Func::AllGather => "AllGather",
            Func::ReduceScatter => "ReduceScatter",
            Func::AlltoAll => "AlltoAll",
            Func::Gather => "Gather",
            Func::Scatter => "Scatter",
        }
    }

    /// Runs on the ring and trees (the others are grouped sends and
    /// receives, in NCCL as in oxccl).
    fn on_rings(self) -> bool {
        !matches!(self, Func::AlltoAll | Func::Gather | Func::Scatter)
    }
}

/// What one call asks for beyond the plain call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PerCall {
    pub call: CallOptions,
    /// `userProfilerTag`: 0 is untagged.
    pub user_tag: u64,
}

/// One entry of NCCL 2.31's algorithm registry: its name (a selection's
/// tags match names from their start), the collectives it serves, and the
/// oxccl algorithm row that runs it, if any.
struct Entry {
    name: &'static str,
    funcs: &'static [Func],
    ours: Option<Algo>,
}

const AR: &[Func] = &[Func::AllReduce];
const AG: &[Func] = &[Func::AllGather];
const RS: &[Func] = &[Func::ReduceScatter];
const AR_AG_RS: &[Func] = &[Func::AllReduce, Func::AllGather, Func::ReduceScatter];
const AG_RS: &[Func] = &[Func::AllGather, Func::ReduceScatter];
const RINGS: &[Func] = &[
    Func::AllReduce,
    Func::AllGather,
    Func::ReduceScatter,
    Func::Broadcast,
    Func::Reduce,
];

const fn e(name: &'static str, funcs: &'static [Func], ours: Option<Algo>) -> Entry {
    Entry { name, funcs, ours }
}

/// The names NCCL 2.31.2 accepts, with the collectives each serves.
const REGISTRY: &[Entry] = &[
    e("TREE_LL", AR, Some(Algo::Tree)),
    e("TREE_LL128", AR, Some(Algo::Tree)),
    e("TREE_SIMPLE", AR, Some(Algo::Tree)),
    e("RING_LL", RINGS, Some(Algo::Ring)),
    e("RING_LL128", RINGS, Some(Algo::Ring)),
    e("RING_SIMPLE", RINGS, Some(Algo::Ring)),
    e("COLLNET_DIRECT_SIMPLE", AR_AG_RS, None),
    e("COLLNET_CHAIN_SIMPLE", AR, None),
    e("NVLS_SIMPLE", AR_AG_RS, None),
    e("NVLSTREE_SIMPLE", AR, None),
    e("PAT_SIMPLE", AG_RS, None),
    e("SYMK_AGxLL_R", AR, None),
    e("SYMK_AGxLLMC_R", AR, None),
    e("SYMK_RSxTmaLD_AGxTmaST", AR, None),
    e("SYMK_RSxLD_AGxST", AR, None),
    e("SYMK_RSxLDMC_AGxSTMC", AR, None),
    e("SYMK_LL", AG, None),
    e("SYMK_LLMC", AG, None),
    e("SYMK_TmaST", AG, None),
    e("SYMK_ST", AG, None),
    e("SYMK_TmaSTMC", AG, None),
    e("SYMK_STMC", AG, None),
    e("SYMK_RailRing_LsaSTMC", AG, None),
    e("SYMK_LL", RS, None),
    e("SYMK_TmaLD", RS, None),
    e("SYMK_LD", RS, None),
    e("SYMK_LDMC", RS, None),
    e("SYMK_RailA2A_LsaLD", RS, None),
    e("SYMK_RailA2A_LsaLDMC", RS, None),
];

/// The registry entries a selection names, one bit each, or why it does
/// not parse. Grammar (NCCL's): terms separated by `,` are united, factors
/// joined by `+` intersected, a factor `^tag` is every entry but tag's; a
/// tag names every entry whose name starts with it (any case); blanks are
/// ignored.
pub(crate) fn parse_selection(sel: &str) -> Result<u64, String> {
    let all: u64 = (1u64 << REGISTRY.len()) - 1;
    let tag_mask = |tag: &str| -> u64 {
        REGISTRY
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.name.len() >= tag.len() && e.name[..tag.len()].eq_ignore_ascii_case(tag)
            })
            .fold(0, |m, (i, _)| m | 1 << i)
    };
    let s: String = sel.chars().filter(|c| !c.is_whitespace()).collect();
    let mut mask = 0;
    for term in s.split(',').filter(|t| !t.is_empty()) {
        let mut t = all;
        let mut factors = 0;
        for factor in term.split('+').filter(|f| !f.is_empty()) {
            let (neg, tag) = match factor.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, factor),
            };
            if tag.is_empty() {
                return Err(format!("a bare '^' in term {term:?}"));
            }
            let m = tag_mask(tag);
            if m == 0 {
                return Err(format!("{tag:?} names no algorithm NCCL 2.31 knows"));
            }
            t &= if neg { all & !m } else { m };
            factors += 1;
        }
        if factors == 0 {
            return Err(format!("term {term:?} names nothing"));
        }
        if t == 0 {
            return Err(format!("term {term:?} leaves no algorithm"));
        }
        mask |= t;
    }
    Ok(mask)
}

/// What a selection leaves this collective in oxccl: `Ok(None)` for the
/// automatic choice (nothing asked, or both rows), `Ok(Some(row))` for one
/// row, `Err(why)` where nothing oxccl runs is left.
fn select(sel: &str, func: Func) -> Result<Option<Algo>, String> {
    let mask = parse_selection(sel)?;
    let named = |i: usize| mask & (1 << i) != 0;
    let for_func: Vec<&Entry> = REGISTRY
        .iter()
        .enumerate()
        .filter(|(i, e)| named(*i) && e.funcs.contains(&func))
        .map(|(_, e)| e)
        .collect();
    if for_func.is_empty() {
        return Err(format!("none of it serves {}", func.name()));
    }
    let rows: Vec<Algo> = for_func.iter().filter_map(|e| e.ours).collect();
    match rows.as_slice() {
        [first, rest @ ..] if rest.iter().all(|r| r == first) => Ok(Some(*first)),
        [_, ..] => Ok(None),
        [] => Err(format!(
            "oxccl runs none of {}: of NCCL's algorithms it has RING and TREE",
            for_func
                .iter()
                .map(|e| e.name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The protocol a selection holds `func` to, from the entries it leaves
/// that oxccl runs (RING_*, TREE_*; their suffix is the protocol):
/// `Ok(Some)` where those name one protocol oxccl has (LL128 among others
/// is dropped), `Ok(None)` where they name LL and SIMPLE both, or none is
/// left; `Err(why)` where they name LL128 only, which oxccl lacks.
fn protocol(sel: &str, func: Func) -> Result<Option<Proto>, String> {
    let mask = parse_selection(sel)?;
    let mut protos: Vec<&str> = REGISTRY
        .iter()
        .enumerate()
        .filter(|(i, e)| mask & (1 << i) != 0 && e.funcs.contains(&func) && e.ours.is_some())
        .filter_map(|(_, e)| e.name.rsplit('_').next())
        .collect();
    protos.sort_unstable();
    protos.dedup();
    if protos == ["LL128"] {
        return Err(format!(
            "it holds {} to the LL128 protocol, which oxccl does not have (its protocols are LL and Simple)",
            func.name()
        ));
    }
    protos.retain(|p| *p != "LL128");
    Ok(match protos.as_slice() {
        ["LL"] => Some(Proto::Ll),
        ["SIMPLE"] => Some(Proto::Simple),
        _ => None,
    })
}

fn once(flag: &'static Once, f: impl FnOnce()) {
    flag.call_once(f);
}

/// Reads `config` for a call of `func` on `comm`; NULL is the plain call.
pub(crate) fn read(
    config: *const ncclCollConfig_t,
    comm: &oxccl::Comm,
    func: Func,
) -> Result<PerCall, Error> {
    let mut out = PerCall::default();
    if config.is_null() {
        return Ok(out);
    }
    let bad = |m: String| {
        Err(Error::InvalidArgument(format!(
            "ncclCollConfig_t {m}: initialise it with NCCL_COLLCONFIG_INITIALIZER"
        )))
    };
    // SAFETY: non-null; `size`, `magic` and `version` open every version
    // of the struct, so the first 16 bytes are there.
    let (size, magic, version) = unsafe { ((*config).size, (*config).magic, (*config).version) };
    if size < V23100_BYTES {
        return bad(format!(
            "size is {size}, smaller than NCCL 2.31's {V23100_BYTES} bytes"
        ));
    }
    if magic != NCCL_API_MAGIC {
        return bad(format!(
            "magic is {magic:#x}, not NCCL_API_MAGIC ({NCCL_API_MAGIC:#x})"
        ));
    }
    if version < 23100 {
        return bad(format!(
            "version is {version}: the struct first appeared in NCCL 2.31 (23100)"
        ));
    }
    // SAFETY: `size` covers 2.31's struct (checked); a newer, longer one
    // keeps these fields at these offsets and is read only this far.
    let c = unsafe { *config };
    let undef = c_int::MIN;
    let int = |v: c_int| (v != undef).then_some(v);

    if !c.ext.is_null() {
        static EXT: Once = Once::new();
        once(
            &EXT,
            || tracing::info!(target: "oxccl::coll", "ncclCollConfig_t ext: vendor options are ignored, as NCCL ignores them"),
        );
    }
    if c.forceAlgSelection != 0 && c.forceAlgSelection != 1 {
        return Err(Error::InvalidArgument(format!(
            "ncclCollConfig_t forceAlgSelection is {}: it must be 0 or 1",
            c.forceAlgSelection
        )));
    }
    if let Some(p) = int(c.CTAPolicy) {
        let known = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
        if p < 0 || p & !known != 0 {
            return Err(Error::InvalidArgument(format!(
                "ncclCollConfig_t CTAPolicy is {p}: NCCL_CTA_POLICY_DEFAULT (0), _EFFICIENCY (1), _ZERO (2) or both (3)"
            )));
        }
        if p != NCCL_CTA_POLICY_DEFAULT {
            static POLICY: Once = Once::new();
            once(
                &POLICY,
                || tracing::warn!(target: "oxccl::coll", "ncclCollConfig_t CTAPolicy {p} is not implemented by oxccl and runs as DEFAULT: the CTA count is the default one within minCTAs and maxCTAs; no zero-CTA (copy-engine) collectives"),
            );
        }
    }
    if let Some(n) = int(c.cgaClusterSize) {
        if !(0..=8).contains(&n) {
            tracing::info!(target: "oxccl::coll", "ncclCollConfig_t cgaClusterSize {n} is ignored: out of bounds 0..=8");
        } else {
            out.call.cluster = Some(n as u32);
        }
    }
    if let Some(n) = int(c.nvlsCTAs) {
        static NVLS: Once = Once::new();
        once(
            &NVLS,
            || tracing::warn!(target: "oxccl::coll", "ncclCollConfig_t nvlsCTAs {n} is accepted and ignored: oxccl runs no NVLS (NVLink SHARP) algorithm, since NVLink multicast is not used on its machines"),
        );
    }

    // CTA bounds: environment, then the call, then the communicator.
    let max_ch = MAX_CHANNELS as c_int;
    let ctas = |v: c_int, field: &str, var: &str| -> Option<usize> {
        let v = int(v)?;
        if !(1..=max_ch).contains(&v) {
            tracing::info!(target: "oxccl::coll", "ncclCollConfig_t {field} {v} is ignored: out of bounds 1..={max_ch}");
            return None;
        }
        if let Some(e) = oxccl::config::var(var).filter(|e| !e.trim().is_empty()) {
            tracing::info!(target: "oxccl::coll", "ncclCollConfig_t {field} {v} is ignored: {var}={e} holds");
            return None;
        }
        Some(v as usize)
    };
    let mut min = ctas(c.minCTAs, "minCTAs", "NCCL_MIN_CTAS");
    let mut max = ctas(c.maxCTAs, "maxCTAs", "NCCL_MAX_CTAS");
    if min.is_some() || max.is_some() {
        let (_, comm_max) = comm.cta_bounds()?;
        if let Some(m) = max.filter(|&m| m > comm_max) {
            tracing::info!(target: "oxccl::coll", "ncclCollConfig_t maxCTAs {m} is above the communicator's maxCTAs {comm_max}: the call runs on at most {comm_max}");
            max = Some(comm_max);
        }
        let top = max.unwrap_or(comm_max);
        if let Some(m) = min.filter(|&m| m > top) {
            tracing::info!(target: "oxccl::coll", "ncclCollConfig_t minCTAs {m} is above the call's maxCTAs {top} and is dropped");
            min = None;
        }
        if !func.on_rings() {
            tracing::debug!(target: "oxccl::coll", "ncclCollConfig_t minCTAs/maxCTAs: {} runs as grouped sends and receives, whose kernels take the bounds (every rank of the call must pass the same)", func.name());
        }
    }
    out.call.min_ctas = min;
    out.call.max_ctas = max;

    let sel = crate::comm::c_str(c.algSelection).unwrap_or_default();
    if !sel.trim().is_empty() {
        match select(&sel, func) {
            Ok(algo) => {
                if let Some(a) = algo {
                    tracing::debug!(target: "oxccl::coll", "algSelection {sel:?}: {} runs on {}", func.name(), a.name());
                }
                out.call.algo = algo;
                match protocol(&sel, func) {
                    Ok(p) => out.call.proto = p,
                    Err(why) if c.forceAlgSelection == 1 => {
                        return Err(Error::InvalidArgument(format!(
                            "ncclCollConfig_t algSelection {sel:?} cannot be honoured: {why} (set forceAlgSelection=0 to fall back to the automatic choice)"
                        )))
                    }
                    Err(why) => {
                        tracing::info!(target: "oxccl::coll", "ncclCollConfig_t algSelection {sel:?}: {why}; the protocol falls back to the automatic choice")
                    }
                }
            }
            Err(why) if c.forceAlgSelection == 1 => {
                return Err(Error::InvalidArgument(format!(
                    "ncclCollConfig_t algSelection {sel:?} cannot be honoured for {}: {why} (set forceAlgSelection=0 to fall back to the automatic choice)",
                    func.name()
                )))
            }
            Err(why) => {
                tracing::info!(target: "oxccl::coll", "ncclCollConfig_t algSelection {sel:?} cannot be honoured for {}: {why}; falling back to the automatic choice", func.name())
            }
        }
    }

    out.user_tag = c.userProfilerTag;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_as_nccl_parses_them() {
        let bit = |name: &str| 1u64 << REGISTRY.iter().position(|e| e.name == name).unwrap();
        assert_eq!(parse_selection("ring").unwrap().count_ones(), 3);
        assert_eq!(parse_selection("RING_SIMPLE").unwrap(), bit("RING_SIMPLE"));
        // "ring_ll" names RING_LL128 too (a prefix).
        assert_eq!(
            parse_selection(" ring + ^ring_ll ").unwrap(),
            bit("RING_SIMPLE")
        );
        assert_eq!(
            parse_selection("ring+^ring_ll128").unwrap(),
            bit("RING_LL") | bit("RING_SIMPLE")
        );
        // "NVLS" spans NVLS_SIMPLE and NVLSTREE_SIMPLE; "RING" not SYMK_RailRing.
        assert_eq!(
            parse_selection("nvls").unwrap(),
            bit("NVLS_SIMPLE") | bit("NVLSTREE_SIMPLE")
        );
        assert!(parse_selection("fast").is_err());
        assert!(parse_selection("ring+tree").is_err(), "empty intersection");
        assert!(parse_selection("^").is_err());
        assert!(parse_selection("+").is_err());
    }

    #[test]
    fn selections_map_onto_oxccls_algorithms() {
        assert_eq!(select("RING", Func::AllReduce), Ok(Some(Algo::Ring)));
        assert_eq!(select("tree_ll", Func::AllReduce), Ok(Some(Algo::Tree)));
        assert_eq!(select("ring,tree", Func::AllReduce), Ok(None));
        // NVLS is not ours; the ring part of the selection is.
        assert_eq!(select("ring,nvls", Func::AllGather), Ok(Some(Algo::Ring)));
        // Only the ring serves broadcast; nothing serves all-to-all.
        assert!(select("tree", Func::Broadcast).is_err());
        assert!(select("ring", Func::AlltoAll).is_err());
        // The protocol is the entries' suffix; LL128 is not oxccl's.
        assert_eq!(protocol("RING_LL", Func::AllReduce), Ok(Some(Proto::Ll)));
        assert_eq!(
            protocol("ring_simple,tree_simple", Func::AllReduce),
            Ok(Some(Proto::Simple))
        );
        assert_eq!(
            protocol("ring", Func::AllReduce),
            Ok(None),
            "LL and SIMPLE both"
        );
        assert_eq!(
            protocol("ring+^ring_simple", Func::AllReduce),
            Ok(Some(Proto::Ll)),
            "LL128 dropped"
        );
        assert_eq!(
            protocol("tree,ring_ll", Func::Broadcast),
            Ok(Some(Proto::Ll)),
            "trees do not broadcast"
        );
        let e = protocol("RING_LL128", Func::AllGather).unwrap_err();
        assert!(e.contains("LL128"), "{e}");
        let e = select("NVLS", Func::AllReduce).unwrap_err();
        assert!(
            e.contains("NVLS_SIMPLE") && e.contains("RING and TREE"),
            "{e}"
        );
    }
}
