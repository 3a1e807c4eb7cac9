//! One encrypted connection without sockets (sans-IO): the handshake, then
//! the record layer. Bytes from the wire go in through [`Session::read_with`]
//! (or the buffer it fills), plaintext comes out of [`Session::open`];
//! plaintext goes in through [`Session::seal`], bytes for the wire come out
//! through [`Session::flush_with`]. Blocking and non-blocking callers drive
//! it alike; [`Session::read_from`] reads large records from a socket
//! straight into the caller's buffer and decrypts them there.
//!
//! The exchange, each handshake message framed by a 2-byte big-endian
//! length:
//!
//! 1. initiator -> responder: Noise `NNpsk0` message 1 (`psk, e`: 48 bytes,
//!    an AEAD tag keyed by the pre-shared key, so a wrong key fails here);
//! 2. responder -> initiator: message 2 (`e, ee`: 48 bytes);
//! 3. initiator -> responder: an empty record, the key confirmation. A
//!    replayed message 1 gets past step 1 but cannot make this record (it
//!    needs the initiator's ephemeral secret), so the responder lets
//!    nothing through before it.
//!
//! Then records, with the two keys Noise's handshake ends with (one per
//! direction, each record key its first 128 bits) used by ring's
//! AES-128-GCM directly: a 4-byte big-endian
//! plaintext length (at most [`MAX_PLAIN`], authenticated as the record's
//! associated data), the ciphertext, the 16-byte tag; the nonce is the
//! record's number in its direction. Noise's own transport messages stop at
//! 64 KiB and copy every byte in and out of its buffers; these records are
//! four times larger and are opened where they land. A record altered,
//! dropped, reordered or replayed fails authentication and ends the
//! connection.

use std::io::{self, ErrorKind, IoSliceMut, Read, Write};
use std::time::{Duration, Instant};

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_128_GCM};
use snow::resolvers::{DefaultResolver, FallbackResolver, RingResolver};

use crate::key::Key;

/// The Noise protocol name: pre-shared key mixed in before the first
/// message, X25519 ephemeral keys (forward secrecy), AES-256-GCM, SHA-256.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
/// The cipher of the records, as logs name it. AES-128 rather than the
/// handshake's AES-256: its 10 rounds against 14 seal 1.45x and open 1.25x
/// faster on one core (examples/seal_speed.rs), and the cipher is what
/// limits an encrypted connection; it is TLS 1.3's mandatory suite, and
/// any 128 bits of a Noise split key (an HKDF output) are a uniform key.
pub const CIPHER: &str = "AES-128-GCM";
const TAG: usize = 16;
/// Largest plaintext of one record: large enough that the per-record costs
/// (a header, a tag, a call into the cipher) vanish, small enough to stay
/// in a core's L2 cache between the copy and the cipher.
pub const MAX_PLAIN: usize = 256 << 10;
/// Length prefix of a handshake message.
const HS_LEN: usize = 2;
/// Length prefix of a record.
const LEN: usize = 4;
/// Both handshake messages: an ephemeral key and the tag of an empty payload.
pub const HANDSHAKE_MESSAGE: usize = 32 + TAG;
/// Plaintext sealed per [`Session::seal`] call in [`Session::send_all`] and
/// by the socket network: a large write interleaves encryption and sending,
/// and one system call sends four records (batches of one record measured
/// no faster on the 2-core VM, 2026-11-25, 9e4d26e).
pub const SEAL_BATCH: usize = 4 * MAX_PLAIN;
/// Records from this size on are read by [`Session::read_from`] straight
/// into the caller's buffer (when they fit there); smaller ones go through
/// the session's buffer, where one read brings in many.
pub const DIRECT_FROM: usize = 16 << 10;
/// Most bytes [`Session::read_from`] reads ahead into the session's buffer
/// while it does not know what comes: little, so that the start of a large
/// record is seldom caught there (and copied out later).
const READ_AHEAD: usize = 16 << 10;
/// Bytes read past a record being received straight into the caller's
/// buffer: the next record's length (and a small record after it), so that
/// the next large one can start there too without a read of its own.
const LOOKAHEAD: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected.
    Initiator,
    /// The side that accepted.
    Responder,
}

