//! The run's nodes: each a network namespace of its own joined to the
//! etcd members by a veth (a partition is that link down), with its own
//! pinned name, its own state directory, its own keeper, and the family's
//! release binaries run inside it as a runtime would run them, on a
//! skewed clock (libfaketime) when a fault says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::Tls;
use crate::history::lock;

/// `ipam.pool.etcd.tls` for a client of the run's cluster.
pub fn tls_settings(tls: &Tls) -> Value {
    json!({"ca": tls.ca, "cert": tls.cert, "key": tls.key})
}

/// How a fault asks to kill a node's next operation.
#[derive(Debug, Clone, Copy)]
pub struct Kill {
    /// After this long.
    pub after: Duration,
    /// The plugin and the delegates it started, or the plugin alone (its
    /// delegates then finish their work).
    pub tree: bool,
}

/// One node.
pub struct Node {
    pub name: String,
    /// Its network namespace's name.
    netns: String,
    /// The root side of its veth.
    veth: String,
    /// The etcd members' address, as it reaches them.
    pub gateway: String,
    pub dir: PathBuf,
    /// The configuration a runtime gives its plugin (without prevResult).
    pub config: Value,
    /// That configuration as a file, for its keeper.
    pub config_file: PathBuf,
    pub node_name_file: PathBuf,
    keepers: Mutex<Vec<Child>>,
    /// Fenced by reclaim, until it is drained and readmitted.
    pub fenced: AtomicBool,
    /// Its plugins' clock offset, if a fault skews it (FAKETIME's form).
    pub skew: Mutex<Option<String>>,
    /// A fault's request to kill its next operation.
    pub kill_next: Mutex<Option<Kill>>,
    /// Whether its link to etcd is down.
    pub cut: AtomicBool,
}

/// What an operation printed and how it ended.
pub struct Ran {
    /// The exit status; `None` if it was killed.
    pub status: Option<i32>,
    pub stdout: Vec<u8>,
    /// The kill a fault asked for, if it was sent before the plugin ended.
    pub kill: Option<Kill>,
}

/// The address node `index` reaches the etcd members at: the root side
/// of its veth.
pub fn gateway(index: usize) -> String {
    format!("10.211.{index}.1")
}

/// Runs `program` with `args`, saying what failed.
pub fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"))
}

/// Runs `program` with `args`, which must succeed.
pub fn must(program: &str, args: &[&str]) {
    let out = run(program, args);
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
}

impl Node {
    /// Node `index` of the run `tag`: its namespace and veth made, its
    /// configuration written under `dir`, its name pinned, its keeper
    /// started. `network` and the members' client `ports` (with `tls`)
    /// describe the network.
    pub fn make(
        index: usize,
        tag: &str,
        dir: &Path,
        network: &Value,
        ports: &[u16],
        tls: &Tls,
        bin: &Path,
    ) -> Node {
        let name = format!("node-{index}");
        let netns = format!("chaos-{tag}-{index}");
        let veth = format!("cx{tag}{index}");
        let inside = format!("{veth}p");
        let (gateway, address) = (gateway(index), format!("10.211.{index}.2"));
        must("ip", &["netns", "add", &netns]);
        must(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", &inside,
            ],
        );
        must("ip", &["link", "set", &inside, "netns", &netns]);
        must(
            "ip",
            &["addr", "add", &format!("{gateway}/24"), "dev", &veth],
        );
        must("ip", &["link", "set", &veth, "up"]);
        for args in [
            vec!["addr", "add", &format!("{address}/24"), "dev", &inside],
            vec!["link", "set", &inside, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend(args);
            must("ip", &all);
        }
        let dir = dir.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let node_name_file = dir.join("node-name");
        let mut config = network.clone();
        let endpoints: Vec<String> = ports
            .iter()
            .map(|p| format!("https://{gateway}:{p}"))
            .collect();
        config["ipam"]["stateDir"] = json!(dir.join("state"));
        config["ipam"]["pool"]["etcd"]["endpoints"] = json!(endpoints);
        config["ipam"]["pool"]["etcd"]["tls"] = tls_settings(tls);
        config["ipam"]["pool"]["nodeNameFile"] = json!(node_name_file);
        // The node's notes of its claims, as on a node of its own.
        config["ipam"]["pool"]["dataDir"] = json!(dir.join("notes"));
        let config_file = dir.join("chaos.conf");
        std::fs::write(&config_file, config.to_string()).unwrap();
        // Pinned as an installer pins it.
        let scratch = dir.join("bin");
        must(
            bin.join("ipam-delegated").to_str().unwrap(),
            &[
                "install",
                "--into",
                scratch.to_str().unwrap(),
                "--node-name",
                &name,
                "--node-name-file",
                node_name_file.to_str().unwrap(),
            ],
        );
        let node = Node {
            name,
            netns,
            veth,
            gateway,
            dir,
            config,
            config_file,
            node_name_file,
            keepers: Mutex::new(Vec::new()),
            fenced: AtomicBool::new(false),
            skew: Mutex::new(None),
            kill_next: Mutex::new(None),
            cut: AtomicBool::new(false),
        };
        node.start_keeper(bin);
        node
    }

