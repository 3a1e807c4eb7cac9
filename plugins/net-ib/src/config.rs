//! The settings this network reads, each declared once with NCCL's name and
//! default. A plugin reads its own environment (it never links the core);
//! parsing takes a lookup function so tests need no environment.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{key}={value:?}: {why}")]
    Invalid {
        key: &'static str,
        value: String,
        why: String,
    },
}

/// One entry of `NCCL_IB_HCA`: a device name (prefix unless exact) and an
/// optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    pub name: String,
    pub port: Option<u8>,
}

/// `NCCL_IB_HCA`, parsed: `[^][=]name[:port][,name[:port]…]`. `^` excludes
/// the listed devices instead of selecting them; `=` compares names
/// exactly instead of as prefixes (`mlx5_1` would otherwise also select
/// `mlx5_10`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaSpec {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<HcaEntry>,
}

impl HcaSpec {
    pub fn parse(s: &str) -> Result<HcaSpec, ConfigError> {
        let bad = |why: String| ConfigError::Invalid {
            key: "NCCL_IB_HCA",
            value: s.to_string(),
            why,
        };
        let mut rest = s.trim();
        let mut spec = HcaSpec::default();
        if let Some(r) = rest.strip_prefix('^') {
            spec.exclude = true;
            rest = r;
        }
        if let Some(r) = rest.strip_prefix('=') {
            spec.exact = true;
            rest = r;
        }
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port = p
                        .trim()
                        .parse::<u8>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| {
                            bad(format!(
                                "port {p:?} of {n:?} is not a port number (1 to 255)"
                            ))
                        })?;
                    (n.trim(), Some(port))
                }
                None => (item, None),
            };
            if name.is_empty() {
                return Err(bad(format!("entry {item:?} has no device name")));
            }
            spec.entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        Ok(spec)
    }

    fn entry_matches(&self, e: &HcaEntry, dev: &str, port: u8) -> bool {
        let name_ok = if self.exact {
            e.name == dev
        } else {
            dev.starts_with(&e.name)
        };
        name_ok && e.port.is_none_or(|p| p == port)
    }

    /// Whether `dev:port` is used under this setting (an empty list selects all).
    pub fn selects(&self, dev: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self
            .entries
            .iter()
            .any(|e| self.entry_matches(e, dev, port));
        listed != self.exclude
    }

    /// Entries that name no port found, for the warning a typo deserves.
    pub fn unmatched<'a>(&'a self, found: &[(String, u8)]) -> Vec<&'a HcaEntry> {
        self.entries
            .iter()
            .filter(|e| !found.iter().any(|(d, p)| self.entry_matches(e, d, *p)))
            .collect()
    }
}

/// NCCL has no bound of its own on the IB connection set-up; ours is a
/// setting (seconds) of this network.
pub const CONNECT_TIMEOUT_KEY: &str = "OXCCL_IB_CONNECT_TIMEOUT";

/// Most QPs one connection spreads its requests over.
pub const MAX_QPS: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// NCCL_IB_DISABLE: no device at all.
    pub disable: bool,
    /// NCCL_IB_HCA, parsed, and as written (for messages).
    pub hca: HcaSpec,
    pub hca_raw: Option<String>,
    /// NCCL_IB_GID_INDEX; `None` chooses per port (RoCE v2, IPv4 first).
    pub gid_index: Option<i32>,
    /// NCCL_IB_TC: traffic class of RoCE packets.
    pub traffic_class: u8,
    /// NCCL_IB_SL: service level.
    pub service_level: u8,
    /// NCCL_IB_TIMEOUT: ACK timeout, 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// NCCL_IB_RETRY_CNT: retransmissions before a send fails.
    pub retry_cnt: u8,
    /// NCCL_IB_QPS_PER_CONNECTION: QPs a connection spreads requests over.
    pub qps_per_conn: usize,
    /// NCCL_IB_MERGE_NICS: ports of one NIC as one device.
    pub merge_nics: bool,
    /// NCCL_IB_PKEY: partition key index.
    pub pkey_index: u16,
    /// NCCL_GDR_FLUSH_DISABLE: receives into GPU memory are not flushed.
    pub gdr_flush_disable: bool,
    /// OXCCL_IB_CONNECT_TIMEOUT: how long connect and accept wait for the
    /// peer's side of the set-up before failing (a peer that never answers
    /// must end in an error, not a hang).
    pub connect_timeout: std::time::Duration,
    /// Not a setting: `Some` overrides the GPUDirect RDMA detection (the
    /// peer-memory module check), for tests that exercise the flush path.
    #[doc(hidden)]
    pub gdr_override: Option<bool>,
}

impl Default for Config {
    fn default() -> Config {
        Config::parse(|_| None).expect("defaults parse")
    }
}

