//! The bootstrap protocol without sockets: the unique id's layout, frames,
//! and the root's state machine (events in, replies out), unit-tested alone.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Frame kinds.
pub const HELLO: u8 = 1;
pub const TABLE: u8 = 2;
pub const ERROR: u8 = 3;
pub const DATA: u8 = 4;
pub const ABORT: u8 = 5;
pub const QUERY: u8 = 6;
pub const REPLY: u8 = 7;

pub const FRAME_HEADER: usize = 8 + 1 + 4 + 8 + 4;
/// Largest payload accepted, to refuse garbage lengths from strangers.
pub const MAX_PAYLOAD: usize = 1 << 30;

/// `[magic u64][kind u8][from u32][tag u64][len u32]` then the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub magic: u64,
    pub kind: u8,
    pub from: u32,
    pub tag: u64,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FRAME_HEADER + self.payload.len());
        b.extend_from_slice(&self.magic.to_le_bytes());
        b.push(self.kind);
        b.extend_from_slice(&self.from.to_le_bytes());
        b.extend_from_slice(&self.tag.to_le_bytes());
        b.extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.payload);
        b
    }

    /// Parses a header; returns the frame without payload and the payload length.
    pub fn decode_header(h: &[u8; FRAME_HEADER]) -> (Frame, usize) {
        let magic = u64::from_le_bytes(h[0..8].try_into().expect("8"));
        let kind = h[8];
        let from = u32::from_le_bytes(h[9..13].try_into().expect("4"));
        let tag = u64::from_le_bytes(h[13..21].try_into().expect("8"));
        let len = u32::from_le_bytes(h[21..25].try_into().expect("4")) as usize;
        (
            Frame {
                magic,
                kind,
                from,
                tag,
                payload: Vec::new(),
            },
            len,
        )
    }
}

pub fn encode_addr(a: &SocketAddr) -> [u8; 19] {
    let mut b = [0u8; 19];
    b[1..3].copy_from_slice(&a.port().to_le_bytes());
    match a.ip() {
        IpAddr::V4(v) => {
            b[0] = 4;
            b[3..7].copy_from_slice(&v.octets());
        }
        IpAddr::V6(v) => {
            b[0] = 6;
            b[3..19].copy_from_slice(&v.octets());
        }
    }
    b
}

pub fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    if b.len() < 19 {
        return None;
    }
    let port = u16::from_le_bytes([b[1], b[2]]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[3..7]).ok()?)),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[3..19]).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The unique id: version, flags, magic, root address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdContents {
    /// The root's address came from NCCL_COMM_ID: rank 0 hosts the root.
    pub from_env: bool,
    pub magic: u64,
    pub root: SocketAddr,
}

const ID_VERSION: u8 = 1;

impl IdContents {
    pub fn encode(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[0] = ID_VERSION;
        b[1] = self.from_env as u8;
        b[8..16].copy_from_slice(&self.magic.to_le_bytes());
        b[16..35].copy_from_slice(&encode_addr(&self.root));
        b
    }

    pub fn decode(b: &[u8; 128]) -> Option<IdContents> {
        if b[0] != ID_VERSION {
            return None;
        }
        Some(IdContents {
            from_env: b[1] != 0,
            magic: u64::from_le_bytes(b[8..16].try_into().ok()?),
            root: decode_addr(&b[16..35])?,
        })
    }
}

/// What a rank says to the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub rank: usize,
    pub nranks: usize,
    pub listen: SocketAddr,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(27);
        b.extend_from_slice(&(self.nranks as u32).to_le_bytes());
        b.extend_from_slice(&encode_addr(&self.listen));
        b
    }

    pub fn decode(rank: u32, p: &[u8]) -> Option<Hello> {
        let nranks = u32::from_le_bytes(p.get(0..4)?.try_into().ok()?) as usize;
        Some(Hello {
            rank: rank as usize,
            nranks,
            listen: decode_addr(p.get(4..)?)?,
        })
    }
}

pub fn encode_table(t: &[SocketAddr]) -> Vec<u8> {
    t.iter().flat_map(encode_addr).collect()
}

pub fn decode_table(p: &[u8]) -> Option<Vec<SocketAddr>> {
    if !p.len().is_multiple_of(19) {
        return None;
    }
    p.chunks(19).map(decode_addr).collect()
}

/// The root's decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootAction {
    /// Send the address table to every rank (by rank index).
    Table(Vec<SocketAddr>),
    /// Refuse one connection with a message.
    Refuse { conn: usize, message: String },
    /// Tell every connected rank why the communicator cannot form.
    Fail(String),
}

