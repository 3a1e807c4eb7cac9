//! The report a RAS client gets: from the processes' answers and the ones
//! that did not answer, NCCL's text (job summary, communicators grouped by
//! shape, errors, warnings, with NCCL's wording so that people and scripts
//! that read `ncclras` read this) plus oxccl's own: a table of every rank
//! with the collective it is in, and a STUCK entry that names the ranks
//! that are missing or stuck and the operation each is in. Or NCCL's JSON.
//! Pure: no sockets, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::wire::{PeerId, ProcDump, RankDump};
use super::{State, FUNCS};

/// Why a process is not in the answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Miss {
    /// No answer within the wait: stopped, hung, or its host unreachable.
    Timeout,
    /// Connection refused or reset: the process is gone (NCCL's DEAD).
    Dead(String),
    /// It answered something that is not an oxccl RAS answer.
    Garbled(String),
}

/// What a query gathered.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    pub procs: Vec<ProcDump>,
    pub missing: Vec<(PeerId, Miss)>,
    /// Time the gathering took.
    pub elapsed: Duration,
}

/// How to report.
#[derive(Debug, Clone)]
pub struct Options {
    /// NCCL's VERBOSE STATUS: more outliers named, every rank listed.
    pub verbose: bool,
    /// Time in one collective after which a rank is called stuck.
    pub stuck: Duration,
    /// The wait for each process (named for the ones that did not answer).
    pub wait: Duration,
}

// NCCL's status bits (client_support.cc's rasACStatus) and errors.
const NOCOMM: u32 = 1;
const ACE_MISMATCH: u32 = 1;
const ACE_ERROR: u32 = 2;
const ACE_INCOMPLETE: u32 = 4;
const STATUS_STR: [&str; 5] = ["NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT"];
const ERROR_STR: [&str; 8] = [
    "OK",
    "MISMATCH",
    "ERROR",
    "ERROR,MISMATCH",
    "INCOMPLETE",
    "INCOMPLETE,MISMATCH",
    "INCOMPLETE,ERROR",
    "INCOMPLETE,ERROR,MISMATCH",
];
/// NCCL's RAS_CLIENT_DETAIL_THRESHOLD: most outliers named one by one.
const DETAIL: usize = 10;
/// Most ranks of a communicator listed in the rank table unless verbose.
const TABLE_RANKS: usize = 64;

fn state_bit(s: State) -> u32 {
    1 << (s as u32)
}

/// A rank that did not report.
#[derive(Debug, Clone)]
struct MissingRank {
    rank: usize,
    who: Option<PeerId>,
    gpu: i32,
    /// Its process did not answer (else: it answered without this rank,
    /// NCCL's NOCOMM).
    unresponsive: bool,
}

/// One communicator as the answers show it.
#[derive(Debug, Clone)]
struct View<'a> {
    hash: u64,
    nranks: usize,
    present: Vec<(&'a RankDump, &'a PeerId)>,
    missing: Vec<MissingRank>,
    nodes: usize,
    rpn: (usize, usize),
    status: u32,
    errors: u32,
}

