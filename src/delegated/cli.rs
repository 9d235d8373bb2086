//! ipam-delegated's own verbs, for when it is not run as a CNI plugin (no
//! CNI_COMMAND): agent mode's `ensure` and `release`, the `doctor`, and
//! `install`, which puts the family into place on a node. Its binary adds
//! the Docker driver's `docker-plugin`, which the driver defines.

use std::io::Write;
use std::process::ExitCode;

use super::agent::{self, Request};
use super::{config, doctor, install};
use crate::args::{Opt, Options, Program, Verb};
use crate::skel::respond;
use crate::{cni, signals};

/// `ensure` and `release` take the same options.
const AGENT_OPTIONS: &[Opt] = &[
    Opt::value("--config"),
    Opt::value("--network"),
    Opt::value("--id"),
    Opt::value("--ifname"),
    Opt::value("--netns"),
];

/// `ensure`.
pub const ENSURE: Verb = Verb {
    name: "ensure",
    synopsis: "--config PATH [--network NAME] --id ID [--ifname NAME] [--netns PATH]",
    options: AGENT_OPTIONS,
    operands: false,
    help: "\
Make sure the attachment (the network of PATH, ID, interface NAME,
eth0 by default) holds an address, for a node agent; print it.
",
    run: |options| agent_command(options, true),
};

/// `release`.
pub const RELEASE: Verb = Verb {
    name: "release",
    synopsis: "--config PATH [--network NAME] --id ID [--ifname NAME] [--netns PATH]",
    options: AGENT_OPTIONS,
    operands: false,
    help: "Give that address back and forget it.\n",
    run: |options| agent_command(options, false),
};

/// `doctor`.
pub const DOCTOR: Verb = Verb {
    name: "doctor",
    synopsis: "--config PATH [--network NAME]",
    options: &[Opt::value("--config"), Opt::value("--network")],
    operands: false,
    help: "\
Check the network of PATH and its delegates without allocating
anything: each delegate answers VERSION, and those of this family
(ipam-ds-static, ipam-da-pool, ipam-da-neutron) check their own
settings.
",
    run: run_doctor,
};

/// `install`.
pub const INSTALL: Verb = install::VERB;

/// Its command line, as the binary completes it with `docker-plugin`:
/// these verbs, what `--help` says around them.
pub const PROGRAM: Program = Program {
    name: "ipam-delegated",
    purpose: "a CNI IPAM plugin that runs a stack of IPAM delegates",
    description: "\
As a plugin, set it as ipam.type in a network configuration and list the
delegates in ipam.delegates; a container runtime runs it with CNI_COMMAND
set, and then it reads no arguments. Run by hand, CNI_PATH names the
delegates' directories (/opt/cni/bin if unset).
",
    verbs: &[ENSURE, RELEASE, DOCTOR, INSTALL],
    notes: "\
--netns is the CNI_NETNS delegates get, the agent's own namespace by
default (then CNI_NETNS_OVERRIDE=1 is set for them, as plugins built on
libcni 1.2 or later require). PATH is a conflist (its plugin whose
ipam.type is ipam-delegated is used), one plugin's configuration, or a
directory of them, as net.d; --network picks one of its networks by
name, and is needed when it has several.
",
    command: None,
};

/// `ensure` (or `release`): the address kept for the attachment, as a
/// CNI reply.
fn agent_command(options: &Options, ensuring: bool) -> Result<ExitCode, String> {
    let request = agent_request(options)?;
    if let Err(e) = signals::watch() {
        tracing::warn!("SIGTERM and SIGINT will end the plugin at once: {e}");
    }
    Ok(
        match config::load(&request.config, request.network.as_deref()) {
            Ok(stdin) => {
                let outcome = if ensuring {
                    agent::ensure(&request, &stdin).map(Some)
                } else {
                    agent::release(&request, &stdin).map(|()| None)
                };
                respond(outcome, || cni::version_for_reply(&stdin))
            }
            Err(e) => respond(Err(e), || cni::NEWEST.into()),
        },
    )
}

/// The attachment `ensure` and `release` are about.
fn agent_request(options: &Options) -> Result<Request, String> {
    let (Some(config), Some(id)) = (options.path("--config"), options.value("--id")) else {
        return Err("--config and --id are required".into());
    };
    let request = Request {
        config,
        network: options.value("--network").map(str::to_owned),
        id: id.to_owned(),
        ifname: options.value("--ifname").unwrap_or("eth0").to_owned(),
        // The host's own: the namespace the agent runs in, as delegates see it.
        netns: options
            .value("--netns")
            .unwrap_or("/proc/self/ns/net")
            .to_owned(),
        args: None,
    };
    if request.config.as_os_str().is_empty() || request.id.is_empty() {
        return Err("--config and --id are required".into());
    }
    if request.netns.is_empty() {
        return Err("--netns needs a path".into());
    }
    Ok(request)
}

/// `doctor --config PATH`: the report on stdout; exit 0 only if all is well.
fn run_doctor(options: &Options) -> Result<ExitCode, String> {
    let path = options
        .path("--config")
        .ok_or("doctor takes --config PATH")?;
    let cni_path = cni::path_outside_runtime(std::env::var_os("CNI_PATH"));
    let report = doctor::examine(&path, options.value("--network"), &cni_path);
    let _ = std::io::stdout().write_all(report.text.as_bytes());
    Ok(if report.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The request `ensure` makes of `list`.
    fn request(list: &[&str]) -> Result<Request, String> {
        agent_request(&PROGRAM.verbs[0].parse_words(list)?)
    }

    #[test]
    fn ensure_takes_every_option_in_either_form() {
        let request = request(&[
            "--config",
            "/etc/x.conflist",
            "--id=agent-health",
            "--ifname",
            "net1",
            "--netns=/run/netns/x",
        ])
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
        let request = request(&["--id", "a", "--config", "f"]).unwrap();
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
            assert_eq!(request(list).unwrap_err(), problem);
        }
    }

    #[test]
    fn every_synopsis_names_the_options_its_verb_takes() {
        crate::args::assert_synopses(&PROGRAM);
    }
}
