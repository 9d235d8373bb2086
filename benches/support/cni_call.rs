//! One call of a plugin as a runtime makes it: a process of its own, the
//! CNI_* environment and nothing else, the configuration on stdin.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `program` for `command` on container `id` (interface eth0), with
/// `config` on its stdin and `cni_path` as its CNI_PATH: what it did.
pub fn call(program: &Path, cni_path: &Path, config: &str, id: &str, command: &str) -> Output {
    let mut child = Command::new(program)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", "/var/run/netns/bench")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the plugin starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}
