//! `oxccl recover`: how long survivors take to recover from a lost rank.
//! N local ranks run a stream of checked all-reduces; one of them is
//! SIGKILLed (or SIGSTOPped) inside it; each survivor measures the time
//! from that signal to its operation's error (detect), then shrinks the
//! rank away by the exclude list its error names (shrink), and checks 20
//! more all-reduces on the new communicator. One run per transport (shared
//! memory, the socket network) and shrink mode (revoke + default, abort).
//! A benchmark, not a test: figures depend on the machine and its load.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{self, Signal};
use oxccl::{Comm, CommConfig, DataType, ShrinkMode};

use crate::check::checked_all_reduce;
use crate::launch::{self, RankEnv};

#[derive(Debug, Clone, clap::Args)]
pub struct RecoverArgs {
    /// Local ranks to start as processes (at least 3); a comma-separated
    /// list runs each size in turn.
    #[arg(long, default_value = "4,8", value_delimiter = ',')]
    pub ranks: Vec<usize>,
    /// How the victim leaves: kill (SIGKILL) or stop (SIGSTOP; the
    /// survivors wake it once they have shrunk it away).
    #[arg(long, default_value = "kill")]
    pub fault: String,
    /// Transports: shm, net (NCCL_SHM_DISABLE=1), or both.
    #[arg(long, default_value = "both")]
    pub transport: String,
    /// Shrink modes: default (revoke, then NCCL_SHRINK_DEFAULT), abort
    /// (NCCL_SHRINK_ABORT alone), or both.
    #[arg(long, default_value = "both")]
    pub mode: String,
    /// Floats per all-reduce.
    #[arg(long, default_value_t = 16 << 10)]
    pub count: usize,
    /// Runs of each case (figures of every run are pooled).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// The rank that leaves (not the last, so that survivors are renumbered).
    #[arg(long, default_value_t = 1)]
    pub victim: usize,
}

/// Where the victim writes the wall-clock time of its signal, and the run.
const ENV_MARK: &str = "OXCCL_RECOVER_MARK";
/// A survivor's result line: `RECOVER <detect ms> <shrink ms> <#wrong> <record>`.
const RESULT: &str = "RECOVER";
/// The victim's signal comes this long into the stream of all-reduces.
const LEAD: Duration = Duration::from_millis(300);

pub fn main(args: RecoverArgs) -> Result<i32, String> {
    let mode = |s: &str| match s {
        "default" => Ok(ShrinkMode::Default),
        "abort" => Ok(ShrinkMode::Abort),
        _ => Err(format!("--mode {s:?}: expected default, abort or both")),
    };
    if let Some(env) = launch::from_env()? {
        return run_rank(&args, &env, mode(&args.mode)?);
    }
    if let Some(n) = args.ranks.iter().find(|&&n| n < 3 || args.victim >= n) {
        return Err(format!(
            "--ranks must be at least 3 and --victim below it (got {n} and {})",
            args.victim
        ));
    }
    if !matches!(args.fault.as_str(), "kill" | "stop") {
        return Err(format!("--fault {:?}: expected kill or stop", args.fault));
    }
    let both = |s: &str, all: [&'static str; 2]| -> Vec<String> {
        if s == "both" {
            all.map(String::from).to_vec()
        } else {
            vec![s.to_string()]
        }
    };
    let transports = both(&args.transport, ["shm", "net"]);
    let modes = both(&args.mode, ["default", "abort"]);
    if let Some(t) = transports
        .iter()
        .find(|t| !matches!(t.as_str(), "shm" | "net"))
    {
        return Err(format!("--transport {t:?}: expected shm, net or both"));
    }
    for m in &modes {
        mode(m)?;
    }
    let cfg = oxccl::config::Config::load().map_err(|e| e.to_string())?;
    let timeout = std::env::var("NCCL_TIMEOUT").unwrap_or_else(|_| "4".into());
    println!(
        "# oxccl recover: rank {} {} inside a stream of all_reduces ({} floats), NCCL_TIMEOUT {timeout} s, {} run(s) a case; load average {}",
        args.victim,
        if args.fault == "kill" { "SIGKILLed" } else { "SIGSTOPped" },
        args.count,
        args.runs,
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".into())
    );
    println!("# detect: from the signal to a survivor's error; shrink: the revoke (default mode) and shrink; ms over survivors and runs");
    println!(
        "# {:>5} {:<9} {:<16} {:>9} {:>22} {:>22} {:>10} {:>7}",
        "ranks",
        "transport",
        "shrink",
        "survivors",
        "detect ms min/med/max",
        "shrink ms min/med/max",
        "max total",
        "#wrong"
    );
    let mut code = 0;
    for &n in &args.ranks {
        for t in &transports {
            for m in &modes {
                let mut rows: Vec<(f64, f64, u64)> = Vec::new();
                for run in 0..args.runs {
                    match one_run(&args, n, t, m, &timeout, cfg.socket_ifname.is_some(), run) {
                        Ok(r) => rows.extend(r),
                        Err(e) => {
                            eprintln!("oxccl recover: {n} ranks, {t} {m}, run {run}: {e}");
                            code = 1;
                        }
                    }
                }
                let expected = args.runs * (n - 1);
                let what = if m == "default" {
                    "revoke+default"
                } else {
                    "abort"
                };
                print_row(n, t, what, &rows, expected);
                if rows.len() < expected || rows.iter().any(|r| r.2 != 0) {
                    code = 1;
                }
            }
        }
    }
    Ok(code)
}

