//! One encrypted connection without sockets (sans-IO): the handshake, then
//! the record layer. Bytes from the wire go in through [`Session::read_with`]
//! (or the buffer it fills), plaintext comes out of [`Session::open`];
//! plaintext goes in through [`Session::seal`], bytes for the wire come out
//! through [`Session::flush_with`]. Blocking and non-blocking callers drive
//! it alike.
//!
//! On the wire every message is a record: a 2-byte big-endian length, then
//! that many bytes (Noise's framing). The exchange:
//!
//! 1. initiator -> responder: Noise `NNpsk0` message 1 (`psk, e`: 48 bytes,
//!    an AEAD tag keyed by the pre-shared key, so a wrong key fails here);
//! 2. responder -> initiator: message 2 (`e, ee`: 48 bytes);
//! 3. initiator -> responder: an empty transport record, the key
//!    confirmation. A replayed message 1 gets past step 1 but cannot make
//!    this record (it needs the initiator's ephemeral secret), so the
//!    responder lets nothing through before it.
//!
//! Then records of at most 65519 plaintext bytes (Noise's 65535 less the
//! tag), each with its own nonce: a record altered, dropped, reordered or
//! replayed fails authentication and ends the connection.

use std::io::{self, ErrorKind, Read, Write};

use snow::resolvers::{DefaultResolver, FallbackResolver, RingResolver};

use crate::key::Key;

/// The Noise protocol name: pre-shared key mixed in before the first
/// message, X25519 ephemeral keys (forward secrecy), AES-256-GCM, SHA-256.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
/// The cipher of the records, as logs name it.
pub const CIPHER: &str = "AES-256-GCM";
/// Largest record body (Noise's limit).
pub const MAX_RECORD: usize = 65535;
const TAG: usize = 16;
/// Largest plaintext of one record.
pub const MAX_PLAIN: usize = MAX_RECORD - TAG;
const LEN: usize = 2;
/// Both handshake messages: an ephemeral key and the tag of an empty payload.
pub const HANDSHAKE_MESSAGE: usize = 32 + TAG;
/// Plaintext sealed per [`Session::seal`] call at most, so that a large
/// write interleaves encryption and sending.
pub const SEAL_BATCH: usize = 1 << 20;
/// Most ciphertext read from the socket in one call.
const READ_CHUNK: usize = 1 << 20;

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
    Confirm(Box<snow::TransportState>),
    Ready(Box<snow::TransportState>),
    Broken,
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

/// The next whole record in `inb`: where its body starts, and its length.
fn next_record(inb: &Buf) -> Option<(usize, usize)> {
    let p = inb.pending();
    let len = u16::from_be_bytes([*p.first()?, *p.get(1)?]) as usize;
    (p.len() >= LEN + len).then_some((inb.lo + LEN, len))
}

/// One side of one encrypted connection.
pub struct Session {
    role: Role,
    state: State,
    /// Ciphertext received, not yet opened.
    inb: Buf,
    /// Ciphertext to send.
    out: Buf,
    /// Opened plaintext not yet taken.
    plain: Buf,
    records_in: u64,
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
            records_in: 0,
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

    /// Ciphertext received and not yet opened (a partial record at the end
    /// of a stream means it was cut).
    pub fn pending_in(&self) -> usize {
        self.inb.len() + self.plain.len()
    }

