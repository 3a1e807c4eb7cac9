//! Ranks of one GPU that are all threads of this process (`-g N` on one
//! GPU, or several communicators made by threads, nccl-tests' `-t 4 -g 1`).
//! Their kernels run together, but a ring between them still moves every
//! byte through FIFO slots; one launch over every rank's buffers moves it
//! once. CUDA IPC cannot open a handle in the process that made it, and
//! needs none here: the ranks share the context, so their buffers' addresses
//! are valid as they are.
//!
//! No rank waits on the host for another: one thread may drive every rank
//! in turn inside one group (nccl-tests' `-g N`), so a rank that waited for
//! a rank called after it would wait forever. Instead the last rank to call
//! a collective runs it: each earlier rank's stream stores the call's
//! number in its READY word (its buffers are ready once the work before is
//! done) and waits for its DONE word; the last makes its own stream wait for
//! every READY, launches the reduce and copy kernels over every rank's
//! buffers, and stores each earlier rank's DONE. The order is stream order
//! on every rank, whoever comes last. Each rank's stores and waits go in
//! one batch of stream memory operations (one driver call per rank and
//! side), so that the enqueue of an 8-byte collective, which one thread may
//! make for every rank, grows little with the ranks.
//!
//! Which rank comes last, and whether the call runs this way at all, is
//! [`Calls`]'s business, kept apart from the GPU so that it is tested on the
//! host.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use crate::algo::Coll;
use crate::cuda::{Context, DeviceBuffer, KernelSet, MemOp, RawStream, Stream};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};

use super::super::oob::Oob;
use super::super::stop::Awaited;
use super::steps::{self, Bufs};

/// The word of each rank's flag buffer that the last rank stores when it is
/// done with the rank's buffers, and the one the rank's own stream stores
/// when its buffers are ready.
const DONE: u64 = 0;
const READY: u64 = 8;
pub(super) const FLAG_BYTES: usize = 64;

/// One rank's arrival at a call that the last rank runs: its buffers (its
/// stream says when they are ready in its READY word) and that stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    pub rank: usize,
    pub bufs: Bufs,
    pub on: StreamId,
}

/// Which stream a call came on: its handle, and for the per-thread default
/// stream (one handle, a stream per thread) the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamId {
    handle: u64,
    thread: Option<std::thread::ThreadId>,
}

impl StreamId {
    /// `stream`, called on this thread.
    pub fn of(stream: RawStream) -> StreamId {
        // CUDA's CU_STREAM_PER_THREAD.
        const PER_THREAD: u64 = 2;
        let handle = stream.raw();
        StreamId {
            handle,
            thread: (handle == PER_THREAD).then(|| std::thread::current().id()),
        }
    }
}

/// What coming to a call means for one rank.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Others have yet to come: this rank's stream marks it READY and
    /// waits for the last rank's DONE.
    Early,
    /// Every other rank has come (the list): this rank runs the call.
    Last(Vec<Arrival>),
    /// Every rank runs its own kernels (the first to come was capturing a
    /// CUDA graph).
    Kernels,
    /// The call cannot run (the ranks were called differently); the ranks
    /// in `release` came earlier and their streams wait for a DONE that
    /// must now be stored without the work.
    Failed { msg: String, release: Vec<usize> },
}

struct Open {
    /// Decided by the first rank to come: not capturing.
    direct: bool,
    what: String,
    came: usize,
    waiting: Vec<Arrival>,
    failed: Option<String>,
}

/// The calls of one communicator's ranks in this process, by number.
pub(crate) struct Calls {
    nranks: usize,
    open: BTreeMap<u64, Open>,
    /// Errors for ranks whose call failed after they had come (they were
    /// told it ran): each rank's next call reports its own.
    owed: Vec<Option<String>>,
}

impl Calls {
    pub fn new(nranks: usize) -> Calls {
        Calls {
            nranks,
            open: BTreeMap::new(),
            owed: (0..nranks).map(|_| None).collect(),
        }
    }

    /// An error owed to `rank` from an earlier call, once.
    pub fn take_owed(&mut self, rank: usize) -> Option<String> {
        self.owed.get_mut(rank).and_then(Option::take)
    }

