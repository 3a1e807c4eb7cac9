//! Request and completion bookkeeping, pure: which QP a request goes on,
//! which work request id it has, what its completion means. The verbs side
//! (`endpoint`) posts what this decides and feeds back what `ibv_poll_cq`
//! returned.
//!
//! Matching needs no tags on the wire: both ends number their requests in
//! the order the core posts them (it posts sends and receives of one
//! connection in the same order) and put request k on QP k mod nqps, so
//! send k meets receive k on the same QP, where RC keeps order. The tag
//! still travels (as immediate data) and is checked, which turns a core
//! bug into an error instead of silently mixed data.

use std::collections::HashMap;

use oxccl_plugin::NetError;

/// Requests one comm keeps in flight (NCCL's `NCCL_NET_MAX_REQUESTS`).
pub const MAX_REQUESTS: usize = 32;

/// Work request ids of flushes have this bit set, so they never collide
/// with sends and receives.
pub const FLUSH_BIT: u64 = 1 << 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Send,
    /// A receive of at most `capacity` bytes expecting `tag`.
    Recv {
        capacity: usize,
        tag: i32,
    },
    /// A GPU flush: one RDMA read per device of the connection (NCCL does
    /// not know which device a receive landed on, so it reads through
    /// each); done when all of them are.
    Flush {
        reads: usize,
    },
}

/// Where the verbs side posts a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posted {
    /// The `wr_id`, also the request's id.
    pub id: u64,
    /// Index of the connection's QP to post on.
    pub qp: usize,
}

/// One work completion, as `ibv_poll_cq` gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// `Err(text)` for any status other than success.
    pub status: Result<(), String>,
    pub byte_len: u32,
    /// The immediate data (host order) of a receive, `None` without.
    pub imm: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Pending,
    Done(usize),
    Failed(NetError),
}

#[derive(Debug)]
struct Slot {
    kind: Kind,
    size: usize,
    /// Completions still expected (a flush may have several).
    awaiting: usize,
    state: State,
    /// The core dropped the request before it completed: forget it when it does.
    abandoned: bool,
}

#[derive(Debug)]
pub struct Tracker {
    nqps: usize,
    next: u64,
    next_flush: u64,
    slots: HashMap<u64, Slot>,
    /// Set by the first failed completion: a QP in error flushes everything
    /// after, so the connection is over.
    broken: Option<NetError>,
    peer: String,
}