impl View<'_> {
    fn status_str(&self) -> &'static str {
        STATUS_STR[(31 - self.status.max(1).leading_zeros()) as usize]
    }

    /// The oldest collective the answering ranks are stuck in.
    fn stuck_op(&self, stuck: Duration) -> Option<(usize, u64)> {
        self.present
            .iter()
            .filter_map(|(r, _)| r.flight)
            .filter(|f| f.elapsed >= stuck)
            .map(|f| (f.func, f.number))
            .min_by_key(|&(_, n)| n)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn who_str(who: &PeerId, gpu: i32) -> String {
    if gpu >= 0 {
        format!(
            "GPU {gpu} managed by process {} on node {}",
            who.pid,
            who.node()
        )
    } else {
        format!("process {} on node {} (host memory)", who.pid, who.node())
    }
}

fn op_str(func: usize, number: u64) -> String {
    format!(
        "{} (operation {number})",
        FUNCS.get(func).copied().unwrap_or("?")
    )
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// NCCL's outlier rule (rasCountIsOutlier).
fn is_outlier(count: usize, verbose: bool, total: usize) -> bool {
    if verbose {
        (count as f64) < total as f64 * 0.5
    } else {
        count <= DETAIL && (count as f64) <= total as f64 * 0.25
    }
}

struct Analysis<'a> {
    views: Vec<View<'a>>,
    /// Group boundaries: (first index, count).
    groups: Vec<(usize, usize)>,
    unresponsive: BTreeSet<PeerId>,
}

fn analyse(g: &Gathered) -> Analysis<'_> {
    let unresponsive: BTreeSet<PeerId> = g.missing.iter().map(|(p, _)| p.clone()).collect();
    let answered: BTreeSet<&PeerId> = g.procs.iter().map(|p| &p.id).collect();
    let mut by_hash: BTreeMap<u64, Vec<(&RankDump, &PeerId)>> = BTreeMap::new();
    let mut maps: BTreeMap<u64, &[(PeerId, i32)]> = BTreeMap::new();
    for p in &g.procs {
        for r in &p.ranks {
            by_hash.entry(r.hash).or_default().push((r, &p.id));
        }
        for (h, m) in &p.maps {
            maps.entry(*h).or_insert(m.as_slice());
        }
    }
    let mut views = Vec::new();
    for (hash, mut present) in by_hash {
        present.sort_by_key(|(r, _)| r.rank);
        present.dedup_by_key(|(r, _)| r.rank);
        let nranks = present[0].0.nranks;
        let map = maps.get(&hash).copied().filter(|m| m.len() == nranks);
        let mut missing = Vec::new();
        for rank in 0..nranks {
            if present.iter().any(|(r, _)| r.rank == rank) {
                continue;
            }
            let (who, gpu) = map.map_or((None, -1), |m| (Some(m[rank].0.clone()), m[rank].1));
            let unresponsive = who.as_ref().is_none_or(|w| !answered.contains(w));
            missing.push(MissingRank {
                rank,
                who,
                gpu,
                unresponsive,
            });
        }
        let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
        match map {
            Some(m) => m
                .iter()
                .for_each(|(p, _)| *per_node.entry(p.node()).or_default() += 1),
            None => present
                .iter()
                .for_each(|(_, p)| *per_node.entry(p.node()).or_default() += 1),
        }
        let rpn = (
            per_node.values().copied().min().unwrap_or(0),
            per_node.values().copied().max().unwrap_or(0),
        );
        let mut status = 0;
        let mut errors = 0;
        for (r, _) in &present {
            status |= state_bit(r.state);
            if r.counts != present[0].0.counts {
                errors |= ACE_MISMATCH;
            }
            if r.error.is_some() {
                errors |= ACE_ERROR;
            }
        }
        if missing.iter().any(|m| !m.unresponsive) {
            status |= NOCOMM;
        }
        if status.count_ones() > 1 {
            errors |= ACE_MISMATCH;
        }
        if missing.iter().any(|m| m.unresponsive) {
            errors |= ACE_INCOMPLETE;
        }
        views.push(View {
            hash,
            nranks,
            present,
            missing,
            nodes: per_node.len(),
            rpn,
            status,
            errors,
        });
    }
    // The largest communicators first, as NCCL's.
    views.sort_by(|a, b| {
        (b.nranks, b.nodes, b.status, b.errors, a.hash)
            .cmp(&(a.nranks, a.nodes, a.status, a.errors, b.hash))
    });
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for (i, v) in views.iter().enumerate() {
        let same = groups.last().is_some_and(|&(f, _)| {
            let w = &views[f];
            (w.nranks, w.nodes, w.status_str(), w.errors)
                == (v.nranks, v.nodes, v.status_str(), v.errors)
        });
        match groups.last_mut() {
            Some((_, n)) if same => *n += 1,
            _ => groups.push((i, 1)),
        }
    }
    Analysis {
        views,
        groups,
        unresponsive,
    }
}

/// The communicator's name in the report: `#<group>-<index in group>`.
fn comm_name(a: &Analysis<'_>, idx: usize) -> String {
    let (g, (first, _)) = a
        .groups
        .iter()
        .enumerate()
        .find(|(_, (f, n))| (*f..f + n).contains(&idx))
        .expect("every communicator is in a group");
    format!("#{g}-{} ({:016x})", idx - first, a.views[idx].hash)
}

