//! Requests and the per-connection queue that matches them.
//!
//! Matching is by order alone, as the core expects: the n-th receive posted
//! takes the n-th message sent. Every message starts with a 16-byte header
//! (size, tag, check word) on the control socket. Small messages follow it
//! inline, moved by the thread that calls `test` (no hand-off to another
//! thread: lowest latency). Large ones are cut into stripes that the helper
//! threads move over the data sockets; both ends cut by the size in the
//! header and rotate over the sockets in step, so the stripes line up.
//! With a key the control socket's bytes are sealed into records (in
//! batches, so that memory stays bounded) and opened straight into the
//! caller's buffer; a record that fails authentication fails the connection.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_plugin::{NetError, NetEvent, NetProf, NetResult, Request};
use oxccl_secure::session::{DIRECT_FROM, SEAL_BATCH};
use oxccl_secure::Session;
use socket2::Socket;

use crate::stream::{io_error, secure_error, Io, Stream, MSG_NOSIGNAL};
use crate::threads::{sock_event, Job, Progress, Worker};

/// Messages from this size on go to the helper threads; smaller ones ride
/// inline on the control socket.
pub const STRIPE_FROM: usize = 64 << 10;
/// Smallest stripe: below it a stripe costs more in thread hand-off than
/// the extra stream gains.
const MIN_STRIPE: usize = 64 << 10;
const HEADER: usize = 16;
/// Catches a stream that lost its framing (a bug, or a stranger) before a
/// garbage size is trusted.
const HEADER_CHECK: u32 = 0x4f58_4d31; // "OXM1"
/// How often a sender looks for its peer's close on the control socket
/// while its sends leave at once. Looking costs a system call, which on
/// every post was a measurable part of an 8-byte operation's latency (one
/// of four calls); a send to a peer that closed fails at the next write
/// anyway (the peer's stack answers the first with a reset), so a bounded
/// delay loses nothing but the earlier message.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(1);
/// Outstanding operations per direction; beyond it `isend`/`irecv` say
/// "try again", which bounds memory if the peer stops reading.
const MAX_REQUESTS: usize = 4096;

/// The data sockets of one connection and the threads that drive them.
pub struct DataPath {
    workers: Vec<Worker>,
    /// Data socket `j` belongs to worker `j % nthreads`, so consecutive
    /// stripes land on different threads.
    nsocks: usize,
    /// Where the next message's first stripe goes: rotating spreads many
    /// medium messages over all sockets.
    next: usize,
}

impl DataPath {
    pub fn new(workers: Vec<Worker>, nsocks: usize) -> DataPath {
        DataPath {
            workers,
            nsocks,
            next: 0,
        }
    }

    fn enabled(&self) -> bool {
        !self.workers.is_empty() && self.nsocks > 0
    }

    /// Hands the stripes of `size` bytes at `addr` to the helper threads.
    fn dispatch(
        &mut self,
        addr: usize,
        size: usize,
        prof: Option<NetProf>,
    ) -> NetResult<Arc<Progress>> {
        let n = self.nsocks.min(size.div_ceil(MIN_STRIPE)).max(1);
        let nthreads = self.workers.len();
        let done = Progress::new(n);
        for i in 0..n {
            let (a, b) = (size * i / n, size * (i + 1) / n);
            let j = (self.next + i) % self.nsocks;
            self.workers[j % nthreads].submit(Job {
                sock: j / nthreads,
                addr: addr + a,
                len: b - a,
                done: done.clone(),
                prof,
            })?;
        }
        self.next = (self.next + n) % self.nsocks;
        Ok(done)
    }

    fn shutdown(&self) {
        for w in &self.workers {
            w.shutdown();
        }
    }
}

