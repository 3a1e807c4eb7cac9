//! A profiler plugin for oxccl and NCCL: records the events NCCL reports
//! (groups, collectives, point-to-point by default; `NCCL_PROFILE_EVENT_MASK`
//! for more, e.g. 0x1f adds proxy ops and steps) into per-thread buffers
//! and, at finalize, writes one Chrome/Perfetto trace per rank, each event
//! linked to its parent (a proxy step under its proxy op, under its
//! collective, under its group). When an NVTX tool is attached (Nsight
//! Systems, through `NVTX_INJECTION64_PATH`) it also opens NVTX3 ranges.
//! Built as a cdylib exporting `ncclProfiler_v1` … `_v7`; through v7 a
//! call's tag (NCCL 2.31's `userProfilerTag`) shows as `user_tag` on its
//! events, and kernel phases as events below their kernel channel.

pub mod nvtx;
pub mod record;
pub mod trace;

use std::collections::HashSet;
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use oxccl_plugin::profiler::{NCCL_PROFILE_COLL, NCCL_PROFILE_GROUP, NCCL_PROFILE_P2P};
use oxccl_plugin::{
    Event, EventKind, NcclLogger, PluginError, PluginResult, Profiler, ProfilerInit, StateArgs,
    StateUpdate,
};

use record::{intern, next_seq, now_ns, thread_id, Args, Name, Record};
pub use trace::Output;

/// The mask when `NCCL_PROFILE_EVENT_MASK` is unset: what a trace of the
/// application's operations needs, without the per-step proxy flood.
pub const DEFAULT_MASK: i32 = NCCL_PROFILE_GROUP | NCCL_PROFILE_COLL | NCCL_PROFILE_P2P;

/// The activation mask from `NCCL_PROFILE_EVENT_MASK` (decimal or 0x hex).
pub fn mask_from_env() -> Result<i32, PluginError> {
    match std::env::var("NCCL_PROFILE_EVENT_MASK") {
        Err(_) => Ok(DEFAULT_MASK),
        Ok(v) => parse_mask(&v).ok_or_else(|| {
            PluginError::InvalidUsage(format!(
                "NCCL_PROFILE_EVENT_MASK={v:?} is not a number; use NCCL_PROFILE_* bits, e.g. 7 (group|coll|p2p) or 0x1f"
            ))
        }),
    }
}

fn parse_mask(v: &str) -> Option<i32> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => i32::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

static NEXT_CTX: AtomicU64 = AtomicU64::new(1);
/// Files written by this process: a second communicator of the same rank
/// gets its own file instead of overwriting the first.
static WRITTEN: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// State shared by a communicator's profiler and its open events.
struct Shared {
    id: u64,
    /// From `init` (v4+) or the first event (v1 to v3 pass no rank to init).
    rank: AtomicI32,
    /// The activation mask this plugin asked for. NCCL also starts the
    /// parents of wanted events (a collective for its proxy ops, with the
    /// proxy bits alone); those are not recorded.
    mask: i32,
}

/// The profiler of one communicator.
pub struct TraceProfiler {
    shared: Arc<Shared>,
    comm_name: Option<String>,
    output: Output,
    logger: NcclLogger,
}

/// An event between start and stop.
pub struct OpenEvent {
    shared: Arc<Shared>,
    seq: u64,
    parent: usize,
    start_ns: u64,
    tid: u32,
    cat: &'static str,
    name: Name,
    args: Args,
    nvtx: Option<nvtx::NvtxRange>,
}

impl TraceProfiler {
    /// A profiler writing to `output`, recording the events of `mask`.
    pub fn new(args: &ProfilerInit, output: Output, mask: i32) -> Self {
        TraceProfiler {
            shared: Arc::new(Shared {
                id: NEXT_CTX.fetch_add(1, Ordering::Relaxed),
                rank: AtomicI32::new(args.rank.unwrap_or(-1)),
                mask,
            }),
            comm_name: args.comm_name.clone(),
            output,
            logger: args.logger,
        }
    }

