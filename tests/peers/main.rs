//! Wedged and hostile peers, through the built binaries: every call of
//! ipam-da-pool (on etcd) and of ipam-da-neutron (to a controller and
//! Keystone) ends within its `timeout` over TLS as over plain TCP,
//! whatever the peer does or fails to do; a termination request ends a
//! plugin at once; one etcd member wedged is passed over, and the node's
//! keeper keeps its lease; an answer too large, pages that loop, and
//! values that would split a request are refused; secrets go in clear to
//! this host's loopback only; no binary can dump core.
//!
//! The peers are the tests' own, on loopback: etcd-server clusters over
//! TLS, and the servers of `servers.rs`, with certificates made by
//! openssl. Ignored unless asked for with --include-ignored (./.ci/test
//! installs etcd-server, openssl and strace, and does).

// The harness every test binary shares: each uses the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod hostile;
mod servers;
mod wedged;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::etcd::Certificates;
use common::{spawn_program, Env, Outcome, TempDir};

/// The timeout every configuration here gives its plugin, in seconds.
pub const TIMEOUT: u64 = 2;

/// The CNI environment of `command`, for container `id`.
pub fn env(command: &str, id: &str) -> Env {
    Env(vec![
        ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ("CNI_COMMAND".into(), command.into()),
        ("CNI_CONTAINERID".into(), id.into()),
        ("CNI_NETNS".into(), "/var/run/netns/test".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
    ])
}

/// The environment of a command line: no CNI_COMMAND.
pub fn plain_env() -> Env {
    Env(vec![(
        "PATH".into(),
        "/usr/sbin:/usr/bin:/sbin:/bin".into(),
    )])
}

/// A configuration at 1.1.0 of `ipam`, with what `command` needs beside
/// it: a previous result for CHECK, the attachments to keep for GC.
pub fn config(ipam: Value, command: &str) -> Vec<u8> {
    let mut config = json!({
        "cniVersion": "1.1.0",
        "name": "peers",
        "type": "bridge",
        "ipam": ipam,
    });
    match command {
        "CHECK" => {
            config["prevResult"] = json!({
                "cniVersion": "1.1.0",
                "ips": [{"address": "10.252.0.2/26"}],
            })
        }
        "GC" => config["cni.dev/valid-attachments"] = json!([]),
        _ => {}
    }
    config.to_string().into_bytes()
}

/// `ipam` of ipam-da-pool on etcd endpoints `endpoints`, trusting the CA
/// of `certificates` (with its client certificate) for https ones, its
/// notes in `data`.
pub fn pool_ipam(endpoints: &[String], certificates: &Certificates, data: &Path) -> Value {
    let file = |name: &str| certificates.file(name).display().to_string();
    let mut ipam = plain_pool_ipam(endpoints, data);
    ipam["pool"]["etcd"]["tls"] =
        json!({"ca": file("ca.pem"), "cert": file("client.pem"), "key": file("client.key")});
    ipam
}

/// `ipam` of ipam-da-pool on plain-HTTP etcd endpoints `endpoints`, its
/// notes in `data` rather than the default directory every test shares.
pub fn plain_pool_ipam(endpoints: &[String], data: &Path) -> Value {
    json!({
        "type": "ipam-da-pool",
        "pool": {
            "node": "node-a",
            "dataDir": data,
            "pools": {"shared": [{"subnet": "10.252.0.0/26"}]},
            "default": "shared",
            "etcd": {"endpoints": endpoints, "prefix": "/peers", "timeout": TIMEOUT},
        },
    })
}

/// `ipam` of ipam-da-neutron with the controller at `url`, its data in
/// `data`, and `more` members of `ipam.neutron` (`tls`, `auth`, …).
pub fn neutron_ipam(url: &str, data: &Path, more: Value) -> Value {
    let mut settings = json!({
        "url": url,
        "network": "net-1",
        "host": "node-a",
        "timeout": TIMEOUT,
        "dataDir": data,
    });
    for (key, value) in more.as_object().unwrap() {
        settings[key] = value.clone();
    }
    json!({"type": "ipam-da-neutron", "neutron": settings})
}

/// The CA of `certificates` as a `tls` member.
pub fn tls_of(certificates: &Certificates) -> Value {
    json!({"ca": certificates.file("ca.pem")})
}

/// A file holding `text`, its owner's only.
pub fn secret_file(dir: &TempDir, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

/// What a run produced, how long it took, and its peak memory.
pub struct Run {
    pub outcome: Outcome,
    pub took: Duration,
    /// The child's peak resident set (getrusage's ru_maxrss), in KiB.
    pub peak_kib: u64,
}

/// Starts `program` with `env`, `stdin` written and closed.
pub fn start(program: &str, env: &Env, stdin: &[u8]) -> Child {
    let mut child = spawn_program(program, Path::new("/"), &[], env, Stdio::piped());
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_vec();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = pipe.write_all(&input);
    });
    child
}

/// Runs `program` with `env` and `stdin` to its end.
pub fn run(program: &str, env: &Env, stdin: &[u8]) -> Run {
    let started = Instant::now();
    let child = start(program, env, stdin);
    finish(child, started)
}

/// Waits for `child`, started at `started`, reading its output.
#[allow(unsafe_code)]
pub fn finish(mut child: Child, started: Instant) -> Run {
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for this test's own child, writing into the two
    // locals, valid for the call.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "{}", std::io::Error::last_os_error());
    let took = started.elapsed();
    use std::os::unix::process::ExitStatusExt;
    Run {
        outcome: Outcome {
            status: std::process::ExitStatus::from_raw(status),
            stdout: stdout.join().unwrap(),
            stderr: String::from_utf8_lossy(&stderr.join().unwrap()).into_owned(),
        },
        took,
        peak_kib: usage.ru_maxrss as u64,
    }
}

/// Asserts that `run` failed with `code` within the timeout and a second,
/// and returns its message.
pub fn failed_in_time(run: &Run, code: u64, what: &str) -> String {
    failed_within(run, code, what, TIMEOUT)
}

/// As [`failed_in_time`], for a configuration's `timeout` of its own.
pub fn failed_within(run: &Run, code: u64, what: &str, timeout: u64) -> String {
    let error = run.outcome.assert_error(code);
    let bound = Duration::from_secs(timeout + 1);
    assert!(
        run.took < bound,
        "{what}: took {:?}, over {bound:?}: {error}",
        run.took
    );
    error["msg"].as_str().unwrap().to_owned()
}
