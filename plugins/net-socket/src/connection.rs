//! Connections: a control socket plus data sockets, and the two ends.

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxccl_plugin::{MrHandle, NetError, NetResult, PtrType, RecvComm, Request, SendComm};

use crate::handle::Handle;
use crate::request::{DataPath, Queue, SocketRequest};
use crate::threads::Worker;

pub const INTRO_MAGIC: u32 = 0x4f58_4931; // "OXI1"

/// Opens every socket of a connection to the listener in `h`.
pub fn open(h: &Handle) -> NetResult<Vec<TcpStream>> {
    (0..=h.nsocks as u32)
        .map(|i| {
            let mut s = TcpStream::connect_timeout(&h.addr, Duration::from_secs(10))
                .map_err(|e| NetError::System(format!("connect to {}: {e}", h.addr)))?;
            let _ = s.set_nodelay(true);
            let mut intro = [0u8; 16];
            intro[0..8].copy_from_slice(&h.conn_id.to_le_bytes());
            intro[8..12].copy_from_slice(&i.to_le_bytes());
            intro[12..16].copy_from_slice(&INTRO_MAGIC.to_le_bytes());
            s.write_all(&intro)
                .map_err(|e| NetError::System(format!("connect to {}: {e}", h.addr)))?;
            Ok(s)
        })
        .collect()
}

/// No Nagle delay for small messages. Kernel buffer sizes are left to
/// autotuning: fixing them (1 or 4 MiB) measured 20-40% slower on loopback.
fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
}

/// Builds one end's queue from its sockets (control first).
pub fn assemble(
    sending: bool,
    peer: String,
    mut socks: Vec<TcpStream>,
    per_worker: usize,
) -> NetResult<Arc<Mutex<Queue>>> {
    let sys = |e: std::io::Error| NetError::System(format!("connection to {peer}: {e}"));
    for s in &socks {
        tune(s);
    }
    let ctrl = socks.remove(0);
    let per_worker = per_worker.max(1);
    let workers = socks
        .chunks(per_worker)
        .map(|c| {
            Worker::spawn(
                c.iter().map(|s| s.try_clone()).collect::<Result<_, _>>()?,
                sending,
                peer.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(sys)?;
    let data = DataPath {
        workers,
        socks_per_worker: per_worker,
    };
    Ok(Arc::new(Mutex::new(
        Queue::new(sending, peer.clone(), ctrl, data).map_err(sys)?,
    )))
}

fn request(
    queue: &Arc<Mutex<Queue>>,
    addr: usize,
    size: usize,
    tag: i32,
) -> NetResult<Option<Box<dyn Request>>> {
    let mut q = queue
        .lock()
        .map_err(|_| NetError::Internal("socket queue poisoned".into()))?;
    let id = q.post(addr, size, tag)?;
    // A failure found now is kept and reported by the request's test.
    let _ = q.progress();
    drop(q);
    Ok(Some(Box::new(SocketRequest {
        queue: queue.clone(),
        id,
        done: None,
    })))
}

pub struct SocketSend {
    pub queue: Arc<Mutex<Queue>>,
}

pub struct SocketRecv {
    pub queue: Arc<Mutex<Queue>>,
}

impl SendComm for SocketSend {
    fn reg_mr(&mut self, ptr: *mut u8, _size: usize, ptr_type: PtrType) -> NetResult<MrHandle> {
        host_only(ptr_type)?;
        Ok(MrHandle(ptr as usize))
    }
    fn dereg_mr(&mut self, _mr: MrHandle) -> NetResult<()> {
        Ok(())
    }
    #[allow(unsafe_code)]
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        _mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        request(&self.queue, data as usize, size, tag)
    }
}

impl RecvComm for SocketRecv {
    fn reg_mr(&mut self, ptr: *mut u8, _size: usize, ptr_type: PtrType) -> NetResult<MrHandle> {
        host_only(ptr_type)?;
        Ok(MrHandle(ptr as usize))
    }
    fn dereg_mr(&mut self, _mr: MrHandle) -> NetResult<()> {
        Ok(())
    }
    #[allow(unsafe_code)]
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        _mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        request(&self.queue, data as usize, size, tag)
    }
}

fn host_only(t: PtrType) -> NetResult<()> {
    if t != PtrType::Host {
        return Err(NetError::InvalidArgument(format!(
            "the socket network moves host memory only, not {t:?}"
        )));
    }
    Ok(())
}
