//! A tuner plugin for oxccl and NCCL: per collective call, the first rule of
//! a TOML table that matches (collective, size, ranks, nodes) chooses the
//! algorithm, protocol and channel count. See `examples/rules.toml`.
//!
//! Built as a cdylib exporting `ncclTunerPlugin_v2` … `_v6`; the file comes
//! from `OXCCL_TUNER_CONFIG`, else `NCCL_TUNER_CONFIG_FILE`; without either
//! the tuner changes nothing.

pub mod rules;

use std::collections::HashSet;
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use oxccl_plugin::{
    Algorithm, CollInfoRequest, CollType, CostTable, NcclLogger, PluginError, PluginResult,
    Protocol, Tuner, TunerInit,
};

pub use rules::{parse_size, Rule, Rules, RulesError};

/// Environment variables naming the rules file, in priority order.
pub const CONFIG_ENV: [&str; 2] = ["OXCCL_TUNER_CONFIG", "NCCL_TUNER_CONFIG_FILE"];

/// How often the file's mtime is looked at: a `stat` per collective would
/// cost more than the decision itself.
const RECHECK: Duration = Duration::from_secs(1);

/// Bounds the "logged once" memory when sizes vary without end.
const MAX_LOGGED: usize = 4096;

/// What one call was decided, for logging each distinct one once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    pub coll: CollType,
    pub n_bytes: usize,
    /// 0-based index of the rule.
    pub rule: usize,
    pub algorithm: Algorithm,
    pub protocol: Protocol,
    pub channels: Option<i32>,
}

struct Source {
    path: PathBuf,
    mtime: Option<SystemTime>,
    last_check: Instant,
}

struct State {
    source: Option<Source>,
    rules: Arc<Rules>,
    logged: HashSet<Decision>,
}

/// The tuner of one communicator.
pub struct RuleTuner {
    n_ranks: usize,
    n_nodes: usize,
    logger: NcclLogger,
    state: Mutex<State>,
}

fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl RuleTuner {
    /// A tuner reading `path` (or with no rules when `None`).
    pub fn new(
        path: Option<PathBuf>,
        n_ranks: usize,
        n_nodes: usize,
        logger: NcclLogger,
    ) -> Result<Self, RulesError> {
        let (source, rules) = match path {
            None => (None, Rules::default()),
            Some(path) => {
                let m = mtime(&path);
                let rules = Rules::load(&path)?;
                let source = Source {
                    path,
                    mtime: m,
                    last_check: Instant::now(),
                };
                (Some(source), rules)
            }
        };
        Ok(Self {
            n_ranks,
            n_nodes,
            logger,
            state: Mutex::new(State {
                source,
                rules: Arc::new(rules),
                logged: HashSet::new(),
            }),
        })
    }

    /// Re-reads the file if at least a second passed since the last look and
    /// its mtime changed. A broken edit keeps the previous rules (with a
    /// WARN): failing collectives over a typo would be worse.
    pub fn refresh(&self, now: Instant) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(src) = st.source.as_mut() else {
            return;
        };
        if now.saturating_duration_since(src.last_check) < RECHECK {
            return;
        }
        src.last_check = now;
        let m = mtime(&src.path);
        if m == src.mtime {
            return;
        }
        src.mtime = m;
        let path = src.path.clone();
        match Rules::load(&path) {
            Ok(r) => {
                self.logger.info(&format!(
                    "oxccl-tuner: re-read {} ({} rules)",
                    path.display(),
                    r.rules.len()
                ));
                st.rules = Arc::new(r);
                st.logged.clear();
            }
            Err(e) => self
                .logger
                .warn(&format!("oxccl-tuner: keeping the previous rules: {e}")),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rules
            .clone()
    }

    /// Applies the first matching rule whose cell NCCL can use: that cell's
    /// cost becomes 0.0 (NCCL picks the cheapest) and the channel count is
    /// set if the rule has one. Rules whose cell is unavailable for this
    /// call (e.g. NVLS without NVLink SHARP) are passed over.
    pub fn decide(
        &self,
        req: &CollInfoRequest,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Option<Decision> {
        let rules = self.rules();
        let (i, r) = rules
            .find(req.coll, req.n_bytes as u64, self.n_ranks, self.n_nodes)
            .find(|(_, r)| table.is_available(r.algorithm, r.protocol))?;
        table.set(r.algorithm, r.protocol, 0.0);
        if let Some(c) = r.channels {
            *n_channels = c;
        }
        let d = Decision {
            coll: req.coll,
            n_bytes: req.n_bytes,
            rule: i,
            algorithm: r.algorithm,
            protocol: r.protocol,
            channels: r.channels,
        };
        self.log_once(d);
        Some(d)
    }

    fn log_once(&self, d: Decision) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.logged.len() >= MAX_LOGGED || !st.logged.insert(d) {
            return;
        }
        let path = st
            .source
            .as_ref()
            .map(|s| s.path.display().to_string())
            .unwrap_or_default();
        drop(st);
        self.logger
            .info(&describe(&d, self.n_ranks, self.n_nodes, &path));
    }
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("{n} {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The INFO line of a decision.
pub fn describe(d: &Decision, n_ranks: usize, n_nodes: usize, path: &str) -> String {
    let ch = match d.channels {
        Some(c) => plural(c as usize, "channel"),
        None => "NCCL's channel count".to_owned(),
    };
    format!(
        "oxccl-tuner: {} {} B, {}, {} -> {}/{}, {} (rule {} of {})",
        d.coll,
        d.n_bytes,
        plural(n_ranks, "rank"),
        plural(n_nodes, "node"),
        d.algorithm.name(),
        d.protocol.name(),
        ch,
        d.rule + 1,
        path
    )
}

/// The rules file named by the environment, if any.
pub fn config_path() -> Option<PathBuf> {
    CONFIG_ENV
        .iter()
        .filter_map(std::env::var_os)
        .find(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Tuner for RuleTuner {
    const NAME: &'static CStr = c"oxccl-tuner";

    fn init(args: &TunerInit) -> PluginResult<Self> {
        let path = config_path();
        let t = RuleTuner::new(path.clone(), args.n_ranks, args.n_nodes, args.logger)
            .map_err(|e| PluginError::InvalidUsage(e.to_string()))?;
        match path {
            Some(p) => args.logger.info(&format!(
                "oxccl-tuner: {} rules from {} ({}, {})",
                t.rules().rules.len(),
                p.display(),
                plural(args.n_ranks, "rank"),
                plural(args.n_nodes, "node")
            )),
            None => args.logger.info(&format!(
                "oxccl-tuner: no rules file ({} unset); NCCL's own choices stand",
                CONFIG_ENV.join(" and ")
            )),
        }
        Ok(t)
    }

    fn get_coll_info(
        &self,
        req: &CollInfoRequest,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> PluginResult<()> {
        self.refresh(Instant::now());
        self.decide(req, table, n_channels);
        Ok(())
    }
}

oxccl_plugin::export_tuner_plugin!(RuleTuner);

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_plugin::ffi::tuner::NCCL_ALGO_PROTO_IGNORE;
    use std::io::Write;

    fn req(coll: CollType, n_bytes: usize) -> CollInfoRequest {
        CollInfoRequest {
            coll,
            n_bytes,
            num_pipe_ops: 1,
            reg_buff: None,
        }
    }

    fn write(path: &std::path::Path, text: &str, age_s: u64) {
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        // Explicit mtimes: two writes within the filesystem's timestamp
        // granularity would otherwise look unchanged.
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .unwrap();
    }

    #[test]
    fn sets_cell_and_channels_and_skips_unavailable() {
        let dir = std::env::temp_dir().join(format!("oxccl-tuner-t1-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.toml");
        write(
            &path,
            "[[rule]]\nalgorithm = \"nvls\"\nprotocol = \"simple\"\n\
             [[rule]]\ncollective = \"all_reduce\"\nalgorithm = \"ring\"\nprotocol = \"ll128\"\nchannels = 3\n",
            10,
        );
        let t = RuleTuner::new(Some(path), 8, 1, NcclLogger::stderr(0)).unwrap();
        let mut cells = [5.0f32; 21];
        cells[4 * 3..4 * 3 + 3].fill(NCCL_ALGO_PROTO_IGNORE);
        let mut table = CostTable::new(&mut cells, 7, 3);
        let mut nch = 16;
        let d = t
            .decide(&req(CollType::AllReduce, 1 << 20), &mut table, &mut nch)
            .unwrap();
        assert_eq!(d.rule, 1);
        assert_eq!(nch, 3);
        assert_eq!(table.get(Algorithm::Ring, Protocol::Ll128), Some(0.0));
        assert_eq!(
            table.cheapest().map(|c| (c.0, c.1)),
            Some((Algorithm::Ring, Protocol::Ll128))
        );
        assert!(t
            .decide(&req(CollType::Broadcast, 8), &mut table, &mut nch)
            .is_none());
        assert_eq!(
            describe(&d, 8, 1, "/p"),
            "oxccl-tuner: all_reduce 1048576 B, 8 ranks, 1 node -> ring/ll128, 3 channels (rule 2 of /p)"
        );
    }

    #[test]
    fn rereads_when_mtime_changes_at_most_every_second() {
        let dir = std::env::temp_dir().join(format!("oxccl-tuner-t2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.toml");
        write(
            &path,
            "[[rule]]\nalgorithm = \"ring\"\nprotocol = \"ll\"\n",
            100,
        );
        let t = RuleTuner::new(Some(path.clone()), 2, 1, NcclLogger::stderr(0)).unwrap();
        assert_eq!(t.rules().rules[0].algorithm, Algorithm::Ring);

        write(
            &path,
            "[[rule]]\nalgorithm = \"tree\"\nprotocol = \"ll\"\n",
            50,
        );
        let t0 = Instant::now();
        t.refresh(t0); // within a second of `new`: not looked at
        assert_eq!(t.rules().rules[0].algorithm, Algorithm::Ring);
        t.refresh(t0 + Duration::from_secs(2));
        assert_eq!(t.rules().rules[0].algorithm, Algorithm::Tree);

        // A broken edit keeps the rules in force.
        write(
            &path,
            "[[rule]]\nalgorithm = \"bogus\"\nprotocol = \"ll\"\n",
            20,
        );
        t.refresh(t0 + Duration::from_secs(4));
        assert_eq!(t.rules().rules[0].algorithm, Algorithm::Tree);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_file_is_an_init_error_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("oxccl-tuner-t3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        write(&path, "[[rule]]\nalgorithm = \"ring\"\n", 1);
        let e = RuleTuner::new(Some(path.clone()), 2, 1, NcclLogger::stderr(0))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("protocol"),
            "{e}"
        );
        let missing = dir.join("missing.toml");
        let e = RuleTuner::new(Some(missing), 2, 1, NcclLogger::stderr(0))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }
}