/// Every process known, each with its GPUs.
fn processes(g: &Gathered) -> BTreeMap<PeerId, BTreeSet<i32>> {
    let mut all: BTreeMap<PeerId, BTreeSet<i32>> = BTreeMap::new();
    for p in &g.procs {
        let e = all.entry(p.id.clone()).or_default();
        e.extend(p.ranks.iter().map(|r| r.device).filter(|d| *d >= 0));
        for (_, m) in &p.maps {
            for (who, gpu) in m {
                let e = all.entry(who.clone()).or_default();
                if *gpu >= 0 {
                    e.insert(*gpu);
                }
            }
        }
    }
    for (p, _) in &g.missing {
        all.entry(p.clone()).or_default();
    }
    all
}

fn gpus_str(g: &BTreeSet<i32>) -> String {
    if g.is_empty() {
        return "no GPU (host memory)".into();
    }
    let l: Vec<String> = g.iter().map(|d| d.to_string()).collect();
    format!("GPU{} {}", if g.len() > 1 { "s" } else { "" }, l.join(","))
}

/// The text report: `header` (the version lines) first.
pub fn text(g: &Gathered, o: &Options, header: &str) -> String {
    let mut s = String::from(header);
    let procs = processes(g);
    // Job summary.
    let mut per_node: BTreeMap<String, Vec<&PeerId>> = BTreeMap::new();
    for p in procs.keys() {
        per_node.entry(p.node()).or_default().push(p);
    }
    let total_gpus: usize = procs.values().map(BTreeSet::len).sum();
    s.push_str("Job summary\n===========\n\n");
    let ppn: BTreeSet<usize> = per_node.values().map(Vec::len).collect();
    let gpp: BTreeSet<usize> = procs.values().map(BTreeSet::len).collect();
    if ppn.len() <= 1 && gpp.len() <= 1 {
        let _ = write!(
            s,
            "  Nodes  Processes         GPUs  Processes     GPUs\n\
             (total)   per node  per process    (total)  (total)\n\
             {:7}  {:9}  {:11}  {:9}  {:7}\n",
            per_node.len(),
            ppn.first().copied().unwrap_or(0),
            gpp.first().copied().unwrap_or(0),
            procs.len(),
            total_gpus
        );
    } else {
        s.push_str("  Nodes  Processes\n          per node\n");
        for n in &ppn {
            let count = per_node.values().filter(|v| v.len() == *n).count();
            let _ = writeln!(s, "{count:7}  {n:9}");
        }
        let _ = write!(
            s,
            "\n  Nodes  Processes         GPUs\n(total)    (total)      (total)\n{:7}  {:9}  {:11}\n",
            per_node.len(),
            procs.len(),
            total_gpus
        );
    }
    let a = analyse(g);
    let _ = write!(
        s,
        "\nCommunicators... ({:.3}s)\n=============\n\n",
        g.elapsed.as_secs_f64()
    );
    if a.views.is_empty() {
        s.push_str("No communicator data collected!\n");
    } else {
        s.push_str(
            "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n    \
             #  in group  per comm  per node  per comm  in group\n",
        );
    }
    for (gi, &(first, count)) in a.groups.iter().enumerate() {
        let vs = &a.views[first..first + count];
        let lo = vs.iter().map(|v| v.rpn.0).min().unwrap_or(0);
        let hi = vs.iter().map(|v| v.rpn.1).max().unwrap_or(0);
        let rpn = if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        };
        let ranks: usize = vs.iter().map(|v| v.present.len()).sum();
        let _ = writeln!(
            s,
            "{gi:5}  {count:8}  {:8}  {rpn:>8}  {:8}  {ranks:8}  {:>8}  {:>6}",
            vs[0].nodes,
            vs[0].nranks,
            vs[0].status_str(),
            ERROR_STR[vs[0].errors as usize]
        );
    }
    ranks_table(&mut s, &a, o);
    errors(&mut s, g, &a, o, &procs);
    warnings(&mut s, g, &a, o);
    s
}

