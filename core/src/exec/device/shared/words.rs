//! The words of the shared-GPU p2p protocol and the stream operations a
//! message takes (see `super::server` for who runs them): where each
//! rank's stream stores and waits ([`Words`]), the operations of each side
//! of a message, pulled, pushed or copied by the server ([`Op`]), the
//! server's backlog of requests waiting for their words ([`Backlog`]), and
//! how a list of operations goes onto a stream ([`enqueue`]). All of it
//! but `enqueue` is plain data, tested against a simulation of streams.

use crate::cuda::{KernelSet, MemOp, RawStream};
use crate::error::{Error, Result};

use super::super::stop::Awaited;
use super::{P2P_DONE, P2P_FREE, P2P_READY, PUSHED};

/// The most ranks the server serves: its words take 16 bytes per ordered
/// pair in the mailbox segment. Larger groups pull with their own kernels.
pub(super) const MAX_SERVED: usize = 64;

/// Index of `q`'s SREADY for `r` among the server's words of `n` ranks.
fn sready_word(n: usize, q: usize, r: usize) -> usize {
    q * n + r
}

/// Index of `r`'s RECV READY for `q`'s messages.
fn rready_word(n: usize, q: usize, r: usize) -> usize {
    n * n + q * n + r
}

/// Whether a word that holds `word` has reached message `k`: 32-bit
/// values compared wrapping, as stream waits compare them.
pub(super) fn reached(word: u32, k: u32) -> bool {
    (word.wrapping_sub(k) as i32) >= 0
}

/// One stream operation of the protocol: a store or wait on a word (as
/// [`MemOp`] enqueues them), or a copy `C` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op<C> {
    Mem(MemOp),
    Copy(C),
}

impl<C> Op<C> {
    /// Stores `value` at `at`.
    pub fn store(at: u64, value: u32) -> Op<C> {
        Op::Mem(MemOp::Write { addr: at, value })
    }

    /// Later work waits until the word at `at` reaches `value`.
    fn wait(at: u64, value: u32) -> Op<C> {
        Op::Mem(MemOp::Wait { addr: at, value })
    }
}

/// A copy of `bytes` from `src` to `dst`, addresses of the stream's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Move {
    pub dst: u64,
    pub src: u64,
    pub bytes: usize,
}

/// The words of send/recv as one process addresses them, and which
/// stream operations each step takes. Values are message numbers, per
/// ordered pair, compared as wrapping 32-bit words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Words {
    /// Each rank's flag buffer.
    pub flags: Vec<u64>,
    /// The server's words (host memory of the mailbox segment, registered
    /// with CUDA) as this process's streams address them; 0 where there is
    /// no server (`OXCCL_SHARED_P2P=pull`, or too many ranks): every
    /// receiver then pulls.
    pub srv: u64,
    pub leader: usize,
    /// The server copies the messages between other ranks too
    /// (`OXCCL_SHARED_P2P=server`); else it only hands the leader's
    /// receivers' buffers to the leader, and the others pull.
    pub full: bool,
}

impl Words {
    pub fn nranks(&self) -> usize {
        self.flags.len()
    }

    /// Whether `r` posts requests to the server (the leader receives with
    /// its own kernel: it is the leader's context already).
    pub fn asks(&self, r: usize) -> bool {
        self.srv != 0 && r != self.leader
    }

    /// Whether `q`'s messages to `r` go through the server: the leader's
    /// (which the leader's stream then writes, or the receiver pulls), and
    /// where it copies, everyone's.
    pub fn served(&self, q: usize, r: usize) -> bool {
        self.asks(r) && (self.full || q == self.leader)
    }

    /// In `r`'s flags: `q`'s message k is in `r`'s buffer (served), or
    /// ready to pull.
    pub fn ready(&self, q: usize, r: usize) -> u64 {
        self.flags[r] + P2P_READY + 8 * q as u64
    }

