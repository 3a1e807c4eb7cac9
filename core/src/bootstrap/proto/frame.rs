//! Bootstrap frames: the kinds, the header, an incremental reader that
//! refuses what a peer may not send before it costs memory, and the
//! splitting and reassembly of long messages.

use std::fmt;

/// A rank's hello to the root: `from` is its rank, the payload its
/// [`Hello`].
pub const HELLO: u8 = 1;
/// The root's answer: every rank's listen address, by rank.
pub const TABLE: u8 = 2;
/// The root's refusal or failure: see [`encode_error`].
pub const ERROR: u8 = 3;
/// A message (or its last piece) for the mailbox of the receiver.
pub const DATA: u8 = 4;
/// The sender failed; the payload says why.
pub const ABORT: u8 = 5;
/// How many operations have you started? Answered on the same connection.
/// A payload of 8 bytes (a little-endian collective number) also asks what
/// the rank called under that number.
pub const QUERY: u8 = 6;
/// The answer to [`QUERY`]: a little-endian u64, then the 32 bytes of the
/// call asked about where the rank still knows it.
pub const PROGRESS: u8 = 7;
/// The root's answer to a hello that asked for neighbours only
/// ([`Hello::neighbours`]): the addresses of the rank's
/// [`neighbours`], as [`encode_entries`] writes them.
pub const NEIGHBOURS: u8 = 8;
/// Whose address do you know nearest before rank `t`? The payload: `t`,
/// a little-endian u32. Answered on the same connection with [`ADDRS`];
/// see [`closest`].
pub const LOOKUP: u8 = 9;
/// The answer to [`LOOKUP`]: one [`encode_entries`] entry.
pub const ADDRS: u8 = 10;
/// Or'ed into [`DATA`]: the message continues in the next frame.
pub const MORE: u8 = 0x80;

/// `[magic u64][kind u8][from u32][tag u64][len u32]`, little endian.
pub const FRAME_HEADER: usize = 8 + 1 + 4 + 8 + 4;
/// Largest payload of one frame between ranks: longer messages travel as
/// several frames, and a header announcing more is refused as garbage
/// (so that a stranger cannot make us allocate gigabytes).
pub const MAX_CHUNK: usize = 16 << 20;
/// Largest message between ranks, reassembled from its frames; a sender
/// is refused above it, and a receiver drops the connection that goes past
/// it (so that a peer, a bug or a stranger cannot make a rank allocate
/// without bound). The bootstrap's own messages are far smaller: a block
/// of an allgather is one rank's record (its identity, device window,
/// shared-memory name: under 4 KiB), a connection handle 128 bytes, a
/// failure notice a line of text; what is left is room for users of
/// [`crate::bootstrap::Bootstrap::send`] (NCCL's bootstrap carries no more).
pub const MAX_MESSAGE: usize = 64 << 20;
/// Largest communicator: ranks travel as u32 and tag steps get 20 bits.
pub const MAX_RANKS: usize = 1 << 20;
/// Largest hello payload the root reads.
pub const MAX_HELLO: usize = 64;

/// One frame, header and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub magic: u64,
    pub kind: u8,
    pub from: u32,
    pub tag: u64,
    pub payload: Vec<u8>,
}

/// The header of a frame carrying `len` payload bytes (below 4 GiB).
pub fn encode_header(magic: u64, kind: u8, from: u32, tag: u64, len: usize) -> [u8; FRAME_HEADER] {
    let len = u32::try_from(len).expect("a frame's payload fits in u32");
    let mut h = [0u8; FRAME_HEADER];
    h[0..8].copy_from_slice(&magic.to_le_bytes());
    h[8] = kind;
    h[9..13].copy_from_slice(&from.to_le_bytes());
    h[13..21].copy_from_slice(&tag.to_le_bytes());
    h[21..25].copy_from_slice(&len.to_le_bytes());
    h
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FRAME_HEADER + self.payload.len());
        b.extend_from_slice(&encode_header(
            self.magic,
            self.kind,
            self.from,
            self.tag,
            self.payload.len(),
        ));
        b.extend_from_slice(&self.payload);
        b
    }
}

