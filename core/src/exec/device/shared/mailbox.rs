//! The host half of the shared-GPU path. Before enqueuing anything, every
//! rank but the leader posts the call it was given and its buffers (as
//! CUDA IPC handles) into its slot of a small POSIX segment; the leader
//! reads every slot, maps the buffers and answers each slot with how this
//! call runs. A slot is read as soon as it is posted: no socket round trip
//! on the way of an 8-byte collective.
//!
//! Send/recv uses two more kinds of slot: per ordered pair of ranks the
//! sender's messages (its buffer, as the receiver and the leader use it),
//! and per receiver a ring of copy requests for the leader's p2p server
//! (`super::server`), each answered by the server in its slot. After them,
//! on pages of their own, the words the server polls (`server_word`):
//! senders' and receivers' streams store them through this process's
//! registration of the segment with CUDA (`server_words`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::transport::shm::area::Area;

use super::records::{Answer, Post, Request, Served, SERVED_BITS};

/// Bytes of one rank's slot for collectives.
pub(crate) const SLOT: usize = 512;
const POSTED: usize = 0;
const ANSWER: usize = 8;
const LEN: usize = 16;
const BODY: usize = 24;

/// Messages a sender may post ahead of its receiver before it waits.
pub(crate) const DEPTH: u64 = 32;
/// Per ordered pair of ranks: the receiver's count of messages taken, then
/// DEPTH slots of (number, length, post).
const PAIR_SLOT: usize = 256;
const PAIR: usize = 64 + DEPTH as usize * PAIR_SLOT;

/// Copy requests a receiver may have posted to the leader's server before
/// it waits for the server to answer the oldest.
pub(crate) const RING: u64 = 16;
/// One request's slot: the number posted (from 1), the server's answer
/// (number << 2 | code), the body's length, then the body (the request,
/// or the server's error message once it answers `Failed`).
const REQ_SLOT: usize = 256;
const REQ_BODY: usize = 24;
const RING_BYTES: usize = RING as usize * REQ_SLOT;
/// The server's doorbell, after the rings: 1 while the server sleeps (or
/// is about to), so that a receiver that posts a request wakes it.
const BELL_BYTES: usize = 64;
/// The server's words start on a page of their own, so that each process
/// registers with CUDA (pins) only them, not the whole segment.
const PAGE: usize = 4096;
/// Bytes of one server word: a stream stores its low 32 bits (the low
/// address, little-endian), the host loads the whole aligned word.
const SRV_WORD: usize = 8;

/// How a wait of the mailbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    Ready,
    TimedOut,
    /// The communicator was told to end its operations (a revoke).
    Stopped,
}

/// Spins briefly, then yields, until `ready`, `deadline`, or `stop`.
fn wait_until(deadline: Instant, stop: &AtomicBool, mut ready: impl FnMut() -> bool) -> Waited {
    let mut spins = 0u32;
    loop {
        if ready() {
            return Waited::Ready;
        }
        spins = spins.wrapping_add(1);
        if spins < 4096 {
            std::hint::spin_loop();
        } else {
            if spins.is_multiple_of(64) {
                if stop.load(Ordering::Acquire) {
                    return Waited::Stopped;
                }
                if Instant::now() >= deadline {
                    return if ready() {
                        Waited::Ready
                    } else {
                        Waited::TimedOut
                    };
                }
            }
            std::thread::yield_now();
        }
    }
}

/// The error of a wait a stop ended.
fn stopped(what: &str) -> Error {
    Error::InvalidUsage(format!(
        "{what}: the communicator was told to end its operations (revoke, abort or NCCL_SHRINK_ABORT) while this rank waited for another"
    ))
}

/// The segment, as one rank sees it.
pub(crate) struct Mailbox {
    area: Area,
    me: usize,
    nranks: usize,
    timeout: Duration,
    /// Raised to end every wait at once (see `DeviceStop`).
    stop: Arc<AtomicBool>,
}

impl Mailbox {
    pub fn new(area: Area, me: usize, nranks: usize, timeout: Duration) -> Mailbox {
        Mailbox {
            area,
            me,
            nranks,
            timeout,
            stop: Arc::default(),
        }
    }

    /// Waits end (with an error) once `stop` is raised.
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Mailbox {
        self.stop = stop;
        self
    }

    pub fn bytes(nranks: usize) -> usize {
        Self::words_at(nranks) + Self::words_len(nranks)
    }