/// oxccl's table of ranks, with the collective each is in.
fn ranks_table(s: &mut String, a: &Analysis<'_>, o: &Options) {
    if a.views.is_empty() {
        return;
    }
    s.push_str("\nRanks\n=====\n\n");
    for (i, v) in a.views.iter().enumerate() {
        let all = o.verbose || v.nranks <= TABLE_RANKS;
        let _ = writeln!(
            s,
            "{} {}{}",
            comm_name(a, i),
            plural(v.nranks, "rank", "ranks"),
            if all {
                ""
            } else {
                " (only those missing or stuck)"
            }
        );
        s.push_str(
            "   Rank    Process  Node                   GPU  Status         Ops  In flight\n",
        );
        let mut rows: Vec<(usize, String)> = Vec::new();
        for (r, who) in &v.present {
            let stuck = r.flight.is_some_and(|f| f.elapsed >= o.stuck);
            if !all && !stuck && r.error.is_none() {
                continue;
            }
            let flight = match r.flight {
                Some(f) => format!(
                    "{} for {}{}",
                    op_str(f.func, f.number),
                    secs(f.elapsed),
                    if stuck { " (stuck)" } else { "" }
                ),
                None => "-".into(),
            };
            let state = if r.error.is_some() {
                format!("{}/ERROR", r.state.name())
            } else {
                r.state.name().to_string()
            };
            rows.push((
                r.rank,
                format!(
                    "{:7}  {:9}  {:<21}  {:>3}  {:<11}  {:5}  {flight}",
                    r.rank,
                    who.pid,
                    who.node(),
                    if r.device >= 0 {
                        r.device.to_string()
                    } else {
                        "-".into()
                    },
                    state,
                    r.counts.iter().sum::<u64>()
                ),
            ));
        }
        for m in &v.missing {
            let (pid, node) = m
                .who
                .as_ref()
                .map_or(("?".to_string(), "?".to_string()), |w| {
                    (w.pid.to_string(), w.node())
                });
            let why = if m.unresponsive {
                format!("no answer within {}", secs(o.wait))
            } else {
                "its process answered without it".into()
            };
            rows.push((
                m.rank,
                format!(
                    "{:7}  {pid:>9}  {node:<21}  {:>3}  {:<11}  {:>5}  {why}",
                    m.rank,
                    if m.gpu >= 0 {
                        m.gpu.to_string()
                    } else {
                        "-".into()
                    },
                    if m.unresponsive { "MISSING" } else { "NOCOMM" },
                    "?"
                ),
            ));
        }
        rows.sort_by_key(|(r, _)| *r);
        for (_, row) in rows {
            s.push_str(row.trim_end());
            s.push('\n');
        }
        s.push('\n');
    }
}

