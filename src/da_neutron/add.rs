//! ADD: one port for the attachment from each pool asked for, found again
//! if an earlier ADD of it made one (so a repeated ADD, or one retried
//! after a crash past its POST, answers the same port), created
//! otherwise; its addresses checked against their subnets and answered
//! as a CNI result added to the previous one. A failure part-way deletes
//! the ports this ADD made.

use serde_json::{json, Map, Value};

use super::api::{Controller, Port, Subnet};
use super::error::NeutronError;
use super::orphans;
use super::ports::{self, OWNER};
use super::settings::{check_tag_value, invalid, Pool, Settings};
use super::state::State;
use super::warm::handout::{self, Answered};
use crate::addr::Addr;
use crate::cni::{self, Environment, NetConf};
use crate::pools;

/// One pool an ADD gets a port from, and the addresses asked of it.
struct Asked<'a> {
    name: String,
    pool: &'a Pool,
    addresses: Vec<Addr>,
}

/// What one ADD works with.
struct Adding<'a> {
    net: &'a NetConf<'a>,
    settings: &'a Settings,
    controller: &'a Controller,
    state: &'a State,
    container: String,
    ifname: String,
    /// The tag of the pod the attachment is for, where the runtime says.
    pod: Option<String>,
}

/// Runs ADD, and returns the result to print.
pub fn add(env: &Environment, net: &NetConf, settings: &Settings) -> Result<Vec<u8>, NeutronError> {
    // The name is a tag's value too.
    check_tag_value("the CNI network's name", &net.name)?;
    let state = State::open_made(&settings.data_dir);
    let container = env.container_id.clone().unwrap_or_default();
    let ifname = env.ifname.clone().unwrap_or_default();
    let pod = orphans::pod_tag(env);
    // Before any call: a hand-out makes none.
    if let Some(entries) = from_warm(
        env,
        net,
        settings,
        &state,
        &container,
        &ifname,
        pod.as_deref(),
    )? {
        return Ok(result(net, &entries));
    }
    let controller = Controller::open(settings)?;
    let adding = Adding {
        net,
        settings,
        controller: &controller,
        state: &state,
        container,
        ifname,
        pod,
    };
    let asked = asked(env, net, settings, &controller, &state)?;
    // Checked before any POST: the controller would refuse the port.
    for one in &asked {
        let name = ports::name(&net.name, &one.name, &adding.ifname);
        if name.len() > ports::FIELD_LIMIT {
            return Err(invalid(format!(
                "the port's name {name:?} (CNI network/pool/interface) is {} bytes, and the controller takes {}: shorten the CNI network's or the pool's name",
                name.len(),
                ports::FIELD_LIMIT
            )));
        }
    }
    let mut made: Vec<String> = Vec::new();
    match adding.answer_each(&asked, &mut made) {
        Ok(entries) => {
            let ids: Vec<String> = entries.iter().map(|(port, _)| port.id.clone()).collect();
            state.note_answered(&net.name, &adding.container, &adding.ifname, &ids);
            Ok(result(net, &entries))
        }
        Err(e) => {
            // What this ADD made is given back, with time of its own (the
            // failure may have been the timeout); a port an earlier ADD
            // made stays for the DEL the runtime sends after a failure.
            // Not stopped by a termination request that stopped the ADD:
            // a second one stops it.
            crate::signals::take_in_hand();
            let undo = controller.renewed();
            for id in made {
                if let Err(failed) = undo.delete_port(&id) {
                    tracing::warn!("port {id} was left after the failed ADD: {failed}");
                }
            }
            Err(e)
        }
    }
}

