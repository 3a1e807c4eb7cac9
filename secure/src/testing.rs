//! For tests of the users of this crate (feature `testing`): a TCP proxy
//! that forwards every connection it accepts to one address, records what
//! each client sends, and once armed alters one byte of each client stream,
//! as an attacker on the path would.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one client sent, filled in as it arrives.
type Record = Arc<Mutex<Vec<u8>>>;

pub struct TamperProxy {
    pub addr: SocketAddr,
    sent: Arc<Mutex<Vec<Record>>>,
    armed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl TamperProxy {
    /// Listens on loopback and forwards to `to`; once armed, the byte
    /// `flip_at` bytes after the arming in each client stream is flipped.
    pub fn start(to: SocketAddr, flip_at: usize) -> io::Result<TamperProxy> {
        let l = TcpListener::bind(SocketAddr::new(to.ip(), 0))?;
        l.set_nonblocking(true)?;
        let p = TamperProxy {
            addr: l.local_addr()?,
            sent: Arc::default(),
            armed: Arc::default(),
            stop: Arc::default(),
        };
        let (sent, armed, stop) = (p.sent.clone(), p.armed.clone(), p.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((c, _)) => {
                        let rec = Arc::new(Mutex::new(Vec::new()));
                        sent.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(rec.clone());
                        let armed = armed.clone();
                        std::thread::spawn(move || forward(c, to, rec, armed, flip_at));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(p)
    }

    /// From now on, alter one byte of each client stream.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// What each client sent so far, in the order they connected.
    pub fn sent(&self) -> Vec<Vec<u8>> {
        let all = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }
}

impl Drop for TamperProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn forward(mut c: TcpStream, to: SocketAddr, rec: Record, armed: Arc<AtomicBool>, flip_at: usize) {
    let _ = c.set_nonblocking(false);
    let Ok(mut s) = TcpStream::connect(to) else {
        return;
    };
    let _ = (c.set_nodelay(true), s.set_nodelay(true));
    let (Ok(mut c2), Ok(mut s2)) = (c.try_clone(), s.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = io::copy(&mut s2, &mut c2);
        let _ = c2.shutdown(Shutdown::Write);
    });
    let mut b = vec![0u8; 1 << 16];
    let mut since_armed: Option<usize> = None;
    loop {
        let n = match c.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        rec.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(&b[..n]);
        if since_armed.is_none() && armed.load(Ordering::SeqCst) {
            since_armed = Some(0);
        }
        if let Some(at) = since_armed.as_mut() {
            if (*at..*at + n).contains(&flip_at) {
                b[flip_at - *at] ^= 0x20;
            }
            *at += n;
        }
        if s.write_all(&b[..n]).is_err() {
            break;
        }
    }
    let _ = s.shutdown(Shutdown::Write);
}
