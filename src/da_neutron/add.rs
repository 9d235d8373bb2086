//! ADD: one port for the attachment from each pool asked for, found again
//! if an earlier ADD of it made one (so a repeated ADD, or one retried
//! after a crash past its POST, answers the same port), created
//! otherwise; its addresses checked against their subnets and answered
//! as a CNI result added to the previous one. A failure part-way deletes
//! the ports this ADD made.

use serde_json::{json, Map, Value};

use super::api::{Controller, Port, Subnet};
use super::error::NeutronError;
use super::ports::{self, Attachment, OWNER};
use super::settings::{invalid, Pool, Settings};
use super::state::State;
use crate::addr::Addr;
use crate::cni::{self, Environment, NetConf};
use crate::pools;

/// One pool an ADD gets a port from, and the addresses asked of it.
struct Asked<'a> {
    name: String,
    pool: &'a Pool,
    addresses: Vec<Addr>,
}

/// A port answered, with the subnet of each of its addresses.
type Answered = (Port, Vec<(Addr, Subnet)>);

/// Runs ADD, and returns the result to print.
pub fn add(env: &Environment, net: &NetConf, settings: &Settings) -> Result<Vec<u8>, NeutronError> {
    let container = env.container_id.clone().unwrap_or_default();
    let ifname = env.ifname.clone().unwrap_or_default();
    let controller = Controller::open(settings)?;
    let state = State::open(&settings.data_dir);
    let asked = asked(env, net, settings, &controller, &state)?;

    let listed = controller.ports(&[("device_id", &container), ("device_owner", OWNER)])?;
    let existing = ports::ours(listed, &net.name);
    let mut made: Vec<String> = Vec::new();
    let answered = answer_each(
        &asked,
        net,
        settings,
        &controller,
        &state,
        &existing,
        &Attachment {
            container: container.clone(),
            ifname: ifname.clone(),
            pool: String::new(),
        },
        &mut made,
    );
    match answered {
        Ok(entries) => {
            let ids: Vec<String> = entries.iter().map(|(port, _)| port.id.clone()).collect();
            state.note_answered(&net.name, &container, &ifname, &ids);
            Ok(result(net, &entries))
        }
        Err(e) => {
            // What this ADD made is given back; a port an earlier ADD
            // made stays for the DEL the runtime sends after a failure.
            for id in made {
                if let Err(undo) = controller.delete_port(&id) {
                    tracing::warn!("port {id} was left after the failed ADD: {undo}");
                }
            }
            Err(e)
        }
    }
}

/// The port of each pool, with the subnet of each of its addresses.
#[allow(clippy::too_many_arguments)]
fn answer_each(
    asked: &[Asked],
    net: &NetConf,
    settings: &Settings,
    controller: &Controller,
    state: &State,
    existing: &[(Port, Attachment)],
    attachment: &Attachment,
    made: &mut Vec<String>,
) -> Result<Vec<Answered>, NeutronError> {
    let mut entries = Vec::new();
    for one in asked {
        // The oldest port an earlier ADD made: a later one is a late
        // POST's extra, which DEL and GC remove.
        let found = existing.iter().find(|(_, a)| {
            a.container == attachment.container
                && a.ifname == attachment.ifname
                && a.pool == one.name
        });
        let port = match found {
            Some((port, _)) => {
                let missing: Vec<String> = one
                    .addresses
                    .iter()
                    .filter(|a| !port.fixed_ips.iter().any(|(_, held)| held == *a))
                    .map(Addr::to_string)
                    .collect();
                if !missing.is_empty() {
                    return Err(NeutronError::AddressUnavailable {
                        address: missing.join(", "),
                        what: format!("pool {:?}", one.name),
                        why: format!(
                            "the attachment holds port {} already, with other addresses: DEL it first",
                            port.id
                        ),
                    });
                }
                port.clone()
            }
            None => {
                let port = create(one, net, settings, controller, state, attachment)?;
                made.push(port.id.clone());
                port
            }
        };
        let port = controller.filled(port)?;
        let mut addresses = Vec::new();
        for (subnet_id, address) in &port.fixed_ips {
            let subnet = state.subnet(controller, subnet_id)?;
            if let Some(why) = subnet.refusal(*address) {
                if !made.contains(&port.id) {
                    // Found, not made: it goes too, or DEL would be the
                    // only way out of an address that must not be used.
                    controller.delete_port(&port.id)?;
                }
                return Err(NeutronError::AddressUnavailable {
                    address: address.to_string(),
                    what: format!("pool {:?} (network {})", one.name, one.pool.network),
                    why: format!("the controller gave it, but {why}"),
                });
            }
            addresses.push((*address, subnet));
        }
        entries.push((port, addresses));
    }
    Ok(entries)
}