    /// A command run inside the node's namespace.
    fn inside(&self, program: &Path) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(program);
        command
    }

    /// Starts a keeper of the node (one more, if one runs): its log in
    /// the node's directory.
    pub fn start_keeper(&self, bin: &Path) {
        let mut keepers = lock(&self.keepers);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("keeper-{}.log", keepers.len())))
            .unwrap();
        let child = self
            .inside(&bin.join("ipam-da-pool"))
            .args([
                "node-keeper",
                "--config",
                self.config_file.to_str().unwrap(),
            ])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the keeper starts");
        keepers.push(child);
    }

    /// Sends `signal` to the node's first keeper.
    pub fn signal_keeper(&self, signal: &str) {
        if let Some(keeper) = lock(&self.keepers).first() {
            let _ = run("kill", &[&format!("-{signal}"), &keeper.id().to_string()]);
        }
    }

    /// Stops every keeper but the first (SIGTERM), waiting for each.
    pub fn stop_other_keepers(&self) {
        let mut keepers = lock(&self.keepers);
        for mut extra in keepers.drain(1..) {
            let _ = run("kill", &["-TERM", &extra.id().to_string()]);
            let _ = extra.wait();
        }
    }

    /// Cuts (or restores) the node's link to etcd.
    pub fn set_cut(&self, cut: bool) {
        let state = if cut { "down" } else { "up" };
        must("ip", &["link", "set", &self.veth, state]);
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Runs the plugin `program` (a CNI command in `env`) inside the node
    /// with `stdin`, killed as a pending fault asks.
    pub fn plugin(&self, program: &Path, env: &[(&str, String)], stdin: &[u8]) -> Ran {
        let mut command = self.inside(program);
        command
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        for (key, value) in env {
            command.env(key, value);
        }
        if let Some(offset) = lock(&self.skew).clone() {
            command
                .env("LD_PRELOAD", libfaketime())
                .env("FAKETIME", offset)
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the plugin starts");
        if let Some(mut pipe) = child.stdin.take() {
            use std::io::Write;
            let _ = pipe.write_all(stdin);
        }
        let mut pipe = child.stdout.take().expect("its stdout is piped");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = std::io::Read::read_to_end(&mut pipe, &mut out);
            out
        });
        // Killed through its handle, never by number: a plugin already
        // reaped is not killed, and no other process in its stead.
        let mut kill = lock(&self.kill_next).take();
        if let Some(asked) = kill {
            let deadline = Instant::now() + asked.after;
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    kill = None;
                    break;
                }
                if Instant::now() >= deadline {
                    if asked.tree {
                        for pid in descendants(child.id()) {
                            let _ = run("kill", &["-KILL", &pid.to_string()]);
                        }
                    }
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let status = child.wait().expect("the plugin ends");
        let stdout = reader.join().unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        Ran {
            status: if status.signal().is_some() {
                None
            } else {
                status.code()
            },
            stdout,
            kill,
        }
    }

    /// Removes the node's namespace and link, and stops its keepers.
    pub fn remove(&self) {
        for mut keeper in lock(&self.keepers).drain(..) {
            let _ = keeper.kill();
            let _ = keeper.wait();
        }
        let _ = run("ip", &["link", "del", &self.veth]);
        let _ = run("ip", &["netns", "del", &self.netns]);
    }
}

/// Every process below `pid`, from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let mut found = Vec::new();
    for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
        found.push(child);
        found.extend(descendants(child));
    }
    found
}

/// Where Debian's libfaketime is.
pub fn libfaketime() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| Some(entry.ok()?.path().join("faketime/libfaketime.so.1")))
        .find(|path| path.exists());
    found
        .expect("libfaketime (apt-get install faketime; .ci/chaos installs it)")
        .display()
        .to_string()
}
