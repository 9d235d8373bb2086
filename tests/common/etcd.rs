//! etcd clusters of the tests' own, from Debian's etcd-server: members on
//! loopback ports of their own, data in a temporary directory, every one
//! stopped when the cluster is dropped (and bounded by timeout(1) should
//! the test process die first). Keys are read and written through the
//! members' JSON gateway.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{temp_dir, TempDir};

/// PEM files for a TLS cluster: its CA, the members' certificate and key
/// (for 127.0.0.1), and a client's.
pub struct Certificates {
    pub dir: TempDir,
}

impl Certificates {
    /// A CA, and a member's and a client's certificates it signs, made
    /// with openssl.
    pub fn make() -> Certificates {
        let dir = temp_dir("etcd-tls");
        let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > member.ext
openssl req -newkey rsa:2048 -nodes -subj /CN=member -keyout member.key -out member.csr
openssl x509 -req -in member.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile member.ext -out member.pem
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl req -newkey rsa:2048 -nodes -subj /CN=ipam-da-pool -keyout client.key -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca -keyout other.key -out other.pem
"#;
        let out = Command::new("sh")
            .args(["-c", script])
            .current_dir(dir.path())
            .output()
            .expect("openssl runs (apt-get install openssl; ./.ci/test installs it)");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Certificates { dir }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// One member: its name, ports, and process while it runs. `admin` is
/// where the tests themselves talk to it, in plain HTTP: its client port,
/// or, in a TLS cluster, a second one on loopback.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    admin: u16,
    process: Option<Child>,
}

/// A cluster of members on loopback.
pub struct Cluster {
    dir: TempDir,
    members: Vec<Member>,
    tls: bool,
    token: String,
    /// Flags every member starts with, beyond the harness's own.
    flags: Vec<String>,
}

/// Ports nothing listens on now, each different, and none handed out
/// before in this process: the kernel may hand a port freed here to the
/// next caller, and two tests' clusters started at once on one port would
/// share the first one's members (the second's fail to listen, and its
/// health check is answered by the first's).
fn free_ports(count: usize) -> Vec<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Held until every port is chosen, so that none comes twice.
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < count {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if given.insert(port) {
            ports.push(port);
        }
        listeners.push(listener);
    }
    ports
}

impl Cluster {
    /// `size` members, started and healthy; TLS with client certificates
    /// when `tls` is given.
    pub fn start(size: usize, tls: Option<&Certificates>) -> Cluster {
        Cluster::start_with(size, tls, &[])
    }

