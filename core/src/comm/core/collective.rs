//! A collective on the host path: its plan per channel, run over the
//! lanes of the channels' connections, or through the direct host path
//! where it is set up.

use super::*;

impl Core {
    pub(super) fn run_collective(
        &self,
        conns: &mut Connections,
        op: &Op,
        bufs: OpBuffers,
        parents: Option<(Handle, Handle)>,
        mask: i32,
    ) -> Result<()> {
        let coll = op.kind.coll().expect("a collective");
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        self.bootstrap.progress().store(seq + 1, Ordering::SeqCst);
        // In flight for RAS until this returns.
        let _ras = self
            .ras
            .as_ref()
            .map(|r| r.begin(crate::ras::func_index(coll), seq));
        // Which path (inline, threads, rings or trees, how many channels)
        // a rank takes follows from its own count: ranks whose counts
        // differ may take different ones and never meet to compare
        // headers, and a count of 0 sends nothing. Each says here what it
        // called, a count of 0 too: where the ranks share a host, in the
        // peer-memory segment, which every long wait there reads; for any
        // peer, in the bootstrap's call book, which a long wait on the
        // rings asks its peers for (exec::drive).
        let call = header_of(op, seq);
        self.bootstrap.record_call(seq, call.encode());
        if let Some(d) = &self.direct {
            d.enter(&call);
        }
        if op.count == 0 {
            return Ok(());
        }
        let n = self.nranks;
        let bytes = op.count * op.dtype.size();
        // A forced algorithm or a tuner plugin chooses among the ring and
        // trees, which NCCL's tables know; the direct path is ours.
        // A call held to an algorithm (algSelection) runs it, as NCCL_ALGO
        // holds the whole communicator.
        let forced = match op.call.algo {
            Some(a) => cost::Held::from(Some(a)),
            None => self.held,
        };
        if self.direct_colls && op.call.algo.is_none() {
            if let Some(d) = &self.direct {
                // Decided from the call alone, as every rank sees it alike
                // (a broadcast's non-roots pass no input).
                let moved = algo::pull::bytes(coll, op.count, op.dtype.size(), n);
                if let Some(route) = d.route(coll, moved) {
                    return self.run_direct(d, route, op, coll, bufs, seq, parents, mask);
                }
            }
        }
        let (lo, hi) = self.channel_bounds();
        let nch = op
            .call
            .narrow(self.channels(bytes), lo, hi)
            .min(op.count)
            .max(1);
        let (algo, nch) = match &self.tuner {
            None => (cost::choose(coll, bytes, n, self.fabric, forced), nch),
            Some(t) => {
                let max = op.count.min(64);
                crate::plugin::tuner::decide(
                    t,
                    coll,
                    bytes,
                    n,
                    cost::cost_table(coll, bytes, n, self.fabric, forced),
                    cost::choose(coll, bytes, n, self.fabric, forced),
                    nch,
                    max,
                )
            }
        };
        // The tuner's count stays within the call's bounds too.
        let nch = op.call.narrow(nch, lo, hi).min(op.count).max(1);
        // The double binary tree is two trees, one per channel.
        let nch = if algo == Algo::Tree {
            nch.max(2).min(op.count)
        } else {
            nch
        };
        let event = match (self.profiler.as_deref(), parents) {
            (Some(p), Some((g, api))) => Some(p.running(p.coll(mask, op, Some(algo), nch, g, api))),
            _ => None,
        };
        // Its channels' events, stopped (dropped) before the event above.
        let _channels = HostChannels::start(
            self.profiler.as_deref(),
            mask,
            event.as_ref().map(|e| e.handle()),
            nch,
        );
        // The parent of the proxy ops, only when they are started.
        let parents = match &event {
            Some(e) if mask & PROXY_OP_BITS != 0 => vec![e.handle()],
            _ => Vec::new(),
        };
        let what = || format!("{} #{seq}", op.describe());
        debug!(target: "oxccl::coll", rank = self.rank, "{}: {} on {nch} channel(s)", what(), algo.name());
        let header = OpHeader {
            plan: Some((algo, nch as u32)),
            ..header_of(op, seq)
        };
        let reducer = Reducer::new(op.dtype, op.redop, n);
        let esize = op.dtype.size();
        let key = (algo, coll, op.count, nch, esize);
        let slice_bytes = (self.cfg.chunk_size as usize).max(64);
        let join = exec::joinable(slice_bytes, esize);
        let kept = self
            .plan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .filter(|p| p.key == key && p.steps.len() == nch);
        let mut plan = kept.unwrap_or_else(|| {
            let steps: Vec<Vec<Step>> = (0..nch)
                .map(|c| {
                    let (lo, hi) = algo::split(0, op.count, nch, c);
                    algo::schedule_on(algo, coll, self.rank, &self.ring, c, op.count, lo, hi, join)
                })
                .collect();
            let (sends, recvs) = peers_of(&steps, 0);
            Plan {
                key,
                steps,
                sends,
                recvs,
                lanes: Vec::new(),
                bufs: Vec::new(),
            }
        });
        self.connect(conns, &plan.sends, &plan.recvs)
            .map_err(|e| self.failed(e.context(what()), Some(seq), coll.name()))?;
        // PAT's reduce-scatter keeps partial sums for later rounds: room
        // for them, shared by the channels (each keeps its part of every
        // block, as in the output), for this call.
        let mut scratch = Vec::new();
        let mut bufs = bufs;
        if algo == Algo::Pat && coll == algo::Coll::ReduceScatter {
            scratch.resize(algo::pat::scratch_blocks(n) * op.count * esize, 0u8);
            bufs.scratch = scratch.as_mut_ptr();
            bufs.scratch_bytes = scratch.len();
        }
        let mut lanes = std::mem::take(&mut plan.lanes);
        lanes.clear();
        for (c, steps) in plan.steps.drain(..).enumerate() {
            let mut b = plan.bufs.pop().unwrap_or_default();
            b.clear();
            b.push(bufs);
            lanes.push(self.lane(
                conns,
                exec::LaneLabel::Channel(c),
                c,
                steps,
                b,
                parents.clone(),
                reducer,
                header,
            ));
        }
        let ctx = self.ctx(&what, Some(seq), mask);
        let result = if lanes.len() == 1 {
            exec::run(&mut lanes, &ctx)
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = lanes
                    .iter_mut()
                    .map(|l| s.spawn(|| exec::run(std::slice::from_mut(l), &ctx)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Internal("a channel thread panicked".into()))
                        })
                    })
                    .collect::<Result<Vec<()>>>()
                    .map(|_| ())
            })
        };
        self.put_back(conns, &mut lanes, |steps, bufs| {
            plan.steps.push(steps);
            plan.bufs.push(bufs);
        });
        plan.lanes = lanes;
        *self.plan.lock().unwrap_or_else(PoisonError::into_inner) = Some(plan);
        result.map_err(|e| self.coll_failed(e, what(), seq, coll))
    }

    /// A collective's error, named once (the executors' own errors may
    /// already name it), with its failure record.
    fn coll_failed(&self, e: Error, what: String, seq: u64, coll: algo::Coll) -> Error {
        let e = if e.message().contains(&what) {
            e
        } else {
            e.context(what)
        };
        self.failed(e, Some(seq), coll.name())
    }

    /// Runs a collective on the direct path: every rank reads what it
    /// needs from its peers' buffers.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_direct(
        &self,
        d: &exec::host_direct::Direct,
        route: exec::host_direct::Route,
        op: &Op,
        coll: algo::Coll,
        bufs: OpBuffers,
        seq: u64,
        parents: Option<(Handle, Handle)>,
        mask: i32,
    ) -> Result<()> {
        use exec::host_direct::Route;
        let (n, elem) = (self.nranks, op.dtype.size());
        let threads = match route {
            Route::Inline => 1,
            Route::Threads(t) => t,
        };
        let event = match (self.profiler.as_deref(), parents) {
            (Some(p), Some((g, api))) => Some(p.running(p.coll(mask, op, None, threads, g, api))),
            _ => None,
        };
        let channels = HostChannels::start(
            self.profiler.as_deref(),
            mask,
            event.as_ref().map(|e| e.handle()),
            threads,
        );
        let what = || format!("{} #{seq}", op.describe());
        debug!(target: "oxccl::coll", rank = self.rank, "{}: Direct ({route:?})", what());
        let ctx = self.ctx(&what, Some(seq), mask);
        let post = Post {
            // The ring's operation header, so that a mismatch reads alike.
            call: exec::host_direct::call_words(&header_of(op, seq)),
            send: bufs.input as u64,
            recv: bufs.output as u64,
            // Set by the direct path where the call needs it.
            stage: 0,
        };
        let reducer = Reducer::new(op.dtype, op.redop, n);
        let r = match route {
            Route::Inline => d.run_inline(coll, op.count, elem, post, bufs, reducer, &ctx),
            Route::Threads(_) => {
                let slice = d
                    .terms
                    .slice
                    .for_call(n, algo::pull::bytes(coll, op.count, elem, n));
                let plan = algo::pull::plan(coll, self.rank, n, op.count, elem, threads, slice);
                d.run(plan, threads, post, bufs, reducer, elem, &ctx)
            }
        };
        drop(channels);
        drop(event);
        if r.is_err() {
            // Whatever ended it, peers must not take this rank's words for
            // a finished call from now on.
            d.give_up();
        }
        r.map_err(|e| self.coll_failed(e, what(), seq, coll))
    }
}