    /// `rank` comes to call `seq`, described as `what`. Where the
    /// first rank to come is capturing a graph, or `timed` (the profiler
    /// wants its kernels' channel times, which only the ring kernels
    /// write), every rank runs its kernels.
    #[allow(clippy::too_many_arguments)] // one arrival's whole description
    pub fn arrive(
        &mut self,
        rank: usize,
        seq: u64,
        what: &str,
        capturing: bool,
        timed: bool,
        bufs: Bufs,
        on: StreamId,
    ) -> Result<Turn> {
        let nranks = self.nranks;
        let open = self.open.entry(seq).or_insert_with(|| Open {
            direct: !capturing && !timed,
            what: what.to_string(),
            came: 0,
            waiting: Vec::new(),
            failed: None,
        });
        open.came += 1;
        let last = open.came == nranks;
        let turn = if let Some(msg) = &open.failed {
            Turn::Failed {
                msg: msg.clone(),
                release: Vec::new(),
            }
        } else if open.what != what || (open.direct && capturing) {
            let msg = if open.what != what {
                format!(
                    "collective #{seq} on a GPU shared by {nranks} ranks of one process: rank {rank} called {what}, an earlier rank {}",
                    open.what
                )
            } else {
                format!(
                    "collective #{seq} on a GPU shared by {nranks} ranks of one process: rank {rank} captures it into a CUDA graph, and an earlier rank ran it at once; every rank must capture it or none"
                )
            };
            let release: Vec<usize> = open.waiting.drain(..).map(|a| a.rank).collect();
            for &r in &release {
                self.owed[r] = Some(msg.clone());
            }
            open.failed = Some(msg.clone());
            Turn::Failed { msg, release }
        } else if !open.direct {
            Turn::Kernels
        } else if last {
            Turn::Last(std::mem::take(&mut open.waiting))
        } else {
            open.waiting.push(Arrival { rank, bufs, on });
            Turn::Early
        };
        if last {
            self.open.remove(&seq);
        }
        Ok(turn)
    }
}

/// What the ranks of one communicator in this process share.
struct Rendezvous {
    calls: Mutex<Calls>,
    /// Each rank's DONE and READY words.
    done: Vec<u64>,
    ready: Vec<u64>,
}

/// Communicators being set up, by the key their rank 0 drew.
static SETTING_UP: Mutex<Option<HashMap<u64, Weak<Rendezvous>>>> = Mutex::new(None);

pub(crate) struct LocalGpu {
    /// Blocks a fused launch takes at most: the communicator's CTA budget.
    max_blocks: usize,
    ctx: Arc<Context>,
    me: usize,
    nranks: usize,
    /// Calls made so far, the same count on every rank.
    seq: u64,
    rv: Arc<Rendezvous>,
    awaited: Awaited,
    own: DeviceBuffer,
    /// Stores DONE words apart from any rank's stream; made at first use.
    side: Option<Stream>,
}

fn poisoned() -> Error {
    Error::Internal("shared-GPU rendezvous lock poisoned".into())
}

