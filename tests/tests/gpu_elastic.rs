//! Communicators on a GPU that survive a dead rank: four processes share
//! GPU 0 (any machine with one) and run a stream of checked all-reduces
//! on device buffers; rank 1 SIGKILLs itself in the middle of it. Each
//! survivor watches its operation as PyTorch's watchdog does (the host
//! never waits for device work): an operation that neither completes nor
//! fails within WATCH is a failure too. The survivors then drop rank 1,
//! with a revoke and NCCL_SHRINK_DEFAULT or with NCCL_SHRINK_ABORT alone,
//! which must end this rank's operations still on the GPU (its stream
//! must come free long before NCCL_TIMEOUT, when a kernel would trap and
//! take the context with it), and run 100 checked all-reduces on the
//! shrunk communicator, #wrong 0. Each mode runs on the shared-GPU path
//! (the leader's kernels, stream memory waits) and on every rank's
//! kernels (OXCCL_SHARED_GPU=kernels). Skips, saying so, without a GPU.
//!
//! Suspend and resume (NCCL_SUSPEND_MEM) on the same GPU, 3 cycles: the
//! memory the communicator reports as suspendable is released (its own
//! count, and cuMemGetInfo's free memory rises), operations are refused
//! while suspended, and checked all-reduces are right before and after
//! each resume; 4 processes on the shared-GPU path and on every rank's
//! kernels, and 2 ranks as threads of one process.
//!
//! Grow on the same GPU: a 2-rank communicator grows to 4 processes and
//! shrinks back to 2, every collective checked on device buffers after
//! each change.

use std::time::{Duration, Instant};

use nix::sys::signal::{raise, Signal};
use oxccl::cuda::{Context, Device, DeviceBuffer, Event, FillPattern, KernelSet, Stream};
use oxccl::{Comm, CommConfig, DataType, InitState, OpKind, ShrinkMode, UniqueId};
use oxccl_cli::launch::Finished;
use oxccl_tests::{as_child, spawn, Rank};

const VICTIM: usize = 1;
const NRANKS: usize = 4;
const COUNT: usize = 1 << 18;
/// How long a survivor waits for one operation before calling it failed;
/// well below NCCL_TIMEOUT, so that the recovery, not the kernels' trap,
/// ends what hangs.
const WATCH: Duration = Duration::from_secs(4);
const TIMEOUT_S: &str = "10";

/// Held while a test's ranks run (in `spawn_on_gpu`, or the one-process
/// case's threads): the suspend cases read the GPU's free memory
/// (cuMemGetInfo), which any other test of this file allocating on the
/// same GPU at the same moment would move (a 2-GPU machine failed
/// `gpu_suspend_resume_one_process` that way).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pattern(seed: u64) -> impl Fn(usize) -> FillPattern {
    move |rank| FillPattern {
        seed: seed * 31 + rank as u64,
        modulus: 13,
        offset: -6,
    }
}

/// One rank's device side: its GPU's kernels, a stream, two buffers.
struct Dev {
    ctx: std::sync::Arc<Context>,
    kernels: KernelSet,
    stream: Stream,
    input: DeviceBuffer,
    output: DeviceBuffer,
}

/// How one watched all-reduce ended.
enum Outcome {
    Done(usize),
    Failed(oxccl::Error),
    Hung,
}

