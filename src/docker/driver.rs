//! libnetwork's remote IPAM API answered by the CNI stack: a pool is a
//! (network, subnet, ip-range) Docker holds; every RequestAddress is an
//! ADD through the stack under a container ID the driver makes, its
//! result kept in agent mode's state; ReleaseAddress is the DEL of the
//! attachment holding the address, and ReleasePool releases what is left.
//! What a request leaves to undo (an ADD cut short, a release that
//! failed) is undone at the network's next request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{json, Value};
use tracing::{info, warn};

use super::attachments::{
    self, addresses, gateway_of, give_back, lock, release, runtime_config, settle, sweep,
};
use super::error::{message, DockerError};
use super::leftovers::Leftovers;
use super::networks::{self, Network};
use super::pool_ids::{PoolId, PoolRequests};
use crate::addr::{Addr, Family, Subnet};
use crate::delegated::DelegatedError;
use crate::http::Status;

/// The option that says what an address Docker asks for is for.
const ADDRESS_TYPE: &str = "RequestAddressType";

/// Its value when Docker asks for a network's gateway.
const GATEWAY: &str = "com.docker.network.gateway";

/// The driver: where the CNI networks' configurations are.
pub struct Driver {
    config: PathBuf,
}

/// The answer to one request.
pub struct Answer {
    pub status: Status,
    pub body: Vec<u8>,
    /// What undoes the request if Docker never learns of the answer.
    pub undo: Option<Undo>,
}

/// A pool or an address given, to release if Docker never gets it.
pub enum Undo {
    Pool(String),
    Address { pool: String, address: String },
}

/// A request's body: a JSON object (or nothing, for the handshake).
struct Body(serde_json::Map<String, Value>);

impl Body {
    fn parse(bytes: &[u8]) -> Result<Body, DockerError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| DockerError::Request(format!("the request is not JSON: {e}")))?;
        match value {
            Value::Object(members) => Ok(Body(members)),
            other => Err(DockerError::Request(format!(
                "the request is not a JSON object: {other}"
            ))),
        }
    }

    /// A string member; missing or null is empty.
    fn text(&self, key: &str) -> Result<&str, DockerError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(text)) => Ok(text),
            Some(other) => Err(DockerError::Request(format!(
                "\"{key}\" must be a string, not {other}"
            ))),
        }
    }

    /// `Options`, a map of strings; Docker sends null for none.
    fn options(&self) -> Result<HashMap<String, String>, DockerError> {
        match self.0.get("Options") {
            None | Some(Value::Null) => Ok(HashMap::new()),
            Some(Value::Object(options)) => options
                .iter()
                .map(|(key, value)| match value {
                    Value::String(text) => Ok((key.clone(), text.clone())),
                    other => Err(DockerError::Request(format!(
                        "option {key:?} must be a string, not {other}"
                    ))),
                })
                .collect(),
            Some(other) => Err(DockerError::Request(format!(
                "\"Options\" must be an object, not {other}"
            ))),
        }
    }
}

impl Driver {
    /// The driver for the configurations at `config` (a file or a directory).
    pub fn new(config: PathBuf) -> Driver {
        Driver { config }
    }