/// Why a connection was refused or ended; each says what to check.
#[derive(Debug, thiserror::Error)]
pub enum SecureError {
    #[error("the peer does not speak oxccl's encrypted protocol (a record of {len} bytes where the key exchange starts): it has no key (NCCL_SOCKET_KEY_FILE unset there?) or is not an oxccl process")]
    NotEncrypted { len: usize },
    #[error("the peer holds another key (NCCL_SOCKET_KEY_FILE names a different key there), or its key-exchange message was altered on the way")]
    WrongKey,
    #[error("the key exchange was not confirmed: a replayed or forged first message (the sender does not hold this connection's secrets), or altered bytes")]
    NotConfirmed,
    #[error("the peer closed the connection during the key exchange: it holds another key or none (check NCCL_SOCKET_KEY_FILE on both sides; its log says why)")]
    ClosedInHandshake,
    #[error("record {index} failed authentication: bytes altered on the way, replayed, reordered, or not from a holder of the key")]
    Tampered { index: u64 },
    #[error("encrypted stream: {0}")]
    Protocol(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl SecureError {
    /// True for refusals of the peer (as opposed to I/O failures).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, SecureError::Io(_))
    }
}

impl From<SecureError> for io::Error {
    fn from(e: SecureError) -> io::Error {
        match e {
            SecureError::Io(e) => e,
            other => io::Error::new(ErrorKind::InvalidData, other),
        }
    }
}

enum State {
    Handshake(Box<snow::HandshakeState>),
    /// Responder: message 2 sent, waiting for the confirmation record.
    Confirm(Box<Keys>),
    Ready(Box<Keys>),
    Broken,
}

/// The record keys, one per direction, and each direction's next nonce.
struct Keys {
    tx: LessSafeKey,
    rx: LessSafeKey,
    sent: u64,
    received: u64,
}

impl Keys {
    /// Noise's split: the first key protects what the initiator sends.
    fn from_split(role: Role, (k1, k2): ([u8; 32], [u8; 32])) -> Result<Keys, SecureError> {
        let key = |k: &[u8; 32]| {
            UnboundKey::new(&AES_128_GCM, &k[..16])
                .map(LessSafeKey::new)
                .map_err(|_| SecureError::Protocol("cannot make a record key".into()))
        };
        let (tx, rx) = match role {
            Role::Initiator => (key(&k1)?, key(&k2)?),
            Role::Responder => (key(&k2)?, key(&k1)?),
        };
        Ok(Keys {
            tx,
            rx,
            sent: 0,
            received: 0,
        })
    }
}

/// The nonce of record `n` of a direction: never reused under its key.
fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(b)
}

/// A growable byte queue: `data[lo..hi]` is pending.
#[derive(Default)]
struct Buf {
    data: Vec<u8>,
    lo: usize,
    hi: usize,
}

impl Buf {
    fn pending(&self) -> &[u8] {
        &self.data[self.lo..self.hi]
    }
    fn len(&self) -> usize {
        self.hi - self.lo
    }
    fn consume(&mut self, n: usize) {
        self.lo += n;
        if self.lo == self.hi {
            (self.lo, self.hi) = (0, 0);
        }
    }
    /// Room for at least `want` more bytes at the end.
    fn room(&mut self, want: usize) -> &mut [u8] {
        if self.data.len() - self.hi < want && self.lo > 0 {
            self.data.copy_within(self.lo..self.hi, 0);
            (self.lo, self.hi) = (0, self.hi - self.lo);
        }
        if self.data.len() - self.hi < want {
            let n = (self.hi + want).max(2 * self.data.len()).max(4096);
            self.data.resize(n, 0);
        }
        &mut self.data[self.hi..]
    }
    fn commit(&mut self, n: usize) {
        self.hi += n;
    }
}

/// The next whole handshake message in `inb`: where its body starts, and
/// its length.
fn next_message(inb: &Buf) -> Option<(usize, usize)> {
    let p = inb.pending();
    let len = u16::from_be_bytes([*p.first()?, *p.get(1)?]) as usize;
    (p.len() >= HS_LEN + len).then_some((inb.lo + HS_LEN, len))
}

