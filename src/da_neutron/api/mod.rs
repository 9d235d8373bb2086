//! The controller's port API, as OpenStack Networking (Neutron) has it:
//! ports created, read, listed and deleted, subnets and a network's free
//! addresses read; over one kept-alive connection, every call of an
//! invocation bounded by one deadline (`ipam.neutron.timeout`), and each
//! failure told in the controller's own words under the code it deserves.

mod listing;
mod pooled;

pub use pooled::Guarded;

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::error::NeutronError;
use super::keystone;
use super::settings::{invalid, AppCredential, Settings};
use super::state::State;
use super::wire::{self, SubnetWire};
use crate::addr::Addr;
use crate::http::client::Connection;
use crate::http::socket::interrupted;
use crate::http::{Answer, Limits};

/// What an answer of the controller or Keystone may be. A page of ports
/// is about a KiB a port: 4 MiB is thousands of a node's ports, where a
/// node has a few hundred attachments at most; a larger answer is a
/// broken peer, refused before it takes the node's memory.
pub const ANSWERS: Limits = Limits {
    line: 16 * 1024,
    headers: 128,
    body: 4 << 20,
};

/// How long to wait between two reads of a port whose addresses are not
/// filled yet (a controller that fills them later, as Mizar-MP's does).
const POLL_EVERY: Duration = Duration::from_millis(200);

/// One port, as far as the plugin reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "wire::PortWire")]
pub struct Port {
    pub id: String,
    pub name: String,
    pub network_id: String,
    pub device_id: String,
    pub device_owner: String,
    pub description: String,
    /// Its addresses, each with its subnet.
    pub fixed_ips: Vec<(String, Addr)>,
    pub tags: Vec<String>,
    /// When the controller made it, by the controller's clock (RFC 3339).
    pub created_at: Option<String>,
    /// When it last changed, by the controller's clock (RFC 3339).
    pub updated_at: Option<String>,
    /// Neutron's count of its changes, for a change made only if there
    /// was none since it was read (`If-Match`).
    pub revision_number: Option<u64>,
}

/// One subnet, as a result needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    pub id: String,
    pub network_id: String,
    /// Its prefix, whose length each address's result entry carries.
    pub cidr: crate::addr::Subnet,
    pub gateway: Option<Addr>,
    /// The ranges it gives addresses from, first and last.
    pub allocation_pools: Vec<(Addr, Addr)>,
    /// `(destination, nexthop)`.
    pub host_routes: Vec<(String, String)>,
    pub dns_nameservers: Vec<String>,
}

/// How many addresses a subnet has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Free {
    pub subnet_id: String,
    pub ip_version: u64,
    pub free: u128,
}

/// One request to the controller: its method, its path under the API's
/// root, its body, and the `If-Match` it is sent with, if any.
#[derive(Clone, Copy)]
struct Request<'a> {
    method: &'a str,
    path: &'a str,
    body: Option<&'a Value>,
    if_match: Option<&'a str>,
}

/// The controller, for one invocation.
pub struct Controller {
    url: super::settings::Url,
    /// The TLS configuration `tls` makes, for the controller and Keystone
    /// (each used with it where its URL is https).
    tls: Option<Arc<ClientConfig>>,
    /// The token sent, if any: the file's, or Keystone's for `auth`.
    token: RefCell<Option<String>>,
    /// Application credentials, and where their token is kept.
    auth: Option<(AppCredential, PathBuf)>,
    /// Whether Keystone was asked for a new token in this invocation.
    asked_keystone: Cell<bool>,
    deadline: Instant,
    timeout: Duration,
    connection: RefCell<Option<Connection>>,
    /// The `Date` of the last answer: the controller's clock.
    date: RefCell<Option<String>>,
}

