//! A private Docker daemon for the tests (its own roots, socket, config
//! and cgroup parent, torn down with everything it made), a busybox image
//! made offline, and the driver serving it from the built plugin.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{temp_dir, TempDir, PLUGIN};

/// Debian's dockerd and the client of the same version.
const DOCKERD: &str = "/usr/sbin/dockerd";
const DOCKER: &str = "/usr/bin/docker";

/// The image every test container runs.
pub const IMAGE: &str = "ipam-delegated-test-busybox:1";

/// A dockerd of the test's own.
pub struct Dockerd {
    dir: TempDir,
    socket: PathBuf,
    process: Option<Child>,
    cgroup: String,
}

impl Dockerd {
    /// Starts one, without iptables, forwarding or a default bridge, and
    /// imports the busybox image into it.
    pub fn start() -> Dockerd {
        assert!(
            Path::new(DOCKERD).is_file() && Path::new(DOCKER).is_file(),
            "Debian's docker.io is not installed (apt-get install docker.io busybox-static; ./.ci/test installs them)"
        );
        let dir = temp_dir("dockerd");
        let cgroup = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let socket = dir.path().join("docker.sock");
        fs::write(dir.path().join("daemon.json"), "{}").unwrap();
        let log = fs::File::create(dir.path().join("dockerd.log")).unwrap();
        let process = Command::new(DOCKERD)
            .arg("--data-root")
            .arg(dir.path().join("data"))
            .arg("--exec-root")
            .arg(dir.path().join("exec"))
            .arg("--host")
            .arg(format!("unix://{}", socket.display()))
            .arg("--pidfile")
            .arg(dir.path().join("dockerd.pid"))
            .arg("--config-file")
            .arg(dir.path().join("daemon.json"))
            .args(["--cgroup-parent", &cgroup])
            .args(["--iptables=false", "--ip-forward=false", "--bridge=none"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("dockerd starts");
        let daemon = Dockerd {
            dir,
            socket,
            process: Some(process),
            cgroup,
        };
        daemon.wait_ready();
        daemon.import_busybox();
        daemon
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.docker(&["info"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "dockerd is not ready after 60 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// busybox-static in a root of its own, imported as [`IMAGE`].
    fn import_busybox(&self) {
        let root = self.dir.path().join("image");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::copy("/bin/busybox", root.join("bin/busybox"))
            .expect("busybox-static is installed (apt-get install busybox-static)");
        for applet in ["sh", "sleep", "ip", "cat", "hostname"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let tar = self.dir.path().join("image.tar");
        let made = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(made.success());
        self.ok(&[
            "import",
            "--change",
            r#"CMD ["/bin/sh"]"#,
            "--change",
            "ENV PATH=/bin",
            tar.to_str().unwrap(),
            IMAGE,
        ]);
    }

    /// The client's run of `args` against this daemon.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new(DOCKER)
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("docker runs")
    }

    /// The stdout of `args`, trimmed, which must succeed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(
            out.status.success(),
            "docker {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The stderr of `args`, which must fail.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(
            !out.status.success(),
            "docker {args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// A container started in the background on `network`, with `extra`
    /// options; its ID.
    pub fn run_on(&self, network: &str, extra: &[&str]) -> String {
        let mut args = vec!["run", "-d", "--stop-timeout", "1", "--network", network];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, "sleep", "600"]);
        self.ok(&args)
    }

    /// The IPv4 address of the container's eth0, as the container sees it.
    pub fn address_inside(&self, container: &str) -> String {
        let shown = self.ok(&["exec", container, "ip", "-4", "-o", "addr", "show", "eth0"]);
        let cidr = shown
            .split_whitespace()
            .skip_while(|word| *word != "inet")
            .nth(1)
            .unwrap_or_else(|| panic!("no inet in {shown:?}"));
        cidr.split('/').next().unwrap().to_owned()
    }

    /// The IPv4 gateway the container's default route goes through, as
    /// the container sees it: Docker's gateway of its network.
    pub fn gateway_inside(&self, container: &str) -> String {
        let shown = self.ok(&["exec", container, "ip", "-4", "route", "show", "default"]);
        shown
            .split_whitespace()
            .skip_while(|word| *word != "via")
            .nth(1)
            .unwrap_or_else(|| panic!("no default route in {shown:?}"))
            .to_owned()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    /// Removes every container and network: while drivers still serve,
    /// the networks' addresses and pools go back through them.
    fn remove_everything(&self) -> Vec<String> {
        let containers = self.docker(&["ps", "-aq"]);
        let containers = String::from_utf8_lossy(&containers.stdout).into_owned();
        if !containers.trim().is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(containers.split_whitespace());
            let _ = self.docker(&args);
        }
        let networks = self.docker(&[
            "network",
            "ls",
            "-q",
            "--no-trunc",
            "--filter",
            "type=custom",
        ]);
        let networks: Vec<String> = String::from_utf8_lossy(&networks.stdout)
            .split_whitespace()
            .map(String::from)
            .collect();
        for network in &networks {
            let _ = self.docker(&["network", "rm", network]);
        }
        // Each user network has a bridge in the host's namespace, which
        // outlives a daemon that could not remove it.
        networks
            .iter()
            .map(|id| format!("br-{}", &id[..12]))
            .collect()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let bridges = self.remove_everything();
        if let Some(mut process) = self.process.take() {
            let _ = Command::new("kill").arg(process.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while process.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = process.kill();
            let _ = process.wait();
        }
        let root = self.dir.path().to_string_lossy().into_owned();
        // containerd and its shims, if the daemon left them.
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&root) {
                let _ = Command::new("kill")
                    .args(["-KILL", &entry.file_name().to_string_lossy()])
                    .status();
            }
        }
        for bridge in bridges {
            let _ = Command::new("ip")
                .args(["link", "del", &bridge])
                .stderr(Stdio::null())
                .status();
        }
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&root))
            .collect();
        ours.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in ours {
            let _ = Command::new("umount").args(["-l", point]).status();
        }
        remove_cgroups(&Path::new("/sys/fs/cgroup").join(&self.cgroup));
    }
}

