//! The RAS service of this process: the thin I/O around [`super::wire`]
//! and [`super::report`]. Started once, by the first communicator made
//! with NCCL_RAS_ENABLE=1:
//!
//! - a peer listener on the bootstrap's interface (port chosen by the
//!   system), which answers [`wire::REQUEST`] with this process's records;
//! - a client listener on NCCL_RAS_ADDR, bound with SO_REUSEADDR and
//!   SO_REUSEPORT as NCCL's is, so that every process of the job on a host
//!   listens on the one port and the kernel hands each client to one of
//!   them. Whichever takes it gathers from every process it knows of.
//!   Where the address cannot be bound (another user's job holds it), the
//!   process goes on without a client listener, as NCCL's does.
//!
//! Each client runs on its own thread; each query asks the processes in
//! parallel, each bounded by the client's timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing::info;

use super::report::{self, Gathered, Miss, Options};
use super::wire::{self, PeerId, ProcDump};
use crate::config::Config;

/// What a client may change of a query.
#[derive(Debug, Clone)]
struct Settings {
    wait: Duration,
    stuck: Duration,
}

struct Started {
    me: PeerId,
}

static SERVICE: OnceLock<Option<Started>> = OnceLock::new();

/// Most processes asked at once.
const FANOUT: usize = 64;

/// Starts this process's RAS service where `cfg` enables it (once; later
/// calls return the first's), its peer listener on `ip`. Returns this
/// process's RAS id, which the ranks exchange at creation; `None` when RAS
/// is off or could not start (said at INFO).
pub fn start(cfg: &Config, ip: IpAddr) -> Option<PeerId> {
    if !cfg.ras_enable {
        return None;
    }
    SERVICE
        .get_or_init(|| match start_now(cfg, ip) {
            Ok(s) => Some(s),
            Err(why) => {
                tracing::warn!(target: "oxccl::init|ras", "RAS not started: {why}");
                None
            }
        })
        .as_ref()
        .map(|s| s.me.clone())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn start_now(cfg: &Config, ip: IpAddr) -> Result<Started, String> {
    let factor = cfg.ras_timeout_factor;
    let settings = Settings {
        wait: super::LEG_TIMEOUT.mul_f64(factor),
        stuck: Duration::from_secs_f64(
            crate::config::ox::ras_stuck_s().map_err(|e| e.to_string())? * factor,
        ),
    };
    let peers = TcpListener::bind((ip, 0))
        .map_err(|e| format!("cannot listen for RAS peers on {ip}: {e}"))?;
    let me = PeerId {
        addr: peers
            .local_addr()
            .map_err(|e| format!("RAS peer listener: {e}"))?,
        pid: std::process::id(),
    };
    let host = host_name();
    {
        let (me, host) = (me.clone(), host.clone());
        std::thread::Builder::new()
            .name("oxccl-ras-peer".into())
            .spawn(move || serve_peers(peers, &me, &host))
            .map_err(|e| format!("cannot start the RAS peer thread: {e}"))?;
    }
    match client_listener(&cfg.ras_addr) {
        Ok(l) => {
            info!(target: "oxccl::init|ras", "RAS client listening socket at {}", cfg.ras_addr);
            let (me, host) = (me.clone(), host.clone());
            std::thread::Builder::new()
                .name("oxccl-ras-client".into())
                .spawn(move || serve_clients(l, &me, &host, &settings))
                .map_err(|e| format!("cannot start the RAS client thread: {e}"))?;
        }
        Err(why) => {
            info!(target: "oxccl::init|ras", "RAS failed to establish a client listening socket at {}: {why}", cfg.ras_addr)
        }
    }
    Ok(Started { me })
}

/// NCCL_RAS_ADDR bound with SO_REUSEADDR and SO_REUSEPORT.
fn client_listener(addr: &str) -> Result<TcpListener, String> {
    use socket2::{Domain, Socket, Type};
    let at: SocketAddr = addr
        .to_socket_addrs()
        .map_err(|e| format!("NCCL_RAS_ADDR={addr:?}: {e}; expected host:port"))?
        .next()
        .ok_or_else(|| format!("NCCL_RAS_ADDR={addr:?} resolves to no address"))?;
    let s = Socket::new(Domain::for_address(at), Type::STREAM, None).map_err(|e| e.to_string())?;
    s.set_reuse_address(true).map_err(|e| e.to_string())?;
    s.set_reuse_port(true).map_err(|e| e.to_string())?;
    s.bind(&at.into()).map_err(|e| format!("bind {at}: {e}"))?;
    s.listen(1024).map_err(|e| format!("listen {at}: {e}"))?;
    Ok(s.into())
}

fn serve_peers(l: TcpListener, me: &PeerId, host: &str) {
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
        let mut line = String::new();
        if BufReader::new(&s).read_line(&mut line).is_err() {
            continue;
        }
        let answer = if line.trim_end() == wire::REQUEST {
            super::local_dump(me, host).encode()
        } else {
            format!("ERROR: expected {:?}\n", wire::REQUEST)
        };
        let _ = s.write_all(answer.as_bytes());
    }
}

fn serve_clients(l: TcpListener, me: &PeerId, host: &str, settings: &Settings) {
    for s in l.incoming() {
        let Ok(s) = s else { continue };
        let (me, host, settings) = (me.clone(), host.to_string(), settings.clone());
        let _ = std::thread::Builder::new()
            .name("oxccl-ras-query".into())
            .spawn(move || {
                let _ = serve_client(s, &me, &host, settings);
            });
    }
}

