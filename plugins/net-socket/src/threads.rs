//! Helper threads: each owns some data sockets of one connection and moves
//! the stripes of large messages over them, so one connection uses several
//! TCP streams and several cores at once, and the thread that calls `test`
//! never blocks on a large transfer.
//!
//! A thread moves its stripes one after another with blocking calls,
//! straight between the caller's buffer and the socket (no copy in user
//! space). Both ends hand out the same stripes in the same order, so each
//! socket's bytes line up, and the oldest unfinished stripe can always
//! progress on both ends: no deadlock between threads.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use std::os::fd::AsRawFd;
use std::os::raw::c_int;

use oxccl_plugin::ffi::profiler::net_socket_v1::{
    NetSockDescrV1, NetSockDetailV1, NetSockOpDescrV1, NCCL_PROFILE_SOCKET, NET_SOCKET_VER,
};
use oxccl_plugin::ffi::profiler::NCCL_PROFILER_NET_TYPE_SOCK;
use oxccl_plugin::{NetError, NetEvent, NetProf};
use socket2::Socket;

use crate::stream::{io_error, Io, Stream, MSG_NOSIGNAL};

/// Completion state shared by the stripes of one message.
#[derive(Debug)]
pub struct Progress {
    remaining: AtomicUsize,
    /// Set before `remaining` drops, so a caller that sees either knows the
    /// error is in place. An atomic keeps the caller's spin free of locks.
    failed: AtomicBool,
    error: Mutex<Option<NetError>>,
}

impl Progress {
    pub fn new(stripes: usize) -> Arc<Progress> {
        Arc::new(Progress {
            remaining: AtomicUsize::new(stripes),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        })
    }

    /// True once no helper thread touches the message's buffer any more.
    pub fn idle(&self) -> bool {
        // Acquire pairs with the helper's release: the bytes it received are
        // visible to the caller once the count reads zero.
        self.remaining.load(Ordering::Acquire) == 0
    }

    /// The first error of a stripe, as soon as one failed (other stripes
    /// may still be moving).
    pub fn error(&self) -> Option<NetError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let e = self.error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Some(
            e.unwrap_or_else(|| NetError::Internal("socket stripe failed without an error".into())),
        )
    }

    fn fail(&self, e: NetError) {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    fn stripe_done(&self) {
        self.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The net-plugin id of the events this network reports: NCCL's socket
/// transport's (`NCCL_PROFILER_NET_TYPE_SOCK | 1`), so that profilers that
/// decode NCCL's read ours alike.
pub const SOCK_EVENT_ID: i64 = (NCCL_PROFILER_NET_TYPE_SOCK | NET_SOCKET_VER) as i64;

/// Starts the event of one socket transfer as NCCL's net_socket.cc reports
/// it: the socket, the operation (NCCL_SOCKET_SEND 0, NCCL_SOCKET_RECV 1)
/// and the bytes it moves. Stopped when the returned event is dropped.
pub fn sock_event(
    prof: Option<NetProf>,
    sock: &Socket,
    sending: bool,
    len: usize,
) -> Option<NetEvent> {
    let d = NetSockDescrV1 {
        ty: NCCL_PROFILE_SOCKET,
        detail: NetSockDetailV1 {
            sock: NetSockOpDescrV1 {
                fd: sock.as_raw_fd(),
                op: if sending { 0 } else { 1 } as c_int,
                length: len,
            },
        },
    };
    prof?.start(SOCK_EVENT_ID, &d)
}

/// One stripe: `len` bytes at `addr` over socket `sock` of the worker. The
/// address travels as an integer: the caller of `isend`/`irecv` keeps the
/// memory valid until the message's request completes, which is after every
/// stripe has been counted done.
pub struct Job {
    pub sock: usize,
    pub addr: usize,
    pub len: usize,
    pub done: Arc<Progress>,
    /// The message's profiler: each stripe is one socket event.
    pub prof: Option<NetProf>,
}

/// A helper thread and the sockets it owns.
pub struct Worker {
    tx: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    /// Duplicates of the thread's sockets, to wake it out of a blocking call
    /// by shutting them down.
    socks: Vec<Socket>,
}

impl Worker {
    pub fn spawn(mut socks: Vec<Stream>, sending: bool, peer: Arc<str>) -> io::Result<Worker> {
        let dups = socks
            .iter()
            .map(|s| s.sock.try_clone())
            .collect::<io::Result<Vec<_>>>()?;
        let (tx, rx) = channel::<Job>();
        let handle = std::thread::Builder::new()
            .name("oxccl-net-sock".into())
            .spawn(move || {
                // After one failure the connection is gone: later stripes fail
                // at once instead of blocking on a socket nobody serves.
                let mut broken: Option<NetError> = None;
                for job in rx {
                    if broken.is_none() {
                        // Started as the stripe starts moving, stopped when
                        // it is done or failed (before it counts as done, so
                        // within the request), as NCCL's helper threads do.
                        let st = &mut socks[job.sock];
                        let ev = sock_event(job.prof, &st.sock, sending, job.len);
                        if let Err(e) = move_stripe(st, job.addr, job.len, sending) {
                            broken = Some(io_error(&peer, e));
                        }
                        drop(ev);
                    }
                    if let Some(e) = &broken {
                        job.done.fail(e.clone());
                    }
                    job.done.stripe_done();
                }
            })?;
        Ok(Worker {
            tx: Some(tx),
            handle: Some(handle),
            socks: dups,
        })
    }

    pub fn submit(&self, job: Job) -> Result<(), NetError> {
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        tx.send(job).map_err(|_| stopped())
    }

    /// Ends the connection's streams: a blocked call returns, the peer sees
    /// the close.
    pub fn shutdown(&self) {
        for s in &self.socks {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn stopped() -> NetError {
    NetError::Internal("socket helper thread has stopped".into())
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[allow(unsafe_code)]
fn move_stripe(st: &mut Stream, addr: usize, len: usize, sending: bool) -> io::Result<()> {
    let mut off = 0;
    let s = &st.sock;
    if sending {
        // SAFETY: the caller of isend guaranteed `len` readable bytes at
        // `addr`, unchanged until the request completes, which is after this
        // stripe is counted done.
        let buf = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        if let Some(sess) = st.sess.as_mut() {
            return Ok(sess.send_all(&mut Io(s), &[buf])?);
        }
        while off < len {
            match s.send_with_flags(&buf[off..], MSG_NOSIGNAL) {
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    } else {
        // SAFETY: the caller of irecv guaranteed `len` writable bytes at
        // `addr`, touched by no one else until the request completes.
        let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
        if let Some(sess) = st.sess.as_mut() {
            while off < len {
                match sess.read_from(&mut Io(s), &mut buf[off..])? {
                    Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Some(n) => off += n,
                    // A blocking socket without a timeout: only a signal.
                    None => {}
                }
            }
            return Ok(());
        }
        let mut r: &Socket = s;
        while off < len {
            match r.read(&mut buf[off..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
