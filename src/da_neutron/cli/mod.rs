//! ipam-da-neutron's command line, for when it is not run as a CNI plugin
//! (no CNI_COMMAND): an operator's verbs, one file each: `show`, the
//! network's ports by node and attachment, and `release`, the ports of a
//! node that will not come back deleted; `keeper`, the daemon of a node's
//! warm pools; `validate`, its settings checked for the doctor. What they share is here: reading the network they are
//! given, and saying how they went.

mod keeper;
mod release;
mod show;

use std::path::Path;
use std::process::ExitCode;

use serde_json::{json, Value};

use super::api::{Controller, Port};
use super::error::NeutronError;
use super::ports::{self, Attachment, OWNER};
use super::settings::Settings;
use crate::args::Program;
use crate::cni::NetConf;
use crate::netd;

/// The command line.
pub const PROGRAM: Program = Program {
    name: "ipam-da-neutron",
    purpose: "a CNI IPAM plugin that gives each attachment a port of a network controller (OpenStack Networking's API)",
    description: "\
As a plugin, a runtime (or ipam-delegated) runs it with CNI_COMMAND set; it
reads its settings from ipam.neutron, and then reads no arguments.
",
    verbs: &[show::VERB, release::VERB, keeper::VERB, VALIDATE],
    notes: "\
PATH is a conflist, one plugin's configuration, or a directory of them
(.conflist, .conf, .json), of which --network picks one.
",
    command: None,
};

/// `validate`: its settings checked, as the doctor of ipam-delegated asks
/// every delegate of the family; the controller is not called.
const VALIDATE: crate::args::Verb = crate::skel::validate_verb(
    "\
Reads a plugin's configuration on stdin, as a runtime gives it,
and checks ipam.neutron whole, as an ADD does before its first
call: exit 0, printing nothing, when it holds; else the CNI error
object an ADD would print (code 7, naming the key), and exit 1.
It calls no controller. The doctor of ipam-delegated runs it.
",
    |_| {
        Ok(crate::skel::validate(|net| {
            Settings::from_net(net).map(drop)
        }))
    },
);

/// The plugin of a configuration that runs ipam-da-neutron, directly or
/// as a delegate.
const OURS: netd::Ours = netd::Ours {
    described: "that runs ipam-da-neutron",
    several: "networks that run ipam-da-neutron",
    is_ours: |ipam| {
        ipam["type"] == "ipam-da-neutron"
            || ipam["delegates"]
                .as_array()
                .is_some_and(|d| d.iter().any(|name| name == "ipam-da-neutron"))
    },
};

/// The name and settings of the network the configuration at `config`
/// names.
fn read_network(config: &Path, network: Option<&str>) -> Result<(String, Settings), NeutronError> {
    let name_of = |stdin: &[u8]| -> Result<String, NeutronError> {
        Ok(NetConf::parse(stdin)?.name.to_owned())
    };
    let raw = netd::pick(config, &OURS, network, name_of)?.stdin;
    let net = NetConf::parse(&raw)?;
    Ok((net.name.to_owned(), Settings::from_net(&net)?))
}

/// The network's ports of this plugin on every node (or on `node`), with
/// their attachments: every port of this owner, by its name's network,
/// tagged or not (an operator's look is rare, and must miss none), but
/// another cluster's.
fn network_ports(
    controller: &Controller,
    network: &str,
    node: Option<&str>,
    cluster: Option<&str>,
) -> Result<Vec<(Port, Attachment)>, NeutronError> {
    if let Some(node) = node {
        let marks = ports::Marks {
            node,
            network,
            cluster,
        };
        return ports::of_node(controller, &marks);
    }
    let listed = controller.ports(&[("device_owner", OWNER)])?;
    Ok(ports::ours(listed, network)
        .into_iter()
        .filter(|(port, _)| !ports::foreign(port, cluster))
        .collect())
}

/// A port as `--json` lists it.
fn port_json(port: &Port, attachment: &Attachment) -> Value {
    json!({
        "node": ports::node_of(port),
        "containerID": attachment.container,
        "ifname": attachment.ifname,
        "pool": attachment.pool,
        "port": port.id,
        "addresses": port.fixed_ips.iter().map(|(_, a)| a.to_string()).collect::<Vec<_>>(),
        "createdAt": port.created_at,
    })
}

/// A port as a line of text lists it.
fn port_line(port: &Port, attachment: &Attachment) -> String {
    let addresses: Vec<String> = port.fixed_ips.iter().map(|(_, a)| a.to_string()).collect();
    format!(
        "{}/{} pool {} port {} {}",
        attachment.container,
        attachment.ifname,
        attachment.pool,
        port.id,
        match addresses.is_empty() {
            true => "(no address yet)".to_owned(),
            false => addresses.join(", "),
        }
    )
}

/// Exit 0 when all went well, 1 when nothing matched or an error (said
/// on stderr, with its CNI code) stopped the command.
fn finish(outcome: Result<bool, NeutronError>) -> ExitCode {
    crate::args::finish("ipam-da-neutron", outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_synopsis_names_the_options_its_verb_takes() {
        crate::args::assert_synopses(&PROGRAM);
    }
}
