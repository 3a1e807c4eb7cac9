//! `oxccl perf`: nccl-tests for oxccl. Times each collective over a range
//! of sizes, checks every output against a reference on random data, and
//! prints nccl-tests' columns (and JSON rows on request).

use std::time::{Duration, Instant};

use oxccl::{Comm, CommConfig, DataType, RedOp};

use crate::bench::{report, selection, Measured, Stats};
pub use crate::bench::{Case, PerfArgs};
pub use crate::hostmem::HostBuf;
use crate::launch::{self, RankEnv};

/// Runs the benchmark; returns the process exit code.
pub fn main(mut args: PerfArgs) -> Result<i32, String> {
    if let Some(n) = args.gpus {
        if n == 0 {
            return Err("-g must be at least 1".into());
        }
        if args.ranks.is_some() {
            return Err("-g N drives N GPUs from one process; --ranks N starts N processes of one GPU each: pass one of them".into());
        }
        args.device = "cuda".into();
        if launch::from_env()?.is_none() {
            return crate::perf_device::run_single_process(&args, n);
        }
    }
    if let Some(n) = args.ranks {
        if launch::from_env()?.is_none() {
            return spawn_local(n, &args);
        }
    }
    let env = launch::from_env()?.ok_or(
        "no job to join: pass --ranks N to start N local ranks, or start under torchrun, mpirun or srun (with NCCL_COMM_ID set)",
    )?;
    run_rank(&args, &env)
}

fn spawn_local(n: usize, args: &PerfArgs) -> Result<i32, String> {
    if n == 0 {
        return Err("--ranks must be at least 1".into());
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut env = Vec::new();
    // Ranks of one machine talk over loopback unless told otherwise (by
    // the environment, an env plugin or a configuration file).
    let set = oxccl::config::Config::load()
        .ok()
        .is_some_and(|c| c.socket_ifname.is_some());
    if !set {
        env.push(("NCCL_SOCKET_IFNAME".to_string(), "lo".to_string()));
    }
    // Once a rank fails, the others fail within NCCL_TIMEOUT (each names
    // the ranks it waited for); one that has not by then is stopped or
    // hung, and is ended rather than waited for.
    let timeout = oxccl::config::Config::load()
        .map(|c| c.timeout())
        .unwrap_or(Duration::from_secs(300));
    let done = launch::spawn(
        n,
        &argv,
        &env,
        launch::Output::Rank0,
        Duration::from_secs(args.time_limit),
        timeout + Duration::from_secs(2),
    )?;
    let failed_first = done.iter().find(|f| f.first_failure).map(|f| f.rank);
    let mut code = 0;
    for f in &done {
        match f.status {
            Some(s) if s.success() => {}
            Some(s) => {
                let first = if f.first_failure {
                    " (the first to fail)"
                } else {
                    ""
                };
                eprintln!("oxccl perf: rank {} exited with {s}{first}", f.rank);
                code = 1;
            }
            None => {
                match failed_first {
                    Some(r) => eprintln!(
                        "oxccl perf: rank {} was still running {:.0} s after rank {r} failed (NCCL_TIMEOUT is {:.0} s): stopped or hung, so it was ended",
                        f.rank,
                        (timeout + Duration::from_secs(2)).as_secs_f64(),
                        timeout.as_secs_f64()
                    ),
                    None => eprintln!(
                        "oxccl perf: rank {} was still running after {} s and was stopped",
                        f.rank, args.time_limit
                    ),
                }
                code = 1;
            }
        }
    }
    Ok(code)
}

fn run_rank(args: &PerfArgs, env: &RankEnv) -> Result<i32, String> {
    if args.device == "cuda" {
        return crate::perf_device::run_rank(args, env);
    }
    let (rank, n) = (env.rank, env.nranks);
    if args.init_only {
        return init_only(env);
    }
    selection(args, n)?;
    let comm =
        Comm::init_rank(n, env.id, rank, &CommConfig::default()).map_err(|e| e.to_string())?;
    let pages = if crate::hostmem::wanted()? {
        "buffers of 2 MiB and more on transparent huge pages (OXCCL_PERF_HUGEPAGES=0: the heap's)"
    } else {
        "buffers on the heap"
    };
    let what = format!("{n} ranks ({}), host memory, {pages}", env.launcher);
    let wrong = report(args, n, rank == 0, &what, &mut |case| {
        measure(&comm, args, case)
    })?;
    comm.destroy().map_err(|e| e.to_string())?;
    Ok(if wrong == 0 { 0 } else { 1 })
}

/// `--init-only`: times `init_rank` on each rank and prints, on rank 0,
/// the slowest rank's time and the span from the first rank's call to the
/// last rank's ready communicator (by the wall clock, which the ranks of
/// one machine share), both gathered by an all-reduce (max).
fn init_only(env: &RankEnv) -> Result<i32, String> {
    let (rank, n) = (env.rank, env.nranks);
    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let start = wall();
    let t = Instant::now();
    let comm =
        Comm::init_rank(n, env.id, rank, &CommConfig::default()).map_err(|e| e.to_string())?;
    let took = t.elapsed().as_secs_f64();
    let end = wall();
    let mut buf = [0u8; 24];
    for (i, v) in [took, end, -start].into_iter().enumerate() {
        buf[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    comm.all_reduce(None, &mut buf, DataType::Float64, RedOp::Max)
        .map_err(|e| e.to_string())?;
    let f = |i: usize| f64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    if rank == 0 {
        println!("# oxccl init, {n} ranks ({}), host memory", env.launcher);
        println!("# {:>6} {:>14} {:>14}", "ranks", "max_init(ms)", "span(ms)");
        println!(
            "  {n:>6} {:>14.1} {:>14.1}",
            f(0) * 1e3,
            (f(1) + f(2)) * 1e3
        );
    }
    comm.destroy().map_err(|e| e.to_string())?;
    Ok(0)
}

/// Runs one variant: warm-up, timed loop, then a checked run on fresh
/// random data with a poisoned output. Returns (mean time across ranks in
/// us, #wrong summed over ranks), or `None` where the variant does not exist.
fn measure(comm: &Comm, args: &PerfArgs, case: Case) -> Measured {
    if !case.exists() {
        return Ok(None);
    }
    let (rank, n) = (comm.user_rank(), comm.count());
    let (mut input, mut output) = case.buffers(n);
    case.prepare(rank, n, &mut input, &mut output);
    for _ in 0..args.warmup {
        case.run(comm, &input, &mut output)?;
    }
    comm.finalize()?;
    let t0 = Instant::now();
    for _ in 0..args.iters.max(1) {
        case.run(comm, &input, &mut output)?;
    }
    let mine = t0.elapsed().as_secs_f64() * 1e6 / args.iters.max(1) as f64;
    let mut wrong = 0u64;
    if args.check != 0 {
        case.prepare(rank, n, &mut input, &mut output);
        case.run(comm, &input, &mut output)?;
        wrong = case.wrong(rank, n, &output) + case.stray(rank, n, &output);
    }
    // Mean time and total #wrong over the ranks, outside the timed loop.
    let mut stats = Stats::pack(mine, wrong);
    comm.all_reduce(None, &mut stats.0, DataType::Float64, RedOp::Sum)?;
    Ok(Some(stats.mean_and_total(n)))
}
