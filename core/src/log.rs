//! Logging through `tracing`, configured by NCCL's variables and written in
//! NCCL's line form, so that what people and log scrapers grep for in
//! NCCL's output is found in oxccl's:
//!
//! `host:pid:tid [dev] NCCL INFO message`
//!
//! `NCCL_DEBUG` sets the level (VERSION and WARN → warn, INFO → info,
//! TRACE → trace); `NCCL_DEBUG_SUBSYS` picks subsystems (INIT, COLL, P2P,
//! NET, BOOTSTRAP, ENV, TUNING, ALL; a leading `^` excludes; default
//! INIT,BOOTSTRAP,ENV as NCCL's). An event's target names its subsystems
//! as NCCL's flags do: `oxccl::init`, or `oxccl::init|net` for what NCCL
//! logs under INIT|NET (shown when either is on); `oxccl::all` is shown
//! whenever the level allows. Other targets show warnings only. The library
//! installs no subscriber by itself: the CLI and the C ABI call [`init`].

use std::cell::Cell;
use std::fmt;
use std::io::IsTerminal as _;
use std::sync::RwLock;

use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

pub use crate::config::StampLevels;

/// Which events NCCL_DEBUG and NCCL_DEBUG_SUBSYS let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Most verbose level shown for the chosen subsystems (`None`: warnings only).
    level: Option<Level>,
    exclude: bool,
    subsystems: Vec<String>,
}

impl Filter {
    pub fn new(debug: Option<&str>, subsys: Option<&str>) -> Filter {
        let level = match debug.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
            Some("INFO") => Some(Level::INFO),
            Some("TRACE") => Some(Level::TRACE),
            _ => None,
        };
        let subsys = subsys
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or("INIT,BOOTSTRAP,ENV");
        let (exclude, list) = match subsys.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, subsys),
        };
        let subsystems = list
            .split(',')
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect();
        Filter {
            level,
            exclude,
            subsystems,
        }
    }

    fn subsystem_on(&self, name: &str) -> bool {
        let listed = self.subsystems.iter().any(|s| s == name || s == "all");
        listed != self.exclude
    }

    /// Whether an event of `level` with `target` is shown.
    pub fn enabled(&self, target: &str, level: Level) -> bool {
        if level <= Level::WARN {
            return true;
        }
        let Some(max) = self.level else {
            return false;
        };
        if level > max {
            return false;
        }
        let Some(rest) = target.strip_prefix("oxccl::") else {
            return false;
        };
        // `oxccl::init|net`, or a module path such as `oxccl::net::x`
        // (its first part is the subsystem).
        let head = rest.split("::").next().unwrap_or(rest);
        head.split('|').any(|s| s == "all" || self.subsystem_on(s))
    }
}

thread_local! {
    /// The GPU shown in this thread's lines (NCCL's `[cudaDev]`).
    static DEVICE: Cell<i32> = const { Cell::new(0) };
    /// The kernel's id of this thread, read once.
    static TID: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Makes this thread's log lines show `[dev]`, as NCCL shows the GPU of
/// the communicator a thread works for. Threads that never set it show 0,
/// cudaGetDevice's default, as NCCL's do.
pub fn set_device(dev: usize) {
    DEVICE.with(|d| d.set(i32::try_from(dev).unwrap_or(i32::MAX)));
}

fn tid() -> u32 {
    TID.with(|t| {
        if let Some(v) = t.get() {
            return v;
        }
        // "/proc/thread-self" links to "<pid>/task/<tid>".
        let v = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(std::process::id());
        t.set(Some(v));
        v
    })
}

impl StampLevels {
    fn on(&self, level: Level) -> bool {
        match level {
            Level::ERROR | Level::WARN => self.warn,
            Level::INFO => self.info,
            _ => self.trace,
        }
    }
}

/// NCCL_DEBUG_TIMESTAMP_FORMAT made ready: a strftime format, with `_`
/// written as a space and NCCL's `%Nf` (N from 1 to 9: that many digits of
/// the second's fraction, zero-padded; the first one only) kept aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The format before the fraction (all of it where there is none).
    head: String,
    /// Digits of the fraction and the format after it.
    frac: Option<(u32, String)>,
    pub levels: StampLevels,
}

/// NCCL's default format: `[YYYY-MM-DD HH:MM:SS] `.
pub const DEFAULT_STAMP: &str = "[%F %T] ";