struct Op {
    id: u64,
    addr: usize,
    /// Sender: message size. Receiver: room posted, then the size received.
    size: usize,
    tag: i32,
    header: [u8; HEADER],
    header_done: usize,
    payload_done: usize,
    stripes: Option<Arc<Progress>>,
    /// The operation's profiler, and the event of its inline transfer on
    /// the control socket while one runs.
    prof: Option<NetProf>,
    ev: Option<NetEvent>,
}

/// One direction of one connection: the operations posted on it, oldest first.
pub struct Queue {
    sending: bool,
    peer: Arc<str>,
    /// Non-blocking: only the helper threads ever block.
    ctrl: Socket,
    /// The control socket's session, with a key.
    sess: Option<Box<Session>>,
    data: DataPath,
    next_id: u64,
    /// Operations that still need the control socket, in posting order.
    waiting: VecDeque<Op>,
    /// Operations whose bytes the helper threads are moving.
    striping: Vec<Op>,
    /// Finished operations, kept until their request is tested.
    completed: Vec<(u64, usize)>,
    /// The first error; the connection is unusable after it.
    failed: Option<NetError>,
    /// Receiving side: bytes read from the control socket ahead of the
    /// message being received (`carry[carry_lo..carry_hi]`). A small
    /// message's header and payload then come in with one system call, not
    /// two, which is a visible part of an 8-byte operation's latency.
    carry: Box<[u8]>,
    carry_lo: usize,
    carry_hi: usize,
    /// Sending side: when the control socket was last read for the peer's
    /// close; receiving side: when delayed ACKs were last asked for.
    peer_checked: Instant,
}

/// Reads shorter than this go through the carry buffer; longer ones land
/// straight in the caller's buffer.
const CARRY: usize = 4096;

impl Queue {
    pub fn new(sending: bool, peer: Arc<str>, ctrl: Stream, data: DataPath) -> Queue {
        Queue {
            sending,
            peer,
            ctrl: ctrl.sock,
            sess: ctrl.sess,
            data,
            next_id: 0,
            waiting: VecDeque::new(),
            striping: Vec::new(),
            completed: Vec::new(),
            failed: None,
            carry: if sending {
                Box::default()
            } else {
                vec![0u8; CARRY].into_boxed_slice()
            },
            carry_lo: 0,
            carry_hi: 0,
            peer_checked: Instant::now(),
        }
    }

    pub fn sending(&self) -> bool {
        self.sending
    }

    /// No operation waits for the control socket.
    pub fn idle(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Queues an operation; `None` when too many are outstanding.
    pub fn post(
        &mut self,
        addr: usize,
        size: usize,
        tag: i32,
        prof: Option<NetProf>,
    ) -> NetResult<Option<u64>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.sending
            && (!self.waiting.is_empty() || self.peer_checked.elapsed() >= PEER_CHECK_EVERY)
        {
            // The receiver never writes, so anything readable on the control
            // socket is its close: report it now rather than let the message
            // vanish into a dead socket's buffer. Every time while earlier
            // sends wait for the socket (the peer may have stopped reading),
            // otherwise at most every PEER_CHECK_EVERY.
            self.peer_checked = Instant::now();
            if let Some(e) = self.peer_gone() {
                return Err(self.fail(e));
            }
        }
        if self.waiting.len() + self.striping.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut header = [0u8; HEADER];
        if self.sending {
            header[0..8].copy_from_slice(&(size as u64).to_le_bytes());
            header[8..12].copy_from_slice(&tag.to_le_bytes());
            header[12..16].copy_from_slice(&HEADER_CHECK.to_le_bytes());
        }
        self.waiting.push_back(Op {
            id,
            addr,
            size,
            tag,
            header,
            header_done: 0,
            payload_done: 0,
            stripes: None,
            prof,
            ev: None,
        });
        Ok(Some(id))
    }

