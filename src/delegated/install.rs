//! `ipam-delegated install`: puts the family's binaries into a CNI_PATH
//! directory and, once every plugin it names is there, a network's
//! configuration into a net.d directory, each file whole in one step (a
//! runtime that reads the directory meanwhile finds the old file or the
//! new one, never a part of one), leaving a file that is already as it
//! should be alone; and, before all that, pins the node's name
//! (`node_name`, which the allocator reads). What an image's installer
//! (a container of the DaemonSet, beside the keeper) runs on every node.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use crate::args::{Opt, Options, Verb};
use crate::dir::{make_all, SHARED_DIR};
use crate::node_name;
use crate::{signals, sys};

/// The family's binaries, as installed side by side.
pub const FAMILY: [&str; 5] = [
    "ipam-delegated",
    "ipam-ds-static",
    "ipam-da-pool",
    "ipam-da-neutron",
    "ipam-delegated-docker",
];

/// `install`.
pub const VERB: Verb = Verb {
    name: "install",
    synopsis: "--into DIR [--secrets DIR --secrets-into DIR] [--conflist FILE --conf-dir DIR] [--node-name NAME [--node-name-file FILE]] [--wait]",
    options: &[
        Opt::value("--into"),
        Opt::value("--secrets"),
        Opt::value("--secrets-into"),
        Opt::value("--conflist"),
        Opt::value("--conf-dir"),
        Opt::value("--node-name"),
        Opt::value("--node-name-file"),
        Opt::flag("--wait"),
    ],
    operands: false,
    help: "\
Copy each binary of the family found beside this one into DIR
(a CNI_PATH directory, such as /opt/cni/bin): a new file written
and synced in DIR, then renamed over the old one, so that a
runtime never runs half a binary; one already the same is left
alone. With --secrets, copy the files of that directory (a
Secret's volume: etcd's certificates, a password file) into
--secrets-into the same way, readable by root only, for the
plugins the runtime runs on the host. Then, with --conflist,
write FILE into --conf-dir (such as /etc/cni/net.d) the same
way, but only once every plugin it names is in DIR. With
--node-name, first pin the allocator's node name (in
/var/lib/cni/ipam-da-pool/node-name, or FILE): on Kubernetes,
the node's spec.nodeName. A name pinned already is never
changed: another one is refused, and nothing is installed.
With --wait, once all is in place, wait for SIGTERM or SIGINT
and exit 0: a DaemonSet's container, beside the node's keeper,
which must not wait for the install to succeed.
",
    run: |given| {
        let options = options(given)?;
        let installed = finish(run(&options));
        if options.wait && installed == ExitCode::SUCCESS {
            wait_for_stop();
        }
        Ok(installed)
    },
};

/// Waits for a termination request: what a container that has done its
/// work does until its pod stops.
fn wait_for_stop() {
    if let Err(e) = signals::watch() {
        // SIGTERM then ends the process at once, which is as good.
        let _ = writeln!(io::stderr(), "ipam-delegated install: {e}");
    }
    while signals::received(1).is_none() {
        signals::wait(std::time::Duration::from_secs(3_600));
    }
}

/// `install`'s options.
#[derive(Debug, PartialEq)]
struct Install {
    into: PathBuf,
    secrets: Option<(PathBuf, PathBuf)>,
    conflist: Option<(PathBuf, PathBuf)>,
    node_name: Option<(String, PathBuf)>,
    wait: bool,
}

fn options(given: &Options) -> Result<Install, String> {
    let into = given.path("--into").ok_or("install needs --into")?;
    let secrets = match (given.path("--secrets"), given.path("--secrets-into")) {
        (Some(from), Some(to)) => Some((from, to)),
        (None, None) => None,
        _ => return Err("--secrets and --secrets-into go together".into()),
    };
    let conflist = match (given.path("--conflist"), given.path("--conf-dir")) {
        (Some(file), Some(dir)) => Some((file, dir)),
        (None, None) => None,
        _ => return Err("--conflist and --conf-dir go together".into()),
    };
    let node_name = node_name::given(given)?;
    Ok(Install {
        into,
        secrets,
        conflist,
        node_name,
        wait: given.flag("--wait"),
    })
}