impl Stamp {
    pub fn new(format: &str, levels: StampLevels) -> Stamp {
        let format = format.replace('_', " ");
        let b = format.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && b.get(i + 1) == Some(&b'%') {
                i += 2;
                continue;
            }
            if b[i] == b'%'
                && b.get(i + 1).is_some_and(|d| (b'1'..=b'9').contains(d))
                && b.get(i + 2) == Some(&b'f')
            {
                return Stamp {
                    head: format[..i].to_string(),
                    frac: Some((u32::from(b[i + 1] - b'0'), format[i + 3..].to_string())),
                    levels,
                };
            }
            i += 1;
        }
        Stamp {
            head: format,
            frac: None,
            levels,
        }
    }

    /// The prefix for a line written at `secs`.`nanos` since the epoch, in
    /// local time (TZ), as NCCL writes it.
    pub fn render(&self, secs: i64, nanos: u32) -> String {
        let format = match &self.frac {
            None => self.head.clone(),
            Some((digits, tail)) => {
                let frac = u64::from(nanos) / 10u64.pow(9 - digits);
                // The digits are text to strftime: a `%` cannot appear.
                format!("{}{frac:0w$}{tail}", self.head, w = *digits as usize)
            }
        };
        if format.is_empty() {
            return String::new();
        }
        strftime_local(&format, secs)
            .filter(|s| !s.is_empty())
            .or_else(|| strftime_local(DEFAULT_STAMP, secs))
            .unwrap_or_default()
    }

    fn now(&self) -> String {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.render(
            i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            t.subsec_nanos(),
        )
    }
}

/// `format` through the C library's strftime at `secs` in local time;
/// `None` where the time or the format cannot be rendered (a NUL inside,
/// a result over 1 KiB).
#[allow(unsafe_code)] // localtime_r and strftime, the C library's
fn strftime_local(format: &str, secs: i64) -> Option<String> {
    let fmt = std::ffi::CString::new(format).ok()?;
    // time_t is 64 bits wherever oxccl builds (x86_64, aarch64 Linux).
    let t = secs as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value of the plain C struct.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r writes only
    // into `tm` and returns NULL on failure.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    let mut buf = [0u8; 1024];
    // SAFETY: `buf` is writable for its length, `fmt` is NUL-terminated and
    // `tm` was filled above; strftime writes at most `buf.len()` bytes and
    // returns how many (0: it did not fit, or the result is empty).
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm) };
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// NCCL's line: `host:pid:tid [dev] NCCL LEVEL message`, after the time
/// where NCCL_DEBUG_TIMESTAMP_LEVELS asks for it.
struct NcclLine {
    host: String,
    pid: u32,
    stamp: Option<Stamp>,
}

impl<S, N> FormatEvent<S, N> for NcclLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR | Level::WARN => "WARN",
            Level::INFO => "INFO",
            _ => "TRACE",
        };
        let dev = DEVICE.with(Cell::get);
        // A subscriber of `init`'s takes the prefix of the settings in
        // force (`reinit` replaces them); a captured one, its own.
        {
            let out = output();
            let prefix = match &self.stamp {
                Some(s) => Some(s),
                None => out.as_ref().and_then(|o| o.stamp.as_ref()),
            };
            if let Some(stamp) = prefix.filter(|s| s.levels.on(*event.metadata().level())) {
                w.write_str(&stamp.now())?;
            }
        }
        write!(
            w,
            "{}:{}:{} [{dev}] NCCL {level} ",
            self.host,
            self.pid,
            tid()
        )?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// A thread's name: NCCL's (`nccls`, at most 15 bytes as NCCL's
/// NCCL_THREAD_NAMELEN allows) where NCCL_SET_THREAD_NAME=1 (`nccl`),
/// else oxccl's own.
pub fn thread_name(nccl: bool, ours: String, nccls: impl FnOnce() -> String) -> String {
    if !nccl {
        return ours;
    }
    let mut n = nccls();
    while n.len() > 15 {
        n.pop();
    }
    n
}

/// The tracing filter directive for NCCL_DEBUG / NCCL_DEBUG_SUBSYS values,
/// for programs that build their own subscriber with an `EnvFilter` (a
/// target naming several subsystems is matched only by its first there).
pub fn directive(debug: Option<&str>, subsys: Option<&str>) -> String {
    let f = Filter::new(debug, subsys);
    let Some(level) = f.level else {
        return "warn".into();
    };
    let level = level.as_str().to_ascii_lowercase();
    if f.subsystems.iter().any(|n| n == "all") {
        return if f.exclude {
            "warn".into()
        } else {
            format!("warn,oxccl={level}")
        };
    }
    if f.exclude {
        let mut d = format!("warn,oxccl={level}");
        for n in &f.subsystems {
            d += &format!(",oxccl::{n}=warn");
        }
        d
    } else {
        let mut d = "warn".to_string();
        for n in &f.subsystems {
            d += &format!(",oxccl::{n}={level}");
        }
        d
    }
}

