//! The operator's doctor: checks a configuration and its delegates without
//! allocating anything (each delegate answers VERSION; those of this family
//! check their own settings with their `validate` command) and names every
//! problem with what to do about it.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::agent;
use super::config::{self, Config};
use super::delegate::{self, Delegate, Limits, Processes};
use super::error::{DelegatedError, Failure};
use crate::cni;
use crate::sys;

/// How long a delegate may take to answer VERSION when the configuration
/// sets no `ipam.timeout`.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A finished check: the report to print, and whether all is well.
pub struct Report {
    /// What the doctor found, as a table and a list of problems.
    pub text: String,
    /// No problem at all.
    pub healthy: bool,
}

/// The delegates of this family, which check their own settings when run
/// with `validate` and the configuration on stdin.
const FAMILY: [&str; 3] = ["ipam-ds-static", "ipam-da-pool", "ipam-da-neutron"];

/// What the settings of each delegate of the family live under, for the fix.
fn settings_of(name: &str) -> &'static str {
    match name {
        "ipam-ds-static" => "ipam.static",
        "ipam-da-neutron" => "ipam.neutron",
        _ => "ipam.pool",
    }
}

/// Checks the network at `path` (a conflist, one plugin's configuration,
/// or a directory of them, of which `network` picks one) with the
/// delegates in `cni_path`.
pub fn examine(path: &Path, network: Option<&str>, cni_path: &str) -> Report {
    let mut text = format!("ipam-delegated doctor: {}\n", path.display());
    let mut problems: Vec<String> = Vec::new();
    let stdin = match config::load(path, network) {
        Ok(stdin) => stdin,
        Err(e) => return finish(text, vec![format!("{e}: give a conflist with one plugin whose ipam.type is ipam-delegated, that plugin's configuration, or a directory of them (with --network to pick one)")]),
    };
    let config = match Config::parse(&stdin) {
        Ok(config) => config,
        Err(e) => {
            return finish(
                text,
                vec![format!(
                "{e}: fix the configuration (the README's Configuration section lists the keys)"
            )],
            )
        }
    };
    let dirs = cni::search_path(cni_path);
    let _ = writeln!(
        text,
        "network {:?}, cniVersion {}, CNI_PATH {cni_path}",
        config.net.name, config.net.cni_version
    );
    let _ = writeln!(
        text,
        "{:<20} {:<40} {:<32} verdict",
        "delegate", "path", "versions"
    );

    let timeout = config.timeout.unwrap_or(VERSION_TIMEOUT);
    for (name, found) in config
        .delegates
        .iter()
        .zip(delegate::resolve_each(&config.delegates, &dirs))
    {
        let (path, versions, verdict) = match found {
            Ok(delegate) => check_delegate(&delegate, &config, timeout),
            Err(e @ DelegatedError::SelfReference { .. }) => (
                "(this plugin)".into(),
                String::new(),
                Err(format!("{e}; remove it from ipam.delegates")),
            ),
            Err(_) => (
                "(not found)".into(),
                String::new(),
                Err(not_found(name, &dirs)),
            ),
        };
        let shown = match &verdict {
            Ok(()) => "ok",
            Err(_) => "PROBLEM",
        };
        let _ = writeln!(text, "{name:<20} {path:<40} {versions:<32} {shown}");
        if let Err(problem) = verdict {
            problems.push(problem);
        }
    }

    let _ = match config.timeout {
        Some(t) => writeln!(text, "ipam.timeout: {t:?} per delegate call"),
        None => writeln!(
            text,
            "ipam.timeout: not set; a delegate that hangs holds the runtime as long as it does"
        ),
    };
    let root = agent::state_root(&config);
    if let Some(problem) = state_dir_problem(&root) {
        problems.push(problem);
    }
    let _ = writeln!(text, "ipam.stateDir: {} (agent mode)", root.display());
    finish(text, problems)
}

