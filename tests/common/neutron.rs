//! A real OpenStack Networking server (Debian's python3-neutron) for the
//! tests: started on a loopback port of its own with its data in a
//! temporary directory (tests/neutron/server/run.py), and stopped, its
//! whole process group, when dropped; with a small HTTP client to set up
//! networks and subnets and to look at ports as the controller has them.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{temp_dir, TempDir};

/// Debian's interpreter: another python3 in PATH may not see its modules.
const PYTHON: &str = "/usr/bin/python3";

/// How a server is started.
#[derive(Default, Clone)]
pub struct Options {
    /// Requests must carry this `X-Auth-Token`.
    pub token: Option<String>,
    /// Its policy forbids `binding:host_id` to everyone, admins too.
    pub forbid_host_binding: bool,
    /// It drops the tags of a port POST.
    pub drop_posted_tags: bool,
    /// It answers lists in pages of at most this many items.
    pub page_size: Option<u32>,
    /// Policy rules no one passes, admin included.
    pub forbid: Vec<&'static str>,
    /// It serves HTTPS with this certificate and key, which this CA signed.
    pub tls: Option<Tls>,
    /// It validates tokens against this Keystone (its v3 root, and the
    /// admin's password), rather than taking every request as an admin's.
    pub keystone: Option<(String, String)>,
}

/// The PEM files of a server's HTTPS.
#[derive(Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A running server.
pub struct Neutron {
    child: Option<Child>,
    /// The server stops when this pipe closes, with this process if need
    /// be (a server shared by a test binary is never dropped).
    _lifeline: Option<ChildStdin>,
    pub port: u16,
    pub dir: TempDir,
    options: Options,
}