impl LocalGpu {
    /// Every rank calls it, each on its own thread (or together through
    /// `oob`'s exchange).
    pub fn setup(ctx: &Arc<Context>, oob: &dyn Oob, max_blocks: usize) -> Result<LocalGpu> {
        let (me, nranks) = (oob.rank(), oob.nranks());
        let own = DeviceBuffer::alloc(ctx, FLAG_BYTES)?;
        own.fill_bytes(0)?;
        let mut mine = rand::random::<u64>().to_le_bytes().to_vec();
        mine.extend_from_slice(&own.ptr().to_le_bytes());
        let all = oob.allgather(&mine)?;
        let word = |b: &Vec<u8>, at: usize| -> Result<u64> {
            b.get(at..at + 8)
                .and_then(|w| w.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| Error::Internal("a rank sent no flag address".into()))
        };
        let key = word(&all[0], 0)?;
        let flags = all
            .iter()
            .map(|b| word(b, 8))
            .collect::<Result<Vec<u64>>>()?;
        let done = flags.iter().map(|p| p + DONE).collect();
        let ready = flags.iter().map(|p| p + READY).collect();
        let rv = {
            let mut reg = SETTING_UP.lock().map_err(|_| poisoned())?;
            let reg = reg.get_or_insert_with(HashMap::new);
            reg.retain(|_, w| w.strong_count() > 0);
            match reg.get(&key).and_then(Weak::upgrade) {
                Some(rv) => rv,
                None => {
                    let rv = Arc::new(Rendezvous {
                        calls: Mutex::new(Calls::new(nranks)),
                        done,
                        ready,
                    });
                    reg.insert(key, Arc::downgrade(&rv));
                    rv
                }
            }
        };
        // Every rank holds it now: the registry's entry can go.
        oob.allgather(&[])?;
        if me == 0 {
            if let Some(reg) = SETTING_UP.lock().map_err(|_| poisoned())?.as_mut() {
                reg.remove(&key);
            }
        }
        Ok(LocalGpu {
            max_blocks,
            ctx: ctx.clone(),
            me,
            nranks,
            seq: 0,
            rv,
            awaited: Awaited::default(),
            own,
            side: None,
        })
    }

    /// Stores `flag` in the DONE words of `ranks` from a stream of this
    /// rank's own (made at first use), apart from every rank's stream.
    fn release_from_side(&mut self, ranks: &[usize], flag: u32) -> Result<()> {
        if ranks.is_empty() {
            return Ok(());
        }
        let side = match &mut self.side {
            Some(s) => s,
            None => self.side.insert(Stream::new(&self.ctx)?),
        };
        for &r in ranks {
            #[allow(unsafe_code)]
            // SAFETY: rank r's DONE word, alive while r's communicator is,
            // which waits for its stream.
            unsafe {
                side.handle().write_u32(self.rv.done[r], flag)?;
            }
        }
        Ok(())
    }

    /// As the processes' path: stores what this rank's stream waits for.
    pub fn release(&self) -> Result<()> {
        let stream = Stream::new(&self.ctx)?;
        for (off, v) in self.awaited.releases() {
            #[allow(unsafe_code)]
            // SAFETY: the word is in this rank's own flag buffer, which
            // lives until the communicator goes (that synchronizes the
            // context first).
            unsafe {
                stream.handle().write_u32(self.own.ptr() + off, v)?;
            }
        }
        Ok(())
    }

