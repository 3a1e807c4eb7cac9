//! The root's state machine: hellos and connections in, the table or the
//! neighbours out once every rank is in, and at the deadline the ranks
//! that never came, named.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::*;

/// The I/O layer's name for one accepted connection.
pub type ConnId = usize;

/// The root's decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootAction {
    /// Every rank is in: send `table` (listen addresses by rank) to each of
    /// `conns` (by rank). The root is done.
    Table {
        conns: Vec<ConnId>,
        table: Vec<SocketAddr>,
    },
    /// Send `error` to `conn` and close it; the others wait on.
    Refuse { conn: ConnId, error: Error },
    /// Send `error` to each of `conns` and close everything. The root is done.
    Fail { conns: Vec<ConnId>, error: Error },
}

/// The root of one communicator's init: collects one hello per rank, then
/// hands out the table of listen addresses; gives up `timeout` after the
/// first hello (or after its start, when no rank came at all), naming the
/// ranks that never arrived.
#[derive(Debug)]
pub struct Root {
    addr: SocketAddr,
    timeout: Duration,
    started: Instant,
    first_hello: Option<Instant>,
    nranks: Option<usize>,
    joined: Vec<Option<(ConnId, SocketAddr)>>,
    /// Ranks that said hello, then closed their connection.
    left: Vec<usize>,
    /// The first connection refused in the key exchange as a rank with
    /// another key (or none) is: when, from where, why.
    key_refused: Option<(Instant, SocketAddr, String)>,
    done: bool,
}

/// How long the root waits for the missing ranks after it refused a key
/// exchange that looked like a rank's with another key (at most
/// NCCL_TIMEOUT): that rank has failed and will not come, so the ranks in
/// wait for nothing; a stranger's attempt while every rank arrives within
/// it changes nothing.
pub const KEY_REFUSED_GRACE: Duration = Duration::from_secs(2);

impl Root {
    pub fn new(addr: SocketAddr, timeout: Duration, now: Instant) -> Root {
        Root {
            addr,
            timeout,
            started: now,
            first_hello: None,
            nranks: None,
            joined: Vec::new(),
            left: Vec::new(),
            key_refused: None,
            done: false,
        }
    }

    /// When [`Root::poll`] gives up: NCCL_TIMEOUT after the first hello
    /// (or the start), or soon after a key exchange was refused.
    pub fn deadline(&self) -> Instant {
        let full = self.first_hello.unwrap_or(self.started) + self.timeout;
        match &self.key_refused {
            Some((t, _, _)) => full.min(*t + KEY_REFUSED_GRACE.min(self.timeout)),
            None => full,
        }
    }

