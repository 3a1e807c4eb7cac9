//! Device buffers over a network that reaches only host memory: ranks on
//! other nodes, or GPUs told not to map each other (`NCCL_P2P_DISABLE`).
//!
//! Each group is three phases on the caller's stream, none of which makes
//! the enqueuing thread wait: copies of the device inputs into pinned
//! staging; a wait (on the GPU, `cuStreamWaitValue64`) for this
//! communicator's proxy thread, which runs the host algorithms over the net
//! plugin on the staging and then raises a flag; copies of the results back.
//! Work queued before the group is seen (the copies follow it on the
//! stream), work queued after sees the results (it follows the copies back).
//!
//! One staging area serves every group: a group's copies in come after the
//! previous group's copies out on the stream, so the proxy never works on
//! bytes the GPU is still moving. A larger group gets a larger area; the old
//! one stays allocated until the communicator goes, since copies out of it
//! may still be queued.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use tracing::{debug, warn};

use super::core::Core;
use super::on_device::{check_reachable, stream as stream_of};
use crate::cuda::{Context, Event, HostFlag, PinnedHost, RawStream, SavedCurrent};
use crate::error::{Error, Result};
use crate::exec::mem::OpBuffers;
use crate::op::{Op, OpKind};

/// Staging regions start on this boundary (copy engines and vector loads like it).
const ALIGN: usize = 256;

/// One group handed to the proxy.
struct Job {
    seq: u64,
    /// Recorded after the copies in: the staging holds the inputs.
    staged: Event,
    staging: Arc<PinnedHost>,
    /// The group with host addresses into `staging`.
    ops: Vec<(Op, OpBuffers)>,
}

/// The enqueuing side's state.
struct Enqueue {
    seq: u64,
    staging: Option<Arc<PinnedHost>>,
    /// Outgrown staging areas, kept until the communicator goes.
    retired: Vec<Arc<PinnedHost>>,
    last_stream: Option<RawStream>,
    order: Event,
    /// Recorded after the last group's copies out.
    done: Event,
    tx: Option<Sender<Job>>,
    proxy: Option<JoinHandle<()>>,
}

pub(crate) struct Staged {
    ctx: Arc<Context>,
    flag: Arc<HostFlag>,
    state: Mutex<Enqueue>,
    failed: Arc<Mutex<Option<Error>>>,
}

/// A span of device memory some operation of the group reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    start: u64,
    end: u64,
    read: bool,
    written: bool,
    /// Offset in the staging area.
    at: usize,
}

/// Merges the group's buffer extents into disjoint regions (in-place
/// operations name overlapping memory, which must stay one memory) and
/// places them in a staging area; returns the regions and its size.
fn layout(ops: &[(Op, OpBuffers)]) -> (Vec<Region>, usize) {
    let mut ext: Vec<Region> = Vec::new();
    for (_, b) in ops {
        let sides = [
            (b.input as u64, b.in_bytes, true),
            (b.output as u64, b.out_bytes, false),
        ];
        for (start, len, read) in sides.into_iter().filter(|s| s.1 > 0) {
            ext.push(Region {
                start,
                end: start + len as u64,
                read,
                written: !read,
                at: 0,
            });
        }
    }
    ext.sort_by_key(|r| r.start);
    let mut merged: Vec<Region> = Vec::new();
    for r in ext {
        match merged.last_mut() {
            Some(m) if r.start < m.end => {
                m.end = m.end.max(r.end);
                m.read |= r.read;
                m.written |= r.written;
            }
            _ => merged.push(r),
        }
    }
    let mut at = 0;
    for m in &mut merged {
        m.at = at;
        at += ((m.end - m.start) as usize).next_multiple_of(ALIGN);
    }
    (merged, at)
}

/// The staging offset of device address `p`, if some region holds it.
fn staged_at(regions: &[Region], p: u64) -> Option<usize> {
    regions
        .iter()
        .find(|r| r.start <= p && p < r.end)
        .map(|r| r.at + (p - r.start) as usize)
}

/// The host address of device address `p` in the staging, if some region holds it.
fn translate(regions: &[Region], base: *mut u8, p: u64) -> Option<*mut u8> {
    staged_at(regions, p).map(|at| base.wrapping_add(at))
}

