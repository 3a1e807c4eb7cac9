//! How an operation's kernel is enqueued: its arguments, the steps the
//! network proxy moves for it, and the order between operations that come
//! on different streams.

use super::plan::{self, Shape, Template};
use super::{DeviceComm, Direct, TimedLaunch};
use crate::cuda::abi::{CollArgs, PROTO_LL, PROTO_SIMPLE};
use crate::cuda::kernels::kernel_op;
use crate::cuda::RawStream;
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::plugin::profiler::{Handle, ProxyProfiler};
use crate::transport::layout::Proto;
use crate::transport::proxy::{ConnSteps, Launch};

impl DeviceComm {
    /// `channels`: thread blocks, at most the window's (`cfg.channels`).
    #[allow(clippy::too_many_arguments)] // one kernel launch's whole description
    pub(super) fn launch(
        &mut self,
        t: Template,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
        channels: usize,
        direct: Direct,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.window.check_active()?;
        let (kop, sc) = kernel_op(dtype, op, self.nranks);
        let kernel = self.kernels.coll(dtype, kop)?;
        // Small operations go through the LL FIFO where the window has one
        // (peers through host memory): the receiver polls the data itself,
        // the sender posts without a fence. NCCL_PROTO decides alike on
        // every rank (rank 0's).
        let proto = self.protocol(count * dtype.size());
        let ll = proto == Proto::Ll;
        let shape = if ll {
            let channels = channels.min(self.window.ll_channels);
            plan::shape_ll(&self.cfg, count, dtype.size(), t.nchunks as usize, channels)
        } else {
            plan::shape(&self.cfg, count, dtype.size(), t.nchunks as usize, channels)
        };
        self.order_after_last(stream)?;
        let nch = shape.channels as usize;
        let timed = match &self.stamps {
            Some(st) if self.timed && !self.capturing() => st.claim(nch),
            _ => None,
        };
        let mut args = CollArgs {
            comm: self.window.buf.ptr(),
            input,
            output,
            count: count as u64,
            sc,
            timeout_ns: self.cfg.timeout.as_nanos().min(u64::MAX as u128) as u64,
            nsteps: t.nsteps,
            nchunks: t.nchunks,
            slice_elems: shape.slice_elems,
            nchannels: shape.channels,
            group: self.cfg.group as u32,
            proto: if ll { PROTO_LL } else { PROTO_SIMPLE },
            stamps: match (&self.stamps, timed) {
                (Some(st), Some(slot)) => st.device_addr(slot),
                _ => 0,
            },
            abort: self.stop.device_word(),
            direct_in: 0,
            direct_out: 0,
            direct_from: 0,
            steps: t.steps,
        };
        // Registered buffers are read in place through the simple FIFO only
        // (an LL line carries its data with its flag).
        if !ll {
            args.direct_from = self.window.same_process_p2p();
            let (i, o) = (
                direct.input & args.direct_from,
                direct.output & args.direct_from,
            );
            if sends_in_place(&t, i, o) {
                (args.direct_in, args.direct_out) = (i, o);
            }
        }
        let in_place = args.direct_in | args.direct_out;
        if let Some(e) = self.window.failure() {
            return Err(e.context("the network proxy of this communicator stopped"));
        }
        if let Some(e) = self.window.gone() {
            return Err(e.context("a peer of this communicator left"));
        }
        if self.stop.is_raised() {
            return Err(Error::InvalidUsage(
                "the communicator was told to end its operations (revoke, abort or NCCL_SHRINK_ABORT): no launch runs on it".into(),
            ));
        }
        if self.announce {
            // A captured launch runs whenever the graph is replayed, never
            // announced: the proxy can no longer number its steps.
            if self.capturing() {
                self.announce = false;
                self.window.lost();
            } else {
                let l = self.launch_steps(&t, count, dtype.size(), shape, proto);
                self.window.announce(l);
            }
        }
        let r = kernel.launch_in_clusters(
            shape.channels,
            self.cfg.threads,
            self.cluster(),
            stream,
            &args,
        );
        if r.is_ok() && in_place != 0 {
            self.direct_launches += 1;
            if self.direct_launches == 1 {
                let peers: Vec<usize> = (0..64).filter(|p| in_place & (1 << p) != 0).collect();
                tracing::info!(target: "oxccl::reg", "rank {}: peers {peers:?} read this rank's registered {} where it lies, no step slot (first such launch of this communicator)", self.rank,
                    match (args.direct_in != 0, args.direct_out != 0) { (true, true) => "input and output", (true, false) => "input", _ => "output" });
            }
        }
        if r.is_err() && self.announce {
            self.announce = false;
            self.window.lost();
        }
        self.window.kick();
        if let (Some(st), Some(slot)) = (&self.stamps, timed) {
            match r {
                Ok(()) => self.launched.push(TimedLaunch {
                    slot,
                    channels: nch,
                }),
                Err(_) => st.release(slot, nch),
            }
        }
        r.and_then(|()| self.mark())
    }

