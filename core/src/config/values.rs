//! What a setting's value may be: the value types settings have, and each
//! setting's check of range and form, which the table in the parent module
//! names. A check's `expects` is what docs/settings.md and every error say
//! the setting accepts.

use crate::error::{Error, Result};

/// A value type a setting can have.
pub trait ParamValue: Sized {
    /// What a value must look like, for messages and the docs.
    const EXPECTS: &'static str;
    /// `None`: not a value of this type.
    fn parse(s: &str) -> Option<Self>;
}

impl ParamValue for String {
    const EXPECTS: &'static str = "text";
    fn parse(s: &str) -> Option<Self> {
        Some(s.to_string())
    }
}

/// Blank is `None` (unset: the setting's own default behaviour).
impl<T: ParamValue> ParamValue for Option<T> {
    const EXPECTS: &'static str = T::EXPECTS;
    fn parse(s: &str) -> Option<Self> {
        if s.trim().is_empty() {
            return Some(None);
        }
        T::parse(s).map(Some)
    }
}

impl ParamValue for u64 {
    const EXPECTS: &'static str = "a whole number (K, M, G: times 1024, 1024^2, 1024^3)";
    fn parse(s: &str) -> Option<Self> {
        parse_size(s)
    }
}

impl ParamValue for usize {
    const EXPECTS: &'static str = u64::EXPECTS;
    fn parse(s: &str) -> Option<Self> {
        u64::parse(s).and_then(|v| usize::try_from(v).ok())
    }
}

impl ParamValue for f64 {
    const EXPECTS: &'static str = "a number";
    fn parse(s: &str) -> Option<Self> {
        s.trim().parse().ok()
    }
}

impl ParamValue for bool {
    const EXPECTS: &'static str = "0 or 1";
    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" | "" => Some(false),
            _ => None,
        }
    }
}

/// `auto` or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoOr {
    Auto,
    Count(u64),
}

impl ParamValue for AutoOr {
    const EXPECTS: &'static str = "auto, or a whole number";
    fn parse(s: &str) -> Option<Self> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Some(AutoOr::Auto);
        }
        parse_size(s).map(AutoOr::Count)
    }
}

/// A count with an optional K/M/G suffix (powers of 1024).
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// A range or a form a parsed value must also meet; `expects` replaces the
/// type's [`ParamValue::EXPECTS`] in messages and the docs.
pub struct Check<T: 'static> {
    pub expects: &'static str,
    pub test: fn(&T) -> std::result::Result<(), String>,
}

/// The most NCCL_TIMEOUT may say: 365 days. Beyond it a wait is no bound at
/// all, and Rust's `Duration` (and a deadline past the clock's range) fails
/// before 10^20 seconds.
pub const MAX_TIMEOUT_S: f64 = 365.0 * 24.0 * 3600.0;

pub(super) const TIMEOUT: Check<f64> = Check {
    expects: "seconds: a finite number from 0.001 to 31536000 (365 days)",
    test: |v| {
        if v.is_finite() && (0.001..=MAX_TIMEOUT_S).contains(v) {
            Ok(())
        } else {
            Err("out of range".into())
        }
    },
};

/// NCCL_RAS_TIMEOUT_FACTOR and OXCCL_RAS_STUCK_S: a finite positive number.
pub(super) const RAS_FACTOR: Check<f64> = Check {
    expects: "a finite number from 0.001 to 100000",
    test: |v| {
        if v.is_finite() && (0.001..=1e5).contains(v) {
            Ok(())
        } else {
            Err("out of range".into())
        }
    },
};

/// NCCL_BUFFSIZE's floor. NCCL takes any value (src/init.cc,
/// computeBuffSizes, has no check), and its own defaults are 4 MiB
/// (Simple) and 512 KiB or more (LL, LL128). oxccl cuts the buffer into 8
/// slots (NCCL_STEPS) and each slot is one message between the ranks: at
/// `NCCL_BUFFSIZE=1` the slots were 64 bytes and an 8 MiB reduce_scatter on
/// host memory took 0.7-2.8 s. 64 KiB gives 8 KiB slots, the size of the
/// device path's LL slot, where a slot's own costs (a flag, a wake-up) are
/// small against its bytes.
pub const MIN_BUFFSIZE: u64 = 64 << 10;

/// NCCL_BUFFSIZE's ceiling: the device path's slots are at most 64 MiB
/// (NCCL_BUFFSIZE / 8), so a larger value would be cut there.
pub const MAX_BUFFSIZE: u64 = 512 << 20;

pub(super) const BUFFSIZE: Check<u64> = Check {
    expects: "bytes (K, M, G suffixes) from 64K to 512M",
    test: |v| {
        if (MIN_BUFFSIZE..=MAX_BUFFSIZE).contains(v) {
            Ok(())
        } else {
            Err("out of range".into())
        }
    },
};

pub(super) const PROTO: Check<Option<String>> = Check {
    expects: "a comma-separated list of LL, LL128 and Simple, or ^ and the ones to leave out",
    test: |v| parse_protocols(v.as_deref().unwrap_or("")).map(|_| ()),
};

