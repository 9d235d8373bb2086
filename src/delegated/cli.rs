//! The command line, for when the binary is not run as a CNI plugin (no
//! CNI_COMMAND): agent mode's `ensure` and `release`, the `doctor`,
//! `--help` and `--version`; or, with no arguments, the about text.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use super::agent::{self, Request};
use super::{config, doctor};
use crate::skel::{self, respond};
use crate::{cni, signals};

const USAGE: &str = "usage:
  ipam-delegated ensure  --config FILE --id ID [--ifname NAME] [--netns PATH]
  ipam-delegated release --config FILE --id ID [--ifname NAME] [--netns PATH]
  ipam-delegated doctor  --config FILE
  ipam-delegated docker-plugin --config PATH [--name NAME | --socket PATH]
  ipam-delegated --help | --version
";

/// The Docker driver's binary, installed beside this one.
const DOCKER_DRIVER: &str = "ipam-delegated-docker";

const HELP: &str = "ipam-delegated: a CNI IPAM plugin that runs a stack of IPAM delegates.

As a plugin, set it as ipam.type in a network configuration and list the
delegates in ipam.delegates; a container runtime runs it with CNI_COMMAND
set, and then it reads no arguments.

Commands (CNI_PATH names the delegates' directories, /opt/cni/bin if unset):
  ensure  --config FILE --id ID [--ifname NAME] [--netns PATH]
          Make sure the attachment (network of FILE, ID, interface NAME,
          eth0 by default) holds an address, for a node agent; print it.
  release --config FILE --id ID [--ifname NAME] [--netns PATH]
          Give that address back and forget it.
--netns is the CNI_NETNS delegates get, the agent's own namespace by
default (then CNI_NETNS_OVERRIDE=1 is set for them, as plugins built on
libcni 1.2 or later require).
  doctor  --config FILE
          Check FILE and its delegates without allocating anything.
FILE is a conflist (its plugin whose ipam.type is ipam-delegated is used)
or one plugin's configuration.
  docker-plugin --config PATH [--name NAME | --socket PATH]
          Serve Docker as a remote IPAM driver on
          /run/docker/plugins/NAME.sock (NAME ipam-delegated by default)
          or on the socket given, for the networks in PATH (a file, or a
          directory of them, such as /etc/cni/net.d), until SIGTERM.
          Docker networks use it with --ipam-driver NAME
          [--ipam-opt network=CNI-NETWORK].

  --help     this text
  --version  the version, the CNI spec versions it speaks, its flavour
";

/// Runs the command line `args` (without the program name).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    let Some(command) = args.first() else {
        return skel::about(
            "ipam-delegated",
            "a CNI IPAM plugin that runs a stack of IPAM delegates",
        );
    };
    let ensuring = match command.to_str() {
        Some("ensure") => true,
        Some("release") => false,
        Some("doctor") => return doctor(&args[1..]),
        Some("docker-plugin") => return docker_plugin(&args[1..]),
        Some("--help" | "-h" | "help") if args.len() == 1 => return print(HELP),
        Some("--version" | "-V") if args.len() == 1 => return print(&version_text()),
        _ => return usage(&format!("unknown command {:?}", command.to_string_lossy())),
    };
    let request = match parse_agent_options(&args[1..]) {
        Ok(request) => request,
        Err(problem) => return usage(&problem),
    };
    if let Err(e) = signals::watch() {
        tracing::warn!("SIGTERM and SIGINT will end the plugin at once: {e}");
    }
    match config::load_file(&request.config) {
        Ok(stdin) => {
            let outcome = if ensuring {
                agent::ensure(&request, &stdin).map(Some)
            } else {
                agent::release(&request, &stdin).map(|()| None)
            };
            respond(outcome, || cni::version_for_reply(&stdin))
        }
        Err(e) => respond(Err(e), || cni::NEWEST.into()),
    }
}