/// A free loopback port (bound, then let go: the server binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Neutron {
    /// Starts a server and waits until it answers.
    pub fn start(options: Options) -> Neutron {
        let dir = temp_dir("neutron");
        let mut neutron = Neutron {
            child: None,
            _lifeline: None,
            port: free_port(),
            dir,
            options,
        };
        neutron.launch();
        neutron
    }

    fn launch(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/neutron/server/run.py");
        // The schema, made once per build and copied for each server.
        let template = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("neutron-schema.sqlite");
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let mut command = Command::new("setsid");
        command
            .arg(PYTHON)
            .arg(script)
            .arg("--dir")
            .arg(self.dir.path().join("server"))
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--schema-template")
            .arg(&template)
            .arg("--stop-with-stdin")
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(token) = &self.options.token {
            command.arg("--token").arg(token);
        }
        if self.options.forbid_host_binding {
            command.arg("--forbid-host-binding");
        }
        if self.options.drop_posted_tags {
            command.arg("--drop-posted-tags");
        }
        if let Some(size) = self.options.page_size {
            command.args(["--page-size", &size.to_string()]);
        }
        for rule in &self.options.forbid {
            command.args(["--forbid", rule]);
        }
        if let Some(tls) = &self.options.tls {
            command.arg("--tls-cert").arg(&tls.cert);
            command.arg("--tls-key").arg(&tls.key);
        }
        if let Some((url, password)) = &self.options.keystone {
            command
                .args(["--keystone", url, "--keystone-password", password])
                // Each token validated anew: a revoked one is refused at once.
                .args(["--keystone-token-cache-time", "0"]);
            self.options.token = Some(admin_token(url, password));
        }
        let mut child = command.spawn().expect("the neutron server starts");
        self._lifeline = child.stdin.take();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok((200, _)) = self.try_request("GET", "/v2.0/networks", None) {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the neutron server exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "the neutron server never answered: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's log, for a failure's message.
    pub fn log(&self) -> String {
        let server = self.dir.path().join("server");
        let text = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
            + &std::fs::read_to_string(server.join("neutron.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The API's root, as `ipam.neutron.url` takes it.
    pub fn url(&self) -> String {
        let scheme = match self.options.tls {
            Some(_) => "https",
            None => "http",
        };
        format!("{scheme}://127.0.0.1:{}/v2.0", self.port)
    }

    /// Kills the whole server at once (SIGKILL to its process group).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data, after `kill`.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// A request as an admin (with the token, if the server wants one):
    /// its status and its JSON body (null if none).
    pub fn request(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.try_request(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}: {}", self.log()))
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> std::io::Result<(u16, Value)> {
        let token = self.options.token.as_deref();
        let ca = self.options.tls.as_ref().map(|tls| tls.ca.as_path());
        let (status, _, body) = exchange(self.port, ca, method, path, body, token)?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// Makes a network; returns its ID.
    pub fn network(&self, name: &str) -> String {
        let (status, body) = self.request(
            "POST",
            "/v2.0/networks",
            Some(json!({"network": {"name": name}})),
        );
        assert_eq!(status, 201, "{body}");
        body["network"]["id"].as_str().unwrap().to_owned()
    }

    /// Makes a subnet of `network` with these members (`cidr`,
    /// `gateway_ip`, `allocation_pools`, …); returns its ID.
    pub fn subnet(&self, network: &str, members: Value) -> String {
        let mut subnet = json!({"network_id": network, "ip_version": 4});
        for (key, value) in members.as_object().unwrap() {
            subnet[key] = value.clone();
        }
        let (status, body) =
            self.request("POST", "/v2.0/subnets", Some(json!({ "subnet": subnet })));
        assert_eq!(status, 201, "{body}");
        body["subnet"]["id"].as_str().unwrap().to_owned()
    }

    /// Every port of `network`, as the controller has them.
    pub fn ports_of(&self, network: &str) -> Vec<Value> {
        let (status, body) =
            self.request("GET", &format!("/v2.0/ports?network_id={network}"), None);
        assert_eq!(status, 200, "{body}");
        body["ports"].as_array().unwrap().clone()
    }

    /// Makes a port directly (another owner's, another host's).
    pub fn port(&self, members: Value) -> Value {
        let (status, body) = self.request("POST", "/v2.0/ports", Some(json!({ "port": members })));
        assert_eq!(status, 201, "{body}");
        body["port"].clone()
    }
}

impl Drop for Neutron {
    /// SIGTERM to the group, which stops its three processes in about a
    /// second; SIGKILL if it lingers.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill")
                .args(["-TERM", "--", &group])
                .stderr(Stdio::null())
                .status();
            // Its group's leader is reaped only after the group is
            // killed: reaped first, its group's ID could be another's.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && !exited(child.id()) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }
}

/// A TLS client on `stream` to 127.0.0.1, trusting `ca` only.
fn tls_to_loopback(
    ca: &Path,
    stream: TcpStream,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        rustls::pki_types::CertificateDer::pem_file_iter(ca).map_err(std::io::Error::other)?
    {
        roots
            .add(cert.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name =
        rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(std::io::Error::other)?;
    Ok(rustls::StreamOwned::new(connection, stream))
}

/// Whether process `pid`, a child not yet reaped, has exited (a zombie).
fn exited(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis.
    stat.rsplit_once(')')
        .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// A Keystone (Debian's python3-keystone) of the tests' own, with an
/// application credential of its admin made: tests/neutron/server/keystone.py.
pub struct Keystone {
    child: Child,
    _lifeline: Option<ChildStdin>,
    pub port: u16,
    /// credential.json: `auth_url`, `id`, `secret`, `user_id`,
    /// `admin_password` …
    pub credential: Value,
    pub dir: TempDir,
}

impl Keystone {
    /// Starts it, tokens lasting `token_seconds`, and waits until it serves.
    pub fn start(token_seconds: u64) -> Keystone {
        let dir = temp_dir("keystone");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/neutron/server/keystone.py");
        let template = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("keystone-template");
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let port = free_port();
        let mut child = Command::new("setsid")
            .arg(PYTHON)
            .arg(script)
            .arg("--dir")
            .arg(dir.path().join("server"))
            .args(["--port", &port.to_string()])
            .arg("--template")
            .arg(template)
            .args(["--token-expiration", &token_seconds.to_string()])
            .arg("--stop-with-stdin")
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("keystone starts");
        let lifeline = child.stdin.take();
        let file = dir.path().join("server/credential.json");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !file.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                let log =
                    std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
                panic!("keystone exited ({status}): {log}");
            }
            assert!(Instant::now() < deadline, "keystone never got ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        let credential = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        Keystone {
            child,
            _lifeline: lifeline,
            port,
            credential,
            dir,
        }
    }

    /// Its v3 root.
    pub fn url(&self) -> String {
        self.credential["auth_url"].as_str().unwrap().to_owned()
    }

    /// What a Neutron that validates against it needs.
    pub fn for_neutron(&self) -> (String, String) {
        let password = self.credential["admin_password"].as_str().unwrap();
        (self.url(), password.to_owned())
    }

    /// Deletes the application credential (its tokens are refused then).
    pub fn revoke(&self) {
        let (url, password) = self.for_neutron();
        let token = admin_token(&url, &password);
        let user = self.credential["user_id"].as_str().unwrap();
        let id = self.credential["id"].as_str().unwrap();
        let path = format!("/v3/users/{user}/application_credentials/{id}");
        let (status, _) = http(self.port, "DELETE", &path, None, Some(&token)).unwrap();
        assert_eq!(status, 204);
    }

    /// Kills it (SIGKILL to its process group).
    pub fn kill(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Keystone {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An admin's token, by password, from the Keystone at `url`.
fn admin_token(url: &str, password: &str) -> String {
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a loopback Keystone: {url}"));
    let body = json!({"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": "admin", "domain": {"id": "default"}, "password": password}}},
        "scope": {"project": {"name": "admin", "domain": {"id": "default"}}},
    }});
    let (status, head, _) =
        http_with_head(port, "POST", "/v3/auth/tokens", Some(body), None).unwrap();
    assert_eq!(status, 201, "{head}");
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-subject-token")
                .then(|| value.trim().to_owned())
        })
        .expect("a token")
}

/// One HTTP/1.1 request on a connection of its own, closed after the
/// answer: its status and body (chunks joined).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> std::io::Result<(u16, Vec<u8>)> {
    http_with_head(port, method, path, body, token).map(|(status, _, body)| (status, body))
}

/// As [`http`], with the answer's head too.
pub fn http_with_head(
    port: u16,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> std::io::Result<(u16, String, Vec<u8>)> {
    exchange(port, None, method, path, body, token)
}

/// One request to loopback `port`, over TLS trusting `ca` if it is
/// given: its status, head and body.
fn exchange(
    port: u16,
    ca: Option<&Path>,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> std::io::Result<(u16, String, Vec<u8>)> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let token = token.map_or(String::new(), |t| format!("X-Auth-Token: {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{token}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut answer = Vec::new();
    match ca {
        None => {
            let mut stream = stream;
            stream.write_all(request.as_bytes())?;
            stream.read_to_end(&mut answer)?;
        }
        Some(ca) => {
            let mut tls = tls_to_loopback(ca, stream)?;
            tls.write_all(request.as_bytes())?;
            // A server that closes without close_notify ends the answer all the same.
            match tls.read_to_end(&mut answer) {
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                other => {
                    other?;
                }
            }
        }
    }
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an answer: {head}")))?;
    let mut rest = answer[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut joined = Vec::new();
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
                .unwrap_or(0);
            if size == 0 {
                break;
            }
            joined.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = rest[eol + 2 + size + 2..].to_vec();
        }
        rest = joined;
    }
    Ok((status, head, rest))
}
