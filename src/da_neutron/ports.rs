//! Which ports are ours, and whose: each is owned by this plugin
//! (`device_owner`), made for a container (`device_id`), named for its
//! CNI network, pool and interface, and tagged with its node and its CNI
//! network, so that DEL, GC and the operator's verbs find exactly the
//! ports they may touch, even at a controller that ignores list filters.
//! The owner and the name alone say whose a port is; the tags let a
//! listing select by node and network, and GC touches no port without
//! this node's mark. The same marks are in the port's `description`,
//! which every controller keeps: a port whose tags were lost (a plugin
//! killed between its POST and the tags' PUT, at a controller that drops
//! a POST's tags) is still found by its node.

use super::api::{Controller, Port};
use super::error::NeutronError;

/// The `device_owner` that marks a port as this plugin's.
pub const OWNER: &str = "cni:ipam-da-neutron";

/// The attachment a port is for, and the pool it was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container: String,
    pub ifname: String,
    pub pool: String,
}

/// The port name of `network`'s attachment `ifname`, for `pool`. `/` is
/// in no network, pool or interface name, so the name reads back whole.
pub fn name(network: &str, pool: &str, ifname: &str) -> String {
    format!("{network}/{pool}/{ifname}")
}

/// The tag that says which node a port is on.
pub fn node_tag(node: &str) -> String {
    format!("cni-node={node}")
}

/// The tag that says which CNI network a port is for.
pub fn network_tag(network: &str) -> String {
    format!("cni-network={network}")
}

/// The `description` every port of ours carries: its marks, as a
/// listing can select them exactly.
pub fn description(node: &str, network: &str) -> String {
    format!(
        "ipam-da-neutron {} {}",
        node_tag(node),
        network_tag(network)
    )
}

/// The node a port of ours is marked with: its tag, else its description.
pub fn node_of(port: &Port) -> Option<&str> {
    port.tags
        .iter()
        .find_map(|t| t.strip_prefix("cni-node="))
        .or_else(|| {
            let marks = port.description.strip_prefix("ipam-da-neutron ")?;
            marks.split(' ').find_map(|m| m.strip_prefix("cni-node="))
        })
}

/// Whether `port` may be this node's: marked with `node`, or with no
/// node at all (marks lost with both tags and description, or made
/// before them). A controller that ignores list filters lists every
/// node's ports of a container ID; another node's is never ours.
pub fn on_node(port: &Port, node: &str) -> bool {
    node_of(port).is_none_or(|marked| marked == node)
}

/// `network`'s ports of this plugin on `node`, oldest first: those tagged
/// so, and those only described so (their tags lost), each once.
pub fn of_node(
    controller: &Controller,
    network: &str,
    node: &str,
) -> Result<Vec<(Port, Attachment)>, NeutronError> {
    let tags = format!("{},{}", node_tag(node), network_tag(network));
    let mut listed = controller.ports(&[("device_owner", OWNER), ("tags", &tags)])?;
    let described = description(node, network);
    for port in controller.ports(&[("device_owner", OWNER), ("description", &described)])? {
        if !listed.iter().any(|p| p.id == port.id) {
            listed.push(port);
        }
    }
    Ok(ours(listed, network)
        .into_iter()
        .filter(|(port, _)| node_of(port) == Some(node))
        .collect())
}

/// The tags every port of ours carries.
pub fn tags(node: &str, network: &str) -> Vec<String> {
    vec![node_tag(node), network_tag(network)]
}

/// The attachment `port` is for, if it is one of `network`'s ports of
/// this plugin.
pub fn attachment(port: &Port, network: &str) -> Option<Attachment> {
    if port.device_owner != OWNER {
        return None;
    }
    let rest = port.name.strip_prefix(network)?.strip_prefix('/')?;
    let (pool, ifname) = rest.split_once('/')?;
    Some(Attachment {
        container: port.device_id.clone(),
        ifname: ifname.to_owned(),
        pool: pool.to_owned(),
    })
}

/// `network`'s ports of this plugin among `listed`, with their
/// attachments, oldest first (as the controller dates them).
pub fn ours(listed: Vec<Port>, network: &str) -> Vec<(Port, Attachment)> {
    let mut ours: Vec<(Port, Attachment)> = listed
        .into_iter()
        .filter_map(|p| attachment(&p, network).map(|a| (p, a)))
        .collect();
    ours.sort_by(|(a, _), (b, _)| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, owner: &str, tags: &[&str]) -> Port {
        Port {
            id: "p".into(),
            name: name.into(),
            network_id: "n".into(),
            device_id: "c1".into(),
            device_owner: owner.into(),
            description: String::new(),
            fixed_ips: vec![],
            tags: tags.iter().map(|t| t.to_string()).collect(),
            created_at: None,
        }
    }

    #[test]
    fn a_port_reads_back_as_its_attachment_only_if_it_is_ours_and_the_networks() {
        let tags = ["cni-node=n1", "cni-network=net"];
        let ours = port(&name("net", "tenant-a", "eth0"), OWNER, &tags);
        assert_eq!(
            attachment(&ours, "net"),
            Some(Attachment {
                container: "c1".into(),
                ifname: "eth0".into(),
                pool: "tenant-a".into()
            })
        );
        assert_eq!(node_of(&ours), Some("n1"));
        // Its tags lost, its description still says.
        let mut untagged = port(&name("net", "tenant-a", "eth0"), OWNER, &[]);
        assert_eq!(node_of(&untagged), None);
        untagged.description = description("n2", "net");
        assert_eq!(node_of(&untagged), Some("n2"));
        assert_eq!(attachment(&ours, "ne"), None);
        assert_eq!(
            attachment(
                &port(&name("net", "a", "eth0"), "compute:nova", &tags),
                "net"
            ),
            None
        );
        // Another network's, and a name that does not read back.
        assert_eq!(
            attachment(&port(&name("other", "a", "eth0"), OWNER, &tags), "net"),
            None
        );
        assert_eq!(attachment(&port("net-a-eth0", OWNER, &tags), "net"), None);
    }
}