/// Exit 0 when all is in place, 1 (said on stderr) when it is not.
fn finish(outcome: Result<(), String>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            let _ = writeln!(io::stderr(), "ipam-delegated install: {problem}");
            ExitCode::FAILURE
        }
    }
}

/// Installs, saying what it did on stdout.
fn run(options: &Install) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let from = exe.parent().ok_or("this binary has no directory")?;
    let mut out = io::stdout().lock();
    // First: no ADD may run under the host's name before it is pinned,
    // and a name pinned already is never changed.
    if let Some((name, file)) = &options.node_name {
        let pinned = node_name::pin(file, name).map_err(|e| e.to_string())?;
        let said = if pinned { "pinned" } else { "already pinned:" };
        let _ = writeln!(out, "{said} node name {name} in {}", file.display());
    }
    for name in FAMILY {
        let source = from.join(name);
        if !source.exists() {
            // The Docker driver is left out where Docker is not used.
            let _ = writeln!(out, "not beside this binary, left out: {name}");
            continue;
        }
        let bytes = fs::read(&source).map_err(|e| format!("{}: {e}", source.display()))?;
        let said = place(&options.into, SHARED_DIR, name, &bytes, 0o755)?;
        let _ = writeln!(out, "{said} {}", options.into.join(name).display());
    }
    if let Some((from, to)) = &options.secrets {
        // One there already is closed before a secret goes in; one made
        // here is made 0700.
        if to.is_dir() {
            fs::set_permissions(to, fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{}: {e}", to.display()))?;
        }
        for (name, bytes) in secret_files(from)? {
            let said = place(to, 0o700, &name, &bytes, 0o600)?;
            let _ = writeln!(out, "{said} {}", to.join(&name).display());
        }
    }
    if let Some((file, dir)) = &options.conflist {
        let text = fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let config: Value = serde_json::from_slice(&text)
            .map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
        let missing: Vec<String> = named_plugins(&config)
            .into_iter()
            .filter(|name| !is_executable(&options.into.join(name)))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{} names {}, not in {}: the configuration is not written until every plugin it names is there",
                file.display(),
                missing.join(", "),
                options.into.display()
            ));
        }
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: no file name", file.display()))?;
        let said = place(dir, SHARED_DIR, name, &text, 0o644)?;
        let _ = writeln!(out, "{said} {}", dir.join(name).display());
    }
    Ok(())
}

/// Puts `bytes` in `dir/name` with `mode`, owned by this user, whole in
/// one step, making `dir` with `dir_mode` (and the directories above it
/// 0755) if it is missing, whatever the umask: what it did. A file left
/// alone must be the same in content, mode and owner (a password file
/// others may read, the plugin refuses).
fn place(
    dir: &Path,
    dir_mode: u32,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<&'static str, String> {
    let target = dir.join(name);
    let fail = |e: io::Error| format!("{}: {e}", target.display());
    let as_wanted = fs::symlink_metadata(&target).is_ok_and(|meta| {
        meta.is_file() && meta.permissions().mode() & 0o7777 == mode && meta.uid() == sys::euid()
    });
    if as_wanted && fs::read(&target).is_ok_and(|there| there == bytes) {
        return Ok("unchanged");
    }
    make_all(dir, dir_mode).map_err(fail)?;
    // In DIR, so that the rename is within one filesystem; random, as
    // installers in containers are all pid 1.
    let temporary = dir.join(format!(
        ".{name}.install-{}",
        sys::random_hex().map_err(fail)?
    ));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.set_permissions(fs::Permissions::from_mode(mode))?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(&temporary, &target))
        .and_then(|()| fs::File::open(dir)?.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&temporary);
        return Err(fail(e));
    }
    Ok("installed")
}

/// The files of a Secret's volume in `dir`, by name: its dot-entries are
/// the volume's own (`..data` and the like), its files links into them.
fn secret_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let fail = |e: io::Error| format!("{}: {e}", dir.display());
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') || !fs::metadata(&path).map_err(fail)?.is_file() {
            continue;
        }
        files.push((name, fs::read(&path).map_err(fail)?));
    }
    files.sort();
    Ok(files)
}

