//! The `pools` contract between a selector and an allocator: a Pool
//! object as a selector prints it in its result's `pools` (a name, and
//! optionally its range inline and the address asked for), a pool's
//! definition (its ranges and reserved addresses, checked whole), and the
//! addresses the runtime asks for. Whatever the selector or the allocator,
//! both read them by these rules; a mistake is a configuration error
//! (code 7) naming the pool, the range and the field.

use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::addr::{Addr, Range, RANGE_KEYS};
use crate::cni::{self, Environment, Error, NetConf};

/// A pool: a name, the ranges it gives addresses from, all of one IP
/// version and none overlapping another, and the addresses of them it
/// keeps back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub ranges: Vec<Range>,
    /// `reserved`: addresses of the ranges never given (set aside by the
    /// operator for what is configured by hand).
    pub reserved: Vec<Addr>,
}

impl Pool {
    /// Reads pool `name`'s definition, a JSON array of ranges or
    /// `{"ranges": [...], "reserved"?: [ADDRESS, ...]}`, and checks it
    /// whole; the error names the pool, the range and the field.
    pub fn parse(name: &str, definition: &Value) -> Result<Pool, Error> {
        check_name(name)?;
        let fail = |reason: String| invalid(format!("pool {name:?}: {reason}"));
        let (ranges, reserved) = match definition {
            Value::Object(fields) => {
                // A misspelt key would leave addresses unreserved unnoticed.
                if let Some(key) = fields
                    .keys()
                    .find(|k| !matches!(k.as_str(), "ranges" | "reserved"))
                {
                    return Err(fail(format!(
                        "unknown key {key:?}: a pool is an array of ranges, or {{\"ranges\", \"reserved\"}}"
                    )));
                }
                (
                    fields.get("ranges").unwrap_or(&Value::Null),
                    fields.get("reserved"),
                )
            }
            ranges => (ranges, None),
        };
        let list = ranges
            .as_array()
            .filter(|list| !list.is_empty())
            .ok_or_else(|| fail("must be a non-empty array of ranges".into()))?;
        let ranges = list
            .iter()
            .enumerate()
            .map(|(i, range)| Range::parse(range).map_err(|e| fail(format!("range {i}: {e}"))))
            .collect::<Result<Vec<Range>, Error>>()?;
        for (i, a) in ranges.iter().enumerate() {
            for (j, b) in ranges.iter().enumerate().skip(i + 1) {
                if a.network.family() != b.network.family() {
                    return Err(fail(format!(
                        "ranges {i} ({}) and {j} ({}) are of different IP versions: a pool gives one address, of one version",
                        a.subnet(),
                        b.subnet()
                    )));
                }
                if a.overlaps(b) {
                    return Err(fail(format!(
                        "ranges {i} ({}) and {j} ({}) overlap",
                        a.subnet(),
                        b.subnet()
                    )));
                }
            }
        }
        let reserved = match reserved {
            None => Vec::new(),
            Some(list) => list
                .as_array()
                .ok_or_else(|| fail("\"reserved\" must be an array of addresses".into()))?
                .iter()
                .map(|entry| {
                    let address = entry
                        .as_str()
                        .and_then(|text| text.parse::<IpAddr>().ok())
                        .map(Addr::new)
                        .ok_or_else(|| fail(format!("\"reserved\" {entry} is not an address")))?;
                    // One outside every range would reserve nothing: a typo.
                    if !ranges.iter().any(|r| r.contains(address)) {
                        return Err(fail(format!(
                            "\"reserved\" {address} is in none of the pool's ranges"
                        )));
                    }
                    Ok(address)
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(Pool {
            name: name.to_owned(),
            ranges,
            reserved,
        })
    }

    /// How many addresses the pool may give: its ranges', but the reserved.
    pub fn size(&self) -> u128 {
        let given: u128 = self
            .ranges
            .iter()
            .fold(0, |sum, range| sum.saturating_add(range.given_count()));
        given.saturating_sub(self.kept_back().len() as u128)
    }

    /// The reserved addresses that a range would otherwise give, each once.
    pub fn kept_back(&self) -> Vec<Addr> {
        let mut kept: Vec<Addr> = self
            .reserved
            .iter()
            .copied()
            .filter(|a| self.range_of(*a).is_some_and(|r| r.gives(*a)))
            .collect();
        kept.sort();
        kept.dedup();
        kept
    }

    /// Why the pool may not give `addr`, if it may not.
    pub fn refusal(&self, addr: Addr) -> Option<String> {
        let Some(range) = self.range_of(addr) else {
            return Some(
                self.reserved_by_ipv4(addr)
                    .unwrap_or_else(|| "it is outside the pool's ranges".into()),
            );
        };
        range.refusal(addr).or_else(|| {
            self.reserved
                .contains(&addr)
                .then(|| "it is reserved in the pool".into())
        })
    }

    /// Why `addr` is in none of the pool's ranges but in one's subnet, if
    /// it is that subnet's IPv4 network or broadcast address.
    pub fn reserved_by_ipv4(&self, addr: Addr) -> Option<String> {
        self.ranges
            .iter()
            .find_map(|range| range.reserved_by_ipv4(addr))
    }

    /// The range that gives `addr`, if one does.
    pub fn range_of(&self, addr: Addr) -> Option<&Range> {
        self.ranges.iter().find(|range| range.contains(addr))
    }
}

/// A pool an ADD asks for: by name, with its ranges inline or not (then
/// they are the configuration's, or the store's), and the address asked
/// for, if one is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub name: String,
    pub inline: Option<Pool>,
    pub requested: Option<Addr>,
}

/// The pools an ADD asks for: `prevResult.pools` (Pool objects, as a
/// selector prints them), or else the allocator's `default` pools; an
/// address asked for through `CNI_ARGS` (`IP=`) or `runtimeConfig.ips`
/// goes to the pool that gives it, at allocation.
pub fn wanted(net: &NetConf, default: &[String]) -> Result<Vec<Wanted>, Error> {
    let prev: Option<Value> = net
        .member("prevResult")
        .and_then(|raw| serde_json::from_str(raw.get()).ok());
    let listed = prev.as_ref().and_then(|prev| prev.get("pools"));
    let objects = match listed {
        Some(Value::Array(objects)) if !objects.is_empty() => objects.clone(),
        Some(Value::Array(_)) | None => default
            .iter()
            .map(|name| serde_json::json!({ "name": name }))
            .collect(),
        Some(_) => {
            return Err(invalid(
                "\"prevResult.pools\" must be an array of pools".into(),
            ))
        }
    };
    if objects.is_empty() {
        return Err(invalid(
            "no pool to allocate from: the previous result lists no \"pools\", and \"ipam.pool.default\" names none".into(),
        ));
    }
    let wanted: Vec<Wanted> = objects
        .iter()
        .map(|object| Wanted::parse(object, "\"prevResult.pools\""))
        .collect::<Result<_, _>>()?;
    for (i, w) in wanted.iter().enumerate() {
        if wanted[..i].iter().any(|e| e.name == w.name) {
            return Err(invalid(format!(
                "pool {:?} is asked for twice: one address comes from each pool",
                w.name
            )));
        }
    }
    Ok(wanted)
}

impl Wanted {
    /// One Pool object: `{"name", "requested-ip"?, "subnet"?, "gateway"?,
    /// "rangeStart"?, "rangeEnd"?, "exclude"?, "reserved"?}`, from the list
    /// `list` names.
    pub fn parse(object: &Value, list: &str) -> Result<Wanted, Error> {
        let name = object
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("a pool in {list} has no \"name\": {object}")))?;
        check_name(name)?;
        let requested = match object.get("requested-ip") {
            None => None,
            Some(value) => Some(value.as_str().and_then(parse_address).ok_or_else(|| {
                invalid(format!(
                    "pool {name:?}: \"requested-ip\" {value} is not an address"
                ))
            })?),
        };
        let inline = match object.get("subnet") {
            Some(_) => {
                let mut range = object.clone();
                if let Some(fields) = range.as_object_mut() {
                    // The object's other members are for other delegates.
                    fields.retain(|key, _| RANGE_KEYS.contains(&key.as_str()));
                }
                let mut definition = Map::new();
                definition.insert("ranges".into(), Value::Array(vec![range]));
                if let Some(reserved) = object.get("reserved") {
                    definition.insert("reserved".into(), reserved.clone());
                }
                Some(Pool::parse(name, &Value::Object(definition))?)
            }
            // A pool defined elsewhere lists its own: these would be lost.
            None if object.get("exclude").is_some() || object.get("reserved").is_some() => {
                return Err(invalid(format!(
                    "pool {name:?}: \"exclude\" and \"reserved\" need an inline range (\"subnet\"); a pool defined elsewhere lists its own"
                )))
            }
            None => None,
        };
        Ok(Wanted {
            name: name.to_owned(),
            inline,
            requested,
        })
    }
}

