//! ipam-da-neutron through its built binary, against a real OpenStack
//! Networking server (Debian's python3-neutron) the tests start on
//! loopback: each command through ipam-delegated, the retried and the
//! failed ADD, an exhausted subnet, GC among other hosts' and owners'
//! ports, requested addresses, many ADDs at once, tokens and policies, a
//! controller killed or silent, and the operator's verbs.

// The harness every test binary shares: each uses the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod keystone;
mod main_plugin;
mod operating;
mod plugin;
mod proxy;
mod warm;

use std::sync::OnceLock;

use serde_json::{json, Value};

use common::neutron::{Neutron, Options};
use common::{temp_dir, with_state_dir, Env, Outcome, Stack, TempDir};

/// One server for the tests that neither stop it nor need it set up
/// otherwise: each makes a network of its own. Never dropped: the server
/// stops when this process's end closes its stdin.
fn shared() -> &'static Neutron {
    static SHARED: OnceLock<Neutron> = OnceLock::new();
    SHARED.get_or_init(|| Neutron::start(Options::default()))
}

/// A CNI network on a network of the controller: its configuration,
/// state directory and plugins.
pub struct Net {
    /// The CNI network's name.
    pub name: String,
    /// The controller's network and its IPv4 subnet.
    pub network: String,
    pub subnet: String,
    pub stack: Stack,
    pub data: TempDir,
    pub url: String,
    /// Extra members of `ipam.neutron`.
    pub extra: Value,
}

impl Net {
    /// A network of 10.77.0.0/24 (addresses .10 to .200, gateway .1, a
    /// host route and a name server) on `neutron`.
    pub fn on(neutron: &Neutron, name: &str) -> Net {
        Net::with_pool(neutron, name, "10.77.0.10", "10.77.0.200")
    }

    /// As [`Net::on`], with the allocation pool `first` to `last`.
    pub fn with_pool(neutron: &Neutron, name: &str, first: &str, last: &str) -> Net {
        let network = neutron.network(name);
        let subnet = neutron.subnet(
            &network,
            json!({
                "cidr": "10.77.0.0/24",
                "gateway_ip": "10.77.0.1",
                "allocation_pools": [{"start": first, "end": last}],
                "host_routes": [{"destination": "10.78.0.0/16", "nexthop": "10.77.0.254"}],
                "dns_nameservers": ["10.77.0.53"],
            }),
        );
        Net {
            name: name.to_owned(),
            network,
            subnet,
            stack: Stack::new().with_neutron_plugins(),
            data: temp_dir("neutron-data"),
            url: neutron.url(),
            extra: json!({}),
        }
    }

    /// `ipam.neutron` as the tests give it, on host `node-a`.
    pub fn settings(&self) -> Value {
        let mut settings = json!({
            "url": self.url,
            "network": self.network,
            "host": "node-a",
            "dataDir": self.data.path(),
            "timeout": 20,
        });
        for (key, value) in self.extra.as_object().unwrap() {
            settings[key] = value.clone();
        }
        settings
    }

    /// The configuration of a chain of `delegates` over these settings.
    pub fn config_of(&self, version: &str, delegates: &[&str]) -> String {
        let config = json!({
            "cniVersion": version,
            "name": self.name,
            "type": "bridge",
            "ipam": {
                "type": "ipam-delegated",
                "delegates": delegates,
                "neutron": self.settings(),
            },
        });
        with_state_dir(&self.stack, &config.to_string())
    }

    /// The configuration, ipam-da-neutron the only delegate, at 1.1.0.
    pub fn config(&self) -> String {
        self.config_of("1.1.0", &["ipam-da-neutron"])
    }

    /// The environment of `command` for container `id`.
    pub fn env(&self, command: &str, id: &str) -> Env {
        self.stack.env(command).set("CNI_CONTAINERID", id)
    }

    /// Runs ipam-delegated for container `id` with `stdin`.
    pub fn run(&self, command: &str, id: &str, stdin: &[u8]) -> Outcome {
        common::run_plugin(&self.env(command, id), stdin)
    }

    /// The ports of this network the controller has.
    pub fn ports(&self, neutron: &Neutron) -> Vec<Value> {
        neutron.ports_of(&self.network)
    }
}

/// The shortest grace GC takes, with a timeout as short.
const GC_GRACE: u64 = 3;

/// Members of `ipam.neutron` for a GC that deletes every stale port made
/// so far: it waits until they are older than [`GC_GRACE`] by the
/// controller's clock, whose dates are whole seconds.
pub fn past_the_grace() -> Value {
    std::thread::sleep(std::time::Duration::from_millis(GC_GRACE * 1000 + 100));
    json!({"gcGraceSeconds": GC_GRACE, "timeout": GC_GRACE})
}

/// Asserts that `outcome` failed with `code`, its message saying `what`.
pub fn says(outcome: &Outcome, code: u64, what: &str) {
    let error = outcome.assert_error(code);
    let msg = error["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(what), "not {what:?}: {error}");
}

/// The addresses of a result's `ips`, without their prefix lengths.
pub fn addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| {
            let text = ip["address"].as_str().unwrap();
            text.split_once('/').unwrap().0.to_owned()
        })
        .collect()
}

/// The addresses of a port of the controller's.
pub fn port_addresses(port: &Value) -> Vec<String> {
    port["fixed_ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["ip_address"].as_str().unwrap().to_owned())
        .collect()
}

/// A port's tags, sorted.
pub fn tags_of(port: &Value) -> Vec<&str> {
    let mut tags: Vec<&str> = port["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    tags.sort();
    tags
}
