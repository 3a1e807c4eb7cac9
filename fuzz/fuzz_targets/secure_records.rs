//! What a stranger can send to an encrypted listener: any bytes, in reads
//! of any size, into a responder's session. It must refuse them or wait,
//! and never hand out plaintext (the stranger holds no key).
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxccl_secure::{Key, Role, Session};

fuzz_target!(|data: &[u8]| {
    let Some((&read, mut bytes)) = data.split_first() else {
        return;
    };
    let read = usize::from(read) + 1;
    let key = Key::from_bytes([7; 32]);
    let mut r = Session::new(Role::Responder, &key, b"fuzz").expect("a session");
    while !bytes.is_empty() {
        let fed = r.read_with(|b| {
            let n = b.len().min(read).min(bytes.len());
            b[..n].copy_from_slice(&bytes[..n]);
            Ok(n)
        });
        let Ok(n) = fed else { return };
        bytes = &bytes[n..];
        if r.advance().is_err() {
            return;
        }
    }
    assert!(!r.is_ready(), "a stranger finished the key exchange");
    let mut buf = [0u8; 64];
    assert_eq!(
        r.open(&mut buf).unwrap_or(0),
        0,
        "plaintext from a stranger"
    );
});
