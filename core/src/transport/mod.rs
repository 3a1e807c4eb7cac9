//! Connections between ranks through the network interface: set up on
//! first use (both ends reach the same point of the same operation), kept
//! for the communicator's life.
//!
//! The receiver listens and sends its handle to the sender through the
//! bootstrap; both then poll `connect`/`accept` together until done.

pub mod shm;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_plugin::{ListenComm, Net, RecvComm, SendComm};

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// Bootstrap tags of connection handles: one per (channel, purpose).
pub const TAG_CONN: u64 = 1 << 32;

/// A connection's place: channel (lane set) and peer rank.
pub type ConnKey = (usize, usize);

/// All connections of one communicator.
#[derive(Default)]
pub struct Connections {
    pub send: BTreeMap<ConnKey, Box<dyn SendComm>>,
    pub recv: BTreeMap<ConnKey, Box<dyn RecvComm>>,
}

impl Connections {
    /// Establishes the missing connections among `sends` and `recvs`.
    pub fn ensure(
        &mut self,
        net: &Arc<dyn Net>,
        bootstrap: &Bootstrap,
        sends: &[ConnKey],
        recvs: &[ConnKey],
        timeout: Duration,
    ) -> Result<()> {
        let ndev = net.devices()?.max(1);
        let mut listens: Vec<(ConnKey, Box<dyn ListenComm>)> = Vec::new();
        for &key in recvs {
            if self.recv.contains_key(&key) || listens.iter().any(|(k, _)| *k == key) {
                continue;
            }
            let (handle, listen) = net
                .listen(key.0 % ndev)
                .map_err(|e| Error::from(e).context(format!("listening for rank {}", key.1)))?;
            bootstrap.send(key.1, TAG_CONN + key.0 as u64, &handle)?;
            listens.push((key, listen));
        }
        let mut connects = Vec::new();
        for &key in sends {
            if self.send.contains_key(&key) || connects.iter().any(|(k, _)| *k == key) {
                continue;
            }
            let bytes = bootstrap.recv(key.1, TAG_CONN + key.0 as u64)?;
            let mut handle = [0u8; oxccl_plugin::NET_HANDLE_MAXSIZE];
            if bytes.len() != handle.len() {
                return Err(Error::Internal(format!(
                    "rank {} sent a {}-byte connection handle",
                    key.1,
                    bytes.len()
                )));
            }
            handle.copy_from_slice(&bytes);
            connects.push((key, handle));
        }
        let start = Instant::now();
        while !(listens.is_empty() && connects.is_empty()) {
            let mut i = 0;
            while i < listens.len() {
                let (key, l) = &mut listens[i];
                match l
                    .accept()
                    .map_err(|e| Error::from(e).context(format!("accepting rank {}", key.1)))?
                {
                    Some(c) => {
                        self.recv.insert(*key, c);
                        listens.swap_remove(i);
                    }
                    None => i += 1,
                }
            }
            let mut i = 0;
            while i < connects.len() {
                let (key, h) = &mut connects[i];
                match net
                    .connect(key.0 % ndev, h)
                    .map_err(|e| Error::from(e).context(format!("connecting to rank {}", key.1)))?
                {
                    Some(c) => {
                        self.send.insert(*key, c);
                        connects.swap_remove(i);
                    }
                    None => i += 1,
                }
            }
            if start.elapsed() > timeout {
                let peers: Vec<usize> = listens
                    .iter()
                    .map(|(k, _)| k.1)
                    .chain(connects.iter().map(|(k, _)| k.1))
                    .collect();
                return Err(Error::Remote(format!(
                    "connections to ranks {peers:?} not established within {:.1} s (NCCL_TIMEOUT)",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}
