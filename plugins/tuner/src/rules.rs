//! The rule table: parsed from TOML, checked once, then matched per call
//! without allocation.

use std::path::{Path, PathBuf};

use oxccl_plugin::{Algorithm, CollType, Protocol};
use serde::Deserialize;
use toml::Spanned;

/// Why a rules file cannot be used. Every variant names the file and the
/// line, so the user can go straight to the mistake.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("tuner rules file {path}: cannot read it: {source} (set OXCCL_TUNER_CONFIG to a readable TOML file)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tuner rules file {path}, line {line}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// One rule, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Collectives it applies to; empty = any.
    pub collectives: Vec<CollType>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub min_ranks: usize,
    pub max_ranks: usize,
    pub min_nodes: usize,
    pub max_nodes: usize,
    pub algorithm: Algorithm,
    pub protocol: Protocol,
    /// `None`: NCCL keeps its channel count.
    pub channels: Option<i32>,
    /// Line of the `[[rule]]` header, for logs.
    pub line: usize,
}

impl Rule {
    /// Whether the rule applies to this call.
    pub fn matches(&self, coll: CollType, n_bytes: u64, n_ranks: usize, n_nodes: usize) -> bool {
        (self.collectives.is_empty() || self.collectives.contains(&coll))
            && (self.min_bytes..=self.max_bytes).contains(&n_bytes)
            && (self.min_ranks..=self.max_ranks).contains(&n_ranks)
            && (self.min_nodes..=self.max_nodes).contains(&n_nodes)
    }
}

/// A parsed rules file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rules {
    pub rules: Vec<Rule>,
}

impl Rules {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, RulesError> {
        let text = std::fs::read_to_string(path).map_err(|source| RulesError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses rules from `text`; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, RulesError> {
        let invalid = |at: usize, message: String| RulesError::Invalid {
            path: path.to_owned(),
            line: line_of(text, at),
            message,
        };
        let file: RawFile = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            invalid(at, e.message().to_owned())
        })?;
        let mut rules = Vec::with_capacity(file.rule.len());
        for (i, raw) in file.rule.into_iter().enumerate() {
            let start = raw.span().start;
            let raw = raw.into_inner();
            let n = i + 1;
            let collectives = match raw.collective {
                None => Vec::new(),
                Some(c) => {
                    let at = c.span().start;
                    let names = match c.into_inner() {
                        OneOrMany::One(s) => vec![s],
                        OneOrMany::Many(v) => v,
                    };
                    names
                        .iter()
                        .map(|s| {
                            parse_coll(s).ok_or_else(|| {
                                invalid(
                                    at,
                                    format!(
                                        "rule {n}, field `collective`: unknown collective {s:?}; use one of {}",
                                        COLL_NAMES.join(", ")
                                    ),
                                )
                            })
                        })
                        .collect::<Result<_, _>>()?
                }
            };
            let size = |v: Option<Spanned<SizeValue>>, field: &str, default: u64| {
                v.map_or(Ok(default), |v| {
                    let at = v.span().start;
                    v.into_inner()
                        .bytes()
                        .map_err(|m| invalid(at, format!("rule {n}, field `{field}`: {m}")))
                })
            };
            let min_bytes = size(raw.min_bytes, "min_bytes", 0)?;
            let max_bytes = size(raw.max_bytes, "max_bytes", u64::MAX)?;
            let algorithm = {
                let at = raw.algorithm.span().start;
                parse_algo(raw.algorithm.get_ref()).ok_or_else(|| {
                    invalid(
                        at,
                        format!(
                            "rule {n}, field `algorithm`: unknown algorithm {:?}; use one of {}",
                            raw.algorithm.get_ref(),
                            Algorithm::ALL.map(|a| a.name()).join(", ")
                        ),
                    )
                })?
            };
            let protocol = {
                let at = raw.protocol.span().start;
                parse_proto(raw.protocol.get_ref()).ok_or_else(|| {
                    invalid(
                        at,
                        format!(
                            "rule {n}, field `protocol`: unknown protocol {:?}; use one of {}",
                            raw.protocol.get_ref(),
                            Protocol::ALL.map(|p| p.name()).join(", ")
                        ),
                    )
                })?
            };
            let channels = match raw.channels {
                None => None,
                Some(c) if (1..=64).contains(c.get_ref()) => Some(*c.get_ref() as i32),
                Some(c) => {
                    return Err(invalid(
                        c.span().start,
                        format!(
                            "rule {n}, field `channels`: {} is out of range; use 1 to 64",
                            c.get_ref()
                        ),
                    ))
                }
            };
            let rule = Rule {
                collectives,
                min_bytes,
                max_bytes,
                min_ranks: raw.min_ranks.unwrap_or(0),
                max_ranks: raw.max_ranks.unwrap_or(usize::MAX),
                min_nodes: raw.min_nodes.unwrap_or(0),
                max_nodes: raw.max_nodes.unwrap_or(usize::MAX),
                algorithm,
                protocol,
                channels,
                line: line_of(text, start),
            };
            for (field, lo, hi) in [
                ("bytes", rule.min_bytes, rule.max_bytes),
                ("ranks", rule.min_ranks as u64, rule.max_ranks as u64),
                ("nodes", rule.min_nodes as u64, rule.max_nodes as u64),
            ] {
                if lo > hi {
                    return Err(invalid(
                        start,
                        format!("rule {n}, fields `min_{field}`/`max_{field}`: min {lo} is above max {hi}; the rule could never match"),
                    ));
                }
            }
            rules.push(rule);
        }
        Ok(Rules { rules })
    }

