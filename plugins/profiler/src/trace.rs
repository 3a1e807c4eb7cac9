//! The Chrome/Perfetto trace file ("Trace Event Format", JSON object form):
//! one "X" (complete) event per record, ts/dur in microseconds, pid = rank,
//! tid = thread. Written once, at finalize, so serde_json costs nothing on
//! the hot path.
//!
//! Each event carries `args.id` and, when its parent was recorded,
//! `args.parent`. Viewers nest "X" events by time within one tid and
//! misdraw partial overlaps, while a collective's proxy ops and steps run
//! concurrently and on other threads; so an event goes on its parent's
//! track when the innermost event open there is its parent, else on the
//! first extra track ("proxy N") with nothing open, and `args.thread`
//! keeps the thread it ran on.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::record::Record;

/// Where a communicator's trace goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// `OXCCL_PROFILER_DIR`: `<dir>/oxccl-trace-<host>-<pid>-rank<r>.json`.
    Dir(PathBuf),
    /// `NCCL_PROFILE_DUMP_FILE`: `<prefix>-<rank>.json`, as NCCL's example.
    Prefix(String),
}

impl Output {
    /// From the environment; the current directory when neither is set.
    pub fn from_env() -> Self {
        if let Some(d) = std::env::var_os("OXCCL_PROFILER_DIR").filter(|v| !v.is_empty()) {
            return Output::Dir(d.into());
        }
        if let Ok(p) = std::env::var("NCCL_PROFILE_DUMP_FILE") {
            if !p.is_empty() {
                return Output::Prefix(p);
            }
        }
        Output::Dir(PathBuf::from("."))
    }

    /// The file of `rank`; `comm` tells apart communicators of one rank.
    pub fn path(&self, rank: i32, comm: Option<u64>) -> PathBuf {
        let extra = comm.map(|c| format!("-comm{c}")).unwrap_or_default();
        match self {
            Output::Dir(d) => d.join(format!(
                "oxccl-trace-{}-{}-rank{rank}{extra}.json",
                hostname(),
                std::process::id()
            )),
            Output::Prefix(p) => PathBuf::from(format!("{p}-{rank}{extra}.json")),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

/// Extra tracks are numbered from here, above any thread number.
const EXTRA_TID: u64 = 1 << 20;

/// Where one record goes in the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    pub tid: u64,
    /// The parent's `seq`, when the parent was recorded.
    pub parent: Option<u64>,
}

struct Track {
    tid: u64,
    /// Open intervals (start, end, record), outermost first.
    open: Vec<(u64, u64, usize)>,
}

impl Track {
    /// The innermost event still open at `start`.
    fn top_at(&mut self, start: u64) -> Option<(u64, u64, usize)> {
        while self.open.last().is_some_and(|&(_, e, _)| e <= start) {
            self.open.pop();
        }
        self.open.last().copied()
    }

    /// Whether `[start, end)` of a child of `parent` shows nested right
    /// under it here (a root: under whatever contains it, or alone).
    fn fits(&mut self, start: u64, end: u64, parent: Option<usize>) -> bool {
        match (self.top_at(start), parent) {
            (None, _) => true,
            (Some((_, e, i)), Some(p)) => i == p && end <= e,
            (Some((s, e, _)), None) => s <= start && end <= e,
        }
    }
}

/// Parents and tracks of `records`, given in start order. A parent is the
/// latest record started before the child whose handle is the child's
/// parent handle (handles are addresses, reused only once freed).
pub fn layout(records: &[Record]) -> Vec<Placed> {
    let mut out = Vec::with_capacity(records.len());
    let mut by_handle: HashMap<usize, usize> = HashMap::new();
    let mut tracks: Vec<Track> = Vec::new();
    let mut thread_track: HashMap<u32, usize> = HashMap::new();
    let mut extra: Vec<usize> = Vec::new();
    let mut track_of: Vec<usize> = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let (start, end) = (r.start_ns, r.start_ns + r.dur_ns);
        let parent = (r.parent != 0)
            .then(|| by_handle.get(&r.parent).copied())
            .flatten();
        if r.handle != 0 {
            by_handle.insert(r.handle, i);
        }
        let home = match parent {
            Some(p) => track_of[p],
            None => *thread_track.entry(r.tid).or_insert_with(|| {
                tracks.push(Track {
                    tid: u64::from(r.tid),
                    open: Vec::new(),
                });
                tracks.len() - 1
            }),
        };
        let t = if tracks[home].fits(start, end, parent) {
            home
        } else if let Some(&t) = extra.iter().find(|&&t| tracks[t].top_at(start).is_none()) {
            t
        } else {
            tracks.push(Track {
                tid: EXTRA_TID + extra.len() as u64,
                open: Vec::new(),
            });
            extra.push(tracks.len() - 1);
            tracks.len() - 1
        };
        tracks[t].open.push((start, end, i));
        track_of.push(t);
        out.push(Placed {
            tid: tracks[t].tid,
            parent: parent.map(|p| records[p].seq),
        });
    }
    out
}

fn event(r: &Record, at: Placed) -> Value {
    let mut args = Map::new();
    args.insert("op".into(), json!(r.name));
    args.insert("id".into(), json!(r.seq));
    if let Some(p) = at.parent {
        args.insert("parent".into(), json!(p));
    }
    if at.tid != u64::from(r.tid) {
        args.insert("thread".into(), json!(r.tid));
    }
    let a = &r.args;
    if let Some(v) = a.count {
        args.insert("count".into(), json!(v));
    }
    if let Some(v) = &a.dtype {
        args.insert("dtype".into(), json!(v));
    }
    if let Some(v) = a.root {
        args.insert("root".into(), json!(v));
    }
    if let Some(v) = a.peer {
        args.insert("peer".into(), json!(v));
    }
    if let Some(v) = a.seq {
        args.insert("seq".into(), json!(v));
    }
    if let Some(v) = &a.algo {
        args.insert("algo".into(), json!(v));
    }
    if let Some(v) = &a.proto {
        args.insert("proto".into(), json!(v));
    }
    if let Some(v) = a.channels {
        args.insert("channels".into(), json!(v));
    }
    if let Some(v) = a.step {
        args.insert("step".into(), json!(v));
    }
    if let Some(v) = a.bytes {
        args.insert("bytes".into(), json!(v));
    }
    if let Some(v) = a.chunk {
        args.insert("chunk".into(), json!(v));
    }
    if let Some(v) = a.state {
        args.insert("state".into(), json!(v));
    }
    if let Some(v) = a.gpu_start_ns {
        args.insert("gpu_start_ns".into(), json!(v));
    }
    if let Some(v) = a.gpu_stop_ns {
        args.insert("gpu_stop_ns".into(), json!(v));
    }
    if let Some(v) = a.user_tag {
        args.insert("user_tag".into(), json!(v));
    }
    json!({
        "name": r.name,
        "cat": r.cat,
        "ph": "X",
        "ts": r.start_ns as f64 / 1000.0,
        "dur": r.dur_ns as f64 / 1000.0,
        "pid": r.rank,
        "tid": at.tid,
        "args": Value::Object(args),
    })
}

/// The whole trace document of one rank.
pub fn document(rank: i32, comm_name: Option<&str>, records: &[Record]) -> Value {
    let label = match comm_name {
        Some(n) if !n.is_empty() => format!("rank {rank} ({n})"),
        _ => format!("rank {rank}"),
    };
    let placed = layout(records);
    let mut events = Vec::with_capacity(records.len() + 1);
    events.push(json!({
        "name": "process_name", "ph": "M", "pid": rank, "tid": 0,
        "args": { "name": label },
    }));
    let mut extra: Vec<u64> = placed
        .iter()
        .map(|p| p.tid)
        .filter(|&t| t >= EXTRA_TID)
        .collect();
    extra.sort_unstable();
    extra.dedup();
    events.extend(extra.into_iter().map(|t| {
        json!({
            "name": "thread_name", "ph": "M", "pid": rank, "tid": t,
            "args": { "name": format!("proxy {}", t - EXTRA_TID) },
        })
    }));
    events.extend(records.iter().zip(placed).map(|(r, at)| event(r, at)));
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

/// Writes `doc` to `path` (through a temporary file, so a reader never sees
/// half a trace).
pub fn write(path: &Path, doc: &Value) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut f, doc)?;
        f.flush()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{intern, Args};