    /// As [`Cluster::start`], each member also started with `flags`.
    pub fn start_with(size: usize, tls: Option<&Certificates>, flags: &[&str]) -> Cluster {
        assert!(
            Path::new("/usr/bin/etcd").exists(),
            "etcd tests need Debian's etcd-server (./.ci/test installs it)"
        );
        let dir = temp_dir("etcd");
        let ports = free_ports(3 * size);
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[3 * i],
                peer: ports[3 * i + 1],
                admin: if tls.is_some() {
                    ports[3 * i + 2]
                } else {
                    ports[3 * i]
                },
                process: None,
            })
            .collect();
        let mut cluster = Cluster {
            token: format!("ipamd-{}-{}", std::process::id(), ports[0]),
            dir,
            members,
            tls: tls.is_some(),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        };
        if let Some(certificates) = tls {
            for file in ["ca.pem", "member.pem", "member.key"] {
                std::fs::copy(certificates.file(file), cluster.dir.path().join(file)).unwrap();
            }
        }
        for i in 0..size {
            cluster.start_member(i);
        }
        cluster.wait_healthy();
        cluster
    }

    fn scheme(&self) -> &str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    fn start_member(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let member = &self.members[i];
        let client_url = format!("{}://127.0.0.1:{}", self.scheme(), member.client);
        let peer_url = format!("http://127.0.0.1:{}", member.peer);
        let listen = if self.tls {
            format!("{client_url},http://127.0.0.1:{}", member.admin)
        } else {
            client_url.clone()
        };
        let log =
            std::fs::File::create(self.dir.path().join(format!("{}.log", member.name))).unwrap();
        let mut command = Command::new("timeout");
        command
            .args(["-k", "5", "1800", "/usr/bin/etcd"])
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &listen])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(["--log-level", "warn"])
            .args(&self.flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if self.tls {
            let file = |name: &str| self.dir.path().join(name);
            command
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(file("ca.pem"))
                .arg("--cert-file")
                .arg(file("member.pem"))
                .arg("--key-file")
                .arg(file("member.key"));
        }
        let child = command.spawn().expect("etcd starts");
        self.members[i].process = Some(child);
    }

    /// Waits until every running member says it is healthy.
    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for member in self.members.iter().filter(|m| m.process.is_some()) {
            loop {
                if get(member.admin, "/health").is_some_and(|h| h["health"] == "true") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd member {} is not healthy after 60 s: {}",
                    member.name,
                    std::fs::read_to_string(self.dir.path().join(format!("{}.log", member.name)))
                        .unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Runs Debian's etcdctl (package etcd-client) with `args` against the
    /// first member: its output, having checked that it succeeded.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let member = &self.members[0];
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://127.0.0.1:{}", member.admin))
            .args(args)
            .output()
            .expect("etcdctl runs (./.ci/test installs etcd-client)");
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The client endpoints, as the plugin's settings take them.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.scheme(), m.client))
            .collect()
    }

    /// A directory of this cluster's own for the nodes' notes (the
    /// allocator's `dataDir`). Left to its default, every test would share
    /// `/var/lib/cni/ipam-da-pool`, and a cluster on a port another test
    /// binary used before would read that cluster's notes: a guess still
    /// right for the allocator, but not the address a test expects.
    pub fn notes(&self) -> PathBuf {
        self.dir.path().join("notes")
    }

    /// Kills member `i` (SIGKILL: a crash, not a shutdown).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut timeout) = self.members[i].process.take() {
            // The member is timeout(1)'s only child; timeout(1) ends with it.
            let children = format!("/proc/{0}/task/{0}/children", timeout.id());
            for pid in std::fs::read_to_string(children)
                .unwrap_or_default()
                .split_whitespace()
            {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            let _ = timeout.wait();
        }
    }

    /// The pid of member `i`'s etcd, timeout(1)'s only child.
    fn pid(&self, i: usize) -> String {
        let timeout = self.members[i].process.as_ref().expect("a running member");
        let children = format!("/proc/{0}/task/{0}/children", timeout.id());
        let pid = std::fs::read_to_string(children).unwrap_or_default();
        pid.split_whitespace().next().expect("etcd runs").to_owned()
    }

    /// Stops member `i` where it stands (SIGSTOP): its kernel still
    /// accepts connections, its process answers none, as a wedged member.
    pub fn freeze(&self, i: usize) {
        let stopped = Command::new("kill").args(["-STOP", &self.pid(i)]).status();
        assert!(stopped.unwrap().success());
    }

    /// Lets a frozen member `i` go on (SIGCONT).
    pub fn thaw(&self, i: usize) {
        let resumed = Command::new("kill").args(["-CONT", &self.pid(i)]).status();
        assert!(resumed.unwrap().success());
    }

    /// The keys under `prefix` as the first running member other than
    /// `apart` has them, read serializably (a member without a leader
    /// still answers); `None` if none answers.
    pub fn try_keys_apart_from(&self, apart: usize, prefix: &str) -> Option<Vec<String>> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let request = json!({
            "key": encode(prefix.as_bytes()),
            "range_end": encode(&end),
            "keys_only": true,
            "serializable": true,
        });
        self.members
            .iter()
            .enumerate()
            .filter(|(i, m)| *i != apart && m.process.is_some())
            .find_map(|(_, m)| post(m.admin, "/v3/kv/range", &request))
            .map(|answer| {
                answer["kvs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|kv| {
                        String::from_utf8_lossy(&decode(kv["key"].as_str().unwrap_or_default()))
                            .into_owned()
                    })
                    .collect()
            })
    }

    /// Starts `members` again, on their data, and waits for them.
    pub fn restart(&mut self, members: &[usize]) {
        for i in members {
            self.start_member(*i);
        }
        self.wait_healthy();
    }

    /// Rebuilds the cluster from nothing, as an operator might after
    /// losing it: every member stopped, its data removed, and started
    /// again at the same endpoints, so that the revisions count from 1.
    pub fn rebuild(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
            let data = self.dir.path().join(&self.members[i].name);
            std::fs::remove_dir_all(data).unwrap();
        }
        for i in 0..self.members.len() {
            self.start_member(i);
        }
        self.wait_healthy();
    }

    /// The index of the member that leads, as the members say.
    pub fn leader(&self) -> usize {
        for member in self.members.iter().filter(|m| m.process.is_some()) {
            if let Some(status) = post(member.admin, "/v3/maintenance/status", &json!({})) {
                let leader = status["leader"].as_str().unwrap_or_default().to_owned();
                for (i, m) in self.members.iter().enumerate() {
                    let Some(own) = post(m.admin, "/v3/maintenance/status", &json!({})) else {
                        continue;
                    };
                    if own["header"]["member_id"].as_str() == Some(leader.as_str()) {
                        return i;
                    }
                }
            }
        }
        panic!("no member says who leads");
    }

    /// The keys under `prefix`, from the first running member, as text.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.values(prefix).into_iter().map(|(k, _)| k).collect()
    }

    /// Whether the running members other than `apart` follow a leader
    /// among themselves: an election after `apart` froze has ended.
    pub fn led_apart_from(&self, apart: usize) -> bool {
        let others: Vec<Value> = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| *i != apart && m.process.is_some())
            .filter_map(|(_, m)| post(m.admin, "/v3/maintenance/status", &json!({})))
            .collect();
        others.iter().any(|status| {
            let leader = status["leader"].as_str().unwrap_or_default();
            others
                .iter()
                .any(|own| own["header"]["member_id"].as_str() == Some(leader))
        })
    }

    /// The keys under `prefix` and their values, as text.
    pub fn values(&self, prefix: &str) -> Vec<(String, String)> {
        let member = self
            .members
            .iter()
            .find(|m| m.process.is_some())
            .expect("a running member");
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let answer = post(
            member.admin,
            "/v3/kv/range",
            &json!({"key": encode(prefix.as_bytes()), "range_end": encode(&end)}),
        )
        .expect("the member answers");
        answer["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| {
                        let text = |name: &str| {
                            String::from_utf8(decode(kv[name].as_str().unwrap_or_default()))
                                .unwrap()
                        };
                        (text("key"), text("value"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The sum over the running members of the metric `name` (every
    /// sample of it, whatever its labels), from their `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let mut total = 0.0;
        for member in self.members.iter().filter(|m| m.process.is_some()) {
            let mut stream = TcpStream::connect(("127.0.0.1", member.admin)).unwrap();
            stream
                .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            total += answer
                .lines()
                .filter(|line| {
                    line.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with([' ', '{']))
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        total
    }

    /// The first running member's database: its file's size and the part
    /// of it in use (etcd's `dbSize` and `dbSizeInUse`), in bytes.
    pub fn db_size(&self) -> (u64, u64) {
        let member = self.members.iter().find(|m| m.process.is_some()).unwrap();
        let status =
            post(member.admin, "/v3/maintenance/status", &json!({})).expect("the member answers");
        let field = |name: &str| status[name].as_str().unwrap_or("0").parse().unwrap_or(0);
        (field("dbSize"), field("dbSizeInUse"))
    }

    /// The cluster's revision now: how many changes it has made.
    pub fn revision(&self) -> i64 {
        let member = self.members.iter().find(|m| m.process.is_some()).unwrap();
        let answer = post(member.admin, "/v3/kv/range", &json!({"key": encode(b"/")}))
            .expect("the member answers");
        answer["header"]["revision"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Sets every key to its value, in transactions of etcd's largest
    /// size (128 operations).
    pub fn put_all(&self, pairs: &[(String, String)]) {
        let member = self.members.iter().find(|m| m.process.is_some()).unwrap();
        for batch in pairs.chunks(128) {
            let puts: Vec<Value> = batch
                .iter()
                .map(|(k, v)| json!({"request_put": {"key": encode(k.as_bytes()), "value": encode(v.as_bytes())}}))
                .collect();
            post(member.client, "/v3/kv/txn", &json!({"success": puts}))
                .expect("the member answers");
        }
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: &str, value: &str) {
        let member = self.members.iter().find(|m| m.process.is_some()).unwrap();
        post(
            member.admin,
            "/v3/kv/put",
            &json!({"key": encode(key.as_bytes()), "value": encode(value.as_bytes())}),
        )
        .expect("the member answers");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// GET `path` of a plain member: its JSON, if it answers.
fn get(port: u16, path: &str) -> Option<Value> {
    exchange(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"),
    )
}

/// POST `body` to `path` of a plain member: its JSON, if it answers.
fn post(port: u16, path: &str, body: &Value) -> Option<Value> {
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    exchange(port, &request)
}

/// One HTTP/1.0 exchange: the answer's body as JSON.
fn exchange(port: u16, request: &str) -> Option<Value> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| serde_json::from_str(body).ok())
        .flatten()
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64, as etcd's JSON gateway carries keys and values.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut bits, mut count) = (0u32, 0);
    for c in text.trim_end_matches('=').bytes() {
        bits = bits << 6 | ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}

/// A proxy on a loopback port of its own in front of an etcd member,
/// which counts the requests made through it (each `POST /v3/…`): how
/// many round trips a command costs the cluster.
pub struct Counting {
    port: u16,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Counting {
    /// A proxy to the member at `endpoint` (`http://127.0.0.1:PORT`).
    pub fn to(endpoint: &str) -> Counting {
        let upstream: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(member) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                // As the plugin's and etcd's own: no request held back.
                let _ = (client.set_nodelay(true), member.set_nodelay(true));
                let (mut from_member, mut to_client) =
                    (member.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || std::io::copy(&mut from_member, &mut to_client));
                let counted = counted.clone();
                std::thread::spawn(move || forward_counting(client, member, &counted));
            }
        });
        Counting { port, requests }
    }

    /// The endpoint to give the plugin.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests made through it so far.
    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Copies what `client` sends to `member`, counting the requests in it
/// (a request line may be split between two reads).
fn forward_counting(
    mut client: TcpStream,
    mut member: TcpStream,
    counted: &std::sync::atomic::AtomicUsize,
) {
    const LINE: &[u8] = b"POST /v3/";
    let mut carried: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 16384];
    loop {
        let n = match client.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        carried.extend_from_slice(&buffer[..n]);
        let found = carried.windows(LINE.len()).filter(|w| *w == LINE).count();
        counted.fetch_add(found, std::sync::atomic::Ordering::SeqCst);
        let keep = carried.len().min(LINE.len() - 1);
        carried.drain(..carried.len() - keep);
        if member.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = member.shutdown(std::net::Shutdown::Both);
}

/// A claim as a bare client makes it, the least an ADD can cost the
/// cluster: one transaction, over a connection of its own, that puts
/// `key` if it is absent. Whether it did.
pub fn bare_claim(endpoint: &str, key: &str) -> bool {
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let key = encode(key.as_bytes());
    let txn = json!({
        "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": key, "value": encode(b"claimed")}}],
    });
    post(port, "/v3/kv/txn", &txn).is_some_and(|answer| answer["succeeded"] == true)
}
