//! NCCL's step protocol without the shared memory: a ring of [`STEPS`]
//! slots that one sender fills and one receiver empties, counted by two
//! monotonic counters (the sender's `tail`, the receiver's `head`) on cache
//! lines of their own, so that each end writes only its own line and polls
//! the other's.
//!
//! A message takes one slot per `slot_bytes` (at least one, so that an empty
//! message still arrives); every slot says how many bytes it carries, the
//! message's total and its tag. Messages stay in order. The FIFOs on top
//! queue the requests of one connection and move them front first, as many
//! slots as are ready per call, never waiting.
//!
//! Nothing here maps memory or touches a caller's raw pointer: the slots are
//! reached through [`SlotMem`], which the tests implement on the heap and
//! the transport on the mapped segment.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// Slots of a ring (NCCL's `NCCL_STEPS`).
pub const STEPS: usize = 8;

/// Written by the creator once the segment is laid out; the other end
/// refuses anything else (a stale or foreign segment of the same name).
const MAGIC: u64 = 0x6f78_6363_6c73_686d; // "oxcclshm"

/// The sender has mapped the segment (and removed its name).
const SENDER_MAPPED: u32 = 1;
const RECV_CLOSED: u32 = 2;
const SEND_CLOSED: u32 = 4;

/// Counters of the two ends sit on separate lines: 128 bytes, since
/// x86's adjacent-line prefetcher pairs 64-byte lines (NCCL pads to 128 too).
#[derive(Default)]
#[repr(C, align(128))]
struct Line<T>(T);

#[derive(Default)]
#[repr(C)]
struct Header {
    magic: AtomicU64,
    slot_bytes: AtomicU64,
    flags: AtomicU32,
}

/// One slot's framing, written by the sender before it moves `tail` past
/// the slot (Release) and read by the receiver after it sees that (Acquire).
#[derive(Default)]
#[repr(C)]
struct SlotInfo {
    bytes: AtomicU32,
    tag: AtomicI32,
    total: AtomicU64,
}

/// The control block at the start of a ring's memory. All atomics, valid
/// for any bit pattern, so that zeroed shared memory is one.
#[derive(Default)]
#[repr(C)]
pub struct Control {
    header: Line<Header>,
    tail: Line<AtomicU64>,
    head: Line<AtomicU64>,
    fifo: Line<[SlotInfo; STEPS]>,
}

/// Bytes the control block takes in front of the slots.
pub const CONTROL_BYTES: usize = std::mem::size_of::<Control>();
const _: () = assert!(CONTROL_BYTES == 4 * 128);

/// Which end of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Send,
    Recv,
}

impl End {
    fn closed_bit(self) -> u32 {
        match self {
            End::Send => SEND_CLOSED,
            End::Recv => RECV_CLOSED,
        }
    }

    pub fn other(self) -> End {
        match self {
            End::Send => End::Recv,
            End::Recv => End::Send,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            End::Send => "sender",
            End::Recv => "receiver",
        }
    }
}

impl Control {
    /// Lays out a ring of `slot_bytes`-byte slots (the creator, on zeroed memory).
    pub fn init(&self, slot_bytes: usize) {
        self.header
            .0
            .slot_bytes
            .store(slot_bytes as u64, Ordering::Relaxed);
        self.header.0.magic.store(MAGIC, Ordering::Release);
    }

    /// The slot size the creator laid out, or `None` if it laid out nothing.
    pub fn slot_bytes(&self) -> Option<usize> {
        (self.header.0.magic.load(Ordering::Acquire) == MAGIC)
            .then(|| self.header.0.slot_bytes.load(Ordering::Relaxed) as usize)
    }

    pub fn mark_sender_mapped(&self) {
        self.header
            .0
            .flags
            .fetch_or(SENDER_MAPPED, Ordering::Release);
    }

    pub fn sender_mapped(&self) -> bool {
        self.header.0.flags.load(Ordering::Acquire) & SENDER_MAPPED != 0
    }

    /// This end goes away: the other end's next call that needs it fails.
    pub fn close(&self, end: End) {
        self.header
            .0
            .flags
            .fetch_or(end.closed_bit(), Ordering::Release);
    }

    fn closed(&self, end: End) -> bool {
        self.header.0.flags.load(Ordering::Acquire) & end.closed_bit() != 0
    }
}