fn errors(
    s: &mut String,
    g: &Gathered,
    a: &Analysis<'_>,
    o: &Options,
    procs: &BTreeMap<PeerId, BTreeSet<i32>>,
) {
    let timeouts: Vec<&PeerId> = g
        .missing
        .iter()
        .filter(|(_, m)| !matches!(m, Miss::Dead(_)))
        .map(|(p, _)| p)
        .collect();
    let dead: Vec<&PeerId> = g
        .missing
        .iter()
        .filter(|(_, m)| matches!(m, Miss::Dead(_)))
        .map(|(p, _)| p)
        .collect();
    let any_stuck = a.views.iter().any(|v| {
        v.present
            .iter()
            .any(|(r, _)| r.flight.is_some_and(|f| f.elapsed >= o.stuck))
    });
    let comm_errors = a
        .views
        .iter()
        .any(|v| v.errors & (ACE_ERROR | ACE_INCOMPLETE) != 0);
    if timeouts.is_empty() && dead.is_empty() && !any_stuck && !comm_errors {
        return;
    }
    s.push_str("\nErrors\n======\n\n");
    let none = BTreeSet::new();
    if !timeouts.is_empty() {
        let _ = writeln!(
            s,
            "INCOMPLETE\n  Missing communicator data from {}",
            plural(timeouts.len(), "job process", "job processes")
        );
        for p in &timeouts {
            let _ = writeln!(
                s,
                "  Process {} on node {} managing {}",
                p.pid,
                p.node(),
                gpus_str(procs.get(*p).unwrap_or(&none))
            );
        }
        s.push('\n');
    }
    if !dead.is_empty() {
        let _ = writeln!(
            s,
            "DEAD\n  {} considered dead (unreachable via the RAS network)",
            if dead.len() == 1 {
                "1 job process is".to_string()
            } else {
                format!("{} job processes are", dead.len())
            }
        );
        for p in &dead {
            let _ = writeln!(
                s,
                "  Process {} on node {} managing {}",
                p.pid,
                p.node(),
                gpus_str(procs.get(*p).unwrap_or(&none))
            );
        }
        s.push('\n');
    }
    for (i, v) in a.views.iter().enumerate() {
        let gone: Vec<&MissingRank> = v.missing.iter().filter(|m| m.unresponsive).collect();
        if !gone.is_empty() {
            let _ = writeln!(
                s,
                "{} INCOMPLETE\n  Missing communicator data from {}",
                comm_name(a, i),
                plural(gone.len(), "rank", "ranks")
            );
            if gone.len() <= DETAIL || o.verbose {
                for m in &gone {
                    match &m.who {
                        Some(w) => {
                            let _ = writeln!(s, "  Rank {} -- {}", m.rank, who_str(w, m.gpu));
                        }
                        None => {
                            let _ =
                                writeln!(s, "  Rank {} -- [process information not found]", m.rank);
                        }
                    }
                }
            } else {
                let l: Vec<String> = gone.iter().map(|m| m.rank.to_string()).collect();
                let _ = writeln!(s, "  The missing ranks: {}", l.join(","));
            }
            s.push('\n');
        }
        let failed: Vec<&(&RankDump, &PeerId)> = v
            .present
            .iter()
            .filter(|(r, _)| r.error.is_some())
            .collect();
        if !failed.is_empty() {
            let _ = writeln!(
                s,
                "{} ERROR\n  Asynchronous error{} on {}",
                comm_name(a, i),
                if failed.len() > 1 { "s" } else { "" },
                plural(failed.len(), "rank", "ranks")
            );
            for (r, w) in failed
                .iter()
                .take(if o.verbose { usize::MAX } else { DETAIL })
            {
                let _ = writeln!(
                    s,
                    "  Rank {} reported {} -- {}",
                    r.rank,
                    r.error.as_deref().unwrap_or_default(),
                    who_str(w, r.device)
                );
            }
            s.push('\n');
        }
        stuck(s, a, i, o);
    }
}

/// oxccl's STUCK entry: who holds the communicator up, and where.
fn stuck(s: &mut String, a: &Analysis<'_>, i: usize, o: &Options) {
    let v = &a.views[i];
    let waiting: Vec<&(&RankDump, &PeerId)> = v
        .present
        .iter()
        .filter(|(r, _)| r.flight.is_some_and(|f| f.elapsed >= o.stuck))
        .collect();
    let gone: Vec<&MissingRank> = v.missing.iter().filter(|m| m.unresponsive).collect();
    // Missing ranks are named here only where the others are in an
    // operation (else INCOMPLETE says it all).
    let held_up = !gone.is_empty() && v.stuck_op(Duration::ZERO).is_some();
    if waiting.is_empty() && !held_up {
        return;
    }
    let _ = writeln!(s, "{} STUCK", comm_name(a, i));
    let op = v.stuck_op(Duration::ZERO);
    for m in &gone {
        let who = m
            .who
            .as_ref()
            .map_or("[process information not found]".to_string(), |w| {
                who_str(w, m.gpu)
            });
        let _ = match op {
            Some((f, n)) => writeln!(
                s,
                "  Rank {} is missing (no answer within {}): it has not finished {}, which the ranks that answered are in -- {who}",
                m.rank,
                secs(o.wait),
                op_str(f, n)
            ),
            None => writeln!(
                s,
                "  Rank {} is missing (no answer within {}) -- {who}",
                m.rank,
                secs(o.wait)
            ),
        };
    }
    let mut by_op: BTreeMap<(u64, usize), Vec<&(&RankDump, &PeerId)>> = BTreeMap::new();
    for w in &waiting {
        let f = w.0.flight.expect("filtered");
        by_op.entry((f.number, f.func)).or_default().push(w);
    }
    for ((number, func), ws) in by_op {
        let least = ws
            .iter()
            .filter_map(|(r, _)| r.flight.map(|f| f.elapsed))
            .min()
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  {} {} been in {} for {} or more",
            plural(ws.len(), "rank", "ranks"),
            if ws.len() == 1 { "has" } else { "have" },
            op_str(func, number),
            secs(least)
        );
        for (r, w) in ws.iter().take(if o.verbose { usize::MAX } else { DETAIL }) {
            let _ = writeln!(s, "  Rank {} -- {}", r.rank, who_str(w, r.device));
        }
    }
    s.push('\n');
}

