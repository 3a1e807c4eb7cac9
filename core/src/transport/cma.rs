//! Peer memory between processes of one host: a rank reads another rank's
//! host buffers straight from that process (Linux cross-memory attach,
//! `process_vm_readv`), one kernel copy, no staging slot in between; the
//! ranks meet at barriers in a small shared-memory segment, where each
//! also posts the call it was given and its buffers' addresses. A
//! barrier can be split: a rank arrives, and waits later only for the
//! peers whose results it needs.
//!
//! Reading another process needs the kernel's ptrace permission: same
//! user, and under Yama's `ptrace_scope` 1 (Ubuntu's default) the target's
//! consent, which each rank gives with `PR_SET_PTRACER_ANY` (as OpenMPI's
//! vader does). Every rank probes every peer when the communicator is
//! made, and the ranks use this path only if all probes pass; otherwise
//! the shared-memory rings carry everything, and the INFO log says why.
//!
//! Nothing here writes another process's memory: a rank that was stopped
//! and resumed after its peers gave up on it can only read from them.
#![allow(unsafe_code)]

use std::io::IoSliceMut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::transport::shm::area::Area;

/// Bytes of a rank's slot: its barrier word, its gave-up word, then its
/// posted call, then the collective it is in (on any path).
const SLOT: usize = 192;
const ARRIVED: usize = 0;
/// Nonzero once the rank has given up a wait on this segment (a timeout,
/// a stop, a failed peer): its barrier word then says nothing about the
/// buffers it posted, which it may be reusing already. In the same line
/// as the barrier word, so reading it costs nothing more.
const GAVE_UP: usize = 8;
const POST: usize = 64;
/// Words of a posted call.
const POST_WORDS: usize = 7;
const _: () = assert!(POST + 8 * POST_WORDS <= CALL);
/// The collective the rank is in, whichever path it took ([`PeerMem::enter`]):
/// a stamp, odd while the four words after it change, then the words.
/// In a line of its own: peers read it only while they wait.
const CALL: usize = 128;
const _: () = assert!(CALL + 8 * 5 <= SLOT);
/// Bytes of input a rank may pass inline, through the segment itself: a
/// small collective then costs one barrier and no system call.
pub const INLINE: usize = 4096;
/// One inline slot: the meeting's number, the call's four words, then its
/// data. Two per rank, used by turns (the parity of the
/// meeting): a rank writes a slot again only two meetings later, when
/// every peer has passed the one in between and so has read it. Slots
/// start on cache lines.
const INLINE_HEAD: usize = 40;
const INLINE_SLOT: usize = (INLINE_HEAD + INLINE).next_multiple_of(64);

/// Bytes of the mailbox of one ordered pair of ranks, for point-to-point
/// messages: the sender's line (the count of messages offered, then the
/// last one's address and length) and the receiver's (the count taken,
/// then how the last one went), apart so that neither writer's stores
/// evict the other's line.
const PAIR: usize = 128;
const OFFER: usize = 0;
const TAKEN: usize = 64;
/// Ranks up to which the segment has a mailbox per ordered pair (n^2 of
/// them: 2 MiB at this many); larger communicators send on the rings.
pub const MAILBOX_RANKS: usize = 128;

/// Bytes of the segment for `n` ranks.
fn segment_bytes(n: usize) -> usize {
    let pairs = if n <= MAILBOX_RANKS { n * n * PAIR } else { 0 };
    mailboxes_at(n) + pairs
}

fn mailboxes_at(n: usize) -> usize {
    n * SLOT + 2 * n * INLINE_SLOT
}

/// How a receiver ended a message, in its mailbox: taken whole, or
/// refused because the receive was posted for fewer bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Whole,
    /// The receive's size, too small for the message.
    Refused {
        room: u64,
    },
}

impl Taken {
    fn word(self) -> u64 {
        match self {
            Taken::Whole => 0,
            Taken::Refused { room } => room + 1,
        }
    }

    fn from_word(w: u64) -> Taken {
        match w {
            0 => Taken::Whole,
            w => Taken::Refused { room: w - 1 },
        }
    }
}