/// The bytes of a ring's slots, shared by its two ends.
pub trait SlotMem {
    /// Copies `src` to the start of slot `i`.
    fn put(&self, i: usize, src: &[u8]);
    /// Copies the start of slot `i` into `dst`.
    fn get(&self, i: usize, dst: &mut [u8]);
}

/// Why a ring cannot go on. A ring that failed stays failed: its order of
/// messages is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The other end closed (or failed) before the message got through.
    Closed(End),
    /// The other end's process died without closing.
    Gone(End),
    /// A message larger than the receive posted for it.
    Truncated {
        sent: usize,
        room: usize,
    },
    TagMismatch {
        sent: i32,
        posted: i32,
    },
    /// A slot says something no sender writes: memory overwritten by a
    /// third party, or ends of different builds.
    Corrupt(String),
    /// A request was dropped in the middle of its message.
    Abandoned,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Closed(end) => write!(
                f,
                "shared-memory connection closed by peer (the {} went away)",
                end.name()
            ),
            RingError::Gone(end) => write!(
                f,
                "shared-memory connection lost: the {}'s process exited or was killed",
                end.name()
            ),
            RingError::Truncated { sent, room } => write!(
                f,
                "message truncated: the peer sent {sent} bytes, receive posted for {room}"
            ),
            RingError::TagMismatch { sent, posted } => write!(
                f,
                "message has tag {sent}, the receive posted in its place has tag {posted}"
            ),
            RingError::Corrupt(why) => write!(f, "shared-memory ring corrupt: {why}"),
            RingError::Abandoned => write!(
                f,
                "a request was dropped before it completed; the connection's message order is lost"
            ),
        }
    }
}

fn slots_for(len: usize, slot_bytes: usize) -> usize {
    len.div_ceil(slot_bytes).max(1)
}

/// The sending end's view: how far it has published, and the last `head`
/// it read (reloaded only when the ring looks full).
#[derive(Debug)]
pub struct Sender {
    slot_bytes: usize,
    tail: u64,
    head_seen: u64,
}

impl Sender {
    pub fn new(slot_bytes: usize) -> Sender {
        Sender {
            slot_bytes: slot_bytes.max(1),
            tail: 0,
            head_seen: 0,
        }
    }

    /// Moves `msg` into free slots from its slot `*sent` on; true once all
    /// of it is in the ring.
    fn push(
        &mut self,
        ctl: &Control,
        mem: &impl SlotMem,
        msg: &[u8],
        tag: i32,
        sent: &mut usize,
    ) -> Result<bool, RingError> {
        if ctl.closed(End::Recv) {
            return Err(RingError::Closed(End::Recv));
        }
        let need = slots_for(msg.len(), self.slot_bytes);
        while *sent < need {
            if self.tail - self.head_seen >= STEPS as u64 {
                self.head_seen = ctl.head.0.load(Ordering::Acquire);
                if self.tail - self.head_seen >= STEPS as u64 {
                    return Ok(false);
                }
            }
            let i = (self.tail % STEPS as u64) as usize;
            let off = *sent * self.slot_bytes;
            let n = (msg.len() - off).min(self.slot_bytes);
            mem.put(i, &msg[off..off + n]);
            let info = &ctl.fifo.0[i];
            info.bytes.store(n as u32, Ordering::Relaxed);
            info.tag.store(tag, Ordering::Relaxed);
            info.total.store(msg.len() as u64, Ordering::Relaxed);
            self.tail += 1;
            ctl.tail.0.store(self.tail, Ordering::Release);
            *sent += 1;
        }
        Ok(true)
    }
}

/// How much of one incoming message has arrived.
#[derive(Debug, Default, Clone, Copy)]
struct Incoming {
    slots: usize,
    bytes: usize,
    total: usize,
}

/// The receiving end's view: how far it has consumed, and the last `tail`
/// it read (reloaded only when the ring looks empty).
#[derive(Debug)]
pub struct Receiver {
    slot_bytes: usize,
    head: u64,
    tail_seen: u64,
}

impl Receiver {
    pub fn new(slot_bytes: usize) -> Receiver {
        Receiver {
            slot_bytes: slot_bytes.max(1),
            head: 0,
            tail_seen: 0,
        }
    }

