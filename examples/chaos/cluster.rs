//! The run's etcd cluster: three members of Debian's etcd-server on this
//! host, their client ports listening on every address so that each
//! node reaches them through the root side of its veth, their peers on
//! loopback; a member killed and started again on its data; the quota
//! small enough to fill. Every member is bounded by timeout(1), should
//! the run die before it stops them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One member: its name, ports, and process while it runs.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    process: Option<Child>,
}

/// The cluster.
pub struct Cluster {
    dir: PathBuf,
    members: Vec<Member>,
    token: String,
    /// The database's quota, in bytes.
    pub quota: u64,
    /// How long any member may live, in seconds (timeout(1)'s bound).
    lifetime: u64,
}

impl Cluster {
    /// `size` members with data under `dir`, on `ports` (two per member),
    /// started and healthy.
    pub fn start(dir: &Path, size: usize, ports: &[u16], quota: u64, lifetime: u64) -> Cluster {
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[2 * i],
                peer: ports[2 * i + 1],
                process: None,
            })
            .collect();
        let mut cluster = Cluster {
            dir: dir.to_owned(),
            members,
            token: format!("chaos-{}", std::process::id()),
            quota,
            lifetime,
        };
        for i in 0..size {
            cluster.start_member(i);
        }
        assert!(
            cluster.wait_healthy(Duration::from_secs(60)),
            "the etcd cluster did not become healthy"
        );
        cluster
    }

    fn start_member(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let member = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))
            .expect("a member's log");
        let child = Command::new("timeout")
            .args(["-k", "5", &self.lifetime.to_string(), "/usr/bin/etcd"])
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .args([
                "--listen-client-urls",
                &format!("http://0.0.0.0:{}", member.client),
            ])
            .args([
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", member.client),
            ])
            .args([
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", member.peer),
            ])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", member.peer),
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(["--quota-backend-bytes", &self.quota.to_string()])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("a member's log"))
            .stderr(log)
            .spawn()
            .expect("etcd starts (apt-get install etcd-server; .ci/chaos installs it)");
        self.members[i].process = Some(child);
    }

    /// How many members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Whether member `i` runs.
    pub fn runs(&self, i: usize) -> bool {
        self.members[i].process.is_some()
    }

    /// The client endpoints, as `host` (an address of this host) reaches
    /// them.
    pub fn endpoints(&self, host: &str) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{host}:{}", m.client))
            .collect()
    }

    /// Kills member `i` (SIGKILL: a crash).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut timeout) = self.members[i].process.take() {
            // The member is timeout(1)'s only child; timeout(1) ends with it.
            let _ = Command::new("pkill")
                .args(["-KILL", "-P", &timeout.id().to_string()])
                .status();
            let _ = timeout.wait();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        if self.members[i].process.is_none() {
            self.start_member(i);
        }
    }

    /// Waits up to `limit` for every running member to say it is healthy.
    pub fn wait_healthy(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let healthy = self
                .members
                .iter()
                .filter(|m| m.process.is_some())
                .all(|m| {
                    self.etcdctl_at(m.client, &["endpoint", "health"])
                        .status
                        .success()
                });
            if healthy {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs etcdctl with `args` against the running members.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.process.is_some())
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect();
        etcdctl(&endpoints.join(","), args)
    }

    /// Puts `value` (read from stdin by etcdctl: too long for an
    /// argument) at `key`: whether etcd took it.
    pub fn put_large(&self, key: &str, value: &[u8]) -> bool {
        use std::io::Write;
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.process.is_some())
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect();
        let child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(["--command-timeout=5s", "put", key])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else { return false };
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(value);
        }
        child.wait().is_ok_and(|status| status.success())
    }

    fn etcdctl_at(&self, port: u16, args: &[&str]) -> Output {
        etcdctl(&format!("http://127.0.0.1:{port}"), args)
    }
}

/// etcdctl (Debian's etcd-client), API 3, against `endpoints`, bounded.
fn etcdctl(endpoints: &str, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(["--command-timeout=5s", "--dial-timeout=2s"])
        .args(args)
        .output()
        .expect("etcdctl runs (apt-get install etcd-client; .ci/chaos installs it)")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