/// The plaintext length a record's header announces, once it is in.
fn record_len(p: &[u8]) -> Option<usize> {
    let h: [u8; LEN] = p.get(..LEN)?.try_into().ok()?;
    Some(u32::from_be_bytes(h) as usize)
}

/// A record being read straight into the caller's buffer: its ciphertext
/// fills `buf[..len]` of the buffer that starts at `at`, its tag `tag`.
struct Direct {
    at: usize,
    header: [u8; LEN],
    len: usize,
    got: usize,
    tag: [u8; TAG],
    tag_got: usize,
}

/// One side of one encrypted connection.
pub struct Session {
    role: Role,
    state: State,
    /// Bytes received, not yet opened.
    inb: Buf,
    /// Bytes to send.
    out: Buf,
    /// Opened plaintext not yet taken.
    plain: Buf,
    direct: Option<Direct>,
}

fn internal(e: snow::Error) -> SecureError {
    SecureError::Protocol(format!("noise: {e}"))
}

impl Session {
    /// Starts a session. `prologue` binds it to its context (protocol and
    /// connection): both sides must give the same bytes. An initiator
    /// queues its first message at once.
    pub fn new(role: Role, key: &Key, prologue: &[u8]) -> Result<Session, SecureError> {
        let params = NOISE_PARAMS.parse().map_err(internal)?;
        let resolver = Box::new(FallbackResolver::new(
            Box::new(RingResolver),
            Box::new(DefaultResolver),
        ));
        let b = snow::Builder::with_resolver(params, resolver)
            .psk(0, key.bytes())
            .and_then(|b| b.prologue(prologue))
            .map_err(internal)?;
        let hs = match role {
            Role::Initiator => b.build_initiator(),
            Role::Responder => b.build_responder(),
        }
        .map_err(internal)?;
        let mut s = Session {
            role,
            state: State::Handshake(Box::new(hs)),
            inb: Buf::default(),
            out: Buf::default(),
            plain: Buf::default(),
            direct: None,
        };
        if role == Role::Initiator {
            s.write_handshake()?;
        }
        Ok(s)
    }

    /// The handshake is over: data may be sealed and opened.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// Ciphertext waiting to be sent.
    pub fn pending_out(&self) -> usize {
        self.out.len()
    }

    /// Bytes received and not yet taken as plaintext (a partial record at
    /// the end of a stream means it was cut).
    pub fn pending_in(&self) -> usize {
        let d = self.direct.as_ref().map_or(0, |d| LEN + d.got + d.tag_got);
        self.inb.len() + self.plain.len() + d
    }

    fn write_handshake(&mut self) -> Result<(), SecureError> {
        let State::Handshake(hs) = &mut self.state else {
            return Err(SecureError::Protocol(
                "handshake message out of turn".into(),
            ));
        };
        let mut m = [0u8; 2 * HANDSHAKE_MESSAGE];
        let n = hs.write_message(&[], &mut m).map_err(internal)?;
        let room = self.out.room(HS_LEN + n);
        room[..HS_LEN].copy_from_slice(&(n as u16).to_be_bytes());
        room[HS_LEN..HS_LEN + n].copy_from_slice(&m[..n]);
        self.out.commit(HS_LEN + n);
        Ok(())
    }

    fn broken(&mut self, e: SecureError) -> SecureError {
        self.state = State::Broken;
        e
    }

