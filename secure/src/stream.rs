//! A blocking stream over a [`Session`]: `Read` gives plaintext, `Write`
//! seals and sends. The underlying stream's timeouts bound every call.

use std::io::{self, Read, Write};

use crate::key::Key;
use crate::session::{Role, SecureError, Session, SEAL_BATCH};

pub struct SecureStream<S> {
    s: S,
    session: Session,
}

impl<S: Read + Write> SecureStream<S> {
    /// Runs the handshake on `s` as `role`; fails if the peer does not hold
    /// `key` (or gives another `prologue`).
    pub fn handshake(
        mut s: S,
        role: Role,
        key: &Key,
        prologue: &[u8],
    ) -> Result<SecureStream<S>, SecureError> {
        let mut session = Session::new(role, key, prologue)?;
        session.handshake(&mut s)?;
        Ok(SecureStream { s, session })
    }

    /// A stream whose handshake was driven elsewhere (`session` is ready).
    pub fn from_parts(s: S, session: Session) -> SecureStream<S> {
        SecureStream { s, session }
    }

    pub fn get_ref(&self) -> &S {
        &self.s
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.s
    }
}

impl<S: Read + Write> Read for SecureStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.session.read_from(&mut self.s, buf)? {
            Some(n) => Ok(n),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl<S: Read + Write> Write for SecureStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.session.seal(&[buf], SEAL_BATCH.min(buf.len()))?;
        self.flush()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let s = &mut self.s;
        self.session.flush_with(|b| s.write(b))?;
        s.flush()
    }
}