    /// Writes the trace of everything recorded so far; returns its path.
    pub fn write_trace(&self) -> std::io::Result<PathBuf> {
        let rank = self.shared.rank.load(Ordering::Relaxed).max(0);
        let records = record::drain(self.shared.id);
        let doc = trace::document(rank, self.comm_name.as_deref(), &records);
        let path = {
            let mut w = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
            let set = w.get_or_insert_with(HashSet::new);
            let mut p = self.output.path(rank, None);
            if set.contains(&p) {
                p = self.output.path(rank, Some(self.shared.id));
            }
            set.insert(p.clone());
            p
        };
        trace::write(&path, &doc)?;
        let dropped = record::take_dropped();
        if dropped > 0 {
            self.logger.warn(&format!(
                "oxccl-profiler: {dropped} events dropped (more than {} in a thread's buffer); narrow NCCL_PROFILE_EVENT_MASK",
                record::MAX_PER_THREAD
            ));
        }
        self.logger.info(&format!(
            "oxccl-profiler: {} events of rank {rank} written to {}",
            records.len(),
            path.display()
        ));
        Ok(path)
    }
}

/// An event's length: a kernel channel's as the GPU timed it when NCCL gave
/// both ends (the host only sees when the proxy noticed start and stop),
/// else the host's between start and stop. The event stays placed at its
/// host start: the GPU's globaltimer is another clock.
fn duration(host_start: u64, host_end: u64, args: &Args) -> u64 {
    match (args.gpu_start_ns, args.gpu_stop_ns) {
        (Some(s), Some(e)) if e >= s => e - s,
        _ => host_end.saturating_sub(host_start),
    }
}

/// A call's tag as shown: none for 0 (untagged, and every version before v7).
fn tag(t: u64) -> Option<u64> {
    (t != 0).then_some(t)
}

/// Category, name and arguments of an event; `None` for kinds not traced.
fn describe(kind: &EventKind<'_>) -> Option<(&'static str, Name, Args)> {
    Some(match kind {
        EventKind::Group => ("group", Name::Borrowed("Group"), Args::default()),
        EventKind::GroupApi { depth, .. } => (
            "api",
            Name::Borrowed("GroupApi"),
            Args {
                step: Some(*depth),
                ..Args::default()
            },
        ),
        EventKind::Coll(c) => (
            "coll",
            intern(c.func),
            Args {
                count: Some(c.count),
                dtype: Some(intern(c.datatype)),
                root: Some(c.root),
                seq: Some(c.seq_number),
                algo: Some(intern(c.algo)),
                proto: Some(intern(c.proto)),
                channels: Some(c.n_channels as u32),
                user_tag: tag(c.user_tag),
                ..Args::default()
            },
        ),
        EventKind::P2p(p) => (
            "p2p",
            intern(p.func),
            Args {
                count: Some(p.count),
                dtype: Some(intern(p.datatype)),
                peer: Some(p.peer),
                channels: p.n_channels.map(u32::from),
                user_tag: tag(p.user_tag),
                ..Args::default()
            },
        ),
        EventKind::CollApi(c) => (
            "api",
            intern(c.func),
            Args {
                count: Some(c.count),
                dtype: Some(intern(c.datatype)),
                root: Some(c.root),
                user_tag: tag(c.user_tag),
                ..Args::default()
            },
        ),
        EventKind::P2pApi(p) => (
            "api",
            intern(p.func),
            Args {
                count: Some(p.count),
                dtype: Some(intern(p.datatype)),
                user_tag: tag(p.user_tag),
                ..Args::default()
            },
        ),
        EventKind::KernelLaunch { .. } => {
            ("kernel", Name::Borrowed("KernelLaunch"), Args::default())
        }
        EventKind::ProxyOp(o) => (
            "proxy",
            Name::Borrowed(if o.is_send { "ProxySend" } else { "ProxyRecv" }),
            Args {
                peer: Some(o.peer),
                channels: Some(o.channel_id as u32),
                step: Some(o.n_steps),
                chunk: Some(o.chunk_size),
                ..Args::default()
            },
        ),
        EventKind::ProxyStep { step } => (
            "proxy",
            Name::Borrowed("ProxyStep"),
            Args {
                step: Some(*step),
                ..Args::default()
            },
        ),
        EventKind::ProxyCtrl => ("proxy", Name::Borrowed("ProxyCtrl"), Args::default()),
        EventKind::KernelCh {
            channel_id,
            p_timer,
        } => (
            "kernel",
            Name::Borrowed("KernelChannel"),
            Args {
                channels: Some(*channel_id as u32),
                gpu_start_ns: *p_timer,
                ..Args::default()
            },
        ),
        EventKind::NetPlugin { .. } => ("net", Name::Borrowed("NetPlugin"), Args::default()),
        EventKind::KernelPhase {
            channel_id,
            phase_id,
            phase_name,
            p_timer,
        } => (
            "kernel",
            intern(phase_name),
            Args {
                channels: Some(*channel_id as u32),
                step: Some(i32::from(*phase_id)),
                gpu_start_ns: Some(*p_timer),
                ..Args::default()
            },
        ),
        _ => return None,
    })
}