/// The addresses the runtime asks for: `CNI_ARGS`'s `IP=` (a comma-separated
/// list, as the static plugin takes it) and `runtimeConfig.ips`; each with
/// or without its prefix length.
pub fn requested_by_runtime(env: &Environment, net: &NetConf) -> Result<Vec<Addr>, Error> {
    let mut asked = Vec::new();
    for (key, list) in env.arg_pairs() {
        if key == "IP" {
            for text in list.split(',').filter(|t| !t.is_empty()) {
                asked.push(
                    parse_address(text)
                        .ok_or_else(|| invalid(format!("CNI_ARGS IP={text} is not an address")))?,
                );
            }
        }
    }
    let runtime: Option<Value> = net
        .member("runtimeConfig")
        .and_then(|raw| serde_json::from_str(raw.get()).ok());
    if let Some(ips) = runtime.as_ref().and_then(|r| r.get("ips")) {
        let list = ips
            .as_array()
            .ok_or_else(|| invalid("\"runtimeConfig.ips\" must be an array of addresses".into()))?;
        for value in list {
            asked.push(value.as_str().and_then(parse_address).ok_or_else(|| {
                invalid(format!(
                    "\"runtimeConfig.ips\" holds {value}, which is not an address"
                ))
            })?);
        }
    }
    Ok(asked)
}

