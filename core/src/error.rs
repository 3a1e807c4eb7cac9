//! Errors of the library, one variant per NCCL result code.

/// Every failure of oxccl. Each variant maps to one `ncclResult_t`; the
/// message tells the user what went wrong and, where possible, what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `ncclSystemError`: the operating system or a socket failed.
    #[error("system error: {0}")]
    System(String),
    /// `ncclInternalError`: a bug in oxccl or a plugin.
    #[error("internal error: {0}")]
    Internal(String),
    /// `ncclInvalidArgument`: a bad value was passed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// `ncclInvalidUsage`: a call made in the wrong state or order.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// `ncclRemoteError`: a peer failed, vanished, or disagreed.
    #[error("remote error: {0}")]
    Remote(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The `ncclResult_t` value of this error.
    pub fn code(&self) -> i32 {
        match self {
            Error::System(_) => 2,
            Error::Internal(_) => 3,
            Error::InvalidArgument(_) => 4,
            Error::InvalidUsage(_) => 5,
            Error::Remote(_) => 6,
        }
    }

    /// The message without the kind prefix.
    pub fn message(&self) -> &str {
        match self {
            Error::System(m)
            | Error::Internal(m)
            | Error::InvalidArgument(m)
            | Error::InvalidUsage(m)
            | Error::Remote(m) => m,
        }
    }

    /// Prefixes the message with where it happened, keeping the kind.
    pub fn context(self, what: impl std::fmt::Display) -> Error {
        self.map_message(|m| format!("{what}: {m}"))
    }

    /// Ends the message with `tail` (after a space), keeping the kind.
    pub fn append(self, tail: &str) -> Error {
        self.map_message(|m| format!("{m} {tail}"))
    }

    fn map_message(self, f: impl FnOnce(String) -> String) -> Error {
        match self {
            Error::System(m) => Error::System(f(m)),
            Error::Internal(m) => Error::Internal(f(m)),
            Error::InvalidArgument(m) => Error::InvalidArgument(f(m)),
            Error::InvalidUsage(m) => Error::InvalidUsage(f(m)),
            Error::Remote(m) => Error::Remote(f(m)),
        }
    }

    pub(crate) fn io(what: impl std::fmt::Display, e: std::io::Error) -> Error {
        Error::System(format!("{what}: {e}"))
    }
}

impl From<oxccl_plugin::NetError> for Error {
    fn from(e: oxccl_plugin::NetError) -> Self {
        use oxccl_plugin::NetError as N;
        match e {
            N::InvalidArgument(m) => Error::InvalidArgument(m),
            N::System(m) => Error::System(m),
            N::Remote(m) => Error::Remote(m),
            N::Internal(m) => Error::Internal(m),
            N::InvalidUsage(m) => Error::InvalidUsage(m),
            other => Error::Internal(other.to_string()),
        }
    }
}

/// Which ranks a failure took, at which operation: the exclude list a
/// survivor passes to `shrink`. Every error that ends a communicator's
/// operation because of a peer carries one at the end of its message, in a
/// form a C application can parse from `ncclGetLastError`:
/// `[oxccl failure: ranks=1,3 seq=57 op=all_reduce]` (`ranks=none` when
/// every rank still answers, `seq=none` for sends and receives).
///
/// The ranks are those that did not answer a progress query from the rank
/// that first detected the failure (dead, hung, or cut off); the others
/// take its record from its failure notice, so every survivor names the
/// same ranks (ranks that detect it at once each ask, and find the same
/// dead). `seq` is the number (from 0) of the collective the failure
/// stopped: the lowest one in progress among the ranks that answered;
/// `op` the name of the operation the recording rank was in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub ranks: Vec<usize>,
    pub seq: Option<u64>,
    pub op: String,
}

const FAILURE_TAG: &str = "[oxccl failure: ";

impl Failure {
    /// The record as it ends an error message.
    pub fn tag(&self) -> String {
        let ranks = if self.ranks.is_empty() {
            "none".to_string()
        } else {
            let r: Vec<String> = self.ranks.iter().map(|r| r.to_string()).collect();
            r.join(",")
        };
        let seq = self.seq.map_or("none".to_string(), |s| s.to_string());
        format!("{FAILURE_TAG}ranks={ranks} seq={seq} op={}]", self.op)
    }

    /// The last record in `message`, if it holds a well-formed one.
    pub fn parse(message: &str) -> Option<Failure> {
        let at = message.rfind(FAILURE_TAG)?;
        let body = &message[at + FAILURE_TAG.len()..];
        let body = &body[..body.find(']')?];
        let (mut ranks, mut seq, mut op) = (None, None, None);
        for field in body.split(' ') {
            let (k, v) = field.split_once('=')?;
            match k {
                "ranks" if v == "none" => ranks = Some(Vec::new()),
                "ranks" => {
                    ranks = Some(
                        v.split(',')
                            .map(str::parse)
                            .collect::<Result<_, _>>()
                            .ok()?,
                    )
                }
                "seq" if v == "none" => seq = Some(None),
                "seq" => seq = Some(Some(v.parse().ok()?)),
                "op" => op = Some(v.to_string()),
                _ => return None,
            }
        }
        Some(Failure {
            ranks: ranks?,
            seq: seq?,
            op: op?,
        })
    }
}

impl Error {
    /// The failure record this error carries (see [`Failure`]).
    pub fn failure(&self) -> Option<Failure> {
        Failure::parse(self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, Failure};

    #[test]
    fn failure_records_read_back_as_written() {
        for f in [
            Failure {
                ranks: vec![1, 3],
                seq: Some(57),
                op: "all_reduce".into(),
            },
            Failure {
                ranks: vec![],
                seq: None,
                op: "send/recv".into(),
            },
        ] {
            let e = Error::Remote(format!("rank 2 failed: link down {}", f.tag()));
            assert_eq!(e.failure(), Some(f.clone()));
            // A report wrapped in another keeps the outer (last) record.
            let outer = Failure {
                ranks: vec![0],
                ..f.clone()
            };
            let wrapped = format!("{} (seen here as: {})", outer.tag(), f.tag());
            assert_eq!(
                Failure::parse(&format!("x {wrapped} {}", outer.tag())),
                Some(outer)
            );
        }
        assert_eq!(Failure::parse("no record"), None);
        assert_eq!(Failure::parse("[oxccl failure: ranks=x seq=1 op=a]"), None);
        assert_eq!(Failure::parse("[oxccl failure: ranks=1 seq=1]"), None);
    }
}
