//! Requests and the per-connection queues they progress through.
//!
//! Every message starts with a 16-byte header (size, tag) on the control
//! socket. Small messages follow inline on it, moved by the caller's thread
//! in `test` (no thread hand-off: lowest latency); large ones are cut into
//! stripes that the helper threads move over the data sockets. Both ends
//! cut by the size in the header, so stripes line up.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use oxccl_plugin::{NetError, NetResult, Request};

use crate::threads::{Job, Progress, Worker};

/// Largest message carried inline on the control socket.
pub const INLINE_MAX: usize = 64 << 10;
/// Smallest stripe worth a helper thread.
const MIN_STRIPE: usize = 32 << 10;

/// The data sockets of one connection and the threads that drive them.
pub struct DataPath {
    pub workers: Vec<Worker>,
    pub socks_per_worker: usize,
}

impl DataPath {
    fn nsocks(&self) -> usize {
        self.workers.len() * self.socks_per_worker
    }

    /// Hands the stripes of `size` bytes at `addr` to the helper threads.
    fn dispatch(&self, addr: usize, size: usize) -> Result<Arc<Progress>, String> {
        let n = self.nsocks().min(size.div_ceil(MIN_STRIPE)).max(1);
        let done = Progress::new(n);
        for i in 0..n {
            let (a, b) = (size * i / n, size * (i + 1) / n);
            let w = &self.workers[i / self.socks_per_worker];
            w.submit(Job {
                sock: i % self.socks_per_worker,
                addr: addr + a,
                len: b - a,
                done: done.clone(),
            })?;
        }
        Ok(done)
    }
}

struct Op {
    id: u64,
    addr: usize,
    /// Sender: message size. Receiver: room posted.
    size: usize,
    tag: i32,
    header: [u8; 16],
    header_done: usize,
    payload_done: usize,
    stripes: Option<Arc<Progress>>,
}

/// The queue of one direction of one connection.
pub struct Queue {
    pub sending: bool,
    pub peer: String,
    ctrl: TcpStream,
    data: DataPath,
    next_id: u64,
    waiting: VecDeque<Op>,
    striping: VecDeque<Op>,
    /// Ids below this have completed, with their sizes kept until tested.
    completed: Vec<(u64, usize)>,
    failed: Option<NetError>,
}

impl Queue {
    pub fn new(
        sending: bool,
        peer: String,
        ctrl: TcpStream,
        data: DataPath,
    ) -> std::io::Result<Queue> {
        ctrl.set_nonblocking(true)?;
        Ok(Queue {
            sending,
            peer,
            ctrl,
            data,
            next_id: 0,
            waiting: VecDeque::new(),
            striping: VecDeque::new(),
            completed: Vec::new(),
            failed: None,
        })
    }