/// Why a byte stream is not a stream of our frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The first 8 bytes of a frame are not this communicator's magic:
    /// another job, a stale process, or a stray client (a port scanner).
    BadMagic(u64),
    /// The header announces more payload than this reader accepts.
    TooLong { len: usize, max: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadMagic(m) => write!(
                f,
                "wrong magic {m:#018x} (another job, a stale process, or not an oxccl bootstrap client)"
            ),
            FrameError::TooLong { len, max } => {
                write!(f, "a frame announcing {len} bytes (at most {max} accepted)")
            }
        }
    }
}

/// A frame's header, read before its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub from: u32,
    pub tag: u64,
    /// Payload bytes announced.
    pub len: usize,
}

/// Largest failure notice a rank reads (a sender cuts its message to 64 KiB).
pub const MAX_ABORT: usize = (64 << 10) + 1024;

/// The most payload a rank's service reads in a frame of `kind`, `None`
/// for a kind no rank sends to another (those are refused at their
/// header, before a byte of payload is read).
pub fn rank_frame_limit(kind: u8) -> Option<usize> {
    match kind {
        k if k & !MORE == DATA => Some(MAX_CHUNK),
        ABORT => Some(MAX_ABORT),
        QUERY => Some(64),
        LOOKUP => Some(4),
        _ => None,
    }
}

/// Cuts a byte stream into frames, whatever the sizes of the reads that
/// fed it. Checks the magic as soon as its 8 bytes are in.
#[derive(Debug)]
pub struct FrameReader {
    magic: u64,
    max_payload: usize,
    buf: Vec<u8>,
}

impl FrameReader {
    pub fn new(magic: u64, max_payload: usize) -> FrameReader {
        FrameReader {
            magic,
            max_payload,
            buf: Vec::new(),
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Reserves room for exactly the frame whose header is in (nothing
    /// without one): a reader that has decided to read a long frame holds
    /// its size, not up to twice it as a growing buffer would.
    pub fn reserve_frame(&mut self) {
        if let Ok(Some(h)) = self.header() {
            let want = (FRAME_HEADER + h.len).saturating_sub(self.buf.len());
            self.buf.reserve_exact(want);
        }
    }

    /// No partial frame is buffered (an end of stream here is clean).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes held: those buffered, with the room reserved for them.
    pub fn held(&self) -> usize {
        self.buf.capacity()
    }

    /// The next frame's header once its bytes are in, judged as
    /// [`FrameReader::next_frame`] judges it; nothing is taken. A reader
    /// decides from it whether to read the payload at all.
    pub fn header(&self) -> Result<Option<Header>, FrameError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let magic = u64::from_le_bytes(self.buf[0..8].try_into().expect("8 bytes"));
        if magic != self.magic {
            return Err(FrameError::BadMagic(magic));
        }
        if self.buf.len() < FRAME_HEADER {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buf[21..25].try_into().expect("4 bytes")) as usize;
        if len > self.max_payload {
            return Err(FrameError::TooLong {
                len,
                max: self.max_payload,
            });
        }
        Ok(Some(Header {
            kind: self.buf[8],
            from: u32::from_le_bytes(self.buf[9..13].try_into().expect("4 bytes")),
            tag: u64::from_le_bytes(self.buf[13..21].try_into().expect("8 bytes")),
            len,
        }))
    }

    /// A whole frame is buffered (its header judged as
    /// [`FrameReader::next_frame`] judges it); nothing is taken.
    pub fn has_frame(&self) -> Result<bool, FrameError> {
        Ok(self
            .header()?
            .is_some_and(|h| self.buf.len() >= FRAME_HEADER + h.len))
    }

    /// The next whole frame, `None` while more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let magic = u64::from_le_bytes(self.buf[0..8].try_into().expect("8 bytes"));
        if magic != self.magic {
            return Err(FrameError::BadMagic(magic));
        }
        if self.buf.len() < FRAME_HEADER {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buf[21..25].try_into().expect("4 bytes")) as usize;
        if len > self.max_payload {
            return Err(FrameError::TooLong {
                len,
                max: self.max_payload,
            });
        }
        if self.buf.len() < FRAME_HEADER + len {
            // Nothing reserved for what the header announces (announcing
            // costs a stranger nothing): the buffer grows as bytes come.
            return Ok(None);
        }
        let rest = self.buf.split_off(FRAME_HEADER + len);
        let mut bytes = std::mem::replace(&mut self.buf, rest);
        let payload = bytes.split_off(FRAME_HEADER);
        Ok(Some(Frame {
            magic,
            kind: bytes[8],
            from: u32::from_le_bytes(bytes[9..13].try_into().expect("4 bytes")),
            tag: u64::from_le_bytes(bytes[13..21].try_into().expect("8 bytes")),
            payload,
        }))
    }
}

/// The pieces a message of any length travels in: `(more, piece)`, at
/// least one (an empty message is one empty frame).
pub fn chunks(payload: &[u8], max: usize) -> impl Iterator<Item = (bool, &[u8])> {
    let max = max.max(1);
    let n = payload.len().div_ceil(max).max(1);
    (0..n).map(move |i| {
        let end = ((i + 1) * max).min(payload.len());
        (i + 1 < n, &payload[(i * max).min(end)..end])
    })
}

/// Why a connection's DATA frames do not make messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PieceError {
    /// A piece of another message arrived before the last piece of the
    /// one in progress (a sender writes a message's frames together).
    Interleaved { tag: u64, inside: u64 },
    /// The message grew past the reassembler's limit.
    TooLong { len: usize, max: usize },
}

