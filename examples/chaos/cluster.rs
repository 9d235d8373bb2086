//! The run's etcd cluster: three members of Debian's etcd-server on this
//! host, with TLS as production runs them (clients and peers alike, each
//! client with a certificate of the run's own CA), their client ports
//! listening on every address so that each node reaches them through the
//! root side of its veth, their peers on loopback; a member killed and
//! started again on its data, or paused (SIGSTOP: its kernel still
//! accepts connections, it answers nothing) and resumed; the quota small
//! enough to fill. Every member is bounded by timeout(1), should the run
//! die before it stops them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One member: its name, ports, and process while it runs.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    process: Option<Child>,
    /// Stopped by SIGSTOP, until resumed.
    paused: bool,
}

/// The run's PEM files: its CA, the members' certificate and key (for
/// loopback and every address a node reaches them at, for serving and
/// for their peers), and a client's, which the nodes, the operator and
/// the checker's etcdctl present.
#[derive(Debug, Clone)]
pub struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    member_cert: PathBuf,
    member_key: PathBuf,
}

impl Tls {
    /// A CA and the certificates it signs, made with openssl under `dir`;
    /// the members' names `addresses` (IPs) as well as 127.0.0.1.
    fn make(dir: &Path, addresses: &[String]) -> Tls {
        std::fs::create_dir_all(dir).expect("the certificates' directory");
        let names: Vec<String> = std::iter::once("127.0.0.1")
            .chain(addresses.iter().map(String::as_str))
            .map(|a| format!("IP:{a}"))
            .collect();
        let script = format!(
            r#"set -e
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=chaos-ca -keyout ca.key -out ca.pem 2>/dev/null
printf 'subjectAltName={}\nextendedKeyUsage=serverAuth,clientAuth\n' > member.ext
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=member -keyout member.key -out member.csr 2>/dev/null
openssl x509 -req -in member.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile member.ext -out member.pem 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=chaos-client -keyout client.key -out client.csr 2>/dev/null
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem 2>/dev/null
"#,
            names.join(",")
        );
        let out = Command::new("sh")
            .args(["-c", &script])
            .current_dir(dir)
            .output()
            .expect("openssl runs (apt-get install openssl; .ci/chaos installs it)");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tls {
            ca: dir.join("ca.pem"),
            cert: dir.join("client.pem"),
            key: dir.join("client.key"),
            member_cert: dir.join("member.pem"),
            member_key: dir.join("member.key"),
        }
    }

    /// etcdctl's flags for a client of the cluster.
    pub fn etcdctl_flags(&self) -> Vec<String> {
        vec![
            format!("--cacert={}", self.ca.display()),
            format!("--cert={}", self.cert.display()),
            format!("--key={}", self.key.display()),
        ]
    }
}

/// The cluster.
pub struct Cluster {
    dir: PathBuf,
    members: Vec<Member>,
    token: String,
    /// The certificates every member and client uses.
    pub tls: Tls,
    /// The database's quota, in bytes.
    pub quota: u64,
    /// How long any member may live, in seconds (timeout(1)'s bound).
    lifetime: u64,
}