/// NCCL_DEBUG_FILE's name with NCCL's substitutions: %h host name, %p
/// process id, %% a percent sign (other % sequences are kept as written).
fn debug_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// The time prefix NCCL_DEBUG_TIMESTAMP_FORMAT and _LEVELS ask for (as
/// NCCL: set but empty, the format prints nothing and the levels list
/// none); their values were checked by the load.
pub fn stamp_of(cfg: &crate::config::Config) -> Stamp {
    let format = match &cfg.debug_timestamp_format {
        Some(f) => f.as_str(),
        None if cfg.is_set("DEBUG_TIMESTAMP_FORMAT") => "",
        None => DEFAULT_STAMP,
    };
    let levels = match &cfg.debug_timestamp_levels {
        Some(l) => StampLevels::parse(l).unwrap_or_default(),
        None if cfg.is_set("DEBUG_TIMESTAMP_LEVELS") => StampLevels::default(),
        None => StampLevels {
            warn: true,
            ..StampLevels::default()
        },
    };
    Stamp::new(format, levels)
}

/// What the installed subscriber filters with and writes to, replaced by
/// [`reinit`]: NCCL_DEBUG and NCCL_DEBUG_SUBSYS's filter, and
/// NCCL_DEBUG_FILE's file (`None`: stderr).
struct Output {
    filter: Filter,
    file: Option<std::fs::File>,
    /// NCCL_DEBUG_TIMESTAMP_FORMAT and _LEVELS's prefix; `None` where the
    /// settings could not be read.
    stamp: Option<Stamp>,
}

static OUTPUT: RwLock<Option<Output>> = RwLock::new(None);

fn output() -> std::sync::RwLockReadGuard<'static, Option<Output>> {
    OUTPUT.read().unwrap_or_else(|p| p.into_inner())
}

/// The writer of one line: the current output's file, else stderr.
struct CurrentOutput;