/// Removes a cgroup and those under it, deepest first.
fn remove_cgroups(dir: &Path) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroups(&entry.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

/// `ipam-delegated docker-plugin` serving a socket in Docker's plugin
/// directory under a name of the test's own, or a socket of the test's.
pub struct Driver {
    process: Option<Child>,
    pub name: String,
    pub socket: PathBuf,
    /// `--name NAME` or `--socket PATH`.
    serve: [String; 2],
    config: PathBuf,
    cni_path: String,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl Driver {
    /// Serves the networks of `config` (a file or directory) to Docker,
    /// with delegates from `cni_path`; `env` is added to its environment.
    /// Its log is in `dir`, whose name makes its own.
    pub fn start(config: &Path, cni_path: &str, env: &[(&str, &str)], dir: &Path) -> Driver {
        let name = format!(
            "ipam-delegated-test-{}",
            dir.file_name()
                .unwrap()
                .to_string_lossy()
                .rsplit('-')
                .next()
                .unwrap()
        );
        let socket = Path::new("/run/docker/plugins").join(format!("{name}.sock"));
        let serve = ["--name".into(), name.clone()];
        Driver::with(config, cni_path, env, dir, name, socket, serve)
    }

    /// Serves them on `dir/driver.sock`, for a test that speaks the
    /// protocol itself.
    pub fn on_socket(config: &Path, cni_path: &str, env: &[(&str, &str)], dir: &Path) -> Driver {
        let socket = dir.join("driver.sock");
        let serve = ["--socket".into(), socket.to_string_lossy().into_owned()];
        Driver::with(config, cni_path, env, dir, String::new(), socket, serve)
    }

    fn with(
        config: &Path,
        cni_path: &str,
        env: &[(&str, &str)],
        dir: &Path,
        name: String,
        socket: PathBuf,
        serve: [String; 2],
    ) -> Driver {
        let mut driver = Driver {
            process: None,
            name,
            socket,
            serve,
            config: config.to_owned(),
            cni_path: cni_path.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: dir.join("driver.log"),
        };
        driver.restart();
        driver
    }

    /// Its answer to a POST of `body` to `path`: the status and the JSON.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut stream = UnixStream::connect(&self.socket).expect("the driver accepts");
        send(&mut stream, path, body);
        read_answer(&mut BufReader::new(stream))
    }

    /// Starts it (again), and waits for its socket.
    pub fn restart(&mut self) {
        assert!(self.process.is_none());
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let process = Command::new(PLUGIN)
            .args(["docker-plugin", "--config"])
            .arg(&self.config)
            .args(&self.serve)
            .env("CNI_PATH", &self.cni_path)
            // The verbose flavour logs here, not to the machine's /var/log.
            .env(
                "IPAM_DELEGATED_LOG_FILE",
                self.log.with_extension("verbose.log"),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("the driver starts");
        self.process = Some(process);
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&self.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the driver does not serve {} after 10 s: {}",
                self.socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and how it ended.
    pub fn stop(&mut self) -> ExitStatus {
        let mut process = self.process.take().expect("the driver runs");
        let _ = Command::new("kill").arg(process.id().to_string()).status();
        process.wait().unwrap()
    }

    /// SIGKILL: a driver that dies in the middle of what it does.
    pub fn kill(&mut self) {
        let mut process = self.process.take().expect("the driver runs");
        process.kill().unwrap();
        process.wait().unwrap();
    }

    /// What it logged.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.process.is_some() {
            self.stop();
        }
    }
}

/// Writes a POST of `body` to `path`, as Docker's plugin client does.
pub fn send(stream: &mut UnixStream, path: &str, body: &Value) {
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: plugin\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
}

/// Reads one answer: its status and its JSON body.
pub fn read_answer(input: &mut impl BufRead) -> (u16, Value) {
    let mut line = String::new();
    input.read_line(&mut line).unwrap();
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {line:?}"));
    let mut length = 0;
    loop {
        line.clear();
        input.read_line(&mut line).unwrap();
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some(value) = header.strip_prefix("Content-Length: ") {
            length = value.parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    input.read_exact(&mut body).unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}
