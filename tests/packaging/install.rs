//! `ipam-delegated install`, as an image's installer runs it on a node:
//! the family copied into a CNI_PATH directory whole, an unchanged binary
//! left alone, the configuration written only once every plugin it names
//! is there, the node's name pinned, and an upgrade that a runtime
//! executing the plugins meanwhile never sees half done.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{temp_dir, TempDir, ALLOCATOR, PLUGIN, PORT_ALLOCATOR, SELECTOR};

const DOCKER: &str = env!("CARGO_BIN_EXE_ipam-delegated-docker");

/// A runtime that executes a plugin over and over, each run to succeed,
/// until stopped.
pub(crate) struct Runtime {
    stop: Arc<AtomicBool>,
    runs: Arc<AtomicUsize>,
    runner: std::thread::JoinHandle<Option<String>>,
}

impl Runtime {
    /// Starts running `plugin --version` in a loop.
    pub(crate) fn start(plugin: PathBuf) -> Runtime {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let runner = {
            let (stop, runs) = (stop.clone(), runs.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match Command::new(&plugin).arg("--version").output() {
                        Ok(out) if out.status.success() => {
                            runs.fetch_add(1, Ordering::Relaxed);
                        }
                        failed => return Some(format!("{failed:?}")),
                    }
                }
                None
            })
        };
        Runtime { stop, runs, runner }
    }

    /// Stops it, having checked that no run failed: how many ran.
    pub(crate) fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        assert_eq!(self.runner.join().unwrap(), None, "a run failed");
        self.runs.load(Ordering::Relaxed)
    }
}

/// The family's binaries copied into `dir`, ipam-da-pool with `extra`
/// bytes after its end (another build of it, as an upgrade brings).
fn family_in(dir: &Path, extra: &[u8]) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    for binary in [PLUGIN, SELECTOR, ALLOCATOR, PORT_ALLOCATOR, DOCKER] {
        let name = Path::new(binary).file_name().unwrap();
        let mut bytes = fs::read(binary).unwrap();
        if name == "ipam-da-pool" {
            bytes.extend_from_slice(extra);
        }
        fs::write(dir.join(name), bytes).unwrap();
        fs::set_permissions(dir.join(name), fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir.join("ipam-delegated")
}

fn install(installer: &Path, args: &[&str]) -> std::process::Output {
    Command::new(installer)
        .arg("install")
        .args(args)
        .output()
        .unwrap()
}

fn inodes(dir: &Path) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().ino(),
            )
        })
        .collect();
    found.sort();
    found
}

/// A host to install onto, in a directory of the test's own: the
/// family in an image directory beside it, the host's CNI_PATH, net.d and
/// pinned node name's paths, and a conflist whose plugin is `main`.
struct Host {
    work: TempDir,
    installer: PathBuf,
    bin: PathBuf,
    netd: PathBuf,
    pinned: PathBuf,
    conflist: PathBuf,
}

impl Host {
    fn new(tag: &str, main: &str) -> Host {
        let work = temp_dir(tag);
        let conflist = work.path().join("pods.conflist");
        let text = format!(
            r#"{{"cniVersion": "1.0.0", "name": "pods", "plugins": [{{"type": "{main}",
                "ipam": {{"type": "ipam-delegated", "delegates": ["ipam-ds-static", "ipam-da-pool"]}}}}]}}"#
        );
        fs::write(&conflist, text).unwrap();
        Host {
            installer: family_in(&work.path().join("image"), b""),
            bin: work.path().join("host/opt/cni/bin"),
            netd: work.path().join("host/etc/cni/net.d"),
            pinned: work.path().join("host/var/lib/cni/ipam-da-pool/node-name"),
            conflist,
            work,
        }
    }
}