/// One found delegate: its path, the versions it supports, and whether it
/// will do for this configuration.
fn check_delegate(
    delegate: &Delegate,
    config: &Config,
    timeout: Duration,
) -> (String, String, Result<(), String>) {
    let path = delegate.path.display().to_string();
    let name = &delegate.name;
    if delegate::is_copy_of_this_plugin(&delegate.path) {
        let copy = DelegatedError::SelfReference {
            name: name.clone(),
            how: format!("{path} is a copy of it"),
        };
        return (
            path,
            String::new(),
            Err(format!("{copy}; remove it from ipam.delegates")),
        );
    }
    match delegate::supported_versions(delegate, config.net.cni_version, timeout) {
        Ok(versions) => {
            let shown = versions.join(",");
            let verdict = if versions.iter().any(|v| v == config.net.cni_version) {
                Ok(())
            } else {
                Err(format!(
                    "{name} does not support cniVersion {} (it supports {shown}): use a version it supports, or a newer build of {name}",
                    config.net.cni_version
                ))
            };
            let verdict = verdict.and_then(|()| match FAMILY.contains(&name.as_str()) {
                true => validate(delegate, config.net.raw, timeout),
                false => Ok(()),
            });
            (path, shown, verdict)
        }
        Err(e) => (
            path,
            String::new(),
            Err(format!(
                "{name} did not answer VERSION ({e}): check that it is a CNI plugin"
            )),
        ),
    }
}

/// Has a delegate of this family check its own settings in `stdin`, as
/// its next ADD would, by running its `validate` command, which allocates,
/// writes and pins nothing: the meta-plugin reads no other plugin's
/// settings itself.
fn validate(delegate: &Delegate, stdin: &[u8], timeout: Duration) -> Result<(), String> {
    let name = &delegate.name;
    let limits = Limits {
        timeout: Some(timeout),
        stopped_by: 1,
    };
    match Processes::default().run_verb(delegate, "validate", stdin, limits) {
        Ok(_) => Ok(()),
        Err(Failure::Reported { code, msg, .. }) if code == cni::code::INVALID_CONFIG => {
            Err(format!(
                "{name} refuses its settings (code {code}): {msg}: correct {} and run the doctor again",
                settings_of(name)
            ))
        }
        // Not the settings: what it could not read, say.
        Err(Failure::Reported { code, msg, .. }) => Err(format!(
            "{name} could not check its settings (code {code}): {msg}"
        )),
        // Usage errors exit 2, printing nothing on stdout: a build from
        // before `validate`, which the rest of the family's does not match.
        Err(Failure::Exited { status: 2, .. }) => Err(format!(
            "{name} has no validate command: it is older than ipam-delegated; install the same release of the whole family"
        )),
        Err(failure) => Err(format!("{name} (validate) {failure}")),
    }
}

/// Why a delegate was not found, and what to do: a file of its name that
/// is not executable is the usual slip.
fn not_found(name: &str, dirs: &[PathBuf]) -> String {
    for dir in dirs {
        let candidate = dir.join(name);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 == 0 {
                return format!("{} is not executable: chmod +x it", candidate.display());
            }
        }
    }
    format!(
        "{name} is in none of {}: install it there, or add its directory to CNI_PATH",
        delegate::list_dirs(dirs)
    )
}

/// What stops agent mode from keeping state in `root`: it, or the nearest
/// directory above it that exists, is not a directory it can write to.
fn state_dir_problem(root: &Path) -> Option<String> {
    let existing = root.ancestors().find(|d| d.exists())?;
    let writable = existing.is_dir() && sys::can_write(existing);
    (!writable).then(|| {
        format!(
            "ipam.stateDir {} cannot be made or written ({} is not a writable directory): fix its permissions or set ipam.stateDir elsewhere",
            root.display(),
            existing.display()
        )
    })
}

fn finish(mut text: String, problems: Vec<String>) -> Report {
    if problems.is_empty() {
        text.push_str("all good\n");
    } else {
        let _ = writeln!(text, "{} problem(s):", problems.len());
        for problem in &problems {
            let _ = writeln!(text, "- {problem}");
        }
    }
    Report {
        text,
        healthy: problems.is_empty(),
    }
}
