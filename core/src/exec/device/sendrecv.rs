//! Sends and receives on the device path: each group's messages of one
//! size in one kernel (a step per message), a rank's messages to itself
//! copied in that kernel or by the copy engine beside it.

use super::plan::Template;
use super::{DeviceComm, Direct};
use crate::cuda::{Event, RawStream};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};

/// Messages to itself up to this many bytes a rank copies in the kernel of
/// its group's other messages (an all_to_all's own block); larger ones go
/// by the copy engine beside it. On 2 H200 the copy engine's fork and join
/// made an all_to_all of 1 KiB take 26 us where in place took 17.
const SELF_COPY_IN_KERNEL: usize = 1 << 20;

/// A stream of the communicator's own and the events that fork a copy
/// onto it from the caller's stream and join it back, so that the copy
/// engine moves a rank's message to itself while the kernel moves the
/// peers' (in a graph capture the fork and the join are captured too).
/// Copied before the kernel on the caller's stream instead, an
/// all_to_all's own block added its whole copy to the call: 14 us at
/// 1 KiB on 2 H200, where NCCL took 21 us in all.
pub(super) struct SideCopy {
    stream: crate::cuda::Stream,
    fork: Event,
    join: Event,
}

impl DeviceComm {
    /// Sends `count` elements to `peer`, which calls [`DeviceComm::recv`]
    /// with the same count. Messages between two ranks match in order. A
    /// send waits (on the GPU) for the receiver once more than a FIFO's
    /// worth is in flight, so two ranks that both send before receiving
    /// need messages below `slots * slot_bytes` per channel.
    pub fn send(
        &mut self,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_peer("send", "peer", peer, false)?;
        self.check("send", count, dtype, &[buf])?;
        if self.window.shared.is_some() {
            return self.p2p(&[(peer, buf)], &[], count, dtype, stream);
        }
        let nch = self.p2p_channels_for(count * dtype.size());
        let t = Template::send(peer);
        let direct = self.p2p_direct(&[(peer, buf)], count * dtype.size(), stream)?;
        self.launch(t, buf, 0, count, dtype, RedOp::Sum, stream, nch, direct)
    }

    /// The peers that may read a group's send buffers where they lie: each
    /// same-process P2P peer all of whose messages come from registered
    /// buffers.
    fn p2p_direct(
        &self,
        sends: &[(usize, u64)],
        bytes: usize,
        stream: RawStream,
    ) -> Result<Direct> {
        let peers = self.window.same_process_p2p();
        if peers == 0 || (self.registry.is_empty() && !self.graph_register) {
            return Ok(Direct::default());
        }
        let (mut yes, mut no) = (0u64, 0u64);
        let mut captured = None;
        for &(p, b) in sends {
            if p >= 64 || peers & (1 << p) == 0 {
                continue;
            }
            if self.readable_in_place(b, bytes, stream, &mut captured)? {
                yes |= 1 << p;
            } else {
                no |= 1 << p;
            }
        }
        Ok(Direct {
            input: yes & !no,
            output: 0,
        })
    }

    /// Receives `count` elements from `peer` into `buf`.
    pub fn recv(
        &mut self,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_peer("recv", "peer", peer, false)?;
        self.check("recv", count, dtype, &[buf])?;
        if self.window.shared.is_some() {
            return self.p2p(&[], &[(peer, buf)], count, dtype, stream);
        }
        let nch = self.p2p_channels_for(count * dtype.size());
        let t = Template::recv(peer);
        self.launch(
            t,
            0,
            buf,
            count,
            dtype,
            RedOp::Sum,
            stream,
            nch,
            Direct::default(),
        )
    }