    /// In `q`'s flags: its message k to `r` has been copied.
    pub fn done(&self, q: usize, r: usize) -> u64 {
        self.flags[q] + P2P_DONE + 8 * r as u64
    }

    /// In the server's words: `q`'s stream has made its message k to `r`
    /// ready.
    pub fn sready(&self, q: usize, r: usize) -> u64 {
        self.srv + 8 * sready_word(self.nranks(), q, r) as u64
    }

    /// In the server's words: `r`'s stream has reached its receive k from
    /// `q` (its buffer may be overwritten).
    pub fn rready(&self, q: usize, r: usize) -> u64 {
        self.srv + 8 * rready_word(self.nranks(), q, r) as u64
    }

    /// Sender `q`'s stream, where its `k`-th message to `r` is ready: the
    /// server's word where the server copies or relays it, else the
    /// receiver's (the leader's messages: the leader knows by then that
    /// the receiver pulls).
    pub fn send<C>(&self, q: usize, r: usize, k: u64) -> Op<C> {
        let at = if self.served(q, r) && q != self.leader {
            self.sready(q, r)
        } else {
            self.ready(q, r)
        };
        Op::store(at, k as u32)
    }

    /// Sender `q`'s stream, after the group: its buffer is free again.
    pub fn send_end<C>(&self, q: usize, r: usize, k: u64) -> Op<C> {
        Op::wait(self.done(q, r), k as u32)
    }

    /// Receiver `r`'s stream, for `q`'s `k`-th message, which the server
    /// copies.
    pub fn recv_copied<C>(&self, q: usize, r: usize, k: u64) -> [Op<C>; 2] {
        let value = k as u32;
        [
            Op::store(self.rready(q, r), value),
            Op::wait(self.ready(q, r), value),
        ]
    }

    /// In the leader's flags: `r`'s buffer is free for the leader's
    /// message k (which the leader's stream pushes).
    pub fn free(&self, r: usize) -> u64 {
        self.flags[self.leader] + P2P_FREE + 8 * r as u64
    }

    /// In `r`'s flags: the leader's message k is in `r`'s buffer.
    pub fn pushed(&self, r: usize) -> u64 {
        self.flags[r] + PUSHED
    }

    /// The leader's stream, for its `k`-th message to `r`, which it writes
    /// into `r`'s buffer itself: a copy the server queued in the leader's
    /// context could sit behind the leader's own waits (see the module).
    pub fn push<C>(&self, r: usize, k: u64, copy: C) -> [Op<C>; 3] {
        let value = k as u32;
        [
            Op::wait(self.free(r), value),
            Op::Copy(copy),
            Op::store(self.pushed(r), value),
        ]
    }

    /// Receiver `r`'s stream, for the leader's `k`-th message, which the
    /// leader pushes.
    pub fn recv_pushed<C>(&self, r: usize, k: u64) -> [Op<C>; 2] {
        let value = k as u32;
        [
            Op::store(self.free(r), value),
            Op::wait(self.pushed(r), value),
        ]
    }

    /// Receiver `r`'s stream, for `q`'s `k`-th message, which it pulls.
    pub fn recv_pull<C>(&self, q: usize, r: usize, k: u64, copy: C) -> [Op<C>; 3] {
        let value = k as u32;
        [
            Op::wait(self.ready(q, r), value),
            Op::Copy(copy),
            Op::store(self.done(q, r), value),
        ]
    }

    /// The server's stream, for `q`'s `k`-th message to `r`, once its
    /// thread has seen the words reach it (see [`Backlog`]): the copy, or
    /// (`None`) only the receiver's READY for it to pull. No wait.
    pub fn serve<C>(&self, q: usize, r: usize, k: u64, copy: Option<C>) -> Vec<Op<C>> {
        let value = k as u32;
        let ready = Op::store(self.ready(q, r), value);
        match copy {
            None => vec![ready],
            Some(c) => vec![Op::Copy(c), ready, Op::store(self.done(q, r), value)],
        }
    }
}