/// One client, speaking NCCL's protocol: `CLIENT PROTOCOL <n>`,
/// `TIMEOUT <s>`, `SET FORMAT text|json`, `[VERBOSE] STATUS` (which ends
/// the connection); `MONITOR` is refused.
fn serve_client(s: TcpStream, me: &PeerId, host: &str, mut st: Settings) -> std::io::Result<()> {
    // A client that says nothing for a minute is dropped.
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut out = s.try_clone()?;
    let mut json = false;
    for line in BufReader::new(s).lines() {
        let line = line?;
        let cmd = line.trim_end_matches('\r');
        let lower = cmd.to_ascii_lowercase();
        if let Some(_v) = lower.strip_prefix("client protocol ") {
            writeln!(out, "SERVER PROTOCOL {}", super::CLIENT_PROTOCOL)?;
        } else if let Some(t) = lower.strip_prefix("timeout ") {
            match t.trim().parse::<u64>() {
                Ok(0) => {
                    st.wait = Duration::from_secs(24 * 3600);
                    writeln!(out, "OK")?;
                }
                Ok(n) => {
                    st.wait = Duration::from_secs(n);
                    writeln!(out, "OK")?;
                }
                Err(_) => writeln!(out, "ERROR: Invalid timeout value {t}")?,
            }
        } else if let Some(f) = lower.strip_prefix("set format ") {
            match f.trim() {
                "text" => {
                    json = false;
                    writeln!(out, "OK")?;
                }
                "json" => {
                    json = true;
                    writeln!(out, "OK")?;
                }
                other => writeln!(out, "ERROR: Invalid format {other}")?,
            }
        } else if lower == "status" || lower == "verbose status" {
            let header = format!(
                "oxccl version {} (NCCL's RAS client protocol {})\n\n",
                env!("CARGO_PKG_VERSION"),
                super::CLIENT_PROTOCOL
            );
            if !json {
                // As NCCL's: the summary's start before the gathering.
                out.write_all(header.as_bytes())?;
            }
            let g = gather(me, host, st.wait);
            let o = Options {
                verbose: lower.starts_with("verbose"),
                stuck: st.stuck,
                wait: st.wait,
            };
            let text = if json {
                report::json(&g, &o, env!("CARGO_PKG_VERSION"), &timestamp())
            } else {
                report::text(&g, &o, "")
            };
            out.write_all(text.as_bytes())?;
            return Ok(());
        } else if lower == "monitor" || lower.starts_with("monitor ") {
            writeln!(
                out,
                "ERROR: oxccl's RAS has no monitor mode; ask STATUS again instead"
            )?;
        } else {
            writeln!(out, "ERROR: Unknown command {cmd}")?;
        }
    }
    Ok(())
}

/// Asks every process this one knows of, and those they know of, each
/// within `wait`.
pub fn gather(me: &PeerId, host: &str, wait: Duration) -> Gathered {
    let t0 = Instant::now();
    let local = super::local_dump(me, host);
    let mut seen: std::collections::BTreeSet<PeerId> = local.peers.iter().cloned().collect();
    seen.insert(me.clone());
    let mut queue: Vec<PeerId> = local.peers.clone();
    let mut g = Gathered {
        procs: vec![local],
        ..Gathered::default()
    };
    while !queue.is_empty() {
        let batch = std::mem::take(&mut queue);
        for chunk in batch.chunks(FANOUT) {
            let answers: Vec<(PeerId, Result<ProcDump, Miss>)> = std::thread::scope(|sc| {
                let hs: Vec<_> = chunk
                    .iter()
                    .map(|p| (p.clone(), sc.spawn(move || ask(p, wait))))
                    .collect();
                hs.into_iter()
                    .map(|(p, h)| {
                        let r = h.join().unwrap_or_else(|_| {
                            Err(Miss::Garbled("the asking thread panicked".into()))
                        });
                        (p, r)
                    })
                    .collect()
            });
            for (p, r) in answers {
                match r {
                    Ok(d) => {
                        for q in &d.peers {
                            if seen.insert(q.clone()) {
                                queue.push(q.clone());
                            }
                        }
                        g.procs.push(d);
                    }
                    Err(m) => g.missing.push((p, m)),
                }
            }
        }
    }
    g.elapsed = t0.elapsed();
    g
}

/// One process's records, within `wait`.
fn ask(p: &PeerId, wait: Duration) -> Result<ProcDump, Miss> {
    use std::io::ErrorKind;
    let deadline = Instant::now() + wait;
    let miss = |e: std::io::Error| match e.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Miss::Timeout,
        _ => Miss::Dead(e.to_string()),
    };
    let mut s = TcpStream::connect_timeout(&p.addr, wait).map_err(miss)?;
    s.set_write_timeout(Some(wait)).map_err(miss)?;
    s.write_all(format!("{}\n", wire::REQUEST).as_bytes())
        .map_err(miss)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Miss::Timeout);
        }
        s.set_read_timeout(Some(left)).map_err(miss)?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(miss(e)),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    ProcDump::decode(&text).map_err(Miss::Garbled)
}

/// The UTC time now as NCCL's JSON writes it ("2025-12-19 13:06:53").
fn timestamp() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (t / 86400, t % 86400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that accepts and never answers is a timeout; a port
    /// nobody listens on is a dead process; both within the wait.
    #[test]
    fn silent_and_gone_peers_are_told_apart_in_time() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = PeerId {
            addr: l.local_addr().unwrap(),
            pid: 1,
        };
        let t = Instant::now();
        assert_eq!(ask(&silent, Duration::from_millis(300)), Err(Miss::Timeout));
        assert!(t.elapsed() < Duration::from_secs(2));
        let gone = PeerId {
            addr: {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap()
            },
            pid: 2,
        };
        assert!(matches!(
            ask(&gone, Duration::from_millis(300)),
            Err(Miss::Dead(_))
        ));
        assert!(timestamp().len() == 19);
    }
}