    /// Copies the next message's ready slots into `buf`; its size once all
    /// of it has arrived.
    fn pull(
        &mut self,
        ctl: &Control,
        mem: &impl SlotMem,
        buf: &mut [u8],
        tag: i32,
        got: &mut Incoming,
    ) -> Result<Option<usize>, RingError> {
        loop {
            if self.head == self.tail_seen {
                self.tail_seen = ctl.tail.0.load(Ordering::Acquire);
                if self.head == self.tail_seen {
                    // Closed after its last slot: look at the tail once more
                    // after the flag, or a last slot could be missed.
                    if ctl.closed(End::Send) && ctl.tail.0.load(Ordering::Acquire) == self.head {
                        return Err(RingError::Closed(End::Send));
                    }
                    return Ok(None);
                }
            }
            let i = (self.head % STEPS as u64) as usize;
            let info = &ctl.fifo.0[i];
            let bytes = info.bytes.load(Ordering::Relaxed) as usize;
            let sent_tag = info.tag.load(Ordering::Relaxed);
            let total = usize::try_from(info.total.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
            if sent_tag != tag {
                return Err(RingError::TagMismatch {
                    sent: sent_tag,
                    posted: tag,
                });
            }
            if got.slots == 0 {
                if total > buf.len() {
                    return Err(RingError::Truncated {
                        sent: total,
                        room: buf.len(),
                    });
                }
                got.total = total;
            } else if total != got.total {
                return Err(RingError::Corrupt(format!(
                    "slot {} of a {}-byte message says {total} bytes",
                    got.slots, got.total
                )));
            }
            if bytes > self.slot_bytes || got.bytes + bytes > total {
                return Err(RingError::Corrupt(format!(
                    "slot of {bytes} bytes at byte {} of a {total}-byte message ({}-byte slots)",
                    got.bytes, self.slot_bytes
                )));
            }
            mem.get(i, &mut buf[got.bytes..got.bytes + bytes]);
            self.head += 1;
            ctl.head.0.store(self.head, Ordering::Release);
            got.bytes += bytes;
            got.slots += 1;
            if got.bytes == total {
                return Ok(Some(total));
            }
        }
    }
}

/// An outstanding request's number, in posting order.
pub type Id = u64;

/// The sends of one connection, moved in order.
pub struct SendFifo<B> {
    end: Sender,
    /// Posted, not yet wholly in the ring: (buffer, tag, slots written).
    queue: VecDeque<(B, i32, usize)>,
    posted: Id,
    /// Requests below this number are done.
    done: Id,
    failed: Option<RingError>,
}

impl<B: AsRef<[u8]>> SendFifo<B> {
    pub fn new(end: Sender) -> SendFifo<B> {
        SendFifo {
            end,
            queue: VecDeque::new(),
            posted: 0,
            done: 0,
            failed: None,
        }
    }

    pub fn post(&mut self, buf: B, tag: i32) -> Id {
        self.queue.push_back((buf, tag, 0));
        self.posted += 1;
        self.posted - 1
    }

    /// Moves queued sends, front first, as far as the ring has room;
    /// returns whether any slot moved.
    pub fn progress(&mut self, ctl: &Control, mem: &impl SlotMem) -> Result<bool, RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut moved = false;
        while let Some((buf, tag, sent)) = self.queue.front_mut() {
            let before = *sent;
            let r = self.end.push(ctl, mem, buf.as_ref(), *tag, sent);
            moved |= *sent != before;
            match r {
                Ok(true) => {
                    self.queue.pop_front();
                    self.done += 1;
                }
                Ok(false) => break,
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(moved)
    }

    pub fn is_done(&self, id: Id) -> bool {
        id < self.done
    }

    /// Stops using every queued buffer; later calls fail with `e`.
    pub fn fail(&mut self, e: RingError) -> RingError {
        self.queue.clear();
        self.failed.get_or_insert(e).clone()
    }

    /// Why the FIFO stopped, if it did.
    pub fn failure(&self) -> Option<&RingError> {
        self.failed.as_ref()
    }
}

/// The receives of one connection, filled in order.
pub struct RecvFifo<B> {
    end: Receiver,
    /// Posted, not yet complete: (id, buffer, tag, progress).
    queue: VecDeque<(Id, B, i32, Incoming)>,
    posted: Id,
    /// Completed and not yet collected: (id, size, buffer).
    finished: VecDeque<(Id, usize, B)>,
    failed: Option<RingError>,
}

impl<B: AsMut<[u8]>> RecvFifo<B> {
    pub fn new(end: Receiver) -> RecvFifo<B> {
        RecvFifo {
            end,
            queue: VecDeque::new(),
            posted: 0,
            finished: VecDeque::new(),
            failed: None,
        }
    }

