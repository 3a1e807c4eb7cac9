//! `oxccl perf --device cuda`: the same cases on device memory. Each rank
//! owns one GPU, a stream, and device input/output buffers; operations are
//! enqueued on the stream as a framework would, timed on the host around
//! the enqueue loop and a stream synchronisation (as nccl-tests does), and
//! checked by copying the output back. `-g N` drives N GPUs from one thread,
//! each iteration one group over the N communicators (nccl-tests -g N).

use std::sync::Arc;
use std::time::Instant;

use oxccl::cuda::{Context, Device, DeviceBuffer, Stream};
use oxccl::{Comm, CommConfig, DataType, Op, OpKind, RedOp};

use crate::bench::{report, selection, Case, Measured, PerfArgs, Stats};
use crate::check::Coll;
use crate::launch::RankEnv;

/// One rank on one GPU.
struct DevRank {
    comm: Comm,
    ctx: Arc<Context>,
    stream: Stream,
    input: DeviceBuffer,
    output: DeviceBuffer,
}

impl DevRank {
    fn new(comm: Comm, gpu: usize, args: &PerfArgs, n: usize) -> oxccl::Result<DevRank> {
        let ctx = Context::primary(Device::get(gpu)?)?;
        // The largest case decides the buffers: every size and type fits.
        let (mut bin, mut bout) = (1usize, 1usize);
        for coll in Coll::ALL {
            for inplace in [false, true] {
                let case = Case {
                    coll,
                    dtype: DataType::Int8,
                    op: RedOp::Sum,
                    root: 0,
                    size: args.max_bytes,
                    inplace,
                };
                let (i, o) = case.buffers(n);
                bin = bin.max(i.len());
                bout = bout.max(o.len());
            }
        }
        Ok(DevRank {
            stream: Stream::new(&ctx)?,
            input: DeviceBuffer::alloc(&ctx, bin)?,
            output: DeviceBuffer::alloc(&ctx, bout)?,
            comm,
            ctx,
        })
    }

    /// Writes the case's prepared input and poisoned output to the GPU.
    fn prepare(&self, case: &Case, rank: usize, n: usize) -> oxccl::Result<()> {
        let (mut hin, mut hout) = case.buffers(n);
        case.prepare(rank, n, &mut hin, &mut hout);
        self.input.write(0, &hin)?;
        self.output.write(0, &hout)
    }

    fn wrong(&self, case: &Case, rank: usize, n: usize) -> oxccl::Result<u64> {
        let (_, mut hout) = case.buffers(n);
        self.output.read(0, &mut hout)?;
        Ok(case.wrong(rank, n, &hout))
    }
}

/// The operations one rank issues for a case, on device addresses.
fn ops(case: &Case, rank: usize, n: usize, inp: u64, out: u64, stream: u64) -> Vec<Op> {
    let (_, _, count) = case.counts(n);
    let es = case.dtype.size() as u64;
    let op = |kind, input: u64, output: u64| Op {
        kind,
        input: input as usize as *const u8,
        output: output as usize as *mut u8,
        count,
        dtype: case.dtype,
        redop: case.op,
        stream,
        user_tag: 0,
        call: Default::default(),
    };
    let block = |p: usize| p as u64 * count as u64 * es;
    let root = case.root;
    match (case.coll, case.inplace) {
        (Coll::AllReduce, false) => vec![op(OpKind::AllReduce, inp, out)],
        (Coll::AllReduce, true) => vec![op(OpKind::AllReduce, out, out)],
        (Coll::Broadcast, false) => vec![op(OpKind::Broadcast { root }, inp, out)],
        (Coll::Broadcast, true) => vec![op(OpKind::Broadcast { root }, out, out)],
        (Coll::Reduce, false) => vec![op(OpKind::Reduce { root }, inp, out)],
        (Coll::Reduce, true) => vec![op(OpKind::Reduce { root }, out, out)],
        (Coll::AllGather, false) => vec![op(OpKind::AllGather, inp, out)],
        (Coll::AllGather, true) => vec![op(OpKind::AllGather, out + block(rank), out)],
        (Coll::ReduceScatter, false) => vec![op(OpKind::ReduceScatter, inp, out)],
        (Coll::ReduceScatter, true) => vec![op(OpKind::ReduceScatter, out, out + block(rank))],
        (Coll::SendRecv, _) => vec![
            op(
                OpKind::Send {
                    peer: (rank + 1) % n,
                },
                inp,
                0,
            ),
            op(
                OpKind::Recv {
                    peer: (rank + n - 1) % n,
                },
                0,
                out,
            ),
        ],
        (Coll::AllToAll, _) => (0..n)
            .flat_map(|p| {
                [
                    op(OpKind::Send { peer: p }, inp + block(p), 0),
                    op(OpKind::Recv { peer: p }, 0, out + block(p)),
                ]
            })
            .collect(),
    }
}

