//! The proxy of the device path's network connections (NCCL's proxy
//! thread): the GPU cannot call the net plugin, so a host thread moves its
//! step slots. For each net peer and channel the kernel stores slices into
//! a send mirror in host memory and posts them (`tail`, with each slot's
//! size); the proxy `isend`s each posted slot and, once the plugin is done
//! with it, tells the kernel the slot is free again (`head` in the kernel's
//! receive area). The other way, the proxy keeps an `irecv` posted into
//! every free slot of the receive area and publishes each completed one to
//! the kernel (`tail`); the kernel's acknowledgements (`head` in the
//! mirror) free slots for the next `irecv`s. Steps go out and come in while
//! the kernel works on others, so the network, the PCIe traffic of the
//! kernel and its reductions overlap, on every channel at once.
//!
//! [`SendSteps`] and [`RecvSteps`] are the per-connection state machines,
//! without sockets or GPUs; [`Proxy`] is the thread that feeds them the
//! counters it reads and performs what they answer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_plugin::{MrHandle, Request};

use super::layout::Layout;
use super::shm::area::Area;
use crate::cuda::Registered;
use crate::error::{Error, Result};
use crate::exec::mem::Span;
use crate::exec::reg::{RecvConn, Scope, SendConn};

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
}

/// The memory the proxy works in: this rank's receive area and its send
/// mirror, both mapped into the GPU.
pub struct Areas {
    pub mine: Arc<Registered<Area>>,
    pub mirror: Arc<Registered<Area>>,
    pub layout: Layout,
    pub rank: usize,
}

/// One net peer on one channel: both directions.
pub struct Link {
    pub peer: usize,
    pub chan: usize,
    pub send: SendConn,
    pub recv: RecvConn,
}

struct Driven {
    link: Link,
    /// Cell of this rank's data for the peer, in the mirror.
    out: usize,
    /// Cell of the peer's data for this rank, in the receive area.
    inc: usize,
    send_mr: MrHandle,
    recv_mr: MrHandle,
    sends: SendSteps,
    recvs: RecvSteps,
    send_q: VecDeque<Box<dyn Request>>,
    recv_q: VecDeque<Box<dyn Request>>,
}

fn span(a: &Area, (off, len): (usize, usize)) -> Span {
    Span {
        ptr: a.at(off, len),
        len,
    }
}

impl Driven {
    fn new(mut link: Link, a: &Areas) -> Result<Driven> {
        let l = &a.layout;
        let out = l.cell(a.rank, link.peer, link.chan);
        let inc = l.cell(link.peer, a.rank, link.chan);
        let what = |dir: &str, e| {
            Error::from(e).context(format!(
                "registering the {dir} slots of channel {} to rank {} with the network",
                link.chan, link.peer
            ))
        };
        let s = span(a.mirror.mem(), l.slots(out));
        let send_mr = link
            .send
            .mr(s, s, Scope::Kept)
            .map_err(|e| what("send", e))?;
        let r = span(a.mine.mem(), l.slots(inc));
        let recv_mr = link
            .recv
            .mr(r, r, Scope::Kept)
            .map_err(|e| what("receive", e))?;
        Ok(Driven {
            link,
            out,
            inc,
            send_mr,
            recv_mr,
            sends: SendSteps::new(),
            recvs: RecvSteps::new(l.nslots),
            send_q: VecDeque::new(),
            recv_q: VecDeque::new(),
        })
    }