    /// The answer to a POST of `body` to `path`. A request that fails is
    /// answered 200 with `{"Error": …}`, the key Docker reads, carrying
    /// the CNI code and message.
    pub fn answer(&self, path: &str, body: &[u8]) -> Answer {
        let mut undo = None;
        let outcome =
            match path {
                "/Plugin.Activate" => Ok(json!({"Implements": ["IpamDriver"]})),
                "/IpamDriver.GetCapabilities" => Ok(json!({
                    "RequiresMACAddress": false,
                    // What Docker asked for before it restarted is kept here:
                    // it need not ask again.
                    "RequiresRequestReplay": false,
                })),
                "/IpamDriver.GetDefaultAddressSpaces" => Ok(json!({
                    "LocalDefaultAddressSpace": "local",
                    "GlobalDefaultAddressSpace": "global",
                })),
                "/IpamDriver.RequestPool" => Body::parse(body)
                    .and_then(|r| self.request_pool(&r))
                    .map(|(value, pool)| {
                        undo = Some(Undo::Pool(pool));
                        value
                    }),
                "/IpamDriver.ReleasePool" => Body::parse(body)
                    .and_then(|r| self.release_pool(r.text("PoolID")?))
                    .map(|()| json!({})),
                "/IpamDriver.RequestAddress" => Body::parse(body)
                    .and_then(|r| self.request_address(&r))
                    .map(|(value, (pool, address))| {
                        undo = Some(Undo::Address { pool, address });
                        value
                    }),
                "/IpamDriver.ReleaseAddress" => Body::parse(body)
                    .and_then(|r| self.release_address(r.text("PoolID")?, r.text("Address")?))
                    .map(|()| json!({})),
                _ => {
                    return Answer {
                        status: Status::NotFound,
                        body: json!({"Err": format!("{path} is not part of the IPAM driver API")})
                            .to_string()
                            .into_bytes(),
                        undo: None,
                    }
                }
            };
        let body = match outcome {
            Ok(value) => value,
            Err(e) => {
                warn!("{path}: {}", message(&e));
                json!({"Error": message(&e)})
            }
        };
        Answer {
            status: Status::Ok,
            body: body.to_string().into_bytes(),
            undo,
        }
    }

    /// Releases a pool or an address Docker was never told of.
    pub fn undo(&self, undo: Undo) {
        let released = match &undo {
            Undo::Pool(pool) => {
                warn!("the answer giving pool {pool} could not be delivered: releasing it");
                self.release_pool(pool)
            }
            Undo::Address { pool, address } => {
                warn!("the answer giving {address} could not be delivered: releasing it");
                self.release_address(pool, address)
            }
        };
        if let Err(e) = released {
            warn!("could not release it: {}", message(&e));
        }
    }

    /// RequestPool: checks that the network can give addresses from the
    /// pool and counts one more request of it. Nothing is allocated.
    fn request_pool(&self, request: &Body) -> Result<(Value, String), DockerError> {
        let options = request.options()?;
        let (asked_pool, sub_pool) = (request.text("Pool")?, request.text("SubPool")?);
        let v6 = request.0.get("V6") == Some(&Value::Bool(true));
        if let Some(unknown) = options.keys().find(|key| *key != "network") {
            return Err(DockerError::Request(format!(
                "unknown IPAM option {unknown:?}: this driver takes --ipam-opt network=NAME"
            )));
        }
        let net = networks::find(&self.config, options.get("network").map(String::as_str))?;
        let subnet = if asked_pool.is_empty() {
            if !sub_pool.is_empty() {
                return Err(DockerError::Request(
                    "an --ip-range needs a --subnet".into(),
                ));
            }
            net.declared_subnet(if v6 { Family::V6 } else { Family::V4 })?
        } else {
            Subnet::parse(asked_pool)
                .map_err(|e| DockerError::Request(format!("--subnet {asked_pool}: {e}")))?
        };
        let range = match sub_pool {
            "" => None,
            text => {
                let range = Subnet::parse(text)
                    .map_err(|e| DockerError::Request(format!("--ip-range {text}: {e}")))?;
                if !subnet.covers(&range) {
                    return Err(DockerError::Request(format!(
                        "--ip-range {range} is not inside --subnet {subnet}"
                    )));
                }
                let (first, last) = range.host_bounds_in(&subnet);
                if first > last {
                    return Err(DockerError::Request(format!(
                        "--ip-range {range} holds no address a host of {subnet} may have"
                    )));
                }
                Some(range)
            }
        };
        let declared = net.subnets();
        if !net.takes("ipRanges") {
            if range.is_some() {
                return Err(DockerError::Request(format!(
                    "an --ip-range is given to the stack as the ipRanges capability, which network {:?}'s plugin does not take (\"capabilities\": {{\"ipRanges\": true}})",
                    net.name
                )));
            }
            if !declared.is_empty() && !declared.contains(&subnet) {
                return Err(DockerError::Request(format!(
                    "network {:?} declares {}, not {subnet}, and its plugin does not take the ipRanges capability through which the stack could be given it",
                    net.name,
                    networks::list(&declared)
                )));
            }
        }
        let pool = PoolId {
            network: net.name.clone(),
            subnet,
            range,
        };
        let state = lock(&net)?;
        settle(&net, &state);
        let mut requests = PoolRequests::read(&state)?;
        requests.add(&pool);
        let leftovers = sweep(&net, &state, &mut requests);
        requests.write(&state)?;
        for e in leftovers {
            warn!("{}", message(&e));
        }
        info!("pool {pool} requested");
        let answer = json!({"PoolID": pool.to_string(), "Pool": subnet.to_string(), "Data": {}});
        Ok((answer, pool.to_string()))
    }