    pub fn post(&mut self, buf: B, tag: i32) -> Id {
        let id = self.posted;
        self.queue.push_back((id, buf, tag, Incoming::default()));
        self.posted += 1;
        id
    }

    /// Fills queued receives, front first, from the slots that have
    /// arrived; returns whether any slot moved.
    pub fn progress(&mut self, ctl: &Control, mem: &impl SlotMem) -> Result<bool, RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut moved = false;
        while let Some((_, buf, tag, got)) = self.queue.front_mut() {
            let before = got.slots;
            let r = self.end.pull(ctl, mem, buf.as_mut(), *tag, got);
            moved |= got.slots != before;
            match r {
                Ok(Some(size)) => {
                    let (id, buf, ..) = self.queue.pop_front().expect("front exists");
                    self.finished.push_back((id, size, buf));
                }
                Ok(None) => break,
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(moved)
    }

    /// The size received by `id` and its buffer, once (later calls: `None`).
    pub fn take(&mut self, id: Id) -> Option<(usize, B)> {
        let at = self.finished.iter().position(|(i, ..)| *i == id)?;
        self.finished.remove(at).map(|(_, size, buf)| (size, buf))
    }

    /// Whether `id` is still queued (neither complete nor failed).
    pub fn is_pending(&self, id: Id) -> bool {
        self.queue.iter().any(|(i, ..)| *i == id)
    }

    /// Stops using every queued buffer; later calls fail with `e`.
    pub fn fail(&mut self, e: RingError) -> RingError {
        self.queue.clear();
        self.failed.get_or_insert(e).clone()
    }

    /// Why the FIFO stopped, if it did.
    pub fn failure(&self) -> Option<&RingError> {
        self.failed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::sync::{Arc, Mutex};

    const SLOT: usize = 64;

    /// Slots on the heap, standing in for the mapped segment.
    struct Heap(Vec<Mutex<Vec<u8>>>);

    impl SlotMem for Heap {
        fn put(&self, i: usize, src: &[u8]) {
            self.0[i].lock().unwrap()[..src.len()].copy_from_slice(src);
        }
        fn get(&self, i: usize, dst: &mut [u8]) {
            dst.copy_from_slice(&self.0[i].lock().unwrap()[..dst.len()]);
        }
    }

    struct Ring {
        ctl: Control,
        mem: Heap,
    }

    fn ring() -> Ring {
        let ctl = Control::default();
        ctl.init(SLOT);
        Ring {
            ctl,
            mem: Heap((0..STEPS).map(|_| Mutex::new(vec![0xee; SLOT])).collect()),
        }
    }

    fn ends(r: &Ring) -> (SendFifo<Vec<u8>>, RecvFifo<Vec<u8>>) {
        let sb = r.ctl.slot_bytes().expect("laid out");
        (
            SendFifo::new(Sender::new(sb)),
            RecvFifo::new(Receiver::new(sb)),
        )
    }

    fn random(rng: &mut impl Rng, n: usize) -> Vec<u8> {
        (0..n).map(|_| rng.random()).collect()
    }

    /// Poisoned receive buffer of `n` bytes.
    fn poisoned(n: usize) -> Vec<u8> {
        vec![0xaa; n]
    }

    #[test]
    fn a_message_spans_slots_and_arrives_whole() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let lens = [0, 1, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT + 7, STEPS * SLOT];
        for len in lens {
            let r = ring();
            let (mut tx, mut rx) = ends(&r);
            let msg = random(&mut rng, len);
            let s = tx.post(msg.clone(), 3);
            let q = rx.post(poisoned(len + 10), 3);
            tx.progress(&r.ctl, &r.mem).unwrap();
            assert!(tx.is_done(s), "{len} bytes fit in an empty ring at once");
            rx.progress(&r.ctl, &r.mem).unwrap();
            let (size, buf) = rx.take(q).expect("arrived");
            assert_eq!(size, len);
            assert_eq!(&buf[..len], &msg[..], "{len} bytes");
            assert!(
                buf[len..].iter().all(|b| *b == 0xaa),
                "wrote past the message"
            );
            assert_eq!(rx.take(q), None, "a completion is collected once");
        }
    }

    #[test]
    fn a_message_larger_than_the_ring_flows_as_the_receiver_drains() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let r = ring();
        let (mut tx, mut rx) = ends(&r);
        let len = 5 * STEPS * SLOT + 13;
        let msg = random(&mut rng, len);
        let s = tx.post(msg.clone(), 0);
        let q = rx.post(poisoned(len), 0);
        tx.progress(&r.ctl, &r.mem).unwrap();
        assert!(!tx.is_done(s), "the ring holds only {STEPS} slots");
        // The sender alone makes no more room.
        assert!(!tx.progress(&r.ctl, &r.mem).unwrap());
        let mut rounds = 0;
        let got = loop {
            rx.progress(&r.ctl, &r.mem).unwrap();
            if let Some(got) = rx.take(q) {
                break got;
            }
            tx.progress(&r.ctl, &r.mem).unwrap();
            rounds += 1;
            assert!(rounds < 100, "no progress");
        };
        assert!(tx.is_done(s));
        assert_eq!(got.0, len);
        assert_eq!(got.1, msg);
    }