impl fmt::Display for PieceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PieceError::Interleaved { tag, inside } => write!(
                f,
                "a piece of a message with tag {tag:#x} inside one with tag {inside:#x}"
            ),
            PieceError::TooLong { len, max } => write!(
                f,
                "a message of {len} bytes or more (the bootstrap carries at most {max}): a bug or not an oxccl peer"
            ),
        }
    }
}

/// Joins the pieces of the messages arriving on one connection, up to a
/// limit on a message's size.
#[derive(Debug)]
pub struct Reassembler {
    max: usize,
    partial: Option<(u64, Vec<u8>)>,
}

impl Default for Reassembler {
    fn default() -> Reassembler {
        Reassembler::new(MAX_MESSAGE)
    }
}

impl Reassembler {
    pub fn new(max: usize) -> Reassembler {
        Reassembler { max, partial: None }
    }

    /// A DATA frame's piece; the whole message once its last piece is in.
    pub fn push(
        &mut self,
        tag: u64,
        more: bool,
        payload: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, PieceError> {
        let have = match &self.partial {
            None => 0,
            Some((t, _)) if *t != tag => {
                return Err(PieceError::Interleaved { tag, inside: *t });
            }
            Some((_, acc)) => acc.len(),
        };
        let len = have.saturating_add(payload.len());
        if len > self.max {
            self.partial = None;
            return Err(PieceError::TooLong { len, max: self.max });
        }
        let whole = match self.partial.take() {
            None => payload,
            Some((_, mut acc)) => {
                // Exactly: what a message holds is its bytes, not up to
                // twice them.
                acc.reserve_exact(payload.len());
                acc.extend_from_slice(&payload);
                acc
            }
        };
        if more {
            self.partial = Some((tag, whole));
            Ok(None)
        } else {
            Ok(Some(whole))
        }
    }

    /// Bytes of the message in progress.
    pub fn pending(&self) -> usize {
        self.partial.as_ref().map_or(0, |(_, b)| b.len())
    }

    /// Bytes held for the message in progress (room reserved included).
    pub fn held(&self) -> usize {
        self.partial.as_ref().map_or(0, |(_, b)| b.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_roundtrip_through_the_reader_byte_by_byte() {
        let frames = [
            Frame {
                magic: 9,
                kind: DATA,
                from: 3,
                tag: 77,
                payload: vec![1, 2, 3],
            },
            Frame {
                magic: 9,
                kind: ABORT,
                from: 0,
                tag: u64::MAX,
                payload: vec![],
            },
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut r = FrameReader::new(9, 16);
        let mut got = Vec::new();
        for b in bytes {
            r.push(&[b]);
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        assert!(r.is_empty());
    }

    #[test]
    fn reader_refuses_wrong_magic_early_and_long_frames() {
        let mut r = FrameReader::new(9, 16);
        r.push(&10u64.to_le_bytes());
        assert_eq!(r.next_frame(), Err(FrameError::BadMagic(10)));
        let mut r = FrameReader::new(9, 16);
        r.push(&b"GET / HTTP/1.1\r\n"[..]);
        assert!(matches!(r.next_frame(), Err(FrameError::BadMagic(_))));
        let mut r = FrameReader::new(9, 16);
        r.push(&encode_header(9, DATA, 0, 0, 17));
        assert_eq!(
            r.next_frame(),
            Err(FrameError::TooLong { len: 17, max: 16 })
        );
    }

    #[test]
    fn long_messages_split_and_reassemble() {
        let msg: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for max in [1, 7, 999, 1000, 1001] {
            let pieces: Vec<_> = chunks(&msg, max).collect();
            assert_eq!(pieces.len(), 1000usize.div_ceil(max));
            assert!(pieces.iter().all(|(_, p)| p.len() <= max));
            let mut asm = Reassembler::default();
            let mut out = None;
            for (i, (more, p)) in pieces.iter().enumerate() {
                assert_eq!(*more, i + 1 < pieces.len());
                out = asm.push(5, *more, p.to_vec()).unwrap();
                assert_eq!(out.is_some(), !more);
            }
            assert_eq!(out.unwrap(), msg);
        }
        assert_eq!(chunks(&[], 4).collect::<Vec<_>>(), vec![(false, &[][..])]);
        let mut asm = Reassembler::default();
        assert_eq!(asm.push(1, true, vec![1]), Ok(None));
        assert!(asm.push(2, false, vec![2]).is_err());
    }

    #[test]
    fn messages_past_the_limit_are_refused() {
        let mut asm = Reassembler::new(10);
        assert_eq!(asm.push(1, true, vec![0; 6]), Ok(None));
        assert_eq!(
            asm.push(1, true, vec![0; 5]),
            Err(PieceError::TooLong { len: 11, max: 10 })
        );
        assert_eq!(asm.pending(), 0, "the partial message is dropped");
        // Exactly the limit passes; one frame above it does not.
        let mut asm = Reassembler::new(10);
        assert_eq!(asm.push(1, true, vec![1; 4]), Ok(None));
        assert_eq!(asm.push(1, false, vec![2; 6]).unwrap().unwrap().len(), 10);
        assert!(asm.push(2, false, vec![0; 11]).is_err());
        let e = Reassembler::default()
            .push(3, false, vec![0; MAX_MESSAGE + 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 67108864"), "{e}");
    }

    #[test]
    fn an_announced_length_costs_memory_only_as_its_bytes_arrive() {
        let mut r = FrameReader::new(9, MAX_CHUNK);
        r.push(&encode_header(9, DATA, 0, 0, MAX_CHUNK));
        assert_eq!(r.next_frame(), Ok(None));
        assert!(r.buf.capacity() <= 64, "{}", r.buf.capacity());
        let mut fed = FRAME_HEADER;
        for _ in 0..100 {
            r.push(&[7u8; 10_000]);
            fed += 10_000;
            assert_eq!(r.next_frame(), Ok(None));
            assert!(r.buf.capacity() <= 2 * fed, "{fed}");
        }
    }
}
