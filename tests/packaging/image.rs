//! The image (deploy/image/Containerfile), built offline with podman from
//! the static binaries and run as the DaemonSet's installer runs it:
//! the host's directories mounted, it installs the family and the
//! network's configuration, and a second run changes nothing.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use crate::common::{temp_dir, Cgroups};
use crate::install::Runtime;
use crate::static_build;

/// podman with storage and settings of the test's own under `dir`: its
/// images and containers go with the test, not into the machine's.
pub(crate) struct Podman {
    conf: std::path::PathBuf,
    storage: std::path::PathBuf,
}

impl Podman {
    pub(crate) fn new(dir: &Path) -> Podman {
        for sub in ["run", "storage", "tmp"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let storage = dir.join("storage.conf");
        fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
                dir.join("run").display(),
                dir.join("storage").display()
            ),
        )
        .unwrap();
        // The machine's limits (open files, processes) may be below
        // podman's defaults.
        let conf = dir.join("containers.conf");
        fs::write(
            &conf,
            format!(
                "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n",
                dir.join("tmp").display()
            ),
        )
        .unwrap();
        Podman { conf, storage }
    }

    /// Runs podman with `args`: its output, having checked that it
    /// succeeded.
    pub(crate) fn run(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(out.status.success(), "podman {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs podman with `args`, however it ends.
    pub(crate) fn output(&self, args: &[&str]) -> std::process::Output {
        Command::new("podman")
            .args(args)
            .env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage)
            .output()
            .expect("podman runs")
    }
}

/// The image built from the static build, in podman's storage of the
/// test's own under `work`, `extra` bytes after the end of its
/// ipam-da-pool (another build of it, as an upgrade brings): podman, and
/// the image's tag, named `name`.
pub(crate) fn build_image(work: &Path, name: &str, extra: &[u8]) -> (Podman, String) {
    let built = static_build::build_static();
    let context = work.join(format!("context-{name}"));
    fs::create_dir(&context).unwrap();
    for binary in [
        "ipam-delegated",
        "ipam-ds-static",
        "ipam-da-pool",
        "ipam-da-neutron",
        "ipam-delegated-docker",
    ] {
        fs::copy(built.join(binary), context.join(binary)).unwrap();
    }
    let mut allocator = fs::OpenOptions::new()
        .append(true)
        .open(context.join("ipam-da-pool"))
        .unwrap();
    std::io::Write::write_all(&mut allocator, extra).unwrap();
    let containerfile = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/image/Containerfile");
    let podman = Podman::new(&work.join("podman"));
    let tag = format!("localhost/ipam-delegated-{name}:{}", std::process::id());
    podman.run(&[
        "build",
        "--quiet",
        "-f",
        containerfile,
        "-t",
        &tag,
        context.to_str().unwrap(),
    ]);
    (podman, tag)
}

fn inode(path: &Path) -> u64 {
    fs::metadata(path).unwrap().ino()
}

#[test]
#[ignore = "needs root, podman and a static release build (minutes)"]
fn the_image_installs_the_family_and_the_configuration_into_the_hosts_directories() {
    let work = temp_dir("image");
    let (podman, tag) = build_image(work.path(), "test", b"");
    let built = static_build::build_static();
    // Its containers' cgroups go under a parent of the test's own.
    let cgroups = Cgroups(format!("ipamd-image-{}", std::process::id()));
    let cgroup_parent = format!("/{}", cgroups.0);
    // The host, as a DaemonSet mounts it, and the configuration a
    // ConfigMap gives; bridge is Debian's, there already.
    let host = work.path().join("host");
    let (bin, netd, state) = (
        host.join("opt/cni/bin"),
        host.join("etc/cni/net.d"),
        host.join("var/lib/cni"),
    );
    for dir in [&bin, &netd, &state] {
        fs::create_dir_all(dir).unwrap();
    }
    fs::write(bin.join("bridge"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(bin.join("bridge"), fs::Permissions::from_mode(0o755)).unwrap();
    let config = work.path().join("config");
    fs::create_dir(&config).unwrap();
    fs::write(
        config.join("pods.conflist"),
        r#"{"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "bridge",
            "ipam": {"type": "ipam-delegated", "delegates": ["ipam-ds-static", "ipam-da-pool"]}}]}"#,
    )
    .unwrap();
    let volume = |from: &Path, to: &str| format!("{}:{to}", from.display());
    let run = |image: &str| {
        podman.run(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--cgroup-parent",
            &cgroup_parent,
            "-v",
            &volume(&bin, "/host/opt/cni/bin"),
            "-v",
            &volume(&netd, "/host/etc/cni/net.d"),
            "-v",
            &volume(&state, "/host/var/lib/cni"),
            "-v",
            &volume(&config, "/config:ro"),
            image,
            "--into",
            "/host/opt/cni/bin",
            "--conflist",
            "/config/pods.conflist",
            "--conf-dir",
            "/host/etc/cni/net.d",
            "--node-name",
            "node-9",
            "--node-name-file",
            "/host/var/lib/cni/ipam-da-pool/node-name",
        ])
    };
    let said = run(&tag);
    assert!(
        said.contains("installed /host/opt/cni/bin/ipam-da-pool"),
        "{said}"
    );
    for binary in [
        "ipam-delegated",
        "ipam-ds-static",
        "ipam-da-pool",
        "ipam-da-neutron",
        "ipam-delegated-docker",
    ] {
        assert_eq!(
            fs::read(bin.join(binary)).unwrap(),
            fs::read(built.join(binary)).unwrap()
        );
    }
    assert_eq!(
        fs::read(netd.join("pods.conflist")).unwrap(),
        fs::read(config.join("pods.conflist")).unwrap()
    );
    assert_eq!(
        fs::read_to_string(state.join("ipam-da-pool/node-name")).unwrap(),
        "node-9\n"
    );
    // A second run (the pod restarted): nothing changes.
    let before = (
        inode(&bin.join("ipam-da-pool")),
        inode(&netd.join("pods.conflist")),
    );
    let said = run(&tag);
    assert!(
        said.contains("unchanged /host/opt/cni/bin/ipam-da-pool"),
        "{said}"
    );
    assert_eq!(
        (
            inode(&bin.join("ipam-da-pool")),
            inode(&netd.join("pods.conflist"))
        ),
        before
    );
    // An upgrade (another build of the allocator), and back, while a
    // runtime runs the allocator from the host's directory over and over:
    // no run fails.
    let (_, upgrade) = build_image(work.path(), "upgrade", b"another build");
    let runtime = Runtime::start(bin.join("ipam-da-pool"));
    for round in 0..6 {
        let said = run(if round % 2 == 0 { &upgrade } else { &tag });
        assert!(
            said.contains("installed /host/opt/cni/bin/ipam-da-pool"),
            "{said}"
        );
    }
    assert!(runtime.stop() > 6, "the runtime ran meanwhile");
    assert_eq!(
        fs::read(bin.join("ipam-da-pool")).unwrap(),
        fs::read(built.join("ipam-da-pool")).unwrap()
    );
    podman.run(&["rmi", "--force", &tag, &upgrade]);
}