impl std::io::Write for CurrentOutput {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match output().as_ref().and_then(|o| o.file.as_ref()) {
            Some(mut f) => f.write(b),
            None => std::io::stderr().write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match output().as_ref().and_then(|o| o.file.as_ref()) {
            Some(mut f) => f.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

/// Reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE now; the file's
/// error, with its name, where it cannot be created.
fn read_output(host: &str, pid: u32) -> (Output, Option<(String, std::io::Error)>) {
    let cfg = crate::config::Config::load().ok();
    let filter = Filter::new(
        cfg.as_ref().and_then(|c| c.debug.as_deref()),
        cfg.as_ref().and_then(|c| c.debug_subsys.as_deref()),
    );
    let mut failed = None;
    let file = cfg
        .as_ref()
        .and_then(|c| c.debug_file.as_deref())
        .and_then(|p| {
            let name = debug_file_name(p, host, pid);
            std::fs::File::create(&name)
                .map_err(|e| failed = Some((name, e)))
                .ok()
        });
    let stamp = cfg.as_ref().map(stamp_of);
    (
        Output {
            filter,
            file,
            stamp,
        },
        failed,
    )
}

/// Installs a subscriber writing NCCL's lines to stderr, or to
/// `NCCL_DEBUG_FILE`, from the environment. Does nothing if one exists.
pub fn init() {
    let host = host_name();
    let pid = std::process::id();
    let (out, failed) = read_output(&host, pid);
    // NCCL writes no colour codes; only a terminal gets any field styling
    // tracing adds.
    let ansi = out.file.is_none() && std::io::stderr().is_terminal();
    let format = NcclLine {
        host,
        pid,
        stamp: None,
    };
    let keep = |m: &Metadata<'_>| {
        output()
            .as_ref()
            .is_some_and(|o| o.filter.enabled(m.target(), *m.level()))
    };
    let layer = tracing_subscriber::fmt::layer()
        .event_format(format)
        .with_ansi(ansi)
        .with_writer(|| CurrentOutput)
        .with_filter(filter_fn(keep));
    if tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .is_ok()
    {
        *OUTPUT.write().unwrap_or_else(|p| p.into_inner()) = Some(out);
    }
    // NCCL falls back to stderr too; saying so names the setting.
    if let Some((name, e)) = failed {
        tracing::warn!(target: "oxccl::init", "NCCL_DEBUG_FILE={name}: cannot create it ({e}); logging to stderr");
    }
    // The env plugin was loaded to read the settings above, before any
    // subscriber: what it found is logged now.
    crate::plugin::env::announce();
}

/// NCCL's `ncclResetDebugInit`: reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and
/// NCCL_DEBUG_FILE again, and the subscriber [`init`] installed filters
/// and writes by the new values from the next event on (a new
/// NCCL_DEBUG_FILE is created; the old one is closed). Where no
/// subscriber of [`init`]'s is installed, it installs one. Returns whether
/// the values now in force are the environment's (false where another
/// subscriber was installed first, which this leaves alone).
pub fn reinit() -> bool {
    if output().is_none() {
        init();
        return output().is_some();
    }
    let (out, failed) = read_output(&host_name(), std::process::id());
    *OUTPUT.write().unwrap_or_else(|p| p.into_inner()) = Some(out);
    // The filter's answers are cached per call site (always or never):
    // they are asked again under the new values.
    tracing::callsite::rebuild_interest_cache();
    if let Some((name, e)) = failed {
        tracing::warn!(target: "oxccl::init", "NCCL_DEBUG_FILE={name}: cannot create it ({e}); logging to stderr");
    }
    true
}

/// Runs `f` with every event this thread emits meanwhile written as NCCL's
/// lines into the returned text (whatever the global subscriber).
#[cfg(test)]
pub(crate) fn capture_lines<R>(f: impl FnOnce() -> R) -> (R, String) {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let out = sink.clone();
    let layer = tracing_subscriber::fmt::layer()
        .event_format(NcclLine {
            host: host_name(),
            pid: std::process::id(),
            stamp: None,
        })
        .with_ansi(false)
        .with_writer(move || out.clone());
    let sub = tracing_subscriber::registry().with(layer);
    let r = tracing::subscriber::with_default(sub, f);
    let text =
        String::from_utf8_lossy(&sink.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    (r, text)
}

#[cfg(test)]
mod tests {
    use super::{debug_file_name, directive, stamp_of, Filter, Stamp, StampLevels};
    use tracing::Level;

    #[test]
    fn thread_names_as_nccl_under_nccl_set_thread_name() {
        let name = |nccl| {
            super::thread_name(nccl, "oxccl-proxy-3".into(), || {
                format!("NCCL Progress{:2}", 3)
            })
        };
        assert_eq!(name(false), "oxccl-proxy-3");
        assert_eq!(name(true), "NCCL Progress 3");
        let long = super::thread_name(true, String::new(), || "NCCL Progress 123456".into());
        assert_eq!(long, "NCCL Progress 1");
    }

    /// NCCL_DEBUG_TIMESTAMP_FORMAT through strftime, with `_` as a space
    /// and `%Nf` as N digits of the second's fraction (once; `%%` is a
    /// percent sign, not the start of one).
    #[test]
    fn timestamp_format_as_nccl() {
        let all = StampLevels::parse("ALL").unwrap();
        // 2001-09-09 01:48:43 UTC; seconds are the same in every zone
        // whose offset is whole minutes.
        let (secs, nanos) = (1_000_000_123, 123_456_789);
        assert_eq!(Stamp::new("%S.%3f_", all).render(secs, nanos), "43.123 ");
        assert_eq!(
            Stamp::new("%S.%9f", all).render(secs, nanos),
            "43.123456789"
        );
        assert_eq!(Stamp::new("%1f|%2f", all).render(secs, 5_000_000), "0|%2f");
        assert_eq!(Stamp::new("%%3f", all).render(secs, nanos), "%3f");
        assert_eq!(Stamp::new("%S.%6f", all).render(secs, 42_000), "43.000042");
        assert_eq!(Stamp::new("", all).render(secs, nanos), "");
        let default = Stamp::new(super::DEFAULT_STAMP, all).render(secs, 0);
        assert!(
            default.starts_with("[2001-09-") && default.ends_with(":43] "),
            "{default:?}"
        );
    }

    #[test]
    fn timestamp_levels_as_nccl() {
        let l = |s| StampLevels::parse(s).unwrap();
        let (warn, info, trace) = (true, true, true);
        assert_eq!(
            l("WARN"),
            StampLevels {
                warn,
                ..Default::default()
            }
        );
        assert_eq!(
            l("warn,INFO"),
            StampLevels {
                warn,
                info,
                trace: false
            }
        );
        assert_eq!(
            l("^TRACE"),
            StampLevels {
                warn,
                info,
                trace: false
            }
        );
        assert_eq!(l("ALL"), StampLevels { warn, info, trace });
        assert_eq!(l(""), StampLevels::default());
        assert_eq!(l("VERSION,ABORT"), StampLevels::default());
        assert!(StampLevels::parse("WARN,LOUD")
            .unwrap_err()
            .contains("LOUD"));
        // Defaults: NCCL's format on warnings only; set but empty: none.
        let cfg = crate::config::Config::load_with(&[]).unwrap();
        if !cfg.is_set("DEBUG_TIMESTAMP_FORMAT") && !cfg.is_set("DEBUG_TIMESTAMP_LEVELS") {
            assert_eq!(stamp_of(&cfg), Stamp::new("[%F %T] ", l("WARN")));
        }
        let cfg = crate::config::Config::load_with(&[
            ("DEBUG_TIMESTAMP_FORMAT", ""),
            ("DEBUG_TIMESTAMP_LEVELS", "INFO"),
        ])
        .unwrap();
        assert_eq!(stamp_of(&cfg).render(1, 0), "");
        assert_eq!(stamp_of(&cfg).levels, l("INFO"));
        let e = crate::config::Config::load_with(&[("DEBUG_TIMESTAMP_LEVELS", "LOUD")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_DEBUG_TIMESTAMP_LEVELS=\"LOUD\""), "{e}");
    }

    /// A WARN line begins with the time, before `host:pid:tid`; an INFO
    /// line under the default levels does not.
    #[test]
    fn warn_lines_begin_with_the_time() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let sink = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let out = sink.clone();
        let layer = tracing_subscriber::fmt::layer()
            .event_format(super::NcclLine {
                host: "node7".into(),
                pid: 42,
                stamp: Some(Stamp::new("<%Y>_", StampLevels::parse("WARN").unwrap())),
            })
            .with_ansi(false)
            .with_writer(move || Writer(out.clone()));
        let sub = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(target: "oxccl::init", "careful");
            tracing::info!(target: "oxccl::init", "fine");
        });
        let text = String::from_utf8(sink.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with('<') && lines[0].contains("> node7:42:"),
            "{text}"
        );
        assert!(lines[0].ends_with("NCCL WARN careful"), "{text}");
        assert!(lines[1].starts_with("node7:42:"), "{text}");
    }