    /// ReleasePool: one request less; after the last, DEL of every
    /// attachment of the pool still kept. One that fails stays kept, its
    /// pool recorded as released, and is tried again at the network's next
    /// RequestPool or ReleasePool.
    fn release_pool(&self, pool: &str) -> Result<(), DockerError> {
        let pool = PoolId::parse(pool)?;
        let net = networks::find(&self.config, Some(&pool.network))?;
        let state = lock(&net)?;
        settle(&net, &state);
        let mut requests = PoolRequests::read(&state)?;
        if !requests.holds(&pool) {
            warn!("pool {pool} is not held: releasing what is left of it");
        }
        requests.remove(&pool);
        let failures = sweep(&net, &state, &mut requests);
        requests.write(&state)?;
        DelegatedError::from_failures(failures)?;
        info!("pool {pool} released");
        Ok(())
    }

    /// RequestAddress: an ADD through the stack, with the address Docker
    /// asks for (if any) passed every way CNI IPAM plugins read one; the
    /// result is kept, or given back if it does not hold the address the
    /// pool needs. Docker's request for the gateway is answered with the
    /// gateway the stack gives (see [`Driver::gateway`]).
    fn request_address(&self, request: &Body) -> Result<(Value, (String, String)), DockerError> {
        let pool = PoolId::parse(request.text("PoolID")?)?;
        let options = request.options()?;
        let unavailable = |address: &str, why: String| DockerError::AddressUnavailable {
            address: address.to_owned(),
            pool: pool.to_string(),
            why,
        };
        let asked = match request.text("Address")? {
            "" => None,
            text => {
                let ip: IpAddr = text
                    .parse()
                    .map_err(|_| unavailable(text, "it is not an address".into()))?;
                let addr = Addr::new(ip);
                if !pool.subnet.contains(addr) {
                    return Err(unavailable(text, "it is outside the pool's subnet".into()));
                }
                Some(addr)
            }
        };
        let net = networks::find(&self.config, Some(&pool.network))?;
        let for_gateway = options.get(ADDRESS_TYPE).map(String::as_str) == Some(GATEWAY);
        let given = if for_gateway {
            self.gateway(&net, &pool, asked)?
        } else {
            let added = attachments::add(&net, &pool, asked)?;
            info!(
                "{} given from pool {pool} to {}",
                added.given, added.attachment.id
            );
            added.keep()?
        };
        let answer = json!({"Address": format!("{given}/{}", pool.subnet.prefix), "Data": {}});
        Ok((answer, (pool.to_string(), given.to_string())))
    }

    /// Docker's gateway request. The stack's gateway for the pool is the
    /// truth, so that Docker's bridge and every CNI result agree: it is
    /// read from the result of an ADD made to learn it, whose address then
    /// goes back, and a `--gateway` naming another address is refused. A
    /// stack whose results name no gateway gives the gateway as it gives
    /// any address, held for as long as Docker keeps it.
    fn gateway(
        &self,
        net: &Network,
        pool: &PoolId,
        asked: Option<Addr>,
    ) -> Result<Addr, DockerError> {
        let probe = attachments::add(net, pool, None)?;
        let Some(gateway) = gateway_of(&probe.result, pool) else {
            if asked.is_none() {
                info!(
                    "{} given from pool {pool} to {} as the gateway (the stack names none)",
                    probe.given, probe.attachment.id
                );
                return probe.keep();
            }
            give_back(net, pool, probe);
            let added = attachments::add(net, pool, asked)?;
            info!(
                "{} given from pool {pool} to {} as the gateway (the stack names none)",
                added.given, added.attachment.id
            );
            return added.keep();
        };
        give_back(net, pool, probe);
        match asked {
            Some(other) if other != gateway => Err(DockerError::AddressUnavailable {
                address: other.to_string(),
                pool: pool.to_string(),
                why: format!(
                    "the stack gives the pool the gateway {gateway}, which every container's result names: give --gateway {gateway}, or none"
                ),
            }),
            _ => {
                info!("{gateway}, the stack's gateway, is pool {pool}'s");
                Ok(gateway)
            }
        }
    }

