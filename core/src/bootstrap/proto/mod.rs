//! The bootstrap protocol without sockets and without a clock of its own:
//! the unique id's layout, frames (encoding, an incremental reader, the
//! splitting of long messages), the tag layout, the schedules of the ring
//! allgather and of the barrier, and the root's state machine (events in,
//! decisions out). The socket code in `root.rs`, `service.rs` and `tcp.rs`
//! only moves bytes and time into these types.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::error::Error;

mod frame;
mod root_state;
pub use frame::{
    chunks, encode_header, rank_frame_limit, Frame, FrameError, FrameReader, Header, PieceError,
    Reassembler, ABORT, ADDRS, DATA, ERROR, FRAME_HEADER, HELLO, LOOKUP, MAX_ABORT, MAX_CHUNK,
    MAX_HELLO, MAX_MESSAGE, MAX_RANKS, MORE, NEIGHBOURS, PROGRESS, QUERY, TABLE,
};
pub use root_state::{ConnId, Root, RootAction, KEY_REFUSED_GRACE};

// ---------------------------------------------------------------- tags

/// Tags at and above this are the bootstrap's own; users' are below.
pub const TAG_RESERVED: u64 = 1 << 62;
/// Internal tag kinds (4 bits).
pub const TAG_ALLGATHER: u64 = 1;
pub const TAG_BARRIER: u64 = 2;
/// The tables a join through several roots passes along ([`super::roots`]).
pub const TAG_JOIN: u64 = 3;
/// The Bruck exchange of listen addresses after a join through one root.
pub const TAG_ADDRS: u64 = 4;
const STEP_BITS: u32 = 20;
const EPOCH_BITS: u32 = 62 - 4 - STEP_BITS;

/// The tag of step `step` of the `epoch`-th internal operation of `kind`.
/// Epochs wrap (after 2^38 operations); steps are below [`MAX_RANKS`].
pub fn internal_tag(kind: u64, epoch: u64, step: usize) -> u64 {
    debug_assert!(kind < 16 && (step as u64) < (1 << STEP_BITS));
    TAG_RESERVED
        | (kind << (62 - 4))
        | ((epoch & ((1 << EPOCH_BITS) - 1)) << STEP_BITS)
        | step as u64
}

// ---------------------------------------------------------------- schedules

/// Step `k` of the Bruck allgather on `n` ranks (`k` below
/// `bruck_steps(n)`): with `d = 2^k`, rank `me`, which holds the blocks of
/// ranks `me .. me + d` (mod `n`), sends the first `count` of them to
/// `me - d` and receives as many, those of `me + d .. me + d + count`, from
/// `me + d`. Returns `(d, count)`. After the last step every rank holds
/// all `n` blocks: `ceil(log2 n)` messages each way per rank, each block
/// travelling once to each rank.
pub fn bruck_step(n: usize, k: usize) -> (usize, usize) {
    let d = 1usize << k;
    (d, d.min(n - d))
}

/// How many steps the Bruck allgather takes on `n` ranks: `ceil(log2 n)`.
pub fn bruck_steps(n: usize) -> usize {
    barrier_distances(n).count()
}

/// The ranks whose addresses a rank needs to take part in the Bruck
/// allgather and the dissemination barrier: `me + 2^k` and `me - 2^k` for
/// `2^k < n` (at most `2 ceil(log2 n)`; ascending, without `me`). What the
/// root hands each rank of one root.
pub fn neighbours(me: usize, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = barrier_distances(n)
        .flat_map(|d| [(me + d) % n, (me + n - d) % n])
        .filter(|&r| r != me)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Of the ranks in `known`, the one nearest before `target` going up
/// (mod `n`): `target` itself if it is there. What a rank answers to a
/// [`LOOKUP`], and where the asker goes next: each rank knows its
/// [`neighbours`] (`me + 2^k` among them), so each answer at least halves
/// the distance left and a lookup takes at most `ceil(log2 n)` questions.
pub fn closest(target: usize, n: usize, known: impl Iterator<Item = usize>) -> Option<usize> {
    known.min_by_key(|&r| (target + n - r) % n)
}

/// Blocks of varied lengths in one message: a little-endian u32 count,
/// the u32 length of each, then their bytes.
pub fn encode_blocks<'a>(blocks: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let count = blocks.clone().count();
    let total: usize = blocks.clone().map(<[u8]>::len).sum();
    let mut b = Vec::with_capacity(4 + 4 * count + total);
    b.extend_from_slice(&(count as u32).to_le_bytes());
    for x in blocks.clone() {
        b.extend_from_slice(&(x.len() as u32).to_le_bytes());
    }
    for x in blocks {
        b.extend_from_slice(x);
    }
    b
}

