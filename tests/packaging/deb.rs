//! The Debian package .ci/release builds: lintian finds nothing wrong
//! with it, apt installs it, the demo's flow runs on the binaries it put
//! in /usr/lib/cni, and `apt-get purge` leaves none of its files behind.

use std::path::Path;
use std::process::Command;

use crate::common::temp_dir;

/// Runs `program` with `args`: its output, having checked that it
/// succeeded.
fn ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs root, apt, lintian, etcd-server and a static release build (minutes)"]
fn the_package_installs_runs_the_demo_and_purges_without_a_trace() {
    if cfg!(feature = "verbose") {
        // The package does not depend on the flavour the tests run in.
        return;
    }
    let out = temp_dir("deb");
    let release = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/release");
    ok(release, &[out.path().to_str().unwrap()]);
    let deb = out.path().join(format!(
        "ipam-delegated_{}_amd64.deb",
        env!("CARGO_PKG_VERSION")
    ));
    let deb = deb.to_str().unwrap();
    // No error and no warning.
    ok(
        "lintian",
        &["--allow-root", "--fail-on", "error,warning", deb],
    );
    ok(
        "apt-get",
        &["install", "-y", "-qq", "--no-install-recommends", deb],
    );
    let files: Vec<String> = ok("dpkg", &["-L", "ipam-delegated"])
        .lines()
        .filter(|path| Path::new(path).is_file())
        .map(String::from)
        .collect();
    for expected in [
        "/usr/lib/cni/ipam-delegated",
        "/usr/lib/cni/ipam-ds-static",
        "/usr/lib/cni/ipam-da-pool",
        "/usr/lib/cni/ipam-da-neutron",
        "/usr/lib/cni/ipam-delegated-docker",
        "/lib/systemd/system/ipam-da-pool-keeper.service",
        "/lib/systemd/system/ipam-da-neutron-keeper@.service",
        "/lib/systemd/system/ipam-delegated-docker.service",
        "/usr/share/man/man1/ipam-da-pool.1.gz",
        "/usr/share/man/man1/ipam-da-neutron.1.gz",
        "/usr/share/doc/ipam-delegated/copyright",
    ] {
        assert!(
            files.iter().any(|f| f == expected),
            "{expected} not in {files:?}"
        );
    }
    // The units' commands are the installed binaries.
    let unit = std::fs::read_to_string("/lib/systemd/system/ipam-da-pool-keeper.service").unwrap();
    assert!(
        unit.contains("ExecStart=/usr/lib/cni/ipam-da-pool node-keeper"),
        "{unit}"
    );
    let unit =
        std::fs::read_to_string("/lib/systemd/system/ipam-da-neutron-keeper@.service").unwrap();
    assert!(
        unit.contains(
            "ExecStart=/usr/lib/cni/ipam-da-neutron keeper --config /etc/cni/net.d --network %i"
        ),
        "{unit}"
    );
    // The demo's flow on the installed binaries.
    let demo = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/demo.sh"))
        .env("DEMO_BIN", "/usr/lib/cni")
        .output()
        .unwrap();
    let purge = || ok("apt-get", &["purge", "-y", "-qq", "ipam-delegated"]);
    if !demo.status.success() {
        purge();
        panic!("the demo failed: {demo:?}");
    }
    purge();
    let left: Vec<&String> = files.iter().filter(|f| Path::new(f).exists()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