/// What a rank posts for one call: the call's description (sequence
/// number, kind, count, type, operation, root, packed by the caller: every
/// rank's must match) and its buffers, for its peers to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Post {
    pub call: [u64; 4],
    pub send: u64,
    pub recv: u64,
    /// The rank's staging area (where a reduce's non-root leaves its part).
    pub stage: u64,
}

impl Post {
    fn words(&self) -> [u64; POST_WORDS] {
        let c = self.call;
        [c[0], c[1], c[2], c[3], self.send, self.recv, self.stage]
    }

    fn from_words(w: [u64; POST_WORDS]) -> Post {
        Post {
            call: [w[0], w[1], w[2], w[3]],
            send: w[4],
            recv: w[5],
            stage: w[6],
        }
    }
}

/// A word with a known value that peers read at setup to prove they may.
static PROBE: u64 = 0x6f78_6363_6c5f_636d;

/// Whether to try this path at all: `OXCCL_HOST_DIRECT=0` turns it off.
pub fn wanted() -> Result<bool> {
    crate::config::ox::host_direct()
}

/// Lets peers of this user read this process (Yama `ptrace_scope` 1).
fn allow_peers() {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
    if scope.is_ok_and(|s| s.trim() == "1") {
        // SAFETY: PR_SET_PTRACER takes two integer arguments and changes
        // only this process's Yama exception; no memory is passed.
        unsafe {
            libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
        }
    }
}

