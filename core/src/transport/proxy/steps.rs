//! The steps of one net connection of the device path, without sockets or
//! GPUs: which slots the kernel posted have gone to the plugin and which it
//! finished, and which free slots have a receive posted into them. The
//! proxy thread ([`super::Proxy`]) feeds these the counters it reads and
//! performs what they answer.

/// The sending half of one connection: which steps the kernel posted have
/// gone to the plugin, and which the plugin finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendSteps {
    posted: u64,
    done: u64,
}

impl SendSteps {
    pub fn new() -> SendSteps {
        SendSteps { posted: 0, done: 0 }
    }

    /// The step to hand to `isend` next, given the kernel's `tail` (steps
    /// it has stored); `None` while it has stored nothing new.
    pub fn next(&self, tail: u64) -> Option<u64> {
        (self.posted < tail).then_some(self.posted)
    }

    pub fn posted(&mut self) {
        self.posted += 1;
    }

    /// The oldest step in flight has completed (they complete in order);
    /// returns the count to publish as the kernel's `head`: its slot may
    /// be stored into again.
    pub fn done(&mut self) -> u64 {
        debug_assert!(self.done < self.posted, "a send done that was never posted");
        self.done += 1;
        self.done
    }

    pub fn in_flight(&self) -> u64 {
        self.posted - self.done
    }

    /// Steps completed so far: the number of the oldest in flight.
    pub fn completed(&self) -> u64 {
        self.done
    }
}

impl Default for SendSteps {
    fn default() -> Self {
        SendSteps::new()
    }
}

/// The receiving half: receives are posted ahead into free slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvSteps {
    nslots: u64,
    posted: u64,
    done: u64,
}

impl RecvSteps {
    pub fn new(nslots: usize) -> RecvSteps {
        RecvSteps {
            nslots: nslots as u64,
            posted: 0,
            done: 0,
        }
    }

    /// The step to post an `irecv` for next, given the kernel's `head`
    /// (steps it has consumed): a slot is free once the step that used it
    /// `nslots` steps ago was consumed.
    pub fn next(&self, consumed: u64) -> Option<u64> {
        (self.posted < consumed + self.nslots).then_some(self.posted)
    }

    pub fn posted(&mut self) {
        self.posted += 1;
    }

    /// The oldest receive completed; returns the count to publish as the
    /// kernel's `tail`.
    pub fn done(&mut self) -> u64 {
        debug_assert!(
            self.done < self.posted,
            "a receive done that was never posted"
        );
        self.done += 1;
        self.done
    }

    /// Receives completed so far: the step of the oldest in flight.
    pub fn completed(&self) -> u64 {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn sends_follow_the_kernels_posts_and_free_slots_in_order() {
        let mut s = SendSteps::new();
        assert_eq!(s.next(0), None, "nothing stored");
        assert_eq!(s.next(2), Some(0));
        s.posted();
        assert_eq!(s.next(2), Some(1));
        s.posted();
        assert_eq!(s.next(2), None, "both posted");
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.done(), 1);
        assert_eq!(s.done(), 2);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.next(3), Some(2));
    }

    #[test]
    fn receives_are_posted_ahead_into_free_slots_only() {
        let mut r = RecvSteps::new(4);
        let mut posted = Vec::new();
        while let Some(step) = r.next(0) {
            posted.push(step);
            r.posted();
        }
        assert_eq!(posted, [0, 1, 2, 3], "every slot of an idle connection");
        assert_eq!(r.done(), 1);
        assert_eq!(
            r.next(0),
            None,
            "arrived is not consumed: slot 0 stays busy"
        );
        assert_eq!(
            r.next(1),
            Some(4),
            "the kernel consumed step 0: its slot takes step 4"
        );
        r.posted();
        assert_eq!(r.next(1), None);
    }

    /// A kernel and two proxies simulated step by step: every step the
    /// kernel posts arrives once, in order, and no slot is overwritten
    /// before its step was consumed, whatever the timing.
    #[test]
    fn a_simulated_stream_never_overwrites_an_unconsumed_slot() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let nslots = 4u64;
        let total = 200u64;
        let (mut s, mut r) = (SendSteps::new(), RecvSteps::new(nslots as usize));
        // The sending kernel's stored count and the head it sees; the
        // receiving kernel's consumed count and the tail it sees.
        let (mut stored, mut head, mut consumed, mut tail) = (0u64, 0u64, 0u64, 0u64);
        // Posted sends in flight (steps), posted receives (steps); the
        // wire: steps sent and not yet matched.
        let (mut sq, mut rq, mut wire) = (VecDeque::new(), VecDeque::new(), VecDeque::new());
        let mut slot_of = vec![None; nslots as usize];
        while consumed < total {
            match rng.random_range(0..6) {
                0 if stored < total && stored < head + nslots => stored += 1,
                1 => {
                    if let Some(step) = s.next(stored) {
                        sq.push_back(step);
                        s.posted();
                    }
                }
                2 => {
                    if let Some(step) = sq.pop_front() {
                        wire.push_back(step);
                        head = s.done();
                    }
                }
                3 => {
                    if let Some(step) = r.next(consumed) {
                        let slot = (step % nslots) as usize;
                        assert!(
                            slot_of[slot].is_none(),
                            "slot {slot} reused before consumed"
                        );
                        slot_of[slot] = Some(step);
                        rq.push_back(step);
                        r.posted();
                    }
                }
                4 => {
                    if let (Some(&want), Some(&got)) = (rq.front(), wire.front()) {
                        assert_eq!(want, got, "in order");
                        rq.pop_front();
                        wire.pop_front();
                        tail = r.done();
                    }
                }
                5 if consumed < tail => {
                    let slot = (consumed % nslots) as usize;
                    assert_eq!(slot_of[slot], Some(consumed));
                    slot_of[slot] = None;
                    consumed += 1;
                }
                _ => {}
            }
        }
        assert_eq!((stored, tail), (total, total));
    }
}