/// One iteration: every local rank's operations in one group.
fn issue(ranks: &[DevRank], case: &Case, n: usize) -> oxccl::Result<()> {
    let calls = ranks
        .iter()
        .map(|d| (&d.comm, &d.input, &d.output, &d.stream));
    // SAFETY: the buffers are each rank's device allocations, sized for the
    // largest case, alive until the ranks are dropped after their streams
    // are synchronised; each stream is its rank's.
    unsafe { enqueue_group(calls, case, n) }
}

/// `case`'s operations of each (communicator, input, output, stream) in
/// one group.
///
/// # Safety
/// The buffers must be device memory of the communicator's GPU, large
/// enough for the case, and stay allocated until the stream has passed
/// the operations.
unsafe fn enqueue_group<'a>(
    calls: impl Iterator<Item = (&'a Comm, &'a DeviceBuffer, &'a DeviceBuffer, &'a Stream)>,
    case: &Case,
    n: usize,
) -> oxccl::Result<()> {
    oxccl::group_start();
    let mut r = Ok(());
    for (comm, input, output, stream) in calls {
        let rank = comm.user_rank();
        for op in ops(
            case,
            rank,
            n,
            input.ptr(),
            output.ptr(),
            stream.handle().raw(),
        ) {
            // SAFETY: the caller's contract.
            r = r.and_then(|_| unsafe { comm.enqueue(op) });
        }
    }
    let end = oxccl::group_end();
    r.and(end)
}

/// Waits for every rank's stream as nccl-tests does: polling the stream
/// and the communicator's asynchronous error, so that a peer's failure
/// (reported through the bootstrap) ends the wait with that error, the
/// communicator aborted, instead of a wait on the GPU that nothing ends.
fn synchronize(ranks: &[DevRank]) -> oxccl::Result<()> {
    ranks.iter().try_for_each(|d| wait(&d.comm, &d.stream))
}

