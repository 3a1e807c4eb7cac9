//! Point-to-point messages on the direct path: the sender offers its
//! buffer's address in the pair's mailbox ([`PeerMem::offer`]), the
//! receiver copies the message straight out of the sender's process (one
//! kernel copy, no staging slot, no chunking) and marks it taken, which
//! ends the send. A group's messages progress together in one loop that
//! never blocks on any single one, so sends and receives in any order
//! complete without deadlock, as on the rings.
//!
//! Messages between one ordered pair match in order, numbered from 1 by
//! both ends: the sender offers message k only once the receiver has
//! taken k-1, so one mailbox per pair is enough.
//!
//! A large message goes on the rings instead, where two cores copy it in
//! a pipeline through shared memory: the kernel's cross-process copy pins
//! every page and runs at a third of a user-space copy's speed (7.9 against
//! 22 GB/s for 64 MiB on a 2-core VM), which only pays while the rings'
//! hand-offs cost more. The sender decides, and still offers the message
//! in the mailbox with a mark, so both ends agree on every message's route
//! and number whatever size the receiver posted.

use crate::error::{Error, Result};
use crate::transport::cma::{PeerMem, Poll, Taken};

use crate::mem::{self, Span};

/// One send or receive of a group, on this rank's host memory.
#[derive(Debug, Clone, Copy)]
pub struct Msg {
    pub peer: usize,
    pub send: bool,
    /// The bytes to send, or the room to receive into.
    pub span: Span,
    /// A send the sender puts on the rings (its receiver learns it from
    /// the offer).
    pub ring: bool,
}

/// Marks an offer whose message travels on the rings, in its length word.
const RING: u64 = 1 << 63;

/// Messages numbered so far per peer: (sent, received).
pub type Counts = Vec<(u64, u64)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A send waits for the pair's previous message to be taken; a
    /// receive, for its message to be offered.
    Waiting,
    /// A send's message is offered, not yet taken.
    Offered,
    Done,
}

/// Runs one group's messages to completion (`peer` never this rank), but
/// for those on the rings, whose places in `msgs` it returns for the
/// caller to run there. A wait asks `poll` now and then, with the peers
/// still owing something, whether to give up.
pub fn exchange(
    pm: &PeerMem,
    counts: &mut Counts,
    msgs: &[Msg],
    threads: &dyn Fn(usize) -> usize,
    poll: &mut Poll<'_>,
) -> Result<Vec<usize>> {
    let me = pm.rank();
    let numbers: Vec<u64> = msgs
        .iter()
        .map(|m| {
            let c = &mut counts[m.peer];
            let k = if m.send { &mut c.0 } else { &mut c.1 };
            *k += 1;
            *k
        })
        .collect();
    let mut state = vec![State::Waiting; msgs.len()];
    let mut ring = Vec::new();
    let mut left = msgs.len();
    let mut wait = pm.backoff();
    while left > 0 {
        let mut moved = false;
        for (i, ((m, &k), st)) in msgs.iter().zip(&numbers).zip(state.iter_mut()).enumerate() {
            let (next, on_ring) = step(pm, me, m, k, *st, threads)?;
            if next != *st {
                moved = true;
                *st = next;
                if next == State::Done {
                    left -= 1;
                    if on_ring {
                        ring.push(i);
                    }
                }
            }
        }
        if moved || left == 0 {
            wait = pm.backoff();
            continue;
        }
        if let Some(waited) = wait.pause() {
            let mut owing: Vec<usize> = msgs
                .iter()
                .zip(&state)
                .filter(|(_, s)| **s != State::Done)
                .map(|(m, _)| m.peer)
                .collect();
            owing.sort_unstable();
            owing.dedup();
            if let Some(e) = poll(&owing, waited) {
                return Err(e);
            }
        }
    }
    ring.sort_unstable();
    Ok(ring)
}

/// One look at message number `k`'s mailbox, moving it on where it can;
/// with whether the message, now done here, goes on the rings.
fn step(
    pm: &PeerMem,
    me: usize,
    m: &Msg,
    k: u64,
    st: State,
    threads: &dyn Fn(usize) -> usize,
) -> Result<(State, bool)> {
    let stay = Ok((st, false));
    match (m.send, st) {
        (_, State::Done) => stay,
        (true, State::Waiting) => {
            if pm.taken(m.peer).0 + 1 < k {
                return stay;
            }
            let len = m.span.len as u64;
            let (addr, len) = if m.ring {
                (0, len | RING)
            } else {
                (m.span.ptr as u64, len)
            };
            pm.offer(m.peer, k, addr, len);
            Ok((State::Offered, false))
        }
        (true, State::Offered) => match pm.taken(m.peer) {
            (t, _) if t < k => stay,
            (_, Taken::Whole) => Ok((State::Done, m.ring)),
            (_, Taken::Refused { room }) => Err(Error::InvalidUsage(format!(
                "rank {me} sent {} bytes to rank {}, which posted a receive of {room} bytes for it",
                m.span.len, m.peer
            ))),
        },
        (false, _) => {
            let (offered, addr, len) = pm.offered(m.peer);
            if offered < k {
                return stay;
            }
            let (len, ring) = (len & !RING, len & RING != 0);
            let room = m.span.len as u64;
            if len > room {
                pm.take(m.peer, k, Taken::Refused { room });
                return Err(Error::InvalidUsage(format!(
                    "message truncated: rank {} sent {len} bytes, rank {me} posted a receive of {room}",
                    m.peer
                )));
            }
            if !ring {
                let into = Span {
                    ptr: m.span.ptr,
                    len: len as usize,
                };
                mem::fill(into, |d| read(pm, m.peer, addr, d, threads(d.len())))?;
            }
            pm.take(m.peer, k, Taken::Whole);
            Ok((State::Done, ring))
        }
    }
}