    /// Where the server's words start: two per ordered pair of ranks.
    fn words_at(nranks: usize) -> usize {
        let before = nranks * SLOT + nranks * nranks * PAIR + nranks * RING_BYTES + BELL_BYTES;
        before.next_multiple_of(PAGE)
    }

    fn words_len(nranks: usize) -> usize {
        (2 * nranks * nranks * SRV_WORD).next_multiple_of(PAGE)
    }

    /// The server's words: (offset in the segment, bytes), whole pages;
    /// word `i` (see [`Mailbox::server_word`]) is `SRV_WORD` bytes at
    /// `offset + 8 i`.
    pub fn server_words(&self) -> (usize, usize) {
        (Self::words_at(self.nranks), Self::words_len(self.nranks))
    }

    /// The server's words in this process's mapping of the segment.
    pub fn server_words_ptr(&self) -> *mut u8 {
        let (at, len) = self.server_words();
        self.area.at(at, len)
    }

    /// The server: the value streams last stored into its word `i` (32
    /// bits, compared wrapping).
    pub fn server_word(&self, i: usize) -> u32 {
        let (at, len) = self.server_words();
        debug_assert!(SRV_WORD * i < len, "server word {i} out of range");
        // The low half: what a stream's 32-bit store writes.
        self.area.load(at + SRV_WORD * i) as u32
    }

    /// Stores `v` into server word `i` from the host (tests; a stream
    /// stores them on the GPU).
    #[cfg(test)]
    pub fn set_server_word(&self, i: usize, v: u32) {
        let (at, _) = self.server_words();
        self.area.store(at + SRV_WORD * i, u64::from(v));
    }

    /// Waits until `ready`, at most `limit` (or until a stop): whether it
    /// came, for a wait with somewhere else to go.
    pub fn wait_briefly(&self, limit: Duration, ready: impl FnMut() -> bool) -> bool {
        wait_until(Instant::now() + limit, &self.stop, ready) == Waited::Ready
    }

    /// Waits until `ready`, at most NCCL_TIMEOUT: a stop ends it with the
    /// error of `what` (the wait), the timeout with `late()`.
    fn wait_for(
        &self,
        what: impl FnOnce() -> String,
        late: impl FnOnce() -> String,
        ready: impl FnMut() -> bool,
    ) -> Result<()> {
        match wait_until(Instant::now() + self.timeout, &self.stop, ready) {
            Waited::Ready => Ok(()),
            Waited::Stopped => Err(stopped(&what())),
            Waited::TimedOut => Err(Error::Remote(late())),
        }
    }

    /// The bytes a writer put at `at` with their length at `len_at`, at
    /// most `max` of them (a garbled length reads no further).
    fn read_body(&self, len_at: usize, at: usize, max: usize) -> Vec<u8> {
        let len = (self.area.load(len_at) as usize).min(max);
        let mut body = vec![0; len];
        self.area.read_bytes(at, &mut body);
        body
    }

    /// Rank `r`'s ring of requests for the leader's server.
    fn ring(&self, r: usize) -> usize {
        self.nranks * SLOT + self.nranks * self.nranks * PAIR + r * RING_BYTES
    }

    fn req_slot(&self, r: usize, n: u64) -> usize {
        self.ring(r) + ((n - 1) % RING) as usize * REQ_SLOT
    }