/// NCCL's limits on the socket network's helper threads and sockets
/// (oxccl-net-socket checks the process environment's values itself).
pub(super) const SOCKET_THREADS: Check<Option<u64>> = Check {
    expects: "a whole number from 0 to 16 (threads x NCCL_NSOCKS_PERTHREAD at most 64)",
    test: |v| match v {
        Some(0..=16) | None => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

pub(super) const NSOCKS: Check<Option<u64>> = Check {
    expects: "a whole number from 1 to 64 (NCCL_SOCKET_NTHREADS x this at most 64)",
    test: |v| match v {
        Some(1..=64) | None => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

pub(super) const FAMILY: Check<Option<String>> = Check {
    expects: "AF_INET or AF_INET6",
    test: |v| match v.as_deref().map(str::trim) {
        None | Some("AF_INET" | "AF_INET6") => Ok(()),
        Some(_) => Err("no such family".into()),
    },
};

pub(super) const THREADS: Check<Option<u64>> = Check {
    expects: "a whole number from 1 to 256",
    test: |v| match v {
        Some(1..=256) | None => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

pub(super) const SHARED_GPU: Check<Option<String>> = Check {
    expects: "leader or kernels",
    test: |v| match v.as_deref().map(str::trim) {
        None | Some("leader" | "kernels") => Ok(()),
        Some(_) => Err("no such path".into()),
    },
};

pub(super) const SHARED_P2P: Check<Option<String>> = Check {
    expects: "pull, leader or server",
    test: |v| match v.as_deref().map(str::trim) {
        None | Some("pull" | "leader" | "server") => Ok(()),
        Some(_) => Err("no such path".into()),
    },
};

pub(super) const COLLNET_ENABLE: Check<u64> = Check {
    expects: "0 or 1",
    test: |v| {
        if *v <= 1 {
            Ok(())
        } else {
            Err("not 0 or 1".into())
        }
    },
};

pub(super) const COLLNET_NODES: Check<u64> = Check {
    expects: "a whole number of nodes from 1",
    test: |v| {
        if *v >= 1 {
            Ok(())
        } else {
            Err("CollNet needs at least one node".into())
        }
    },
};

pub(super) const CTAS: Check<Option<u64>> = Check {
    expects: "a whole number of CTAs from 1 (above 128 means 128)",
    test: |v| match v {
        Some(0) => Err("a communicator needs at least one CTA".into()),
        _ => Ok(()),
    },
};

pub(super) const NTHREADS: Check<Option<u64>> = Check {
    expects: "a multiple of 32 from 64 to 1024 (NCCL takes 64, 128, 256 or 512)",
    test: |v| match v {
        None => Ok(()),
        Some(t) if (64..=1024).contains(t) && t % 32 == 0 => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

pub(super) const CE_COLL: Check<Option<String>> = Check {
    expects: "auto, 1 or 0",
    test: |v| ce_coll_mode(v.as_deref()).map(|_| ()),
};

pub(super) const CTA_POLICY: Check<Option<String>> = Check {
    expects: "DEFAULT, EFFICIENCY or ZERO (or 0, 1, 2), joined by |",
    test: |v| cta_policy(v.as_deref()).map(|_| ()),
};

/// NCCL_CTA_POLICY as NCCL reads it: DEFAULT, EFFICIENCY and ZERO, or
/// their numbers, joined by `|`; ZERO wins over EFFICIENCY where both are
/// set, as in NCCL. Returns the policy's bits.
pub fn cta_policy(s: Option<&str>) -> std::result::Result<u32, String> {
    let Some(s) = s.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(0);
    };
    let mut bits = 0u32;
    for t in s.split('|').map(str::trim) {
        bits |= match t.to_ascii_uppercase().as_str() {
            "DEFAULT" | "0" => 0,
            "EFFICIENCY" | "1" => 1,
            "ZERO" | "2" => 2,
            "3" => 3,
            _ => return Err(format!("{t:?} is no policy")),
        };
    }
    Ok(if bits & 2 != 0 { 2 } else { bits })
}

pub(super) const P2P_LEVEL: Check<Option<String>> = Check {
    expects: "LOC, NVL, PIX, PXB, PHB, SYS or 0-5",
    test: |v| match v.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(()),
        Some(s) => crate::topo::policy::PathLevel::parse(s).map(|_| ()),
    },
};

pub(super) const CROSS_NIC: Check<u64> = Check {
    expects: "0, 1 or 2",
    test: |v| crate::topo::policy::CrossNic::from_setting(*v).map(|_| ()),
};

pub(super) const NETDEVS_POLICY: Check<Option<String>> = Check {
    expects: "AUTO, ALL or MAX:N (N from 1)",
    test: |v| crate::topo::policy::NetDevsPolicy::parse(v.as_deref().unwrap_or("")).map(|_| ()),
};

pub(super) const LAUNCH_MODE: Check<Option<String>> = Check {
    expects: "PARALLEL or GROUP",
    test: |v| match v
        .as_deref()
        .map(|m| m.trim().to_ascii_uppercase())
        .as_deref()
    {
        None | Some("PARALLEL" | "GROUP") => Ok(()),
        Some(_) => Err("no such mode".into()),
    },
};

pub(super) const STAMP_FORMAT: Check<Option<String>> = Check {
    expects: "a strftime format (`_` for a space, %1f to %9f for fractions of a second), under 256 bytes, no NUL",
    test: |v| match v {
        Some(f) if f.len() >= 256 || f.contains('\0') => Err("too long, or holds a NUL".into()),
        _ => Ok(()),
    },
};

/// NCCL_DEBUG_TIMESTAMP_LEVELS: which levels' lines begin with a time
/// (read here, used by [`crate::log`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StampLevels {
    pub warn: bool,
    pub info: bool,
    pub trace: bool,
}

impl StampLevels {
    /// NCCL's list: VERSION, WARN, INFO, ABORT, TRACE or ALL, comma-
    /// separated, case-insensitive; `^` in front: every level but those.
    /// Empty: none. oxccl writes no VERSION or ABORT lines of its own, so
    /// those two are accepted and change nothing.
    pub fn parse(s: &str) -> std::result::Result<StampLevels, String> {
        let s = s.trim();
        let (not, list) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let mut l = StampLevels::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name.to_ascii_uppercase().as_str() {
                "WARN" => l.warn = true,
                "INFO" => l.info = true,
                "TRACE" => l.trace = true,
                "VERSION" | "ABORT" => {}
                "ALL" => {
                    l = StampLevels {
                        warn: true,
                        info: true,
                        trace: true,
                    }
                }
                _ => return Err(format!("{name:?} is no level")),
            }
        }
        if not {
            l = StampLevels {
                warn: !l.warn,
                info: !l.info,
                trace: !l.trace,
            };
        }
        Ok(l)
    }
}

pub(super) const STAMP_LEVELS: Check<Option<String>> = Check {
    expects: "VERSION, WARN, INFO, ABORT, TRACE or ALL, comma-separated, ^ in front to exclude",
    test: |v| StampLevels::parse(v.as_deref().unwrap_or("")).map(|_| ()),
};

pub(super) const RETRY_CNT: Check<Option<u64>> = Check {
    expects: oxccl_netif::retry::CNT_EXPECTS,
    test: |v| match v {
        Some(1..=100_000) | None => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

pub(super) const RETRY_SLEEP: Check<Option<u64>> = Check {
    expects: oxccl_netif::retry::SLEEP_EXPECTS,
    test: |v| match v {
        Some(1..=600_000) | None => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

pub(super) const DEV_TIMEOUT: Check<Option<u64>> = Check {
    expects: "whole seconds from 1 to 31536000 (365 days)",
    test: |v| match v {
        Some(1..=31_536_000) | None => Ok(()),
        Some(_) => Err("out of range".into()),
    },
};

/// Which protocols NCCL_PROTO allows (LL, Simple), NCCL's syntax: a
/// comma-separated list of LL, LL128 and Simple, case-insensitive, or
/// `^` and the ones to leave out. Unset or empty: both.
pub fn protocols(proto: Option<&str>) -> Result<(bool, bool)> {
    let s = proto.unwrap_or("");
    parse_protocols(s).map_err(|why| Error::InvalidArgument(format!("NCCL_PROTO={s:?}: {why}")))
}

pub(super) fn parse_protocols(s: &str) -> std::result::Result<(bool, bool), String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok((true, true));
    }
    let (exclude, list) = match s.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (mut ll, mut simple) = (false, false);
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name.to_ascii_lowercase().as_str() {
            "ll" => ll = true,
            "simple" => simple = true,
            "ll128" => {}
            _ => return Err(format!("{name:?} is no protocol (LL, LL128, Simple)")),
        }
    }
    let (ll, simple) = if exclude {
        (!ll, !simple)
    } else {
        (ll, simple)
    };
    if !ll && !simple {
        return Err("it leaves neither LL nor Simple, the protocols oxccl's kernels run".into());
    }
    Ok((ll, simple))
}

/// How copy-engine collectives are chosen (`OXCCL_CE_COLL`; see
/// `win::ce`), parsed here so that the settings table checks it.
/// What `OXCCL_CE_COLL` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeCollMode {
    /// Where the CTA policy is ZERO.
    Auto,
    /// Whenever the buffers allow.
    Force,
    /// Never.
    Never,
}

/// Parses `OXCCL_CE_COLL`.
pub fn ce_coll_mode(s: Option<&str>) -> std::result::Result<CeCollMode, String> {
    match s.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(CeCollMode::Auto),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "auto" => Ok(CeCollMode::Auto),
            "1" | "force" | "yes" => Ok(CeCollMode::Force),
            "0" | "never" | "no" => Ok(CeCollMode::Never),
            _ => Err(format!("{v:?}: auto, 1 or 0")),
        },
    }
}
