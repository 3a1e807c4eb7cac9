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

use std::time::{Duration, Instant};

use nix::sys::signal::{raise, Signal};
use oxccl::cuda::{Context, Device, DeviceBuffer, Event, FillPattern, KernelSet, Stream};
use oxccl::{Comm, CommConfig, InitState, OpKind, ShrinkMode};
use oxccl_tests::{as_child, spawn, Rank};

const VICTIM: usize = 1;
const NRANKS: usize = 4;
const COUNT: usize = 1 << 18;
/// How long a survivor waits for one operation before calling it failed;
/// well below NCCL_TIMEOUT, so that the recovery, not the kernels' trap,
/// ends what hangs.
const WATCH: Duration = Duration::from_secs(4);
const TIMEOUT_S: &str = "10";

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

fn survive(r: Rank, mode: ShrinkMode, revoke_first: bool) {
    oxccl::log::init();
    let cfg = CommConfig {
        device: Some(0),
        ..CommConfig::default()
    };
    let comm = Comm::init_rank(r.nranks, r.id, r.rank, &cfg).expect("init_rank on GPU 0");
    let ctx = Context::primary(Device::get(0).unwrap()).unwrap();
    let dev = Dev {
        kernels: KernelSet::new(&ctx).unwrap(),
        stream: Stream::new(&ctx).unwrap(),
        input: DeviceBuffer::alloc(&ctx, COUNT * 4).unwrap(),
        output: DeviceBuffer::alloc(&ctx, COUNT * 4).unwrap(),
        ctx,
    };
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
    if oxccl_tests::gpu::ranks().is_none() {
        return;
    }
    let mut vars = vec![("NCCL_TIMEOUT", TIMEOUT_S)];
    vars.extend_from_slice(env);
    let t = Instant::now();
    let done = spawn(name, NRANKS, &vars, Duration::from_secs(180));
    eprintln!("{name}: {:?}", t.elapsed());
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
