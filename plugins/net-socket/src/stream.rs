//! One socket of a connection as the other files use it: the socket with
//! its session ([`Stream`]), reading and writing it without SIGPIPE
//! ([`Io`]), and its errors as the core should see them. Below the
//! connection, the requests and the helper threads, which all take it.

use std::io::{self, ErrorKind, Read, Write};
use std::os::raw::c_int;

use oxccl_plugin::NetError;
use oxccl_secure::{SecureError, Session};
use socket2::Socket;

/// A write to a socket the peer closed must be an error, not SIGPIPE: as a
/// library loaded into a C program we cannot rely on the signal being
/// ignored. (std's `TcpStream` sets this flag on `write` but not on
/// `write_vectored`, hence socket2 with explicit flags.)
#[cfg(any(target_os = "linux", target_os = "android"))]
pub const MSG_NOSIGNAL: c_int = 0x4000;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub const MSG_NOSIGNAL: c_int = 0;

/// A socket and, with a key, its session.
pub struct Stream {
    pub sock: Socket,
    pub sess: Option<Box<Session>>,
}

/// A socket as `Read + Write` for a session, sending with MSG_NOSIGNAL.
pub struct Io<'a>(pub &'a Socket);

impl Read for Io<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self.0).read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        (&*self.0).read_vectored(bufs)
    }
}

impl Write for Io<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.send_with_flags(buf, MSG_NOSIGNAL)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A session's failure on an established connection.
pub fn secure_error(peer: &str, e: SecureError) -> NetError {
    match e {
        SecureError::Io(e) => io_error(peer, e),
        e => NetError::Remote(format!("connection to {peer}: {e}")),
    }
}

/// A socket error as the core should see it: the peer going away, or bytes
/// of it refused, is a remote error, anything else a system one.
pub fn io_error(peer: &str, e: io::Error) -> NetError {
    match e.kind() {
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::BrokenPipe
        | ErrorKind::ConnectionAborted
        | ErrorKind::NotConnected => {
            NetError::Remote(format!("connection to {peer} closed by peer ({e})"))
        }
        // A session's refusal of what arrived (altered, replayed, cut).
        ErrorKind::InvalidData => NetError::Remote(format!("connection to {peer}: {e}")),
        _ => NetError::System(format!("connection to {peer}: {e}")),
    }
}