fn warnings(s: &mut String, g: &Gathered, a: &Analysis<'_>, o: &Options) {
    let timeouts = g
        .missing
        .iter()
        .filter(|(_, m)| matches!(m, Miss::Timeout))
        .count();
    let garbled: Vec<(&PeerId, &String)> = g
        .missing
        .iter()
        .filter_map(|(p, m)| match m {
            Miss::Garbled(w) => Some((p, w)),
            _ => None,
        })
        .collect();
    let mismatched: Vec<usize> = (0..a.views.len())
        .filter(|&i| a.views[i].errors & ACE_MISMATCH != 0)
        .collect();
    if timeouts == 0 && garbled.is_empty() && mismatched.is_empty() {
        return;
    }
    s.push_str("\nWarnings\n========\n\n");
    if timeouts > 0 {
        let _ = writeln!(
            s,
            "TIMEOUT\n  Encountered {} while gathering communicator data\n",
            plural(timeouts, "communication timeout", "communication timeouts")
        );
    }
    for (p, why) in garbled {
        let _ = writeln!(
            s,
            "GARBLED\n  Process {} on node {} answered what is not an oxccl RAS answer: {why}\n",
            p.pid,
            p.node()
        );
    }
    for i in mismatched {
        let v = &a.views[i];
        let _ = writeln!(s, "{} MISMATCH", comm_name(a, i));
        let total = v.present.len();
        let states: BTreeSet<State> = v.present.iter().map(|(r, _)| r.state).collect();
        if states.len() > 1 || v.status & NOCOMM != 0 {
            s.push_str("  Communicator ranks have different status\n");
            let mut groups: Vec<(String, Vec<String>)> = Vec::new();
            for st in &states {
                let rs: Vec<String> = v
                    .present
                    .iter()
                    .filter(|(r, _)| r.state == *st)
                    .map(|(r, w)| format!("  Rank {} -- {}", r.rank, who_str(w, r.device)))
                    .collect();
                groups.push((st.name().to_string(), rs));
            }
            let nocomm: Vec<String> = v
                .missing
                .iter()
                .filter(|m| !m.unresponsive)
                .map(|m| format!("  Rank {}", m.rank))
                .collect();
            if !nocomm.is_empty() {
                groups.push(("NOCOMM".into(), nocomm));
            }
            groups.sort_by_key(|(_, rs)| std::cmp::Reverse(rs.len()));
            for (k, (name, rs)) in groups.iter().enumerate() {
                let _ = writeln!(s, "  {} status {name}", ranks_have(rs.len()));
                if k > 0 && is_outlier(rs.len(), o.verbose, total) {
                    rs.iter().for_each(|r| {
                        let _ = writeln!(s, "{r}");
                    });
                }
            }
        }
        for (fi, fname) in FUNCS.iter().enumerate() {
            let counts: BTreeSet<u64> = v.present.iter().map(|(r, _)| r.counts[fi]).collect();
            if counts.len() <= 1 {
                continue;
            }
            let _ = writeln!(
                s,
                "  Communicator ranks have different {fname} operation counts"
            );
            let mut groups: Vec<(u64, Vec<&(&RankDump, &PeerId)>)> = counts
                .iter()
                .map(|c| {
                    (
                        *c,
                        v.present
                            .iter()
                            .filter(|(r, _)| r.counts[fi] == *c)
                            .collect(),
                    )
                })
                .collect();
            groups.sort_by_key(|(c, rs)| (std::cmp::Reverse(rs.len()), std::cmp::Reverse(*c)));
            for (k, (c, rs)) in groups.iter().enumerate() {
                if *c > 0 {
                    let _ = writeln!(s, "  {} launched up to operation {c}", ranks_have(rs.len()));
                } else {
                    let _ = writeln!(s, "  {} not launched any operations", ranks_have(rs.len()));
                }
                if k > 0 && is_outlier(rs.len(), o.verbose, total) {
                    for (r, w) in rs {
                        let _ = writeln!(s, "  Rank {} -- {}", r.rank, who_str(w, r.device));
                    }
                }
            }
        }
        s.push('\n');
    }
}