    fn write_handshake(&mut self) -> Result<(), SecureError> {
        let State::Handshake(hs) = &mut self.state else {
            return Err(SecureError::Protocol(
                "handshake message out of turn".into(),
            ));
        };
        let mut m = [0u8; 2 * HANDSHAKE_MESSAGE];
        let n = hs.write_message(&[], &mut m).map_err(internal)?;
        let room = self.out.room(LEN + n);
        room[..LEN].copy_from_slice(&(n as u16).to_be_bytes());
        room[LEN..LEN + n].copy_from_slice(&m[..n]);
        self.out.commit(LEN + n);
        Ok(())
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
                    if p.len() >= LEN {
                        let len = u16::from_be_bytes([p[0], p[1]]) as usize;
                        if len != HANDSHAKE_MESSAGE {
                            self.state = State::Broken;
                            return Err(if self.role == Role::Responder {
                                SecureError::NotEncrypted { len }
                            } else {
                                SecureError::Protocol(format!(
                                    "a key-exchange answer of {len} bytes (expected {HANDSHAKE_MESSAGE})"
                                ))
                            });
                        }
                    }
                    let Some((at, len)) = next_record(&self.inb) else {
                        return Ok(());
                    };
                    let mut scratch = [0u8; HANDSHAKE_MESSAGE];
                    let r = hs.read_message(&self.inb.data[at..at + len], &mut scratch);
                    self.inb.consume(LEN + len);
                    if r.is_err() {
                        self.state = State::Broken;
                        return Err(SecureError::WrongKey);
                    }
                    if self.role == Role::Responder {
                        self.write_handshake()?;
                    }
                    let State::Handshake(hs) = std::mem::replace(&mut self.state, State::Broken)
                    else {
                        unreachable!("matched above")
                    };
                    let t = Box::new(hs.into_transport_mode().map_err(internal)?);
                    match self.role {
                        Role::Responder => self.state = State::Confirm(t),
                        Role::Initiator => {
                            self.state = State::Ready(t);
                            // The confirmation: an empty record.
                            self.seal(&[], 0)?;
                        }
                    }
                }
                State::Confirm(t) => {
                    let Some((at, len)) = next_record(&self.inb) else {
                        return Ok(());
                    };
                    let mut scratch = [0u8; TAG];
                    let ok = len == TAG
                        && t.read_message(&self.inb.data[at..at + len], &mut scratch)
                            .is_ok();
                    self.inb.consume(LEN + len);
                    if !ok {
                        self.state = State::Broken;
                        return Err(SecureError::NotConfirmed);
                    }
                    let State::Confirm(t) = std::mem::replace(&mut self.state, State::Broken)
                    else {
                        unreachable!("matched above")
                    };
                    self.state = State::Ready(t);
                }
            }
        }
    }

    /// Encrypts the concatenation of `parts` (up to `limit` bytes of it;
    /// with nothing to seal, one empty record) into records queued for
    /// sending; returns how many plaintext bytes it took.
    pub fn seal(&mut self, parts: &[&[u8]], limit: usize) -> Result<usize, SecureError> {
        let State::Ready(t) = &mut self.state else {
            return Err(SecureError::Protocol(
                "data sealed before the key exchange finished".into(),
            ));
        };
        let total: usize = parts.iter().map(|p| p.len()).sum::<usize>().min(limit);
        let mut gather = Vec::new();
        let (mut part, mut off, mut taken) = (0, 0, 0);
        loop {
            let n = (total - taken).min(MAX_PLAIN);
            // The record's plaintext: a slice of one part when it lies in
            // one (no copy), else gathered.
            while part < parts.len() && off == parts[part].len() {
                (part, off) = (part + 1, 0);
            }
            let plain: &[u8] = if n == 0 {
                &[]
            } else if parts[part].len() - off >= n {
                let s = &parts[part][off..off + n];
                off += n;
                s
            } else {
                gather.clear();
                while gather.len() < n {
                    while off == parts[part].len() {
                        (part, off) = (part + 1, 0);
                    }
                    let k = (n - gather.len()).min(parts[part].len() - off);
                    gather.extend_from_slice(&parts[part][off..off + k]);
                    off += k;
                }
                &gather
            };
            let room = self.out.room(LEN + n + TAG);
            let m = t
                .write_message(plain, &mut room[LEN..LEN + n + TAG])
                .map_err(internal)?;
            room[..LEN].copy_from_slice(&(m as u16).to_be_bytes());
            self.out.commit(LEN + m);
            taken += n;
            if taken == total {
                return Ok(taken);
            }
        }
    }

    /// Plaintext into `buf`: what was opened before, else the records that
    /// are in (straight into `buf` where a whole one fits). 0 when nothing
    /// is in (or `buf` is empty).
    pub fn open(&mut self, buf: &mut [u8]) -> Result<usize, SecureError> {
        if self.plain.len() > 0 {
            let n = buf.len().min(self.plain.len());
            buf[..n].copy_from_slice(&self.plain.pending()[..n]);
            self.plain.consume(n);
            return Ok(n);
        }
        self.advance()?;
        let mut got = 0;
        while got < buf.len() {
            let Some((at, len)) = next_record(&self.inb) else {
                break;
            };
            let State::Ready(t) = &mut self.state else {
                return Ok(got);
            };
            if len < TAG {
                self.state = State::Broken;
                return Err(SecureError::Protocol(format!("a record of {len} bytes")));
            }
            let plen = len - TAG;
            let ct = &self.inb.data[at..at + len];
            // ring decrypts in place when the output has room for the tag.
            let r = if buf.len() - got >= len {
                t.read_message(ct, &mut buf[got..got + len])
            } else {
                let room = self.plain.room(len);
                t.read_message(ct, &mut room[..len])
            };
            self.inb.consume(LEN + len);
            let index = self.records_in;
            self.records_in += 1;
            if r.is_err() {
                self.state = State::Broken;
                return Err(SecureError::Tampered { index });
            }
            if buf.len() - got >= len {
                got += plen;
            } else {
                self.plain.commit(plen);
                let n = (buf.len() - got).min(plen);
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
        mut recv: impl FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        // Enough for the record being received, up to READ_CHUNK ahead.
        let need = self
            .inb
            .pending()
            .get(..LEN)
            .map_or(LEN, |l| LEN + u16::from_be_bytes([l[0], l[1]]) as usize);
        let want = need.saturating_sub(self.inb.len()).max(64 << 10);
        let room = self.inb.room(want);
        let cap = room.len().min(READ_CHUNK.max(want));
        let n = recv(&mut room[..cap])?;
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
            match self.read_with(|b| s.read(b)) {
                Ok(0) => return Err(SecureError::ClosedInHandshake),
                Ok(_) => self.advance()?,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Drives the handshake to its end over a blocking stream (its
    /// timeouts bound it).
    pub fn handshake<S: Read + Write>(&mut self, s: &mut S) -> Result<(), SecureError> {
        if self.handshake_step(s)? {
            Ok(())
        } else {
            Err(SecureError::Io(io::Error::new(
                ErrorKind::TimedOut,
                "the peer did not finish the key exchange in time",
            )))
        }
    }

    /// Plaintext into `buf`: what is buffered, else what one read of `s`
    /// brings. `None` when `s` has nothing now (a non-blocking socket, or a
    /// blocking one's timeout); `Some(0)` at the end of the stream (an
    /// error if it cuts a record).
    pub fn read_from<S: Read>(
        &mut self,
        s: &mut S,
        buf: &mut [u8],
    ) -> Result<Option<usize>, SecureError> {
        loop {
            let n = self.open(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(Some(n));
            }
            match self.read_with(|b| s.read(b)) {
                Ok(0) if self.pending_in() == 0 => return Ok(Some(0)),
                Ok(0) => {
                    return Err(SecureError::Io(io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the connection ended inside an encrypted record",
                    )))
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
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