/// A request the server has answered and not yet queued: `q`'s `k`-th
/// message to `r`; `copy`: the server copies it (it then waits for the
/// receiver's RECV READY too), else the receiver pulls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pending<T> {
    pub q: usize,
    pub r: usize,
    pub k: u64,
    pub copy: bool,
    pub work: T,
}

/// The server's pending requests, in the order they were posted.
#[derive(Debug)]
pub(super) struct Backlog<T> {
    nranks: usize,
    items: Vec<Pending<T>>,
}

impl<T> Backlog<T> {
    pub fn new(nranks: usize) -> Backlog<T> {
        Backlog {
            nranks,
            items: Vec::new(),
        }
    }

    pub fn push(&mut self, p: Pending<T>) {
        self.items.push(p);
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Takes, in posted order, every request whose words (`word(i)`, the
    /// server's word `i`) have reached it: the sender's SREADY, and for a
    /// copy the receiver's RECV READY. A request waits behind an earlier
    /// one of its pair still pending, so that a pair's READY stores keep
    /// their order (a pulled message needs no RECV READY and could
    /// otherwise pass a copied one before it).
    pub fn take_ready(&mut self, word: impl Fn(usize) -> u32) -> Vec<Pending<T>> {
        let n = self.nranks;
        let mut blocked: Vec<(usize, usize)> = Vec::new();
        let mut ready = Vec::new();
        let mut left = Vec::with_capacity(self.items.len());
        for p in self.items.drain(..) {
            let k = p.k as u32;
            let go = !blocked.contains(&(p.q, p.r))
                && reached(word(sready_word(n, p.q, p.r)), k)
                && (!p.copy || reached(word(rready_word(n, p.q, p.r)), k));
            if go {
                ready.push(p);
            } else {
                blocked.push((p.q, p.r));
                left.push(p);
            }
        }
        self.items = left;
        ready
    }
}

/// Enqueues `ops` on `stream`; each wait is recorded in `awaited` by its
/// offset from the buffer at `base` (the stream's own flag words); `None`
/// for a stream that must never wait (the server's), which refuses one.
///
/// # Safety
/// Every word is 4-byte aligned memory mapped for the stream's context
/// (device memory, or host memory registered with DEVICEMAP as the device
/// addresses it) and alive until the stream has run the operations; every
/// copy's buffers are valid for its bytes until then.
#[allow(unsafe_code)] // stream memory operations on raw device addresses
pub(super) unsafe fn enqueue(
    ops: &[Op<Move>],
    stream: RawStream,
    kernels: &KernelSet,
    max_blocks: usize,
    mut awaited: Option<(u64, &mut Awaited)>,
) -> Result<()> {
    // Stores and waits between two copies go in one driver call.
    let mut batch: Vec<MemOp> = Vec::new();
    let flush = |batch: &mut Vec<MemOp>| -> Result<()> {
        if !batch.is_empty() {
            #[allow(unsafe_code)]
            // SAFETY: the caller's contract.
            unsafe {
                stream.mem_ops(batch)?
            };
            batch.clear();
        }
        Ok(())
    };
    for op in ops {
        match *op {
            Op::Mem(m @ MemOp::Wait { addr, value }) => {
                let Some((base, awaited)) = awaited.as_mut() else {
                    return Err(Error::Internal(
                        "a stream wait on the shared-GPU p2p server's stream".into(),
                    ));
                };
                debug_assert!(addr >= *base, "a wait on another process's word");
                batch.push(m);
                awaited.wait(addr - *base, value);
            }
            Op::Mem(m @ MemOp::Write { .. }) => batch.push(m),
            Op::Copy(m) => {
                flush(&mut batch)?;
                kernels.copy(m.dst, m.src, m.bytes, max_blocks, stream)?;
            }
        }
    }
    flush(&mut batch)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, VecDeque};

    use super::*;

    /// A message: (sender, receiver, number).
    type Msg = (usize, usize, u64);

    /// Streams of stream operations over one memory of words, run until
    /// none can go on; the log keeps (stream, op) in the order they ran.
    struct Sim {
        mem: HashMap<u64, u32>,
        streams: Vec<(String, VecDeque<Op<Msg>>)>,
        log: Vec<(String, Op<Msg>)>,
    }

    impl Sim {
        fn new() -> Sim {
            Sim {
                mem: HashMap::new(),
                streams: Vec::new(),
                log: Vec::new(),
            }
        }

        fn stream(&mut self, name: &str) -> usize {
            match self.streams.iter().position(|(n, _)| n == name) {
                Some(i) => i,
                None => {
                    self.streams.push((name.to_string(), VecDeque::new()));
                    self.streams.len() - 1
                }
            }
        }

        fn push(&mut self, name: &str, ops: impl IntoIterator<Item = Op<Msg>>) {
            let i = self.stream(name);
            self.streams[i].1.extend(ops);
        }

        /// Runs what can run; the names of the streams left waiting.
        fn run(&mut self) -> Vec<String> {
            loop {
                let mut moved = false;
                for (name, ops) in &mut self.streams {
                    while let Some(&op) = ops.front() {
                        match op {
                            Op::Mem(MemOp::Wait { addr: at, value }) => {
                                let v = self.mem.get(&at).copied().unwrap_or(0);
                                if (v.wrapping_sub(value) as i32) < 0 {
                                    break;
                                }
                            }
                            Op::Mem(MemOp::Write { addr: at, value }) => {
                                self.mem.insert(at, value);
                            }
                            Op::Copy(_) => {}
                        }
                        self.log.push((name.clone(), op));
                        ops.pop_front();
                        moved = true;
                    }
                }
                if !moved {
                    return self
                        .streams
                        .iter()
                        .filter(|(_, ops)| !ops.is_empty())
                        .map(|(n, _)| n.clone())
                        .collect();
                }
            }
        }

        fn stuck(&self) -> Vec<String> {
            self.streams
                .iter()
                .filter(|(_, ops)| !ops.is_empty())
                .map(|(n, _)| n.clone())
                .collect()
        }

        fn at(&self, name: &str, op: Op<Msg>) -> usize {
            self.log
                .iter()
                .position(|(n, o)| n == name && *o == op)
                .unwrap_or_else(|| panic!("{name} never ran {op:?}"))
        }
    }

    fn words(n: usize) -> Words {
        Words {
            flags: (0..n as u64).map(|r| (r + 1) << 20).collect(),
            srv: 1 << 40,
            leader: 0,
            full: true,
        }
    }

    /// One group of one rank: (sends to, receives from).
    type Group = (Vec<usize>, Vec<usize>);

    /// Queues every rank's groups as `Processes::p2p` does, and runs
    /// them with the server as its thread serves: requests posted in the
    /// order `order` (receiver, sender) gives, each queued on the server's
    /// one stream once the words it needs have reached it, seen on the
    /// host between runs of the streams. `pull` says which receivers pull
    /// (their memory cannot be shared). Returns the simulation, run until
    /// nothing can go on, and each message.
    fn queue(
        w: &Words,
        program: &[Vec<Group>],
        pull: &[usize],
        order: Option<&[(usize, usize)]>,
    ) -> (Sim, Vec<Msg>) {
        let n = w.nranks();
        let mut sim = Sim::new();
        let (mut sent, mut received) = (vec![vec![0u64; n]; n], vec![vec![0u64; n]; n]);
        let mut requests = Vec::new();
        let mut msgs = Vec::new();
        for (me, groups) in program.iter().enumerate() {
            let name = format!("rank {me}");
            for (sends, recvs) in groups {
                let (mut frees, mut waits, mut ends) = (Vec::new(), Vec::new(), Vec::new());
                let mut pushes = Vec::new();
                for &p in sends {
                    sent[me][p] += 1;
                    let k = sent[me][p];
                    if !pushed(w, me, p, pull) {
                        let store = w.send(me, p, k);
                        if me == w.leader && p != me && w.served(me, p) {
                            // Stored once the receiver's answer came.
                            pushes.push(store);
                        } else {
                            sim.push(&name, [store]);
                        }
                        ends.push(w.send_end(me, p, k));
                    } else {
                        pushes.extend(w.push(p, k, (me, p, k)));
                    }
                }
                for &q in recvs {
                    received[q][me] += 1;
                    let k = received[q][me];
                    msgs.push((q, me, k));
                    if pushed(w, q, me, pull) {
                        let [free, landed] = w.recv_pushed(me, k);
                        frees.push(free);
                        waits.push(landed);
                    } else if w.served(q, me) {
                        let pulls = pull.contains(&me);
                        // The leader's messages pulled: the leader's
                        // stream stores their READY, the server nothing.
                        if q != w.leader {
                            requests.push((me, q, k, pulls));
                        }
                        if pulls {
                            waits.extend(w.recv_pull(q, me, k, (q, me, k)));
                        } else {
                            // As `Processes::p2p`: every free first.
                            let [free, landed] = w.recv_copied(q, me, k);
                            frees.push(free);
                            waits.push(landed);
                        }
                    } else {
                        waits.extend(w.recv_pull(q, me, k, (q, me, k)));
                    }
                }
                sim.push(&name, frees);
                sim.push(&name, pushes);
                sim.push(&name, waits);
                sim.push(&name, ends);
            }
        }
        if let Some(order) = order {
            let key = |r: &(usize, usize, u64, bool)| {
                order.iter().position(|&(rr, q)| rr == r.0 && q == r.1)
            };
            requests.sort_by_key(|r| (key(r), r.2));
        }
        let mut backlog = Backlog::new(n);
        for (r, q, k, pulls) in requests {
            backlog.push(Pending {
                q,
                r,
                k,
                copy: !pulls,
                work: (!pulls).then_some((q, r, k)),
            });
        }
        loop {
            sim.run();
            let mem = &sim.mem;
            let ready =
                backlog.take_ready(|i| mem.get(&(w.srv + 8 * i as u64)).copied().unwrap_or(0));
            if ready.is_empty() {
                break;
            }
            for p in ready {
                sim.push("server", w.serve(p.q, p.r, p.k, p.work));
            }
        }
        assert!(backlog.is_empty() || !sim.stuck().is_empty());
        (sim, msgs)
    }

    /// Whether `q`'s messages to `r` are written by `q`'s own stream: the
    /// leader's, to a served rank whose buffer can be shared (not in
    /// `pull`), as `Processes::p2p` decides from the receiver's answer.
    fn pushed(w: &Words, q: usize, r: usize, pull: &[usize]) -> bool {
        q == w.leader && r != q && w.served(q, r) && !pull.contains(&r)
    }

    /// Each message was copied once both ranks' streams had reached it,
    /// and before either went past it.
    fn check_order(w: &Words, sim: &Sim, msgs: &[Msg], pull: &[usize]) {
        for &(q, r, k) in msgs {
            let (sender, receiver) = (format!("rank {q}"), format!("rank {r}"));
            if pushed(w, q, r, pull) {
                let copy = sim.at(&sender, Op::Copy((q, r, k)));
                let [free, landed] = w.recv_pushed::<Msg>(r, k);
                assert!(sim.at(&receiver, free) < copy, "{q}->{r} #{k}");
                assert!(copy < sim.at(&receiver, landed), "{q}->{r} #{k}");
                continue;
            }
            let pulls = !w.served(q, r) || pull.contains(&r);
            let copier = if pulls {
                receiver.clone()
            } else {
                "server".to_string()
            };
            let copy = sim.at(&copier, Op::Copy((q, r, k)));
            assert!(sim.at(&sender, w.send(q, r, k)) < copy, "{q}->{r} #{k}");
            assert!(copy < sim.at(&sender, w.send_end(q, r, k)), "{q}->{r} #{k}");
            if !pulls {
                let [rready, landed] = w.recv_copied::<Msg>(q, r, k);
                assert!(sim.at(&receiver, rready) < copy, "{q}->{r} #{k}");
                assert!(copy < sim.at(&receiver, landed), "{q}->{r} #{k}");
            }
        }
    }

    #[test]
    fn a_sendrecv_ring_and_an_all_to_all_complete_in_order() {
        for (n, full) in [2, 3, 4].into_iter().flat_map(|n| [(n, true), (n, false)]) {
            // Without `full` the server copies nothing: the leader's
            // messages are the leader's stream's, the rest pulled.
            let w = Words { full, ..words(n) };
            let mut program = vec![Vec::new(); n];
            for (me, groups) in program.iter_mut().enumerate() {
                for _ in 0..3 {
                    groups.push((vec![(me + 1) % n], vec![(me + n - 1) % n]));
                }
                // A rank other than the leader sends its own block too
                // (`SharedGpu::routes_self`); the leader copies its own.
                let peers: Vec<usize> = (0..n).filter(|&p| p != me || me != w.leader).collect();
                groups.push((peers.clone(), peers));
            }
            for pull in [vec![], vec![1]] {
                let (sim, msgs) = queue(&w, &program, &pull, None);
                assert_eq!(sim.stuck(), Vec::<String>::new(), "{n} ranks stuck");
                check_order(&w, &sim, &msgs, &pull);
                assert!(full || sim.log.iter().all(|(s, _)| s != "server"));
            }
        }
    }

    #[test]
    fn two_ranks_that_send_each_other_in_one_group_do_not_wait_on_each_other() {
        let w = words(3);
        let program = vec![
            vec![(vec![], vec![1])],
            vec![(vec![2], vec![2]), (vec![2, 0], vec![2])],
            vec![(vec![1], vec![1]), (vec![1], vec![1])],
        ];
        let (sim, msgs) = queue(&w, &program, &[], None);
        assert_eq!(sim.stuck(), Vec::<String>::new());
        check_order(&w, &sim, &msgs, &[]);
    }

    #[test]
    fn requests_posted_before_the_ones_they_depend_on_do_not_block_them() {
        // Rank 2 first receives from rank 3, then sends to rank 1. Rank
        // 1's request for rank 2's message comes to the server before rank
        // 2's for rank 3's: a stream that waited on the GPU for requests in
        // arrival order would wait for rank 2's send before the copy rank 2
        // waits for. The host keeps the first pending and serves the
        // second.
        let w = words(4);
        let program = vec![
            vec![],
            vec![(vec![], vec![2])],
            vec![(vec![], vec![3]), (vec![1], vec![])],
            vec![(vec![2], vec![])],
        ];
        let (sim, msgs) = queue(&w, &program, &[], Some(&[(1, 2), (2, 3)]));
        assert_eq!(sim.stuck(), Vec::<String>::new());
        check_order(&w, &sim, &msgs, &[]);
        assert!(
            sim.at("server", Op::Copy((3, 2, 1))) < sim.at("server", Op::Copy((2, 1, 1))),
            "served in the order the words came, not posted"
        );
    }

    #[test]
    fn the_backlog_serves_what_is_ready_in_any_order_and_keeps_each_pair_in_order() {
        let n = 3;
        let mut words = vec![0u32; 2 * n * n];
        let post = |b: &mut Backlog<&str>, q, r, k, copy, work| {
            b.push(Pending {
                q,
                r,
                k,
                copy,
                work,
            })
        };
        let mut b = Backlog::new(n);
        post(&mut b, 1, 2, 1, true, "1->2 #1");
        post(&mut b, 0, 1, 1, true, "0->1 #1");
        post(&mut b, 2, 1, 1, false, "2->1 #1 pulled");
        let works =
            |ps: Vec<Pending<&'static str>>| ps.into_iter().map(|p| p.work).collect::<Vec<_>>();
        // Nothing stored yet: nothing goes.
        assert!(b.take_ready(|i| words[i]).is_empty());
        // A copy needs both words; a pull the sender's only.
        words[sready_word(n, 1, 2)] = 1;
        words[sready_word(n, 2, 1)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["2->1 #1 pulled"]);
        // The last posted is ready first, then the first.
        words[sready_word(n, 0, 1)] = 1;
        words[rready_word(n, 0, 1)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["0->1 #1"]);
        words[rready_word(n, 1, 2)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["1->2 #1"]);
        assert!(b.is_empty());
        // A pair's later request waits behind its earlier one even where
        // its own words are there (a pull needs no RECV READY).
        post(&mut b, 1, 2, 2, true, "1->2 #2");
        post(&mut b, 1, 2, 3, false, "1->2 #3 pulled");
        words[sready_word(n, 1, 2)] = 3;
        assert!(b.take_ready(|i| words[i]).is_empty());
        words[rready_word(n, 1, 2)] = 2;
        assert_eq!(
            works(b.take_ready(|i| words[i])),
            vec!["1->2 #2", "1->2 #3 pulled"]
        );
        // Wrapping: message 2^32 + 1 is word value 1, past u32::MAX.
        let k = (1u64 << 32) + 1;
        post(&mut b, 2, 0, k, false, "2->0 wrapped");
        words[sready_word(n, 2, 0)] = u32::MAX;
        assert!(b.take_ready(|i| words[i]).is_empty(), "MAX is before 1");
        words[sready_word(n, 2, 0)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["2->0 wrapped"]);
        assert!(reached(5, u32::MAX - 3), "past the wrap");
        assert!(!reached(u32::MAX - 3, 5));
        assert!(reached(7, 7));
    }

    #[test]
    fn every_stream_waits_on_its_own_words() {
        let n = MAX_SERVED;
        let w = words(n);
        let mut seen = std::collections::HashSet::new();
        for q in 0..n {
            for r in (0..n).filter(|&r| r != q) {
                for at in [w.sready(q, r), w.rready(q, r)] {
                    assert!(at >= w.srv && at + 8 <= w.srv + 16 * (n * n) as u64);
                    assert!(seen.insert(at), "word {at:#x} used twice");
                }
                let mine = |rank: usize, op: Op<()>| {
                    if let Op::Mem(MemOp::Wait { addr: at, .. }) = op {
                        assert!(at >= w.flags[rank] && at < w.flags[rank] + (1 << 20));
                    }
                };
                mine(q, w.send_end(q, r, 1));
                for op in w.recv_copied(q, r, 1) {
                    mine(r, op);
                }
                for op in w.recv_pull(q, r, 1, ()) {
                    mine(r, op);
                }
                if q == w.leader {
                    for op in w.push(r, 1, ()) {
                        mine(q, op);
                    }
                    for op in w.recv_pushed::<()>(r, 1) {
                        mine(r, op);
                    }
                }
                for op in [w.serve(q, r, 1, Some(())), w.serve(q, r, 1, None)].concat() {
                    assert!(
                        !matches!(op, Op::Mem(MemOp::Wait { .. })),
                        "the server never waits"
                    );
                }
            }
        }
        // Without a server every receiver pulls, and senders signal it.
        let w = Words { srv: 0, ..words(3) };
        assert!(!w.served(2, 1) && !w.served(0, 1));
        assert_eq!(w.send::<()>(2, 1, 5), Op::store(w.ready(2, 1), 5));
    }
}