/// The attachments a GC must keep: `cni.dev/valid-attachments`, which a
/// runtime always sends (an empty list included); without it, or with an
/// entry that is not `{"containerID", "ifname"}`, nothing is freed (code 7)
/// rather than everything.
pub fn valid_attachments(net: &NetConf) -> Result<Vec<(String, String)>, Error> {
    let raw = net.member("cni.dev/valid-attachments").ok_or_else(|| {
        invalid("GC needs \"cni.dev/valid-attachments\", the attachments to keep".into())
    })?;
    let list: Vec<Value> = serde_json::from_str(raw.get())
        .map_err(|_| invalid("\"cni.dev/valid-attachments\" must be an array".into()))?;
    list.iter()
        .map(|a| {
            let field = |name: &str| a.get(name).and_then(Value::as_str).map(String::from);
            field("containerID").zip(field("ifname")).ok_or_else(|| {
                invalid(format!(
                    "\"cni.dev/valid-attachments\" holds {a}, which is not {{\"containerID\", \"ifname\"}}"
                ))
            })
        })
        .collect()
}

/// An address, with or without a prefix length.
fn parse_address(text: &str) -> Option<Addr> {
    let address = text.split_once('/').map_or(text, |(address, _)| address);
    address.parse::<IpAddr>().ok().map(Addr::new)
}

/// Pool names name files and keys: the identifier rule.
pub fn check_name(name: &str) -> Result<(), Error> {
    if cni::is_identifier(name) {
        Ok(())
    } else {
        Err(invalid(format!(
            "pool name {name:?} {}",
            cni::IDENTIFIER_RULE
        )))
    }
}

/// A configuration error (code 7) saying `reason`.
fn invalid(reason: String) -> Error {
    Error::InvalidConfig(reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Reportable;
    use serde_json::json;

    /// A configuration with, if given, `prevResult` set to `prev`.
    fn net(prev: Option<Value>) -> Vec<u8> {
        let mut config = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {}});
        if let Some(prev) = prev {
            config["prevResult"] = prev;
        }
        config.to_string().into_bytes()
    }

    #[test]
    fn wanted_pools_come_from_the_previous_result_else_the_default() {
        let default = ["blue".to_owned(), "blue6".to_owned()];
        let raw = net(None);
        let conf = NetConf::parse(&raw).unwrap();
        let names: Vec<String> = wanted(&conf, &default)
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["blue", "blue6"]);

        let prev = json!({"cniVersion": "1.0.0", "pools": [
            {"name": "local-pool", "subnet": "192.168.0.0/24", "gateway": "192.168.0.1", "requested-ip": "192.168.0.23/24",
                "exclude": ["192.168.0.128/25"], "reserved": ["192.168.0.99"]},
            {"name": "red"},
        ]});
        let raw = net(Some(prev));
        let conf = NetConf::parse(&raw).unwrap();
        let asked = wanted(&conf, &default).unwrap();
        assert_eq!(asked[0].name, "local-pool");
        assert_eq!(
            asked[0].requested,
            Some(Addr::new("192.168.0.23".parse().unwrap()))
        );
        let inline = asked[0].inline.as_ref().unwrap();
        assert_eq!(inline.ranges[0].subnet(), "192.168.0.0/24");
        assert_eq!(inline.ranges[0].exclude.len(), 1);
        assert_eq!(
            inline.reserved,
            [Addr::new("192.168.0.99".parse().unwrap())]
        );
        assert_eq!(
            (asked[1].name.as_str(), asked[1].inline.is_none()),
            ("red", true)
        );

        let raw = net(None);
        let conf = NetConf::parse(&raw).unwrap();
        let e = wanted(&conf, &[]).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("no pool to allocate from"), "{e}");

        let lost =
            json!({"cniVersion": "1.0.0", "pools": [{"name": "red", "reserved": ["10.1.0.9"]}]});
        let raw = net(Some(lost));
        let conf = NetConf::parse(&raw).unwrap();
        let e = wanted(&conf, &[]).unwrap_err();
        assert!(e.to_string().contains("need an inline range"), "{e}");

        let twice = json!({"cniVersion": "1.0.0", "pools": [{"name": "red"}, {"name": "red"}]});
        let raw = net(Some(twice));
        let conf = NetConf::parse(&raw).unwrap();
        let e = wanted(&conf, &[]).unwrap_err();
        assert!(
            e.to_string().contains("pool \"red\" is asked for twice"),
            "{e}"
        );
    }

    #[test]
    fn the_runtime_asks_for_addresses_by_cni_args_or_runtime_config() {
        let mut raw: Value = serde_json::from_slice(&net(None)).unwrap();
        raw["runtimeConfig"] = json!({"ips": ["fd00::5/64"]});
        let raw = raw.to_string().into_bytes();
        let conf = NetConf::parse(&raw).unwrap();
        let env = cni::add_with_args("IgnoreUnknown=1;IP=10.1.0.7,10.2.0.7/24");
        let asked: Vec<String> = requested_by_runtime(&env, &conf)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(asked, ["10.1.0.7", "10.2.0.7", "fd00::5"]);
    }
}