impl Controller {
    /// The controller `settings` name; its TLS files and token read now.
    pub fn open(settings: &Settings) -> Result<Controller, NeutronError> {
        let tls = match &settings.tls {
            None => None,
            Some(files) => Some(
                files
                    .load()
                    .map_err(|e| invalid(format!("\"ipam.neutron.tls\": {e}")))?,
            ),
        };
        let deadline = Instant::now() + settings.timeout;
        let auth = settings
            .auth
            .clone()
            .map(|auth| (auth, settings.data_dir.clone()));
        let token = match &auth {
            None => settings.token()?,
            Some((credential, data_dir)) => Some(keystone::token(
                credential,
                tls.as_ref(),
                &State::open_made(data_dir),
                deadline,
                false,
            )?),
        };
        Ok(Controller {
            url: settings.url.clone(),
            tls,
            token: RefCell::new(token),
            auth,
            asked_keystone: Cell::new(false),
            deadline,
            timeout: settings.timeout,
            connection: RefCell::new(None),
            date: RefCell::new(None),
        })
    }

    /// The same controller with time of its own: the whole timeout again,
    /// from now (to give back what a call that ran out of time made).
    pub fn renewed(&self) -> Controller {
        Controller {
            url: self.url.clone(),
            tls: self.tls.clone(),
            token: self.token.clone(),
            auth: self.auth.clone(),
            asked_keystone: Cell::new(self.asked_keystone.get()),
            deadline: Instant::now() + self.timeout,
            timeout: self.timeout,
            connection: RefCell::new(None),
            date: RefCell::new(None),
        }
    }

    /// The API's root, for messages.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// Who answered, for messages.
    fn peer(&self) -> String {
        format!("the controller at {}", self.url)
    }

    /// The controller's clock at its last answer (its `Date` header).
    pub fn date(&self) -> Option<String> {
        self.date.borrow().clone()
    }

    /// Creates a port from `body` (the members of `port`).
    pub fn create_port(&self, body: &Value, what: &str) -> Result<Port, NeutronError> {
        let call = "creating a port";
        let answer = self.call("POST", "/ports", Some(&json!({ "port": body })), call)?;
        match answer.status {
            200 | 201 => self.port_of(call, &answer),
            _ => Err(self.failure(call, &answer, what)),
        }
    }

    /// The port `id`, `None` if it is gone.
    pub fn port(&self, id: &str) -> Result<Option<Port>, NeutronError> {
        let call = format!("reading port {id}");
        let answer = self.call("GET", &format!("/ports/{id}"), None, &call)?;
        match answer.status {
            200 => self.port_of(&call, &answer).map(Some),
            404 => Ok(None),
            _ => Err(self.failure(&call, &answer, &format!("port {id}"))),
        }
    }

    /// Reads port `created` again until its addresses are filled, or the
    /// time is up.
    pub fn filled(&self, mut created: Port) -> Result<Port, NeutronError> {
        while created.fixed_ips.is_empty() {
            if Instant::now() + POLL_EVERY >= self.deadline {
                return Err(NeutronError::Unreachable {
                    peer: self.peer(),
                    call: format!("waiting for port {} to get its addresses", created.id),
                    reason: format!("none within the timeout of {:?}", self.timeout),
                });
            }
            // Cut short by a termination request, which the next read
            // then answers.
            crate::signals::wait(POLL_EVERY);
            created = self
                .port(&created.id)?
                .ok_or_else(|| NeutronError::Missing {
                    what: format!("port {} (made a moment ago)", created.id),
                    peer: self.peer(),
                    message: "it was deleted while its addresses were awaited".into(),
                })?;
        }
        Ok(created)
    }

    /// Sets the tags of port `id` to `tags`, for a controller that drops
    /// them from a POST (Neutron does, without the ML2 extension driver
    /// `tag_ports_during_bulk_creation`).
    pub fn set_tags(&self, id: &str, tags: &[String]) -> Result<(), NeutronError> {
        let call = format!("tagging port {id}");
        let body = json!({ "tags": tags });
        let answer = self.call("PUT", &format!("/ports/{id}/tags"), Some(&body), &call)?;
        match answer.status {
            200 | 201 | 204 => Ok(()),
            _ => Err(self.failure(&call, &answer, &format!("port {id}"))),
        }
    }