fn ranks_have(n: usize) -> String {
    if n == 1 {
        "1 rank has".into()
    } else {
        format!("{n} ranks have")
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// NCCL's JSON (SET FORMAT json), with oxccl's `in_flight` per rank.
pub fn json(g: &Gathered, o: &Options, version: &str, timestamp: &str) -> String {
    let a = analyse(g);
    let mut s = String::from("{\n");
    let _ = writeln!(s, "  \"nccl_version\": {},", json_str(version));
    s.push_str("  \"cuda_runtime_version\": -1,\n  \"cuda_driver_version\": -1,\n");
    let _ = writeln!(s, "  \"timestamp\": {},", json_str(timestamp));
    let _ = writeln!(s, "  \"communicators_count\": {},", a.views.len());
    s.push_str("  \"communicators\": [");
    for (i, v) in a.views.iter().enumerate() {
        s.push_str(if i == 0 { "\n" } else { ",\n" });
        let _ = write!(
            s,
            "    {{\n      \"hash\": \"0x{:016x}\",\n      \"size\": {},\n      \"ranks_count\": {},\n      \"missing_ranks_count\": {},\n      \"ranks\": [",
            v.hash,
            v.nranks,
            v.present.len(),
            v.missing.len()
        );
        for (k, (r, w)) in v.present.iter().enumerate() {
            s.push_str(if k == 0 { "\n" } else { ",\n" });
            let counts: Vec<String> = FUNCS
                .iter()
                .zip(r.counts)
                .map(|(f, c)| format!("\"{f}\": {c}"))
                .collect();
            let flight = r.flight.map_or("null".to_string(), |f| {
                format!(
                    "{{\"op\": {}, \"operation\": {}, \"seconds\": {:.3}, \"stuck\": {}}}",
                    json_str(FUNCS.get(f.func).copied().unwrap_or("?")),
                    f.number,
                    f.elapsed.as_secs_f64(),
                    f.elapsed >= o.stuck
                )
            });
            let _ = write!(
                s,
                "        {{\"rank\": {}, \"host\": {}, \"pid\": {}, \"cuda_dev\": {}, \"nvml_dev\": {}, \"status\": {{\"init_state\": {}, \"async_error\": {}, \"finalize_called\": {}, \"destroy_flag\": false, \"abort_flag\": {}}}, \"collective_counts\": {{{}}}, \"in_flight\": {flight}}}",
                r.rank,
                json_str(&w.node()),
                w.pid,
                r.device,
                r.device,
                if r.state == State::Init { 7 } else { 0 },
                if r.error.is_some() { 6 } else { 0 },
                r.state == State::Finalize,
                r.state == State::Abort,
                counts.join(", ")
            );
        }
        s.push_str("\n      ],\n      \"missing_ranks\": [");
        for (k, m) in v.missing.iter().enumerate() {
            s.push_str(if k == 0 { "\n" } else { ",\n" });
            let (host, pid) = m
                .who
                .as_ref()
                .map_or(("?".to_string(), -1i64), |w| (w.node(), i64::from(w.pid)));
            let dead = m.who.as_ref().is_some_and(|w| {
                g.missing
                    .iter()
                    .any(|(p, why)| p == w && matches!(why, Miss::Dead(_)))
            });
            let _ = write!(
                s,
                "        {{\"rank\": {}, \"host\": {}, \"pid\": {pid}, \"cuda_dev\": {}, \"nvml_dev\": {}, \"status\": {{\"unresponsive\": {}, \"considered_dead\": {dead}}}}}",
                m.rank,
                json_str(&host),
                m.gpu,
                m.gpu,
                m.unresponsive
            );
        }
        s.push_str("\n      ]\n    }");
    }
    let timeouts = a.unresponsive.len();
    let _ = write!(
        s,
        "\n  ],\n  \"ras\": {{\n    \"collection_time_sec\": {:.3},\n    \"timeouts_count\": {timeouts}\n  }}\n}}\n",
        g.elapsed.as_secs_f64()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::super::wire::FlightDump;
    use super::*;
    use std::net::SocketAddr;

    fn id(port: u16) -> PeerId {
        PeerId {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            pid: 1000 + u32::from(port),
        }
    }

    fn rank(r: usize, allreduces: u64, flight_s: Option<u64>) -> RankDump {
        RankDump {
            hash: 0xabc,
            rank: r,
            nranks: 4,
            device: -1,
            state: State::Running,
            counts: [0, 0, 0, 0, allreduces],
            flight: flight_s.map(|s| FlightDump {
                func: 4,
                number: allreduces,
                elapsed: Duration::from_secs(s),
            }),
            error: None,
        }
    }

    /// Four ranks in four processes; rank 2's process does not answer and
    /// the other three wait in all-reduce 17: the report says INCOMPLETE,
    /// names rank 2 and the operation, and lists the waiting ranks.
    #[test]
    fn a_stopped_rank_is_named_with_the_operation() {
        let map: Vec<(PeerId, i32)> = (0..4).map(|r| (id(r), -1)).collect();
        let proc_of = |r: u16| ProcDump {
            id: id(r),
            host: "h".into(),
            ranks: vec![rank(r as usize, 17, Some(9))],
            maps: vec![(0xabc, map.clone())],
            peers: Vec::new(),
        };
        let g = Gathered {
            procs: vec![proc_of(0), proc_of(1), proc_of(3)],
            missing: vec![(id(2), Miss::Timeout)],
            elapsed: Duration::from_millis(5004),
        };
        let o = Options {
            verbose: false,
            stuck: Duration::from_secs(5),
            wait: Duration::from_secs(5),
        };
        let t = text(&g, &o, "");
        assert!(
            t.contains("      1          4            0          4        0"),
            "{t}"
        );
        assert!(
            t.contains(
                "    0         1         1         4         4         3   RUNNING  INCOMPLETE"
            ),
            "{t}"
        );
        assert!(
            t.contains("Process 1002 on node 127.0.0.1 managing no GPU"),
            "{t}"
        );
        assert!(t.contains("#0-0 (0000000000000abc) INCOMPLETE"), "{t}");
        assert!(t.contains("Rank 2 is missing (no answer within 5.0 s): it has not finished AllReduce (operation 17)"), "{t}");
        assert!(
            t.contains("3 ranks have been in AllReduce (operation 17) for 9.0 s or more"),
            "{t}"
        );
        assert!(t.contains("MISSING"), "{t}");
        assert!(
            t.contains("TIMEOUT\n  Encountered 1 communication timeout"),
            "{t}"
        );
        let j = json(&g, &o, "x", "now");
        assert!(j.contains("\"missing_ranks_count\": 1"), "{j}");
        assert!(j.contains("\"unresponsive\": true"), "{j}");
    }

    /// A healthy job: one group, OK, no Errors section; differing counts
    /// give NCCL's MISMATCH warning with the outlier named.
    #[test]
    fn healthy_and_mismatched_jobs() {
        let map: Vec<(PeerId, i32)> = (0..4).map(|r| (id(r), -1)).collect();
        let mk = |counts: [u64; 4]| Gathered {
            procs: (0..4u16)
                .map(|r| ProcDump {
                    id: id(r),
                    host: "h".into(),
                    ranks: vec![rank(r as usize, counts[r as usize], None)],
                    maps: vec![(0xabc, map.clone())],
                    peers: Vec::new(),
                })
                .collect(),
            missing: Vec::new(),
            elapsed: Duration::ZERO,
        };
        let o = Options {
            verbose: false,
            stuck: Duration::from_secs(5),
            wait: Duration::from_secs(5),
        };
        let t = text(&mk([5, 5, 5, 5]), &o, "");
        assert!(t.contains("RUNNING      OK"), "{t}");
        assert!(!t.contains("\nErrors\n"), "{t}");
        let t = text(&mk([6, 6, 6, 5]), &o, "");
        assert!(t.contains("RUNNING  MISMATCH"), "{t}");
        assert!(t.contains("Communicator ranks have different AllReduce operation counts\n  3 ranks have launched up to operation 6\n  1 rank has launched up to operation 5\n  Rank 3 -- process 1003 on node 127.0.0.1 (host memory)"), "{t}");
    }
}