    /// Runs the handshake over the records that have come in; queues the
    /// answers. Call after feeding input. Does nothing once ready.
    pub fn advance(&mut self) -> Result<(), SecureError> {
        loop {
            match &mut self.state {
                State::Ready(_) => return Ok(()),
                State::Broken => {
                    return Err(SecureError::Protocol(
                        "the connection already failed".into(),
                    ))
                }
                State::Handshake(hs) => {
                    // Judge the length as soon as it is in: a peer speaking
                    // in clear is refused without waiting for more bytes.
                    let p = self.inb.pending();
                    if p.len() >= HS_LEN {
                        let len = u16::from_be_bytes([p[0], p[1]]) as usize;
                        if len != HANDSHAKE_MESSAGE {
                            let e = if self.role == Role::Responder {
                                SecureError::NotEncrypted { len }
                            } else {
                                SecureError::Protocol(format!(
                                    "a key-exchange answer of {len} bytes (expected {HANDSHAKE_MESSAGE})"
                                ))
                            };
                            return Err(self.broken(e));
                        }
                    }
                    let Some((at, len)) = next_message(&self.inb) else {
                        return Ok(());
                    };
                    let mut scratch = [0u8; HANDSHAKE_MESSAGE];
                    let r = hs.read_message(&self.inb.data[at..at + len], &mut scratch);
                    self.inb.consume(HS_LEN + len);
                    if r.is_err() {
                        return Err(self.broken(SecureError::WrongKey));
                    }
                    if self.role == Role::Responder {
                        self.write_handshake()?;
                    }
                    let State::Handshake(hs) = &mut self.state else {
                        unreachable!("matched above")
                    };
                    if !hs.is_handshake_finished() {
                        return Err(self.broken(SecureError::Protocol(
                            "the key exchange did not finish after two messages".into(),
                        )));
                    }
                    let mut split = hs.dangerously_get_raw_split();
                    let keys = Keys::from_split(self.role, split);
                    // The raw keys live on in ring's key schedule only.
                    split.0.fill(0);
                    split.1.fill(0);
                    let keys = Box::new(keys.map_err(|e| self.broken(e))?);
                    match self.role {
                        Role::Responder => self.state = State::Confirm(keys),
                        Role::Initiator => {
                            self.state = State::Ready(keys);
                            // The confirmation: an empty record.
                            self.seal(&[], 0)?;
                        }
                    }
                }
                State::Confirm(keys) => {
                    // The confirmation is an empty record: anything else is
                    // refused as soon as its length is in.
                    let Some(len) = record_len(self.inb.pending()) else {
                        return Ok(());
                    };
                    if len != 0 {
                        return Err(self.broken(SecureError::NotConfirmed));
                    }
                    if self.inb.len() < LEN + TAG {
                        return Ok(());
                    }
                    let p = self.inb.pending();
                    let header: [u8; LEN] = p[..LEN].try_into().expect("length checked");
                    let tag: [u8; TAG] = p[LEN..LEN + TAG].try_into().expect("length checked");
                    let ok = keys
                        .rx
                        .open_in_place_separate_tag(
                            nonce(keys.received),
                            Aad::from(header),
                            Tag::from(tag),
                            &mut [],
                            0..,
                        )
                        .is_ok();
                    self.inb.consume(LEN + TAG);
                    if !ok {
                        return Err(self.broken(SecureError::NotConfirmed));
                    }
                    keys.received += 1;
                    let State::Confirm(keys) = std::mem::replace(&mut self.state, State::Broken)
                    else {
                        unreachable!("matched above")
                    };
                    self.state = State::Ready(keys);
                }
            }
        }
    }

    /// Encrypts the concatenation of `parts` (up to `limit` bytes of it;
    /// with nothing to seal, one empty record) into records queued for
    /// sending; returns how many plaintext bytes it took.
    pub fn seal(&mut self, parts: &[&[u8]], limit: usize) -> Result<usize, SecureError> {
        let State::Ready(keys) = &mut self.state else {
            return Err(SecureError::Protocol(
                "data sealed before the key exchange finished".into(),
            ));
        };
        let total: usize = parts.iter().map(|p| p.len()).sum::<usize>().min(limit);
        let (mut part, mut off, mut taken) = (0, 0, 0);
        loop {
            let n = (total - taken).min(MAX_PLAIN);
            let room = self.out.room(LEN + n + TAG);
            let header = (n as u32).to_be_bytes();
            room[..LEN].copy_from_slice(&header);
            // ring seals in place: the plaintext is gathered into the
            // output first (a copy the cipher then finds in cache).
            let mut at = LEN;
            while at < LEN + n {
                while off == parts[part].len() {
                    (part, off) = (part + 1, 0);
                }
                let k = (LEN + n - at).min(parts[part].len() - off);
                room[at..at + k].copy_from_slice(&parts[part][off..off + k]);
                (at, off) = (at + k, off + k);
            }
            let tag = keys
                .tx
                .seal_in_place_separate_tag(
                    nonce(keys.sent),
                    Aad::from(header),
                    &mut room[LEN..LEN + n],
                )
                .map_err(|_| SecureError::Protocol("the cipher refused to seal".into()))?;
            keys.sent += 1;
            room[LEN + n..LEN + n + TAG].copy_from_slice(tag.as_ref());
            self.out.commit(LEN + n + TAG);
            taken += n;
            if taken == total {
                return Ok(taken);
            }
        }
    }

