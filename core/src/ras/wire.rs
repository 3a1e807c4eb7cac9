//! What RAS services send each other: one request line, and a process's
//! records as lines of text, ending with `END`. Text so that a person can
//! ask a process by hand (`echo "OXCCL-RAS 1 DUMP" | nc <ip> <port>`).
//!
//! ```text
//! OXCCL-RAS 1
//! PROC <ip:port/pid> <host name>
//! PEER <ip:port/pid>                       every process its maps name
//! MAP <hash> <id>,<gpu> <id>,<gpu> ...     one per communicator, by rank
//! RANK <hash> <rank> <nranks> <gpu> <state> <c0..c4> <func|-> <number> <ms> <error|->
//! END
//! ```

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use super::State;

/// The request a service sends another.
pub const REQUEST: &str = "OXCCL-RAS 1 DUMP";
const HEADER: &str = "OXCCL-RAS 1";

/// A process in the RAS network: its peer listener and its pid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId {
    pub addr: SocketAddr,
    pub pid: u32,
}

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.pid)
    }
}

impl std::str::FromStr for PeerId {
    type Err = String;
    fn from_str(s: &str) -> Result<PeerId, String> {
        let (a, p) = s
            .rsplit_once('/')
            .ok_or_else(|| format!("{s:?}: expected <ip:port>/<pid>"))?;
        Ok(PeerId {
            addr: a.parse().map_err(|e| format!("{a:?}: {e}"))?,
            pid: p.parse().map_err(|e| format!("{p:?}: {e}"))?,
        })
    }
}

impl PeerId {
    /// The node, as NCCL's report names it: the IP address.
    pub fn node(&self) -> String {
        self.addr.ip().to_string()
    }
}

/// The collective a rank is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlightDump {
    /// Index in [`super::FUNCS`].
    pub func: usize,
    /// Its number among the communicator's collectives, from 1.
    pub number: u64,
    /// How long the rank has been in it.
    pub elapsed: Duration,
}

/// One rank's record.
#[derive(Debug, Clone, PartialEq)]
pub struct RankDump {
    pub hash: u64,
    pub rank: usize,
    pub nranks: usize,
    /// -1: host memory.
    pub device: i32,
    pub state: State,
    /// Collectives launched, by [`super::FUNCS`].
    pub counts: [u64; 5],
    pub flight: Option<FlightDump>,
    pub error: Option<String>,
}

/// One process's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcDump {
    pub id: PeerId,
    pub host: String,
    pub ranks: Vec<RankDump>,
    /// Per communicator: each rank's process and GPU.
    pub maps: Vec<(u64, Vec<(PeerId, i32)>)>,
    /// The other processes its communicators name.
    pub peers: Vec<PeerId>,
}

impl ProcDump {
    pub fn encode(&self) -> String {
        let mut s = format!("{HEADER}\nPROC {} {}\n", self.id, self.host);
        for p in &self.peers {
            let _ = writeln!(s, "PEER {p}");
        }
        for (h, map) in &self.maps {
            let _ = write!(s, "MAP {h:016x}");
            for (p, g) in map {
                let _ = write!(s, " {p},{g}");
            }
            s.push('\n');
        }
        for r in &self.ranks {
            let (func, number, ms) = r.flight.map_or(("-", 0, 0), |f| {
                (
                    super::FUNCS.get(f.func).copied().unwrap_or("-"),
                    f.number,
                    f.elapsed.as_millis() as u64,
                )
            });
            let c = r.counts;
            let _ = writeln!(
                s,
                "RANK {:016x} {} {} {} {} {} {} {} {} {} {func} {number} {ms} {}",
                r.hash,
                r.rank,
                r.nranks,
                r.device,
                r.state.name(),
                c[0],
                c[1],
                c[2],
                c[3],
                c[4],
                r.error.as_deref().unwrap_or("-")
            );
        }
        s.push_str("END\n");
        s
    }