impl Adding<'_> {
    /// The port of each pool, with the subnet of each of its addresses;
    /// each port made is in `made` from the moment it exists.
    fn answer_each(
        &self,
        asked: &[Asked],
        made: &mut Vec<String>,
    ) -> Result<Vec<Answered>, NeutronError> {
        let listed = self
            .controller
            .ports(&[("device_id", &self.container), ("device_owner", OWNER)])?;
        let node = self.settings.node()?;
        let existing: Vec<Port> = ports::ours(listed, &self.net.name)
            .into_iter()
            .filter(|(_, a)| a.container == self.container && a.ifname == self.ifname)
            .filter(|(port, _)| ports::on_node(port, node, self.settings.cluster.as_deref()))
            .map(|(port, _)| port)
            .collect();
        let answered = self
            .state
            .answered(&self.net.name, &self.container, &self.ifname)
            .unwrap_or_default();
        // Read once, when a pool has no port of the container's.
        let mut orphans: Option<Vec<Port>> = None;
        let mut entries = Vec::new();
        for one in asked {
            let name = ports::name(&self.net.name, &one.name, &self.ifname);
            let found: Vec<&Port> = existing
                .iter()
                .filter(|p| p.name == name && p.network_id == one.pool.network)
                .collect();
            // The port an earlier ADD answered with, else the oldest: a
            // later one is a late POST's extra, which DEL and GC remove.
            let found = found
                .iter()
                .find(|p| answered.contains(&p.id))
                .or(found.first());
            let port = match found {
                Some(port) => self.found_again(one, port)?,
                None => match self.adopted(one, &name, &mut orphans)? {
                    Some(port) => port,
                    None => self.create(one, made)?,
                },
            };
            let port = self.addressed(one, port)?;
            let mut addresses = Vec::new();
            for (subnet_id, address) in &port.fixed_ips {
                let subnet = self.state.subnet(self.controller, subnet_id)?;
                if let Some(why) = subnet.refusal(*address) {
                    // A port this ADD made is given back with the rest; one
                    // an earlier ADD made may be in use: it stays for DEL.
                    return Err(NeutronError::AddressUnavailable {
                        address: address.to_string(),
                        what: one.described(),
                        why: format!("the controller gave it, but {why}"),
                    });
                }
                addresses.push((*address, subnet));
            }
            entries.push((port, addresses));
        }
        Ok(entries)
    }

    /// `port` with its addresses: read again until the controller fills
    /// them (within the timeout), unless its network has no subnet to
    /// fill them from (code 7: it never will).
    fn addressed(&self, one: &Asked, port: Port) -> Result<Port, NeutronError> {
        if port.fixed_ips.is_empty()
            && one.pool.subnets.is_empty()
            && self.controller.subnets_of(&one.pool.network)?.is_empty()
        {
            return Err(NeutronError::Missing {
                what: format!(
                    "subnet in network {} (pool {:?})",
                    one.pool.network, one.name
                ),
                peer: format!("the controller at {}", self.controller.url()),
                message: format!("port {} got no address", port.id),
            });
        }
        self.controller.filled(port)
    }

    /// A port of the pod that an earlier sandbox's ADD made and never
    /// answered with (see [`orphans`]), named for `one` and with the
    /// addresses asked for, given to this container; `None` where there
    /// is none, or it changed before it could be taken over.
    fn adopted(
        &self,
        one: &Asked,
        name: &str,
        orphans: &mut Option<Vec<Port>>,
    ) -> Result<Option<Port>, NeutronError> {
        let Some(pod) = &self.pod else {
            return Ok(None);
        };
        if orphans.is_none() {
            *orphans = Some(orphans::of_pod(
                self.controller,
                self.state,
                &self.settings.marks(&self.net.name)?,
                pod,
                &self.ifname,
                &self.container,
                self.settings.timeout,
            )?);
        }
        let candidates = orphans.iter().flatten().filter(|p| {
            p.name == name
                && p.network_id == one.pool.network
                && one
                    .addresses
                    .iter()
                    .all(|a| p.fixed_ips.iter().any(|(_, held)| held == a))
        });
        for candidate in candidates {
            if let Some(port) = self.controller.adopt_port(candidate, &self.container)? {
                tracing::info!(
                    "port {} of container {} (whose ADD never answered with it) goes to {}",
                    port.id,
                    candidate.device_id,
                    self.container
                );
                return self.found_again(one, &port).map(Some);
            }
        }
        Ok(None)
    }

    /// A port an earlier ADD of the attachment made, if it has the
    /// addresses asked for; tagged now if its tags were lost (its ADD
    /// stopped between the POST and the tags' PUT).
    fn found_again(&self, one: &Asked, port: &Port) -> Result<Port, NeutronError> {
        let missing: Vec<String> = one
            .addresses
            .iter()
            .filter(|a| !port.fixed_ips.iter().any(|(_, held)| held == *a))
            .map(Addr::to_string)
            .collect();
        if !missing.is_empty() {
            return Err(NeutronError::AddressUnavailable {
                address: missing.join(", "),
                what: one.described(),
                why: format!(
                    "the attachment holds port {} already, with other addresses: DEL it first",
                    port.id
                ),
            });
        }
        let tags = self.tags()?;
        if tags.iter().any(|t| !port.tags.contains(t)) {
            self.controller.set_tags(&port.id, &tags)?;
        }
        Ok(port.clone())
    }

    /// The tags of the attachment's ports: the node's, the network's, the
    /// cluster's, and the pod's where the runtime names one.
    fn tags(&self) -> Result<Vec<String>, NeutronError> {
        let mut tags = self.settings.marks(&self.net.name)?.tags();
        tags.extend(self.pod.clone());
        Ok(tags)
    }

    /// Creates the port of `one`, bound to this host if the controller
    /// lets the token say so, and tagged (after the POST, where the
    /// controller drops the POST's tags: a port GC cannot see must not
    /// be).
    fn create(&self, one: &Asked, made: &mut Vec<String>) -> Result<Port, NeutronError> {
        let marks = self.settings.marks(&self.net.name)?;
        let tags = self.tags()?;
        let mut body = json!({
            "network_id": one.pool.network,
            "device_id": self.container,
            "device_owner": OWNER,
            "name": ports::name(&self.net.name, &one.name, &self.ifname),
            "description": marks.description(),
            "tags": tags,
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
        if let Some(groups) = &self.settings.security_groups {
            body["security_groups"] = json!(groups);
        }
        let port = self.post(body, one)?;
        made.push(port.id.clone());
        if tags.iter().any(|t| !port.tags.contains(t)) {
            self.controller.set_tags(&port.id, &tags)?;
        }
        Ok(port)
    }

    /// POSTs the port `body` describes, as [`Adding::post_bound`] does;
    /// noting a refusal for the project's quota (STATUS says it), or
    /// forgetting it once a port is made.
    fn post(&self, body: Value, one: &Asked) -> Result<Port, NeutronError> {
        let posted = self.post_bound(body, one);
        match &posted {
            Ok(_) => self.state.forget_over_quota(),
            Err(NeutronError::OverQuota { message, .. }) => self.state.note_over_quota(message),
            Err(_) => {}
        }
        posted
    }

    /// POSTs the port `body` describes, with this host's binding (if
    /// `bindHost`) unless the controller refused it within a minute.
    fn post_bound(&self, body: Value, one: &Asked) -> Result<Port, NeutronError> {
        let what = one.described();
        if self.settings.bind_host && !self.state.binding_refused() {
            let mut bound = body.clone();
            bound["binding:host_id"] = json!(self.settings.node()?);
            match self.controller.create_port(&bound, &what) {
                // A policy that keeps host bindings to admins, or a
                // controller without them: never depended on.
                Err(
                    NeutronError::Refused { message, .. } | NeutronError::Rejected { message, .. },
                ) if message.contains("binding") => {
                    tracing::info!("the controller does not let this token bind ports: {message}");
                    self.state.note_binding_refused();
                }
                created => return created.map_err(|e| taken(e, one)),
            }
        }
        self.controller
            .create_port(&body, &what)
            .map_err(|e| taken(e, one))
    }
}

impl Asked<'_> {
    /// The pool, for messages.
    fn described(&self) -> String {
        format!("pool {:?} (network {})", self.name, self.pool.network)
    }
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
                what: one.described(),
                why: message,
            }
        }
        other => other,
    }
}