    /// Gives `port` to container `container` (its `device_id`) if it is
    /// as read: unchanged since (Neutron's `If-Match` on its revision,
    /// where it counts them) and still there. The port as changed, or
    /// `None`.
    pub fn adopt_port(&self, port: &Port, container: &str) -> Result<Option<Port>, NeutronError> {
        let call = format!("giving port {} to container {container}", port.id);
        let body = json!({ "port": { "device_id": container } });
        let revision = port.revision_number.map(|r| format!("revision_number={r}"));
        let path = format!("/ports/{}", port.id);
        let request = Request {
            method: "PUT",
            path: &path,
            body: Some(&body),
            if_match: revision.as_deref(),
        };
        let answer = self.call_if(&request, &call)?;
        match answer.status {
            200 => self.port_of(&call, &answer).map(Some),
            404 | 412 => Ok(None),
            _ => Err(self.failure(&call, &answer, &format!("port {}", port.id))),
        }
    }

    /// Deletes port `id`: whether it was there (one already gone is no
    /// failure).
    pub fn delete_port(&self, id: &str) -> Result<bool, NeutronError> {
        let call = format!("deleting port {id}");
        let answer = self.call("DELETE", &format!("/ports/{id}"), None, &call)?;
        match answer.status {
            200 | 202 | 204 => Ok(true),
            404 => Ok(false),
            _ => Err(self.failure(&call, &answer, &format!("port {id}"))),
        }
    }

    /// The subnet `id`, as read (for the cache) and as a result needs it.
    pub fn subnet(&self, id: &str) -> Result<(SubnetWire, Subnet), NeutronError> {
        let call = format!("reading subnet {id}");
        let answer = self.call("GET", &format!("/subnets/{id}"), None, &call)?;
        if answer.status != 200 {
            return Err(self.failure(&call, &answer, &format!("subnet {id}")));
        }
        let read: wire::OneSubnet = self.read(&call, &answer)?;
        let subnet = read
            .subnet
            .subnet()
            .ok_or_else(|| self.garbled(&call, &answer))?;
        Ok((read.subnet, subnet))
    }

    /// The subnets of network `network`.
    pub fn subnets_of(&self, network: &str) -> Result<Vec<Subnet>, NeutronError> {
        let call = format!("listing the subnets of network {network}");
        let path = format!("/subnets?network_id={}", encode(network));
        let answer = self.call("GET", &path, None, &call)?;
        if answer.status != 200 {
            return Err(self.failure(&call, &answer, &format!("network {network}")));
        }
        let listed: wire::SubnetList = self.read(&call, &answer)?;
        Ok(listed
            .subnets
            .iter()
            .filter_map(SubnetWire::subnet)
            // A controller that ignores the filter lists every network's.
            .filter(|s| s.network_id == network)
            .collect())
    }

    /// How many addresses each subnet of network `network` has left, by
    /// Neutron's `network-ip-availabilities`; `None` where the token may
    /// not read it or the controller lacks it, once the network is known
    /// to exist.
    pub fn free_addresses(&self, network: &str) -> Result<Option<Vec<Free>>, NeutronError> {
        let call = format!("reading the free addresses of network {network}");
        let path = format!("/network-ip-availabilities/{network}");
        let answer = self.call("GET", &path, None, &call)?;
        match answer.status {
            200 => {
                let read: wire::Availability = self.read(&call, &answer)?;
                Ok(Some(read.free()))
            }
            401 | 403 | 404 => {
                let call = format!("reading network {network}");
                let answer = self.call("GET", &format!("/networks/{network}"), None, &call)?;
                match answer.status {
                    200 => Ok(None),
                    _ => Err(self.failure(&call, &answer, &format!("network {network}"))),
                }
            }
            _ => Err(self.failure(&call, &answer, &format!("network {network}"))),
        }
    }