impl Profiler for TraceProfiler {
    const NAME: &'static CStr = c"oxccl-profiler";
    type Event = OpenEvent;

    fn init(args: &ProfilerInit, activation_mask: &mut i32) -> PluginResult<Self> {
        *activation_mask = mask_from_env()?;
        let p = TraceProfiler::new(args, Output::from_env(), *activation_mask);
        let to = match args.rank {
            Some(r) => p.output.path(r, None).display().to_string(),
            // v1 to v3: the rank is known at the first event.
            None => format!("{:?} (file named at finalize)", p.output),
        };
        args.logger.info(&format!(
            "oxccl-profiler: event mask {:#x}, trace to {to}",
            *activation_mask
        ));
        Ok(p)
    }

    fn start_event(&self, event: &Event<'_>) -> Option<OpenEvent> {
        if self.shared.rank.load(Ordering::Relaxed) < 0 {
            self.shared.rank.store(event.rank, Ordering::Relaxed);
        }
        if event.kind.type_bit() & self.shared.mask as u64 == 0 {
            return None;
        }
        let (cat, name, args) = describe(&event.kind)?;
        let nvtx = match cat {
            "group" | "coll" | "p2p" | "api" => nvtx::get().map(|n| n.start(&name)),
            _ => None,
        };
        Some(OpenEvent {
            shared: self.shared.clone(),
            seq: next_seq(),
            parent: event.parent,
            start_ns: now_ns(),
            tid: thread_id(),
            cat,
            name,
            args,
            nvtx,
        })
    }

    fn stop_event(e: OpenEvent) {
        Self::stop_event_with_handle(e, 0)
    }

    fn stop_event_with_handle(e: OpenEvent, handle: usize) {
        let end = now_ns();
        if let Some(r) = e.nvtx {
            nvtx::end(r);
        }
        record::push(Record {
            ctx: e.shared.id,
            seq: e.seq,
            handle,
            parent: e.parent,
            rank: e.shared.rank.load(Ordering::Relaxed),
            tid: e.tid,
            start_ns: e.start_ns,
            dur_ns: duration(e.start_ns, end, &e.args),
            cat: e.cat,
            name: e.name,
            args: e.args,
        });
    }

    fn record_event_state(e: &mut OpenEvent, u: &StateUpdate) {
        e.args.state = Some(u.state);
        match u.args {
            StateArgs::Transfer { trans_size, .. } if trans_size > 0 => {
                e.args.bytes = Some(trans_size);
            }
            StateArgs::KernelChStop { p_timer } => e.args.gpu_stop_ns = Some(p_timer),
            _ => {}
        }
    }

    fn finalize(self) -> PluginResult<()> {
        self.write_trace().map(|_| ()).map_err(|e| {
            PluginError::System(format!(
                "cannot write the trace ({e}); set OXCCL_PROFILER_DIR to a writable directory"
            ))
        })
    }
}