fn print_row(n: usize, transport: &str, mode: &str, rows: &[(f64, f64, u64)], expected: usize) {
    let stats = |f: fn(&(f64, f64, u64)) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => "-".to_string(),
            n => format!("{:.1}/{:.1}/{:.1}", v[0], v[n / 2], v[n - 1]),
        }
    };
    let total = rows
        .iter()
        .map(|r| r.0 + r.1)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        .map_or("-".into(), |x| format!("{x:.1}"));
    println!(
        "  {:>5} {:<9} {:<16} {:>9} {:>22} {:>22} {:>10} {:>7}",
        n,
        transport,
        mode,
        format!("{}/{expected}", rows.len()),
        stats(|r| r.0),
        stats(|r| r.1),
        total,
        rows.iter().map(|r| r.2).sum::<u64>()
    );
}

/// One job of `n` processes; each survivor's (detect ms, shrink ms,
/// #wrong after).
fn one_run(
    args: &RecoverArgs,
    n: usize,
    transport: &str,
    mode: &str,
    timeout: &str,
    ifname_set: bool,
    run: usize,
) -> Result<Vec<(f64, f64, u64)>, String> {
    let mark = std::env::temp_dir().join(format!(
        "oxccl-recover-{}-{n}-{transport}-{mode}-{run}",
        std::process::id()
    ));
    let argv: Vec<String> = [
        "recover",
        "--fault",
        &args.fault,
        "--mode",
        mode,
        "--count",
        &args.count.to_string(),
        "--victim",
        &args.victim.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut env = vec![
        ("NCCL_TIMEOUT".to_string(), timeout.to_string()),
        (ENV_MARK.to_string(), mark.display().to_string()),
    ];
    if !ifname_set {
        env.push(("NCCL_SOCKET_IFNAME".into(), "lo".into()));
    }
    if transport == "net" {
        env.push(("NCCL_SHM_DISABLE".into(), "1".into()));
    }
    let limit = Duration::from_secs(120);
    let done = launch::spawn(n, &argv, &env, launch::Output::Capture, limit, limit);
    let _ = std::fs::remove_file(&mark);
    let mut rows = Vec::new();
    // Every survivor's failure record must be the same (the exclude list
    // the shrink takes, the collective, the operation).
    let mut records: Vec<(usize, String)> = Vec::new();
    for f in done? {
        if f.rank == args.victim {
            continue;
        }
        let line = f
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(RESULT))
            .ok_or_else(|| {
                format!(
                    "rank {} reported nothing ({:?}):\n{}",
                    f.rank, f.status, f.stderr
                )
            })?;
        let v: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| v.get(i).and_then(|s| s.parse::<f64>().ok());
        match (num(0), num(1), num(2)) {
            (Some(d), Some(s), Some(w)) => rows.push((d, s, w as u64)),
            _ => return Err(format!("rank {}: malformed result {line:?}", f.rank)),
        }
        records.push((f.rank, v.get(3..).unwrap_or_default().join(" ")));
    }
    if records.iter().any(|(_, r)| *r != records[0].1) {
        return Err(format!(
            "the survivors' failure records differ: {records:?}"
        ));
    }
    Ok(rows)
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn run_rank(args: &RecoverArgs, env: &RankEnv, mode: ShrinkMode) -> Result<i32, String> {
    let mark = std::env::var(ENV_MARK).map_err(|_| format!("{ENV_MARK} is not set"))?;
    let cfg = CommConfig::default();
    let comm = Comm::init_rank(env.nranks, env.id, env.rank, &cfg).map_err(|e| e.to_string())?;
    let me = env.rank;
    // Every rank's pid, so that a survivor can wake a stopped victim.
    let mut pids = vec![0u8; 4 * env.nranks];
    pids[4 * me..4 * me + 4].copy_from_slice(&std::process::id().to_le_bytes());
    comm.all_gather(None, &mut pids, DataType::Uint32)
        .map_err(|e| e.to_string())?;
    let v = args.victim;
    let victim_pid = u32::from_le_bytes([
        pids[4 * v],
        pids[4 * v + 1],
        pids[4 * v + 2],
        pids[4 * v + 3],
    ]);
    if me == v {
        let stop = args.fault == "stop";
        let mark = mark.clone();
        std::thread::spawn(move || {
            std::thread::sleep(LEAD);
            // Written before the signal: the survivors read it after their error.
            let _ = std::fs::write(&mark, now_ns().to_string());
            let _ = signal::raise(if stop {
                Signal::SIGSTOP
            } else {
                Signal::SIGKILL
            });
        });
    }
    let mut buf = vec![0u8; args.count * 4];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut it = 0;
    let err = loop {
        it += 1;
        match checked_all_reduce(&comm, it, &mut buf) {
            Ok(0) if Instant::now() < deadline => {}
            Ok(0) => return Err("the victim never left".into()),
            Ok(w) => return Err(format!("{w} wrong elements before the fault")),
            Err(e) => break e,
        }
    };
    let failed_at = now_ns();
    if me == v {
        // A stopped victim, woken: its operation ended in an error.
        println!("VICTIM {err}");
        return Ok(0);
    }
    let signalled: u128 = std::fs::read_to_string(&mark)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("failed before the victim's signal: {err}"))?;
    let detect_ms = failed_at.saturating_sub(signalled) as f64 / 1e6;
    let exclude = err
        .failure()
        .ok_or_else(|| format!("the error names no failed ranks: {err}"))?
        .ranks;
    let t = Instant::now();
    if mode == ShrinkMode::Default {
        comm.revoke().map_err(|e| e.to_string())?;
    }
    let kid = comm
        .shrink(&exclude, &cfg, mode)
        .map_err(|e| format!("shrink excluding {exclude:?}: {e}"))?;
    let shrink_ms = t.elapsed().as_secs_f64() * 1e3;
    if args.fault == "stop" && kid.user_rank() == 0 {
        let _ = signal::kill(
            nix::unistd::Pid::from_raw(victim_pid as i32),
            Signal::SIGCONT,
        );
    }
    let mut wrong = 0;
    for i in 0..20 {
        wrong += checked_all_reduce(&kid, 1 << 30 | i, &mut buf)
            .map_err(|e| format!("after the shrink: {e}"))?;
    }
    println!(
        "{RESULT} {detect_ms:.3} {shrink_ms:.3} {wrong} {}",
        err.failure().map(|f| f.tag()).unwrap_or_default()
    );
    let _ = kid.destroy();
    let _ = comm.destroy();
    Ok(0)
}