    /// One request, as [`Controller::send`] sends it; a token of
    /// Keystone's the controller refuses (revoked, or expired early) is
    /// asked for anew, once, and the request sent again: a 401 made
    /// nothing, a POST included.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        call: &str,
    ) -> Result<Answer, NeutronError> {
        let request = Request {
            method,
            path,
            body,
            if_match: None,
        };
        self.call_if(&request, call)
    }

    /// As [`Controller::call`], with `If-Match: IF_MATCH` where given.
    fn call_if(&self, request: &Request, call: &str) -> Result<Answer, NeutronError> {
        let answer = self.send(request, call)?;
        let Some((credential, data_dir)) = &self.auth else {
            return Ok(answer);
        };
        if answer.status != 401 || self.asked_keystone.replace(true) {
            return Ok(answer);
        }
        let state = State::open_made(data_dir);
        let token = keystone::token(credential, self.tls.as_ref(), &state, self.deadline, true)?;
        *self.token.borrow_mut() = Some(token);
        self.send(request, call)
    }

    /// One request, on the kept connection (or a new one), within the
    /// deadline. A kept connection the server closed meanwhile is opened
    /// again, except under a POST: that one is never sent twice, since
    /// the first may have been made.
    fn send(&self, request: &Request, call: &str) -> Result<Answer, NeutronError> {
        let Request {
            method,
            path,
            body,
            if_match,
        } = *request;
        let body = body.map(|b| b.to_string().into_bytes());
        let path = format!("{}{path}", self.url.base);
        let token = self.token.borrow().clone();
        let mut headers = vec![("Accept", "application/json")];
        if let Some(token) = &token {
            headers.push(("X-Auth-Token", token));
        }
        if let Some(if_match) = if_match {
            headers.push(("If-Match", if_match));
        }
        let mut slot = self.connection.borrow_mut();
        let reused = slot.is_some();
        let mut tries = if reused && method != "POST" { 2 } else { 1 };
        if reused && method == "POST" {
            // Fresh, so that a failure is the request's and not an idle
            // connection's: a POST is never repeated.
            *slot = None;
        }
        loop {
            tries -= 1;
            let mut connection = match slot.take() {
                Some(connection) => connection,
                None => Connection::open(
                    &self.url.host,
                    self.url.port,
                    self.tls.as_ref().filter(|_| self.url.tls),
                    self.deadline,
                    ANSWERS,
                )
                .map_err(|e| self.unreachable(call, &e))?,
            };
            match connection.request(method, &path, &headers, body.as_deref(), self.deadline) {
                Ok(answer) => {
                    if let Some(date) = answer.header("date") {
                        *self.date.borrow_mut() = Some(date.to_owned());
                    }
                    if !answer.close {
                        *slot = Some(connection);
                    }
                    tracing::debug!(method, path, status = answer.status, "controller answered");
                    return Ok(answer);
                }
                // A termination request is not an idle connection's end.
                Err(e)
                    if tries == 0
                        || Instant::now() >= self.deadline
                        || interrupted(&e).is_some() =>
                {
                    return Err(self.unreachable(call, &e))
                }
                Err(_) => {}
            }
        }
    }

    fn unreachable(&self, call: &str, e: &std::io::Error) -> NeutronError {
        transport_failure(self.peer(), call, e, self.timeout)
    }

    /// An answer's body, read as the API has it; what is wrong with it
    /// told, and its beginning.
    fn read<T: DeserializeOwned>(&self, call: &str, answer: &Answer) -> Result<T, NeutronError> {
        serde_json::from_slice(&answer.body).map_err(|e| NeutronError::Unreachable {
            peer: self.peer(),
            call: call.to_owned(),
            reason: format!(
                "status {} with a body that is not the API's ({e}): {}",
                answer.status,
                excerpt(&answer.body)
            ),
        })
    }

    /// The port an answer holds.
    fn port_of(&self, call: &str, answer: &Answer) -> Result<Port, NeutronError> {
        let one: wire::OnePort = self.read(call, answer)?;
        Ok(one.port)
    }

    /// An answer the plugin cannot read.
    fn garbled(&self, call: &str, answer: &Answer) -> NeutronError {
        NeutronError::Unreachable {
            peer: self.peer(),
            call: call.to_owned(),
            reason: format!(
                "status {} with a body that is not the API's: {}",
                answer.status,
                excerpt(&answer.body)
            ),
        }
    }

    /// What a failed `call` on `what` (a network, a subnet, a port) is,
    /// by its status and the controller's own type for it.
    fn failure(&self, call: &str, answer: &Answer, what: &str) -> NeutronError {
        let (kind, message) = message_of(answer);
        let peer = self.peer();
        let call = call.to_owned();
        match (answer.status, kind.as_str()) {
            (401 | 403, _) => NeutronError::Refused {
                peer,
                call,
                message,
            },
            (404, _) => NeutronError::Missing {
                what: what.to_owned(),
                peer,
                message,
            },
            (_, "IpAddressGenerationFailure") => NeutronError::Exhausted {
                what: what.to_owned(),
                message,
            },
            (_, "OverQuota") => NeutronError::OverQuota {
                peer,
                call,
                message,
            },
            (500.., _) => NeutronError::Unreachable {
                peer,
                call,
                reason: format!("status {}: {message}", answer.status),
            },
            _ => NeutronError::Rejected {
                peer,
                call,
                message,
            },
        }
    }
}

