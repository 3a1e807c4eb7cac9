//! Loopback pairs for tests, of this network and of what drives it (the
//! core's proxy): connect and accept polled from one thread, bounded in
//! time, so that a hang fails the test instead of stalling the suite.

use std::time::{Duration, Instant};

use oxccl_plugin::{ListenComm, Net, NetHandle, RecvComm, SendComm};

const LIMIT: Duration = Duration::from_secs(30);

/// A connected pair on device 0 of `net` (this network, or any other, such
/// as one reached through the C ABI). Neither call may block, or this would
/// never finish.
pub fn pair(net: &dyn Net) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (h, mut l) = net.listen(0).unwrap();
    connect_accept(net, h, l.as_mut())
}

/// Polls connect and accept on one listener until both ends exist.
pub fn connect_accept(
    net: &dyn Net,
    mut h: NetHandle,
    l: &mut dyn ListenComm,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let original = h;
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = net.connect(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
        assert!(start.elapsed() < LIMIT, "connect/accept never completed");
    }
    assert_eq!(h, original, "connect leaves the handle as it found it");
    (s.unwrap(), r.unwrap())
}