    /// Many messages of random sizes, the two ends advancing in random
    /// turns: the counters wrap the ring many times; every message arrives
    /// whole and in order.
    #[test]
    fn wraparound_keeps_order_and_bytes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let r = ring();
        let (mut tx, mut rx) = ends(&r);
        let msgs: Vec<Vec<u8>> = (0..300)
            .map(|_| {
                let n = rng.random_range(0..3 * SLOT + 5);
                random(&mut rng, n)
            })
            .collect();
        let sends: Vec<Id> = msgs.iter().map(|m| tx.post(m.clone(), 1)).collect();
        let mut recvs = Vec::new();
        let mut next = 0;
        let mut got: Vec<Option<(usize, Vec<u8>)>> = vec![None; msgs.len()];
        for _ in 0..100_000 {
            // Receives are posted a few at a time, as the executor posts ahead.
            while next < msgs.len() && recvs.len() - got.iter().filter(|g| g.is_some()).count() < 3
            {
                recvs.push(rx.post(poisoned(msgs[next].len() + rng.random_range(0..4)), 1));
                next += 1;
            }
            if rng.random_bool(0.5) {
                tx.progress(&r.ctl, &r.mem).unwrap();
            } else {
                rx.progress(&r.ctl, &r.mem).unwrap();
            }
            for (k, id) in recvs.iter().enumerate() {
                if got[k].is_none() {
                    got[k] = rx.take(*id);
                }
            }
            if got.iter().all(Option::is_some) {
                break;
            }
        }
        assert!(sends.iter().all(|s| tx.is_done(*s)));
        for (k, m) in msgs.iter().enumerate() {
            let (size, buf) = got[k]
                .as_ref()
                .unwrap_or_else(|| panic!("message {k} lost"));
            assert_eq!(*size, m.len(), "message {k}");
            assert_eq!(&buf[..m.len()], &m[..], "message {k}");
        }
        assert!(r.ctl.tail.0.load(Ordering::Relaxed) > 10 * STEPS as u64);
    }

    #[test]
    fn truncation_names_both_sizes_and_stops_the_ring() {
        let r = ring();
        let (mut tx, mut rx) = ends(&r);
        // Smaller than posted: completes with its own size.
        let _ = tx.post(vec![7; 10], 0);
        let q = rx.post(poisoned(100), 0);
        tx.progress(&r.ctl, &r.mem).unwrap();
        rx.progress(&r.ctl, &r.mem).unwrap();
        assert_eq!(rx.take(q).map(|g| g.0), Some(10));
        // Larger: an error naming both, before any byte lands.
        let _ = tx.post(vec![7; 3 * SLOT], 0);
        let q = rx.post(poisoned(SLOT), 0);
        tx.progress(&r.ctl, &r.mem).unwrap();
        let e = rx.progress(&r.ctl, &r.mem).unwrap_err();
        assert_eq!(
            e,
            RingError::Truncated {
                sent: 3 * SLOT,
                room: SLOT
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("truncated") && text.contains("192") && text.contains("64"),
            "{text}"
        );
        assert!(!rx.is_pending(q));
        assert_eq!(
            rx.progress(&r.ctl, &r.mem).unwrap_err(),
            e,
            "failed for good"
        );
    }

    #[test]
    fn tags_must_match() {
        let r = ring();
        let (mut tx, mut rx) = ends(&r);
        tx.post(vec![1; 4], 11);
        rx.post(poisoned(4), 12);
        tx.progress(&r.ctl, &r.mem).unwrap();
        let e = rx.progress(&r.ctl, &r.mem).unwrap_err();
        assert_eq!(
            e,
            RingError::TagMismatch {
                sent: 11,
                posted: 12
            }
        );
    }

    /// Requests of one connection complete in posting order, whichever is
    /// tested: testing the last moves those before it.
    #[test]
    fn requests_progress_in_fifo_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let r = ring();
        let (mut tx, mut rx) = ends(&r);
        let msgs: Vec<Vec<u8>> = [5, 3 * SLOT, 0, 2 * SLOT + 1, 9]
            .iter()
            .map(|n| random(&mut rng, *n))
            .collect();
        let sends: Vec<Id> = msgs.iter().map(|m| tx.post(m.clone(), 0)).collect();
        let recvs: Vec<Id> = msgs.iter().map(|m| rx.post(poisoned(m.len()), 0)).collect();
        assert_eq!(sends, vec![0, 1, 2, 3, 4]);
        // 1 + 3 + 1 + 3 slots fill the ring; the fifth message waits for room.
        tx.progress(&r.ctl, &r.mem).unwrap();
        assert!(sends[..4].iter().all(|s| tx.is_done(*s)));
        assert!(!tx.is_done(sends[4]));
        rx.progress(&r.ctl, &r.mem).unwrap();
        tx.progress(&r.ctl, &r.mem).unwrap();
        rx.progress(&r.ctl, &r.mem).unwrap();
        for (k, id) in recvs.iter().enumerate().rev() {
            let (size, buf) = rx.take(*id).expect("done");
            assert_eq!(size, msgs[k].len());
            assert_eq!(buf, msgs[k]);
        }
    }