/// The root: collects one hello per rank, then hands out the table.
#[derive(Debug, Default)]
pub struct Root {
    nranks: Option<usize>,
    addrs: Vec<Option<SocketAddr>>,
}

impl Root {
    /// A hello arrived on connection `conn`.
    pub fn hello(&mut self, conn: usize, h: &Hello) -> Option<RootAction> {
        let n = *self.nranks.get_or_insert(h.nranks);
        if h.nranks != n {
            return Some(RootAction::Refuse {
                conn,
                message: format!(
                    "rank {} says nranks is {}, but other ranks said {n}",
                    h.rank, h.nranks
                ),
            });
        }
        if h.rank >= n {
            return Some(RootAction::Refuse {
                conn,
                message: format!("rank {} is out of range for {n} ranks", h.rank),
            });
        }
        self.addrs.resize(n, None);
        if self.addrs[h.rank].is_some() {
            return Some(RootAction::Refuse {
                conn,
                message: format!("rank {} joined twice", h.rank),
            });
        }
        self.addrs[h.rank] = Some(h.listen);
        if self.addrs.iter().all(Option::is_some) {
            return Some(RootAction::Table(
                self.addrs.iter().map(|a| a.expect("all present")).collect(),
            ));
        }
        None
    }

    /// The deadline passed before every rank arrived.
    pub fn deadline(&self, root: SocketAddr, waited_s: f64) -> RootAction {
        let missing = self.missing();
        match self.nranks {
            None => RootAction::Fail(format!("bootstrap: no rank connected to the root at {root} within {waited_s:.0} s")),
            Some(n) => RootAction::Fail(format!(
                "bootstrap: ranks {missing:?} of {n} never connected to the root at {root} within {waited_s:.0} s (NCCL_TIMEOUT)"
            )),
        }
    }

    pub fn missing(&self) -> Vec<usize> {
        match self.nranks {
            None => Vec::new(),
            Some(n) => (0..n)
                .filter(|&r| self.addrs.get(r).is_none_or(|a| a.is_none()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(p: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)
    }

    #[test]
    fn frames_and_ids_roundtrip() {
        let f = Frame {
            magic: 9,
            kind: DATA,
            from: 3,
            tag: 77,
            payload: vec![1, 2, 3],
        };
        let b = f.encode();
        let (g, len) = Frame::decode_header(b[..FRAME_HEADER].try_into().unwrap());
        assert_eq!((g.magic, g.kind, g.from, g.tag, len), (9, DATA, 3, 77, 3));
        let id = IdContents {
            from_env: true,
            magic: 5,
            root: "[::1]:99".parse().unwrap(),
        };
        assert_eq!(IdContents::decode(&id.encode()), Some(id));
        let h = Hello {
            rank: 2,
            nranks: 4,
            listen: a(7),
        };
        assert_eq!(Hello::decode(2, &h.encode()), Some(h));
        assert_eq!(
            decode_table(&encode_table(&[a(1), a(2)])),
            Some(vec![a(1), a(2)])
        );
    }

    #[test]
    fn root_collects_then_hands_out_the_table() {
        let mut r = Root::default();
        assert_eq!(
            r.hello(
                0,
                &Hello {
                    rank: 1,
                    nranks: 3,
                    listen: a(11)
                }
            ),
            None
        );
        assert!(matches!(
            r.hello(
                1,
                &Hello {
                    rank: 1,
                    nranks: 3,
                    listen: a(12)
                }
            ),
            Some(RootAction::Refuse { .. })
        ));
        assert!(matches!(
            r.hello(
                2,
                &Hello {
                    rank: 0,
                    nranks: 4,
                    listen: a(12)
                }
            ),
            Some(RootAction::Refuse { .. })
        ));
        assert_eq!(
            r.hello(
                3,
                &Hello {
                    rank: 0,
                    nranks: 3,
                    listen: a(10)
                }
            ),
            None
        );
        assert_eq!(r.missing(), vec![2]);
        match r.deadline(a(1), 5.0) {
            RootAction::Fail(m) => assert!(m.contains("[2]") && m.contains("of 3"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            r.hello(
                4,
                &Hello {
                    rank: 2,
                    nranks: 3,
                    listen: a(12)
                }
            ),
            Some(RootAction::Table(vec![a(10), a(11), a(12)]))
        );
    }
}