/// The plugins a configuration names: each plugin's type, its IPAM
/// type, and ipam-delegated's delegates.
fn named_plugins(config: &Value) -> Vec<String> {
    let plugins: Vec<&Value> = match config.get("plugins").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![config],
    };
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: Option<&str>| {
        if let Some(name) = name.filter(|n| !names.iter().any(|m| m == n)) {
            names.push(name.to_owned());
        }
    };
    for plugin in plugins {
        add(plugin.get("type").and_then(Value::as_str));
        let ipam = plugin.get("ipam");
        add(ipam.and_then(|i| i.get("type")).and_then(Value::as_str));
        let delegates = ipam
            .and_then(|i| i.get("delegates"))
            .and_then(Value::as_array);
        for delegate in delegates.into_iter().flatten() {
            add(delegate.as_str());
        }
    }
    names
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_configuration_names_its_plugins_ipam_and_delegates() {
        let config = json!({"plugins": [
            {"type": "bridge", "ipam": {"type": "ipam-delegated", "delegates": ["ipam-ds-static", "ipam-da-pool"]}},
            {"type": "portmap"},
            {"type": "bridge", "ipam": {"type": "host-local"}},
        ]});
        assert_eq!(
            named_plugins(&config),
            [
                "bridge",
                "ipam-delegated",
                "ipam-ds-static",
                "ipam-da-pool",
                "portmap",
                "host-local"
            ]
        );
        assert_eq!(named_plugins(&json!({"type": "macvlan"})), ["macvlan"]);
    }

    #[test]
    fn a_file_the_same_but_for_its_mode_is_placed_again() {
        let dir = tempfile::tempdir().unwrap();
        // A password file left readable by others by an earlier install.
        fs::write(dir.path().join("password"), b"secret").unwrap();
        fs::set_permissions(
            dir.path().join("password"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(
            place(dir.path(), 0o700, "password", b"secret", 0o600).unwrap(),
            "installed"
        );
        let mode = fs::metadata(dir.path().join("password"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            place(dir.path(), 0o700, "password", b"secret", 0o600).unwrap(),
            "unchanged"
        );
    }

    #[test]
    fn a_file_is_placed_whole_and_left_alone_when_the_same() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            place(dir.path(), SHARED_DIR, "a", b"one", 0o755).unwrap(),
            "installed"
        );
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let first = inode(&dir.path().join("a"));
        assert_eq!(
            place(dir.path(), SHARED_DIR, "a", b"one", 0o755).unwrap(),
            "unchanged"
        );
        assert_eq!(inode(&dir.path().join("a")), first);
        assert_eq!(
            place(dir.path(), SHARED_DIR, "a", b"two", 0o755).unwrap(),
            "installed"
        );
        assert_ne!(inode(&dir.path().join("a")), first);
        let mode = fs::metadata(dir.path().join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn a_secrets_volume_gives_its_files_not_its_own_entries() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("..2026_11_25");
        fs::create_dir(&data).unwrap();
        fs::write(data.join("ca.crt"), "CA").unwrap();
        std::os::unix::fs::symlink("..2026_11_25", dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/ca.crt", dir.path().join("ca.crt")).unwrap();
        assert_eq!(
            secret_files(dir.path()).unwrap(),
            [("ca.crt".to_owned(), b"CA".to_vec())]
        );
    }

    #[test]
    fn options_go_in_pairs() {
        let parse = |words: &[&str]| VERB.parse_words(words).and_then(|o| options(&o));
        assert!(parse(&["--into", "/opt/cni/bin"]).is_ok());
        assert!(parse(&["--into", "/b", "--conflist", "f"]).is_err());
        assert!(parse(&["--into", "/b", "--node-name-file", "/f"]).is_err());
        assert!(parse(&["--into", "/b", "--secrets", "/s"]).is_err());
        assert!(parse(&["--conflist", "f", "--conf-dir", "d"]).is_err());
        let pinned = parse(&["--into", "/b", "--node-name", "n1"]).unwrap();
        assert_eq!(
            pinned.node_name,
            Some((
                "n1".into(),
                PathBuf::from(node_name::DEFAULT_NODE_NAME_FILE)
            ))
        );
    }
}