    struct Writer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Writer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn debug_file_substitutions() {
        assert_eq!(
            debug_file_name("/tmp/nccl.%h.%p.log", "node7", 42),
            "/tmp/nccl.node7.42.log"
        );
        assert_eq!(debug_file_name("a%%b%x%", "h", 1), "a%b%x%");
    }

    #[test]
    fn levels_and_subsystems() {
        assert_eq!(directive(None, None), "warn");
        assert_eq!(directive(Some("INFO"), Some("ALL")), "warn,oxccl=info");
        assert_eq!(
            directive(Some("INFO"), Some("NET,COLL")),
            "warn,oxccl::net=info,oxccl::coll=info"
        );
        assert_eq!(
            directive(Some("TRACE"), Some("^NET")),
            "warn,oxccl=trace,oxccl::net=warn"
        );
    }

    #[test]
    fn subsystems_as_nccl_flags() {
        let default = Filter::new(Some("INFO"), None);
        assert!(default.enabled("oxccl::init", Level::INFO));
        assert!(default.enabled("oxccl::init|net", Level::INFO));
        assert!(!default.enabled("oxccl::net", Level::INFO));
        assert!(default.enabled("oxccl::net", Level::WARN));
        assert!(!default.enabled("oxccl::init", Level::DEBUG));
        assert!(default.enabled("oxccl::all", Level::INFO));
        assert!(!default.enabled("other_crate", Level::INFO));
        let net = Filter::new(Some("INFO"), Some("NET"));
        assert!(net.enabled("oxccl::init|net", Level::INFO));
        assert!(!net.enabled("oxccl::init", Level::INFO));
        let not_net = Filter::new(Some("TRACE"), Some("^NET"));
        assert!(not_net.enabled("oxccl::coll", Level::TRACE));
        assert!(!not_net.enabled("oxccl::net", Level::INFO));
        assert!(not_net.enabled("oxccl::init|net", Level::INFO));
        let quiet = Filter::new(Some("VERSION"), None);
        assert!(!quiet.enabled("oxccl::all", Level::INFO));
        assert!(quiet.enabled("oxccl::init", Level::WARN));
    }
}
