//! The profiler's proxy events on the host path: a proxy op per
//! (operation, peer, direction) of a lane, started when the lane starts,
//! and a proxy step per slice sent or received, at the points of
//! [`OpEvents`] (NCCL's net.cc), where the caller's thread is the proxy.
//! A send step opens with its slice (its data not yet produced); a
//! receive step just before its receive is posted; it ends when the
//! received slice was combined or copied where it goes.
//!
//! Only built when the group's activation mask asks for proxy events, so
//! that the executor otherwise pays a `None` check per slice.

use std::os::raw::c_int;

use super::Lane;
use crate::plugin::profiler::{Handle, NetParent, OpDescr, OpEvents, ProxyProfiler};

/// The op index of a task side that has no proxy op.
pub const NO_OP: usize = usize::MAX;

/// One proxy op: its key and its events.
struct Op {
    /// (index into the lane's parents, peer, is_send).
    key: (usize, usize, bool),
    ev: OpEvents,
}

/// The proxy ops of one lane.
pub struct Proxies<'a> {
    p: ProxyProfiler<'a>,
    /// Sorted by key.
    ops: Vec<Op>,
    /// A lane with one parent shares it between all its steps.
    per_step: bool,
}

impl<'a> Proxies<'a> {
    /// Counts the slices of each (parent, peer, direction) of the lane and
    /// starts their proxy-op events.
    pub fn start(p: ProxyProfiler<'a>, lane: &Lane) -> Proxies<'a> {
        let esize = lane.reducer.dtype().size();
        let slice = (lane.slice_bytes / esize).max(1);
        let per_step = lane.parents.len() > 1;
        let mut counts: Vec<((usize, usize, bool), c_int)> = Vec::new();
        for (i, st) in lane.steps.iter().enumerate() {
            let n = st.count.div_ceil(slice) as c_int;
            let parent = if per_step { i } else { 0 };
            for (peer, send) in [(st.send, true), (st.recv, false)] {
                let Some(peer) = peer.filter(|_| n > 0) else {
                    continue;
                };
                let key = (parent, peer, send);
                match counts.iter_mut().find(|o| o.0 == key) {
                    Some(o) => o.1 += n,
                    None => counts.push((key, n)),
                }
            }
        }
        counts.sort_by_key(|o| o.0);
        // Connections of point-to-point lanes live on a channel of their
        // own, above the 8 bits of the descriptor: NCCL's p2p channel 0.
        let channel = u8::try_from(lane.chan).unwrap_or(0);
        let chunk_size = (slice * esize).min(c_int::MAX as usize) as c_int;
        let ops = counts
            .into_iter()
            .map(|(key, n_steps)| Op {
                key,
                ev: OpEvents::start(
                    p,
                    OpDescr {
                        parent: lane.parents.get(key.0).copied().unwrap_or(Handle::NONE),
                        channel,
                        peer: key.1 as c_int,
                        n_steps,
                        chunk_size,
                        is_send: key.2,
                    },
                ),
            })
            .collect();
        Proxies { p, ops, per_step }
    }

    fn index(&self, step: usize, peer: usize, send: bool) -> usize {
        let key = (if self.per_step { step } else { 0 }, peer, send);
        self.ops
            .binary_search_by_key(&key, |o| o.key)
            .unwrap_or(NO_OP)
    }

    /// A slice to send was opened; its data is not produced yet.
    pub fn send_created(&mut self, step: usize, peer: usize, bytes: usize) -> (usize, Handle) {
        let op = self.index(step, peer, true);
        if op == NO_OP {
            return (NO_OP, Handle::NONE);
        }
        (op, self.ops[op].ev.send_created(self.p, bytes))
    }

    /// The slice's data is ready and its send is being tried.
    pub fn send_ready(&self, op: usize, ev: Handle, bytes: usize) {
        if op != NO_OP {
            self.ops[op].ev.send_ready(self.p, ev, bytes);
        }
    }

    /// The slice's send was handed to the network.
    pub fn sent(&mut self, op: usize, ev: Handle, bytes: usize) {
        if op != NO_OP {
            self.ops[op].ev.sent(self.p, ev, bytes);
        }
    }

    /// The network completed the slice's send.
    pub fn send_done(&mut self, op: usize, ev: Handle) {
        if op != NO_OP {
            self.ops[op].ev.send_done(self.p, ev);
        }
    }

    /// A receive is about to be posted to the network (its step starts
    /// first).
    pub fn recv_step(&mut self, step: usize, peer: usize, bytes: usize) -> (usize, Handle) {
        let op = self.index(step, peer, false);
        if op == NO_OP {
            return (NO_OP, Handle::NONE);
        }
        (op, self.ops[op].ev.recv_step(self.p, bytes))
    }

    /// The receive of `recv_step` was posted.
    pub fn recv_posted(&mut self, op: usize, bytes: usize) {
        if op != NO_OP {
            self.ops[op].ev.recv_posted(self.p, bytes);
        }
    }

    /// See [`ProxyProfiler::net_parent`].
    pub fn net_parent(&self, ev: Handle) -> Option<Box<NetParent>> {
        self.p.net_parent(ev)
    }

    /// The network completed the receive; the data waits to be used.
    pub fn received(&mut self, op: usize, ev: Handle, bytes: usize) {
        if op != NO_OP {
            self.ops[op].ev.received(self.p, ev, bytes);
        }
    }

    /// The received slice was combined or copied where it goes.
    pub fn consumed(&mut self, op: usize, ev: Handle) {
        if op != NO_OP {
            self.ops[op].ev.consumed(self.p, ev);
        }
    }

    /// Ends the steps `open` still holds and every proxy op not ended yet
    /// (all of them end by themselves on success).
    pub fn finish(mut self, open: impl Iterator<Item = Handle>) {
        for ev in open {
            self.p.comm.stop(ev);
        }
        for o in &mut self.ops {
            o.ev.finish(self.p);
        }
    }
}
