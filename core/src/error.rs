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
        let wrap = |m: String| format!("{what}: {m}");
        match self {
            Error::System(m) => Error::System(wrap(m)),
            Error::Internal(m) => Error::Internal(wrap(m)),
            Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
            Error::InvalidUsage(m) => Error::InvalidUsage(wrap(m)),
            Error::Remote(m) => Error::Remote(wrap(m)),
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
