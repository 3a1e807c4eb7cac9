//! The records ranks put into the mailbox's slots (`super::mailbox`) and
//! their byte encodings: a call and its buffers as CUDA IPC handles
//! ([`Post`]), the leader's answer ([`Answer`]), a receiver's copy request
//! to the leader's p2p server ([`Request`]) and the server's reply
//! ([`Served`]). Plain data: a slot holds the bytes, the segment's layout
//! and waits are the mailbox's.

use crate::cuda::ipc::Exported;
use crate::cuda::IpcMemHandle;

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
    pub(super) fn code(self) -> u64 {
        match self {
            Answer::Direct => 1,
            Answer::Kernels => 2,
            Answer::Mismatch => 3,
        }
    }
}

pub(super) fn put_exported(b: &mut Vec<u8>, e: &Exported) {
    b.extend_from_slice(&e.handle.0);
    b.extend_from_slice(&e.offset.to_le_bytes());
    b.extend_from_slice(&e.id.to_le_bytes());
}

pub(super) fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
    *rest = tail;
    Some(head)
}

pub(super) fn take_u64(rest: &mut &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(take(rest, 8)?.try_into().ok()?))
}

pub(super) fn take_exported(rest: &mut &[u8]) -> Option<Exported> {
    let handle = IpcMemHandle(take(rest, 64)?.try_into().ok()?);
    let offset = take_u64(rest)?;
    let id = take_u64(rest)?;
    Some(Exported { handle, offset, id })
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
                    put_exported(&mut b, &e);
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
                2 => Buf::Shared(take_exported(&mut rest)?),
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

/// A receiver's request to the leader's server: copy the `k`-th message
/// (from 1) of rank `from` to the receiver, `bytes` long, from `src` (the
/// sender's buffer) into `dst`; or, where `dst` is `None` (memory CUDA IPC
/// cannot share, or a stream being captured), only pass the sender's READY
/// on to the receiver, which pulls the message with its own kernel. For
/// the leader's own messages the server copies nothing (see
/// `server::Forwards`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub from: usize,
    pub k: u64,
    pub bytes: u64,
    pub src: Exported,
    pub dst: Option<Exported>,
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(200);
        b.extend_from_slice(&(self.from as u64).to_le_bytes());
        b.extend_from_slice(&self.k.to_le_bytes());
        b.extend_from_slice(&self.bytes.to_le_bytes());
        put_exported(&mut b, &self.src);
        match &self.dst {
            None => b.push(0),
            Some(e) => {
                b.push(1);
                put_exported(&mut b, e);
            }
        }
        b
    }

    pub fn decode(mut b: &[u8]) -> Option<Request> {
        let rest = &mut b;
        let from = usize::try_from(take_u64(rest)?).ok()?;
        let k = take_u64(rest)?;
        let bytes = take_u64(rest)?;
        let src = take_exported(rest)?;
        let dst = match take(rest, 1)?[0] {
            0 => None,
            1 => Some(take_exported(rest)?),
            _ => return None,
        };
        rest.is_empty().then_some(Request {
            from,
            k,
            bytes,
            src,
            dst,
        })
    }
}

/// The server's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Served {
    /// It copies the message into the receiver's buffer and stores the
    /// receiver's READY and the sender's DONE after it.
    Copied,
    /// It only passes the sender's READY on: the receiver pulls.
    Pull,
    /// The sender is the leader, whose own stream writes the message into
    /// the receiver's buffer once the receiver says it is free (see
    /// `words::Words::push`).
    Pushed,
    /// It could not enqueue the request (the driver's error).
    Failed(String),
}

/// Bits of a request slot's ANSWER word that hold the [`Served`] code;
/// the request's number is above them.
pub(super) const SERVED_BITS: u32 = 3;

impl Served {
    pub(super) fn code(&self) -> u64 {
        match self {
            Served::Copied => 1,
            Served::Pull => 2,
            Served::Failed(_) => 3,
            Served::Pushed => 4,
        }
    }
}