    /// Runs `coll` over every rank's buffers, or returns `false` when every
    /// rank runs its own kernels for it (all ranks return the same).
    /// `timed`: this rank's launches are timed for the profiler.
    #[allow(clippy::too_many_arguments)] // one collective's whole description
    pub fn run(
        &mut self,
        timed: bool,
        kernels: &KernelSet,
        coll: Coll,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
    ) -> Result<bool> {
        if let Some(msg) = self
            .rv
            .calls
            .lock()
            .map_err(|_| poisoned())?
            .take_owed(self.me)
        {
            return Err(Error::InvalidUsage(format!(
                "{msg} (reported by rank {}'s next call)",
                self.me
            )));
        }
        // Loading a datatype's module waits for the context's queued work,
        // so it must not happen while a rank's stream waits for this call's
        // DONE: every rank loads it before it comes.
        kernels.prepare(dtype)?;
        self.seq += 1;
        let seq = self.seq;
        let flag = seq as u32;
        let what = format!("{} of {count} x {dtype:?} ({op:?})", super::describe(coll));
        let capturing = stream.is_capturing()?;
        let turn = {
            let mut calls = self.rv.calls.lock().map_err(|_| poisoned())?;
            calls.arrive(
                self.me,
                seq,
                &what,
                capturing,
                timed,
                Bufs { send, recv },
                StreamId::of(stream),
            )?
        };
        tracing::trace!(target: "oxccl::coll", "rank {}: {what} as collective #{seq} of the GPU's ranks: {}", self.me, match &turn {
            Turn::Early => "comes early, its stream waits for the last rank's launch".to_string(),
            Turn::Last(w) => format!("comes last, launches over every rank's buffers and releases {:?}", w.iter().map(|a| a.rank).collect::<Vec<_>>()),
            Turn::Kernels => "every rank runs its kernels".to_string(),
            Turn::Failed { .. } => "failed".to_string(),
        });
        match turn {
            Turn::Kernels => Ok(false),
            Turn::Early => {
                #[allow(unsafe_code)]
                // SAFETY: both words are in this rank's flag buffer, alive
                // until the communicator goes (which synchronizes first).
                // The last rank may already wait for READY: it waits until
                // the store below is run.
                unsafe {
                    stream.mem_ops(&[
                        MemOp::Write {
                            addr: self.rv.ready[self.me],
                            value: flag,
                        },
                        MemOp::Wait {
                            addr: self.rv.done[self.me],
                            value: flag,
                        },
                    ])?;
                }
                self.awaited.wait(DONE, flag);
                Ok(true)
            }
            Turn::Failed { msg, release } => {
                self.release_from_side(&release, flag)?;
                Err(Error::InvalidUsage(msg))
            }
            Turn::Last(waiting) => {
                let mut bufs = vec![Bufs { send: 0, recv: 0 }; self.nranks];
                bufs[self.me] = Bufs { send, recv };
                // An earlier rank that came on this very stream (one thread
                // calling every rank on the null stream) has its wait for
                // DONE ahead of this launch there: stored now, from the
                // side, it lets the stream reach the launch, which the
                // stream's own order still puts after that rank's work.
                // Such a rank's DONE is stored from the side only: stored
                // on the stream too, an earlier call's store, still queued
                // there, could land after this one and undo it.
                let here = StreamId::of(stream);
                let (same, apart): (Vec<&Arrival>, Vec<&Arrival>) =
                    waiting.iter().partition(|a| a.on == here);
                let same: Vec<usize> = same.iter().map(|a| a.rank).collect();
                self.release_from_side(&same, flag)?;
                #[allow(unsafe_code)]
                // SAFETY: the earlier ranks' READY words, alive while their
                // communicators are, each of which waits for this stream's
                // DONE store before it can go.
                unsafe {
                    stream.wait_all(waiting.iter().map(|a| self.rv.ready[a.rank]), flag)?;
                }
                for a in &waiting {
                    bufs[a.rank] = a.bufs;
                }
                let r = (|| {
                    for s in steps::steps(coll, &bufs, count, dtype.size(), self.me) {
                        let (o, i) = (&s.outputs, &s.inputs);
                        let nb = self.max_blocks;
                        kernels.reduce(o, i, count, dtype, op, self.nranks, s.flags, nb, stream)?;
                    }
                    Ok(())
                })();
                // The earlier ranks' streams go on even where a launch
                // failed: the error is this call's.
                #[allow(unsafe_code)]
                // SAFETY: the earlier ranks' DONE words, alive while their
                // communicators are, which wait for their streams.
                unsafe {
                    stream.write_all(apart.iter().map(|a| self.rv.done[a.rank]), flag)?;
                }
                r.map(|()| true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> StreamId {
        StreamId {
            handle: 0,
            thread: None,
        }
    }

    fn b(r: u64) -> Bufs {
        Bufs {
            send: r << 32,
            recv: r << 32 | 8,
        }
    }

    #[test]
    fn the_last_rank_to_come_runs_each_call_whatever_the_order() {
        let mut c = Calls::new(3);
        // Call 1: ranks 2, 0, 1; call 2 opened by rank 0 before call 1 ends.
        assert!(matches!(
            c.arrive(2, 1, "ar", false, false, b(2), on()).unwrap(),
            Turn::Early
        ));
        assert!(matches!(
            c.arrive(0, 1, "ar", false, false, b(0), on()).unwrap(),
            Turn::Early
        ));
        assert!(matches!(
            c.arrive(0, 2, "bc", false, false, b(0), on()).unwrap(),
            Turn::Early
        ));
        match c.arrive(1, 1, "ar", false, false, b(1), on()).unwrap() {
            Turn::Last(w) => {
                let got: Vec<(usize, Bufs)> = w.iter().map(|a| (a.rank, a.bufs)).collect();
                assert_eq!(got, vec![(2, b(2)), (0, b(0))]);
            }
            t => panic!("{t:?}"),
        }
        assert!(matches!(
            c.arrive(1, 2, "bc", false, false, b(1), on()).unwrap(),
            Turn::Early
        ));
        assert!(
            matches!(c.arrive(2, 2, "bc", false, false, b(2), on()).unwrap(), Turn::Last(w) if w.len() == 2)
        );
        assert!(c.open.is_empty());
    }

    #[test]
    fn a_call_the_first_rank_captures_runs_on_kernels_everywhere() {
        let mut c = Calls::new(2);
        assert!(matches!(
            c.arrive(1, 1, "ar", true, false, b(1), on()).unwrap(),
            Turn::Kernels
        ));
        assert!(matches!(
            c.arrive(0, 1, "ar", false, false, b(0), on()).unwrap(),
            Turn::Kernels
        ));
        assert!(c.open.is_empty());
    }

    #[test]
    fn a_call_the_first_rank_times_runs_on_kernels_everywhere() {
        let mut c = Calls::new(2);
        assert!(matches!(
            c.arrive(0, 1, "ar", false, true, b(0), on()).unwrap(),
            Turn::Kernels
        ));
        assert!(matches!(
            c.arrive(1, 1, "ar", false, false, b(1), on()).unwrap(),
            Turn::Kernels
        ));
        // A later rank timed where the first was not: it runs the call
        // without channel times, no failure.
        assert!(matches!(
            c.arrive(1, 2, "ar", false, false, b(1), on()).unwrap(),
            Turn::Early
        ));
        assert!(matches!(
            c.arrive(0, 2, "ar", false, true, b(0), on()).unwrap(),
            Turn::Last(_)
        ));
    }

    #[test]
    fn a_mismatch_fails_every_rank_and_releases_the_early_ones() {
        let mut c = Calls::new(3);
        assert!(matches!(
            c.arrive(0, 1, "ar", false, false, b(0), on()).unwrap(),
            Turn::Early
        ));
        match c.arrive(1, 1, "bc", false, false, b(1), on()).unwrap() {
            Turn::Failed { msg, release } => {
                assert_eq!(release, vec![0]);
                assert!(
                    msg.contains("rank 1 called bc, an earlier rank ar"),
                    "{msg}"
                );
            }
            t => panic!("{t:?}"),
        }
        // The third rank is told too, and nothing is left open.
        assert!(
            matches!(c.arrive(2, 1, "ar", false, false, b(2), on()).unwrap(), Turn::Failed { release, .. } if release.is_empty())
        );
        assert!(c.open.is_empty());
        assert!(c.take_owed(0).unwrap().contains("rank 1 called bc"));
        assert_eq!(c.take_owed(0), None, "owed once");
        assert_eq!(c.take_owed(1), None, "rank 1 got its error at once");
        // A capture after an eager start is a mismatch too.
        assert!(matches!(
            c.arrive(0, 2, "ar", false, false, b(0), on()).unwrap(),
            Turn::Early
        ));
        assert!(
            matches!(c.arrive(1, 2, "ar", true, false, b(1), on()).unwrap(), Turn::Failed { msg, .. } if msg.contains("capture"))
        );
    }

    #[test]
    fn the_per_thread_stream_is_one_per_thread() {
        #[allow(unsafe_code)]
        // SAFETY: the handles are only compared, never given to the driver.
        let (null, per_thread, made) = unsafe {
            (
                RawStream::from_raw(0),
                RawStream::from_raw(2),
                RawStream::from_raw(0x7f00_1000),
            )
        };
        let there = std::thread::spawn(move || {
            (
                StreamId::of(null),
                StreamId::of(per_thread),
                StreamId::of(made),
            )
        })
        .join()
        .unwrap();
        assert_eq!(StreamId::of(null), there.0, "the legacy stream is shared");
        assert_ne!(StreamId::of(per_thread), there.1);
        assert_eq!(StreamId::of(per_thread), StreamId::of(per_thread));
        assert_eq!(StreamId::of(made), there.2, "a stream the caller made");
    }
}
