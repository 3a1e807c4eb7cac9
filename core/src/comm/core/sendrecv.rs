//! A group's sends and receives on the host path: all at once, each
//! message over the lanes of its channels, or through the direct host path
//! where it is set up.

use super::*;

/// How a failure record names a group of sends and receives.
const P2P_OP: &str = "send/recv";

impl Core {
    /// `evs`: the p2p events of `ops` (empty when not profiled).
    pub(super) fn run_p2p(
        &self,
        conns: &mut Connections,
        ops: &[&(Op, OpBuffers)],
        evs: &[Handle],
        mask: i32,
    ) -> Result<()> {
        let me = self.rank;
        // Messages to oneself pair up in order and are copies.
        let self_sends: Vec<_> = ops
            .iter()
            .filter(|(o, _)| o.kind == OpKind::Send { peer: me })
            .collect();
        let self_recvs: Vec<_> = ops
            .iter()
            .filter(|(o, _)| o.kind == OpKind::Recv { peer: me })
            .collect();
        if self_sends.len() != self_recvs.len() {
            return Err(Error::InvalidUsage(format!(
                "rank {me} posted {} send(s) to itself and {} receive(s) from itself in one group; they must pair up",
                self_sends.len(),
                self_recvs.len()
            )));
        }
        for ((s, sb), (r, rb)) in self_sends.iter().zip(&self_recvs) {
            if sb.in_bytes != rb.out_bytes {
                return Err(Error::InvalidUsage(format!(
                    "rank {me} sends {} to itself but receives {}",
                    s.describe(),
                    r.describe()
                )));
            }
            let bytes = Reducer::new(DataType::Uint8, RedOp::Sum, 1);
            let src = sb.span(Region::input(0), 0, sb.in_bytes, 1)?;
            let dst = rb.span(Region::output(0), 0, rb.out_bytes, 1)?;
            crate::mem::produce(&bytes, dst, Some((src, false)), None, false);
        }
        // The direct path numbers every message and carries the small ones;
        // the rest go on the rings.
        let on_rings: Vec<usize> = match self.direct.as_ref().filter(|d| d.has_p2p()) {
            Some(d) => self.run_p2p_direct(d, ops, mask)?,
            None => (0..ops.len()).collect(),
        };
        // One lane per (peer, direction): messages to one peer keep their order.
        type PeerLane = (Vec<Step>, Vec<OpBuffers>, Vec<Handle>);
        let mut by_peer: BTreeMap<(usize, bool), PeerLane> = BTreeMap::new();
        let proxy_events = mask & PROXY_OP_BITS != 0 && !evs.is_empty();
        for i in on_rings {
            let (op, bufs) = ops[i];
            let Some((peer, send, bytes)) = p2p_end(me, op, bufs) else {
                continue;
            };
            let step = if send {
                Step::new(bytes).src(Region::input(0)).send(peer)
            } else {
                Step::new(bytes).recv(peer).dst(Region::output(0))
            };
            let e = by_peer.entry((peer, send)).or_default();
            e.0.push(step);
            e.1.push(*bufs);
            if proxy_events {
                e.2.push(evs[i]);
            }
        }
        if by_peer.is_empty() {
            return Ok(());
        }
        let sends: Vec<ConnKey> = by_peer
            .keys()
            .filter(|k| k.1)
            .map(|k| (P2P_CHANNEL, k.0))
            .collect();
        let recvs: Vec<ConnKey> = by_peer
            .keys()
            .filter(|k| !k.1)
            .map(|k| (P2P_CHANNEL, k.0))
            .collect();
        self.connect(conns, &sends, &recvs)
            .map_err(|e| self.failed(e, None, P2P_OP))?;
        let mut seqs = self
            .p2p_seq
            .lock()
            .map_err(|_| Error::Internal("p2p counters poisoned".into()))?;
        let copy = Reducer::new(DataType::Uint8, RedOp::Sum, 1);
        let mut lanes = Vec::new();
        let mut what = Vec::new();
        for ((peer, send), (steps, bufs, parents)) in by_peer {
            let seq = seqs.entry((peer, send)).or_insert(0);
            let total: usize = steps.iter().map(|s| s.count).sum();
            let header = OpHeader {
                seq: *seq,
                kind: 5,
                dtype: DataType::Uint8 as u8,
                redop: 0,
                root: 0,
                count: total as u64,
                plan: None,
            };
            *seq += 1;
            let dir = if send { "send to" } else { "recv from" };
            what.push(format!("{dir} rank {peer}"));
            lanes.push(self.lane(
                conns,
                exec::LaneLabel::P2p { peer, send },
                P2P_CHANNEL,
                steps,
                bufs,
                parents,
                copy,
                header,
            ));
        }
        drop(seqs);
        let what = || format!("group of send/recv ({})", what.join(", "));
        let ctx = self.ctx(&what, None, mask);
        let result = exec::run(&mut lanes, &ctx);
        self.put_back(conns, &mut lanes, |_, _| {});
        result.map_err(|e| self.failed(e, None, P2P_OP))
    }

    /// A group's sends and receives to other ranks on the direct path:
    /// receivers copy each message straight from its sender's buffer, but
    /// for the large ones, whose places in `ops` it returns for the rings.
    fn run_p2p_direct(
        &self,
        d: &exec::host_direct::Direct,
        ops: &[&(Op, OpBuffers)],
        mask: i32,
    ) -> Result<Vec<usize>> {
        let me = self.rank;
        let mut msgs = Vec::with_capacity(ops.len());
        let mut places = Vec::with_capacity(ops.len());
        for (i, (op, bufs)) in ops.iter().enumerate() {
            let Some((peer, send, bytes)) = p2p_end(me, op, bufs) else {
                continue;
            };
            let region = if send {
                Region::input(0)
            } else {
                Region::output(0)
            };
            msgs.push(exec::mailbox::Msg {
                peer,
                send,
                span: bufs.span(region, 0, bytes, 1)?,
                ring: send && bytes > d.terms.p2p_max,
            });
            places.push(i);
        }
        if msgs.is_empty() {
            return Ok(Vec::new());
        }
        let ends: Vec<(bool, usize)> = msgs.iter().map(|m| (m.send, m.peer)).collect();
        let what = || {
            let each: Vec<String> = ends
                .iter()
                .map(|&(send, peer)| {
                    let dir = if send { "send to" } else { "recv from" };
                    format!("{dir} rank {peer}")
                })
                .collect();
            format!("group of send/recv ({})", each.join(", "))
        };
        let ctx = self.ctx(&what, None, mask);
        let ring = d
            .run_p2p(&msgs, &ctx)
            .map_err(|e| self.failed(e, None, P2P_OP))?;
        Ok(ring.into_iter().map(|m| places[m]).collect())
    }
}

/// The peer, direction and bytes of a send or receive to another rank,
/// or `None` for a message to this rank or an empty one (never sent, on
/// any path).
fn p2p_end(me: usize, op: &Op, bufs: &OpBuffers) -> Option<(usize, bool, usize)> {
    let (peer, send, bytes) = match op.kind {
        OpKind::Send { peer } => (peer, true, bufs.in_bytes),
        OpKind::Recv { peer } => (peer, false, bufs.out_bytes),
        _ => return None,
    };
    (peer != me && bytes > 0).then_some((peer, send, bytes))
}