    /// Posts and completes what it can; whether anything moved.
    fn progress(&mut self, a: &Areas) -> Result<bool> {
        let (l, mine, mirror) = (&a.layout, a.mine.mem(), a.mirror.mem());
        let (peer, chan) = (self.link.peer, self.link.chan);
        let fail = |what: &str, e| {
            Error::from(e).context(format!("{what} on channel {chan} with rank {peer}"))
        };
        let mut moved = false;
        while let Some(step) = self.sends.next(mirror.load(l.tail(self.out))) {
            let bytes = mirror.load(l.size(self.out, step)) as usize;
            if bytes > l.slot_bytes {
                return Err(Error::Internal(format!(
                    "the kernel stored {bytes} bytes into a {}-byte slot for rank {peer}",
                    l.slot_bytes
                )));
            }
            let data = mirror.at(l.slot(self.out, step), bytes);
            // SAFETY: the slot lies in the mirror (`at` checked), which
            // outlives every request (the proxy joins before the areas go);
            // the kernel does not store into it again until `head` passes
            // it, which happens only after this request completes.
            #[allow(unsafe_code)]
            let req = unsafe {
                self.link
                    .send
                    .comm()
                    .isend(data, bytes, 0, Some(self.send_mr))
            }
            .map_err(|e| fail("isend", e))?;
            let Some(req) = req else { break };
            self.send_q.push_back(req);
            self.sends.posted();
            moved = true;
        }
        while let Some(r) = self.send_q.front_mut() {
            if r.test().map_err(|e| fail("send", e))?.is_none() {
                break;
            }
            self.send_q.pop_front();
            mine.store(l.head(self.inc), self.sends.done());
            moved = true;
        }
        while let Some(step) = self.recvs.next(mirror.load(l.head(self.out))) {
            let data = mine.at(l.slot(self.inc, step), l.slot_bytes);
            // SAFETY: the slot lies in the receive area, which outlives the
            // request; the kernel has consumed the step that used it last
            // and reads it again only after `tail` says this one arrived.
            #[allow(unsafe_code)]
            let req = unsafe {
                self.link
                    .recv
                    .comm()
                    .irecv(data, l.slot_bytes, 0, Some(self.recv_mr))
            }
            .map_err(|e| fail("irecv", e))?;
            let Some(req) = req else { break };
            self.recv_q.push_back(req);
            self.recvs.posted();
            moved = true;
        }
        while let Some(r) = self.recv_q.front_mut() {
            if r.test().map_err(|e| fail("receive", e))?.is_none() {
                break;
            }
            self.recv_q.pop_front();
            mine.store(l.tail(self.inc), self.recvs.done());
            moved = true;
        }
        Ok(moved)
    }
}

/// After this long without progress or a launch, the proxy stops spinning
/// and naps between polls (a kernel it has not heard of costs at most one
/// nap of latency).
const SPIN: Duration = Duration::from_millis(20);
const NAP: Duration = Duration::from_micros(200);

/// The proxy thread of one rank's net connections.
pub struct Proxy {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    failed: Arc<Mutex<Option<Error>>>,
}

impl Proxy {
    pub fn start(links: Vec<Link>, areas: Areas) -> Result<Proxy> {
        let driven = links
            .into_iter()
            .map(|l| Driven::new(l, &areas))
            .collect::<Result<Vec<_>>>()?;
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let (s, f) = (stop.clone(), failed.clone());
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-proxy-{}", areas.rank))
            .spawn(move || run(driven, areas, &s, &f))
            .map_err(|e| Error::System(format!("cannot start the proxy thread: {e}")))?;
        Ok(Proxy {
            stop,
            thread: Some(thread),
            failed,
        })
    }

    /// A kernel was launched: poll without napping.
    pub fn kick(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// What ended the proxy, if something did (a peer gone, a plugin error).
    pub fn failure(&self) -> Option<Error> {
        self.failed.lock().ok()?.clone()
    }
}

fn run(mut driven: Vec<Driven>, areas: Areas, stop: &AtomicBool, failed: &Mutex<Option<Error>>) {
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let mut moved = false;
        for d in &mut driven {
            match d.progress(&areas) {
                Ok(m) => moved |= m,
                Err(e) => {
                    tracing::warn!(target: "oxccl::net", "proxy of rank {}: {e}", areas.rank);
                    if let Ok(mut f) = failed.lock() {
                        f.get_or_insert(e);
                    }
                    return;
                }
            }
        }
        if moved {
            last = Instant::now();
        } else if last.elapsed() > SPIN {
            std::thread::park_timeout(NAP);
            // A launch unparks: spin again from here.
            last = Instant::now() - SPIN + NAP;
        } else {
            std::hint::spin_loop();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
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