    /// Posts this rank's `n`-th request (from 1) for the leader's server,
    /// once the server has answered the request that had its slot before.
    pub fn post_request(&self, n: u64, req: &Request, leader: usize) -> Result<()> {
        let slot = self.req_slot(self.me, n);
        if n > RING {
            let earlier = n - RING;
            self.wait_for(
                || format!("copy request {n}"),
                || format!(
                    "rank {leader}, whose p2p server copies this GPU's messages, did not answer rank {}'s copy request {earlier} within {:?} (NCCL_TIMEOUT)",
                    self.me, self.timeout
                ),
                || self.area.load(slot + ANSWER) >> SERVED_BITS >= earlier,
            )?;
        }
        let body = req.encode();
        self.area.write_bytes(slot + REQ_BODY, &body);
        self.area.store(slot + LEN, body.len() as u64);
        self.area.store(slot + POSTED, n);
        // The post before the look at the bell, as the server's ring of
        // the bell comes before its last look at the rings (`doze`): one
        // of the two sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.area.load(self.bell()) != 0 {
            self.area.store(self.bell(), 0);
            self.area.wake(self.bell());
        }
        Ok(())
    }

    fn bell(&self) -> usize {
        self.ring(self.nranks)
    }

    /// The server, idle: marks itself asleep, then, where `more` (a last
    /// look at the rings) finds nothing, sleeps until a receiver posts a
    /// request, [`Mailbox::wake_server`], or `timeout`. Returns what
    /// `more` returned.
    pub fn doze(&self, timeout: Duration, more: impl FnOnce() -> bool) -> bool {
        self.area.store(self.bell(), 1);
        std::sync::atomic::fence(Ordering::SeqCst);
        let found = more();
        if !found {
            self.area.sleep_while(self.bell(), 1, timeout);
        }
        self.area.store(self.bell(), 0);
        found
    }

    /// Ends the server's sleep at once (it is being stopped).
    pub fn wake_server(&self) {
        self.area.store(self.bell(), 0);
        self.area.wake(self.bell());
    }

    /// The server: rank `r`'s `n`-th request, if it has posted it.
    pub fn poll_request(&self, r: usize, n: u64) -> Option<Result<Request>> {
        let slot = self.req_slot(r, n);
        if self.area.load(slot + POSTED) != n {
            return None;
        }
        let body = self.read_body(slot + LEN, slot + REQ_BODY, REQ_SLOT - REQ_BODY);
        Some(
            Request::decode(&body)
                .ok_or_else(|| Error::Internal(format!("rank {r}'s copy request {n} is garbled"))),
        )
    }

    /// The server answers rank `r`'s `n`-th request; the slot is the
    /// receiver's again.
    pub fn answer_request(&self, r: usize, n: u64, a: &Served) {
        let slot = self.req_slot(r, n);
        if let Served::Failed(msg) = a {
            let msg = msg.as_bytes();
            let msg = &msg[..msg.len().min(REQ_SLOT - REQ_BODY)];
            self.area.write_bytes(slot + REQ_BODY, msg);
            self.area.store(slot + LEN, msg.len() as u64);
        }
        self.area.store(slot + ANSWER, n << SERVED_BITS | a.code());
    }

    /// The server's answer to this rank's `n`-th request.
    pub fn wait_served(&self, n: u64, leader: usize, mine: &str) -> Result<Served> {
        let slot = self.req_slot(self.me, n);
        self.wait_for(
            || format!("copy request {n} ({mine})"),
            || format!(
                "rank {leader}, whose p2p server copies this GPU's messages, did not answer rank {}'s copy request {n} ({mine}) within {:?} (NCCL_TIMEOUT)",
                self.me, self.timeout
            ),
            || self.area.load(slot + ANSWER) >> SERVED_BITS == n,
        )?;
        Ok(
            match self.area.load(slot + ANSWER) & ((1 << SERVED_BITS) - 1) {
                1 => Served::Copied,
                2 => Served::Pull,
                4 => Served::Pushed,
                _ => {
                    let msg = self.read_body(slot + LEN, slot + REQ_BODY, REQ_SLOT - REQ_BODY);
                    Served::Failed(String::from_utf8_lossy(&msg).into_owned())
                }
            },
        )
    }

    fn pair(&self, from: usize, to: usize) -> usize {
        self.nranks * SLOT + (from * self.nranks + to) * PAIR
    }

    /// Posts this rank's `k`-th message (from 1) to rank `to`, once `to`
    /// has taken all but DEPTH of the earlier ones. `addr`: the buffer's
    /// address in this process, for the leader's server when this is the
    /// leader.
    pub fn post_send(&self, to: usize, k: u64, post: &Post, addr: u64) -> Result<()> {
        let at = self.pair(self.me, to);
        self.wait_for(
            || format!("send {k} to rank {to}"),
            || format!(
                "rank {to} has not received this rank's messages {}..{k} within {:?} (NCCL_TIMEOUT): it died, hangs, or receives fewer than rank {} sends",
                self.area.load(at) + 1,
                self.timeout,
                self.me
            ),
            || self.area.load(at) + DEPTH >= k,
        )?;
        let slot = at + 64 + ((k - 1) % DEPTH) as usize * PAIR_SLOT;
        let mut body = addr.to_le_bytes().to_vec();
        body.extend(post.encode(PAIR_SLOT - 24));
        self.area.write_bytes(slot + 16, &body);
        self.area.store(slot + 8, body.len() as u64);
        self.area.store(slot, k);
        Ok(())
    }

    /// Rank `from`'s `k`-th message to this rank, and the address it gave.
    pub fn wait_send(&self, from: usize, k: u64, mine: &str) -> Result<(Post, u64)> {
        let at = self.pair(from, self.me);
        let slot = at + 64 + ((k - 1) % DEPTH) as usize * PAIR_SLOT;
        self.wait_for(
            || format!("receive {k} from rank {from}"),
            || format!(
                "rank {from} did not send message {k} to rank {} ({mine}) within {:?} (NCCL_TIMEOUT): it died, hangs, or sends fewer than this rank receives",
                self.me, self.timeout
            ),
            || self.area.load(slot) == k,
        )?;
        let body = self.read_body(slot + 8, slot + 16, PAIR_SLOT - 16);
        self.area.store(at, k);
        let garbled = || Error::Internal(format!("rank {from}'s message {k} is garbled"));
        let addr = u64::from_le_bytes(
            body.get(..8)
                .ok_or_else(garbled)?
                .try_into()
                .map_err(|_| garbled())?,
        );
        Ok((Post::decode(&body[8..]).ok_or_else(garbled)?, addr))
    }

    #[cfg(test)]
    pub fn area(&self) -> &Area {
        &self.area
    }

    /// Posts this rank's call number `seq`. The leader has answered the
    /// previous one, so it is done reading the slot.
    pub fn post(&self, seq: u64, post: &Post) {
        let at = self.me * SLOT;
        let body = post.encode(SLOT - BODY);
        self.area.write_bytes(at + BODY, &body);
        self.area.store(at + LEN, body.len() as u64);
        self.area.store(at + POSTED, seq);
    }

    /// The leader: rank `r`'s post for call `seq`.
    pub fn wait_post(&self, r: usize, seq: u64, mine: &str) -> Result<Post> {
        let at = r * SLOT;
        self.wait_for(
            || format!("collective #{seq}"),
            || format!(
                "rank {r} did not call collective #{seq} ({mine}) within {:?} (NCCL_TIMEOUT): it died, hangs, or called fewer collectives than rank {}",
                self.timeout, self.me
            ),
            || self.area.load(at + POSTED) == seq,
        )?;
        let body = self.read_body(at + LEN, at + BODY, SLOT - BODY);
        Post::decode(&body).ok_or_else(|| {
            Error::Internal(format!("rank {r}'s post for collective #{seq} is garbled"))
        })
    }

    /// The leader answers rank `r`'s call `seq`.
    pub fn answer(&self, r: usize, seq: u64, a: Answer) {
        self.area.store(r * SLOT + ANSWER, seq << 2 | a.code());
    }

    /// This rank's answer for call `seq`, from `leader`.
    pub fn wait_answer(&self, seq: u64, leader: usize, mine: &str) -> Result<Answer> {
        let at = self.me * SLOT + ANSWER;
        self.wait_for(
            || format!("collective #{seq}"),
            || format!(
                "rank {leader}, which runs this GPU's collectives, did not answer collective #{seq} ({mine}) within {:?} (NCCL_TIMEOUT)",
                self.timeout
            ),
            || self.area.load(at) >> 2 == seq,
        )?;
        Ok(match self.area.load(at) & 3 {
            1 => Answer::Direct,
            2 => Answer::Kernels,
            _ => Answer::Mismatch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::records::Buf;
    use super::*;
    use crate::cuda::ipc::Exported;
    use crate::cuda::IpcMemHandle;

    fn post(what: &str) -> Post {
        Post {
            what: what.into(),
            capturing: false,
            send: Buf::Shared(Exported {
                handle: IpcMemHandle([7; 64]),
                offset: 4096,
                id: 17,
            }),
            recv: Buf::Private,
        }
    }

    #[test]
    fn posts_survive_the_slot() {
        for p in [
            post("all_reduce of 2 x Float (Sum)"),
            Post {
                what: String::new(),
                capturing: true,
                send: Buf::Unused,
                recv: Buf::Shared(Exported {
                    handle: IpcMemHandle([255; 64]),
                    offset: u64::MAX,
                    id: u64::MAX - 1,
                }),
            },
            post(&"x".repeat(1000)),
        ] {
            let b = p.encode(SLOT - BODY);
            assert!(b.len() <= SLOT - BODY);
            let back = Post::decode(&b).unwrap();
            assert_eq!(back.send, p.send);
            assert_eq!(back.recv, p.recv);
            assert!(p.what.starts_with(&back.what));
        }
        assert_eq!(Post::decode(&[0, 9]), None);
    }

    #[test]
    fn a_call_goes_and_its_answer_comes_back() {
        // Two mappings of one segment stand for the two processes.
        let name = format!("/oxccl-test-mailbox-{}", std::process::id());
        let leader = Mailbox::new(
            Area::create_shared(&name, Mailbox::bytes(2)).unwrap(),
            0,
            2,
            Duration::from_secs(5),
        );
        let view = Area::open_shared(&name, Mailbox::bytes(2)).unwrap();
        leader.area().unlink();
        let other = std::thread::spawn(move || {
            let mb = Mailbox::new(view, 1, 2, Duration::from_secs(5));
            mb.post(1, &post("all_reduce"));
            let a = mb.wait_answer(1, 0, "all_reduce").unwrap();
            mb.post(2, &post("broadcast"));
            (a, mb.wait_answer(2, 0, "broadcast").unwrap())
        });
        let p = leader.wait_post(1, 1, "all_reduce").unwrap();
        assert_eq!(p.what, "all_reduce");
        leader.answer(1, 1, Answer::Direct);
        let p = leader.wait_post(1, 2, "broadcast").unwrap();
        assert_eq!(p.what, "broadcast");
        leader.answer(1, 2, Answer::Kernels);
        assert_eq!(other.join().unwrap(), (Answer::Direct, Answer::Kernels));
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let area = Area::private(Mailbox::bytes(3)).unwrap();
        let mb = Mailbox::new(area, 0, 3, Duration::from_millis(50));
        let e = mb.wait_post(2, 1, "all_gather").unwrap_err();
        let m = e.message();
        assert!(
            m.contains("rank 2 did not call collective #1 (all_gather)"),
            "{e}"
        );
        let e = mb.wait_send(1, 1, "recv").unwrap_err();
        assert!(
            e.message()
                .contains("rank 1 did not send message 1 to rank 0"),
            "{e}"
        );
    }

    #[test]
    fn a_stop_ends_every_wait_long_before_the_timeout() {
        let area = Area::private(Mailbox::bytes(3)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mb = Mailbox::new(area, 0, 3, Duration::from_secs(600)).with_stop(stop.clone());
        let raise = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                stop.store(true, Ordering::Release);
            })
        };
        let start = Instant::now();
        let e = mb.wait_post(2, 1, "all_gather").unwrap_err();
        raise.join().unwrap();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
        assert!(e.message().contains("told to end its operations"), "{e}");
        // Every kind of wait sees it (it stays raised).
        assert!(mb.wait_answer(1, 0, "x").is_err());
        assert!(mb.wait_send(1, 1, "recv").is_err());
        for k in 1..=DEPTH {
            mb.post_send(1, k, &post("m"), 0).unwrap();
        }
        let e = mb.post_send(1, DEPTH + 1, &post("m"), 0).unwrap_err();
        assert!(e.message().contains("told to end"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn messages_queue_up_to_the_depth_and_wait_beyond() {
        // One area, seen in turn as the sender (rank 0) and the receiver.
        let area = Area::private(Mailbox::bytes(2)).unwrap();
        let send = Mailbox::new(area, 0, 2, Duration::from_millis(50));
        for k in 1..=DEPTH {
            send.post_send(1, k, &post(&format!("m{k}")), k).unwrap();
        }
        let e = send.post_send(1, DEPTH + 1, &post("over"), 0).unwrap_err();
        assert!(e.message().contains("rank 1 has not received"), "{e}");
        let recv = Mailbox { me: 1, ..send };
        for k in 1..=3 {
            let (p, addr) = recv.wait_send(0, k, "recv").unwrap();
            assert_eq!((p.what, addr), (format!("m{k}"), k));
        }
        let send = Mailbox { me: 0, ..recv };
        send.post_send(1, DEPTH + 1, &post("after"), u64::MAX)
            .unwrap();
        let recv = Mailbox { me: 1, ..send };
        for k in 4..=DEPTH {
            recv.wait_send(0, k, "recv").unwrap();
        }
        let (p, addr) = recv.wait_send(0, DEPTH + 1, "recv").unwrap();
        assert_eq!((p.what.as_str(), addr), ("after", u64::MAX));
    }

    fn request(from: usize, k: u64) -> Request {
        Request {
            from,
            k,
            bytes: k.wrapping_mul(8),
            src: Exported {
                handle: IpcMemHandle([from as u8; 64]),
                offset: k,
                id: 3,
            },
            dst: Some(Exported {
                handle: IpcMemHandle([9; 64]),
                offset: 0,
                id: u64::MAX,
            }),
        }
    }

    #[test]
    fn requests_survive_the_slot() {
        let mut rs = vec![request(3, 1)];
        rs.push(Request {
            dst: None,
            ..request(0, u64::MAX)
        });
        for r in rs {
            let b = r.encode();
            assert!(b.len() <= REQ_SLOT - REQ_BODY, "{} bytes", b.len());
            assert_eq!(Request::decode(&b), Some(r));
            // Cut short, or with bytes left over: refused, never guessed.
            assert_eq!(Request::decode(&b[..b.len() - 1]), None);
            let mut long = b.clone();
            long.push(0);
            assert_eq!(Request::decode(&long), None);
        }
        // After the three words and the source's handle, offset and id.
        let mut bad = request(1, 1).encode();
        bad[24 + 64 + 16] = 7;
        assert_eq!(Request::decode(&bad), None, "an unknown destination tag");
    }

    #[test]
    fn requests_wrap_around_the_ring_and_each_gets_its_answer() {
        let name = format!("/oxccl-test-ring-{}", std::process::id());
        let server = Mailbox::new(
            Area::create_shared(&name, Mailbox::bytes(3)).unwrap(),
            0,
            3,
            Duration::from_secs(10),
        );
        let view = Area::open_shared(&name, Mailbox::bytes(3)).unwrap();
        server.area().unlink();
        let total = 3 * RING + 5;
        let receiver = std::thread::spawn(move || {
            let mb = Mailbox::new(view, 2, 3, Duration::from_secs(10));
            // Posts run ahead of the answers by up to a ring.
            let mut answers = Vec::new();
            let mut asked = 0;
            for n in 1..=total {
                mb.post_request(n, &request(1, n), 0).unwrap();
                if n - asked == RING {
                    asked += 1;
                    answers.push(mb.wait_served(asked, 0, "recv").unwrap());
                }
            }
            for n in asked + 1..=total {
                answers.push(mb.wait_served(n, 0, "recv").unwrap());
            }
            answers
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut n = 1;
        while n <= total {
            assert!(Instant::now() < deadline, "request {n} never came");
            assert!(server.poll_request(1, n).is_none(), "rank 1 posted nothing");
            let Some(r) = server.poll_request(2, n) else {
                std::thread::yield_now();
                continue;
            };
            assert_eq!(r.unwrap(), request(1, n));
            let a = match n % 3 {
                0 => Served::Copied,
                1 => Served::Pull,
                _ => Served::Failed(format!("no mapping for {n}")),
            };
            server.answer_request(2, n, &a);
            n += 1;
        }
        let answers = receiver.join().unwrap();
        assert_eq!(answers.len() as u64, total);
        for (i, a) in answers.iter().enumerate() {
            let n = i as u64 + 1;
            match n % 3 {
                0 => assert_eq!(*a, Served::Copied),
                1 => assert_eq!(*a, Served::Pull),
                _ => assert_eq!(*a, Served::Failed(format!("no mapping for {n}"))),
            }
        }
    }

    #[test]
    fn a_request_wakes_the_sleeping_server_and_a_stop_does_too() {
        let name = format!("/oxccl-test-bell-{}", std::process::id());
        let server = Mailbox::new(
            Area::create_shared(&name, Mailbox::bytes(2)).unwrap(),
            0,
            2,
            Duration::from_secs(10),
        );
        let view = Area::open_shared(&name, Mailbox::bytes(2)).unwrap();
        server.area().unlink();
        // Nothing posted: the server sleeps its whole timeout.
        let t = Instant::now();
        assert!(!server.doze(Duration::from_millis(30), || false));
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "{:?}",
            t.elapsed()
        );
        // A request posted (through the other mapping) while it sleeps
        // ends the sleep long before its 20 s timeout.
        let receiver = std::thread::spawn(move || {
            let mb = Mailbox::new(view, 1, 2, Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(100));
            mb.post_request(1, &request(0, 1), 0).unwrap();
            mb
        });
        // Posted before or after the server dozes off, either way the
        // request ends the sleep (the bell's protocol).
        let t = Instant::now();
        server.doze(Duration::from_secs(20), || {
            server.poll_request(1, 1).is_some()
        });
        let slept = t.elapsed();
        assert!(
            server.poll_request(1, 1).is_some(),
            "woken with the request there"
        );
        assert!(slept < Duration::from_secs(5), "woken after {slept:?}");
        let receiver = receiver.join().unwrap();
        // A request already there when the server dozes off: no sleep.
        receiver.post_request(2, &request(0, 2), 0).unwrap();
        let t = Instant::now();
        assert!(server.doze(Duration::from_secs(20), || server
            .poll_request(1, 2)
            .is_some()));
        assert!(t.elapsed() < Duration::from_secs(1));
        // wake_server (a stop) ends the sleep too.
        let server = std::sync::Arc::new(server);
        let s2 = server.clone();
        let sleeper = std::thread::spawn(move || {
            let t = Instant::now();
            s2.doze(Duration::from_secs(20), || false);
            t.elapsed()
        });
        // Rung until it ends: a ring before the sleeper dozes off is lost
        // (a stopping server then sleeps one timeout), which a loaded
        // machine may make happen.
        while !sleeper.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
            server.wake_server();
        }
        let slept = sleeper.join().unwrap();
        assert!(slept < Duration::from_secs(5), "woken after {slept:?}");
    }

    #[test]
    fn the_server_words_have_pages_of_their_own_after_everything_else() {
        for n in [1, 2, 4, 64] {
            let area = Area::private(Mailbox::bytes(n)).unwrap();
            let mb = Mailbox::new(area, 0, n, Duration::from_secs(1));
            let (at, len) = mb.server_words();
            assert_eq!((at % PAGE, len % PAGE), (0, 0));
            assert!(at >= mb.bell() + BELL_BYTES, "{n} ranks");
            assert_eq!(at + len, Mailbox::bytes(n));
            let words = 2 * n * n;
            assert!(words * SRV_WORD <= len);
            // Every word is its own: a store shows in that word only.
            mb.set_server_word(words - 1, u32::MAX);
            mb.set_server_word(0, 7);
            assert_eq!(mb.server_word(0), 7);
            assert_eq!(mb.server_word(words - 1), u32::MAX);
            if words > 2 {
                assert_eq!(mb.server_word(1), 0);
            }
            // Nothing else of the segment moved: the last ring slot and
            // the bell are still zero.
            assert_eq!(mb.area.load(mb.bell()), 0);
        }
    }

    #[test]
    fn a_full_ring_waits_for_the_server_and_names_it() {
        let area = Area::private(Mailbox::bytes(2)).unwrap();
        let mb = Mailbox::new(area, 1, 2, Duration::from_millis(50));
        for n in 1..=RING {
            mb.post_request(n, &request(0, n), 0).unwrap();
        }
        let e = mb
            .post_request(RING + 1, &request(0, RING + 1), 0)
            .unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e:?}");
        assert!(
            e.message()
                .contains("rank 0, whose p2p server copies this GPU's messages, did not answer rank 1's copy request 1"),
            "{e}"
        );
        let e = mb.wait_served(2, 0, "recv of 2 x Float").unwrap_err();
        assert!(
            e.message().contains("copy request 2 (recv of 2 x Float)"),
            "{e}"
        );
        // The server (here the same view) answers the oldest: one slot frees.
        assert_eq!(mb.poll_request(1, 1).unwrap().unwrap(), request(0, 1));
        mb.answer_request(1, 1, &Served::Copied);
        mb.post_request(RING + 1, &request(0, RING + 1), 0).unwrap();
        assert_eq!(
            mb.poll_request(1, RING + 1).unwrap().unwrap(),
            request(0, RING + 1)
        );
        assert!(mb.poll_request(1, RING + 2).is_none());
    }

    #[test]
    fn a_stop_ends_the_request_waits() {
        let area = Area::private(Mailbox::bytes(2)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mb = Mailbox::new(area, 1, 2, Duration::from_secs(600)).with_stop(stop.clone());
        for n in 1..=RING {
            mb.post_request(n, &request(0, n), 0).unwrap();
        }
        let raise = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::Release);
        });
        let start = Instant::now();
        let e = mb.wait_served(1, 0, "recv").unwrap_err();
        raise.join().unwrap();
        assert!(e.message().contains("told to end"), "{e}");
        let e = mb.post_request(RING + 1, &request(0, 1), 0).unwrap_err();
        assert!(e.message().contains("told to end"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(60));
    }
}