/// Below this many bytes a collective is staged whole: a piece costs a
/// host collective's setup and an event, which small buffers cannot hide.
const PIPELINE_MIN_BYTES: usize = 1 << 20;
/// Smallest piece, and most pieces, of a pipelined collective.
const PIECE_MIN_BYTES: usize = 256 << 10;
const MAX_PIECES: usize = 16;

/// A range of elements of a collective whose every element is independent
/// of the others (all-reduce, broadcast, reduce): such a range is itself
/// the same collective on sub-buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    lo: usize,
    hi: usize,
}

impl Piece {
    /// The operation on this piece's elements, with its device buffers.
    fn of(&self, op: &Op, b: &OpBuffers) -> (Op, OpBuffers) {
        let es = op.dtype.size();
        let (off, n) = (self.lo * es, (self.hi - self.lo) * es);
        let at = |p: *const u8, used: usize| {
            if used == 0 {
                p
            } else {
                p.wrapping_add(off)
            }
        };
        let input = at(b.input, b.in_bytes);
        let output = at(b.output, b.out_bytes) as *mut u8;
        let bufs = OpBuffers {
            input,
            in_bytes: if b.in_bytes == 0 { 0 } else { n },
            output,
            out_bytes: if b.out_bytes == 0 { 0 } else { n },
        };
        let op = Op {
            input,
            output,
            count: self.hi - self.lo,
            ..*op
        };
        (op, bufs)
    }
}

/// The pieces a group is pipelined in; empty when it is staged whole (more
/// than one operation, an operation whose elements depend on their rank's
/// block, or too small to gain).
fn pieces_of(ops: &[(Op, OpBuffers)]) -> Vec<Piece> {
    pieces_up_to(ops, max_pieces())
}

fn pieces_up_to(ops: &[(Op, OpBuffers)], most: usize) -> Vec<Piece> {
    let [(op, b)] = ops else {
        return Vec::new();
    };
    let elementwise = matches!(
        op.kind,
        OpKind::AllReduce | OpKind::Broadcast { .. } | OpKind::Reduce { .. }
    );
    let bytes = b.in_bytes.max(b.out_bytes);
    if !elementwise || bytes < PIPELINE_MIN_BYTES || op.count == 0 {
        return Vec::new();
    }
    if most <= 1 {
        return Vec::new();
    }
    let es = op.dtype.size().max(1);
    let per = (bytes / most).max(PIECE_MIN_BYTES) / es;
    let per = per.max(1);
    (0..op.count)
        .step_by(per)
        .map(|lo| Piece {
            lo,
            hi: (lo + per).min(op.count),
        })
        .collect()
}

/// `OXCCL_STAGED_PIECES=N` pipelines in up to N pieces (at most
/// [`MAX_PIECES`]). Whole buffers (1) are the default: on one H100 with two
/// processes, 16 pieces were slower at every size from 8 MiB to 1 GiB,
/// through shared memory and through the network (docs/PERF.md, session
/// 5), since each piece pays a host collective's setup and an event
/// round trip while both ranks' copies share one GPU.
fn max_pieces() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("OXCCL_STAGED_PIECES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1)
            .min(MAX_PIECES)
    })
}

/// `op` with its device addresses replaced by their places in the staging.
fn to_host(regions: &[Region], base: *mut u8, op: &Op, b: &OpBuffers) -> (Op, OpBuffers) {
    let input = translate(regions, base, b.input as u64).map_or(b.input, |p| p as *const u8);
    let output = translate(regions, base, b.output as u64).unwrap_or(b.output);
    let op = Op {
        input,
        output,
        stream: 0,
        ..*op
    };
    let bufs = OpBuffers {
        input,
        output,
        ..*b
    };
    (op, bufs)
}

/// The staging offset of device address `p`, which some region holds.
fn offset_of(regions: &[Region], p: u64) -> Result<usize> {
    staged_at(regions, p)
        .ok_or_else(|| Error::Internal(format!("{p:#x} is outside every staged region")))
}