pub fn decode_blocks(p: &[u8]) -> Option<Vec<Vec<u8>>> {
    let count = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
    let lens = p.get(4..4usize.checked_add(count.checked_mul(4)?)?)?;
    let mut at = 4 + 4 * count;
    let mut out = Vec::with_capacity(count);
    for l in lens.chunks(4) {
        let l = u32::from_le_bytes(l.try_into().ok()?) as usize;
        out.push(p.get(at..at.checked_add(l)?)?.to_vec());
        at += l;
    }
    (at == p.len()).then_some(out)
}

/// The distances of the dissemination barrier's rounds: in round `k` rank
/// `me` signals `me + d_k` and waits for `me - d_k`, with `d_k = 2^k < n`.
pub fn barrier_distances(n: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2)).take_while(move |&d| d < n)
}

// ---------------------------------------------------------------- addresses and the id

/// An address in 19 bytes: family (4 or 6), port, then the IP.
pub const ADDR_BYTES: usize = 19;

pub fn encode_addr(a: &SocketAddr) -> [u8; ADDR_BYTES] {
    let mut b = [0u8; ADDR_BYTES];
    b[1..3].copy_from_slice(&a.port().to_le_bytes());
    match a.ip() {
        IpAddr::V4(v) => {
            b[0] = 4;
            b[3..7].copy_from_slice(&v.octets());
        }
        IpAddr::V6(v) => {
            b[0] = 6;
            b[3..19].copy_from_slice(&v.octets());
        }
    }
    b
}

pub fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    let b = b.get(..ADDR_BYTES)?;
    let port = u16::from_le_bytes([b[1], b[2]]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[3..7]).ok()?)),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[3..19]).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// What a unique id holds. Layout of the 128 bytes: `[0]` version, `[1]`
/// flags, `[8..16]` magic, `[16..35]` the root's address, zeros after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdContents {
    /// The root's address came from NCCL_COMM_ID: rank 0 hosts the root.
    pub from_env: bool,
    pub magic: u64,
    pub root: SocketAddr,
}

pub const ID_VERSION: u8 = 1;
const FLAG_FROM_ENV: u8 = 1;

impl IdContents {
    pub fn encode(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[0] = ID_VERSION;
        b[1] = if self.from_env { FLAG_FROM_ENV } else { 0 };
        b[8..16].copy_from_slice(&self.magic.to_le_bytes());
        b[16..16 + ADDR_BYTES].copy_from_slice(&encode_addr(&self.root));
        b
    }

    /// `None` for bytes that are not an id of this version.
    pub fn decode(b: &[u8; 128]) -> Option<IdContents> {
        if b[0] != ID_VERSION {
            return None;
        }
        Some(IdContents {
            from_env: b[1] & FLAG_FROM_ENV != 0,
            magic: u64::from_le_bytes(b[8..16].try_into().ok()?),
            root: decode_addr(&b[16..16 + ADDR_BYTES])?,
        })
    }
}

/// The magic of an id made from NCCL_COMM_ID: a hash (FNV-1a) of the
/// setting, so that every rank computes the same id on its own.
pub fn comm_id_magic(setting: &str) -> u64 {
    setting
        .trim()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
}

// ---------------------------------------------------------------- root messages

/// What a rank says to the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub rank: usize,
    pub nranks: usize,
    pub listen: SocketAddr,
    /// Answer with the addresses of the rank's [`neighbours`] only
    /// ([`NEIGHBOURS`]), not the whole table: one root's ranks ask so and
    /// gather the rest among themselves; several roots' ranks take their
    /// set's whole table.
    pub neighbours: bool,
}

