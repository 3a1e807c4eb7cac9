//! The event tree the profiler_tree fixture (fixtures/profiler_tree.c)
//! logs to a rank's stderr, rebuilt for tests to assert parents, fields
//! and states.

/// One started event as the tree fixture logs it.
#[derive(Debug, Clone)]
pub struct TreeEvent {
    pub kind: String,
    pub parent: i64,
    pub fields: std::collections::HashMap<String, String>,
    pub states: Vec<i32>,
    pub stopped_at: Option<usize>,
    pub started_at: usize,
}

/// The events of one rank's stderr, by id, from profiler_tree.c's lines.
pub fn tree_of(stderr: &str) -> std::collections::BTreeMap<u64, TreeEvent> {
    let mut evs = std::collections::BTreeMap::new();
    for (n, l) in stderr.lines().enumerate() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["tree", "start", id, kind, rest @ ..] => {
                let fields: std::collections::HashMap<String, String> = rest
                    .iter()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let id: u64 = id.parse().unwrap();
                let parent = fields["parent"].parse().unwrap();
                evs.insert(
                    id,
                    TreeEvent {
                        kind: kind.to_string(),
                        parent,
                        fields,
                        states: Vec::new(),
                        stopped_at: None,
                        started_at: n,
                    },
                );
            }
            ["tree", "stop", id] => {
                let e = evs
                    .get_mut(&id.parse::<u64>().unwrap())
                    .expect("stop of a started event");
                assert!(e.stopped_at.is_none(), "stopped twice: {l}");
                e.stopped_at = Some(n);
            }
            ["tree", "state", id, state, args] => {
                let e = evs
                    .get_mut(&id.parse::<u64>().unwrap())
                    .expect("state of a started event");
                // NCCL passes NULL with the group API states, arguments
                // with the proxy ones (profiler.cc).
                let want = if e.kind == "GroupApi" {
                    "args=null"
                } else {
                    "args=set"
                };
                assert_eq!(*args, want, "{l}");
                e.states.push(state.parse().unwrap());
            }
            _ => {}
        }
    }
    evs
}