#[test]
fn the_installer_places_the_family_whole_and_the_configuration_last() {
    let Host {
        work,
        installer,
        bin,
        netd,
        pinned,
        conflist,
    } = Host::new("install", "bridge");
    // A Secret's volume: files that are links into a directory of its own.
    let secret = work.path().join("secret");
    fs::create_dir_all(secret.join("..2026_11_25")).unwrap();
    fs::write(secret.join("..2026_11_25/ca.crt"), "CA").unwrap();
    std::os::unix::fs::symlink("..2026_11_25", secret.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/ca.crt", secret.join("ca.crt")).unwrap();
    let credentials = work.path().join("host/etc/cni/ipam-delegated/etcd");
    let args = [
        "--into",
        bin.to_str().unwrap(),
        "--secrets",
        secret.to_str().unwrap(),
        "--secrets-into",
        credentials.to_str().unwrap(),
        "--conflist",
        conflist.to_str().unwrap(),
        "--conf-dir",
        netd.to_str().unwrap(),
        "--node-name",
        "node-7",
        "--node-name-file",
        pinned.to_str().unwrap(),
    ];
    // bridge is not in the directory yet: the binaries go in, the
    // configuration does not.
    let out = install(&installer, &args);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("names bridge, not in"),
        "{out:?}"
    );
    assert!(!netd.join("pods.conflist").exists());
    let names: Vec<String> = inodes(&bin).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "ipam-da-neutron",
            "ipam-da-pool",
            "ipam-delegated",
            "ipam-delegated-docker",
            "ipam-ds-static"
        ]
    );
    // Once it is: everything, the binaries left as they were.
    fs::write(bin.join("bridge"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(bin.join("bridge"), fs::Permissions::from_mode(0o755)).unwrap();
    let before = inodes(&bin);
    let out = install(&installer, &args);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains(&format!("unchanged {}", bin.join("ipam-da-pool").display())),
        "{said}"
    );
    assert_eq!(inodes(&bin), before, "a second run changes nothing");
    assert_eq!(
        fs::read(netd.join("pods.conflist")).unwrap(),
        fs::read(&conflist).unwrap()
    );
    assert_eq!(fs::read_to_string(&pinned).unwrap(), "node-7\n");
    // The credentials, for the plugins on the host: root's alone.
    assert_eq!(fs::read(credentials.join("ca.crt")).unwrap(), b"CA");
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        (mode(&credentials), mode(&credentials.join("ca.crt"))),
        (0o700, 0o600)
    );
    assert_eq!(
        fs::read_dir(&credentials).unwrap().count(),
        1,
        "only the Secret's files"
    );
    let conf_inode = fs::metadata(netd.join("pods.conflist")).unwrap().ino();
    assert!(install(&installer, &args).status.success());
    assert_eq!(
        fs::metadata(netd.join("pods.conflist")).unwrap().ino(),
        conf_inode
    );
    assert_eq!(
        fs::read_dir(&bin).unwrap().count(),
        6,
        "no temporary file left"
    );
}

#[test]
fn the_installer_never_renames_a_node_and_pins_before_any_configuration() {
    // Kept whole: its directory goes with it.
    let host = Host::new("install-renamed", "missing-plugin");
    let Host {
        installer,
        bin,
        netd,
        pinned,
        conflist,
        ..
    } = &host;
    let args = |name: &'static str| {
        let owned: Vec<String> = [
            "--into",
            bin.to_str().unwrap(),
            "--conflist",
            conflist.to_str().unwrap(),
            "--conf-dir",
            netd.to_str().unwrap(),
            "--node-name",
            name,
            "--node-name-file",
            pinned.to_str().unwrap(),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        owned
    };
    let run = |name: &'static str| {
        let args = args(name);
        install(
            installer,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };
    // The plugin the configuration names is missing: the name is pinned
    // all the same, before any configuration could run an ADD.
    let out = run("node-7");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(fs::read_to_string(pinned).unwrap(), "node-7\n");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .starts_with(&format!("pinned node name node-7 in {}", pinned.display())),
        "{out:?}"
    );
    // The node runs under node-7 now; a DaemonSet passing another name
    // is refused whole: nothing installed, the name left.
    fs::remove_dir_all(bin).unwrap();
    let out = run("node-8");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        said.contains(&format!(
            "{} pins node name \"node-7\", not \"node-8\"",
            pinned.display()
        )) && said.contains("install with --node-name node-7"),
        "{said}"
    );
    assert_eq!(fs::read_to_string(pinned).unwrap(), "node-7\n");
    assert!(!bin.exists(), "nothing installed");
    // The same name again is no change.
    let out = run("node-7");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("already pinned: node name node-7"),
        "{out:?}"
    );
}

