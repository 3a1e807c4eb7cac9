//! The 128-byte handle a listener gives its peer: where to connect, how
//! many sockets to open, and which connection they belong to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use oxccl_plugin::{NetError, NetHandle, NET_HANDLE_MAXSIZE};

const MAGIC: u32 = 0x4f58_534b; // "OXSK"

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub addr: SocketAddr,
    pub nsocks: u8,
    /// Random id that lets the listener group the sockets of one connection.
    pub conn_id: u64,
}

impl Handle {
    pub fn encode(&self) -> NetHandle {
        let mut b = [0u8; NET_HANDLE_MAXSIZE];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.nsocks;
        b[8..16].copy_from_slice(&self.conn_id.to_le_bytes());
        b[16..18].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(a) => {
                b[18] = 4;
                b[20..24].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[18] = 6;
                b[20..36].copy_from_slice(&a.octets());
            }
        }
        b
    }

    pub fn decode(b: &NetHandle) -> Result<Handle, NetError> {
        if u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) != MAGIC {
            return Err(NetError::InvalidArgument(
                "not a socket-network handle (bad magic)".into(),
            ));
        }
        let port = u16::from_le_bytes([b[16], b[17]]);
        let ip = match b[18] {
            4 => IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(&b[20..24]).expect("4 bytes"),
            )),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[20..36]).expect("16 bytes"),
            )),
            f => {
                return Err(NetError::InvalidArgument(format!(
                    "handle has unknown address family {f}"
                )))
            }
        };
        Ok(Handle {
            addr: SocketAddr::new(ip, port),
            nsocks: b[4],
            conn_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        for addr in ["127.0.0.1:5000", "[::1]:7"] {
            let h = Handle {
                addr: addr.parse().unwrap(),
                nsocks: 4,
                conn_id: 0xdead_beef,
            };
            assert_eq!(Handle::decode(&h.encode()).unwrap(), h);
        }
        assert!(Handle::decode(&[0u8; NET_HANDLE_MAXSIZE]).is_err());
    }
}