impl Hello {
    /// The payload (the rank travels as the frame's `from`).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(4 + ADDR_BYTES + 1);
        b.extend_from_slice(&(self.nranks as u32).to_le_bytes());
        b.extend_from_slice(&encode_addr(&self.listen));
        b.push(u8::from(self.neighbours));
        b
    }

    pub fn decode(rank: u32, p: &[u8]) -> Option<Hello> {
        if p.len() != 4 + ADDR_BYTES + 1 || p[4 + ADDR_BYTES] > 1 {
            return None;
        }
        Some(Hello {
            rank: rank as usize,
            nranks: u32::from_le_bytes(p[0..4].try_into().ok()?) as usize,
            listen: decode_addr(&p[4..])?,
            neighbours: p[4 + ADDR_BYTES] == 1,
        })
    }
}

pub fn encode_table(t: &[SocketAddr]) -> Vec<u8> {
    t.iter().flat_map(encode_addr).collect()
}

/// Some ranks' addresses: a little-endian u32 rank, then its address, each.
pub fn encode_entries(e: &[(usize, SocketAddr)]) -> Vec<u8> {
    e.iter()
        .flat_map(|(r, a)| {
            let mut b = (*r as u32).to_le_bytes().to_vec();
            b.extend_from_slice(&encode_addr(a));
            b
        })
        .collect()
}

pub fn decode_entries(p: &[u8]) -> Option<Vec<(usize, SocketAddr)>> {
    const ENTRY: usize = 4 + ADDR_BYTES;
    if !p.len().is_multiple_of(ENTRY) {
        return None;
    }
    p.chunks(ENTRY)
        .map(|c| {
            Some((
                u32::from_le_bytes(c[..4].try_into().ok()?) as usize,
                decode_addr(&c[4..])?,
            ))
        })
        .collect()
}

pub fn decode_table(p: &[u8]) -> Option<Vec<SocketAddr>> {
    if !p.len().is_multiple_of(ADDR_BYTES) {
        return None;
    }
    p.chunks(ADDR_BYTES).map(decode_addr).collect()
}

/// An error frame's payload: the error's `ncclResult_t` code, then its
/// message.
pub fn encode_error(e: &Error) -> Vec<u8> {
    let mut b = vec![e.code() as u8];
    b.extend_from_slice(e.message().as_bytes());
    b
}

pub fn decode_error(p: &[u8]) -> Error {
    let msg = String::from_utf8_lossy(p.get(1..).unwrap_or_default()).into_owned();
    match p.first() {
        Some(2) => Error::System(msg),
        Some(4) => Error::InvalidArgument(msg),
        Some(5) => Error::InvalidUsage(msg),
        Some(6) => Error::Remote(msg),
        _ => Error::Internal(msg),
    }
}

/// Seconds as people write them: `5 s`, `2.5 s`.
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

// ---------------------------------------------------------------- fuzzing

/// What [`digest`] made of a connection's bytes.
#[derive(Debug, Default)]
pub struct Digest {
    /// Whole frames cut out of the stream.
    pub frames: usize,
    /// Whole DATA messages, by tag, in order.
    pub messages: Vec<(u64, Vec<u8>)>,
    /// Why the stream was refused (the reader drops the connection there).
    pub refused: Option<String>,
    /// Most bytes the reader and the reassembler held at once (capacity
    /// reserved included): what the stream cost in memory.
    pub peak_held: usize,
}

/// What the bootstrap's readers make of `bytes` arriving on one connection
/// in reads of `read` bytes: frames cut by a [`FrameReader`] for `magic`,
/// DATA pieces joined by a [`Reassembler`], every other kind's payload
/// decoded as the root and the ranks decode it, hellos fed to a [`Root`];
/// the first 128 bytes are also read as a unique id (the application hands
/// those over). Stops at the first refusal, as a reader does.
///
/// The entry point of the fuzz target (`fuzz/`, `cargo fuzz run
/// bootstrap_frames`) and of its bounded stand-in among the tests:
/// whatever the bytes, this returns, never panics, and never yields a
/// message that the bytes did not hold.
pub fn digest(magic: u64, bytes: &[u8], read: usize) -> Digest {
    digest_limited(magic, bytes, read, MAX_CHUNK, MAX_MESSAGE)
}

