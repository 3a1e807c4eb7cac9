//! `oxccl ras`: NCCL's `ncclras` client. Connects to a running job's RAS
//! listener (NCCL_RAS_ADDR, localhost:28028 by default), speaks NCCL's
//! RAS client protocol, and prints the job's answer: its ranks, their
//! state, the collectives in flight, and (from an oxccl job) which ranks
//! are missing or stuck and the operation each is in. Works with NCCL jobs
//! too. The flags are ncclras's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The first connection waits this long for the handshake: every process
/// of a host shares the port, and one that is stopped takes connections it
/// never answers; the client then tries again, as ncclras does.
const HANDSHAKE: Duration = Duration::from_secs(1);
/// Tries before giving up (ncclras tries without end).
const TRIES: usize = 20;

#[derive(Debug, Clone, clap::Args)]
#[command(disable_help_flag = true)]
pub struct RasArgs {
    /// Host name or IP address of the job's RAS listener (NCCL_RAS_ADDR's host).
    #[arg(short = 'h', long, default_value = "localhost")]
    pub host: String,
    /// TCP port of the job's RAS listener (NCCL_RAS_ADDR's port).
    #[arg(short = 'p', long, default_value_t = oxccl::ras::CLIENT_PORT)]
    pub port: u16,
    /// Most seconds the job's process waits for each other process's
    /// answer (5 by default, times NCCL_RAS_TIMEOUT_FACTOR there; 0: no limit).
    #[arg(short = 't', long)]
    pub timeout: Option<u64>,
    /// More detail: every rank listed, more outliers named.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Output format: text or json.
    #[arg(short = 'f', long)]
    pub format: Option<String>,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

/// Runs the query; the report goes to stdout.
pub fn main(a: &RasArgs) -> Result<i32, String> {
    if let Some(f) = &a.format {
        if !f.eq_ignore_ascii_case("text") && !f.eq_ignore_ascii_case("json") {
            return Err(format!("--format {f:?}: expected text or json"));
        }
    }
    let mut out = std::io::stdout().lock();
    query(a, &mut out)?;
    Ok(0)
}

/// Connects, handshakes, asks, and copies the answer to `out`.
pub fn query(a: &RasArgs, out: &mut dyn Write) -> Result<(), String> {
    let (mut s, mut r) = connect(a)?;
    let mut ask = |line: &str| -> Result<String, String> {
        s.write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("sending {line:?}: {e}"))?;
        let mut got = String::new();
        r.read_line(&mut got)
            .map_err(|e| format!("waiting for the answer to {line:?}: {e}"))?;
        Ok(got)
    };
    if let Some(t) = a.timeout {
        let got = ask(&format!("TIMEOUT {t}"))?;
        if got.trim_end() != "OK" {
            return Err(format!("unexpected answer to TIMEOUT: {got:?}"));
        }
    }
    if let Some(f) = &a.format {
        let got = ask(&format!("SET FORMAT {}", f.to_ascii_lowercase()))?;
        if got.trim_end() != "OK" {
            return Err(format!("unexpected answer to SET FORMAT: {got:?}"));
        }
    }
    // The job may wait for every process up to its timeout.
    let wait = a
        .timeout
        .map_or(Duration::from_secs(5), Duration::from_secs);
    let limit = if a.timeout == Some(0) {
        None
    } else {
        Some(HANDSHAKE + wait * 2)
    };
    s.set_read_timeout(limit)
        .map_err(|e| format!("socket: {e}"))?;
    s.write_all(if a.verbose {
        b"VERBOSE STATUS\n"
    } else {
        b"STATUS\n"
    })
    .map_err(|e| format!("sending STATUS: {e}"))?;
    let mut buf = [0u8; 16 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                out.write_all(&buf[..n])
                    .and_then(|()| out.flush())
                    .map_err(|e| format!("stdout: {e}"))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the job's answer: {e}")),
        }
    }
}

fn connect(a: &RasArgs) -> Result<(TcpStream, BufReader<TcpStream>), String> {
    let addrs: Vec<_> = (a.host.as_str(), a.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {}:{}: {e}", a.host, a.port))?
        .collect();
    let mut last = String::new();
    for _ in 0..TRIES {
        let mut timed_out = false;
        for at in &addrs {
            let s = match TcpStream::connect_timeout(at, HANDSHAKE) {
                Ok(s) => s,
                Err(e) => {
                    last = format!("connecting to {at}: {e}");
                    continue;
                }
            };
            let _ = s.set_read_timeout(Some(HANDSHAKE));
            let _ = s.set_write_timeout(Some(HANDSHAKE));
            let Ok(mut w) = s.try_clone() else { continue };
            let mut r = BufReader::new(s);
            let mut got = String::new();
            let shook = w
                .write_all(format!("CLIENT PROTOCOL {}\n", oxccl::ras::CLIENT_PROTOCOL).as_bytes())
                .and_then(|()| r.read_line(&mut got));
            match shook {
                Ok(n) if n > 0 && got.to_ascii_uppercase().starts_with("SERVER PROTOCOL ") => {
                    let _ = w.set_write_timeout(None);
                    return Ok((w, r));
                }
                Ok(_) => return Err(format!("unexpected response from {at}: {got:?}")),
                Err(e) => {
                    // A stopped process took it: try again.
                    eprintln!("Connection timed out; retrying...");
                    timed_out = true;
                    last = format!("handshake with {at}: {e}");
                }
            }
        }
        if !timed_out {
            break;
        }
    }
    Err(format!(
        "failed to connect to the RAS service at {}:{} ({last}): make sure the job runs with NCCL_RAS_ENABLE=1 (the default) and that the host and port match its NCCL_RAS_ADDR",
        a.host, a.port
    ))
}
