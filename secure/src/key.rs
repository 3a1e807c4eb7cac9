//! The pre-shared key: one setting, `NCCL_SOCKET_KEY_FILE`, naming a file
//! that holds 32 random bytes as 64 hex digits. Every process of a job must
//! see the same file (or a copy); a process without it, or with another key,
//! cannot join.

use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable naming the key file. The core declares it in its
/// settings table; the socket net plugin reads it here itself (a plugin never
/// links the core), as it reads NCCL_SOCKET_IFNAME.
pub const KEY_ENV: &str = "NCCL_SOCKET_KEY_FILE";

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;

/// A 256-bit pre-shared key. Its bytes never appear in `Debug` output, and
/// are overwritten when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_BYTES]);

/// Why the key could not be had; each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{KEY_ENV}={}: cannot read the key file: {source} (make one with `oxccl keygen > FILE` and give every rank the same file)", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{KEY_ENV}={}: {why} (the file must hold exactly 64 hex digits, 32 random bytes; make one with `oxccl keygen > FILE`)", path.display())]
    Format { path: PathBuf, why: String },
}

impl Key {
    pub fn from_bytes(b: [u8; KEY_BYTES]) -> Key {
        Key(b)
    }

    pub fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// A fresh random key (from the kernel's generator).
    pub fn generate() -> std::io::Result<Key> {
        use std::io::Read;
        let mut b = [0u8; KEY_BYTES];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        Ok(Key(b))
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits, surrounding white space allowed.
    pub fn parse_hex(s: &str) -> Result<Key, String> {
        let s = s.trim();
        if s.len() != 2 * KEY_BYTES {
            return Err(format!(
                "it holds {} characters, not 64 hex digits",
                s.chars().count()
            ));
        }
        let mut b = [0u8; KEY_BYTES];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = s
                .get(2 * i..2 * i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("character {} is not a hex digit", 2 * i + 1))?;
        }
        if b.iter().all(|&x| x == b[0]) {
            return Err("the key is one byte repeated, not a random key".into());
        }
        Ok(Key(b))
    }

    /// Reads the key file at `path`.
    pub fn from_file(path: &Path) -> Result<Key, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: path.to_owned(),
            source,
        })?;
        Key::parse_hex(&text).map_err(|why| KeyError::Format {
            path: path.to_owned(),
            why,
        })
    }

    /// The key of the file `NCCL_SOCKET_KEY_FILE` names; `None` when it is
    /// unset or empty (traffic then goes in clear, as before).
    pub fn from_env() -> Result<Option<Key>, KeyError> {
        match std::env::var_os(KEY_ENV) {
            Some(p) if !p.is_empty() => Key::from_file(Path::new(&p)).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether others than the owner may read the key file (a warning, not
    /// an error: shared file systems differ).
    #[cfg(unix)]
    pub fn readable_by_others(path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(<{KEY_BYTES} bytes, hidden>)")
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // Best effort: the optimizer may keep copies elsewhere.
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip_and_errors_say_what_to_fix() {
        let k = Key::generate().unwrap();
        assert_eq!(Key::parse_hex(&format!(" {}\n", k.to_hex())).unwrap(), k);
        assert!(Key::parse_hex("abc").unwrap_err().contains("3 characters"));
        let bad = format!("{}zz", "0f".repeat(31));
        assert!(Key::parse_hex(&bad).unwrap_err().contains("character 63"));
        assert!(Key::parse_hex(&"00".repeat(32))
            .unwrap_err()
            .contains("repeated"));
        assert!(!format!("{k:?}").contains(&k.to_hex()[..8]));
        let e = Key::from_file(Path::new("/nonexistent/key")).unwrap_err();
        assert!(e
            .to_string()
            .contains("NCCL_SOCKET_KEY_FILE=/nonexistent/key"));
        assert!(e.to_string().contains("oxccl keygen"));
    }
}