/// One rank's stream, as [`synchronize`] waits for it.
fn wait(comm: &Comm, stream: &Stream) -> oxccl::Result<()> {
    while !stream.query()? {
        if let Err(e) = comm.async_error() {
            comm.abort();
            return Err(e);
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// Warm-up, timed loop, checked run; then, with one local rank of several
/// processes, the mean time and total #wrong over processes (summed by a
/// device all-reduce, outside the timed loop).
fn measure(ranks: &[DevRank], args: &PerfArgs, case: Case, n: usize) -> Measured {
    if !case.exists() {
        return Ok(None);
    }
    for d in ranks {
        d.prepare(&case, d.comm.user_rank(), n)?;
    }
    for _ in 0..args.warmup {
        issue(ranks, &case, n)?;
    }
    synchronize(ranks)?;
    let iters = args.iters.max(1);
    let t0 = Instant::now();
    for _ in 0..iters {
        issue(ranks, &case, n)?;
    }
    synchronize(ranks)?;
    let mine = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut wrong = 0;
    if args.check != 0 {
        for d in ranks {
            d.prepare(&case, d.comm.user_rank(), n)?;
        }
        issue(ranks, &case, n)?;
        synchronize(ranks)?;
        for d in ranks {
            wrong += d.wrong(&case, d.comm.user_rank(), n)?;
        }
    }
    if ranks.len() == n {
        return Ok(Some((mine, wrong)));
    }
    let d = &ranks[0];
    let mut stats = Stats::pack(mine, wrong);
    let buf = DeviceBuffer::alloc(&d.ctx, 16)?;
    buf.write(0, &stats.0)?;
    let op = Op {
        kind: OpKind::AllReduce,
        input: buf.ptr() as usize as *const u8,
        output: buf.ptr() as usize as *mut u8,
        count: 2,
        dtype: DataType::Float64,
        redop: RedOp::Sum,
        stream: d.stream.handle().raw(),
        user_tag: 0,
        call: Default::default(),
    };
    // SAFETY: `buf` is 16 bytes of this GPU's memory, kept until the
    // stream is synchronised below.
    unsafe { d.comm.enqueue(op) }?;
    wait(&d.comm, &d.stream)?;
    buf.read(0, &mut stats.0)?;
    Ok(Some(stats.mean_and_total(n)))
}

/// One checked run of `case` on `comm` (this rank's communicator, on GPU
/// `gpu`) with device buffers of the case's sizes: the case's input and a
/// poisoned output, the rank's operations in one group on a fresh stream,
/// and the number of wrong output elements. For tests that change a GPU
/// communicator (grow, shrink) and check every collective after it.
pub fn check_once_on_device(case: &Case, comm: &Comm, gpu: usize) -> oxccl::Result<u64> {
    if !case.exists() {
        return Ok(0);
    }
    let (n, rank) = (comm.count(), comm.user_rank());
    let ctx = Context::primary(Device::get(gpu)?)?;
    let stream = Stream::new(&ctx)?;
    let (mut hin, mut hout) = case.buffers(n);
    case.prepare(rank, n, &mut hin, &mut hout);
    let input = DeviceBuffer::alloc(&ctx, hin.len().max(1))?;
    let output = DeviceBuffer::alloc(&ctx, hout.len().max(1))?;
    input.write(0, &hin)?;
    output.write(0, &hout)?;
    // SAFETY: device buffers of this GPU sized by the case, kept until the
    // stream is synchronised below; the stream is ours.
    unsafe { enqueue_group(std::iter::once((comm, &input, &output, &stream)), case, n) }?;
    wait(comm, &stream)?;
    output.read(0, &mut hout)?;
    Ok(case.wrong(rank, n, &hout))
}

fn gpu_count() -> Result<usize, String> {
    oxccl::cuda::device_count().map_err(|e| format!("--device cuda: no usable GPU: {e}"))
}

/// One rank of a multi-process job, on GPU `LOCAL_RANK` (or the rank)
/// modulo the GPUs this machine has.
pub(crate) fn run_rank(args: &PerfArgs, env: &RankEnv) -> Result<i32, String> {
    let (rank, n) = (env.rank, env.nranks);
    selection(args, n)?;
    let gpus = gpu_count()?;
    let local = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(rank);
    let gpu = local % gpus;
    let cfg = CommConfig {
        device: Some(gpu),
        ..CommConfig::default()
    };
    let comm = Comm::init_rank(n, env.id, rank, &cfg).map_err(|e| e.to_string())?;
    let ranks = vec![DevRank::new(comm, gpu, args, n).map_err(|e| e.to_string())?];
    let what = format!("{n} ranks ({}), one GPU each, device memory", env.launcher);
    let wrong = report(args, n, rank == 0, &what, &mut |case| {
        measure(&ranks, args, case, n)
    })?;
    finish(ranks)?;
    Ok(if wrong == 0 { 0 } else { 1 })
}

/// `-g N`: this process drives GPUs 0..N, one rank each, from one thread.
/// With fewer GPUs than ranks, rank `i` takes GPU `i % GPUs` (several
/// ranks share a GPU, which NCCL refuses).
pub(crate) fn run_single_process(args: &PerfArgs, n: usize) -> Result<i32, String> {
    selection(args, n)?;
    let gpus = gpu_count()?;
    let devices: Vec<usize> = (0..n).map(|i| i % gpus).collect();
    let comms =
        Comm::init_all_devices(&devices, &CommConfig::default()).map_err(|e| e.to_string())?;
    let ranks = comms
        .into_iter()
        .zip(&devices)
        .map(|(c, &g)| DevRank::new(c, g, args, n))
        .collect::<oxccl::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let shared = if n > gpus {
        format!(", {gpus} GPU(s) shared")
    } else {
        String::new()
    };
    let what = format!("{n} ranks in one process (-g {n}{shared}), device memory");
    let wrong = report(args, n, true, &what, &mut |case| {
        measure(&ranks, args, case, n)
    })?;
    finish(ranks)?;
    Ok(if wrong == 0 { 0 } else { 1 })
}

fn finish(ranks: Vec<DevRank>) -> Result<(), String> {
    synchronize(&ranks).map_err(|e| e.to_string())?;
    for d in &ranks {
        d.comm.destroy().map_err(|e| e.to_string())?;
    }
    Ok(())
}
