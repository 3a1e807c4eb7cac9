//! NCCL's connect retries (NCCL_SOCKET_RETRY_CNT and
//! NCCL_SOCKET_RETRY_SLEEP_MSEC), shared by the bootstrap and the socket
//! network as NCCL shares them (`misc/socket.cc`): after the n-th refused,
//! timed-out or unreachable connect the caller waits n times the sleep,
//! and gives up after the count, so NCCL's defaults (34 retries, 100 ms)
//! retry for about 60 s.

use std::time::Duration;

/// NCCL's default count of retries.
pub const NCCL_RETRY_CNT: u32 = 34;
/// NCCL's default first wait, in milliseconds.
pub const NCCL_RETRY_SLEEP_MSEC: u64 = 100;
/// What NCCL_SOCKET_RETRY_CNT accepts.
pub const CNT_EXPECTS: &str = "a whole number of retries from 1 to 100000";
/// What NCCL_SOCKET_RETRY_SLEEP_MSEC accepts.
pub const SLEEP_EXPECTS: &str = "whole milliseconds from 1 to 600000";

/// NCCL's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Retries after the first attempt.
    pub count: u32,
    /// The wait after the first failure; the n-th waits n times it.
    pub sleep: Duration,
}

impl Retry {
    /// The policy the two variables' values ask for (`None`: unset or
    /// blank); `Ok(None)` where both are unset (the caller's own retries
    /// hold), NCCL's default for the one left unset, and an error naming
    /// the variable where a value does not parse or is out of range.
    pub fn from_values(cnt: Option<&str>, sleep: Option<&str>) -> Result<Option<Retry>, String> {
        fn set(v: Option<&str>) -> Option<&str> {
            v.map(str::trim).filter(|v| !v.is_empty())
        }
        let (cnt, sleep) = (set(cnt), set(sleep));
        if cnt.is_none() && sleep.is_none() {
            return Ok(None);
        }
        let count = match cnt {
            None => NCCL_RETRY_CNT,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=100_000).contains(n))
                .ok_or_else(|| format!("NCCL_SOCKET_RETRY_CNT={v:?}: expected {CNT_EXPECTS}"))?,
        };
        let ms = match sleep {
            None => NCCL_RETRY_SLEEP_MSEC,
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=600_000).contains(n))
                .ok_or_else(|| {
                    format!("NCCL_SOCKET_RETRY_SLEEP_MSEC={v:?}: expected {SLEEP_EXPECTS}")
                })?,
        };
        Ok(Some(Retry {
            count,
            sleep: Duration::from_millis(ms),
        }))
    }

    /// From the process environment (the socket network's way).
    pub fn from_env() -> Result<Option<Retry>, String> {
        let get = |n| std::env::var(n).ok();
        Retry::from_values(
            get("NCCL_SOCKET_RETRY_CNT").as_deref(),
            get("NCCL_SOCKET_RETRY_SLEEP_MSEC").as_deref(),
        )
    }

    /// The wait after the `failures`-th failed attempt (from 1), or `None`
    /// where the retries are spent.
    pub fn wait_after(&self, failures: u32) -> Option<Duration> {
        (failures <= self.count).then(|| self.sleep * failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccls_defaults_retry_for_about_a_minute() {
        let r = Retry::from_values(Some("34"), None).unwrap().unwrap();
        let total: Duration = (1..).map_while(|n| r.wait_after(n)).sum();
        assert_eq!(total, Duration::from_millis(100 * 34 * 35 / 2));
        assert_eq!(r.wait_after(1), Some(Duration::from_millis(100)));
        assert_eq!(r.wait_after(3), Some(Duration::from_millis(300)));
        assert_eq!(r.wait_after(35), None);
    }

    #[test]
    fn values_strictly() {
        assert_eq!(Retry::from_values(None, Some(" ")).unwrap(), None);
        let r = Retry::from_values(None, Some("5")).unwrap().unwrap();
        assert_eq!((r.count, r.sleep), (34, Duration::from_millis(5)));
        for (c, s, says) in [
            (Some("0"), None, "NCCL_SOCKET_RETRY_CNT=\"0\""),
            (Some("many"), None, "NCCL_SOCKET_RETRY_CNT=\"many\""),
            (None, Some("-1"), "NCCL_SOCKET_RETRY_SLEEP_MSEC=\"-1\""),
            (None, Some("1s"), "NCCL_SOCKET_RETRY_SLEEP_MSEC=\"1s\""),
        ] {
            let e = Retry::from_values(c, s).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