#[test]
fn a_hostile_umask_never_makes_a_directory_others_may_write() {
    let host = Host::new("install-umask", "ipam-delegated");
    let secret = host.work.path().join("secret");
    fs::create_dir_all(&secret).unwrap();
    fs::write(secret.join("ca.crt"), "CA").unwrap();
    let credentials = host.work.path().join("host/etc/cni/ipam-delegated/etcd");
    let out = crate::common::run_under_umask(
        "000",
        host.installer.to_str().unwrap(),
        &[
            "install",
            "--into",
            host.bin.to_str().unwrap(),
            "--secrets",
            secret.to_str().unwrap(),
            "--secrets-into",
            credentials.to_str().unwrap(),
            "--conflist",
            host.conflist.to_str().unwrap(),
            "--conf-dir",
            host.netd.to_str().unwrap(),
            "--node-name",
            "node-7",
            "--node-name-file",
            host.pinned.to_str().unwrap(),
        ],
        &crate::common::Env(Vec::new()),
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let mode = crate::common::mode_of;
    let root = host.work.path().join("host");
    for (path, expected) in [
        (root.clone(), 0o755),
        (host.bin.clone(), 0o755),
        (host.netd.clone(), 0o755),
        (root.join("etc/cni/ipam-delegated"), 0o755),
        (credentials.clone(), 0o700),
        (root.join("var/lib/cni"), 0o755),
        (root.join("var/lib/cni/ipam-da-pool"), 0o700),
    ] {
        assert_eq!(mode(&path), expected, "{}", path.display());
    }
    assert_eq!(mode(&credentials.join("ca.crt")), 0o600);
    assert_eq!(mode(&host.netd.join("pods.conflist")), 0o644);
}

#[test]
#[ignore = "needs root (PID namespaces)"]
fn two_installers_that_are_both_pid_1_never_collide() {
    let host = Host::new("install-pid1", "ipam-delegated");
    // Each in a PID namespace of its own, as in a container: both pid 1.
    for round in 0..10 {
        // A new build each round, so that each installer writes every file.
        let installer = family_in(
            &host.work.path().join("image"),
            round.to_string().as_bytes(),
        );
        let runs: Vec<_> = (0..2)
            .map(|_| {
                Command::new("unshare")
                    .args(["--pid", "--fork"])
                    .arg(&installer)
                    .args(["install", "--into", host.bin.to_str().unwrap()])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for run in runs {
            let out = run.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {out:?}");
        }
    }
    assert_eq!(
        fs::read_dir(&host.bin).unwrap().count(),
        5,
        "no temporary file left"
    );
}

#[test]
fn with_wait_the_installer_stays_until_asked_to_stop_but_not_after_failing() {
    let host = Host::new("install-wait", "ipam-delegated");
    let start = |conflist: &Path| {
        Command::new(&host.installer)
            .args(["install", "--wait", "--into", host.bin.to_str().unwrap()])
            .args(["--conflist", conflist.to_str().unwrap()])
            .args(["--conf-dir", host.netd.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut installer = start(&host.conflist);
    let written = host.netd.join("pods.conflist");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !written.exists() {
        assert!(std::time::Instant::now() < deadline, "not installed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(installer.try_wait().unwrap().is_none(), "it waits, done");
    let sent = Command::new("kill")
        .args(["-TERM", &installer.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(installer.wait().unwrap().success());
    // A failed install does not wait: its container is restarted.
    let broken = host.work.path().join("broken.conflist");
    fs::write(&broken, "{").unwrap();
    let out = start(&broken).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn an_upgrade_never_makes_a_runtime_executing_the_plugin_fail() {
    let work = temp_dir("upgrade");
    let old = family_in(&work.path().join("old"), b"");
    let new = family_in(&work.path().join("new"), b"another build");
    let bin = work.path().join("bin");
    let into = ["--into", bin.to_str().unwrap()];
    assert!(install(&old, &into).status.success());
    // A runtime runs the allocator from the directory over and over.
    let runtime = Runtime::start(bin.join("ipam-da-pool"));
    for round in 0..20 {
        let installer = if round % 2 == 0 { &new } else { &old };
        let out = install(installer, &into);
        assert!(out.status.success(), "{out:?}");
    }
    assert!(runtime.stop() > 20, "the runtime ran meanwhile");
    assert_eq!(
        fs::read(bin.join("ipam-da-pool")).unwrap(),
        fs::read(old.with_file_name("ipam-da-pool")).unwrap()
    );
}

#[test]
#[ignore = "needs strace"]
fn a_loose_secrets_directory_is_closed_before_a_secret_goes_in() {
    let Host {
        work,
        installer,
        bin,
        ..
    } = Host::new("secrets-order", "bridge");
    let secret = work.path().join("secret");
    fs::create_dir_all(&secret).unwrap();
    fs::write(secret.join("password"), "hunter2").unwrap();
    let credentials = work.path().join("host/etc/cni/ipam-delegated/etcd");
    fs::create_dir_all(&credentials).unwrap();
    fs::set_permissions(&credentials, fs::Permissions::from_mode(0o755)).unwrap();
    let log = work.path().join("strace.log");
    let out = Command::new("/usr/bin/strace")
        .args(["-qq", "-f", "-e", "trace=chmod,fchmodat,openat", "-o"])
        .arg(&log)
        .arg(&installer)
        .arg("install")
        .args(["--into", bin.to_str().unwrap(), "--secrets"])
        .arg(&secret)
        .arg("--secrets-into")
        .arg(&credentials)
        .output()
        .expect("strace runs (./.ci/test installs it)");
    assert!(out.status.success(), "{out:?}");
    let calls = fs::read_to_string(&log).unwrap();
    let dir = credentials.display().to_string();
    let closed = calls
        .lines()
        .position(|l| l.contains(&format!("\"{dir}\", 0700")))
        .unwrap_or_else(|| panic!("no chmod of {dir} to 0700:\n{calls}"));
    let written = calls
        .lines()
        .position(|l| l.contains(&format!("\"{dir}/.password.install-")) && l.contains("O_CREAT"))
        .unwrap_or_else(|| panic!("no secret written into {dir}:\n{calls}"));
    assert!(
        closed < written,
        "closed after the secret went in:\n{calls}"
    );
    assert_eq!(
        fs::metadata(&credentials).unwrap().permissions().mode() & 0o777,
        0o700
    );
}