    /// Parses [`ProcDump::encode`]'s text; an error says which line.
    pub fn decode(text: &str) -> Result<ProcDump, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!(
                "not an oxccl RAS answer (expected {HEADER:?} first)"
            ));
        }
        let mut out: Option<ProcDump> = None;
        let mut ended = false;
        for line in lines {
            let bad = |why: String| format!("{line:?}: {why}");
            let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
            if tag == "END" {
                ended = true;
                break;
            }
            if tag == "PROC" {
                let (id, host) = rest.split_once(' ').unwrap_or((rest, ""));
                out = Some(ProcDump {
                    id: id.parse().map_err(bad)?,
                    host: host.to_string(),
                    ranks: Vec::new(),
                    maps: Vec::new(),
                    peers: Vec::new(),
                });
                continue;
            }
            let d = out.as_mut().ok_or_else(|| bad("before PROC".into()))?;
            match tag {
                "PEER" => d.peers.push(rest.parse().map_err(bad)?),
                "MAP" => {
                    let mut w = rest.split(' ');
                    let h = hex(w.next()).map_err(bad)?;
                    let mut map = Vec::new();
                    for e in w {
                        let (p, g) = e.rsplit_once(',').ok_or_else(|| bad(format!("{e:?}")))?;
                        map.push((
                            p.parse().map_err(bad)?,
                            g.parse().map_err(|e| bad(format!("{e}")))?,
                        ));
                    }
                    d.maps.push((h, map));
                }
                "RANK" => {
                    let w: Vec<&str> = rest.splitn(14, ' ').collect();
                    if w.len() != 14 {
                        return Err(bad(format!("{} fields, expected 14", w.len())));
                    }
                    let n = |i: usize| -> Result<u64, String> {
                        w[i].parse().map_err(|e| bad(format!("field {i}: {e}")))
                    };
                    let func = super::FUNCS.iter().position(|f| *f == w[10]);
                    d.ranks.push(RankDump {
                        hash: hex(Some(w[0])).map_err(bad)?,
                        rank: n(1)? as usize,
                        nranks: n(2)? as usize,
                        device: w[3].parse().map_err(|e| bad(format!("{e}")))?,
                        state: State::from_name(w[4])
                            .ok_or_else(|| bad(format!("state {:?}", w[4])))?,
                        counts: [n(5)?, n(6)?, n(7)?, n(8)?, n(9)?],
                        flight: match func {
                            Some(func) => Some(FlightDump {
                                func,
                                number: n(11)?,
                                elapsed: Duration::from_millis(n(12)?),
                            }),
                            None => None,
                        },
                        error: Some(w[13].to_string()).filter(|e| e != "-"),
                    });
                }
                _ => return Err(bad("unknown line".into())),
            }
        }
        if !ended {
            return Err("answer cut short (no END)".into());
        }
        out.ok_or_else(|| "no PROC line".into())
    }
}

fn hex(s: Option<&str>) -> Result<u64, String> {
    let s = s.ok_or("missing hash")?;
    u64::from_str_radix(s, 16).map_err(|e| format!("hash {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(port: u16, pid: u32) -> PeerId {
        PeerId {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            pid,
        }
    }

    #[test]
    fn a_dump_survives_the_wire() {
        let d = ProcDump {
            id: id(4000, 11),
            host: "node-a".into(),
            ranks: vec![
                RankDump {
                    hash: 0xdead_beef,
                    rank: 1,
                    nranks: 2,
                    device: -1,
                    state: State::Running,
                    counts: [0, 0, 0, 0, 7],
                    flight: Some(FlightDump {
                        func: 4,
                        number: 7,
                        elapsed: Duration::from_millis(1500),
                    }),
                    error: None,
                },
                RankDump {
                    hash: 1,
                    rank: 0,
                    nranks: 1,
                    device: 3,
                    state: State::Abort,
                    counts: [1, 2, 3, 4, 5],
                    flight: None,
                    error: Some("remote error: rank 1 left".into()),
                },
            ],
            maps: vec![(0xdead_beef, vec![(id(4001, 12), -1), (id(4000, 11), -1)])],
            peers: vec![id(4001, 12)],
        };
        let text = d.encode();
        assert_eq!(ProcDump::decode(&text), Ok(d), "{text}");
        assert!(ProcDump::decode(&text.replace("END\n", "")).is_err());
        assert!(ProcDump::decode("HTTP/1.1 400\n").is_err());
    }
}
