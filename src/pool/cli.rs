//! ipam-da-pool's command line, for when it is not run as a CNI plugin (no
//! CNI_COMMAND): `import`, the upgrade from the local store to etcd;
//! `--help` and `--version`; or, with no arguments, the about text.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::settings::{Settings, StoreSettings};
use super::{etcd, import, local};
use crate::cni::{self, NetConf};
use crate::error::Error;
use crate::{config, skel};

const USAGE: &str = "usage:
  ipam-da-pool import --config FILE --from DATADIR [--dry-run]
  ipam-da-pool --help | --version
";

const HELP: &str = "ipam-da-pool: a CNI IPAM plugin that allocates addresses from pools.

As a plugin, a runtime (or ipam-delegated) runs it with CNI_COMMAND set; it
reads its settings from ipam.pool, and then reads no arguments.

Commands:
  import --config FILE --from DATADIR [--dry-run]
          Copy this node's reservations of FILE's network from the local
          store under DATADIR into the etcd cluster FILE names, each held
          by the same container, interface and node. One already there is
          left alone; one whose address another holds in etcd is named as
          a conflict (exit status 1). From then on the local store refuses
          new addresses (code 11, try again later) until the node runs
          FILE. With --dry-run, nothing is written.
FILE is a conflist (its plugin that runs ipam-da-pool, directly or as a
delegate of ipam-delegated, is used) or one plugin's configuration.

  --help     this text
  --version  the version and the CNI spec versions it speaks
";

/// Runs the command line `args` (without the program name).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<String> = match args.into_iter().map(OsString::into_string).collect() {
        Ok(args) => args,
        Err(arg) => return usage(&format!("{arg:?} is not UTF-8")),
    };
    match args.first().map(String::as_str) {
        None => skel::about(
            "ipam-da-pool",
            "a CNI IPAM plugin that allocates addresses from pools, on local files or etcd",
        ),
        Some("import") => match parse_import(&args[1..]) {
            Ok(options) => finish(run_import(&options)),
            Err(problem) => usage(&problem),
        },
        Some("--help" | "-h" | "help") if args.len() == 1 => print(HELP),
        Some("--version" | "-V") if args.len() == 1 => print(&format!(
            "ipam-da-pool {}\nCNI spec versions: {}\n",
            env!("CARGO_PKG_VERSION"),
            cni::SUPPORTED.join(", ")
        )),
        Some(other) => usage(&format!("unknown command {other:?}")),
    }
}

/// `import`'s options.
#[derive(Debug, PartialEq)]
struct Import {
    config: PathBuf,
    from: PathBuf,
    dry_run: bool,
}

fn parse_import(options: &[String]) -> Result<Import, String> {
    let mut import = Import {
        config: PathBuf::new(),
        from: PathBuf::new(),
        dry_run: false,
    };
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let (name, inline) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (option.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| options.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name {
            "--config" => import.config = value()?.into(),
            "--from" => import.from = value()?.into(),
            "--dry-run" if inline.is_none() => import.dry_run = true,
            _ => return Err(format!("unknown option {option:?}")),
        }
    }
    if import.config.as_os_str().is_empty() || import.from.as_os_str().is_empty() {
        return Err("import needs --config and --from".into());
    }
    Ok(import)
}

/// Imports, printing what it did: whether every attachment is in etcd now.
fn run_import(options: &Import) -> Result<bool, Error> {
    let raw = config::load_plugin(&options.config, "that runs ipam-da-pool", |ipam| {
        ipam["type"] == "ipam-da-pool"
            || ipam["delegates"]
                .as_array()
                .is_some_and(|d| d.iter().any(|name| name == "ipam-da-pool"))
    })?;
    let net = NetConf::parse(&raw)?;
    let settings = Settings::from_net(&net)?;
    let StoreSettings::Etcd(cluster) = &settings.store else {
        return Err(cni::Error::InvalidConfig(format!(
            "{} keeps pools in local files: import copies into etcd, so its \"ipam.pool\" must name an etcd cluster",
            options.config.display()
        ))
        .into());
    };
    let network = options.from.join(&net.name);
    if !network.is_dir() {
        return Err(Error::Files {
            path: network,
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no local store of this network here",
            ),
        });
    }
    let from = local::Local::open(&options.from, &net.name)?;
    let to = etcd::Etcd::new(crate::etcd::Client::new(cluster.clone())?, &net.name);
    if !options.dry_run {
        // From now on (the lock held) the local store refuses new claims:
        // an ADD made locally after the import would be missing from etcd.
        from.mark_moved()?;
    }
    let report = import::import(&from, &to, options.dry_run)?;
    let mut out = std::io::stdout().lock();
    for line in &report.lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{} attachment(s) of network {} under {}; {} conflict(s)",
        report.lines.len(),
        net.name,
        options.from.display(),
        report.conflicts
    );
    Ok(report.conflicts == 0)
}

/// Exit 0 when all went well, 1 when something is left to settle or an
/// error (said on stderr, with its CNI code) stopped the command.
fn finish(outcome: Result<bool, Error>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "ipam-da-pool: {e} (code {})", e.code());
            ExitCode::FAILURE
        }
    }
}

fn print(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// A usage error: what is wrong and the usage on stderr, exit status 2.
fn usage(problem: &str) -> ExitCode {
    let _ = write!(std::io::stderr(), "ipam-da-pool: {problem}\n{USAGE}");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn import_takes_its_options_in_either_form_and_needs_both_paths() {
        assert_eq!(
            parse_import(&args(&[
                "--config=/etc/cni/net.d/pods.conflist",
                "--from",
                "/var/lib/x",
                "--dry-run"
            ])),
            Ok(Import {
                config: "/etc/cni/net.d/pods.conflist".into(),
                from: "/var/lib/x".into(),
                dry_run: true,
            })
        );
        for (bad, said) in [
            (&["--config", "f"][..], "needs --config and --from"),
            (&["--from"][..], "--from needs a value"),
            (
                &["--config", "f", "--from", "d", "--force"][..],
                "unknown option \"--force\"",
            ),
            (&["--dry-run=yes"][..], "unknown option"),
        ] {
            let e = parse_import(&args(bad)).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }
}
