//! What a peer that has not proved who it is may hold in a rank's bootstrap
//! service. Without NCCL_SOCKET_KEY_FILE that is every peer, known only by
//! its address; with a key, one that has not finished the key exchange.
//! Without these caps a stranger who knew the magic held 12 connections of
//! 3 x 16 MiB pieces and pinned 1.19 GB of a rank (issue 40, item 3).
//!
//! Per address (an IP address: all that a stranger shows of itself):
//! - connections: at most [`CONNS_PER_RANK`] for each rank listening at
//!   that address (its data connection, a progress query, a failure
//!   notice, and one replacing a connection that broke) plus
//!   [`SPARE_CONNS`]; before the table of addresses is known, as if every
//!   rank were there. The one past the cap is closed at once.
//! - bytes: a frame of at most [`SMALL_FRAME`] bytes is read as it comes; a
//!   larger one, or any piece of a message of several frames, only while
//!   its connection holds the address's one slot ([`Admission::take_slot`]),
//!   held until the message is whole. So an address makes this rank hold
//!   one message being joined (at most `MAX_MESSAGE + MAX_CHUNK`) and a
//!   small frame per connection. Whole messages not yet taken: a connection
//!   starts no next message while [`MAILBOX_QUOTA`] bytes of its rank's
//!   wait, so that TCP holds the sender back; what a stranger posing as a
//!   rank sends and no one takes stops there.
//! - time: the first frame within the first wait (`min(10 s,
//!   NCCL_TIMEOUT)`, as before); a frame or message, once begun, must keep
//!   coming (each read within the first wait, the whole by
//!   [`message_deadline`]); between messages a connection may be idle (a
//!   rank's cached connection is, most of the time). Waiting for the slot
//!   or for room in the mailbox ends at NCCL_TIMEOUT, as the sender's own
//!   write does.
//!
//! Without a key the sender is checked too: a frame that says it comes
//! from rank r must come from rank r's address (ranks connect from the
//! address they listen on), else its connection is refused with a warning
//! naming the address. A process on a rank's own host can still pose as
//! that rank: NCCL_SOCKET_KEY_FILE is what authenticates ranks.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Connections an address may hold per rank listening there.
pub const CONNS_PER_RANK: usize = 4;
/// Connections any address may hold beyond those (tools, a rank whose
/// address the table does not show yet).
pub const SPARE_CONNS: usize = 4;
/// Frames up to this size are read without the address's slot: every
/// message of the bootstrap's own (addresses, handles, records of a few
/// KiB, failure notices) is one.
pub const SMALL_FRAME: usize = 64 << 10;
/// Bytes of one sender's whole messages waiting to be taken, past which its
/// connections read no next message until some are taken.
pub const MAILBOX_QUOTA: usize = 16 << 20;
/// The pace a message in progress must keep: its whole is due at the first
/// wait plus its bytes at this rate (a stranger that trickles is dropped).
pub const MIN_RATE: u64 = 1 << 20;

/// An address as a peer's connection shows it (IPv4 in IPv6 as IPv4).
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// When a message begun at `start` with `bytes` of it read so far must be
/// whole.
pub fn message_deadline(start: Instant, first_wait: Duration, bytes: usize) -> Instant {
    start + first_wait + Duration::from_secs_f64(bytes as f64 / MIN_RATE as f64)
}

/// Whether the `n`-th refusal of an address is worth a warning: the 1st,
/// 10th, 100th, ...: a stranger that opens thousands cannot flood the log.
pub fn warn_at(n: u64) -> bool {
    n > 0 && 10u64.pow(n.ilog10()) == n
}

/// A connection refused at the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub open: usize,
    pub cap: usize,
    /// Refusals of this address so far, this one included.
    pub refused: u64,
}

/// The connections each address holds and who holds its slot.
#[derive(Debug)]
pub struct Admission {
    nranks: usize,
    /// Ranks listening at each address, once the table is known.
    ranks_at: Option<HashMap<IpAddr, usize>>,
    /// Ranks of the table whose address is not known (yet): each may be
    /// at any address.
    unknown: usize,
    open: HashMap<IpAddr, usize>,
    slots: HashMap<IpAddr, u64>,
    refused: HashMap<IpAddr, u64>,
}

impl Admission {
    pub fn new(nranks: usize) -> Admission {
        Admission {
            nranks,
            ranks_at: None,
            unknown: 0,
            open: HashMap::new(),
            slots: HashMap::new(),
            refused: HashMap::new(),
        }
    }