/// The answer from the node's warm pools: where every pool asked for
/// keeps one and no address is asked for (a pooled port's is the
/// controller's choice); see [`handout::take`].
fn from_warm(
    env: &Environment,
    net: &NetConf,
    settings: &Settings,
    state: &State,
    container: &str,
    ifname: &str,
    pod: Option<&str>,
) -> Result<Option<Vec<Answered>>, NeutronError> {
    if settings.pools.values().all(|p| p.warm.is_none()) {
        return Ok(None);
    }
    let wanted = pools::wanted(net, std::slice::from_ref(&settings.default))?;
    if wanted
        .iter()
        .any(|w| w.inline.is_some() || w.requested.is_some())
        || !pools::requested_by_runtime(env, net)?.is_empty()
    {
        return Ok(None);
    }
    let mut asked = Vec::new();
    for w in &wanted {
        asked.push((w.name.clone(), settings.pool(&w.name)?));
    }
    let attachment = handout::For {
        network: &net.name,
        container,
        ifname,
        pod,
    };
    let answered = state.answered(&net.name, container, ifname);
    let note = |ids: &[String]| state.note_answered(&net.name, container, ifname, ids);
    handout::take(settings, &attachment, &asked, answered.as_deref(), &note)
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
    // A selector sets the runtime's address on the pool that gives it:
    // one already asked of a pool is not asked again.
    let by_runtime: Vec<Addr> = pools::requested_by_runtime(env, net)?
        .into_iter()
        .filter(|a| !asked.iter().any(|one| one.addresses.contains(a)))
        .collect();
    if let [only] = asked.as_mut_slice() {
        for address in by_runtime {
            if !only.addresses.contains(&address) {
                only.addresses.push(address);
            }
        }
        return Ok(asked);
    }
    // Each pool's subnets read once, and only if an address needs them.
    let mut subnets: Vec<Option<Vec<Subnet>>> = vec![None; asked.len()];
    for address in by_runtime {
        let mut holder = None;
        for (i, one) in asked.iter().enumerate() {
            if subnets[i].is_none() {
                subnets[i] = Some(match one.pool.subnets.is_empty() {
                    true => controller.subnets_of(&one.pool.network)?,
                    false => one
                        .pool
                        .subnets
                        .iter()
                        .map(|id| state.subnet(controller, id))
                        .collect::<Result<_, _>>()?,
                });
            }
            let of_pool = subnets[i].as_deref().unwrap_or_default();
            if of_pool.iter().any(|s| s.cidr.contains(address)) {
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