    fn rec(seq: u64, handle: usize, parent: usize, tid: u32, start: u64, end: u64) -> Record {
        Record {
            ctx: 1,
            seq,
            handle,
            parent,
            rank: 0,
            tid,
            start_ns: start,
            dur_ns: end - start,
            cat: "proxy",
            name: intern("Send"),
            args: Args::default(),
        }
    }

    /// A collective on thread 1 with two overlapping proxy ops run on
    /// thread 2, each with steps; a handle address reused after its event
    /// ended names the later event only.
    #[test]
    fn parents_by_handle_and_tracks_that_nest() {
        let rs = [
            rec(1, 0xa, 0, 1, 0, 100),   // collective
            rec(2, 0xb, 0xa, 2, 10, 80), // send op
            rec(3, 0xc, 0xa, 2, 12, 90), // recv op: overlaps the send op
            rec(4, 0xd, 0xb, 2, 20, 30), // send step
            rec(5, 0xe, 0xc, 2, 25, 40), // recv step
            rec(6, 0xd, 0xb, 2, 35, 50), // send step at a reused address
            rec(7, 0xf, 0xd, 2, 36, 37), // child of the second 0xd
        ];
        let p = layout(&rs);
        let parents: Vec<Option<u64>> = p.iter().map(|x| x.parent).collect();
        assert_eq!(
            parents,
            [None, Some(1), Some(1), Some(2), Some(3), Some(2), Some(6)]
        );
        // The collective stays on its thread; the first op nests there.
        assert_eq!(p[0].tid, 1);
        assert_eq!(p[1].tid, 1);
        // The second op overlaps the first: an extra track, not under it.
        assert_eq!(p[2].tid, EXTRA_TID);
        // Steps right under their op where it is the innermost open event.
        assert_eq!(p[3].tid, 1);
        assert_eq!(p[4].tid, EXTRA_TID);
        // Every track holds properly nested intervals only.
        let mut by_tid: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for (r, at) in rs.iter().zip(&p) {
            by_tid
                .entry(at.tid)
                .or_default()
                .push((r.start_ns, r.start_ns + r.dur_ns));
        }
        for (tid, v) in by_tid {
            for (i, a) in v.iter().enumerate() {
                for b in &v[i + 1..] {
                    let apart = a.1 <= b.0 || b.1 <= a.0;
                    let nested = (a.0 <= b.0 && b.1 <= a.1) || (b.0 <= a.0 && a.1 <= b.1);
                    assert!(apart || nested, "track {tid}: {a:?} and {b:?} overlap");
                }
            }
        }
    }
}