    pub fn post(&mut self, addr: usize, size: usize, tag: i32) -> NetResult<u64> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut header = [0u8; 16];
        if self.sending {
            header[0..8].copy_from_slice(&(size as u64).to_le_bytes());
            header[8..12].copy_from_slice(&tag.to_le_bytes());
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
        });
        Ok(id)
    }

    fn fail(&mut self, e: NetError) -> NetError {
        self.failed.get_or_insert(e).clone()
    }

    fn io_err(&self, e: std::io::Error) -> NetError {
        match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted => {
                NetError::Remote(format!("connection to {} closed by peer ({e})", self.peer))
            }
            _ => NetError::System(format!("connection to {}: {e}", self.peer)),
        }
    }

    /// Moves what can move without blocking.
    pub fn progress(&mut self) -> NetResult<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Err(e) = self.progress_waiting() {
            return Err(self.fail(e));
        }
        while let Some(op) = self.striping.front() {
            let st = op.stripes.clone().expect("striping ops have stripes");
            let err = st.error.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(e) = err {
                return Err(self.fail(NetError::Remote(e)));
            }
            if st.remaining.load(Ordering::Acquire) != 0 {
                break;
            }
            let op = self.striping.pop_front().expect("front exists");
            self.completed.push((op.id, op.size));
        }
        Ok(())
    }

    fn progress_waiting(&mut self) -> NetResult<()> {
        while let Some(mut op) = self.waiting.pop_front() {
            let more = if self.sending {
                self.step_send(&mut op)?
            } else {
                self.step_recv(&mut op)?
            };
            if more {
                self.waiting.push_front(op);
                return Ok(());
            }
            if op.stripes.is_some() {
                self.striping.push_back(op);
            } else {
                self.completed.push((op.id, op.size));
            }
        }
        Ok(())
    }

    /// Returns true while the op still needs the control socket.
    /// Without helper threads every message travels on the control socket,
    /// moved by the caller's thread as `test` is called.
    fn inline(&self, size: usize) -> bool {
        size <= INLINE_MAX || self.data.workers.is_empty()
    }

    fn step_send(&mut self, op: &mut Op) -> NetResult<bool> {
        let inline = self.inline(op.size);
        #[allow(unsafe_code)]
        // SAFETY: isend's contract: `size` readable bytes at `addr` until completion.
        let payload = unsafe {
            std::slice::from_raw_parts(op.addr as *const u8, if inline { op.size } else { 0 })
        };
        // Header and an inline payload leave in one system call (one segment
        // for a small message), which is most of the latency.
        while op.header_done < 16 || op.payload_done < payload.len() {
            let bufs = [
                IoSlice::new(&op.header[op.header_done..]),
                IoSlice::new(&payload[op.payload_done..]),
            ];
            match self.ctrl.write_vectored(&bufs) {
                Ok(0) => {
                    return Err(NetError::Remote(format!(
                        "connection to {} closed",
                        self.peer
                    )))
                }
                Ok(mut n) => {
                    let h = n.min(16 - op.header_done);
                    op.header_done += h;
                    n -= h;
                    op.payload_done += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        if !inline {
            op.stripes = Some(
                self.data
                    .dispatch(op.addr, op.size)
                    .map_err(NetError::Internal)?,
            );
        }
        Ok(false)
    }

    fn step_recv(&mut self, op: &mut Op) -> NetResult<bool> {
        while op.header_done < 16 {
            match self.ctrl.read(&mut op.header[op.header_done..]) {
                Ok(0) => {
                    return Err(NetError::Remote(format!(
                        "connection to {} closed by peer",
                        self.peer
                    )))
                }
                Ok(n) => {
                    op.header_done += n;
                    if op.header_done == 16 {
                        let size = u64::from_le_bytes(op.header[0..8].try_into().expect("8 bytes"))
                            as usize;
                        let tag = i32::from_le_bytes(op.header[8..12].try_into().expect("4 bytes"));
                        if tag != op.tag {
                            return Err(NetError::Internal(format!(
                                "message from {} has tag {tag}, the receive posted in its place has tag {}",
                                self.peer, op.tag
                            )));
                        }
                        if size > op.size {
                            return Err(NetError::InvalidArgument(format!(
                                "message truncated: {} sent {size} bytes, receive posted for {}",
                                self.peer, op.size
                            )));
                        }
                        op.size = size;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        if !self.inline(op.size) {
            op.stripes = Some(
                self.data
                    .dispatch(op.addr, op.size)
                    .map_err(NetError::Internal)?,
            );
            return Ok(false);
        }
        #[allow(unsafe_code)]
        // SAFETY: irecv's contract: `size` writable bytes at `addr`, untouched by others until completion.
        let buf = unsafe { std::slice::from_raw_parts_mut(op.addr as *mut u8, op.size) };
        while op.payload_done < op.size {
            match self.ctrl.read(&mut buf[op.payload_done..]) {
                Ok(0) => {
                    return Err(NetError::Remote(format!(
                        "connection to {} closed by peer",
                        self.peer
                    )))
                }
                Ok(n) => op.payload_done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        Ok(false)
    }

    /// The size of a completed op, once.
    fn take_completed(&mut self, id: u64) -> Option<usize> {
        let i = self.completed.iter().position(|(c, _)| *c == id)?;
        Some(self.completed.swap_remove(i).1)
    }
}

/// A request: polls its connection's queue and reports its own completion.
pub struct SocketRequest {
    pub queue: Arc<Mutex<Queue>>,
    pub id: u64,
    pub done: Option<usize>,
}

impl Request for SocketRequest {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        if let Some(s) = self.done {
            return Ok(Some(vec![s]));
        }
        let mut q = self
            .queue
            .lock()
            .map_err(|_| NetError::Internal("socket queue poisoned".into()))?;
        q.progress()?;
        if let Some(s) = q.take_completed(self.id) {
            self.done = Some(s);
            return Ok(Some(vec![s]));
        }
        Ok(None)
    }
}