    /// The steps a launch moves on each net connection, in the kernel's
    /// order, each run with the event of the operation it belongs to when
    /// the group's mask asks for proxy events.
    /// `proto`: the FIFOs the launch goes through (the LL ones have links
    /// of their own).
    fn launch_steps(
        &mut self,
        t: &Template,
        count: usize,
        esize: usize,
        shape: Shape,
        proto: Proto,
    ) -> Launch {
        let steps = &t.steps[..t.nsteps as usize];
        let mut parents = self
            .parents
            .as_mut()
            .filter(|p| ProxyProfiler::wants_ops(p.mask));
        let mask = parents.as_ref().map_or(0, |p| p.mask);
        let mut of_step: Vec<Option<Handle>> = Vec::with_capacity(steps.len());
        for d in steps {
            of_step.push(parents.as_mut().map(|p| match p.coll {
                Some(h) => h,
                None => {
                    let (peer, send) = if d.send >= 0 {
                        (d.send as usize, true)
                    } else {
                        (d.recv as usize, false)
                    };
                    p.p2p
                        .iter()
                        .position(|e| (e.0, e.1) == (peer, send))
                        .map_or(Handle::NONE, |i| p.p2p.remove(i).2)
                }
            }));
        }
        let net = |p: i16| p >= 0 && self.window.net_peers.contains(&(p as usize));
        // Steps of different operations on one connection interleave as
        // the kernel's groups do: only then is the order needed.
        let ordered = steps.iter().enumerate().any(|(i, a)| {
            steps[i + 1..].iter().enumerate().any(|(j, b)| {
                of_step[i] != of_step[i + 1 + j]
                    && ((net(a.send) && a.send == b.send) || (net(a.recv) && a.recv == b.recv))
            })
        });
        let chunk_bytes = shape.slice_elems as usize * esize;
        let mut conns: Vec<ConnSteps> = Vec::new();
        for ch in 0..shape.channels as usize {
            let runs = plan::slice_runs(t, count, esize, shape, self.cfg.group, ch, ordered);
            for (i, n) in runs {
                let d = steps[i];
                for (peer, send) in [(d.send, true), (d.recv, false)] {
                    if !net(peer) {
                        continue;
                    }
                    let peer = peer as usize;
                    let last = conns
                        .iter_mut()
                        .rev()
                        .find(|c| (c.peer, c.chan, c.send) == (peer, ch, send));
                    match last {
                        Some(c) if c.parent == of_step[i] => c.steps += n,
                        _ => conns.push(ConnSteps {
                            peer,
                            chan: ch,
                            send,
                            steps: n,
                            parent: of_step[i],
                            chunk_bytes,
                            proto,
                        }),
                    }
                }
            }
        }
        Launch { mask, conns }
    }