    /// The length of the record at the head of `inb`, refused at once if it
    /// exceeds the limit (a stranger's garbage, or a lost framing).
    fn head_len(&mut self) -> Result<Option<usize>, SecureError> {
        match record_len(self.inb.pending()) {
            Some(len) if len > MAX_PLAIN => Err(self.broken(SecureError::Protocol(format!(
                "a record of {len} bytes (at most {MAX_PLAIN})"
            )))),
            r => Ok(r),
        }
    }

    /// Plaintext into `buf`: what was opened before, else the whole records
    /// that are in (decrypted in `buf` where one fits). 0 when nothing is in
    /// (or `buf` is empty).
    pub fn open(&mut self, buf: &mut [u8]) -> Result<usize, SecureError> {
        if self.plain.len() > 0 {
            let n = buf.len().min(self.plain.len());
            buf[..n].copy_from_slice(&self.plain.pending()[..n]);
            self.plain.consume(n);
            return Ok(n);
        }
        self.advance()?;
        if !self.is_ready() || self.direct.is_some() {
            return Ok(0);
        }
        let mut got = 0;
        while got < buf.len() {
            let Some(len) = self.head_len()? else {
                break;
            };
            if self.inb.len() < LEN + len + TAG {
                break;
            }
            let p = self.inb.pending();
            let header: [u8; LEN] = p[..LEN].try_into().expect("length checked");
            let tag: [u8; TAG] = p[LEN + len..LEN + len + TAG]
                .try_into()
                .expect("length checked");
            let at = self.inb.lo + LEN;
            let fits = buf.len() - got >= len;
            let body = if fits {
                &mut buf[got..got + len]
            } else {
                // Opened aside, then handed out in pieces.
                &mut self.plain.room(len)[..len]
            };
            body.copy_from_slice(&self.inb.data[at..at + len]);
            self.inb.consume(LEN + len + TAG);
            if let Err(e) = open_with(&mut self.state, header, tag, body) {
                return Err(self.broken(e));
            }
            if fits {
                got += len;
            } else {
                self.plain.commit(len);
                let n = (buf.len() - got).min(len);
                buf[got..got + n].copy_from_slice(&self.plain.pending()[..n]);
                self.plain.consume(n);
                got += n;
                break;
            }
        }
        Ok(got)
    }

    /// Reads ciphertext with `recv` (a socket's read); returns what it
    /// returned (0: end of stream).
    pub fn read_with(
        &mut self,
        recv: impl FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.fill(recv, READ_CHUNK)
    }

    /// Reads at most about `most` bytes into `inb`, more where the record
    /// being received needs them.
    fn fill(
        &mut self,
        mut recv: impl FnMut(&mut [u8]) -> io::Result<usize>,
        most: usize,
    ) -> io::Result<usize> {
        if self.direct.is_some() {
            return Err(io::Error::other(
                "encrypted stream: read_with in the middle of a record read by read_from",
            ));
        }
        let p = self.inb.pending();
        let need = match (&self.state, record_len(p)) {
            (State::Handshake(_), _) => p.get(..HS_LEN).map_or(HS_LEN, |l| {
                HS_LEN + u16::from_be_bytes([l[0], l[1]]) as usize
            }),
            (_, Some(len)) => LEN + len.min(MAX_PLAIN) + TAG,
            (_, None) => LEN,
        };
        // At least a byte: a read of nothing would look like the end.
        let want = need.saturating_sub(self.inb.len()).max(most).max(1);
        let room = self.inb.room(want);
        let n = recv(&mut room[..want])?;
        self.inb.commit(n);
        Ok(n)
    }