    /// A connection from `peer` failed the key exchange as a rank with
    /// another key (or none) would: the root gives up on the missing ranks
    /// [`KEY_REFUSED_GRACE`] later, naming it.
    pub fn key_refused(&mut self, now: Instant, peer: SocketAddr, why: &str) {
        if self.done {
            return;
        }
        self.key_refused
            .get_or_insert_with(|| (now, peer, why.to_string()));
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The communicator's size, once a hello has said it.
    pub fn nranks(&self) -> Option<usize> {
        self.nranks
    }

    /// A hello arrived on connection `conn`.
    pub fn hello(&mut self, now: Instant, conn: ConnId, h: &Hello) -> Option<RootAction> {
        if self.done {
            return None;
        }
        let refuse = |m: String| {
            Some(RootAction::Refuse {
                conn,
                error: Error::InvalidUsage(format!("bootstrap root at {}: {m}", self.addr)),
            })
        };
        if h.nranks == 0 || h.nranks > MAX_RANKS {
            return refuse(format!(
                "rank {} says nranks is {} (1 to {MAX_RANKS} supported)",
                h.rank, h.nranks
            ));
        }
        if let Some(n) = self.nranks.filter(|&n| n != h.nranks) {
            return refuse(format!(
                "rank {} says nranks is {}, but the ranks that joined before said {n}",
                h.rank, h.nranks
            ));
        }
        if h.rank >= h.nranks {
            return refuse(format!(
                "rank {} is out of range for {} ranks",
                h.rank, h.nranks
            ));
        }
        if let Some(Some((_, first))) = self.joined.get(h.rank) {
            return refuse(format!(
                "rank {} joined twice (listening at {first}, then at {}): two processes were given the same rank",
                h.rank, h.listen
            ));
        }
        self.first_hello.get_or_insert(now);
        self.nranks = Some(h.nranks);
        self.joined.resize(h.nranks, None);
        self.joined[h.rank] = Some((conn, h.listen));
        self.left.retain(|&r| r != h.rank);
        if self.joined.iter().all(Option::is_some) {
            self.done = true;
            let (conns, table) = self.joined.iter().flatten().copied().unzip();
            return Some(RootAction::Table { conns, table });
        }
        None
    }

    /// Connection `conn` closed before the table went out: its rank (if it
    /// said hello) is missing again, and may say hello anew.
    pub fn closed(&mut self, conn: ConnId) {
        if self.done {
            return;
        }
        if let Some(r) = self
            .joined
            .iter()
            .position(|j| matches!(j, Some((c, _)) if *c == conn))
        {
            self.joined[r] = None;
            self.left.push(r);
        }
    }

    /// The ranks not in (yet).
    pub fn missing(&self) -> Vec<usize> {
        (0..self.nranks.unwrap_or(0))
            .filter(|&r| self.joined.get(r).is_none_or(Option::is_none))
            .collect()
    }

    /// Gives up once the deadline has passed.
    pub fn poll(&mut self, now: Instant) -> Option<RootAction> {
        if self.done || now < self.deadline() {
            return None;
        }
        self.done = true;
        let conns = self.joined.iter().flatten().map(|(c, _)| *c).collect();
        // Given up early after a refused key exchange, or at NCCL_TIMEOUT.
        let when = match &self.key_refused {
            Some((_, peer, why)) => format!(
                ": the root refused {peer} ({why}), and gave up {} after that rather than at NCCL_TIMEOUT; NCCL_SOCKET_KEY_FILE must name the same key on every rank",
                secs(KEY_REFUSED_GRACE.min(self.timeout))
            ),
            None => format!(" within {} (NCCL_TIMEOUT)", secs(self.timeout)),
        };
        let message = match self.nranks {
            None => format!(
                "bootstrap: no rank connected to the root at {}{when}",
                self.addr
            ),
            Some(n) => {
                let mut m = format!(
                    "bootstrap: ranks {:?} of {n} never connected to the root at {}{when}",
                    self.missing(),
                    self.addr
                );
                if !self.left.is_empty() {
                    m += &format!(
                        "; ranks {:?} connected, then closed their connection (died?)",
                        self.left
                    );
                }
                m
            }
        };
        Some(RootAction::Fail {
            conns,
            error: Error::Remote(message),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{a, hello};
    use super::*;

    #[test]
    fn root_collects_then_hands_out_the_table() {
        let t0 = Instant::now();
        let mut r = Root::new(a(1), Duration::from_secs(5), t0);
        assert_eq!(r.hello(t0, 0, &hello(1, 3, 11)), None);
        let refused = |x: Option<RootAction>, conn: ConnId, what: &str| match x {
            Some(RootAction::Refuse {
                conn: c,
                error: Error::InvalidUsage(m),
            }) => {
                assert_eq!(c, conn);
                assert!(m.contains(what), "{m}");
            }
            other => panic!("{other:?}"),
        };
        refused(r.hello(t0, 1, &hello(1, 3, 12)), 1, "rank 1 joined twice");
        refused(r.hello(t0, 2, &hello(0, 4, 12)), 2, "nranks is 4");
        refused(r.hello(t0, 3, &hello(3, 3, 12)), 3, "out of range");
        refused(r.hello(t0, 4, &hello(0, 0, 12)), 4, "nranks is 0");
        assert_eq!(r.hello(t0, 5, &hello(0, 3, 10)), None);
        assert_eq!(r.missing(), vec![2]);
        assert_eq!(
            r.hello(t0, 6, &hello(2, 3, 12)),
            Some(RootAction::Table {
                conns: vec![5, 0, 6],
                table: vec![a(10), a(11), a(12)]
            })
        );
        assert!(r.is_done());
        assert_eq!(r.poll(t0 + Duration::from_secs(60)), None);
    }

    #[test]
    fn root_gives_up_soon_after_refusing_a_key_exchange() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = Root::new(a(1), 30 * s, t0);
        assert_eq!(r.hello(t0, 7, &hello(0, 2, 10)), None);
        r.key_refused(t0 + s, a(9), "the peer holds another key");
        r.key_refused(t0 + 2 * s, a(8), "a second one is not the one named");
        assert_eq!(r.deadline(), t0 + s + KEY_REFUSED_GRACE);
        assert_eq!(r.poll(t0 + s), None);
        match r.poll(t0 + s + KEY_REFUSED_GRACE) {
            Some(RootAction::Fail {
                conns,
                error: Error::Remote(m),
            }) => {
                assert_eq!(conns, vec![7]);
                assert!(
                    m.contains("ranks [1] of 2 never connected to the root at 127.0.0.1:1: the root refused 127.0.0.1:9 (the peer holds another key)"),
                    "{m}"
                );
                assert!(
                    m.contains("NCCL_SOCKET_KEY_FILE must name the same key"),
                    "{m}"
                );
                assert!(!m.contains("within 30 s"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // Every rank in within the grace: a stranger's refusal changes nothing.
        let mut r = Root::new(a(1), 30 * s, t0);
        r.key_refused(t0, a(9), "the peer holds another key");
        assert_eq!(r.hello(t0, 7, &hello(0, 2, 10)), None);
        assert!(matches!(
            r.hello(t0 + s, 8, &hello(1, 2, 11)),
            Some(RootAction::Table { .. })
        ));
        // A grace never longer than NCCL_TIMEOUT.
        let r = Root::new(a(1), s / 2, t0);
        let mut r2 = r;
        r2.key_refused(t0, a(9), "x");
        assert_eq!(r2.deadline(), t0 + s / 2);
    }

    #[test]
    fn root_names_missing_ranks_at_the_deadline() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = Root::new(a(1), 5 * s, t0);
        // The clock starts at the first hello.
        assert_eq!(r.hello(t0 + 3 * s, 7, &hello(0, 4, 10)), None);
        assert_eq!(r.hello(t0 + 4 * s, 8, &hello(3, 4, 13)), None);
        assert_eq!(r.hello(t0 + 4 * s, 9, &hello(1, 4, 11)), None);
        r.closed(9);
        assert_eq!(r.deadline(), t0 + 8 * s);
        assert_eq!(r.poll(t0 + 7 * s), None);
        match r.poll(t0 + 8 * s) {
            Some(RootAction::Fail {
                conns,
                error: Error::Remote(m),
            }) => {
                assert_eq!(conns, vec![7, 8]);
                assert!(
                    m.contains(
                        "ranks [1, 2] of 4 never connected to the root at 127.0.0.1:1 within 5 s"
                    ),
                    "{m}"
                );
                assert!(m.contains("ranks [1] connected, then closed"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert!(r.is_done());
        assert_eq!(r.poll(t0 + 9 * s), None);

        let mut r = Root::new(a(1), s / 2, t0);
        match r.poll(t0 + s) {
            Some(RootAction::Fail { conns, error }) => {
                assert!(conns.is_empty());
                assert!(error.message().contains("no rank connected"), "{error}");
                assert!(error.message().contains("0.5 s"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
}