/// Creates the port of `one` for `attachment`, bound to this host if the
/// controller lets the token say so.
fn create(
    one: &Asked,
    net: &NetConf,
    settings: &Settings,
    controller: &Controller,
    state: &State,
    attachment: &Attachment,
) -> Result<Port, NeutronError> {
    let mut body = json!({
        "network_id": one.pool.network,
        "device_id": attachment.container,
        "device_owner": OWNER,
        "name": ports::name(&net.name, &one.name, &attachment.ifname),
        "tags": ports::tags(&settings.host, &net.name),
    });
    let fixed_ips: Vec<Value> = if one.addresses.is_empty() {
        one.pool
            .subnets
            .iter()
            .map(|s| json!({ "subnet_id": s }))
            .collect()
    } else {
        one.addresses
            .iter()
            .map(|a| json!({ "ip_address": a.to_string() }))
            .collect()
    };
    if !fixed_ips.is_empty() {
        body["fixed_ips"] = Value::Array(fixed_ips);
    }
    let what = format!("network {} (pool {:?})", one.pool.network, one.name);
    let port = post(body, &what, one, settings, controller, state)?;
    let tags = ports::tags(&settings.host, &net.name);
    if tags.iter().any(|t| !port.tags.contains(t)) {
        // Dropped from the POST: set now, or GC would never see the port.
        match controller.set_tags(&port.id, &tags) {
            Err(e @ NeutronError::Unreachable { .. }) => {
                let _ = controller.delete_port(&port.id);
                return Err(e);
            }
            Err(e) => tracing::warn!("port {} stays untagged, out of GC's sight: {e}", port.id),
            Ok(()) => {}
        }
    }
    Ok(port)
}

/// POSTs the port `body` describes, with this host's binding if the
/// controller lets the token set it.
fn post(
    body: Value,
    what: &str,
    one: &Asked,
    settings: &Settings,
    controller: &Controller,
    state: &State,
) -> Result<Port, NeutronError> {
    if !state.binding_refused() {
        let mut bound = body.clone();
        bound["binding:host_id"] = json!(settings.host);
        match controller.create_port(&bound, what) {
            // The policy keeps host bindings to admins: never depended on.
            Err(NeutronError::Refused { message, .. }) if message.contains("binding") => {
                tracing::info!("the controller does not let this token bind ports: {message}");
                state.note_binding_refused();
            }
            created => return created.map_err(|e| taken(e, one)),
        }
    }
    controller
        .create_port(&body, what)
        .map_err(|e| taken(e, one))
}

/// A requested address another port has, or outside the network's
/// subnets, is that address unavailable.
fn taken(e: NeutronError, one: &Asked) -> NeutronError {
    match e {
        NeutronError::Rejected { message, .. }
            if message.contains("IpAddressAlreadyAllocated")
                || message.contains("InvalidIpForNetwork") =>
        {
            let addresses: Vec<String> = one.addresses.iter().map(Addr::to_string).collect();
            NeutronError::AddressUnavailable {
                address: addresses.join(", "),
                what: format!("pool {:?} (network {})", one.name, one.pool.network),
                why: message,
            }
        }
        other => other,
    }
}