    /// Sends queued ciphertext with `send` until none is left; passes
    /// `WouldBlock` (and other errors) on, keeping what was not sent.
    pub fn flush_with(
        &mut self,
        mut send: impl FnMut(&[u8]) -> io::Result<usize>,
    ) -> io::Result<()> {
        while self.out.len() > 0 {
            match send(self.out.pending()) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.out.consume(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Moves the handshake as far as `s` allows without waiting (on a
    /// non-blocking socket; on a blocking one, until its timeout): true once
    /// it is over and nothing of it is left to send.
    pub fn handshake_step<S: Read + Write>(&mut self, s: &mut S) -> Result<bool, SecureError> {
        loop {
            match self.flush_with(|b| s.write(b)) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                r => r?,
            }
            if self.is_ready() {
                return Ok(true);
            }
            // Only the handshake's bytes: what follows it is read by
            // `read_from`, straight into a caller's buffer where it can.
            match self.fill(|b| s.read(b), 0) {
                Ok(0) => return Err(SecureError::ClosedInHandshake),
                Ok(_) => self.advance()?,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Drives the handshake to its end over a blocking stream (its
    /// timeouts bound each wait; see [`Session::handshake_until`] for a
    /// bound on the whole).
    pub fn handshake<S: Read + Write>(&mut self, s: &mut S) -> Result<(), SecureError> {
        if self.handshake_step(s)? {
            Ok(())
        } else {
            Err(timed_out(None))
        }
    }

    /// Drives the handshake over a blocking stream until `deadline` at the
    /// latest: before every read and write, `limit` sets the stream's
    /// timeouts to the time left, so a peer that trickles its bytes cannot
    /// stretch the exchange past the deadline.
    pub fn handshake_until<S: Read + Write>(
        &mut self,
        s: &mut S,
        deadline: Instant,
        mut limit: impl FnMut(&mut S, Duration) -> io::Result<()>,
    ) -> Result<(), SecureError> {
        let started = Instant::now();
        let waiting =
            |e: &io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(Some(deadline.saturating_duration_since(started))));
            }
            limit(s, left)?;
            match self.flush_with(|b| s.write(b)) {
                Err(e) if waiting(&e) => continue,
                r => r?,
            }
            if self.is_ready() {
                return Ok(());
            }
            match self.fill(|b| s.read(b), 0) {
                Ok(0) => return Err(SecureError::ClosedInHandshake),
                Ok(_) => self.advance()?,
                Err(e) if waiting(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Plaintext into `buf`: what is buffered, else what reads of `s`
    /// bring. `None` when `s` has nothing now (a non-blocking socket, or a
    /// blocking one's timeout); `Some(0)` at the end of the stream (an
    /// error if it cuts a record).
    ///
    /// A record of [`DIRECT_FROM`] bytes or more that fits in `buf` is read
    /// into `buf` and decrypted there, with no copy. If `s` runs dry in the
    /// middle of one (`None`), its ciphertext stays in `buf` beyond what was
    /// returned: the next call must pass the same memory from the same
    /// start (the rest of the buffer, as a caller filling a buffer does),
    /// else it fails. Bytes changed there in between fail authentication.
    pub fn read_from<S: Read>(
        &mut self,
        s: &mut S,
        buf: &mut [u8],
    ) -> Result<Option<usize>, SecureError> {
        loop {
            if self.direct.is_some() {
                match self.read_direct(s, buf)? {
                    Some(0) => continue,
                    r => return Ok(r),
                }
            }
            let n = self.open(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(Some(n));
            }
            if self.is_ready() {
                if let Some(len) = self.head_len()? {
                    if len >= DIRECT_FROM && len <= buf.len() {
                        self.start_direct(len, buf);
                        continue;
                    }
                }
            }
            match self.fill(|b| s.read(b), READ_AHEAD) {
                Ok(0) if self.pending_in() == 0 => return Ok(Some(0)),
                Ok(0) => return Err(cut()),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Starts reading the record at the head of `inb` (of `len` bytes) into
    /// `buf`: what of it is in moves there now.
    fn start_direct(&mut self, len: usize, buf: &mut [u8]) {
        let p = self.inb.pending();
        let header: [u8; LEN] = p[..LEN].try_into().expect("length checked");
        let body = (p.len() - LEN).min(len);
        buf[..body].copy_from_slice(&p[LEN..LEN + body]);
        let mut tag = [0u8; TAG];
        let tag_got = (p.len() - LEN - body).min(TAG);
        tag[..tag_got].copy_from_slice(&p[LEN + body..LEN + body + tag_got]);
        self.inb.consume(LEN + body + tag_got);
        self.direct = Some(Direct {
            at: buf.as_ptr() as usize,
            header,
            len,
            got: body,
            tag,
            tag_got,
        });
    }

    /// Reads more of the record being received into `buf`: its plaintext
    /// length once it is whole and opened, `Some(0)` for an empty one,
    /// `None` when `s` has nothing now.
    fn read_direct<S: Read>(
        &mut self,
        s: &mut S,
        buf: &mut [u8],
    ) -> Result<Option<usize>, SecureError> {
        let d = self
            .direct
            .as_mut()
            .expect("called with a record in progress");
        if buf.as_ptr() as usize != d.at || buf.len() < d.len {
            let e = SecureError::Protocol(
                "the receive buffer changed in the middle of a record (read_from's contract)"
                    .into(),
            );
            return Err(self.broken(e));
        }
        while d.got < d.len || d.tag_got < TAG {
            let look = self.inb.room(LOOKAHEAD);
            let mut bufs = [
                IoSliceMut::new(&mut buf[d.got..d.len]),
                IoSliceMut::new(&mut d.tag[d.tag_got..]),
                IoSliceMut::new(&mut look[..LOOKAHEAD]),
            ];
            let n = match s.read_vectored(&mut bufs) {
                Ok(0) => return Err(cut()),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            let body = n.min(d.len - d.got);
            d.got += body;
            let tag = (n - body).min(TAG - d.tag_got);
            d.tag_got += tag;
            self.inb.commit(n - body - tag);
        }
        let d = self.direct.take().expect("checked above");
        if let Err(e) = open_with(&mut self.state, d.header, d.tag, &mut buf[..d.len]) {
            return Err(self.broken(e));
        }
        Ok(Some(d.len))
    }

    /// Seals all of `parts` and sends it over a blocking `s`, in batches of
    /// [`SEAL_BATCH`] (encryption of one batch overlaps the kernel's sending
    /// of the last).
    pub fn send_all<S: Write>(&mut self, s: &mut S, parts: &[&[u8]]) -> Result<(), SecureError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0;
        let mut rest: Vec<&[u8]> = parts.to_vec();
        loop {
            let n = self.seal(&rest, SEAL_BATCH)?;
            done += n;
            self.flush_with(|b| s.write(b))?;
            if done == total {
                return Ok(());
            }
            let mut skip = n;
            rest.retain_mut(|p| {
                let k = skip.min(p.len());
                skip -= k;
                *p = &p[k..];
                !p.is_empty()
            });
        }
    }
}

/// Most ciphertext [`Session::read_with`] reads in one call.
const READ_CHUNK: usize = 1 << 20;

fn timed_out(within: Option<Duration>) -> SecureError {
    let within = within.map_or_else(String::new, |d| format!(" within {:.1} s", d.as_secs_f64()));
    SecureError::Io(io::Error::new(
        ErrorKind::TimedOut,
        format!("the peer did not finish the key exchange{within}"),
    ))
}

fn cut() -> SecureError {
    SecureError::Io(io::Error::new(
        ErrorKind::UnexpectedEof,
        "the connection ended inside an encrypted record",
    ))
}

/// Opens one record's `body` in place with the receiving key of `state`.
fn open_with(
    state: &mut State,
    header: [u8; LEN],
    tag: [u8; TAG],
    body: &mut [u8],
) -> Result<(), SecureError> {
    let State::Ready(keys) = state else {
        return Err(SecureError::Protocol(
            "a record before the key exchange finished".into(),
        ));
    };
    let index = keys.received;
    keys.received += 1;
    keys.rx
        .open_in_place_separate_tag(nonce(index), Aad::from(header), Tag::from(tag), body, 0..)
        .map(|_| ())
        .map_err(|_| SecureError::Tampered { index })
}