/// What an I/O failure talking to `peer` is: TLS that could not be agreed
/// (a CA that did not sign the certificate, a plain-HTTP port given as
/// https://) is a setting to correct, code 5 as for etcd; anything else
/// is the peer out of reach, code 11.
pub fn transport_failure(
    peer: String,
    call: &str,
    e: &std::io::Error,
    timeout: Duration,
) -> NeutronError {
    if let Some(stopped) = interrupted(e) {
        return NeutronError::Interrupted(stopped.clone());
    }
    if let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return NeutronError::Tls {
            peer,
            reason: tls.to_string(),
        };
    }
    let reason = match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            format!("no answer within the timeout of {timeout:?}")
        }
        _ => e.to_string(),
    };
    NeutronError::Unreachable {
        peer,
        call: call.to_owned(),
        reason,
    }
}

/// The controller's type and message for a failure: Neutron's
/// `{"NeutronError": {"type", "message"}}`, keystonemiddleware's
/// `{"error": {"message"}}`, or else the body itself.
pub fn message_of(answer: &Answer) -> (String, String) {
    let (kind, message) = serde_json::from_slice::<wire::Failure>(&answer.body)
        .map(wire::Failure::said)
        .unwrap_or_default();
    let message = message.unwrap_or_else(|| excerpt(&answer.body));
    let message = match kind.is_empty() {
        true => format!("{message} (status {})", answer.status),
        false => format!("{kind}: {message}"),
    };
    (kind, message)
}

/// The beginning of a body, as text, for a message.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None if text.is_empty() => "(no body)".into(),
        None => text.to_owned(),
    }
}

/// A query's key or value, percent-encoded but for the characters that
/// never need it.
fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                encoded.push(byte as char)
            }
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

