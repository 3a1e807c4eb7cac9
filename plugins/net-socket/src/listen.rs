//! Listening: the sockets of one connection arrive in any order, each
//! saying which connection and which position it is.

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use oxccl_plugin::{ListenComm, NetError, NetResult, RecvComm};

use crate::connection::{assemble, INTRO_MAGIC};

pub struct SocketListen {
    pub listener: TcpListener,
    pub nsocks: usize,
    pub socks_per_worker: usize,
    pub conn_id: u64,
    pending: HashMap<u32, TcpStream>,
}

impl SocketListen {
    pub fn new(
        listener: TcpListener,
        nsocks: usize,
        socks_per_worker: usize,
        conn_id: u64,
    ) -> std::io::Result<SocketListen> {
        listener.set_nonblocking(true)?;
        Ok(SocketListen {
            listener,
            nsocks,
            socks_per_worker,
            conn_id,
            pending: HashMap::new(),
        })
    }
}

impl ListenComm for SocketListen {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        loop {
            match self.listener.accept() {
                Ok((mut s, peer)) => {
                    // The connector writes its 16-byte introduction right after
                    // connecting; wait for it briefly rather than keeping state.
                    s.set_nonblocking(false)
                        .map_err(|e| NetError::System(e.to_string()))?;
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut intro = [0u8; 16];
                    if let Err(e) = s.read_exact(&mut intro) {
                        eprintln!("oxccl net-socket: WARN dropped a connection from {peer} that sent no introduction: {e}");
                        continue;
                    }
                    let magic = u32::from_le_bytes(intro[12..16].try_into().expect("4 bytes"));
                    let conn = u64::from_le_bytes(intro[0..8].try_into().expect("8 bytes"));
                    if magic != INTRO_MAGIC || conn != self.conn_id {
                        eprintln!("oxccl net-socket: WARN refused a connection from {peer}: not for this listener");
                        continue;
                    }
                    let _ = s.set_read_timeout(None);
                    let idx = u32::from_le_bytes(intro[8..12].try_into().expect("4 bytes"));
                    self.pending.insert(idx, s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(NetError::System(format!("accept: {e}"))),
            }
        }
        if self.pending.len() < self.nsocks + 1 {
            return Ok(None);
        }
        let mut socks: Vec<TcpStream> = Vec::with_capacity(self.nsocks + 1);
        for i in 0..=self.nsocks as u32 {
            socks.push(
                self.pending
                    .remove(&i)
                    .ok_or_else(|| NetError::Internal(format!("socket {i} missing")))?,
            );
        }
        let peer = socks[0]
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let q = assemble(false, peer, socks, self.socks_per_worker)?;
        Ok(Some(Box::new(crate::connection::SocketRecv { queue: q })))
    }
}