fn copy_in(
    staging: &PinnedHost,
    regions: &[Region],
    src: u64,
    len: usize,
    stream: RawStream,
) -> Result<()> {
    staging.copy_from_device(offset_of(regions, src)?, src, len, stream)
}

fn copy_out(
    staging: &PinnedHost,
    regions: &[Region],
    dst: u64,
    len: usize,
    stream: RawStream,
) -> Result<()> {
    staging.copy_to_device(dst, offset_of(regions, dst)?, len, stream)
}

impl Staged {
    pub(crate) fn new(ctx: Arc<Context>) -> Result<Staged> {
        let flag = Arc::new(HostFlag::new(&ctx)?);
        Ok(Staged {
            state: Mutex::new(Enqueue {
                seq: 0,
                staging: None,
                retired: Vec::new(),
                last_stream: None,
                order: Event::new(&ctx, false)?,
                done: Event::new(&ctx, false)?,
                tx: None,
                proxy: None,
            }),
            ctx,
            flag,
            failed: Arc::default(),
        })
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The first failure of a group the proxy ran, if any.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    /// Enqueues one group of this communicator's operations.
    pub(crate) fn execute(&self, core: &Core, ops: &[(Op, OpBuffers)]) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(
                e.context("an earlier staged operation failed; the communicator is unusable")
            );
        }
        let gpu = self.ctx.device().ordinal();
        for (op, bufs) in ops {
            check_reachable(gpu, op, bufs)?;
        }
        let Some(first) = ops.first() else {
            return Ok(());
        };
        let _restore = SavedCurrent::save()?;
        self.ctx.bind()?;
        let mut st = self
            .state
            .lock()
            .map_err(|_| Error::Internal("staging state poisoned by an earlier panic".into()))?;
        let (regions, bytes) = layout(ops);
        let stream = stream_of(&first.0);
        let mut others: Vec<RawStream> = ops
            .iter()
            .map(|(op, _)| stream_of(op))
            .filter(|s| *s != stream)
            .collect();
        others.sort_by_key(|s| s.raw());
        others.dedup();
        // The staging is shared: this group follows the last one even when
        // it comes on another stream; and every stream of the group.
        if let Some(last) = st.last_stream.filter(|l| *l != stream) {
            st.order.record(last)?;
            st.order.wait_on(stream)?;
        }
        for s in &others {
            st.order.record(*s)?;
            st.order.wait_on(stream)?;
        }
        st.last_stream = Some(stream);
        let staging = match &st.staging {
            Some(s) if s.len() >= bytes => s.clone(),
            _ => {
                let grow = st.staging.as_ref().map_or(0, |s| s.len() * 2);
                let s = Arc::new(PinnedHost::alloc(&self.ctx, bytes.max(grow).max(ALIGN))?);
                if let Some(old) = st.staging.replace(s.clone()) {
                    st.retired.push(old);
                }
                debug!(target: "oxccl::coll", "rank {}: staging area of {} bytes in pinned host memory", core.rank, s.len());
                s
            }
        };
        let base = staging.host_ptr();
        let pieces = pieces_of(ops);
        let mut jobs = Vec::with_capacity(pieces.len().max(1));
        if pieces.is_empty() {
            // Whole group at once: every input in, one job, every output back.
            for r in regions.iter().filter(|r| r.read) {
                staging.copy_from_device(r.at, r.start, (r.end - r.start) as usize, stream)?;
            }
            let staged = Event::new(&self.ctx, false)?;
            staged.record(stream)?;
            let host_ops = ops
                .iter()
                .map(|(op, b)| to_host(&regions, base, op, b))
                .collect();
            st.seq += 1;
            jobs.push(Job {
                seq: st.seq,
                staged,
                staging: staging.clone(),
                ops: host_ops,
            });
            self.flag.wait_on(stream, st.seq)?;
            for r in regions.iter().filter(|r| r.written) {
                staging.copy_to_device(r.start, r.at, (r.end - r.start) as usize, stream)?;
            }
        } else {
            // Pipelined: every piece's copy in is queued first, each with its
            // event, so the proxy starts on piece 0 while later pieces cross
            // PCIe; then, per piece, the stream waits for the proxy's flag
            // and copies that piece back while the proxy works on the next.
            let (op, b) = &ops[0];
            let first = st.seq + 1;
            for (i, piece) in pieces.iter().enumerate() {
                let (pop, pb) = piece.of(op, b);
                if pb.in_bytes > 0 {
                    copy_in(&staging, &regions, pb.input as u64, pb.in_bytes, stream)?;
                }
                let staged = Event::new(&self.ctx, false)?;
                staged.record(stream)?;
                jobs.push(Job {
                    seq: first + i as u64,
                    staged,
                    staging: staging.clone(),
                    ops: vec![to_host(&regions, base, &pop, &pb)],
                });
            }
            for (i, piece) in pieces.iter().enumerate() {
                let (_, pb) = piece.of(op, b);
                self.flag.wait_on(stream, first + i as u64)?;
                if pb.out_bytes > 0 {
                    copy_out(&staging, &regions, pb.output as u64, pb.out_bytes, stream)?;
                }
            }
            st.seq += pieces.len() as u64;
            debug!(target: "oxccl::coll", "rank {}: {} of {} B staged in {} pieces", core.rank, op.kind.name(), b.in_bytes.max(b.out_bytes), pieces.len());
        }
        st.done.record(stream)?;
        for s in &others {
            st.done.wait_on(*s)?;
        }
        if st.tx.is_none() {
            let (tx, rx) = channel();
            let this = core.this();
            let (ctx, flag, failed) = (self.ctx.clone(), self.flag.clone(), self.failed.clone());
            let rank = core.rank;
            let h = std::thread::Builder::new()
                .name(format!("oxccl-proxy-{rank}"))
                .spawn(move || proxy(this, ctx, flag, failed, rx))
                .map_err(|e| {
                    Error::System(format!("cannot start the staging proxy thread: {e}"))
                })?;
            st.tx = Some(tx);
            st.proxy = Some(h);
        }
        let tx = st
            .tx
            .as_ref()
            .ok_or_else(|| Error::Internal("the staging proxy thread is gone".into()))?;
        for job in jobs {
            tx.send(job)
                .map_err(|_| Error::Internal("the staging proxy thread is gone".into()))?;
        }
        Ok(())
    }
}

