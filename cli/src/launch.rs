//! Where a rank learns its place in a job, and how local ranks are started:
//! as child processes of one command (`--ranks N`), or by a launcher
//! (torchrun, mpirun, Slurm) whose variables name the rank and size.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use oxccl::UniqueId;

/// This process's rank, the job size, and the communicator id.
#[derive(Debug, Clone)]
pub struct RankEnv {
    pub rank: usize,
    pub nranks: usize,
    pub id: UniqueId,
    /// Which launcher set this up, for messages.
    pub launcher: &'static str,
}

pub const ENV_RANK: &str = "OXCCL_RANK";
pub const ENV_NRANKS: &str = "OXCCL_NRANKS";
pub const ENV_ID: &str = "OXCCL_UNIQUE_ID";

pub fn id_to_hex(id: &UniqueId) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn id_from_hex(s: &str) -> Result<UniqueId, String> {
    if s.len() != 256 {
        return Err(format!("{ENV_ID} must be 256 hex digits, got {}", s.len()));
    }
    let mut id = UniqueId([0; 128]);
    for (i, b) in id.0.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{ENV_ID} is not hex"))?;
    }
    Ok(id)
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn num(name: &str) -> Result<Option<usize>, String> {
    var(name)
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| format!("{name}={v:?} is not a number"))
        })
        .transpose()
}

/// Reads the rank layout a launcher left in the environment; `None` when
/// this process was not started by one.
pub fn from_env() -> Result<Option<RankEnv>, String> {
    if let (Some(rank), Some(nranks)) = (num(ENV_RANK)?, num(ENV_NRANKS)?) {
        let id = id_from_hex(
            &var(ENV_ID).ok_or_else(|| format!("{ENV_RANK} is set but {ENV_ID} is not"))?,
        )?;
        return Ok(Some(RankEnv {
            rank,
            nranks,
            id,
            launcher: "oxccl",
        }));
    }
    let found = [
        ("torchrun", "RANK", "WORLD_SIZE"),
        ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("mpirun", "PMI_RANK", "PMI_SIZE"),
        ("Slurm", "SLURM_PROCID", "SLURM_NTASKS"),
    ]
    .into_iter()
    .find_map(|(who, r, s)| Some((who, num(r).ok()??, num(s).ok()??)));
    let Some((launcher, rank, nranks)) = found else {
        return Ok(None);
    };
    if var("NCCL_COMM_ID").is_none() {
        // torchrun's store holds MASTER_PORT; the bootstrap root takes the next one.
        match (var("MASTER_ADDR"), num("MASTER_PORT")?) {
            (Some(addr), Some(port)) => std::env::set_var("NCCL_COMM_ID", format!("{addr}:{}", port + 1)),
            _ => {
                return Err(format!(
                    "started by {launcher} (rank {rank} of {nranks}) but neither NCCL_COMM_ID nor MASTER_ADDR/MASTER_PORT is set: set NCCL_COMM_ID=<host of rank 0>:<free port>"
                ))
            }
        }
    }
    let id = oxccl::Comm::unique_id().map_err(|e| e.to_string())?;
    Ok(Some(RankEnv {
        rank,
        nranks,
        id,
        launcher,
    }))
}

/// Makes the child of `cmd` die (SIGKILL) when this process does, however
/// it dies: a launcher killed by SIGKILL runs no clean-up of its own, and
/// its ranks would otherwise go on as orphans, holding their cores and
/// waiting for peers until NCCL_TIMEOUT or for ever. Linux ties the signal
/// to the thread that started the child: [`spawn`] starts and waits for
/// its children on one thread, which outlives them.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    let arm = move || -> std::io::Result<()> {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        // A parent that died before the line above sends nothing: the
        // child has been handed to another process already.
        if std::os::unix::process::parent_id() != parent {
            return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: `arm` runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two system calls
    // (prctl, getppid) and allocates nothing (the io::Error of an errno is
    // a plain value).
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(arm);
    }
}

/// How each child's output is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Rank 0 writes to this process's stdout, the others' stdout is dropped.
    Rank0,
    /// Every child's stdout and stderr are captured.
    Capture,
}

/// What became of one child.
#[derive(Debug)]
pub struct Finished {
    pub rank: usize,
    /// `None`: killed at the time limit.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// The first rank seen to exit with a failure.
    pub first_failure: bool,
}

/// Starts `n` ranks as children running this executable with `args`, the
/// id of a communicator rooted in this process, and `env`; waits for all,
/// killing every one still running at `limit`, or `after_failure` after
/// the first rank failed: the others have then failed too within
/// NCCL_TIMEOUT, or are stopped or hung and never will.
pub fn spawn(
    n: usize,
    args: &[String],
    env: &[(String, String)],
    output: Output,
    limit: Duration,
    after_failure: Duration,
) -> Result<Vec<Finished>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let id = oxccl::Comm::unique_id().map_err(|e| e.to_string())?;
    let hex = id_to_hex(&id);
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_NRANKS, n.to_string())
            .env(ENV_ID, &hex);
        for (k, v) in env {
            cmd.env(k, v);
        }
        die_with_parent(&mut cmd);
        match output {
            Output::Rank0 if rank == 0 => cmd.stdout(Stdio::inherit()),
            Output::Rank0 => cmd.stdout(Stdio::null()),
            Output::Capture => cmd.stdout(Stdio::piped()).stderr(Stdio::piped()),
        };
        match cmd.spawn() {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("cannot start rank {rank}: {e}"));
            }
        }
    }
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let readers: Vec<_> = children
        .iter_mut()
        .map(|(_, c)| {
            let out = c.stdout.take();
            let err = c.stderr.take();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut o = String::new();
                let mut e = String::new();
                if let Some(mut s) = out {
                    let _ = s.read_to_string(&mut o);
                }
                if let Some(mut s) = err {
                    let _ = s.read_to_string(&mut e);
                }
                (o, e)
            })
        })
        .collect();
    let mut deadline = Instant::now() + limit;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    let mut first_failure = None;
    while statuses.iter().any(Option::is_none) && Instant::now() < deadline {
        for (rank, c) in &mut children {
            if statuses[*rank].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    statuses[*rank] = Some(s);
                    if !s.success() && first_failure.is_none() {
                        first_failure = Some(*rank);
                        deadline = deadline.min(Instant::now() + after_failure);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for (rank, c) in &mut children {
        if statuses[*rank].is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    Ok(readers
        .into_iter()
        .enumerate()
        .map(|(rank, h)| {
            let (stdout, stderr) = h.join().unwrap_or_default();
            Finished {
                rank,
                status: statuses[rank],
                stdout,
                stderr,
                first_failure: first_failure == Some(rank),
            }
        })
        .collect())
}
