//! DEL, CHECK and GC: the attachment's ports found by its container and
//! interface (`device_id` and the port's name), deleted, or verified
//! against the previous result; for GC, this node's ports of this network
//! that the runtime no longer lists deleted once they are older than the
//! grace, by the controller's clock.

use serde_json::Value;

use super::api::{Controller, Port};
use super::error::NeutronError;
use super::orphans;
use super::ports::{self, Attachment, OWNER};
use super::settings::{invalid, Settings};
use super::state::State;
use super::warm::handout;
use crate::addr::Addr;
use crate::cni::{Environment, NetConf};
use crate::pools;

/// The attachment's ports of this network, oldest first.
fn attachment_ports(
    controller: &Controller,
    net: &NetConf,
    container: &str,
    ifname: &str,
    node: Option<&str>,
    cluster: Option<&str>,
) -> Result<Vec<(Port, Attachment)>, NeutronError> {
    let listed = controller.ports(&[("device_id", container), ("device_owner", OWNER)])?;
    Ok(ports::ours(listed, &net.name)
        .into_iter()
        .filter(|(_, a)| a.container == container && a.ifname == ifname)
        // Another node's or another cluster's port of the same container
        // ID is never ours; a DEL whose node's name cannot be read takes
        // the ID's word, within its cluster.
        .filter(|(port, _)| match node {
            Some(node) => ports::on_node(port, node, cluster),
            None => !ports::foreign(port, cluster),
        })
        .collect())
}

/// DEL: deletes the attachment's ports, and its pod's orphans (see
/// [`orphans`]); one already gone, or none at all, is success. A controller out of reach is code 11, so that the
/// runtime tries again.
pub fn del(env: &Environment, net: &NetConf, settings: &Settings) -> Result<(), NeutronError> {
    let container = env.container_id.clone().unwrap_or_default();
    let ifname = env.ifname.clone().unwrap_or_default();
    let controller = Controller::open(settings)?;
    let node = settings.node().ok();
    let cluster = settings.cluster.as_deref();
    // Its ports from the warm pool whose owner is not recorded yet.
    handout::delete_claimed(settings, &controller, &net.name, &container, &ifname)?;
    for (port, _) in attachment_ports(&controller, net, &container, &ifname, node, cluster)? {
        controller.delete_port(&port.id)?;
    }
    let state = State::open(&settings.data_dir);
    // And the pod's ports that no ADD answered with, which no later DEL
    // would find: its sandbox was retried under another container ID.
    if let (Some(pod), Ok(marks)) = (orphans::pod_tag(env), settings.marks(&net.name)) {
        let timeout = settings.timeout;
        for port in orphans::of_pod(
            &controller,
            &state,
            &marks,
            &pod,
            &ifname,
            &container,
            timeout,
        )? {
            tracing::info!(
                "DEL deletes port {} of container {}, which no ADD answered with",
                port.id,
                port.device_id
            );
            controller.delete_port(&port.id)?;
        }
    }
    state.forget(&net.name, &container, &ifname);
    Ok(())
}

/// CHECK: the attachment has a port of each pool it asked for (the
/// previous result's `pools`, as a selector handed them on, else the
/// default), and their addresses are ones the previous result lists.
pub fn check(env: &Environment, net: &NetConf, settings: &Settings) -> Result<(), NeutronError> {
    let container = env.container_id.clone().unwrap_or_default();
    let ifname = env.ifname.clone().unwrap_or_default();
    let previous: Value = net
        .member("prevResult")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .ok_or_else(|| invalid("CHECK needs \"prevResult\", the result ADD gave".into()))?;
    let listed: Vec<Addr> = previous["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| {
            let text = ip["address"].as_str()?;
            let address = text.split_once('/').map_or(text, |(a, _)| a);
            address.parse().ok().map(Addr::new)
        })
        .collect();
    let controller = Controller::open(settings)?;
    let mut found = attachment_ports(
        &controller,
        net,
        &container,
        &ifname,
        Some(settings.node()?),
        settings.cluster.as_deref(),
    )?;
    found.extend(handout::claimed(
        settings,
        &controller,
        &net.name,
        &container,
        &ifname,
    )?);
    if found.is_empty() {
        return Err(NeutronError::NotHeld(format!(
            "{container}/{ifname} has no port in network {:?} at {}",
            net.name,
            controller.url()
        )));
    }
    for wanted in pools::wanted(net, std::slice::from_ref(&settings.default))? {
        if !found.iter().any(|(_, a)| a.pool == wanted.name) {
            return Err(NeutronError::NotHeld(format!(
                "{container}/{ifname} has no port of pool {:?} in network {:?} at {}",
                wanted.name,
                net.name,
                controller.url()
            )));
        }
    }
    for (port, attachment) in &found {
        if port.fixed_ips.is_empty() {
            return Err(NeutronError::NotHeld(format!(
                "port {} of {container}/{ifname} (pool {:?}) has no address",
                port.id, attachment.pool
            )));
        }
        for (_, address) in &port.fixed_ips {
            if !listed.contains(address) {
                return Err(NeutronError::NotHeld(format!(
                    "port {} of {container}/{ifname} (pool {:?}) has {address}, which the previous result does not list",
                    port.id, attachment.pool
                )));
            }
        }
    }
    Ok(())
}

/// GC (CNI 1.1): deletes this node's ports of this network whose
/// attachment `valid` does not list, and a listed attachment's ports
/// that its ADD did not answer with (a late POST's extra), each only
/// once older than the grace. Another node's ports, another network's,
/// another cluster's and another owner's are never touched.
pub fn gc(
    net: &NetConf,
    settings: &Settings,
    valid: &[(String, String)],
) -> Result<(), NeutronError> {
    let marks = settings.marks(&net.name)?;
    let controller = Controller::open(settings)?;
    let state = State::open(&settings.data_dir);
    let ours = ports::of_node(&controller, &marks)?;
    // The controller's clock, at the listing: a port's age is told by the
    // clock that dated it.
    let now = controller.date().as_deref().and_then(super::age::http_date);
    for (port, attachment) in ours {
        let listed = valid
            .iter()
            .any(|(id, ifname)| *id == attachment.container && *ifname == attachment.ifname);
        let stale = match listed {
            false => true,
            true => state
                .answered(&net.name, &attachment.container, &attachment.ifname)
                .is_some_and(|answered| !answered.contains(&port.id)),
        };
        // Since its last change: a pooled port handed out long after it
        // was made is as young as its owner's record.
        let changed = port.updated_at.as_deref().or(port.created_at.as_deref());
        let old = match (now, changed.and_then(super::age::rfc3339)) {
            (Some(now), Some(created)) => created.saturating_add(settings.gc_grace) <= now,
            // Undated: GC cannot tell a port made a moment ago, and the
            // grace is never 0.
            _ => false,
        };
        if stale && old {
            tracing::info!(
                "GC deletes port {} of {}/{} (pool {:?})",
                port.id,
                attachment.container,
                attachment.ifname,
                attachment.pool
            );
            controller.delete_port(&port.id)?;
        }
    }
    state.forget_all_but(&net.name, valid, settings.gc_grace);
    Ok(())
}