/// [`digest`] with other limits on a frame's and a message's size.
pub fn digest_limited(
    magic: u64,
    bytes: &[u8],
    read: usize,
    max_frame: usize,
    max_message: usize,
) -> Digest {
    let mut d = Digest::default();
    if let Some(id) = bytes.get(..128) {
        let id: &[u8; 128] = id.try_into().expect("128 bytes");
        let _ = IdContents::decode(id);
    }
    let t0 = Instant::now();
    let mut root = Root::new(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1),
        Duration::from_secs(1),
        t0,
    );
    let mut reader = FrameReader::new(magic, max_frame);
    let mut pieces = Reassembler::new(max_message);
    for piece in bytes.chunks(read.max(1)) {
        reader.push(piece);
        d.peak_held = d.peak_held.max(reader.held() + pieces.pending());
        loop {
            let h = reader.header();
            let f = match reader.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    d.refused = Some(e.to_string());
                    return d;
                }
            };
            // The header a reader judges first is the frame's.
            assert_eq!(
                h,
                Ok(Some(Header {
                    kind: f.kind,
                    from: f.from,
                    tag: f.tag,
                    len: f.payload.len()
                }))
            );
            d.frames += 1;
            let refused = match f.kind {
                k if k & !MORE == DATA => {
                    match pieces.push(f.tag, k & MORE != 0, f.payload) {
                        Ok(Some(m)) => d.messages.push((f.tag, m)),
                        Ok(None) => {}
                        Err(e) => d.refused = Some(e.to_string()),
                    }
                    false
                }
                HELLO => match Hello::decode(f.from, &f.payload) {
                    Some(h) => {
                        // One connection per hello, as the root sees them.
                        let _ = root.hello(t0, d.frames, &h);
                        false
                    }
                    None => true,
                },
                TABLE => decode_table(&f.payload).is_none(),
                ERROR => {
                    let _ = decode_error(&f.payload).to_string();
                    false
                }
                PROGRESS => f.payload.len() != 8,
                ABORT => {
                    let _ = String::from_utf8_lossy(&f.payload);
                    false
                }
                QUERY => false,
                _ => true,
            };
            if refused {
                d.refused = Some(format!("a malformed frame of kind {}", f.kind));
            }
            if d.refused.is_some() {
                return d;
            }
        }
    }
    let _ = root.poll(t0 + Duration::from_secs(2));
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn a(p: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)
    }

    pub(super) fn hello(rank: usize, nranks: usize, port: u16) -> Hello {
        Hello {
            rank,
            nranks,
            listen: a(port),
            neighbours: false,
        }
    }

    #[test]
    fn ids_roundtrip_and_foreign_bytes_are_refused() {
        for (from_env, root) in [(true, "[::1]:99"), (false, "10.1.2.3:65535")] {
            let id = IdContents {
                from_env,
                magic: 0xdead_beef_0123_4567,
                root: root.parse().unwrap(),
            };
            assert_eq!(IdContents::decode(&id.encode()), Some(id));
        }
        assert_eq!(IdContents::decode(&[0u8; 128]), None);
        let mut b = [0u8; 128];
        b[0] = ID_VERSION;
        b[16] = 5; // no such family
        assert_eq!(IdContents::decode(&b), None);
        assert_eq!(comm_id_magic("h:1"), comm_id_magic(" h:1 "));
        assert_ne!(comm_id_magic("h:1"), comm_id_magic("h:2"));
    }

    #[test]
    fn hello_table_and_error_roundtrip() {
        let h = hello(2, 4, 7);
        assert_eq!(Hello::decode(2, &h.encode()), Some(h));
        assert_eq!(Hello::decode(2, &[1, 2, 3]), None);
        let t = vec![a(1), "[fe80::1]:2".parse().unwrap()];
        assert_eq!(decode_table(&encode_table(&t)), Some(t));
        assert_eq!(decode_table(&[4; 20]), None);
        for e in [
            Error::InvalidUsage("u".into()),
            Error::Remote("r".into()),
            Error::System("s".into()),
            Error::InvalidArgument("a".into()),
        ] {
            assert_eq!(decode_error(&encode_error(&e)), e);
        }
    }

    #[test]
    fn internal_tags_are_disjoint_from_users_and_each_other() {
        let mut seen = std::collections::HashSet::new();
        for kind in [TAG_ALLGATHER, TAG_BARRIER, TAG_JOIN, TAG_ADDRS] {
            for epoch in [0, 1, (1 << EPOCH_BITS) - 1] {
                for step in [0, 1, MAX_RANKS - 1] {
                    let t = internal_tag(kind, epoch, step);
                    assert!(t >= TAG_RESERVED);
                    assert!(seen.insert(t));
                }
            }
        }
        // Epochs wrap instead of spilling into the kind bits.
        assert_eq!(
            internal_tag(TAG_ALLGATHER, 1 << EPOCH_BITS, 3),
            internal_tag(TAG_ALLGATHER, 0, 3)
        );
    }

    /// Runs Bruck's steps in lockstep: every rank ends with every block,
    /// each received once, in `ceil(log2 n)` messages.
    #[test]
    fn bruck_allgather_schedule_delivers_every_block_once() {
        for n in 1..70 {
            // have[me][i]: the block of rank me + i, as it holds them.
            let mut have: Vec<Vec<usize>> = (0..n).map(|me| vec![me]).collect();
            let mut received = vec![0usize; n];
            for k in 0..bruck_steps(n) {
                let (d, count) = bruck_step(n, k);
                let sent: Vec<Vec<usize>> = have.iter().map(|h| h[..count].to_vec()).collect();
                for (me, h) in have.iter_mut().enumerate() {
                    assert_eq!(h.len(), d);
                    let from = &sent[(me + d) % n];
                    assert!(from.iter().enumerate().all(|(i, &b)| b == (me + d + i) % n));
                    h.extend_from_slice(from);
                    received[me] += from.len();
                }
            }
            assert!(bruck_steps(n) <= (n as f64).log2().ceil() as usize);
            for (me, h) in have.iter().enumerate() {
                assert_eq!(h, &(0..n).map(|i| (me + i) % n).collect::<Vec<_>>());
                assert_eq!(received[me], n - 1);
            }
        }
    }

    #[test]
    fn neighbours_are_the_power_of_two_distances_both_ways() {
        assert_eq!(neighbours(0, 1), Vec::<usize>::new());
        assert_eq!(neighbours(0, 2), vec![1]);
        assert_eq!(neighbours(0, 8), vec![1, 2, 4, 6, 7]);
        assert_eq!(neighbours(5, 16), vec![1, 3, 4, 6, 7, 9, 13]);
        for n in 1..300 {
            assert!(neighbours(n / 2, n).len() <= 2 * bruck_steps(n));
        }
    }

    /// Lookups by the neighbours alone reach every rank from every rank
    /// in at most ceil(log2 n) questions.
    #[test]
    fn lookups_through_neighbours_take_log_n_questions() {
        for n in [1usize, 2, 3, 7, 16, 33, 100] {
            for from in 0..n {
                for target in 0..n {
                    let mut at =
                        closest(target, n, neighbours(from, n).into_iter().chain([from])).unwrap();
                    let mut asked = 0;
                    while at != target {
                        let next =
                            closest(target, n, neighbours(at, n).into_iter().chain([at])).unwrap();
                        assert!((target + n - next) % n < (target + n - at) % n);
                        at = next;
                        asked += 1;
                    }
                    assert!(
                        asked <= bruck_steps(n),
                        "{from} -> {target} of {n}: {asked}"
                    );
                }
            }
        }
    }

    #[test]
    fn blocks_and_entries_roundtrip() {
        let bs: Vec<Vec<u8>> = vec![vec![], vec![1, 2, 3], vec![9; 300]];
        let enc = encode_blocks(bs.iter().map(Vec::as_slice));
        assert_eq!(decode_blocks(&enc), Some(bs));
        assert_eq!(decode_blocks(&enc[..enc.len() - 1]), None);
        assert_eq!(decode_blocks(&[5, 0, 0, 0]), None);
        assert_eq!(decode_blocks(&[0xff; 4]), None);
        let e = vec![(3, a(1)), (70000, "[fe80::1]:2".parse().unwrap())];
        assert_eq!(decode_entries(&encode_entries(&e)), Some(e));
        assert_eq!(decode_entries(&[1; 22]), None);
    }

    /// In the dissemination barrier, every rank hears (transitively) from
    /// every other.
    #[test]
    fn barrier_rounds_reach_everyone() {
        assert_eq!(barrier_distances(1).count(), 0);
        assert_eq!(barrier_distances(5).collect::<Vec<_>>(), vec![1, 2, 4]);
        for n in 1..20 {
            let mut knows: Vec<Vec<bool>> =
                (0..n).map(|me| (0..n).map(|r| r == me).collect()).collect();
            for d in barrier_distances(n) {
                let before = knows.clone();
                for (me, k) in knows.iter_mut().enumerate() {
                    let from = (me + n - d) % n;
                    for (r, x) in k.iter_mut().enumerate() {
                        *x |= before[from][r];
                    }
                }
            }
            assert!(knows.iter().all(|k| k.iter().all(|&x| x)), "n = {n}");
        }
    }

    // The fuzz target's bounded stand-in (fuzz/ holds the cargo fuzz one):
    // the reader and decoders of the bootstrap over streams that are
    // garbage, or true streams garbled.

    const M: u64 = 0x0123_4567_89ab_cdef;

    /// A true stream: messages cut into DATA frames, with frames of the
    /// other kinds between them.
    fn stream(msgs: &[(u64, Vec<u8>)], chunk: usize) -> Vec<u8> {
        let mut b = Vec::new();
        for (i, (tag, m)) in msgs.iter().enumerate() {
            let other = [
                (HELLO, hello(i % 3, 3, 9000 + i as u16).encode()),
                (TABLE, encode_table(&[a(1), a(2)])),
                (PROGRESS, (i as u64).to_le_bytes().to_vec()),
                (QUERY, Vec::new()),
            ];
            let (kind, payload) = other[i % other.len()].clone();
            b.extend(
                Frame {
                    magic: M,
                    kind,
                    from: (i % 3) as u32,
                    tag: 0,
                    payload,
                }
                .encode(),
            );
            for (more, piece) in chunks(m, chunk) {
                b.extend(
                    Frame {
                        magic: M,
                        kind: DATA | if more { MORE } else { 0 },
                        from: 1,
                        tag: *tag,
                        payload: piece.to_vec(),
                    }
                    .encode(),
                );
            }
        }
        b
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn garbage_is_refused_or_waited_on_never_a_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000),
            read in 1usize..64,
        ) {
            let d = digest(M, &bytes, read);
            // Garbage rarely starts with the magic: refused at its 8 bytes.
            if bytes.len() >= 8 && bytes[..8] != M.to_le_bytes() {
                proptest::prop_assert!(d.refused.is_some() && d.frames == 0);
            }
        }

        #[test]
        fn true_streams_arrive_whole_and_garbled_ones_never_panic(
            msgs in proptest::collection::vec(
                (0u64..4, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)), 0..6),
            chunk in 1usize..100,
            read in 1usize..200,
            edits in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>(), 0u8..3), 0..4),
        ) {
            let clean = stream(&msgs, chunk);
            let d = digest(M, &clean, read);
            proptest::prop_assert!(d.refused.is_none(), "{:?}", d.refused);
            proptest::prop_assert_eq!(&d.messages, &msgs);
            // Flipped, cut or inserted bytes: whatever comes out, no panic.
            let mut b = clean;
            for (at, v, what) in edits {
                let at = at % (b.len() + 1);
                match what {
                    0 if at < b.len() => b[at] ^= v | 1,
                    1 => b.truncate(at),
                    _ => b.insert(at, v),
                }
            }
            let _ = digest(M, &b, read);
        }

        #[test]
        fn no_stream_holds_more_than_it_sent_or_a_message_past_the_limit(
            pieces in proptest::collection::vec((0u64..2, 0usize..400, proptest::prelude::any::<bool>()), 0..40),
            max_message in 0usize..1500,
            read in 1usize..300,
        ) {
            // DATA frames of random sizes and tags, MORE set at random: a
            // peer (or a bug) that never ends its message, or interleaves.
            let mut b = Vec::new();
            for (tag, len, more) in &pieces {
                let kind = DATA | if *more { MORE } else { 0 };
                b.extend(Frame { magic: M, kind, from: 0, tag: *tag, payload: vec![1; *len] }.encode());
            }
            let d = digest_limited(M, &b, read, 512, max_message);
            for (_, m) in &d.messages {
                proptest::prop_assert!(m.len() <= max_message);
            }
            if let Some(why) = &d.refused {
                proptest::prop_assert!(why.contains("at most") || why.contains("inside one with tag"), "{}", why);
            }
            proptest::prop_assert!(d.peak_held <= 3 * b.len() + 64,
                "held {} for {} bytes", d.peak_held, b.len());
        }
    }
}