oxccl_plugin::export_profiler_plugin!(TraceProfiler);

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_plugin::ffi::profiler::NCCL_PROFILER_KERNEL_CH_STOP;
    use oxccl_plugin::ffi::types::NCCL_PROFILE;
    use oxccl_plugin::CollEvent;

    fn coll(seq: u64) -> Event<'static> {
        Event {
            kind: EventKind::Coll(CollEvent {
                seq_number: seq,
                func: "AllReduce",
                count: 1024,
                root: 0,
                datatype: "ncclFloat32",
                algo: "Ring",
                proto: "Simple",
                n_channels: 2,
                n_warps: 8,
                comm_hash: None,
                send_buff: 0,
                recv_buff: 0,
                user_tag: 0,
            }),
            rank: 3,
            parent: 0,
        }
    }

    /// `init`'s arguments as a v1 to v3 NCCL (rank `None`) or a later one
    /// gives them, logging to stderr.
    fn init_args(comm_id: u64, rank: Option<i32>) -> ProfilerInit {
        ProfilerInit {
            comm_id: Some(comm_id),
            comm_name: None,
            n_nodes: None,
            n_ranks: None,
            rank,
            logger: NcclLogger::stderr(NCCL_PROFILE),
        }
    }

    #[test]
    fn masks() {
        assert_eq!(parse_mask("7"), Some(7));
        assert_eq!(parse_mask("0x1f"), Some(31));
        assert_eq!(parse_mask("lots"), None);
    }

    #[test]
    fn two_threads_one_trace_event_per_collective() {
        let dir = std::env::temp_dir().join(format!("oxccl-prof-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let init = init_args(9, None);
        let p = Arc::new(TraceProfiler::new(
            &init,
            Output::Dir(dir.clone()),
            DEFAULT_MASK,
        ));
        let ts: Vec<_> = (0..2u64)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..3 {
                        let e = p.start_event(&coll(t * 10 + i)).unwrap();
                        TraceProfiler::stop_event(e);
                    }
                })
            })
            .collect();
        ts.into_iter().for_each(|t| t.join().unwrap());
        let path = p.write_trace().unwrap();
        assert!(path.to_string_lossy().contains("rank3"), "{path:?}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let xs: Vec<_> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(xs.len(), 6);
        let mut seqs: Vec<u64> = xs
            .iter()
            .map(|e| e["args"]["seq"].as_u64().unwrap())
            .collect();
        seqs.sort();
        assert_eq!(seqs, [0, 1, 2, 10, 11, 12]);
        assert!(xs.iter().all(|e| e["pid"] == 3 && e["name"] == "AllReduce"));
        assert_eq!(xs[0]["args"]["dtype"], "ncclFloat32");
        let tids: HashSet<u64> = xs.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
        assert_eq!(tids.len(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A kernel channel with both GPU timers lasts as long as the GPU says
    /// (here much longer than the host saw), and keeps both timers in its
    /// args; without the stop timer (v3 gives none) it keeps host time.
    #[test]
    fn kernel_channel_duration_is_the_gpu_one() {
        use oxccl_plugin::profiler::NCCL_PROFILE_KERNEL_CH;
        let dir = std::env::temp_dir().join(format!("oxccl-prof-kch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let init = init_args(1, Some(5));
        let p = TraceProfiler::new(&init, Output::Dir(dir.clone()), NCCL_PROFILE_KERNEL_CH);
        let kch = |channel_id, p_timer| Event {
            kind: EventKind::KernelCh {
                channel_id,
                p_timer,
            },
            rank: 5,
            parent: 0,
        };
        let gpu_start = 1_700_000_000_000_000_000u64;
        let mut e = p.start_event(&kch(2, Some(gpu_start))).unwrap();
        TraceProfiler::record_event_state(
            &mut e,
            &StateUpdate {
                state: NCCL_PROFILER_KERNEL_CH_STOP,
                args: StateArgs::KernelChStop {
                    p_timer: gpu_start + 250_000_000,
                },
            },
        );
        TraceProfiler::stop_event(e);
        let e = p.start_event(&kch(3, None)).unwrap();
        TraceProfiler::stop_event(e);

        let path = p.write_trace().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let xs: Vec<_> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(xs.len(), 2);
        let timed = xs.iter().find(|e| e["args"]["channels"] == 2).unwrap();
        assert_eq!(timed["name"], "KernelChannel");
        assert_eq!(timed["args"]["gpu_start_ns"], gpu_start);
        assert_eq!(timed["args"]["gpu_stop_ns"], gpu_start + 250_000_000);
        assert_eq!(timed["args"]["state"], NCCL_PROFILER_KERNEL_CH_STOP);
        // 250 ms in µs: the GPU's, not the few µs between the host calls.
        assert_eq!(timed["dur"].as_f64(), Some(250_000.0));
        let untimed = xs.iter().find(|e| e["args"]["channels"] == 3).unwrap();
        assert!(untimed["args"].get("gpu_start_ns").is_none());
        assert!(untimed["args"].get("gpu_stop_ns").is_none());
        assert!(untimed["dur"].as_f64().unwrap() < 250_000.0);
        std::fs::remove_dir_all(&dir).ok();
    }
}