    /// ReleaseAddress: the DEL of the attachment that holds the address
    /// (with its kept result as prevResult), then the attachment
    /// forgotten. An address no attachment of the pool holds is released
    /// already.
    fn release_address(&self, pool: &str, address: &str) -> Result<(), DockerError> {
        let pool = PoolId::parse(pool)?;
        let ip: IpAddr = address
            .parse()
            .map_err(|_| DockerError::Request(format!("{address:?} is not an address")))?;
        let address = Addr::new(ip);
        let net = networks::find(&self.config, Some(&pool.network))?;
        let state = lock(&net)?;
        settle(&net, &state);
        let prefix = pool.attachment_prefix();
        for attachment in state.attachments()? {
            if !attachment.id.starts_with(&prefix) {
                continue;
            }
            let Some(kept) = state.read(&attachment)? else {
                continue;
            };
            if addresses(&kept).contains(&address) {
                let stdin = net.stdin(runtime_config(&net, &pool, None));
                if let Err(e) = release(&net, &stdin, &state, &attachment, Some(&kept)) {
                    // Docker forgets the address whatever the answer:
                    // released later, not at `docker network rm` only.
                    Leftovers::add(&state, &attachment.id, &pool)?;
                    warn!(
                        "{address} of pool {pool} is left to release again: {}",
                        message(&e)
                    );
                    return Err(e.into());
                }
                info!("{address} released from pool {pool} by {}", attachment.id);
                return Ok(());
            }
        }
        // The stack's gateway, which no attachment holds, comes here at
        // `docker network rm`.
        info!("{address} is held by no attachment of pool {pool}: nothing to release");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_reach_docker_with_their_code_and_details() {
        let e = DockerError::from(DelegatedError::Failed {
            delegate: "ipam-da-x".into(),
            command: crate::cni::Command::Add,
            failure: crate::delegated::Failure::Reported {
                code: 11,
                msg: "pool busy".into(),
                details: "line one\nline two".into(),
            },
        });
        assert_eq!(
            message(&e),
            "ipam-da-x (ADD): failed with code 11: pool busy (CNI error code 11): line one line two"
        );
    }

    #[test]
    fn the_api_answers_its_handshake_and_refuses_what_it_does_not_have() {
        let driver = Driver::new("/nonexistent".into());
        let activate = driver.answer("/Plugin.Activate", b"");
        assert_eq!(activate.body, br#"{"Implements":["IpamDriver"]}"#);
        let caps = driver.answer("/IpamDriver.GetCapabilities", b"null");
        let caps: Value = serde_json::from_slice(&caps.body).unwrap();
        assert_eq!(caps["RequiresRequestReplay"], false);
        let spaces = driver.answer("/IpamDriver.GetDefaultAddressSpaces", b"");
        assert_eq!(spaces.status, Status::Ok);
        assert_eq!(
            driver.answer("/NetworkDriver.CreateNetwork", b"{}").status,
            Status::NotFound
        );
        // Errors are a 200 with "Error", which is what Docker reads.
        for (path, body) in [
            ("/IpamDriver.RequestPool", &b"not json"[..]),
            (
                "/IpamDriver.RequestPool",
                br#"{"AddressSpace":"local","Options":{"colour":"red"}}"#,
            ),
            (
                "/IpamDriver.RequestPool",
                br#"{"AddressSpace":"local","Options":null}"#,
            ),
            (
                "/IpamDriver.RequestAddress",
                br#"{"PoolID":"junk","Address":"","Options":null}"#,
            ),
            (
                "/IpamDriver.ReleaseAddress",
                br#"{"PoolID":"n/10.1.0.0/16","Address":"x"}"#,
            ),
        ] {
            let answer = driver.answer(path, body);
            assert_eq!(answer.status, Status::Ok);
            assert!(answer.undo.is_none());
            let body: Value = serde_json::from_slice(&answer.body).unwrap();
            let error = body["Error"].as_str().unwrap();
            assert!(error.contains("(CNI error code "), "{path}: {error}");
        }
    }
}