impl Dev {
    /// All-reduces `pattern(seed)` over `comm`'s ranks (`globals`: each
    /// one's rank in the first communicator, whose pattern it fills) and
    /// counts the wrong elements; an error or a hang past WATCH instead.
    fn all_reduce(&self, comm: &Comm, globals: &[usize], me: usize, seed: u64) -> Outcome {
        let s = self.stream.handle();
        let p = pattern(seed);
        self.kernels
            .fill(self.input.ptr(), COUNT, oxccl::DataType::Float32, p(me), s)
            .unwrap();
        let op = oxccl::Op {
            kind: OpKind::AllReduce,
            input: self.input.ptr() as usize as *const u8,
            output: self.output.ptr() as usize as *mut u8,
            count: COUNT,
            dtype: oxccl::DataType::Float32,
            redop: oxccl::RedOp::Sum,
            stream: s.raw(),
            user_tag: 0,
            call: Default::default(),
        };
        // SAFETY: device buffers of this GPU of COUNT floats, alive until
        // the stream passed the operation (waited for below, or ended by
        // the recovery before the buffers go).
        if let Err(e) = unsafe { comm.enqueue(op) } {
            return Outcome::Failed(e);
        }
        let done = Event::new(&self.ctx, false).unwrap();
        done.record(s).unwrap();
        let start = Instant::now();
        while !done.query().unwrap() {
            if start.elapsed() > WATCH {
                return Outcome::Hung;
            }
            if let Err(e) = comm.async_error() {
                return Outcome::Failed(e);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = vec![0u8; COUNT * 4];
        self.output.read(0, &mut got).unwrap();
        let wrong = (0..COUNT)
            .filter(|&i| {
                let want: f32 = globals.iter().map(|&r| p(r).value(i) as f32).sum();
                f32::from_ne_bytes(got[i * 4..i * 4 + 4].try_into().unwrap()) != want
            })
            .count();
        Outcome::Done(wrong)
    }

    /// Whether the stream has passed everything enqueued on it, waiting up
    /// to `limit`.
    fn free_within(&self, limit: Duration) -> bool {
        let e = Event::new(&self.ctx, false).unwrap();
        e.record(self.stream.handle()).unwrap();
        let start = Instant::now();
        while !e.query().unwrap() {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// A child rank's communicator on GPU 0 (logging set up) and its device side.
fn join_on_gpu0(r: &Rank) -> (Comm, Dev) {
    oxccl::log::init();
    let cfg = CommConfig {
        device: Some(0),
        ..CommConfig::default()
    };
    let comm = Comm::init_rank(r.nranks, r.id, r.rank, &cfg).expect("init_rank on GPU 0");
    (comm, dev_on_gpu0())
}

/// A rank's device side on GPU 0.
fn dev_on_gpu0() -> Dev {
    let ctx = Context::primary(Device::get(0).unwrap()).unwrap();
    Dev {
        kernels: KernelSet::new(&ctx).unwrap(),
        stream: Stream::new(&ctx).unwrap(),
        input: DeviceBuffer::alloc(&ctx, COUNT * 4).unwrap(),
        output: DeviceBuffer::alloc(&ctx, COUNT * 4).unwrap(),
        ctx,
    }
}

const MIB: u64 = 1 << 20;

/// Three suspend/resume cycles of `comm` (every rank runs them at once):
/// checked all-reduces before each suspend and after each resume, the
/// memory figures, operations refused while suspended. One line of
/// figures per cycle; "PASS" at the end.
fn suspend_cycles(comm: &Comm, dev: &Dev, me: usize) -> String {
    let all: Vec<usize> = (0..comm.count()).collect();
    let check = |seed: u64, when: &str| match dev.all_reduce(comm, &all, me, seed) {
        Outcome::Done(0) => {}
        Outcome::Done(w) => panic!("rank {me}: all_reduce {when}: {w} wrong"),
        Outcome::Failed(e) => panic!("rank {me}: all_reduce {when}: {e}"),
        Outcome::Hung => panic!("rank {me}: all_reduce {when} hung"),
    };
    let mut lines = Vec::new();
    for cycle in 0..3u64 {
        for i in 0..3 {
            check(cycle * 100 + i, &format!("#{i} of cycle {cycle}"));
        }
        let before = comm.mem_stats().unwrap();
        assert!(!before.suspended, "rank {me}: {before:?}");
        assert_eq!(before.held_bytes, before.device_bytes, "rank {me}");
        assert!(
            before.suspendable_bytes > 0 && before.suspendable_bytes <= before.device_bytes,
            "rank {me}: nothing to release: {before:?}"
        );
        let (free0, _) = dev.ctx.mem_info().unwrap();
        let t = Instant::now();
        comm.suspend()
            .unwrap_or_else(|e| panic!("rank {me}: suspend of cycle {cycle}: {e}"));
        let suspend = t.elapsed();
        let (free1, _) = dev.ctx.mem_info().unwrap();
        let during = comm.mem_stats().unwrap();
        assert!(during.suspended, "rank {me}: {during:?}");
        assert_eq!(
            during.device_bytes, before.device_bytes,
            "rank {me}: NCCL's Total"
        );
        assert_eq!(
            during.suspendable_bytes, before.suspendable_bytes,
            "rank {me}"
        );
        assert_eq!(
            during.held_bytes,
            before.device_bytes - before.suspendable_bytes,
            "rank {me}: the communicator's own count after the suspend"
        );
        // Other ranks only free (their suspend) or take back the same
        // (their resume) meanwhile: the GPU's free memory rose by at
        // least most of what this rank released.
        let rose = free1 as i64 - free0 as i64;
        assert!(
            rose >= (before.suspendable_bytes / 2) as i64,
            "rank {me}: cuMemGetInfo free memory rose by {rose} bytes across the suspend; the communicator released {} bytes",
            before.suspendable_bytes
        );
        match dev.all_reduce(comm, &all, me, 7) {
            Outcome::Failed(e) => {
                assert!(e.to_string().contains("suspended"), "rank {me}: {e}")
            }
            _ => panic!("rank {me}: an all_reduce ran while suspended"),
        }
        let e = comm.suspend().unwrap_err().to_string();
        assert!(e.contains("already suspended"), "rank {me}: {e}");
        let t = Instant::now();
        comm.resume()
            .unwrap_or_else(|e| panic!("rank {me}: resume of cycle {cycle}: {e}"));
        let resume = t.elapsed();
        let after = comm.mem_stats().unwrap();
        assert_eq!(after, before, "rank {me}: the figures after the resume");
        for i in 0..3 {
            check(cycle * 100 + 50 + i, &format!("#{i} after resume {cycle}"));
        }
        lines.push(format!(
            "rank {me} cycle {cycle}: total {} MiB, suspendable {} MiB, held while suspended {} MiB; cuMemGetInfo free +{} MiB; suspend {:.1} ms, resume {:.1} ms",
            before.device_bytes / MIB,
            before.suspendable_bytes / MIB,
            during.held_bytes / MIB,
            rose / MIB as i64,
            suspend.as_secs_f64() * 1e3,
            resume.as_secs_f64() * 1e3,
        ));
    }
    lines.push(format!(
        "PASS rank {me}: 3 suspend/resume cycles, 18 checked all_reduces, 0 wrong"
    ));
    lines.join("\n")
}

fn suspend_child(r: Rank) {
    let (comm, dev) = join_on_gpu0(&r);
    println!("{}", suspend_cycles(&comm, &dev, r.rank));
    comm.destroy().unwrap();
}

/// NRANKS children running the test `name` with `env` and NCCL_TIMEOUT,
/// how each ended; `None` (the test is skipped) without a GPU.
fn spawn_on_gpu(name: &str, env: &[(&str, &str)], limit: Duration) -> Option<Vec<Finished>> {
    oxccl_tests::gpu::ranks()?;
    let mut vars = vec![("NCCL_TIMEOUT", TIMEOUT_S)];
    vars.extend_from_slice(env);
    let _serial = one_at_a_time();
    let t = Instant::now();
    let done = spawn(name, NRANKS, &vars, limit);
    eprintln!("{name}: {:?}", t.elapsed());
    Some(done)
}

/// Four ranks on GPU 0 run `suspend_cycles`; every one must pass.
fn run_suspend_case(name: &str, env: &[(&str, &str)]) {
    let Some(done) = spawn_on_gpu(name, env, Duration::from_secs(240)) else {
        return;
    };
    oxccl_tests::assert_all_ok(&done);
    for f in &done {
        assert!(f.stdout.contains("PASS"), "rank {}:\n{}", f.rank, f.stdout);
        eprintln!("{}", f.stdout.trim_end());
    }
}

#[test]
fn gpu_suspend_resume_shared_gpu() {
    let name = "gpu_suspend_resume_shared_gpu";
    if as_child(name, suspend_child) {
        return;
    }
    run_suspend_case(name, &[]);
}

#[test]
fn gpu_suspend_resume_on_kernels() {
    let name = "gpu_suspend_resume_on_kernels";
    if as_child(name, suspend_child) {
        return;
    }
    run_suspend_case(name, &[("OXCCL_SHARED_GPU", "kernels")]);
}

/// Two ranks as threads of this process on GPU 0 (each maps the other's
/// memory by address, no IPC).
#[test]
fn gpu_suspend_resume_one_process() {
    if oxccl_tests::gpu::ranks().is_none() {
        return;
    }
    let _serial = one_at_a_time();
    oxccl::log::init();
    let cfg = CommConfig::default().with("TIMEOUT", TIMEOUT_S);
    let comms = Comm::init_all_devices(&[0, 0], &cfg).expect("two ranks on GPU 0");
    let out: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || suspend_cycles(c, &dev_on_gpu0(), r)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (c, o) in comms.iter().zip(&out) {
        eprintln!("{o}");
        c.destroy().unwrap();
    }
}

fn survive(r: Rank, mode: ShrinkMode, revoke_first: bool) {
    let (comm, dev) = join_on_gpu0(&r);
    let all: Vec<usize> = (0..NRANKS).collect();
    for it in 0..5 {
        match dev.all_reduce(&comm, &all, r.rank, it) {
            Outcome::Done(0) => {}
            Outcome::Done(w) => panic!("rank {}: warm-up #{it}: {w} wrong", r.rank),
            Outcome::Failed(e) => panic!("rank {}: warm-up #{it}: {e}", r.rank),
            Outcome::Hung => panic!("rank {}: warm-up #{it} hung", r.rank),
        }
    }
    if r.rank == VICTIM {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            let _ = raise(Signal::SIGKILL);
        });
    }
    let mut it = 5;
    let t0 = Instant::now();
    let how = loop {
        match dev.all_reduce(&comm, &all, r.rank, it) {
            Outcome::Done(0) => {}
            Outcome::Done(w) => panic!("rank {}: all_reduce #{it}: {w} wrong", r.rank),
            Outcome::Failed(e) => break format!("failed: {e}"),
            Outcome::Hung => break format!("hung for {WATCH:?}"),
        }
        it += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the victim never left"
        );
    };
    eprintln!("rank {}: all_reduce #{it} {how}", r.rank);
    let t = Instant::now();
    if revoke_first {
        assert_eq!(comm.revoke().unwrap(), InitState::Ready);
        assert!(comm.finalize().is_err(), "finalize after revoke");
    }
    let kid = comm
        .shrink(&[VICTIM], &CommConfig::default(), mode)
        .unwrap_or_else(|e| panic!("rank {}: {mode:?} shrink: {e}", r.rank));
    let shrink = t.elapsed();
    // The parent's work no longer holds the stream: ended, not trapped.
    assert!(
        dev.free_within(Duration::from_secs(5)),
        "rank {}: the stream still waits on the parent's work after the shrink",
        r.rank
    );
    eprintln!(
        "rank {}: {mode:?} shrink (revoke first: {revoke_first}) in {shrink:?}",
        r.rank
    );
    assert_eq!(kid.count(), NRANKS - 1);
    let survivors: Vec<usize> = all.iter().copied().filter(|&g| g != VICTIM).collect();
    let mut wrong = 0;
    for i in 0..100 {
        match dev.all_reduce(&kid, &survivors, r.rank, 1000 + i) {
            Outcome::Done(w) => wrong += w,
            Outcome::Failed(e) => panic!("rank {}: all_reduce #{i} after shrink: {e}", r.rank),
            Outcome::Hung => panic!("rank {}: all_reduce #{i} after shrink hung", r.rank),
        }
    }
    assert_eq!(wrong, 0, "rank {}: wrong elements after the shrink", r.rank);
    kid.destroy().unwrap();
    comm.destroy().unwrap();
    println!(
        "PASS rank {}: {how}; shrink {shrink:?}; 100 all_reduces, 0 wrong",
        r.rank
    );
}

fn run_case(name: &str, env: &[(&str, &str)]) {
    let Some(done) = spawn_on_gpu(name, env, Duration::from_secs(180)) else {
        return;
    };
    for f in &done {
        if f.rank == VICTIM {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                f.status.and_then(|s| s.signal()),
                Some(Signal::SIGKILL as i32),
                "the victim was not killed: {:?}\n{}",
                f.status,
                f.stderr
            );
            continue;
        }
        assert!(
            f.status.is_some_and(|s| s.success()) && f.stdout.contains("PASS"),
            "rank {}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            f.rank,
            f.status,
            f.stdout,
            f.stderr
        );
        let lines: Vec<&str> = f
            .stderr
            .lines()
            .filter(|l| l.contains("all_reduce #") || l.contains("shrink"))
            .collect();
        eprintln!("{}\n{}", lines.join("\n"), f.stdout.trim_end());
    }
}

#[test]
fn gpu_killed_rank_revoke_then_shrink_default() {
    let name = "gpu_killed_rank_revoke_then_shrink_default";
    if as_child(name, |r| survive(r, ShrinkMode::Default, true)) {
        return;
    }
    run_case(name, &[]);
}

#[test]
fn gpu_killed_rank_shrink_abort() {
    let name = "gpu_killed_rank_shrink_abort";
    if as_child(name, |r| survive(r, ShrinkMode::Abort, false)) {
        return;
    }
    run_case(name, &[]);
}

#[test]
fn gpu_killed_rank_revoke_then_shrink_default_on_kernels() {
    let name = "gpu_killed_rank_revoke_then_shrink_default_on_kernels";
    if as_child(name, |r| survive(r, ShrinkMode::Default, true)) {
        return;
    }
    run_case(name, &[("OXCCL_SHARED_GPU", "kernels")]);
}

#[test]
fn gpu_killed_rank_shrink_abort_on_kernels() {
    let name = "gpu_killed_rank_shrink_abort_on_kernels";
    if as_child(name, |r| survive(r, ShrinkMode::Abort, false)) {
        return;
    }
    run_case(name, &[("OXCCL_SHARED_GPU", "kernels")]);
}

/// Sizes every collective is checked at after each change: one element
/// per rank's share and a size that takes several steps of every path.
const GROW_SIZES: [usize; 2] = [64, 4 << 20];

/// Every collective on `comm` (device buffers of GPU 0), at both roots'
/// ends of the communicator; a panic naming the wrong cases.
fn check_gpu_comm(comm: &Comm, n: usize, me: usize, when: &str) {
    assert_eq!(comm.count(), n, "rank {me} {when}");
    for root in [0, n - 1] {
        let bad = oxccl_tests::gpu::every_collective_on_gpu(comm, 0, root, &GROW_SIZES);
        assert!(
            bad.is_empty(),
            "rank {me} {when}, root {root}:\n{}",
            bad.join("\n")
        );
    }
}

/// Issue 16 item 3 on a GPU. Four processes start with a host-memory
/// communicator that carries the ids, as an application's launcher would.
/// Ranks 0 and 1 make a communicator on GPU 0 and check it; its rank 0
/// makes the grow id (its partner receives it inside grow), the launcher
/// hands it to ranks 2 and 3, which join with init_rank on GPU 0; all four
/// check every collective; then 2 and 3 leave, 0 and 1 shrink back and
/// check again.
fn grow_child(r: Rank) {
    oxccl::log::init();
    let launcher = r.comm(&[]);
    let gpu = CommConfig {
        device: Some(0),
        ..CommConfig::default()
    };
    let mut id = [0u8; 128];
    if r.rank == 0 {
        id = Comm::unique_id().unwrap().0;
    }
    launcher
        .broadcast(None, &mut id, DataType::Uint8, 0)
        .unwrap();
    let pair = (r.rank < 2).then(|| {
        let p = Comm::init_rank(2, UniqueId(id), r.rank, &gpu).expect("pair on GPU 0");
        check_gpu_comm(&p, 2, r.rank, "before the grow");
        if r.rank == 0 {
            id = p.grow_id().unwrap().0;
        }
        p
    });
    launcher
        .broadcast(None, &mut id, DataType::Uint8, 0)
        .unwrap();
    let id = UniqueId(id);
    let t = Instant::now();
    let big = match &pair {
        Some(p) => p.grow(4, (r.rank == 0).then_some(id), &CommConfig::default()),
        None => Comm::init_rank(4, id, r.rank, &gpu),
    }
    .unwrap_or_else(|e| panic!("rank {}: grow: {e}", r.rank));
    let grown = t.elapsed();
    check_gpu_comm(&big, 4, r.rank, "after the grow");
    let mut line = format!("rank {}: grown to 4 in {grown:?}", r.rank);
    if let Some(p) = &pair {
        let t = Instant::now();
        let back = big
            .shrink(&[2, 3], &CommConfig::default(), ShrinkMode::Default)
            .unwrap();
        line += &format!(", shrunk back to 2 in {:?}", t.elapsed());
        check_gpu_comm(&back, 2, r.rank, "after the shrink");
        back.destroy().unwrap();
        p.destroy().unwrap();
    }
    big.destroy().unwrap();
    launcher.destroy().unwrap();
    println!("PASS {line}; every collective 0 wrong after each change");
}

#[test]
fn gpu_grow_two_to_four_and_back() {
    let name = "gpu_grow_two_to_four_and_back";
    if as_child(name, grow_child) {
        return;
    }
    let Some(done) = spawn_on_gpu(name, &[], Duration::from_secs(240)) else {
        return;
    };
    oxccl_tests::assert_all_ok(&done);
    for f in &done {
        assert!(f.stdout.contains("PASS"), "rank {}:\n{}", f.rank, f.stdout);
        eprintln!("{}", f.stdout.trim_end());
    }
}