    /// The size of operation `id` once it has completed; its error, or the
    /// connection's, once one happened.
    pub fn poll(&mut self, id: u64) -> NetResult<Option<usize>> {
        if let Some(s) = self.take_completed(id) {
            return Ok(Some(s));
        }
        self.progress();
        if let Some(s) = self.take_completed(id) {
            return Ok(Some(s));
        }
        let Some(e) = self.failed.clone() else {
            return Ok(None);
        };
        if let Some(i) = self.striping.iter().position(|o| o.id == id) {
            let p = self.striping[i]
                .stripes
                .clone()
                .expect("striping ops have stripes");
            // The caller may free the buffer once told: not before the helper
            // threads are out of it (the sockets are shut down, so soon).
            if !p.idle() {
                return Ok(None);
            }
            if p.error().is_none() {
                let op = self.striping.swap_remove(i);
                return Ok(Some(op.size));
            }
        }
        Err(e)
    }

    /// Moves what can move without blocking. Errors are kept in `failed`.
    pub fn progress(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.progress_waiting() {
            self.fail(e);
            return;
        }
        let mut i = 0;
        while i < self.striping.len() {
            let p = self.striping[i]
                .stripes
                .clone()
                .expect("striping ops have stripes");
            // Idle first: a stripe records its error before it counts itself
            // done, so an idle message's error (if any) is visible below.
            let idle = p.idle();
            if let Some(e) = p.error() {
                self.fail(e);
                return;
            }
            if idle {
                let op = self.striping.swap_remove(i);
                self.completed.push((op.id, op.size));
            } else {
                i += 1;
            }
        }
    }

    /// Closes the connection from this side: sockets shut down, helper
    /// threads joined (after which no thread touches a caller's buffer).
    pub fn close(&mut self) {
        self.fail(NetError::Internal(format!(
            "connection to {} was closed on this side",
            self.peer
        )));
        self.data.workers.clear();
    }

    /// Records the first error and shuts every socket down, so that helper
    /// threads wake up and the peer learns at once instead of waiting on a
    /// stream whose framing is lost.
    fn fail(&mut self, e: NetError) -> NetError {
        if self.failed.is_none() {
            self.failed = Some(e);
            // A transfer that failed ends its event, as NCCL's does.
            for op in &mut self.waiting {
                op.ev = None;
            }
            let _ = self.ctrl.shutdown(std::net::Shutdown::Both);
            self.data.shutdown();
        }
        self.failed.clone().expect("set above")
    }

    fn closed_by_peer(&self) -> NetError {
        NetError::Remote(format!("connection to {} closed by peer", self.peer))
    }

    fn peer_gone(&self) -> Option<NetError> {
        let mut byte = [0u8; 1];
        match (&self.ctrl).read(&mut byte) {
            Ok(0) => Some(self.closed_by_peer()),
            Ok(_) => Some(NetError::Internal(format!(
                "unexpected bytes from {} on a sending connection",
                self.peer
            ))),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
            Err(e) => Some(io_error(&self.peer, e)),
        }
    }

    fn progress_waiting(&mut self) -> NetResult<()> {
        while let Some(mut op) = self.waiting.pop_front() {
            let blocked = if self.sending {
                self.step_send(&mut op)?
            } else {
                self.step_recv(&mut op)?
            };
            if blocked {
                self.waiting.push_front(op);
                return Ok(());
            }
            // The inline transfer is done: its event stops.
            op.ev = None;
            if op.stripes.is_some() {
                self.striping.push(op);
            } else {
                self.completed.push((op.id, op.size));
            }
        }
        Ok(())
    }

    fn inline(&self, size: usize) -> bool {
        size < STRIPE_FROM || !self.data.enabled()
    }

