//! Authenticated, encrypted TCP for oxccl, turned on by one setting:
//! `NCCL_SOCKET_KEY_FILE` names a file with a pre-shared 256-bit key. Every
//! TCP connection oxccl owns (the bootstrap's, the root's, and the socket
//! network's control and data connections) then opens with a Noise
//! `NNpsk0` handshake, which both sides pass only if they hold the key, and
//! carries AES-128-GCM records (ring's, under the keys the handshake ends
//! with) from then on.
//!
//! - [`key`]: the setting and the key file;
//! - [`session`]: the handshake and record layer without sockets;
//! - [`stream`]: a blocking stream over a session.
//!
//! Shared by the core's bootstrap and the socket net plugin; it depends on
//! neither (a plugin never links the core).

pub mod key;
pub mod session;
pub mod stream;
#[cfg(feature = "testing")]
pub mod testing;

pub use key::{Key, KeyError, KEY_ENV};
pub use session::{Role, SecureError, Session, CIPHER, NOISE_PARAMS};
pub use stream::SecureStream;

/// What the logs and `oxccl info` say the connections run.
pub fn describe() -> String {
    format!(
        "{NOISE_PARAMS} handshake (pre-shared key), {CIPHER} records of up to {} KiB",
        session::MAX_PLAIN >> 10
    )
}

#[cfg(test)]
mod tests;
