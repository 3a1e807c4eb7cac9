//! The 128-byte handle a listener gives its peer: the TCP address where the
//! two sides exchange their queue-pair numbers and addresses (as NCCL's IB
//! transport does over a socket), how many QPs the connection has, and a
//! random magic that the connector presents so a stray connection is refused.
//!
//! Layout (little endian):
//!
//! | bytes   | field |
//! |---------|-------|
//! | 0..4    | magic `OXIB` |
//! | 4       | layout version |
//! | 5       | address family: 4 or 6 |
//! | 6..8    | port |
//! | 8..24   | IP address (IPv4 in the first 4 bytes) |
//! | 24..28  | IPv6 scope id |
//! | 28      | QPs per connection |
//! | 32..40  | connection magic |
//! | 64..128 | connect state, owned by `IbNet::connect` |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use oxccl_plugin::{NetError, NetHandle, NET_HANDLE_MAXSIZE};

use crate::config::MAX_QPS;

const MAGIC: u32 = 0x4f58_4942; // "OXIB"
const VERSION: u8 = 1;
/// The bytes the connecting side may rewrite between calls; zero from the
/// listener, so zero means "not started".
const STATE: usize = 64;
const STATE_MAGIC: u32 = 0x4f58_4943; // "OXIC"

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub addr: SocketAddr,
    /// The listener's NCCL_IB_QPS_PER_CONNECTION, which the connector adopts
    /// so both ends pair QP i with QP i.
    pub nqps: u8,
    pub magic: u64,
}

impl Handle {
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
        b[28] = self.nqps;
        b[32..40].copy_from_slice(&self.magic.to_le_bytes());
        b
    }

    pub fn decode(b: &NetHandle) -> Result<Handle, NetError> {
        let bad = |why: String| NetError::InvalidArgument(format!("IB handle: {why}"));
        if u32::from_le_bytes(word(b, 0)) != MAGIC {
            return Err(bad(
                "bad magic (not made by this network's listen: do both ranks use the same net plugin?)"
                    .into(),
            ));
        }
        if b[4] != VERSION {
            return Err(bad(format!(
                "layout version {}, this library reads version {VERSION} (mixed plugin versions?)",
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
            f => return Err(bad(format!("unknown address family {f}"))),
        };
        let nqps = b[28];
        if nqps == 0 || nqps as usize > MAX_QPS {
            return Err(bad(format!("{nqps} QPs per connection (1 to {MAX_QPS})")));
        }
        let mut m = [0u8; 8];
        m.copy_from_slice(&b[32..40]);
        Ok(Handle {
            addr,
            nqps,
            magic: u64::from_le_bytes(m),
        })
    }
}

/// The key of a connect in progress, kept in the handle so that the next
/// `connect` with the same handle finds its state again.
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
    fn roundtrip_and_connect_state() {
        for addr in ["10.1.2.3:5000", "[::1]:7", "[fe80::1%3]:65535"] {
            let h = Handle {
                addr: addr.parse().unwrap(),
                nqps: 4,
                magic: 0x0123_4567_89ab_cdef,
            };
            let mut b = h.encode();
            assert_eq!(b.len(), NET_HANDLE_MAXSIZE);
            assert_eq!(Handle::decode(&b).unwrap(), h);
            assert_eq!(connect_key(&b), None);
            set_connect_key(&mut b, Some(99));
            assert_eq!(connect_key(&b), Some(99));
            assert_eq!(
                Handle::decode(&b).unwrap(),
                h,
                "state bytes leave the address alone"
            );
            set_connect_key(&mut b, None);
            assert_eq!(b, h.encode());
        }
    }

    #[test]
    fn corrupt_handles_are_refused_with_a_reason() {
        let good = Handle {
            addr: "127.0.0.1:1".parse().unwrap(),
            nqps: 1,
            magic: 5,
        }
        .encode();
        let e = Handle::decode(&[0u8; NET_HANDLE_MAXSIZE])
            .unwrap_err()
            .to_string();
        assert!(e.contains("magic"), "{e}");
        let mut b = good;
        b[4] = 7;
        assert!(Handle::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("version 7"));
        let mut b = good;
        b[28] = 0;
        assert!(Handle::decode(&b).is_err());
        b[28] = MAX_QPS as u8 + 1;
        assert!(Handle::decode(&b).is_err());
        let mut b = good;
        b[5] = 9;
        assert!(Handle::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("family 9"));
    }
}
