//! The 128-byte handle a listener gives its peer: where to connect, how many
//! sockets to open and how the helper threads share them, which connection
//! the sockets belong to, and room for the connecting side's progress.
//!
//! Layout (little endian):
//!
//! | bytes  | field |
//! |--------|-------|
//! | 0..4   | magic `OXSK` |
//! | 4      | layout version |
//! | 5      | address family: 4 or 6 |
//! | 6..8   | port |
//! | 8..24  | IP address (IPv4 in the first 4 bytes) |
//! | 24..28 | IPv6 scope id (link-local addresses) |
//! | 28     | helper threads per connection |
//! | 29     | data sockets per helper thread |
//! | 32..40 | connection id |
//! | 64..128| connect state, owned by [`crate::SocketNet`]'s `connect` |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use oxccl_plugin::{NetError, NetHandle, NET_HANDLE_MAXSIZE};

const MAGIC: u32 = 0x4f58_534b; // "OXSK"
const VERSION: u8 = 1;
/// Start of the bytes the connecting side may rewrite between calls. The
/// listener leaves them zero, so "zero" means "connect not started".
const STATE: usize = 64;
const STATE_MAGIC: u32 = 0x4f58_4353; // "OXCS"

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
        let mut b = [0u8; NET_HANDLE_MAXSIZE];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[6..8].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr {
            SocketAddr::V4(a) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&a.ip().octets());
                b[24..28].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        b[28] = self.nthreads;
        b[29] = self.socks_per_thread;
        b[32..40].copy_from_slice(&self.conn_id.to_le_bytes());
        b
    }

    pub fn decode(b: &NetHandle) -> Result<Handle, NetError> {
        if u32::from_le_bytes(word(b, 0)) != MAGIC {
            return Err(NetError::InvalidArgument(
                "not a socket-network handle (bad magic)".into(),
            ));
        }
        if b[4] != VERSION {
            return Err(NetError::InvalidArgument(format!(
                "socket-network handle of layout version {}, this library reads version {VERSION}",
                b[4]
            )));
        }
        let port = u16::from_le_bytes([b[6], b[7]]);
        let addr = match b[5] {
            4 => SocketAddr::new(IpAddr::V4(Ipv4Addr::from(word(b, 8))), port),
            6 => {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[8..24]);
                let scope = u32::from_le_bytes(word(b, 24));
                SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope))
            }
            f => {
                return Err(NetError::InvalidArgument(format!(
                    "socket-network handle has unknown address family {f}"
                )))
            }
        };
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[32..40]);
        let h = Handle {
            addr,
            nthreads: b[28],
            socks_per_thread: b[29],
            conn_id: u64::from_le_bytes(id),
        };
        // A corrupt handle must not make the connector open thousands of sockets.
        if h.nthreads as usize > crate::MAX_THREADS || h.nsocks() > crate::MAX_SOCKETS {
            return Err(NetError::InvalidArgument(format!(
                "socket-network handle asks for {} threads and {} sockets (at most {} and {})",
                h.nthreads,
                h.nsocks(),
                crate::MAX_THREADS,
                crate::MAX_SOCKETS
            )));
        }
        Ok(h)
    }
}

/// The key of a connect in progress, kept in the handle so that the caller's
/// next `connect` with the same handle finds its state again.
pub fn connect_key(b: &NetHandle) -> Option<u64> {
    if u32::from_le_bytes(word(b, STATE)) != STATE_MAGIC {
        return None;
    }
    let mut k = [0u8; 8];
    k.copy_from_slice(&b[STATE + 4..STATE + 12]);
    Some(u64::from_le_bytes(k))
}

pub fn set_connect_key(b: &mut NetHandle, key: Option<u64>) {
    b[STATE..].fill(0);
    if let Some(k) = key {
        b[STATE..STATE + 4].copy_from_slice(&STATE_MAGIC.to_le_bytes());
        b[STATE + 4..STATE + 12].copy_from_slice(&k.to_le_bytes());
    }
}

fn word(b: &NetHandle, at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

#[cfg(test)]
mod tests {
    use super::*;

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
        other_version[4] = VERSION;
        other_version[29] = 200;
        assert!(Handle::decode(&other_version).is_err());
    }
}
