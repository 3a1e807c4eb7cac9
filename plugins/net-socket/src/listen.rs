//! Listening: one listener per connection, as NCCL's `listen` hands out one
//! handle per peer. `accept` never blocks: it takes what the kernel has
//! queued and reads introductions as they arrive.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use oxccl_secure::Key;

use oxccl_plugin::{ListenComm, NetError, NetResult, RecvComm};
use socket2::{Domain, Protocol, Socket, Type};

use crate::connection::{assemble, Accepting, SocketRecv};

/// A connection opens nsocks + 1 sockets at once; NCCL sizes its backlog the
/// same way, generously, so a burst of connects is never refused.
const BACKLOG: i32 = 16384;

pub struct SocketListen {
    listener: Socket,
    nthreads: usize,
    accepting: Accepting,
}

impl SocketListen {
    /// Binds `addr` (port 0: the kernel picks) and returns the listener with
    /// the address the peer must connect to.
    pub fn bind(
        addr: SocketAddr,
        nthreads: usize,
        nsocks: usize,
        conn_id: u64,
        handshake_wait: Duration,
        key: Option<Arc<Key>>,
    ) -> std::io::Result<(SocketListen, SocketAddr)> {
        let listener = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        listener.bind(&addr.into())?;
        listener.listen(BACKLOG)?;
        listener.set_nonblocking(true)?;
        let local = listener
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("listener has no IP address"))?;
        Ok((
            SocketListen {
                listener,
                nthreads,
                accepting: Accepting::new(conn_id, nsocks, handshake_wait, key),
            },
            local,
        ))
    }
}

impl ListenComm for SocketListen {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        loop {
            match self.listener.accept() {
                Ok((s, peer)) => self.accepting.offer(s, peer.as_socket())?,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // The peer gave up between SYN and accept: not this side's error.
                Err(e) if e.kind() == ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(NetError::System(format!("accept: {e}"))),
            }
        }
        let Some(socks) = self.accepting.step() else {
            return Ok(None);
        };
        let peer = socks[0]
            .sock
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        let queue = assemble(false, peer, socks, self.nthreads)?;
        Ok(Some(Box::new(SocketRecv::new(queue))))
    }
}
