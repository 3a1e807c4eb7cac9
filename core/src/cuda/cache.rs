//! Compiled kernels on disk, so that a second start compiles nothing.
//!
//! One file per key under `$OXCCL_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/oxccl/kernels`, else `~/.cache/oxccl/kernels`
//! (`OXCCL_CACHE_DIR=none` turns the cache off). The key holds everything
//! the binary depends on (source hash, options, architecture, NVRTC
//! version), so entries are never invalidated, only added. A damaged or
//! unreadable entry is a miss; a failed write is logged and forgotten.

use std::io::Write;
use std::path::PathBuf;

use tracing::debug;

use super::nvrtc::Compiled;

const MAGIC: &[u8; 8] = b"OXCCLK01";

pub(crate) fn dir() -> Option<PathBuf> {
    // Text: any value parses (`Err` only where it is not UTF-8, which a
    // communicator's creation has refused already).
    match crate::config::ox::cache_dir().ok().flatten() {
        Some(d) if d.trim() == "none" => return None,
        Some(d) => return Some(PathBuf::from(d)),
        None => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("oxccl").join("kernels"))
}

pub(crate) fn path(key: &str) -> Option<PathBuf> {
    dir().map(|d| d.join(format!("{key}.bin")))
}

/// Layout: magic, u32 count of symbols, each as u32-length-prefixed name
/// and symbol, then the cubin to the end.
fn encode(c: &Compiled) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&(c.symbols.len() as u32).to_le_bytes());
    for (n, s) in &c.symbols {
        for t in [n, s] {
            b.extend_from_slice(&(t.len() as u32).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
        }
    }
    b.extend_from_slice(&c.cubin);
    b
}

fn decode(b: &[u8]) -> Option<Compiled> {
    let rest = b.strip_prefix(MAGIC)?;
    let (n, mut rest) = take_u32(rest)?;
    let mut symbols = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (name, r) = take_str(rest)?;
        let (sym, r) = take_str(r)?;
        symbols.push((name, sym));
        rest = r;
    }
    (!rest.is_empty()).then(|| Compiled {
        cubin: rest.to_vec(),
        symbols,
    })
}

fn take_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (h, t) = b.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*h), t))
}

fn take_str(b: &[u8]) -> Option<(String, &[u8])> {
    let (len, t) = take_u32(b)?;
    let (s, t) = t.split_at_checked(len as usize)?;
    Some((String::from_utf8(s.to_vec()).ok()?, t))
}

pub(crate) fn load(key: &str) -> Option<Compiled> {
    let p = path(key)?;
    let b = std::fs::read(&p).ok()?;
    let c = decode(&b);
    if c.is_none() {
        debug!(target: "oxccl::init", "kernel cache entry {} is damaged; recompiling", p.display());
    }
    c
}

/// Writes through a temporary file and a rename, so that a reader never
/// sees half an entry (several processes start at once).
pub(crate) fn store(key: &str, c: &Compiled) -> Option<PathBuf> {
    let p = path(key)?;
    let res = (|| -> std::io::Result<()> {
        let d = p.parent().expect("cache path has a parent");
        std::fs::create_dir_all(d)?;
        let tmp = d.join(format!(".{key}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&encode(c))?;
        f.sync_all()?;
        std::fs::rename(&tmp, &p)
    })();
    match res {
        Ok(()) => Some(p),
        Err(e) => {
            debug!(target: "oxccl::init", "could not cache kernels at {}: {e}", p.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_damage_is_a_miss() {
        let c = Compiled {
            cubin: vec![1, 2, 3, 0, 255],
            symbols: vec![("&k<float>".into(), "_Z1kIfEv".into())],
        };
        let b = encode(&c);
        assert_eq!(decode(&b), Some(c));
        assert_eq!(decode(&b[..10]), None);
        assert_eq!(decode(b"garbage!"), None);
    }
}
