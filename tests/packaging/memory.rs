//! What the static plugins ask the kernel for memory: each process of a
//! stack ADD takes its memory from its arena (src/sys/arena.rs), not from
//! musl's malloc, which maps and unmaps as it goes (an ADD of
//! ipam-da-pool on the local store made 22 such calls with it).

use std::collections::BTreeMap;

use serde_json::json;

use crate::common::{run_program, temp_dir, Env};
use crate::static_build;

/// The calls a process makes whatever it allocates: musl's thread area
/// (`mmap`), and the signal stack std maps at start and unmaps at exit.
const AT_START_AND_EXIT: usize = 3;

#[test]
#[ignore = "needs a static release build of its own (a few minutes) and strace"]
fn a_stack_add_maps_no_memory_past_each_processs_start() {
    let bin = static_build::build_static();
    let dir = temp_dir("memory");
    let config = json!({
        "cniVersion": "1.1.0",
        "name": "memory",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["ipam-ds-static", "ipam-da-pool"],
            "static": {"default": [{"name": "p"}]},
            "pool": {"dataDir": dir.path().join("data"), "node": "n",
                "pools": {"p": [{"subnet": "10.99.0.0/24"}]}},
        },
    });
    let trace = dir.path().join("trace");
    let env = Env(vec![
        ("CNI_COMMAND".into(), "ADD".into()),
        ("CNI_CONTAINERID".into(), "m1".into()),
        ("CNI_NETNS".into(), "/var/run/netns/memory".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), bin.to_str().unwrap().into()),
    ]);
    let plugin = bin.join("ipam-delegated");
    let out = run_program(
        "strace",
        dir.path(),
        &[
            "-f",
            "-e",
            "trace=mmap,munmap,mremap,brk",
            "-o",
            trace.to_str().unwrap(),
            plugin.to_str().unwrap(),
        ],
        &env,
        config.to_string().as_bytes(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["ips"][0]["address"], "10.99.0.2/24", "{out:?}");
    // strace -f starts each line with the process's pid, then the call
    // (or a signal, an exit, or a call resumed after another's line).
    let mut calls: BTreeMap<String, usize> = BTreeMap::new();
    let traced = std::fs::read_to_string(&trace).unwrap();
    for line in traced.lines() {
        let mut words = line.split_whitespace();
        let (Some(pid), Some(call)) = (words.next(), words.next()) else {
            continue;
        };
        let counted = calls.entry(pid.to_owned()).or_default();
        if ["mmap(", "munmap(", "mremap(", "brk("]
            .iter()
            .any(|name| call.starts_with(name))
        {
            *counted += 1;
        }
    }
    assert_eq!(calls.len(), 3, "three processes: {traced}");
    assert!(
        calls.values().all(|n| *n <= AT_START_AND_EXIT),
        "{calls:?}: {traced}"
    );
}