    /// Operations share the window's counters, so each must run after the
    /// previous one even when the caller switches streams. On a switch, the
    /// new stream waits for the event recorded after the previous
    /// operation's work ([`DeviceComm::mark`]): the old stream itself may
    /// be gone by then, so nothing is asked of it.
    ///
    /// An event joins two streams only when both are in the same CUDA graph
    /// capture or neither is: CUDA refuses a wait that would tie a capture
    /// to work outside it (CUDA_ERROR_STREAM_CAPTURE_ISOLATION, which also
    /// invalidates the capture; PyTorch captures on a side stream after
    /// warming up on another). Across that border the caller orders the
    /// graph's launches, as with NCCL.
    pub(super) fn order_after_last(&mut self, stream: RawStream) -> Result<()> {
        let capture = stream.capture_id()?;
        if let Some((_, last)) = self.last.filter(|(l, _)| *l != stream) {
            if last == capture {
                self.order.wait_on(stream)?;
            }
        }
        self.opened = Some((stream, capture));
        Ok(())
    }

    /// Whether the operation being enqueued goes into a graph capture (as
    /// `order_after_last` found its stream).
    pub(super) fn capturing(&self) -> bool {
        self.opened.is_some_and(|(_, capture)| capture.is_some())
    }

    /// After an operation's work is enqueued (on a live stream: the
    /// caller's, during its call): records `order` behind it for the next
    /// operation. One event record per operation, as NCCL records one per
    /// launch to order its streams.
    pub(super) fn mark(&mut self) -> Result<()> {
        if let Some((stream, capture)) = self.opened {
            self.order.record(stream)?;
            self.last = Some((stream, capture));
        }
        Ok(())
    }
}

/// Whether a step of `t` sends from a buffer its peer reads in place
/// (`input`, `output`: the peers that read each, a bit per rank), as the
/// kernel's `oxccl_direct` decides: from the step's destination, or from
/// its source where it receives nothing. The exchange (a step that sends
/// its source and overwrites it in place) never does.
fn sends_in_place(t: &Template, input: u64, output: u64) -> bool {
    use crate::cuda::abi::{BUF_INPUT, BUF_OUTPUT};
    let reads = |buf: u8, peer: i16| {
        let mask = match buf {
            BUF_INPUT => input,
            BUF_OUTPUT => output,
            _ => 0,
        };
        (0..64).contains(&peer) && mask & (1 << peer) != 0
    };
    t.steps[..t.nsteps as usize].iter().any(|d| {
        d.send >= 0
            && d.flags & crate::cuda::abi::STEP_SEND_LOCAL == 0
            && (reads(d.dst_buf, d.send) || (d.recv < 0 && reads(d.src_buf, d.send)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Algo, Coll};

    #[test]
    fn which_schedules_send_from_buffers_read_in_place() {
        let peer1 = 1 << 1;
        let ag = plan::template(Algo::Ring, Coll::AllGather, 0, 2).unwrap();
        assert!(sends_in_place(&ag, 0, peer1), "from its output");
        assert!(sends_in_place(&ag, peer1, 0), "from its input");
        assert!(!sends_in_place(&ag, 1 << 0, 0), "no bit for the peer");
        let ar = plan::template(Algo::Ring, Coll::AllReduce, 0, 2).unwrap();
        assert!(sends_in_place(&ar, 0, peer1), "the final reduced slices");
        // The exchange overwrites what it sends: never in place.
        let ex = plan::template(Algo::RecDoubling, Coll::AllReduce, 0, 2).unwrap();
        assert!(!sends_in_place(&ex, peer1, peer1));
        // A broadcast's last rank only receives.
        let leaf = plan::template(Algo::Ring, Coll::Broadcast { root: 0 }, 1, 2).unwrap();
        assert!(!sends_in_place(&leaf, 1, 1));
        assert!(sends_in_place(&Template::send(1), peer1, 0));
        assert!(!sends_in_place(&Template::recv(1), peer1, peer1));
    }
}