/// `doctor --config FILE`: the report on stdout; exit 0 only if all is well.
fn doctor(options: &[OsString]) -> ExitCode {
    let file = match options {
        [flag, file] if flag == "--config" => PathBuf::from(file),
        [one] => match one.to_str().and_then(|o| o.strip_prefix("--config=")) {
            Some(file) => PathBuf::from(file),
            None => return usage("doctor takes --config FILE"),
        },
        _ => return usage("doctor takes --config FILE"),
    };
    let cni_path = cni::path_outside_runtime(std::env::var_os("CNI_PATH"));
    let report = doctor::examine(&file, &cni_path);
    let _ = std::io::stdout().write_all(report.text.as_bytes());
    if report.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `docker-plugin`: the Docker driver, a binary of its own beside this
/// one, so that the plugin every pod start runs carries none of it. Only
/// returns if it cannot be started.
fn docker_plugin(options: &[OsString]) -> ExitCode {
    let driver = std::env::current_exe().map(|exe| exe.with_file_name(DOCKER_DRIVER));
    let error = match &driver {
        Ok(driver) => std::process::Command::new(driver).args(options).exec(),
        Err(e) => std::io::Error::new(e.kind(), e.to_string()),
    };
    let place = driver.map_or_else(|_| "beside it".into(), |d| d.display().to_string());
    let _ = writeln!(
        std::io::stderr(),
        "ipam-delegated: docker-plugin runs {place}, which cannot be started: {error} (install {DOCKER_DRIVER} with ipam-delegated)"
    );
    ExitCode::FAILURE
}

fn version_text() -> String {
    let flavour = if cfg!(feature = "verbose") {
        "verbose"
    } else {
        "standard"
    };
    format!(
        "ipam-delegated {} ({flavour} flavour)\nCNI spec versions: {}\n",
        env!("CARGO_PKG_VERSION"),
        cni::SUPPORTED.join(", ")
    )
}

fn print(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// The options of `ensure` and `release`.
fn parse_agent_options(options: &[OsString]) -> Result<Request, String> {
    let mut request = Request {
        config: PathBuf::new(),
        id: String::new(),
        ifname: "eth0".into(),
        // The host's own: the namespace the agent runs in, as delegates see it.
        netns: "/proc/self/ns/net".into(),
        args: None,
    };
    for (flag, value) in flags(options, &["--config", "--id", "--ifname", "--netns"])? {
        match flag {
            "--config" => request.config = PathBuf::from(value),
            "--id" => request.id = value,
            "--ifname" => request.ifname = value,
            _ => request.netns = value,
        }
    }
    if request.config.as_os_str().is_empty() || request.id.is_empty() {
        return Err("--config and --id are required".into());
    }
    if request.netns.is_empty() {
        return Err("--netns needs a path".into());
    }
    Ok(request)
}

/// The options, each `--flag VALUE` or `--flag=VALUE` with a flag of
/// `known`, as (flag, value) pairs in order.
pub(crate) fn flags<'k>(
    options: &[OsString],
    known: &[&'k str],
) -> Result<Vec<(&'k str, String)>, String> {
    let mut pairs = Vec::new();
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let option = option
            .to_str()
            .ok_or_else(|| format!("{option:?} is not UTF-8"))?;
        let (name, inline) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (option, None),
        };
        let flag = *known
            .iter()
            .find(|k| **k == name)
            .ok_or_else(|| format!("unknown option {option:?}"))?;
        let value = match inline {
            Some(value) => value,
            None => options
                .next()
                .and_then(|v| v.to_str().map(String::from))
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
        pairs.push((flag, value));
    }
    Ok(pairs)
}

/// A usage error: what is wrong and the usage on stderr, exit status 2.
fn usage(problem: &str) -> ExitCode {
    let _ = write!(std::io::stderr(), "ipam-delegated: {problem}\n{USAGE}");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn ensure_takes_every_option_in_either_form() {
        let request = parse_agent_options(&args(&[
            "--config",
            "/etc/x.conflist",
            "--id=agent-health",
            "--ifname",
            "net1",
            "--netns=/run/netns/x",
        ]))
        .unwrap();
        assert_eq!(request.config, PathBuf::from("/etc/x.conflist"));
        assert_eq!(
            (
                request.id.as_str(),
                request.ifname.as_str(),
                request.netns.as_str()
            ),
            ("agent-health", "net1", "/run/netns/x")
        );
    }

    #[test]
    fn defaults_are_eth0_and_the_hosts_namespace() {
        let request = parse_agent_options(&args(&["--id", "a", "--config", "f"])).unwrap();
        assert_eq!(
            (request.ifname.as_str(), request.netns.as_str()),
            ("eth0", "/proc/self/ns/net")
        );
    }

    #[test]
    fn bad_command_lines_are_named() {
        for (list, problem) in [
            (&["--id", "a"][..], "--config and --id are required"),
            (&["--config", "f"], "--config and --id are required"),
            (&["--config"], "--config needs a value"),
            (&["--bogus"], "unknown option \"--bogus\""),
        ] {
            assert_eq!(parse_agent_options(&args(list)).unwrap_err(), problem);
        }
    }
}