/// The pools an ADD asks for (`prevResult.pools`, else `default`), each
/// with the addresses asked of it: a selector's `requested-ip`, and the
/// runtime's (`IP=`, `runtimeConfig.ips`), each to the one pool, or to
/// the pool whose subnets hold it.
fn asked<'a>(
    env: &Environment,
    net: &NetConf,
    settings: &'a Settings,
    controller: &Controller,
    state: &State,
) -> Result<Vec<Asked<'a>>, NeutronError> {
    let wanted = pools::wanted(net, std::slice::from_ref(&settings.default))?;
    let mut asked = Vec::new();
    for w in &wanted {
        if w.inline.is_some() {
            return Err(invalid(format!(
                "pool {:?} of \"prevResult.pools\" has a range of its own (\"subnet\"): ipam-da-neutron's pools are networks of \"ipam.neutron\"",
                w.name
            )));
        }
        asked.push(Asked {
            name: w.name.clone(),
            pool: settings.pool(&w.name)?,
            addresses: w.requested.into_iter().collect(),
        });
    }
    let by_runtime = pools::requested_by_runtime(env, net)?;
    if let [only] = asked.as_mut_slice() {
        only.addresses.extend(by_runtime);
        return Ok(asked);
    }
    for address in by_runtime {
        let mut holder = None;
        for (i, one) in asked.iter().enumerate() {
            let subnets = match one.pool.subnets.is_empty() {
                true => controller.subnets_of(&one.pool.network)?,
                false => one
                    .pool
                    .subnets
                    .iter()
                    .map(|id| state.subnet(controller, id))
                    .collect::<Result<_, _>>()?,
            };
            if subnets.iter().any(|s| s.cidr.contains(address)) {
                holder = Some(i);
                break;
            }
        }
        let i = holder.ok_or_else(|| NeutronError::AddressUnavailable {
            address: address.to_string(),
            what: "the pools asked for".into(),
            why: "no subnet of theirs holds it".into(),
        })?;
        asked[i].addresses.push(address);
    }
    Ok(asked)
}

/// The result: the ports' addresses with their prefixes and gateways
/// added to the previous result's `ips`, their subnets' host routes to
/// its `routes` and name servers to its `dns`; every other member kept.
fn result(net: &NetConf, entries: &[Answered]) -> Vec<u8> {
    let previous: Value = net
        .member("prevResult")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .unwrap_or(Value::Null);
    let subnets: Vec<&Subnet> = entries
        .iter()
        .flat_map(|(_, addresses)| addresses.iter().map(|(_, s)| s))
        .collect();
    let ours = entries
        .iter()
        .flat_map(|(_, addresses)| addresses)
        .map(|(address, subnet)| {
            let mut ip = Map::new();
            ip.insert(
                "address".into(),
                json!(format!("{address}/{}", subnet.cidr.prefix)),
            );
            if let Some(gateway) = subnet.gateway {
                ip.insert("gateway".into(), json!(gateway.to_string()));
            }
            ip
        })
        .collect();
    let ips = cni::ips_after(&previous, ours, net.cni_version).to_string();
    let mut set = vec![("ips", ips)];

    let mut routes: Vec<Value> = previous["routes"].as_array().cloned().unwrap_or_default();
    for (dst, gw) in subnets.iter().flat_map(|s| &s.host_routes) {
        let route = json!({ "dst": dst, "gw": gw });
        if !routes.contains(&route) {
            routes.push(route);
        }
    }
    if !routes.is_empty() {
        set.push(("routes", Value::Array(routes).to_string()));
    }

    let mut dns = previous["dns"].as_object().cloned().unwrap_or_default();
    let mut nameservers: Vec<Value> = dns
        .get("nameservers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for server in subnets.iter().flat_map(|s| &s.dns_nameservers) {
        if !nameservers.iter().any(|n| n == server) {
            nameservers.push(json!(server));
        }
    }
    if !nameservers.is_empty() {
        dns.insert("nameservers".into(), Value::Array(nameservers));
        set.push(("dns", Value::Object(dns).to_string()));
    }
    let set: Vec<(&str, &str)> = set.iter().map(|(k, v)| (*k, v.as_str())).collect();
    net.result_on_previous(&set)
}
