//! The host half of the shared-GPU path. Before enqueuing anything, every
//! rank but the leader posts the call it was given and its buffers (as
//! CUDA IPC handles) into its slot of a small POSIX segment; the leader
//! reads every slot, maps the buffers and answers each slot with how this
//! call runs. A slot is read as soon as it is posted: no socket round trip
//! on the way of an 8-byte collective.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cuda::ipc::Exported;
use crate::cuda::IpcMemHandle;
use crate::error::{Error, Result};
use crate::transport::shm::area::Area;

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

/// One buffer of a posted call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The collective does not touch it on this rank.
    Unused,
    /// Memory that CUDA IPC cannot share (virtual-memory allocations).
    Private,
    /// The allocation's handle, the buffer's offset in it, the
    /// allocation's id.
    Shared(Exported),
}

/// What a rank posts for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Post {
    /// The call as the rank was given it; every rank's must be the same.
    pub what: String,
    /// Its stream is being captured into a CUDA graph.
    pub capturing: bool,
    pub send: Buf,
    pub recv: Buf,
}

/// The leader's answer to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The leader runs it on every rank's buffers; the others signal.
    Direct,
    /// Every rank runs its own kernels (graph capture, private memory).
    Kernels,
    /// The ranks were not called for the same collective.
    Mismatch,
}

impl Answer {
    fn code(self) -> u64 {
        match self {
            Answer::Direct => 1,
            Answer::Kernels => 2,
            Answer::Mismatch => 3,
        }
    }
}

impl Post {
    /// At most `room` bytes: the description is cut to fit.
    pub fn encode(&self, room: usize) -> Vec<u8> {
        let mut b = vec![u8::from(self.capturing)];
        for buf in [self.send, self.recv] {
            match buf {
                Buf::Unused => b.push(0),
                Buf::Private => b.push(1),
                Buf::Shared(e) => {
                    b.push(2);
                    b.extend_from_slice(&e.handle.0);
                    b.extend_from_slice(&e.offset.to_le_bytes());
                    b.extend_from_slice(&e.id.to_le_bytes());
                }
            }
        }
        let what = self.what.as_bytes();
        let what = &what[..what.len().min(room.saturating_sub(b.len() + 1)).min(255)];
        b.push(what.len() as u8);
        b.extend_from_slice(what);
        b
    }

