//! The command line, for when the binary is not run as a CNI plugin (no
//! CNI_COMMAND): agent mode's `ensure` and `release`, or the about text.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::agent::{self, Request};
use crate::{config, respond, signals, version};

const USAGE: &str = "usage:
  ipam-delegated ensure  --config FILE --id ID [--ifname NAME] [--netns PATH]
  ipam-delegated release --config FILE --id ID [--ifname NAME]
Run by a container runtime (CNI_COMMAND set), it is a CNI IPAM plugin.
";

/// Runs the command line `args` (without the program name).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    let Some(command) = args.first() else {
        let _ = std::io::stderr().write_all(version::about().as_bytes());
        return ExitCode::FAILURE;
    };
    let ensuring = match command.to_str() {
        Some("ensure") => true,
        Some("release") => false,
        _ => return usage(&format!("unknown command {command:?}")),
    };
    let request = match parse(&args[1..], ensuring) {
        Ok(request) => request,
        Err(problem) => return usage(&problem),
    };
    if let Err(e) = signals::watch() {
        tracing::warn!("SIGTERM and SIGINT will end the plugin at once: {e}");
    }
    match agent::load(&request.config) {
        Ok(stdin) => {
            let outcome = if ensuring {
                agent::ensure(&request, &stdin).map(Some)
            } else {
                agent::release(&request, &stdin).map(|()| None)
            };
            respond(outcome, &config::reply_version(&stdin))
        }
        Err(e) => respond(Err(e), version::NEWEST),
    }
}

/// The options of `ensure` (all) or `release` (no --netns).
fn parse(options: &[OsString], ensuring: bool) -> Result<Request, String> {
    let mut request = Request {
        config: PathBuf::new(),
        id: String::new(),
        ifname: "eth0".into(),
        // The host's own: the namespace the agent runs in, as delegates see it.
        netns: "/proc/self/ns/net".into(),
    };
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let option = option
            .to_str()
            .ok_or_else(|| format!("{option:?} is not UTF-8"))?;
        let (name, inline) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (option, None),
        };
        let mut value = || match &inline {
            Some(value) => Ok(value.clone()),
            None => options
                .next()
                .and_then(|v| v.to_str().map(String::from))
                .ok_or_else(|| format!("{name} needs a value")),
        };
        match name {
            "--config" => request.config = PathBuf::from(value()?),
            "--id" => request.id = value()?,
            "--ifname" => request.ifname = value()?,
            "--netns" if ensuring => request.netns = value()?,
            _ => return Err(format!("unknown option {option:?}")),
        }
    }
    if request.config.as_os_str().is_empty() || request.id.is_empty() {
        return Err("--config and --id are required".into());
    }
    Ok(request)
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
        let request = parse(
            &args(&[
                "--config",
                "/etc/x.conflist",
                "--id=agent-health",
                "--ifname",
                "net1",
                "--netns=/run/netns/x",
            ]),
            true,
        )
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
        let request = parse(&args(&["--id", "a", "--config", "f"]), false).unwrap();
        assert_eq!(
            (request.ifname.as_str(), request.netns.as_str()),
            ("eth0", "/proc/self/ns/net")
        );
    }

    #[test]
    fn bad_command_lines_are_named() {
        for (list, ensuring, problem) in [
            (&["--id", "a"][..], true, "--config and --id are required"),
            (&["--config", "f"], true, "--config and --id are required"),
            (&["--config"], true, "--config needs a value"),
            (
                &["--config", "f", "--id", "a", "--netns", "x"],
                false,
                "unknown option \"--netns\"",
            ),
            (&["--bogus"], true, "unknown option \"--bogus\""),
        ] {
            assert_eq!(parse(&args(list), ensuring).unwrap_err(), problem);
        }
    }
}
