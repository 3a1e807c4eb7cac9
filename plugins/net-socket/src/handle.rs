//! The 128-byte handle a listener gives its peer, in the SDK's shared
//! layout ([`oxccl_plugin::handle`]): where to connect, which connection
//! the sockets belong to, and room for the connecting side's progress.
//! This network's own parameters:
//!
//! | params byte | field |
//! |-------------|-------|
//! | 0           | helper threads per connection |
//! | 1           | data sockets per helper thread |

use std::net::SocketAddr;

use oxccl_plugin::handle::{Envelope, HandleKind};
use oxccl_plugin::{NetError, NetHandle};

/// Most data sockets one connection opens (NCCL's `MAX_SOCKETS`).
pub const MAX_SOCKETS: usize = 64;
/// Most helper threads per connection (NCCL's `MAX_THREADS`).
pub const MAX_THREADS: usize = 16;

const KIND: HandleKind = HandleKind {
    magic: 0x4f58_534b, // "OXSK"
    version: 1,
    state_magic: 0x4f58_4353, // "OXCS"
    network: "socket-network",
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub addr: SocketAddr,
    /// The listener's threading, which the connector adopts so both ends cut
    /// messages into the same stripes on the same sockets.
    pub nthreads: u8,
    pub socks_per_thread: u8,
    /// Random id that lets the listener group the sockets of one connection
    /// and refuse strangers.
    pub conn_id: u64,
}

impl Handle {
    /// Data sockets of the connection (the control socket not counted).
    pub fn nsocks(&self) -> usize {
        self.nthreads as usize * self.socks_per_thread as usize
    }

    pub fn encode(&self) -> NetHandle {
        KIND.encode(&Envelope {
            addr: self.addr,
            params: [self.nthreads, self.socks_per_thread, 0, 0],
            id: self.conn_id,
        })
    }

    pub fn decode(b: &NetHandle) -> Result<Handle, NetError> {
        let e = KIND.decode(b)?;
        let h = Handle {
            addr: e.addr,
            nthreads: e.params[0],
            socks_per_thread: e.params[1],
            conn_id: e.id,
        };
        // A corrupt handle must not make the connector open thousands of sockets.
        if h.nthreads as usize > MAX_THREADS || h.nsocks() > MAX_SOCKETS {
            return Err(NetError::InvalidArgument(format!(
                "socket-network handle asks for {} threads and {} sockets (at most {} and {})",
                h.nthreads,
                h.nsocks(),
                MAX_THREADS,
                MAX_SOCKETS
            )));
        }
        Ok(h)
    }
}

/// The key of a connect in progress, kept in the handle so that the caller's
/// next `connect` with the same handle finds its state again.
pub fn connect_key(b: &NetHandle) -> Option<u64> {
    KIND.connect_key(b)
}

pub fn set_connect_key(b: &mut NetHandle, key: Option<u64>) {
    KIND.set_connect_key(b, key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_plugin::NET_HANDLE_MAXSIZE;

    #[test]
    fn roundtrip() {
        for addr in ["127.0.0.1:5000", "[::1]:7", "[fe80::1%3]:65535"] {
            let h = Handle {
                addr: addr.parse().unwrap(),
                nthreads: 2,
                socks_per_thread: 3,
                conn_id: 0xdead_beef_0123_4567,
            };
            let mut b = h.encode();
            assert_eq!(Handle::decode(&b).unwrap(), h);
            assert_eq!(h.nsocks(), 6);
            // The connect state lives beside the address and never disturbs it.
            assert_eq!(connect_key(&b), None);
            set_connect_key(&mut b, Some(42));
            assert_eq!(connect_key(&b), Some(42));
            assert_eq!(Handle::decode(&b).unwrap(), h);
            set_connect_key(&mut b, None);
            assert_eq!(b, h.encode());
        }
        assert!(Handle::decode(&[0u8; NET_HANDLE_MAXSIZE]).is_err());
        let mut other_version = Handle {
            addr: "127.0.0.1:1".parse().unwrap(),
            nthreads: 1,
            socks_per_thread: 1,
            conn_id: 1,
        }
        .encode();
        other_version[4] = 9;
        let e = Handle::decode(&other_version).unwrap_err();
        assert!(e.to_string().contains("version 9"), "{e}");
        other_version[4] = KIND.version;
        other_version[29] = 200;
        assert!(Handle::decode(&other_version).is_err());
    }
}