/// Reads `dst.len()` bytes at `addr` in process `pid`.
fn read_from(pid: i32, addr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let remote = [RemoteIoVec {
            base: addr as usize + done,
            len: dst.len() - done,
        }];
        let mut local = [IoSliceMut::new(&mut dst[done..])];
        match process_vm_readv(Pid::from_raw(pid), &mut local, &remote) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Called now and then while a rank waits, with the ranks still missing
/// and the time waited; an error it returns ends the wait.
pub type Poll<'a> = dyn FnMut(&[usize], Duration) -> Option<Error> + 'a;

/// The bootstrap's allgather: every rank's bytes, by rank.
pub type AllGather<'a> = dyn Fn(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// The ranks' meeting place and the way to their memory.
pub struct PeerMem {
    area: Area,
    me: usize,
    pids: Vec<i32>,
    /// Barriers this rank has entered.
    epoch: AtomicU64,
    /// Polls of a wait before it yields: many where every rank has a core
    /// (the hand-off is a cache line's trip), few where the host has more
    /// ranks than cores (the peer needs this core to arrive at all).
    spins: u32,
}

/// A waiter's pauses between looks at shared words: spins first, then
/// yields, then short sleeps.
pub struct Backoff {
    spins: u32,
    rounds: u32,
    /// Read only once a wait is long: a clock read costs more than a
    /// small collective's hand-off.
    start: Option<Instant>,
}

impl Backoff {
    /// Pauses once; every so often returns the time waited so far, for
    /// the caller to check on its peers.
    pub fn pause(&mut self) -> Option<Duration> {
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds < self.spins {
            std::hint::spin_loop();
            return None;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        // A rank that is early gives its core to the others' copies
        // (all its host's cores are in use when every rank runs its
        // threads): it yields at first, then sleeps a little.
        if start.elapsed() < Duration::from_micros(50) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
        self.rounds.is_multiple_of(64).then(|| start.elapsed())
    }
}

fn spins_for(n: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n <= cores {
        2000
    } else {
        16
    }
}

/// How one rank's setup went, sent to every other.
fn encode(pid: i32, probe: u64, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + name.len());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&probe.to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

fn decode(p: usize, b: &[u8]) -> Result<(i32, u64, String)> {
    let bad = || Error::Remote(format!("rank {p} sent a malformed peer-memory setup"));
    let pid = i32::from_le_bytes(b.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
    let probe = u64::from_le_bytes(
        b.get(4..12)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let name = std::str::from_utf8(&b[12..]).map_err(|_| bad())?;
    Ok((pid, probe, name.to_string()))
}

impl PeerMem {
    /// Every rank of a communicator whose ranks all share this host calls
    /// it, in the same order as its other exchanges (`allgather` is the
    /// bootstrap's). `Ok(None)`: some rank cannot read some peer (or did
    /// not want to), said in `why`.
    pub fn setup(
        me: usize,
        n: usize,
        allgather: &AllGather<'_>,
        why: &mut String,
    ) -> Result<Option<PeerMem>> {
        let want = wanted()?;
        let mut verdict = String::new();
        if want {
            allow_peers();
        } else {
            verdict = format!("rank {me} set OXCCL_HOST_DIRECT=0");
        }
        let name = format!(
            "/oxccl-cma-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let area = if me == 0 {
            Some(Area::create_shared(&name, segment_bytes(n))?)
        } else {
            None
        };
        let pid = std::process::id() as i32;
        let probe = if want {
            std::ptr::addr_of!(PROBE) as u64
        } else {
            0
        };
        let first = allgather(&encode(pid, probe, if me == 0 { &name } else { "" }))?;
        let peers = first
            .iter()
            .enumerate()
            .map(|(p, b)| decode(p, b))
            .collect::<Result<Vec<_>>>()?;
        let area = match area {
            Some(a) => a,
            None => Area::open_shared(&peers[0].2, segment_bytes(n))?,
        };
        // Every rank reads one word of every other: the kernel's verdict,
        // given before any collective relies on it.
        for (p, (pid, addr, _)) in peers.iter().enumerate() {
            if p == me || !verdict.is_empty() {
                continue;
            }
            if *addr == 0 {
                verdict = format!("rank {p} set OXCCL_HOST_DIRECT=0");
                continue;
            }
            let mut word = [0u8; 8];
            // Reading is all the path does to a peer's memory.
            match read_from(*pid, *addr, &mut word) {
                Ok(()) if u64::from_ne_bytes(word) == PROBE => {}
                Ok(()) => verdict = format!("rank {me} read a wrong probe from rank {p}"),
                Err(e) => {
                    verdict = format!(
                        "rank {me} may not read rank {p} (pid {pid}): {e} (another PID namespace, or ptrace restricted: /proc/sys/kernel/yama/ptrace_scope)"
                    )
                }
            }
        }
        let verdicts = allgather(verdict.as_bytes())?;
        // Every rank has mapped the segment: the name can go.
        area.unlink();
        if let Some(v) = verdicts.iter().find(|v| !v.is_empty()) {
            *why = String::from_utf8_lossy(v).into_owned();
            return Ok(None);
        }
        Ok(Some(PeerMem {
            area,
            me,
            pids: peers.iter().map(|p| p.0).collect(),
            epoch: AtomicU64::new(0),
            spins: spins_for(n),
        }))
    }

    pub fn nranks(&self) -> usize {
        self.pids.len()
    }

    /// Posts this rank's call; peers see it once it enters the next barrier.
    pub fn post(&self, post: &Post) {
        for (i, w) in post.words().into_iter().enumerate() {
            self.area.store(self.me * SLOT + POST + 8 * i, w);
        }
    }

    /// Says which collective this rank is in now (its call words, as
    /// [`PeerMem::post`] takes them), whichever path it takes: a peer that
    /// took another path for the same collective waits where this rank
    /// never comes, and finds here why ([`PeerMem::current`]).
    pub fn enter(&self, call: &[u64; 4]) {
        let at = self.me * SLOT + CALL;
        // Only this rank writes its stamp: odd while the words change.
        let stamp = self.area.load(at);
        self.area.store(at, stamp | 1);
        for (i, w) in call.iter().enumerate() {
            self.area.store(at + 8 + 8 * i, *w);
        }
        self.area.store(at, (stamp | 1) + 1);
    }

    /// The call words `peer` last entered ([`PeerMem::enter`]), or None
    /// if it entered none, or is changing them as this reads.
    pub fn current(&self, peer: usize) -> Option<[u64; 4]> {
        let at = peer * SLOT + CALL;
        let stamp = self.area.load(at);
        if stamp == 0 || stamp & 1 == 1 {
            return None;
        }
        let call = std::array::from_fn(|i| self.area.load(at + 8 + 8 * i));
        (self.area.load(at) == stamp).then_some(call)
    }

    fn inline_slot(&self, rank: usize, turn: u64) -> usize {
        self.nranks() * SLOT + (2 * rank + turn as usize) * INLINE_SLOT
    }

    /// A small call inline, in one meeting: this rank writes its input (at
    /// most [`INLINE`] bytes) into its slot after the call's words, and the
    /// meeting's number last, in the same cache line as the call and the
    /// first bytes (LL's idea: the data travels with its flag, so an
    /// 8-byte call costs one line's trip per peer). Then it waits for
    /// every peer's slot. Returns each rank's call words and data, valid
    /// until this rank's next meeting.
    pub fn meet_inline(
        &self,
        call: &[u64; 4],
        data: &[u8],
        poll: &mut Poll<'_>,
    ) -> Result<Vec<([u64; 4], *const u8)>> {
        assert!(
            data.len() <= INLINE,
            "{} bytes do not go inline",
            data.len()
        );
        let e = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let turn = e % 2;
        let at = self.inline_slot(self.me, turn);
        self.area.write_bytes(at + INLINE_HEAD, data);
        for (i, w) in call.iter().enumerate() {
            self.area.store(at + 8 + 8 * i, *w);
        }
        self.area.store(at, e);
        // Later barriers count this meeting too.
        self.area.store(self.me * SLOT + ARRIVED, e);
        self.wait_all(e, 0..self.nranks(), &|p| self.inline_slot(p, turn), poll)?;
        Ok((0..self.nranks())
            .map(|p| {
                let at = self.inline_slot(p, turn);
                let call = std::array::from_fn(|i| self.area.load(at + 8 + 8 * i));
                let data = self.area.at(at + INLINE_HEAD, INLINE) as *const u8;
                (call, data)
            })
            .collect())
    }

    /// Whether this communicator's segment has the pairs' mailboxes.
    pub fn has_mailboxes(&self) -> bool {
        self.nranks() <= MAILBOX_RANKS
    }

    fn mailbox(&self, from: usize, to: usize) -> usize {
        let n = self.nranks();
        debug_assert!(n <= MAILBOX_RANKS && from < n && to < n);
        mailboxes_at(n) + (from * n + to) * PAIR
    }

    /// Offers message number `k` (counted from 1 per ordered pair) to
    /// `to`: `len` bytes at `addr` of this process, which must stay
    /// unchanged until `to` has taken it. Its address and length are
    /// written before its number, which the receiver reads first.
    pub fn offer(&self, to: usize, k: u64, addr: u64, len: u64) {
        let at = self.mailbox(self.me, to) + OFFER;
        self.area.store(at + 8, addr);
        self.area.store(at + 16, len);
        self.area.store(at, k);
    }

    /// How many messages `from` has offered this rank, and the last one's
    /// address and length.
    pub fn offered(&self, from: usize) -> (u64, u64, u64) {
        let at = self.mailbox(from, self.me) + OFFER;
        let k = self.area.load(at);
        (k, self.area.load(at + 8), self.area.load(at + 16))
    }

    /// Ends message number `k` from `from`: after this the sender may
    /// reuse its buffer and offer the next.
    pub fn take(&self, from: usize, k: u64, how: Taken) {
        let at = self.mailbox(from, self.me) + TAKEN;
        self.area.store(at + 8, how.word());
        self.area.store(at, k);
    }

    /// How many of this rank's messages `to` has taken, and how the last went.
    pub fn taken(&self, to: usize) -> (u64, Taken) {
        let at = self.mailbox(self.me, to) + TAKEN;
        let k = self.area.load(at);
        (k, Taken::from_word(self.area.load(at + 8)))
    }

    /// What `peer` posted, valid after a barrier that followed its post.
    pub fn posted(&self, peer: usize) -> Post {
        let mut w = [0u64; POST_WORDS];
        for (i, v) in w.iter_mut().enumerate() {
            *v = self.area.load(peer * SLOT + POST + 8 * i);
        }
        Post::from_words(w)
    }

    /// Waits until every rank has entered as many barriers as this one.
    /// Every few milliseconds of waiting, `poll` gets the ranks still
    /// missing and the time waited so far; an error it returns ends the
    /// wait.
    pub fn barrier(&self, poll: &mut Poll<'_>) -> Result<()> {
        let e = self.arrive();
        self.wait_all(e, 0..self.nranks(), &|p| p * SLOT + ARRIVED, poll)
    }

    /// Enters the next barrier without waiting, and returns its number:
    /// this tells every peer that this rank has done what came before it.
    /// A peer that needs only that waits for this rank alone
    /// ([`PeerMem::wait_for`]). The number grows with every meeting, so a
    /// rank's word from an earlier call is always below it.
    pub fn arrive(&self) -> u64 {
        let e = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.area.store(self.me * SLOT + ARRIVED, e);
        e
    }

    /// Waits until each of `ranks` has entered barrier `e` (or a later
    /// one), as [`PeerMem::barrier`] does for all, with `poll` alike.
    pub fn wait_for(&self, ranks: &[usize], e: u64, poll: &mut Poll<'_>) -> Result<()> {
        self.wait_all(e, ranks.iter().copied(), &|p| p * SLOT + ARRIVED, poll)
    }

    /// Waits until the word at `word(p)` of every rank p of `ranks` reads
    /// `e` or more.
    fn wait_all(
        &self,
        e: u64,
        ranks: impl Iterator<Item = usize> + Clone,
        word: &dyn Fn(usize) -> usize,
        poll: &mut Poll<'_>,
    ) -> Result<()> {
        let mut wait = self.backoff();
        let mut left = ranks.clone().peekable();
        loop {
            while left.next_if(|&p| self.area.load(word(p)) >= e).is_some() {}
            if left.peek().is_none() {
                // A rank that arrived and then gave up (its wait for this
                // rank timed out while this rank was stopped) has left the
                // call: what this rank read of its buffers may be from its
                // next operations. Read after the arrivals: it gave up
                // before it reused anything.
                return match ranks.clone().find(|&p| self.gave_up(p)) {
                    None => Ok(()),
                    Some(p) => Err(self.left_us(p)),
                };
            }
            if let Some(waited) = wait.pause() {
                let missing: Vec<usize> = ranks
                    .clone()
                    .filter(|&p| self.area.load(word(p)) < e)
                    .collect();
                if let Some(err) = poll(&missing, waited) {
                    self.give_up();
                    return Err(err);
                }
            }
        }
    }

    /// Marks that this rank has given up a wait: no peer may take its
    /// barrier word as a promise that its buffers still hold this call's
    /// data.
    pub fn give_up(&self) {
        self.area.store(self.me * SLOT + GAVE_UP, 1);
    }

    fn gave_up(&self, p: usize) -> bool {
        self.area.load(p * SLOT + GAVE_UP) != 0
    }

    fn left_us(&self, p: usize) -> Error {
        Error::Remote(format!(
            "rank {p} (pid {}) gave up this operation (it failed or timed out waiting, perhaps for this rank) and may be reusing its buffers: this rank's result is not trusted",
            self.pid(p)
        ))
    }

    /// How a wait on this segment's words spends its time.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            spins: self.spins,
            rounds: 0,
            start: None,
        }
    }

    /// Whether `peer`'s process still exists (it may be stopped).
    pub fn alive(&self, peer: usize) -> bool {
        // Signal 0 checks that the process exists without touching it.
        !matches!(
            nix::sys::signal::kill(Pid::from_raw(self.pids[peer]), None),
            Err(nix::errno::Errno::ESRCH)
        )
    }

    pub fn pid(&self, peer: usize) -> i32 {
        self.pids[peer]
    }

    pub fn rank(&self) -> usize {
        self.me
    }

    /// Copies `dst.len()` bytes at `addr` of `peer`'s memory into `dst`.
    pub fn read(&self, peer: usize, addr: u64, dst: &mut [u8]) -> Result<()> {
        read_from(self.pids[peer], addr, dst).map_err(|e| {
            Error::Remote(format!(
                "reading {} bytes of rank {peer}'s buffer at {addr:#x} (pid {}): {e}",
                dst.len(),
                self.pids[peer]
            ))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_post_survives_its_words() {
        let p = Post {
            call: [9, 2, 3, 4],
            send: 0xdead_beef,
            recv: 77,
            stage: 0x5747,
        };
        assert_eq!(Post::from_words(p.words()), p);
    }

    #[test]
    fn a_process_reads_its_own_memory_and_refuses_a_bad_address() {
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        read_from(std::process::id() as i32, src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(src, dst);
        assert!(read_from(std::process::id() as i32, 8, &mut dst[..8]).is_err());
    }

    /// Runs `f` on `n` threads of this process, each a rank with its own
    /// peer memory (the process reads itself, which the kernel allows).
    pub(crate) fn in_process(n: usize, f: impl Fn(PeerMem) + Send + Sync + 'static) {
        use std::sync::{Arc, Barrier, Mutex};
        let board: Arc<Mutex<Vec<Option<Vec<u8>>>>> = Arc::new(Mutex::new(vec![None; n]));
        let meet = Arc::new(Barrier::new(n));
        let f = Arc::new(f);
        let hs: Vec<_> = (0..n)
            .map(|me| {
                let (board, meet, f) = (board.clone(), meet.clone(), f.clone());
                std::thread::spawn(move || {
                    let ag = |mine: &[u8]| -> Result<Vec<Vec<u8>>> {
                        board.lock().unwrap()[me] = Some(mine.to_vec());
                        meet.wait();
                        let all = board
                            .lock()
                            .unwrap()
                            .iter()
                            .map(|b| b.clone().unwrap())
                            .collect();
                        meet.wait();
                        Ok(all)
                    };
                    let mut why = String::new();
                    let pm = PeerMem::setup(me, n, &ag, &mut why).unwrap().expect(&why);
                    f(pm);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }

    #[test]
    fn ranks_of_one_process_meet_at_barriers() {
        let n = 3;
        in_process(n, move |pm| {
            let me = pm.rank();
            let data = vec![me as u8 + 1; 4096];
            pm.post(&Post {
                call: [5, 0, 0, 0],
                send: data.as_ptr() as u64,
                recv: 0,
                stage: 0,
            });
            pm.barrier(&mut |_, _| None).unwrap();
            let next = (me + 1) % n;
            let got = pm.posted(next);
            assert_eq!(got.call[0], 5);
            let mut buf = vec![0u8; 4096];
            pm.read(next, got.send, &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == next as u8 + 1));
            // Nobody's data goes before everyone has read it.
            pm.barrier(&mut |_, _| None).unwrap();
        });
    }

    #[test]
    fn a_rank_reads_the_call_each_peer_entered_last() {
        in_process(2, move |pm| {
            let me = pm.rank() as u64;
            assert_eq!(pm.current(1 - pm.rank()), None, "nothing entered yet");
            // The peer enters only after this rank has looked.
            pm.barrier(&mut |_, _| None).unwrap();
            for seq in 1..100u64 {
                pm.enter(&[seq, me, seq * 10, 7]);
                assert_eq!(pm.current(pm.rank()), Some([seq, me, seq * 10, 7]));
                // Whatever the peer is doing, a call read whole is one it entered.
                if let Some(c) = pm.current(1 - pm.rank()) {
                    assert_eq!(c[1], 1 - me);
                    assert_eq!((c[2], c[3]), (c[0] * 10, 7), "a torn read: {c:?}");
                }
            }
            pm.barrier(&mut |_, _| None).unwrap();
            assert_eq!(pm.current(1 - pm.rank()), Some([99, 1 - me, 990, 7]));
        });
    }

    #[test]
    fn a_barrier_names_the_rank_that_never_comes() {
        let area = Area::private(segment_bytes(2)).unwrap();
        let pm = PeerMem {
            area,
            me: 0,
            pids: vec![std::process::id() as i32; 2],
            epoch: AtomicU64::new(0),
            spins: spins_for(2),
        };
        let mut seen = Vec::new();
        let e = pm.barrier(&mut |missing, waited| {
            seen = missing.to_vec();
            (waited > Duration::from_millis(50)).then(|| Error::Remote("late".into()))
        });
        assert!(e.is_err());
        assert_eq!(seen, vec![1]);
        assert!(pm.alive(1));
    }

    fn alone(n: usize, me: usize) -> PeerMem {
        PeerMem {
            area: Area::private(segment_bytes(n)).unwrap(),
            me,
            pids: vec![std::process::id() as i32; n],
            epoch: AtomicU64::new(0),
            spins: spins_for(n),
        }
    }

    /// A peer that arrived at a meeting and then gave up (its wait timed
    /// out while this rank was stopped) does not let this rank pass it:
    /// this rank's reads of its buffers may be of its next operations.
    /// And a rank whose wait fails marks itself so.
    #[test]
    fn a_peer_that_gave_up_after_arriving_ends_the_wait_in_an_error() {
        let pm = alone(2, 0);
        pm.area.store(SLOT + ARRIVED, 5);
        pm.area.store(SLOT + GAVE_UP, 1);
        let e = pm.barrier(&mut |_, _| None).unwrap_err();
        assert!(e.to_string().contains("rank 1 "), "{e}");
        assert!(e.to_string().contains("gave up"), "{e}");
        let pm = alone(2, 0);
        let _ = pm.barrier(&mut |_, w| {
            (w > Duration::from_millis(20)).then(|| Error::Remote("late".into()))
        });
        assert!(pm.gave_up(0), "a failed wait marks the rank");
    }

    #[test]
    fn a_wait_for_one_rank_names_only_it_and_takes_no_older_arrival() {
        let pm = alone(3, 0);
        // Rank 1 arrived at the meeting before (its word from an earlier
        // call); rank 2, which this wait does not ask for, at none.
        pm.area.store(SLOT + ARRIVED, 1);
        pm.epoch.store(1, Ordering::SeqCst);
        let e = pm.arrive();
        assert_eq!(e, 2);
        let mut seen = Vec::new();
        let r = pm.wait_for(&[1], e, &mut |missing, waited| {
            seen = missing.to_vec();
            (waited > Duration::from_millis(50)).then(|| Error::Remote("late".into()))
        });
        assert!(r.is_err());
        assert_eq!(seen, vec![1]);
        // Once it arrives, the wait ends, whatever rank 2 does.
        pm.area.store(SLOT + ARRIVED, 2);
        pm.wait_for(&[1], e, &mut |_, _| Some(Error::Remote("waited".into())))
            .unwrap();
        pm.wait_for(&[], e, &mut |_, _| Some(Error::Remote("waited".into())))
            .unwrap();
    }

    #[test]
    fn ranks_wait_for_one_owner_then_meet() {
        let n = 3;
        in_process(n, move |pm| {
            let me = pm.rank();
            let mut mine = vec![0u8; 4096];
            pm.post(&Post {
                call: [6, 0, 0, 0],
                send: 0,
                recv: mine.as_ptr() as u64,
                stage: 0,
            });
            pm.barrier(&mut |_, _| None).unwrap();
            // Rank 2 is late with its part; rank 0 needs only rank 1's.
            if me == 2 {
                std::thread::sleep(Duration::from_millis(500));
            }
            mine.fill(me as u8 + 10);
            let e = pm.arrive();
            let owner = (me + 1) % n;
            let start = Instant::now();
            pm.wait_for(&[owner], e, &mut |_, _| None).unwrap();
            if me == 0 {
                assert!(
                    start.elapsed() < Duration::from_millis(400),
                    "{:?}",
                    start.elapsed()
                );
            }
            let mut buf = vec![0u8; 4096];
            pm.read(owner, pm.posted(owner).recv, &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == owner as u8 + 10));
            // Nobody's part goes before everyone has read it.
            pm.barrier(&mut |_, _| None).unwrap();
        });
    }
}