    /// A group's sends and receives, `count` elements each, as one kernel
    /// where they can be: all slices advance together, so two ranks that
    /// both send before they receive never wait on each other, whatever the
    /// size (NCCL fuses a group's point-to-point work likewise). One kernel
    /// addresses buffers as blocks of `count` elements from one base each
    /// way; a group whose buffers are not laid out so (or too many peers)
    /// runs as one kernel per message, in order, which is safe for messages
    /// up to a FIFO per channel. Sends to and receives from this rank are
    /// matched in order and copied.
    pub fn p2p(
        &mut self,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<()> {
        let nch = self.p2p_channels_for(count * dtype.size());
        self.p2p_on(sends, recvs, count, dtype, stream, nch)
    }

    /// [`DeviceComm::p2p`] on `channels` thread blocks (at most the
    /// window's), which both ends of every message must use alike: a
    /// call's own CTA bounds (all-to-all, gather, scatter), which every
    /// rank of the call passes.
    pub fn p2p_on(
        &mut self,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
        channels: usize,
    ) -> Result<()> {
        self.window.check_active()?;
        for &(p, _) in sends.iter().chain(recvs) {
            self.check_peer("send/recv", "peer", p, true)?;
        }
        let bufs: Vec<u64> = sends.iter().chain(recvs).map(|&(_, b)| b).collect();
        self.check("send/recv", count, dtype, &bufs)?;
        if count == 0 {
            return Ok(());
        }
        let bytes = count * dtype.size();
        let nch = channels.clamp(1, self.cfg.channels.max(1));
        let me = self.rank;
        let self_sends: Vec<u64> = sends.iter().filter(|s| s.0 == me).map(|s| s.1).collect();
        let self_recvs: Vec<u64> = recvs.iter().filter(|r| r.0 == me).map(|r| r.1).collect();
        if self_sends.len() != self_recvs.len() {
            return Err(Error::InvalidUsage(format!(
                "rank {me} sends {} message(s) to itself and receives {} from itself in one group: they must pair up",
                self_sends.len(),
                self_recvs.len()
            )));
        }
        self.order_after_last(stream)?;
        let routes_self = self
            .window
            .shared
            .as_ref()
            .is_some_and(|sh| sh.routes_self());
        let mut sends: Vec<(usize, u64)> = sends.to_vec();
        let mut recvs: Vec<(usize, u64)> = recvs.to_vec();
        let mut forked = false;
        let mut local = Vec::new();
        if !routes_self {
            // A rank's message to itself goes by the copy engine, taking no
            // SM, beside the kernel where there is one; up to
            // SELF_COPY_IN_KERNEL bytes, by the kernel itself, whose time
            // the copy then hides in, where the fork and join cost more
            // than the copy.
            let mut copies: Vec<(u64, u64)> = self_sends
                .iter()
                .zip(&self_recvs)
                .filter(|(s, r)| s != r)
                .map(|(s, r)| (*s, *r))
                .collect();
            sends.retain(|s| s.0 != me);
            recvs.retain(|r| r.0 != me);
            let peers = !(sends.is_empty() && recvs.is_empty());
            let fits = sends.len() + recvs.len() + copies.len() <= oxccl_kernels::MAX_STEPS;
            if peers && fits && bytes <= SELF_COPY_IN_KERNEL && self.window.shared.is_none() {
                local = std::mem::take(&mut copies);
            }
            let beside = !copies.is_empty() && peers;
            let on = if beside {
                Some(self.fork(stream)?)
            } else {
                None
            };
            for (s, r) in copies {
                #[allow(unsafe_code)]
                // SAFETY: both buffers passed `check` for `count` elements
                // of `dtype` (device memory of this context) and stay the
                // caller's until the stream has run the group (the side
                // stream's copy joins it below); a send and a receive
                // buffer of one group are the same buffer or apart, as
                // NCCL requires.
                unsafe {
                    on.unwrap_or(stream).copy_device(r, s, bytes)?
                };
            }
            if let (Some(side), Some(c)) = (on, self.side.as_ref()) {
                c.join.record(side)?;
                forked = true;
            }
        }
        if let Some(sh) = self.window.shared.as_mut() {
            (sends, recvs) = sh.p2p(
                self.timed,
                &self.kernels,
                &sends,
                &recvs,
                count,
                dtype,
                stream,
            )?;
        }
        if routes_self {
            // Those the shared path left to this rank (its stream is being
            // captured, or its memory cannot be shared): copied here.
            let left_s: Vec<u64> = sends.iter().filter(|s| s.0 == me).map(|s| s.1).collect();
            let left_r: Vec<u64> = recvs.iter().filter(|r| r.0 == me).map(|r| r.1).collect();
            for (s, r) in left_s.iter().zip(&left_r) {
                self.kernels
                    .copy(*r, *s, bytes, self.cfg.channels, stream)?;
            }
            sends.retain(|s| s.0 != me);
            recvs.retain(|r| r.0 != me);
        }
        if sends.is_empty() && recvs.is_empty() {
            return self.mark();
        }
        let launched = self.launch_p2p(&sends, &recvs, &local, count, dtype, stream, nch, bytes);
        if forked {
            // Joined whether or not the launch went through, so the side
            // stream never holds the caller's work back.
            if let Some(c) = self.side.as_ref() {
                c.join.wait_on(stream)?;
            }
            launched?;
            return self.mark();
        }
        launched
    }

    /// The caller's stream's work so far forks onto the side stream
    /// (made on the first call), which is returned.
    fn fork(&mut self, stream: RawStream) -> Result<RawStream> {
        let c = match &mut self.side {
            Some(c) => c,
            None => self.side.insert(SideCopy {
                stream: crate::cuda::Stream::new(&self.ctx)?,
                fork: Event::new(&self.ctx, false)?,
                join: Event::new(&self.ctx, false)?,
            }),
        };
        c.fork.record(stream)?;
        c.fork.wait_on(c.stream.handle())?;
        Ok(c.stream.handle())
    }

    /// The kernels of a group's messages to other ranks, and the copies of
    /// its messages to itself in `local` (source, destination): in the same
    /// kernel, or by the copy engine first where the group takes several.
    #[allow(clippy::too_many_arguments)] // one group's messages
    fn launch_p2p(
        &mut self,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        local: &[(u64, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
        nch: usize,
        bytes: usize,
    ) -> Result<()> {
        match fused_p2p(sends, recvs, local, bytes) {
            Some((t, input, output)) => {
                // One kernel moves every message, so a send's wait for its
                // reader at the end never holds up a receive.
                let direct = self.p2p_direct(sends, bytes, stream)?;
                self.launch(
                    t,
                    input,
                    output,
                    count,
                    dtype,
                    RedOp::Sum,
                    stream,
                    nch,
                    direct,
                )
            }
            None => {
                tracing::debug!(target: "oxccl::coll", "send/recv group of {} send(s), {} recv(s) not addressable from one base: one kernel each", sends.len(), recvs.len());
                for &(s, d) in local {
                    #[allow(unsafe_code)]
                    // SAFETY: as for the copies in `p2p_on`: checked device
                    // buffers of this context, the caller's until the
                    // stream has run the group, the same or apart.
                    unsafe {
                        stream.copy_device(d, s, bytes)?
                    };
                }
                // Sends never read in place here: a send kernel that waited
                // for its reader would hold up this rank's receives after it.
                let none = Direct::default();
                for &(p, b) in sends {
                    let t = Template::send(p);
                    self.launch(t, b, 0, count, dtype, RedOp::Sum, stream, nch, none)?;
                }
                for &(p, b) in recvs {
                    let t = Template::recv(p);
                    self.launch(t, 0, b, count, dtype, RedOp::Sum, stream, nch, none)?;
                }
                Ok(())
            }
        }
    }
}

/// One template for a group of sends and receives of `bytes` each, and
/// the copies of a rank's messages to itself (`local`: source, destination),
/// when every buffer is a whole number of blocks from the lowest of its
/// side: the template, the input base and the output base.
fn fused_p2p(
    sends: &[(usize, u64)],
    recvs: &[(usize, u64)],
    local: &[(u64, u64)],
    bytes: usize,
) -> Option<(Template, u64, u64)> {
    let lowest = |v: &mut dyn Iterator<Item = u64>| v.min().unwrap_or(0);
    let ib = lowest(&mut sends.iter().map(|x| x.1).chain(local.iter().map(|x| x.0)));
    let ob = lowest(&mut recvs.iter().map(|x| x.1).chain(local.iter().map(|x| x.1)));
    let block = |b: u64, base: u64| -> Option<u16> {
        let off = b - base;
        off.is_multiple_of(bytes as u64)
            .then(|| u16::try_from(off / bytes as u64).ok())?
    };
    let mut steps = Vec::with_capacity(sends.len() + recvs.len() + local.len());
    for &(p, b) in sends {
        let mut t = Template::send(p).steps[0];
        t.src_block = block(b, ib)?;
        steps.push(t);
    }
    for &(p, b) in recvs {
        let mut t = Template::recv(p).steps[0];
        t.dst_block = block(b, ob)?;
        steps.push(t);
    }
    for &(s, d) in local {
        // Neither sends nor receives: the kernel copies the slice.
        let mut t = Template::send(0).steps[0];
        t.send = -1;
        t.dst_buf = crate::cuda::abi::BUF_OUTPUT;
        t.src_block = block(s, ib)?;
        t.dst_block = block(d, ob)?;
        steps.push(t);
    }
    Some((Template::from_steps(&steps).ok()?, ib, ob))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_all_to_all_copies_its_own_block_in_its_kernel() {
        use crate::cuda::abi::{BUF_INPUT, BUF_OUTPUT};
        let (inp, out, b) = (0x1000_0000u64, 0x2000_0000u64, 4096usize);
        // Rank 0 of 2: block 1 to and from rank 1, block 0 to itself.
        let (t, ib, ob) = fused_p2p(
            &[(1, inp + b as u64)],
            &[(1, out + b as u64)],
            &[(inp, out)],
            b,
        )
        .unwrap();
        assert_eq!((ib, ob, t.nsteps), (inp, out, 3));
        let own = t.steps[2];
        assert_eq!((own.recv, own.send), (-1, -1), "no peer");
        assert_eq!((own.src_buf, own.src_block), (BUF_INPUT, 0));
        assert_eq!((own.dst_buf, own.dst_block), (BUF_OUTPUT, 0));
        assert_eq!((t.steps[0].send, t.steps[0].src_block), (1, 1));
        assert_eq!((t.steps[1].recv, t.steps[1].dst_block), (1, 1));
        // Not a whole number of blocks apart: no fused template.
        assert!(fused_p2p(&[(1, inp + 8)], &[], &[(inp, out)], b).is_none());
    }
}
