//! The Chrome/Perfetto trace file ("Trace Event Format", JSON object form):
//! one "X" (complete) event per record, ts/dur in microseconds, pid = rank,
//! tid = thread. Written once, at finalize, so serde_json costs nothing on
//! the hot path.

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

fn event(r: &Record) -> Value {
    let mut args = Map::new();
    args.insert("op".into(), json!(r.name));
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
    json!({
        "name": r.name,
        "cat": r.cat,
        "ph": "X",
        "ts": r.start_ns as f64 / 1000.0,
        "dur": r.dur_ns as f64 / 1000.0,
        "pid": r.rank,
        "tid": r.tid,
        "args": Value::Object(args),
    })
}

/// The whole trace document of one rank.
pub fn document(rank: i32, comm_name: Option<&str>, records: &[Record]) -> Value {
    let label = match comm_name {
        Some(n) if !n.is_empty() => format!("rank {rank} ({n})"),
        _ => format!("rank {rank}"),
    };
    let mut events = Vec::with_capacity(records.len() + 1);
    events.push(json!({
        "name": "process_name", "ph": "M", "pid": rank, "tid": 0,
        "args": { "name": label },
    }));
    events.extend(records.iter().map(event));
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