/// Copies `dst.len()` bytes at `addr` of `peer` on `threads` threads, each
/// a part: where one core's copy falls short of the memory's bandwidth (a
/// 16-core host copies about 5 GB/s per core), a large message needs
/// several.
fn read(pm: &PeerMem, peer: usize, addr: u64, dst: &mut [u8], threads: usize) -> Result<()> {
    if threads <= 1 {
        return pm.read(peer, addr, dst);
    }
    let part = dst.len().div_ceil(threads).next_multiple_of(4096);
    let mut parts = dst.chunks_mut(part);
    let first = parts.next().unwrap_or_default();
    std::thread::scope(|s| {
        let others: Vec<_> = parts
            .enumerate()
            .map(|(i, p)| s.spawn(move || pm.read(peer, addr + ((i + 1) * part) as u64, p)))
            .collect();
        let mine = pm.read(peer, addr, first);
        others.into_iter().fold(mine, |r, h| {
            let theirs = h.join().unwrap_or_else(|_| {
                Err(Error::Internal("a direct-path copy thread panicked".into()))
            });
            r.and(theirs)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::cma::tests::in_process;
    use std::time::Duration;

    fn span(v: &mut [u8]) -> Span {
        mem::staging(v)
    }

    /// Every rank sends each peer three messages of different sizes in one
    /// group (receives posted before sends on odd ranks), twice: each
    /// arrives whole and in order. In the second round the senders put the
    /// largest on the rings: both ends then hand exactly those back, and
    /// the receiver's buffer is left alone.
    #[test]
    fn a_group_of_messages_arrives_in_order_both_ways() {
        let n = 3;
        in_process(n, move |pm| {
            let me = pm.rank();
            let mut counts = vec![(0, 0); n];
            for round in 0..2u8 {
                let sizes = [1usize, 4096, 300_001];
                let mut outs: Vec<Vec<u8>> = Vec::new();
                let mut ins: Vec<(usize, usize, Vec<u8>)> = Vec::new();
                for p in (0..n).filter(|&p| p != me) {
                    for (i, &len) in sizes.iter().enumerate() {
                        let tag = (me * 16 + p * 4 + i) as u8 ^ round;
                        outs.push((0..len).map(|j| tag.wrapping_add(j as u8)).collect());
                        ins.push((p, i, vec![0u8; len]));
                    }
                }
                let mut msgs = Vec::new();
                let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
                let sends = outs.iter_mut().enumerate().map(|(j, o)| Msg {
                    peer: peers[j / sizes.len()],
                    send: true,
                    ring: round == 1 && o.len() > 100_000,
                    span: span(o),
                });
                let recvs = ins.iter_mut().map(|(p, _, b)| Msg {
                    peer: *p,
                    send: false,
                    span: span(b),
                    ring: false,
                });
                if me % 2 == 1 {
                    msgs.extend(recvs);
                    msgs.extend(sends);
                } else {
                    msgs.extend(sends);
                    msgs.extend(recvs);
                }
                let ring = exchange(
                    &pm,
                    &mut counts,
                    &msgs,
                    &|len| 1 + len / 100_000,
                    &mut |_, w| {
                        (w > Duration::from_secs(20)).then(|| Error::Remote("stuck".into()))
                    },
                )
                .unwrap();
                let big: Vec<usize> = (0..msgs.len())
                    .filter(|&m| round == 1 && msgs[m].span.len == 300_001)
                    .collect();
                assert_eq!(ring, big, "rank {me}, round {round}");
                for (p, i, b) in &ins {
                    if round == 1 && b.len() == 300_001 {
                        assert!(b.iter().all(|&x| x == 0));
                        continue;
                    }
                    let tag = (p * 16 + me * 4 + i) as u8 ^ round;
                    assert!(
                        b.iter()
                            .enumerate()
                            .all(|(j, &x)| x == tag.wrapping_add(j as u8)),
                        "rank {me}: message {i} from {p}, round {round}"
                    );
                }
            }
        });
    }

    /// A receive smaller than its message is refused on both ends, and a
    /// message nobody sends ends in the poll's error naming that peer.
    #[test]
    fn a_short_receive_and_a_missing_sender_are_errors() {
        in_process(2, |pm| {
            let me = pm.rank();
            let mut counts = vec![(0, 0); 2];
            let mut big = vec![7u8; 100];
            let mut small = vec![0u8; 10];
            let msg = if me == 0 {
                Msg {
                    peer: 1,
                    send: true,
                    span: span(&mut big),
                    ring: false,
                }
            } else {
                Msg {
                    peer: 0,
                    send: false,
                    span: span(&mut small),
                    ring: false,
                }
            };
            let never = &mut |_: &[usize], _| -> Option<Error> { None };
            let e = exchange(&pm, &mut counts, &[msg], &|_| 1, never)
                .unwrap_err()
                .to_string();
            assert!(e.contains("100 bytes") && e.contains("10"), "{e}");
            assert!(
                small.iter().all(|&b| b == 0),
                "rank {me}: a refused message wrote bytes"
            );
            if me == 1 {
                let mut seen = Vec::new();
                let msg = Msg {
                    peer: 0,
                    send: false,
                    span: span(&mut small),
                    ring: false,
                };
                let e = exchange(&pm, &mut counts, &[msg], &|_| 1, &mut |owing, w| {
                    seen = owing.to_vec();
                    (w > Duration::from_millis(30)).then(|| Error::Remote("late".into()))
                });
                assert!(e.is_err());
                assert_eq!(seen, vec![0]);
            }
        });
    }
}