    pub fn decode(b: &[u8]) -> Option<Post> {
        let (&cap, mut rest) = b.split_first()?;
        let mut buf = || -> Option<Buf> {
            let (&tag, r) = rest.split_first()?;
            rest = r;
            Some(match tag {
                0 => Buf::Unused,
                1 => Buf::Private,
                2 => {
                    let h: [u8; 64] = rest.get(..64)?.try_into().ok()?;
                    let offset = u64::from_le_bytes(rest.get(64..72)?.try_into().ok()?);
                    let id = u64::from_le_bytes(rest.get(72..80)?.try_into().ok()?);
                    rest = &rest[80..];
                    Buf::Shared(Exported {
                        handle: IpcMemHandle(h),
                        offset,
                        id,
                    })
                }
                _ => return None,
            })
        };
        let (send, recv) = (buf()?, buf()?);
        let (&len, what) = rest.split_first()?;
        let what = String::from_utf8(what.get(..len as usize)?.to_vec()).ok()?;
        Some(Post {
            what,
            capturing: cap != 0,
            send,
            recv,
        })
    }
}

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
        nranks * SLOT + nranks * nranks * PAIR
    }

    fn pair(&self, from: usize, to: usize) -> usize {
        self.nranks * SLOT + (from * self.nranks + to) * PAIR
    }

    /// Posts this rank's `k`-th message (from 1) to rank `to`, once `to`
    /// has taken all but DEPTH of the earlier ones.
    pub fn post_send(&self, to: usize, k: u64, post: &Post) -> Result<()> {
        let at = self.pair(self.me, to);
        let deadline = Instant::now() + self.timeout;
        let w = wait_until(deadline, &self.stop, || self.area.load(at) + DEPTH >= k);
        if w == Waited::Stopped {
            return Err(stopped(&format!("send {k} to rank {to}")));
        }
        if w == Waited::TimedOut {
            return Err(Error::Remote(format!(
                "rank {to} has not received this rank's messages {}..{k} within {:?} (NCCL_TIMEOUT): it died, hangs, or receives fewer than rank {} sends",
                self.area.load(at) + 1,
                self.timeout,
                self.me
            )));
        }
        let slot = at + 64 + ((k - 1) % DEPTH) as usize * PAIR_SLOT;
        let body = post.encode(PAIR_SLOT - 16);
        self.area.write_bytes(slot + 16, &body);
        self.area.store(slot + 8, body.len() as u64);
        self.area.store(slot, k);
        Ok(())
    }

    /// Rank `from`'s `k`-th message to this rank.
    pub fn wait_send(&self, from: usize, k: u64, mine: &str) -> Result<Post> {
        let at = self.pair(from, self.me);
        let slot = at + 64 + ((k - 1) % DEPTH) as usize * PAIR_SLOT;
        let deadline = Instant::now() + self.timeout;
        let w = wait_until(deadline, &self.stop, || self.area.load(slot) == k);
        if w == Waited::Stopped {
            return Err(stopped(&format!("receive {k} from rank {from}")));
        }
        if w == Waited::TimedOut {
            return Err(Error::Remote(format!(
                "rank {from} did not send message {k} to rank {} ({mine}) within {:?} (NCCL_TIMEOUT): it died, hangs, or sends fewer than this rank receives",
                self.me, self.timeout
            )));
        }
        let len = (self.area.load(slot + 8) as usize).min(PAIR_SLOT - 16);
        let mut body = vec![0; len];
        self.area.read_bytes(slot + 16, &mut body);
        self.area.store(at, k);
        Post::decode(&body)
            .ok_or_else(|| Error::Internal(format!("rank {from}'s message {k} is garbled")))
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
        let deadline = Instant::now() + self.timeout;
        let w = wait_until(deadline, &self.stop, || self.area.load(at + POSTED) == seq);
        if w == Waited::Stopped {
            return Err(stopped(&format!("collective #{seq}")));
        }
        if w == Waited::TimedOut {
            return Err(Error::Remote(format!(
                "rank {r} did not call collective #{seq} ({mine}) within {:?} (NCCL_TIMEOUT): it died, hangs, or called fewer collectives than rank {}",
                self.timeout, self.me
            )));
        }
        let len = (self.area.load(at + LEN) as usize).min(SLOT - BODY);
        let mut body = vec![0; len];
        self.area.read_bytes(at + BODY, &mut body);
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
        let deadline = Instant::now() + self.timeout;
        let w = wait_until(deadline, &self.stop, || self.area.load(at) >> 2 == seq);
        if w == Waited::Stopped {
            return Err(stopped(&format!("collective #{seq}")));
        }
        if w == Waited::TimedOut {
            return Err(Error::Remote(format!(
                "rank {leader}, which runs this GPU's collectives, did not answer collective #{seq} ({mine}) within {:?} (NCCL_TIMEOUT)",
                self.timeout
            )));
        }
        Ok(match self.area.load(at) & 3 {
            1 => Answer::Direct,
            2 => Answer::Kernels,
            _ => Answer::Mismatch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            mb.post_send(1, k, &post("m")).unwrap();
        }
        let e = mb.post_send(1, DEPTH + 1, &post("m")).unwrap_err();
        assert!(e.message().contains("told to end"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn messages_queue_up_to_the_depth_and_wait_beyond() {
        // One area, seen in turn as the sender (rank 0) and the receiver.
        let area = Area::private(Mailbox::bytes(2)).unwrap();
        let send = Mailbox::new(area, 0, 2, Duration::from_millis(50));
        for k in 1..=DEPTH {
            send.post_send(1, k, &post(&format!("m{k}"))).unwrap();
        }
        let e = send.post_send(1, DEPTH + 1, &post("over")).unwrap_err();
        assert!(e.message().contains("rank 1 has not received"), "{e}");
        let recv = Mailbox { me: 1, ..send };
        for k in 1..=3 {
            assert_eq!(recv.wait_send(0, k, "recv").unwrap().what, format!("m{k}"));
        }
        let send = Mailbox { me: 0, ..recv };
        send.post_send(1, DEPTH + 1, &post("after")).unwrap();
        let recv = Mailbox { me: 1, ..send };
        for k in 4..=DEPTH {
            recv.wait_send(0, k, "recv").unwrap();
        }
        assert_eq!(recv.wait_send(0, DEPTH + 1, "recv").unwrap().what, "after");
    }
}