impl Subnet {
    /// Why `address` may not be given from this subnet, if it may not:
    /// its gateway, or outside its allocation pools (a controller hands
    /// either to an admin who asks).
    pub fn refusal(&self, address: Addr) -> Option<String> {
        if Some(address) == self.gateway {
            return Some(format!("it is subnet {}'s gateway", self.id));
        }
        if !self.cidr.contains(address) {
            return Some(format!("it is outside subnet {} ({})", self.id, self.cidr));
        }
        let pooled = self.allocation_pools.is_empty()
            || self
                .allocation_pools
                .iter()
                .any(|(first, last)| (*first..=*last).contains(&address));
        (!pooled).then(|| format!("it is outside subnet {}'s allocation pools", self.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_value_is_encoded() {
        assert_eq!(encode("cni-net=a b,c/d"), "cni-net%3Da%20b%2Cc%2Fd");
        assert_eq!(encode("binding:host_id"), "binding%3Ahost_id");
    }

    #[test]
    fn the_controllers_words_are_kept_with_its_type() {
        let answer = |status, body: &str| Answer {
            status,
            headers: vec![],
            body: body.as_bytes().to_vec(),
            close: false,
        };
        let (kind, message) = message_of(&answer(
            409,
            r#"{"NeutronError": {"type": "IpAddressGenerationFailure", "message": "No more IP addresses available on network n.", "detail": ""}}"#,
        ));
        assert_eq!(kind, "IpAddressGenerationFailure");
        assert_eq!(
            message,
            "IpAddressGenerationFailure: No more IP addresses available on network n."
        );
        let (_, message) = message_of(&answer(
            401,
            r#"{"error": {"code": 401, "message": "The request you have made requires authentication."}}"#,
        ));
        assert_eq!(
            message,
            "The request you have made requires authentication. (status 401)"
        );
        let (_, message) = message_of(&answer(502, "bad gateway"));
        assert_eq!(message, "bad gateway (status 502)");
    }

    #[test]
    fn a_subnet_refuses_its_gateway_and_what_is_outside_its_pools() {
        let read: SubnetWire = serde_json::from_value(serde_json::json!({
            "id": "s", "network_id": "n", "cidr": "10.9.0.0/24", "gateway_ip": "10.9.0.1",
            "allocation_pools": [{"start": "10.9.0.10", "end": "10.9.0.20"}],
            "host_routes": [{"destination": "10.10.0.0/16", "nexthop": "10.9.0.254"}],
            "dns_nameservers": ["10.9.0.53"]
        }))
        .unwrap();
        let subnet = read.subnet().unwrap();
        assert_eq!(subnet.cidr.prefix, 24);
        let addr = |s: &str| Addr::new(s.parse().unwrap());
        assert_eq!(subnet.refusal(addr("10.9.0.15")), None);
        assert!(subnet
            .refusal(addr("10.9.0.1"))
            .unwrap()
            .contains("gateway"));
        assert!(subnet
            .refusal(addr("10.9.0.21"))
            .unwrap()
            .contains("allocation pools"));
        assert!(subnet
            .refusal(addr("10.8.0.15"))
            .unwrap()
            .contains("outside subnet s"));
        assert_eq!(
            subnet.host_routes,
            [("10.10.0.0/16".into(), "10.9.0.254".into())]
        );
    }

    #[test]
    fn each_status_is_the_failure_it_means_with_the_code_da_pool_gives() {
        use crate::cni::Reportable;
        let object =
            serde_json::json!({"url": "http://127.0.0.1:9/v2.0", "network": "n", "host": "h"});
        let settings = Settings::parse(
            object.as_object().unwrap(),
            super::super::settings::Need::Whole,
        )
        .unwrap();
        let controller = Controller::open(&settings).unwrap();
        let answer = |status, kind: &str| Answer {
            status,
            headers: vec![],
            body: format!(r#"{{"NeutronError": {{"type": "{kind}", "message": "its words"}}}}"#)
                .into_bytes(),
            close: false,
        };
        for (status, kind, code) in [
            (401, "", 5),
            (403, "PolicyNotAuthorized", 5),
            (404, "NetworkNotFound", 7),
            (409, "IpAddressGenerationFailure", 110),
            (409, "OverQuota", 110),
            (400, "HTTPBadRequest", 7),
            (500, "", 11),
            (503, "", 11),
        ] {
            let e = controller.failure("creating a port", &answer(status, kind), "network n");
            assert_eq!(e.code(), code, "{status} {kind}: {e}");
            // The controller's own words, and whose they are or what of.
            let said = e.to_string();
            assert!(said.contains("its words"), "{said}");
            assert!(
                said.contains("http://127.0.0.1:9/v2.0") || said.contains("network n"),
                "{said}"
            );
        }
    }
}