impl Tracker {
    pub fn new(nqps: usize, peer: String) -> Tracker {
        Tracker {
            nqps: nqps.max(1),
            next: 0,
            next_flush: 0,
            slots: HashMap::new(),
            broken: None,
            peer,
        }
    }

    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.slots.len()
    }

    /// Reserves an id and a QP for a new request; `Ok(None)` when
    /// `MAX_REQUESTS` sends and receives are in flight (the core retries
    /// later).
    ///
    /// Flushes have a budget of their own, and exceeding it is an error,
    /// not `Ok(None)`: the C ABI reads a NULL flush request as "flushed",
    /// so "try again later" cannot be said. NCCL keeps at most a few steps
    /// per connection in flight, far below the budget.
    pub fn post(&mut self, kind: Kind, size: usize) -> Result<Option<Posted>, NetError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let is_flush = matches!(kind, Kind::Flush { .. });
        let flushes = self.slots.keys().filter(|id| *id & FLUSH_BIT != 0).count();
        if is_flush && flushes >= MAX_REQUESTS {
            return Err(NetError::Internal(format!(
                "{flushes} flushes in flight to {}: the caller does not test its flush requests",
                self.peer
            )));
        }
        if !is_flush && self.slots.len() - flushes >= MAX_REQUESTS {
            return Ok(None);
        }
        let awaiting = match kind {
            Kind::Flush { reads } => reads.max(1),
            _ => 1,
        };
        let (id, qp) = if is_flush {
            self.next_flush += 1;
            (FLUSH_BIT | self.next_flush, 0)
        } else {
            let id = self.next;
            self.next += 1;
            (id, (id % self.nqps as u64) as usize)
        };
        self.slots.insert(
            id,
            Slot {
                kind,
                size,
                awaiting,
                state: State::Pending,
                abandoned: false,
            },
        );
        Ok(Some(Posted { id, qp }))
    }

    /// The verbs post of `id` failed: take the reservation back. Request
    /// numbers stay consumed only when the peer saw them, so a failed post
    /// must not leave a hole; it also breaks the connection (the QP is in
    /// error after a failed post, as far as we can tell).
    pub fn unpost(&mut self, id: u64, why: String) {
        self.slots.remove(&id);
        self.broken = Some(NetError::System(why));
    }

    /// Applies one completion.
    pub fn complete(&mut self, c: Completion) -> Result<(), NetError> {
        let Some(slot) = self.slots.get_mut(&c.wr_id) else {
            if self.broken.is_some() {
                // A request already failed with the connection; the QP
                // flushing its work request back is expected.
                return Ok(());
            }
            return Err(NetError::Internal(format!(
                "completion for unknown work request {:#x}",
                c.wr_id
            )));
        };
        slot.state = match (c.status, slot.kind) {
            (Err(why), _) => {
                let e = NetError::Remote(format!(
                    "IB work request to {} failed: {why} (a peer that died, a link down, or NCCL_IB_TIMEOUT/NCCL_IB_RETRY_CNT too low for this fabric)",
                    self.peer
                ));
                self.broken.get_or_insert_with(|| e.clone());
                State::Failed(e)
            }
            (Ok(()), Kind::Send) => State::Done(slot.size),
            (Ok(()), Kind::Flush { .. }) => {
                slot.awaiting = slot.awaiting.saturating_sub(1);
                if slot.awaiting > 0 {
                    State::Pending
                } else {
                    State::Done(0)
                }
            }
            (Ok(()), Kind::Recv { capacity, tag }) => match c.imm {
                Some(t) if t as i32 != tag => State::Failed(NetError::Internal(format!(
                    "a message of tag {} arrived for the receive of tag {tag}: sends and receives were posted in different orders",
                    t as i32
                ))),
                _ if c.byte_len as usize > capacity => State::Failed(NetError::InvalidArgument(
                    format!("message of {} bytes for a receive of {capacity}", c.byte_len),
                )),
                _ => State::Done(c.byte_len as usize),
            },
        };
        if slot.abandoned && slot.state != State::Pending {
            self.slots.remove(&c.wr_id);
        }
        Ok(())
    }

    /// `Ok(None)` while `id` is in flight; its size once done (the slot is
    /// then freed).
    pub fn poll(&mut self, id: u64) -> Result<Option<usize>, NetError> {
        let state = match self.slots.get(&id) {
            None => {
                return Err(NetError::Internal(format!(
                    "test of unknown request {id:#x}"
                )))
            }
            Some(s) => s.state.clone(),
        };
        match state {
            State::Pending => match &self.broken {
                // Its completion may never come once the QP is in error.
                Some(e) => {
                    self.slots.remove(&id);
                    Err(e.clone())
                }
                None => Ok(None),
            },
            State::Done(n) => {
                self.slots.remove(&id);
                Ok(Some(n))
            }
            State::Failed(e) => {
                self.slots.remove(&id);
                Err(e)
            }
        }
    }

    /// The core dropped request `id`: free it now if done, else when done.
    pub fn forget(&mut self, id: u64) {
        if let Some(s) = self.slots.get_mut(&id) {
            if s.state == State::Pending && self.broken.is_none() {
                s.abandoned = true;
            } else {
                self.slots.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(wr_id: u64, byte_len: u32, imm: Option<u32>) -> Completion {
        Completion {
            wr_id,
            status: Ok(()),
            byte_len,
            imm,
        }
    }

    #[test]
    fn requests_spread_over_qps_in_order() {
        let mut t = Tracker::new(3, "peer".into());
        let qps: Vec<usize> = (0..7)
            .map(|_| t.post(Kind::Send, 10).unwrap().unwrap().qp)
            .collect();
        assert_eq!(qps, vec![0, 1, 2, 0, 1, 2, 0]);
        // Flushes have ids of their own and do not shift the spread.
        let f = t.post(Kind::Flush { reads: 1 }, 0).unwrap().unwrap();
        assert!(f.id & FLUSH_BIT != 0);
        assert_eq!(
            t.post(Kind::Send, 1).unwrap().unwrap(),
            Posted { id: 7, qp: 1 }
        );
    }

    #[test]
    fn completions_in_any_order_complete_their_own_request() {
        let mut t = Tracker::new(2, "peer".into());
        let a = t.post(Kind::Send, 100).unwrap().unwrap();
        let b = t
            .post(
                Kind::Recv {
                    capacity: 64,
                    tag: 5,
                },
                64,
            )
            .unwrap()
            .unwrap();
        assert_eq!(t.poll(a.id).unwrap(), None);
        t.complete(ok(b.id, 40, Some(5))).unwrap();
        assert_eq!(t.poll(a.id).unwrap(), None);
        assert_eq!(t.poll(b.id).unwrap(), Some(40));
        t.complete(ok(a.id, 0, None)).unwrap();
        assert_eq!(t.poll(a.id).unwrap(), Some(100));
        assert_eq!(t.in_flight(), 0);
        // Freed: testing again is the core's bug, reported, not a panic.
        assert!(t.poll(a.id).is_err());
        assert!(t.complete(ok(999, 0, None)).is_err());
    }

    #[test]
    fn at_most_max_requests_then_try_again() {
        let mut t = Tracker::new(1, "peer".into());
        let ids: Vec<_> = (0..MAX_REQUESTS)
            .map(|_| t.post(Kind::Send, 1).unwrap().unwrap().id)
            .collect();
        assert_eq!(t.post(Kind::Send, 1).unwrap(), None);
        t.complete(ok(ids[3], 0, None)).unwrap();
        t.poll(ids[3]).unwrap();
        assert!(t.post(Kind::Send, 1).unwrap().is_some());
    }

    #[test]
    fn a_failed_completion_breaks_the_connection() {
        let mut t = Tracker::new(1, "10.0.0.2".into());
        let a = t.post(Kind::Send, 1).unwrap().unwrap();
        let b = t.post(Kind::Send, 1).unwrap().unwrap();
        t.complete(Completion {
            wr_id: a.id,
            status: Err("transport retry counter exceeded".into()),
            byte_len: 0,
            imm: None,
        })
        .unwrap();
        let e = t.poll(a.id).unwrap_err();
        assert!(matches!(e, NetError::Remote(_)));
        assert!(e.to_string().contains("retry counter") && e.to_string().contains("10.0.0.2"));
        // The other request's completion may never come: it fails too.
        assert!(t.poll(b.id).is_err());
        assert!(t.post(Kind::Send, 1).is_err());
        // When its flushed completion does come, it is no news.
        t.complete(Completion {
            wr_id: b.id,
            status: Err("Work Request Flushed Error".into()),
            byte_len: 0,
            imm: None,
        })
        .unwrap();
    }

    #[test]
    fn tag_and_size_checks() {
        let mut t = Tracker::new(1, "p".into());
        let r = t
            .post(
                Kind::Recv {
                    capacity: 8,
                    tag: 1,
                },
                8,
            )
            .unwrap()
            .unwrap();
        t.complete(ok(r.id, 4, Some(2))).unwrap();
        assert!(t.poll(r.id).unwrap_err().to_string().contains("tag 2"));
        let r = t
            .post(
                Kind::Recv {
                    capacity: 8,
                    tag: -1,
                },
                8,
            )
            .unwrap()
            .unwrap();
        t.complete(ok(r.id, 8, Some(u32::MAX))).unwrap();
        assert_eq!(
            t.poll(r.id).unwrap(),
            Some(8),
            "negative tags survive the u32 trip"
        );
        let r = t
            .post(
                Kind::Recv {
                    capacity: 8,
                    tag: 1,
                },
                8,
            )
            .unwrap()
            .unwrap();
        t.complete(ok(r.id, 9, Some(1))).unwrap();
        assert!(t.poll(r.id).is_err());
    }

    #[test]
    fn forgotten_requests_are_freed_when_they_complete() {
        let mut t = Tracker::new(1, "p".into());
        let a = t.post(Kind::Send, 1).unwrap().unwrap();
        t.forget(a.id);
        assert_eq!(t.in_flight(), 1, "still owned by the hardware");
        t.complete(ok(a.id, 0, None)).unwrap();
        assert_eq!(t.in_flight(), 0);
        let b = t.post(Kind::Send, 1).unwrap().unwrap();
        t.complete(ok(b.id, 0, None)).unwrap();
        t.forget(b.id);
        assert_eq!(t.in_flight(), 0);
        let c = t.post(Kind::Send, 1).unwrap().unwrap();
        t.unpost(c.id, "ibv_post_send: No memory".into());
        assert_eq!(t.in_flight(), 0);
        assert!(t.post(Kind::Send, 1).is_err());
    }

    #[test]
    fn a_flush_over_several_devices_waits_for_every_read() {
        let mut t = Tracker::new(1, "p".into());
        let f = t.post(Kind::Flush { reads: 2 }, 0).unwrap().unwrap();
        t.complete(ok(f.id, 1, None)).unwrap();
        assert_eq!(t.poll(f.id).unwrap(), None, "one read of two");
        t.complete(ok(f.id, 1, None)).unwrap();
        assert_eq!(t.poll(f.id).unwrap(), Some(0));
        assert_eq!(t.in_flight(), 0);
        // A failed read fails the flush and the connection, with the peer named.
        let f = t.post(Kind::Flush { reads: 2 }, 0).unwrap().unwrap();
        t.complete(Completion {
            wr_id: f.id,
            status: Err("remote access error".into()),
            byte_len: 0,
            imm: None,
        })
        .unwrap();
        let e = t.poll(f.id).unwrap_err().to_string();
        assert!(
            e.contains("remote access error") && e.contains(" p "),
            "{e}"
        );
    }

    #[test]
    fn flushes_have_their_own_budget_and_never_say_try_again() {
        let mut t = Tracker::new(1, "p".into());
        for _ in 0..MAX_REQUESTS {
            t.post(Kind::Send, 1).unwrap().unwrap();
        }
        assert_eq!(t.post(Kind::Send, 1).unwrap(), None);
        // Sends and receives filling their budget do not block a flush.
        let flushes: Vec<_> = (0..MAX_REQUESTS)
            .map(|_| t.post(Kind::Flush { reads: 1 }, 0).unwrap().unwrap().id)
            .collect();
        // Beyond the flush budget: an error (NULL would read as "flushed").
        let e = t.post(Kind::Flush { reads: 1 }, 0).unwrap_err();
        assert!(e.to_string().contains("flushes in flight"), "{e}");
        // Flushes in flight do not take from the sends' budget either.
        t.complete(ok(flushes[0], 1, None)).unwrap();
        t.poll(flushes[0]).unwrap();
        assert_eq!(t.post(Kind::Send, 1).unwrap(), None);
        assert!(t.post(Kind::Flush { reads: 1 }, 0).unwrap().is_some());
    }
}
