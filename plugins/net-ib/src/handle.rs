//! The 128-byte handle a listener gives its peer, in the SDK's shared
//! layout ([`oxccl_plugin::handle`]): the TCP address where the two sides
//! exchange their queue-pair numbers and addresses (as NCCL's IB transport
//! does over a socket), and a random magic that the connector presents so
//! a stray connection is refused. This network's own parameter:
//!
//! | params byte | field |
//! |-------------|-------|
//! | 0           | QPs per connection |

use std::net::SocketAddr;

use oxccl_plugin::handle::{Envelope, HandleKind};
use oxccl_plugin::{NetError, NetHandle};

use crate::config::MAX_QPS;

const KIND: HandleKind = HandleKind {
    magic: 0x4f58_4942, // "OXIB"
    version: 1,
    state_magic: 0x4f58_4943, // "OXIC"
    network: "IB",
};

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
        KIND.encode(&Envelope {
            addr: self.addr,
            params: [self.nqps, 0, 0, 0],
            id: self.magic,
        })
    }

    pub fn decode(b: &NetHandle) -> Result<Handle, NetError> {
        let e = KIND.decode(b)?;
        let nqps = e.params[0];
        if nqps == 0 || nqps as usize > MAX_QPS {
            return Err(NetError::InvalidArgument(format!(
                "IB handle: {nqps} QPs per connection (1 to {MAX_QPS})"
            )));
        }
        Ok(Handle {
            addr: e.addr,
            nqps,
            magic: e.id,
        })
    }
}

/// The key of a connect in progress, kept in the handle so that the next
/// `connect` with the same handle finds its state again.
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