    /// Returns true while the op waits for the control socket.
    fn step_send(&mut self, op: &mut Op) -> NetResult<bool> {
        let inline = self.inline(op.size);
        let len = if inline { op.size } else { 0 };
        // A message moved on the control socket is one socket event (NCCL's
        // main-thread transfer), started as it starts moving; a striped
        // one's events are its stripes'.
        if inline && op.ev.is_none() && op.prof.is_some() {
            op.ev = sock_event(op.prof, &self.ctrl, true, op.size);
        }
        #[allow(unsafe_code)]
        // SAFETY: isend's contract: `size` readable bytes at `addr`, unchanged
        // until the request completes; `len` is 0 or `size`.
        let payload = unsafe { std::slice::from_raw_parts(op.addr as *const u8, len) };
        if let Some(sess) = self.sess.as_mut() {
            // Seal a batch, send it, seal the next: the op waits while
            // sealed bytes wait for the socket (no one else would send them).
            loop {
                match sess.flush_with(|b| Io(&self.ctrl).write(b)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                    Err(e) => return Err(io_error(&self.peer, e)),
                }
                if op.header_done == HEADER && op.payload_done == len {
                    break;
                }
                // A large payload's records start with it, so that the
                // receiver can open them straight in its buffer: its header
                // is a record of its own (sent with the first batch, in one
                // system call). A small one shares its header's record (one
                // record, one read).
                if op.header_done < HEADER && len >= DIRECT_FROM {
                    op.header_done += sess
                        .seal(&[&op.header[op.header_done..]], HEADER)
                        .map_err(|e| secure_error(&self.peer, e))?;
                }
                let parts = [&op.header[op.header_done..], &payload[op.payload_done..]];
                let n = sess
                    .seal(&parts, SEAL_BATCH)
                    .map_err(|e| secure_error(&self.peer, e))?;
                let h = n.min(HEADER - op.header_done);
                op.header_done += h;
                op.payload_done += n - h;
            }
        }
        // Header and inline payload leave in one system call (one segment for
        // a small message), which is most of the latency.
        while op.header_done < HEADER || op.payload_done < len {
            let bufs = [
                IoSlice::new(&op.header[op.header_done..]),
                IoSlice::new(&payload[op.payload_done..]),
            ];
            match self.ctrl.send_vectored_with_flags(&bufs, MSG_NOSIGNAL) {
                Ok(n) => {
                    let h = n.min(HEADER - op.header_done);
                    op.header_done += h;
                    op.payload_done += n - h;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(&self.peer, e)),
            }
        }
        if !inline {
            op.stripes = Some(self.data.dispatch(op.addr, op.size, op.prof)?);
        }
        Ok(false)
    }

