//! Sizing a new shared-memory segment so that every page is backed.
//!
//! `ftruncate` only sets a tmpfs file's length: its pages are taken at the
//! first store, and a store that finds /dev/shm full raises SIGBUS, which
//! kills the process with no word of why. `posix_fallocate` takes the pages
//! at once, so a /dev/shm too small for the segment (a container's default
//! 64 MiB, a small tmpfs) is an error at creation that says what to do.

use std::fs::File;

use nix::sys::statvfs::fstatvfs;

/// Sizes `file` (the new segment `/dev/shm<name>`) to `len` bytes with
/// every page reserved. The error is the whole message for the user: the
/// size asked, the room /dev/shm has, and the two ways out.
pub(super) fn reserve(file: &File, name: &str, len: usize) -> Result<(), String> {
    let Ok(off) = nix::libc::off_t::try_from(len) else {
        return Err(format!(
            "shared memory /dev/shm{name}: {len} bytes is more than a file can hold"
        ));
    };
    nix::fcntl::posix_fallocate(file, 0, off).map_err(|e| {
        let room = match fstatvfs(file) {
            Ok(s) => {
                let unit = s.fragment_size().max(1);
                format!(
                    "/dev/shm has {} free of {}",
                    size(s.blocks_available() * unit),
                    size(s.blocks() * unit)
                )
            }
            Err(_) => "/dev/shm's free space is unknown".to_string(),
        };
        format!(
            "shared memory /dev/shm{name}: cannot reserve {} for a segment: {e}; {room}. \
             Give /dev/shm more room (docker run --shm-size=1g, or a larger tmpfs), use a \
             smaller NCCL_BUFFSIZE, or set NCCL_SHM_DISABLE=1 to pass messages over sockets \
             instead",
            size(len as u64)
        )
    })
}

/// `n` bytes for a person: `4194560 bytes (4.0 MiB)`.
fn size(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{n} bytes ({v:.1} {})", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_bytes_and_binary_units() {
        assert_eq!(size(100), "100 bytes");
        assert_eq!(size(4 << 20), "4194304 bytes (4.0 MiB)");
        assert_eq!(size(1536), "1536 bytes (1.5 KiB)");
    }
}