/// Runs the groups in order; raises the flag after each, failed or not,
/// so a stream never waits forever (the failure is the communicator's
/// asynchronous error instead).
fn proxy(
    core: Weak<Core>,
    ctx: Arc<Context>,
    flag: Arc<HostFlag>,
    failed: Arc<Mutex<Option<Error>>>,
    rx: Receiver<Job>,
) {
    let _ = ctx.bind();
    for job in rx {
        let r = job.staged.synchronize().and_then(|_| {
            if failed.lock().map(|f| f.is_some()).unwrap_or(true) {
                return Err(Error::InvalidUsage(
                    "skipped: an earlier staged operation failed".into(),
                ));
            }
            match core.upgrade() {
                Some(c) => c.execute_host(&job.ops),
                None => Err(Error::InvalidUsage(
                    "the communicator was destroyed with operations still queued".into(),
                )),
            }
        });
        if let Err(e) = r {
            warn!(target: "oxccl::coll", "staged operations #{}: {e}", job.seq);
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert(e);
            }
        }
        drop(job.ops);
        flag.store(job.seq);
        drop(job.staging);
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let Ok(st) = self.state.get_mut() else {
            return;
        };
        // The proxy drains what is queued (and fails it: the core is gone),
        // then the copies out must finish before the staging is freed.
        st.tx = None;
        if let Some(h) = st.proxy.take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        let _ = st.done.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, RedOp};
    use crate::op::OpKind;

    fn op(
        kind: OpKind,
        input: u64,
        output: u64,
        in_bytes: usize,
        out_bytes: usize,
    ) -> (Op, OpBuffers) {
        let o = Op {
            kind,
            input: input as usize as *const u8,
            output: output as usize as *mut u8,
            count: 1,
            dtype: DataType::Float32,
            redop: RedOp::Sum,
            stream: 0,
        };
        let b = OpBuffers {
            input: o.input,
            in_bytes,
            output: o.output,
            out_bytes,
        };
        (o, b)
    }

    #[test]
    fn in_place_all_gather_is_one_region_read_and_written() {
        // Rank 1 of 2: input is the second half of the output.
        let ops = [op(OpKind::AllGather, 0x1000 + 400, 0x1000, 400, 800)];
        let (r, bytes) = layout(&ops);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].start, r[0].end, r[0].read, r[0].written),
            (0x1000, 0x1000 + 800, true, true)
        );
        assert_eq!(bytes, 1024);
        let base = 0x9000usize as *mut u8;
        assert_eq!(
            translate(&r, base, 0x1000 + 400),
            Some(base.wrapping_add(400))
        );
    }

    #[test]
    fn out_of_place_and_p2p_regions_are_apart_and_aligned() {
        let ops = [
            op(OpKind::AllReduce, 0x10_000, 0x20_000, 100, 100),
            op(OpKind::Send { peer: 1 }, 0x30_000, 0, 10, 0),
            op(OpKind::Recv { peer: 1 }, 0, 0x40_000, 0, 10),
            // A non-root reduce writes nothing: never copied back.
            op(OpKind::Reduce { root: 0 }, 0x50_000, 0x60_000, 4, 0),
        ];
        let (r, bytes) = layout(&ops);
        let flags: Vec<(u64, bool, bool, usize)> = r
            .iter()
            .map(|r| (r.start, r.read, r.written, r.at))
            .collect();
        assert_eq!(
            flags,
            vec![
                (0x10_000, true, false, 0),
                (0x20_000, false, true, 256),
                (0x30_000, true, false, 512),
                (0x40_000, false, true, 768),
                (0x50_000, true, false, 1024),
            ]
        );
        assert_eq!(bytes, 1280);
        // Null addresses of unused buffers stay as they are.
        assert_eq!(translate(&r, 0x9000usize as *mut u8, 0), None);
    }

    #[test]
    fn large_elementwise_collectives_are_cut_into_pieces_covering_every_element() {
        let n = (8 << 20) / 4 + 3; // 8 MiB of floats and a ragged tail
        let mut o = op(OpKind::AllReduce, 0x10_0000, 0x10_0000, n * 4, n * 4);
        o.0.count = n;
        let pieces = pieces_up_to(std::slice::from_ref(&o), MAX_PIECES);
        assert_eq!(pieces.len(), MAX_PIECES + 1);
        assert_eq!(pieces.first().map(|p| p.lo), Some(0));
        assert_eq!(pieces.last().map(|p| p.hi), Some(n));
        assert!(pieces.windows(2).all(|w| w[0].hi == w[1].lo));
        let (pop, pb) = pieces[1].of(&o.0, &o.1);
        let off = pieces[1].lo * 4;
        assert_eq!(pop.count, pieces[1].hi - pieces[1].lo);
        assert_eq!(pb.input as u64, 0x10_0000 + off as u64);
        assert_eq!((pb.in_bytes, pb.out_bytes), (pop.count * 4, pop.count * 4));
        // A non-root broadcast reads nothing; its pieces read nothing.
        let mut bc = op(OpKind::Broadcast { root: 0 }, 0, 0x20_0000, 0, n * 4);
        bc.0.count = n;
        let (_, pb) = pieces_up_to(std::slice::from_ref(&bc), MAX_PIECES)[2].of(&bc.0, &bc.1);
        assert_eq!((pb.input as u64, pb.in_bytes), (0, 0));
        // Staged whole: small, rank-blocked, or several operations.
        let small = op(OpKind::AllReduce, 0x1000, 0x1000, 4096, 4096);
        assert!(pieces_up_to(std::slice::from_ref(&small), MAX_PIECES).is_empty());
        let mut ag = op(OpKind::AllGather, 0x1000, 0x9000_0000, n * 4, n * 8);
        ag.0.count = n;
        assert!(pieces_up_to(std::slice::from_ref(&ag), MAX_PIECES).is_empty());
        assert!(pieces_up_to(&[o, o], MAX_PIECES).is_empty());
    }
}
