//! Helper threads: each owns data sockets and moves the stripes of large
//! messages, so one connection uses several TCP streams (and cores) at once
//! and the caller's thread never blocks on a large transfer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Completion state shared by the stripes of one message.
#[derive(Debug, Default)]
pub struct Progress {
    pub remaining: AtomicUsize,
    pub error: Mutex<Option<String>>,
}

impl Progress {
    pub fn new(stripes: usize) -> Arc<Progress> {
        Arc::new(Progress {
            remaining: AtomicUsize::new(stripes),
            error: Mutex::new(None),
        })
    }
}

/// One stripe: `len` bytes at `addr` over socket `sock` of the worker.
pub struct Job {
    pub sock: usize,
    pub addr: usize,
    pub len: usize,
    pub done: Arc<Progress>,
}

/// A helper thread and the sockets it owns.
pub struct Worker {
    tx: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    streams: Vec<TcpStream>,
}

impl Worker {
    pub fn spawn(streams: Vec<TcpStream>, sending: bool, peer: String) -> std::io::Result<Worker> {
        let (tx, rx) = channel::<Job>();
        let mut own: Vec<TcpStream> = streams
            .iter()
            .map(|s| s.try_clone())
            .collect::<Result<_, _>>()?;
        let handle = std::thread::Builder::new()
            .name("oxccl-sock".into())
            .spawn(move || {
                for job in rx {
                    let r = move_bytes(&mut own[job.sock], job.addr, job.len, sending);
                    if let Err(e) = r {
                        let mut slot = job.done.error.lock().unwrap_or_else(|p| p.into_inner());
                        slot.get_or_insert(format!("connection to {peer}: {e}"));
                    }
                    job.done.remaining.fetch_sub(1, Ordering::AcqRel);
                }
            })?;
        Ok(Worker {
            tx: Some(tx),
            handle: Some(handle),
            streams,
        })
    }

    pub fn submit(&self, job: Job) -> Result<(), String> {
        self.tx
            .as_ref()
            .expect("live worker")
            .send(job)
            .map_err(|_| "socket helper thread has stopped".to_string())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        for s in &self.streams {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[allow(unsafe_code)]
fn move_bytes(s: &mut TcpStream, addr: usize, len: usize, sending: bool) -> std::io::Result<()> {
    if sending {
        // SAFETY: the caller of isend guaranteed `len` readable bytes at
        // `addr`, unchanged until the request completes, which is after this
        // stripe is counted done.
        let buf = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        s.write_all(buf)
    } else {
        // SAFETY: the caller of irecv guaranteed `len` writable bytes at
        // `addr`, touched by no one else until the request completes.
        let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
        s.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                std::io::Error::new(e.kind(), "closed by peer")
            } else {
                e
            }
        })
    }
}