    #[test]
    fn a_closed_peer_is_reported_after_what_it_sent() {
        // The sender closes after two messages: both arrive, then the error.
        let r = ring();
        let (mut tx, mut rx) = ends(&r);
        tx.post(vec![1; 3], 0);
        tx.post(vec![2; SLOT * 2], 0);
        tx.progress(&r.ctl, &r.mem).unwrap();
        r.ctl.close(End::Send);
        let a = rx.post(poisoned(3), 0);
        let b = rx.post(poisoned(SLOT * 2), 0);
        let c = rx.post(poisoned(8), 0);
        let e = rx.progress(&r.ctl, &r.mem).unwrap_err();
        assert_eq!(e, RingError::Closed(End::Send));
        assert!(e.to_string().contains("closed by peer"), "{e}");
        assert_eq!(rx.take(a).map(|g| g.1), Some(vec![1; 3]));
        assert_eq!(rx.take(b).map(|g| g.1), Some(vec![2; SLOT * 2]));
        assert!(rx.take(c).is_none());

        // The receiver closes: the next send fails, even with room.
        let r = ring();
        let (mut tx, _rx) = ends(&r);
        r.ctl.close(End::Recv);
        tx.post(vec![1; 3], 0);
        assert_eq!(
            tx.progress(&r.ctl, &r.mem).unwrap_err(),
            RingError::Closed(End::Recv)
        );
        assert!(tx.failure().is_some());
    }

    /// The two ends on two threads, as in the transport (the slots here
    /// are behind locks, so this checks the counting, not the fences).
    #[test]
    fn two_threads_move_random_messages() {
        let r = Arc::new(ring());
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let msgs: Vec<Vec<u8>> = (0..500)
            .map(|_| {
                let n = rng.random_range(0..4 * SLOT);
                random(&mut rng, n)
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let sender = {
            let (r, msgs) = (r.clone(), msgs.clone());
            std::thread::spawn(move || {
                let (mut tx, _) = ends(&r);
                let ids: Vec<Id> = msgs.into_iter().map(|m| tx.post(m, 0)).collect();
                while !tx.is_done(*ids.last().unwrap()) {
                    tx.progress(&r.ctl, &r.mem).unwrap();
                    assert!(std::time::Instant::now() < deadline);
                    std::thread::yield_now();
                }
            })
        };
        let (_, mut rx) = ends(&r);
        for (k, m) in msgs.iter().enumerate() {
            let id = rx.post(poisoned(4 * SLOT), 0);
            let (size, buf) = loop {
                rx.progress(&r.ctl, &r.mem).unwrap();
                if let Some(g) = rx.take(id) {
                    break g;
                }
                assert!(std::time::Instant::now() < deadline, "message {k}");
                std::thread::yield_now();
            };
            assert_eq!(size, m.len(), "message {k}");
            assert_eq!(&buf[..size], &m[..], "message {k}");
        }
        sender.join().unwrap();
    }
}