    /// Every rank's listen address, by rank; the unspecified address for
    /// one not known (yet), which counts at every address.
    pub fn set_table(&mut self, table: &[SocketAddr]) {
        let mut at = HashMap::new();
        self.unknown = 0;
        for a in table {
            if a.ip().is_unspecified() {
                self.unknown += 1;
            } else {
                *at.entry(canonical(a.ip())).or_insert(0) += 1;
            }
        }
        self.ranks_at = Some(at);
    }

    /// How many connections `ip` may hold at once.
    pub fn cap(&self, ip: IpAddr) -> usize {
        let ranks = match &self.ranks_at {
            Some(at) => at.get(&canonical(ip)).copied().unwrap_or(0) + self.unknown,
            None => self.nranks,
        };
        ranks
            .saturating_mul(CONNS_PER_RANK)
            .saturating_add(SPARE_CONNS)
    }

    /// Counts a new connection from `ip`, or refuses it at the cap.
    pub fn admit(&mut self, ip: IpAddr) -> Result<(), Full> {
        let ip = canonical(ip);
        let cap = self.cap(ip);
        let open = self.open.entry(ip).or_insert(0);
        if *open >= cap {
            let refused = self.refused.entry(ip).or_insert(0);
            *refused += 1;
            return Err(Full {
                open: *open,
                cap,
                refused: *refused,
            });
        }
        *open += 1;
        Ok(())
    }

    /// A connection from `ip` ended (it frees its slot too).
    pub fn leave(&mut self, ip: IpAddr, conn: u64) {
        let ip = canonical(ip);
        self.free_slot(ip, conn);
        if let Some(n) = self.open.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.open.remove(&ip);
            }
        }
    }

    /// Gives `ip`'s slot to connection `conn` if it is free (or already its).
    pub fn take_slot(&mut self, ip: IpAddr, conn: u64) -> bool {
        *self.slots.entry(canonical(ip)).or_insert(conn) == conn
    }

    /// `conn` is done with `ip`'s slot (nothing if it did not hold it).
    pub fn free_slot(&mut self, ip: IpAddr, conn: u64) {
        let ip = canonical(ip);
        if self.slots.get(&ip) == Some(&conn) {
            self.slots.remove(&ip);
        }
    }

    /// Connections open from `ip`.
    #[cfg(test)]
    pub fn open(&self, ip: IpAddr) -> usize {
        self.open.get(&canonical(ip)).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn connections_are_capped_per_address_by_the_ranks_there() {
        let mut a = Admission::new(3);
        let (lo, other) = (ip("127.0.0.1"), ip("10.0.0.9"));
        // Before the table: as if all 3 ranks were at every address.
        assert_eq!(a.cap(other), 3 * CONNS_PER_RANK + SPARE_CONNS);
        a.set_table(&[
            "127.0.0.1:5".parse().unwrap(),
            "127.0.0.1:6".parse().unwrap(),
            "10.0.0.2:7".parse().unwrap(),
        ]);
        assert_eq!(a.cap(lo), 2 * CONNS_PER_RANK + SPARE_CONNS);
        assert_eq!(a.cap(other), SPARE_CONNS);
        for _ in 0..SPARE_CONNS {
            a.admit(other).unwrap();
        }
        let e = a.admit(other).unwrap_err();
        assert_eq!((e.open, e.cap, e.refused), (SPARE_CONNS, SPARE_CONNS, 1));
        assert_eq!(a.admit(other).unwrap_err().refused, 2);
        a.leave(other, 1);
        a.admit(other).unwrap();
        // IPv4 seen through IPv6 is the same address.
        assert_eq!(a.cap(ip("::ffff:127.0.0.1")), a.cap(lo));
        assert_eq!(a.open(other), SPARE_CONNS);
    }

    #[test]
    fn one_slot_per_address_freed_by_its_holder_or_its_end() {
        let mut a = Admission::new(2);
        let lo = ip("127.0.0.1");
        assert!(a.take_slot(lo, 1));
        assert!(a.take_slot(lo, 1), "the holder keeps it");
        assert!(!a.take_slot(lo, 2));
        assert!(a.take_slot(ip("127.0.0.2"), 2), "another address");
        a.free_slot(lo, 2);
        assert!(!a.take_slot(lo, 2), "only its holder frees it");
        a.admit(lo).unwrap();
        a.leave(lo, 1);
        assert!(a.take_slot(lo, 2), "a connection that ends frees it");
    }

    #[test]
    fn warnings_thin_out_and_slow_messages_run_out_of_time() {
        let w: Vec<u64> = (1..=1000).filter(|&n| warn_at(n)).collect();
        assert_eq!(w, [1, 10, 100, 1000]);
        let t = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(message_deadline(t, s, 0), t + s);
        assert_eq!(message_deadline(t, s, 3 << 20), t + Duration::from_secs(4));
    }
}