impl Config {
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::parse(|k| std::env::var(k).ok())
    }

    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        fn num(
            key: &'static str,
            v: Option<String>,
            min: i64,
            max: i64,
        ) -> Result<Option<i64>, ConfigError> {
            let Some(v) = v else { return Ok(None) };
            match v.trim().parse::<i64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(ConfigError::Invalid {
                    key,
                    value: v,
                    why: format!("expected a whole number from {min} to {max}"),
                }),
            }
        }
        let hca_raw = get("NCCL_IB_HCA");
        Ok(Config {
            disable: num("NCCL_IB_DISABLE", get("NCCL_IB_DISABLE"), 0, 1)? == Some(1),
            hca: match &hca_raw {
                Some(s) => HcaSpec::parse(s)?,
                None => HcaSpec::default(),
            },
            hca_raw,
            // NCCL's default -1 means "choose": the same as unset.
            gid_index: num("NCCL_IB_GID_INDEX", get("NCCL_IB_GID_INDEX"), -1, 255)?
                .filter(|i| *i >= 0)
                .map(|i| i as i32),
            traffic_class: num("NCCL_IB_TC", get("NCCL_IB_TC"), -1, 255)?
                .filter(|v| *v >= 0)
                .unwrap_or(0) as u8,
            service_level: num("NCCL_IB_SL", get("NCCL_IB_SL"), -1, 15)?
                .filter(|v| *v >= 0)
                .unwrap_or(0) as u8,
            // The QP attribute is 5 bits; the spec allows 1 to 31 (0: infinite, never wanted).
            timeout: num("NCCL_IB_TIMEOUT", get("NCCL_IB_TIMEOUT"), 1, 31)?.unwrap_or(20) as u8,
            // A 3-bit field: 7 is the most retries the hardware does.
            retry_cnt: num("NCCL_IB_RETRY_CNT", get("NCCL_IB_RETRY_CNT"), 0, 7)?.unwrap_or(7) as u8,
            qps_per_conn: num(
                "NCCL_IB_QPS_PER_CONNECTION",
                get("NCCL_IB_QPS_PER_CONNECTION"),
                1,
                MAX_QPS as i64,
            )?
            .unwrap_or(1) as usize,
            merge_nics: num("NCCL_IB_MERGE_NICS", get("NCCL_IB_MERGE_NICS"), 0, 1)? != Some(0),
            pkey_index: num("NCCL_IB_PKEY", get("NCCL_IB_PKEY"), 0, 65535)?.unwrap_or(0) as u16,
            gdr_flush_disable: num(
                "NCCL_GDR_FLUSH_DISABLE",
                get("NCCL_GDR_FLUSH_DISABLE"),
                0,
                1,
            )? == Some(1),
            // Long enough for a peer rank still starting up (NCCL's own
            // socket connects retry for about as long), short enough to end.
            connect_timeout: std::time::Duration::from_secs(
                num(CONNECT_TIMEOUT_KEY, get(CONNECT_TIMEOUT_KEY), 1, 3600)?.unwrap_or(60) as u64,
            ),
            gdr_override: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults_are_nccls() {
        let c = Config::default();
        assert_eq!((c.timeout, c.retry_cnt, c.qps_per_conn), (20, 7, 1));
        assert_eq!(
            (c.gid_index, c.traffic_class, c.service_level),
            (None, 0, 0)
        );
        assert!(c.merge_nics && !c.disable && !c.gdr_flush_disable);
        assert_eq!(c.connect_timeout, std::time::Duration::from_secs(60));
        assert!(c.hca.entries.is_empty());
    }

    #[test]
    fn settings_are_read_and_bad_ones_named() {
        let c = with(&[
            ("NCCL_IB_TIMEOUT", "22"),
            ("NCCL_IB_RETRY_CNT", "3"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "-1"),
            ("NCCL_IB_HCA", "=mlx5_0:1"),
            ("NCCL_IB_MERGE_NICS", "0"),
            ("NCCL_GDR_FLUSH_DISABLE", "1"),
            (CONNECT_TIMEOUT_KEY, "5"),
        ])
        .unwrap();
        assert!(c.gdr_flush_disable);
        assert_eq!(c.connect_timeout, std::time::Duration::from_secs(5));
        assert_eq!((c.timeout, c.retry_cnt, c.qps_per_conn), (22, 3, 4));
        assert_eq!(
            (c.gid_index, c.traffic_class, c.service_level),
            (Some(3), 106, 0)
        );
        assert!(!c.merge_nics && c.hca.exact);
        assert_eq!(
            with(&[("NCCL_IB_GID_INDEX", "-1")]).unwrap().gid_index,
            None
        );
        for (k, v) in [
            ("NCCL_IB_TIMEOUT", "40"),
            ("NCCL_IB_RETRY_CNT", "8"),
            ("NCCL_IB_QPS_PER_CONNECTION", "0"),
            ("NCCL_IB_TC", "x"),
            ("NCCL_IB_HCA", "mlx5_0:z"),
            (CONNECT_TIMEOUT_KEY, "0"),
            ("NCCL_GDR_FLUSH_DISABLE", "2"),
        ] {
            let e = with(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }
}
