//! The connection handle shared by networks that rendezvous over TCP (the
//! socket network, and the IB network for its queue-pair exchange): the
//! listener's address, a few bytes of the network's own parameters, a
//! 64-bit connection id, and room for the connecting side's progress, in
//! NCCL's 128-byte handle. Each network names itself with its own magic
//! numbers ([`HandleKind`]), so a handle given to the wrong network is
//! refused with a reason instead of being misread.
//!
//! Layout (little endian):
//!
//! | bytes   | field |
//! |---------|-------|
//! | 0..4    | the network's magic |
//! | 4       | layout version |
//! | 5       | address family: 4 or 6 |
//! | 6..8    | port |
//! | 8..24   | IP address (IPv4 in the first 4 bytes) |
//! | 24..28  | IPv6 scope id (link-local addresses) |
//! | 28..32  | the network's parameters ([`Envelope::params`]) |
//! | 32..40  | connection id |
//! | 40..64  | zero (free for a later layout version) |
//! | 64..128 | connect state: [`HandleKind::connect_key`] |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::{NetError, NetHandle, NET_HANDLE_MAXSIZE};

/// Bytes of network-specific parameters a handle carries.
pub const PARAMS_LEN: usize = 4;
const PARAMS: usize = 28;
const ID: usize = 32;
/// Start of the bytes the connecting side may rewrite between calls. The
/// listener leaves them zero, so zero means "connect not started".
const STATE: usize = 64;

/// Which network a handle belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleKind {
    /// First word of every handle of this network.
    pub magic: u32,
    /// Raised when the network changes what its parameters mean.
    pub version: u8,
    /// Marks the connect state as this network's.
    pub state_magic: u32,
    /// How error messages name the network ("IB", "socket-network").
    pub network: &'static str,
}

/// What a handle says, before the network checks its own parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// Where the listener accepts the connection.
    pub addr: SocketAddr,
    /// The network's own fields (thread counts, QP counts …), opaque here.
    pub params: [u8; PARAMS_LEN],
    /// Identifies the connection (a random magic or id) so the listener
    /// can refuse strangers.
    pub id: u64,
}

fn word(b: &NetHandle, at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

fn u64_at(b: &NetHandle, at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

impl HandleKind {
    pub fn encode(&self, e: &Envelope) -> NetHandle {
        let mut b = [0u8; NET_HANDLE_MAXSIZE];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4] = self.version;
        b[6..8].copy_from_slice(&e.addr.port().to_le_bytes());
        match e.addr {
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
        b[PARAMS..PARAMS + PARAMS_LEN].copy_from_slice(&e.params);
        b[ID..ID + 8].copy_from_slice(&e.id.to_le_bytes());
        b
    }

    /// Reads a handle of this network; the error says why one cannot be
    /// (another network's, another layout version, corrupt).
    pub fn decode(&self, b: &NetHandle) -> Result<Envelope, NetError> {
        let bad =
            |why: String| NetError::InvalidArgument(format!("{} handle: {why}", self.network));
        if u32::from_le_bytes(word(b, 0)) != self.magic {
            return Err(bad(format!(
                "bad magic (not made by the {} network's listen: do both ranks use the same net plugin?)",
                self.network
            )));
        }
        if b[4] != self.version {
            return Err(bad(format!(
                "layout version {}, this library reads version {} (mixed plugin versions?)",
                b[4], self.version
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
            f => return Err(bad(format!("unknown address family {f}"))),
        };
        Ok(Envelope {
            addr,
            params: word(b, PARAMS),
            id: u64_at(b, ID),
        })
    }

    /// The key of a connect in progress, kept in the handle so that the
    /// caller's next `connect` with the same handle finds its state again
    /// (NCCL lets the connecting side use the handle for this).
    pub fn connect_key(&self, b: &NetHandle) -> Option<u64> {
        if u32::from_le_bytes(word(b, STATE)) != self.state_magic {
            return None;
        }
        Some(u64_at(b, STATE + 4))
    }

    /// Records (`Some`) or clears (`None`) the connect in progress; the
    /// address and parameters stay untouched.
    pub fn set_connect_key(&self, b: &mut NetHandle, key: Option<u64>) {
        b[STATE..].fill(0);
        if let Some(k) = key {
            b[STATE..STATE + 4].copy_from_slice(&self.state_magic.to_le_bytes());
            b[STATE + 4..STATE + 12].copy_from_slice(&k.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: HandleKind = HandleKind {
        magic: 0x1122_3344,
        version: 3,
        state_magic: 0x5566_7788,
        network: "A",
    };
    const B: HandleKind = HandleKind {
        magic: 0x99aa_bbcc,
        version: 3,
        state_magic: 0xddee_ff00,
        network: "B",
    };

    #[test]
    fn roundtrip_and_connect_state() {
        for addr in ["10.1.2.3:5000", "[::1]:7", "[fe80::1%3]:65535", "0.0.0.0:0"] {
            let e = Envelope {
                addr: addr.parse().unwrap(),
                params: [1, 2, 3, 4],
                id: 0x0123_4567_89ab_cdef,
            };
            let mut b = A.encode(&e);
            assert_eq!(A.decode(&b).unwrap(), e, "{addr}");
            assert_eq!(A.connect_key(&b), None);
            A.set_connect_key(&mut b, Some(99));
            assert_eq!(A.connect_key(&b), Some(99));
            assert_eq!(
                B.connect_key(&b),
                None,
                "another network's state is not ours"
            );
            assert_eq!(A.decode(&b).unwrap(), e, "state bytes leave the rest alone");
            A.set_connect_key(&mut b, None);
            assert_eq!(b, A.encode(&e));
        }
    }

    /// The layout is a wire format between ranks that may run different
    /// builds: pin the offsets.
    #[test]
    fn layout_is_fixed() {
        let e = Envelope {
            addr: "1.2.3.4:258".parse().unwrap(),
            params: [9, 8, 7, 6],
            id: 0x0807_0605_0403_0201,
        };
        let b = A.encode(&e);
        assert_eq!(&b[0..8], &[0x44, 0x33, 0x22, 0x11, 3, 4, 2, 1]);
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(&b[28..40], &[9, 8, 7, 6, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(b[40..].iter().all(|x| *x == 0));
    }

    #[test]
    fn foreign_and_corrupt_handles_are_refused_with_a_reason() {
        let e = Envelope {
            addr: "127.0.0.1:1".parse().unwrap(),
            params: [0; 4],
            id: 5,
        };
        let t = B.decode(&A.encode(&e)).unwrap_err().to_string();
        assert!(t.contains("B handle") && t.contains("magic"), "{t}");
        assert!(A.decode(&[0u8; NET_HANDLE_MAXSIZE]).is_err());
        let mut b = A.encode(&e);
        b[4] = 7;
        let t = A.decode(&b).unwrap_err().to_string();
        assert!(t.contains("version 7"), "{t}");
        let mut b = A.encode(&e);
        b[5] = 9;
        let t = A.decode(&b).unwrap_err().to_string();
        assert!(t.contains("family 9"), "{t}");
    }
}