impl Cluster {
    /// `size` members with data under `dir`, on `ports` (two per member),
    /// their certificates naming `addresses` too, started and healthy.
    pub fn start(
        dir: &Path,
        size: usize,
        ports: &[u16],
        addresses: &[String],
        quota: u64,
        lifetime: u64,
    ) -> Cluster {
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[2 * i],
                peer: ports[2 * i + 1],
                process: None,
                paused: false,
            })
            .collect();
        let mut cluster = Cluster {
            dir: dir.to_owned(),
            members,
            token: format!("chaos-{}", std::process::id()),
            tls: Tls::make(&dir.join("tls"), addresses),
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
            .map(|m| format!("{}=https://127.0.0.1:{}", m.name, m.peer))
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
                &format!("https://0.0.0.0:{}", member.client),
            ])
            .args([
                "--advertise-client-urls",
                &format!("https://127.0.0.1:{}", member.client),
            ])
            .args([
                "--listen-peer-urls",
                &format!("https://127.0.0.1:{}", member.peer),
            ])
            .args([
                "--initial-advertise-peer-urls",
                &format!("https://127.0.0.1:{}", member.peer),
            ])
            .arg("--client-cert-auth")
            .arg("--peer-client-cert-auth")
            .arg(format!("--trusted-ca-file={}", self.tls.ca.display()))
            .arg(format!("--peer-trusted-ca-file={}", self.tls.ca.display()))
            .arg(format!("--cert-file={}", self.tls.member_cert.display()))
            .arg(format!("--key-file={}", self.tls.member_key.display()))
            .arg(format!(
                "--peer-cert-file={}",
                self.tls.member_cert.display()
            ))
            .arg(format!("--peer-key-file={}", self.tls.member_key.display()))
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
            .map(|m| format!("https://{host}:{}", m.client))
            .collect()
    }

    /// etcdctl's flags to reach member `i` alone (TLS included).
    pub fn member_flags(&self, i: usize) -> Vec<String> {
        let mut flags = vec![format!(
            "--endpoints=https://127.0.0.1:{}",
            self.members[i].client
        )];
        flags.extend(self.tls.etcdctl_flags());
        flags
    }

    /// Kills member `i` (SIGKILL: a crash).
    pub fn kill(&mut self, i: usize) {
        self.members[i].paused = false;
        if let Some(mut timeout) = self.members[i].process.take() {
            // The member is timeout(1)'s only child; timeout(1) ends with it.
            let _ = Command::new("pkill")
                .args(["-KILL", "-P", &timeout.id().to_string()])
                .status();
            let _ = timeout.wait();
        }
    }

    /// Pauses member `i` (SIGSTOP), or resumes it (SIGCONT).
    pub fn pause(&mut self, i: usize, paused: bool) {
        if let Some(timeout) = &self.members[i].process {
            let signal = if paused { "-STOP" } else { "-CONT" };
            let _ = Command::new("pkill")
                .args([signal, "-P", &timeout.id().to_string()])
                .status();
            self.members[i].paused = paused;
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
                .filter(|m| m.process.is_some() && !m.paused)
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
        self.client().etcdctl(args)
    }

    /// A client of the members that run now, to use once the cluster is
    /// no longer locked: a command that waits for a cluster without
    /// quorum must not hold up the faults.
    pub fn client(&self) -> Client {
        Client {
            endpoints: self.running(),
            tls: self.tls.clone(),
        }
    }

    /// The endpoints of the members that run and are not paused.
    fn running(&self) -> String {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.process.is_some() && !m.paused)
            .map(|m| format!("https://127.0.0.1:{}", m.client))
            .collect();
        endpoints.join(",")
    }

    /// Puts `value` (read from stdin by etcdctl: too long for an
    /// argument) at `key`: whether etcd took it.
    pub fn put_large(&self, key: &str, value: &[u8]) -> bool {
        use std::io::Write;
        let child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.running()))
            .args(self.tls.etcdctl_flags())
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
        etcdctl(&format!("https://127.0.0.1:{port}"), &self.tls, args)
    }
}

/// etcdctl against some members.
#[derive(Debug, Clone)]
pub struct Client {
    endpoints: String,
    tls: Tls,
}

impl Client {
    /// Runs etcdctl with `args`.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        etcdctl(&self.endpoints, &self.tls, args)
    }
}

/// etcdctl (Debian's etcd-client), API 3, against `endpoints`, bounded.
fn etcdctl(endpoints: &str, tls: &Tls, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(tls.etcdctl_flags())
        .args(["--command-timeout=5s", "--dial-timeout=2s"])
        .args(args)
        .output()
        .expect("etcdctl runs (apt-get install etcd-client; .ci/chaos installs it)")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.pause(i, false);
            self.kill(i);
        }
    }
}