    /// The first rule that matches, with its index (0-based).
    pub fn find(
        &self,
        coll: CollType,
        n_bytes: u64,
        n_ranks: usize,
        n_nodes: usize,
    ) -> impl Iterator<Item = (usize, &Rule)> {
        self.rules
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.matches(coll, n_bytes, n_ranks, n_nodes))
    }
}

fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

const COLL_NAMES: [&str; 12] = [
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "send_recv",
    "send",
    "recv",
    "all_to_all",
    "scatter",
    "gather",
    "all_gather_v",
];

fn parse_coll(s: &str) -> Option<CollType> {
    let i = COLL_NAMES.iter().position(|n| n.eq_ignore_ascii_case(s))?;
    Some(CollType::from_raw(i as i32))
}

fn parse_algo(s: &str) -> Option<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .find(|a| a.name().eq_ignore_ascii_case(s))
}

fn parse_proto(s: &str) -> Option<Protocol> {
    Protocol::ALL
        .into_iter()
        .find(|p| p.name().eq_ignore_ascii_case(s))
}

/// Parses "64K", "1M", "3G", "512", "1MiB" (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write bytes like 4096, 64K, 1M or 2G"))?;
    let mult: u64 = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?} has an unknown suffix {suffix:?}; use K, M, G or T"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    collective: Option<Spanned<OneOrMany>>,
    min_bytes: Option<Spanned<SizeValue>>,
    max_bytes: Option<Spanned<SizeValue>>,
    min_ranks: Option<usize>,
    max_ranks: Option<usize>,
    min_nodes: Option<usize>,
    max_nodes: Option<usize>,
    algorithm: Spanned<String>,
    protocol: Spanned<String>,
    channels: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Int(u64),
    Text(String),
}

impl SizeValue {
    fn bytes(self) -> Result<u64, String> {
        match self {
            SizeValue::Int(n) => Ok(n),
            SizeValue::Text(s) => parse_size(&s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Rules, RulesError> {
        Rules::parse(text, Path::new("/etc/rules.toml"))
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("1X").unwrap_err().contains("suffix"));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn example_file_parses() {
        let text = include_str!("../examples/rules.toml");
        let r = parse(text).unwrap();
        assert_eq!(r.rules.len(), 3);
        assert_eq!(r.rules[0].max_bytes, 64 << 10);
        assert_eq!(r.rules[1].channels, Some(4));
        assert_eq!(
            r.rules[2].collectives,
            vec![CollType::AllGather, CollType::ReduceScatter]
        );
    }

    #[test]
    fn first_match_wins_and_ranges_are_inclusive() {
        let r = parse(
            r#"
[[rule]]
collective = "all_reduce"
min_bytes = "1K"
max_bytes = "1M"
algorithm = "tree"
protocol = "ll128"

[[rule]]
min_ranks = 4
max_ranks = 8
algorithm = "ring"
protocol = "simple"
channels = 2
"#,
        )
        .unwrap();
        let first = |c, b, n| r.find(c, b, n, 1).next().map(|(i, _)| i);
        assert_eq!(first(CollType::AllReduce, 1024, 2), Some(0));
        assert_eq!(first(CollType::AllReduce, 1 << 20, 8), Some(0));
        assert_eq!(first(CollType::AllReduce, (1 << 20) + 1, 8), Some(1));
        assert_eq!(first(CollType::Broadcast, 100, 4), Some(1));
        assert_eq!(first(CollType::Broadcast, 100, 9), None);
        assert_eq!(first(CollType::AllReduce, 10, 2), None);
        assert_eq!(r.rules[1].line, 9);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse("[[rule]]\nalgorithm = \"ring\"\nprotocol = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/rules.toml"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("`protocol`") && e.contains("simple"), "{e}");

        let e = parse("[[rule]]\nalgorithm = \"ring\"\nprotocol = \"ll\"\nmax_bytes = \"9Q\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4") && e.contains("max_bytes"), "{e}");

        let e = parse("[[rule]]\nalgorithm = \"ring\"\nprotocol = \"ll\"\nchanels = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4") && e.contains("chanels"), "{e}");

        let e = parse(
            "[[rule]]\ncollective = \"allreduce\"\nalgorithm = \"ring\"\nprotocol = \"ll\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2") && e.contains("all_reduce"), "{e}");

        let e = parse(
            "[[rule]]\nmin_ranks = 9\nmax_ranks = 2\nalgorithm = \"ring\"\nprotocol = \"ll\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1") && e.contains("min_ranks"), "{e}");
    }
}