    fn step_recv(&mut self, op: &mut Op) -> NetResult<bool> {
        // Each connection carries data one way, so the receiver's ACKs are
        // bare segments, and Linux sends one from inside the read that takes
        // each small message: a trip through the stack on every operation's
        // critical path. In delayed-ACK ("pingpong") mode it acks every second
        // small message (or a full segment's worth, or on its timer) instead,
        // which never leaves the sender short of window: 12.18 -> 10.83 us
        // median for an 8 B all_reduce of 2 ranks on loopback. The kernel
        // leaves the mode when its delayed-ACK timer fires, so it is asked
        // for again, at most every PEER_CHECK_EVERY (the field is the sender's
        // timer otherwise). Failure to set it costs only speed.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if self.peer_checked.elapsed() >= PEER_CHECK_EVERY {
            self.peer_checked = Instant::now();
            let _ = self.ctrl.set_tcp_quickack(false);
        }
        if op.header_done < HEADER {
            let mut header = op.header;
            let got = self.read_some(&mut header[op.header_done..], &mut op.header_done)?;
            op.header = header;
            if !got {
                return Ok(true);
            }
            self.check_header(op)?;
            if !self.inline(op.size) {
                op.stripes = Some(self.data.dispatch(op.addr, op.size, op.prof)?);
                return Ok(false);
            }
            // The size is known (NCCL starts its event after the size
            // exchange too): the payload's transfer starts.
            if op.prof.is_some() {
                op.ev = sock_event(op.prof, &self.ctrl, false, op.size);
            }
        }
        #[allow(unsafe_code)]
        // SAFETY: irecv's contract: `size` writable bytes at `addr`, touched by
        // no one else until the request completes; `op.size` is now the
        // incoming size, checked to be no larger than the posted one.
        let buf = unsafe { std::slice::from_raw_parts_mut(op.addr as *mut u8, op.size) };
        let got = self.read_some(&mut buf[op.payload_done..], &mut op.payload_done)?;
        Ok(!got)
    }

    /// Reads into `buf` until full (true) or the socket is drained (false):
    /// first what the carry holds, then short remainders through the carry
    /// (the stream's next bytes, possibly the next message, stay there) and
    /// long ones straight from the socket.
    fn read_some(&mut self, buf: &mut [u8], done: &mut usize) -> NetResult<bool> {
        let mut off = 0;
        if let Some(sess) = self.sess.as_mut() {
            // The session buffers what comes ahead, as the carry does.
            while off < buf.len() {
                match sess.read_from(&mut Io(&self.ctrl), &mut buf[off..]) {
                    Ok(Some(0)) => return Err(self.closed_by_peer()),
                    Ok(Some(n)) => {
                        off += n;
                        *done += n;
                    }
                    Ok(None) => return Ok(false),
                    Err(e) => return Err(secure_error(&self.peer, e)),
                }
            }
            return Ok(true);
        }
        while off < buf.len() {
            if self.carry_lo < self.carry_hi {
                let n = (buf.len() - off).min(self.carry_hi - self.carry_lo);
                buf[off..off + n].copy_from_slice(&self.carry[self.carry_lo..self.carry_lo + n]);
                self.carry_lo += n;
                off += n;
                *done += n;
                continue;
            }
            let through_carry = buf.len() - off < self.carry.len();
            let target = if through_carry {
                &mut self.carry[..]
            } else {
                &mut buf[off..]
            };
            match (&self.ctrl).read(target) {
                Ok(0) => return Err(self.closed_by_peer()),
                Ok(n) if through_carry => (self.carry_lo, self.carry_hi) = (0, n),
                Ok(n) => {
                    off += n;
                    *done += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(&self.peer, e)),
            }
        }
        Ok(true)
    }

    /// Matches an incoming header against the receive posted in its place.
    fn check_header(&self, op: &mut Op) -> NetResult<()> {
        let h = &op.header;
        let size = u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
        let tag = i32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        let check = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
        if check != HEADER_CHECK {
            return Err(NetError::Internal(format!(
                "connection to {} lost its framing (bad message header)",
                self.peer
            )));
        }
        if tag != op.tag {
            return Err(NetError::Internal(format!(
                "message from {} has tag {tag}, the receive posted in its place has tag {}",
                self.peer, op.tag
            )));
        }
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size > op.size {
            return Err(NetError::InvalidArgument(format!(
                "message truncated: {} sent {size} bytes, receive posted for {}",
                self.peer, op.size
            )));
        }
        op.size = size;
        Ok(())
    }

    fn take_completed(&mut self, id: u64) -> Option<usize> {
        let i = self.completed.iter().position(|(c, _)| *c == id)?;
        Some(self.completed.swap_remove(i).1)
    }
}

pub fn lock(q: &Mutex<Queue>) -> NetResult<std::sync::MutexGuard<'_, Queue>> {
    q.lock()
        .map_err(|_| NetError::Internal("socket connection state poisoned by a panic".into()))
}

/// An `isend` or `irecv`: polls its connection and reports its own completion.
pub struct SocketRequest {
    pub queue: Arc<Mutex<Queue>>,
    pub id: u64,
    pub done: Option<usize>,
}

impl Request for SocketRequest {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        Ok(self.test_first()?.map(|s| s.into_iter().collect()))
    }

    fn test_first(&mut self) -> NetResult<Option<Option<usize>>> {
        if self.done.is_none() {
            self.done = lock(&self.queue)?.poll(self.id)?;
        }
        Ok(self.done.map(Some))
    }
}
