//! The ADD reply in the configuration's spec version: a result printed in
//! another version is converted as libcni converts results, and every
//! member the conversion does not touch is kept as written, in its place;
//! and the `ips` of an allocator's result, its own added to those of the
//! previous result, each entry in the version's shape.

use std::net::IpAddr;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::error::{code, Reportable};
use super::json::{self, push_member, Members};

/// Why a result cannot be the reply to a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    /// It is in a spec version the crate cannot convert from.
    #[error("answered in cniVersion {version}, which cannot be converted to the configuration's {wanted}")]
    Version {
        /// The result's cniVersion.
        version: String,
        /// The configuration's.
        wanted: &'static str,
    },
    /// Its content does not fit the configuration's version.
    #[error("printed a result that cannot be converted to the configuration's cniVersion {wanted}: {reason}")]
    Content {
        /// The configuration's cniVersion.
        wanted: &'static str,
        /// What stands in the way.
        reason: String,
    },
}

impl Reportable for ConversionError {
    fn code(&self) -> u32 {
        match self {
            ConversionError::Version { .. } => code::INCOMPATIBLE_VERSION,
            ConversionError::Content { .. } => code::DECODING_FAILURE,
        }
    }
}

/// The result shapes of the versions the plugin speaks: results did not
/// change within 0.3.0–0.4.0, nor within 1.0.0–1.1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// 0.3.0, 0.3.1 and 0.4.0: each of `ips` says its IP `version`.
    Legacy,
    /// 1.0.0 and 1.1.0: `ips` entries have no `version`.
    Current,
}

fn shape(version: &str) -> Option<Shape> {
    match version {
        "0.3.0" | "0.3.1" | "0.4.0" => Some(Shape::Legacy),
        "1.0.0" | "1.1.0" => Some(Shape::Current),
        _ => None,
    }
}

/// `result` (a JSON object) as the reply to a configuration of version
/// `wanted`. A result already in that version, or with no cniVersion
/// (which libcni reads as the configuration's), is returned as it is.
pub fn in_version(result: Vec<u8>, wanted: &'static str) -> Result<Vec<u8>, ConversionError> {
    Ok(converted(&result, wanted)?.unwrap_or(result))
}

/// `result` converted to `wanted`, or `None` when it needs no conversion.
fn converted(result: &[u8], wanted: &'static str) -> Result<Option<Vec<u8>>, ConversionError> {
    let unconvertible = |reason: String| ConversionError::Content { wanted, reason };
    let members: Members = serde_json::from_slice(result)
        .map_err(|e| unconvertible(format!("it is not a JSON object: {e}")))?;
    let Some(from) = members
        .get("cniVersion")
        .and_then(json::string)
        .filter(|v| !v.is_empty() && v != wanted)
    else {
        return Ok(None);
    };
    let (Some(from_shape), Some(to_shape)) = (shape(&from), shape(wanted)) else {
        return Err(ConversionError::Version {
            version: from,
            wanted,
        });
    };
    rewrite(&members, wanted, from_shape != to_shape)
        .map(Some)
        .map_err(unconvertible)
}

/// The object with every `cniVersion` set to `wanted` and, when the shape
/// changes, each of `ips` converted; other members as written.
fn rewrite(members: &Members, wanted: &str, reshape: bool) -> Result<Vec<u8>, String> {
    let version = serde_json::Value::from(wanted).to_string();
    let mut out = Vec::with_capacity(256);
    out.push(b'{');
    for (i, (key, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match key {
            "cniVersion" => push_member(&mut out, key, version.as_bytes()),
            // null, as libcni reads it, is no addresses: nothing to convert.
            "ips" if reshape && value.get() != "null" => {
                push_member(&mut out, key, &ips(value, wanted)?)
            }
            _ => push_member(&mut out, key, value.get().as_bytes()),
        }
    }
    out.push(b'}');
    Ok(out)
}

/// The `ips` array in the shape of `wanted`: a 1.x entry gains the
/// `version` a 0.3.x/0.4.0 entry must have ("4" for an IPv4 address, as
/// libcni decides it, IPv4-mapped IPv6 included), placed first as libcni
/// writes it; a 0.3.x/0.4.0 entry loses it.
fn ips(value: &RawValue, wanted: &str) -> Result<Vec<u8>, String> {
    let entries: Vec<Members> = serde_json::from_str(value.get())
        .map_err(|_| "\"ips\" is not an array of objects".to_owned())?;
    let legacy = shape(wanted) == Some(Shape::Legacy);
    let mut out = vec![b'['];
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        let mut first = true;
        let mut member = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
            if !first {
                out.push(b',');
            }
            first = false;
            push_member(out, key, value);
        };
        if legacy {
            let ip_version =
                ip_version(entry).ok_or_else(|| format!("ips[{i}] has no IP address"))?;
            member(&mut out, "version", ip_version.as_bytes());
        }
        for (key, value) in entry.iter().filter(|(key, _)| *key != "version") {
            member(&mut out, key, value.get().as_bytes());
        }
        out.push(b'}');
    }
    out.push(b']');
    Ok(out)
}

/// `"4"` or `"6"` (as JSON) for an entry's `address` (`IP/prefix`).
fn ip_version(entry: &Members) -> Option<&'static str> {
    let address = json::string(entry.get("address")?)?;
    let ip: std::net::IpAddr = address.split_once('/')?.0.parse().ok()?;
    let v4 = match ip {
        std::net::IpAddr::V4(_) => true,
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    };
    Some(if v4 { "\"4\"" } else { "\"6\"" })
}

/// The `ips` of a result that adds `ours` (entries without `version`)
/// to those of `previous` (the previous result, or null): an earlier
/// delegate's entries stay, one of ours it listed too is listed once, as
/// ours; before 1.0.0 each entry says its IP `version`, first, and from
/// 1.0.0 none does.
pub fn ips_after(previous: &Value, ours: Vec<Map<String, Value>>, cni_version: &str) -> Value {
    let legacy = matches!(cni_version, "0.3.0" | "0.3.1" | "0.4.0");
    let mine: Vec<Option<IpAddr>> = ours.iter().map(address_of).collect();
    let earlier = previous["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .filter(|ip| !mine.contains(&address_of(ip)) || address_of(ip).is_none())
        .cloned();
    let ips = earlier
        .chain(ours)
        .map(|ip| Value::Object(in_shape(ip, legacy)))
        .collect();
    Value::Array(ips)
}

/// The address of an `ips` entry (`ADDRESS/PREFIX`).
fn address_of(ip: &Map<String, Value>) -> Option<IpAddr> {
    let text = ip.get("address")?.as_str()?;
    let address = text.split_once('/').map_or(text, |(address, _)| address);
    address.parse().ok()
}

/// An `ips` entry in the shape of its version.
fn in_shape(mut ip: Map<String, Value>, legacy: bool) -> Map<String, Value> {
    ip.remove("version");
    if !legacy {
        return ip;
    }
    let version = match address_of(&ip) {
        Some(IpAddr::V6(_)) => "6",
        _ => "4",
    };
    let mut shaped = Map::new();
    shaped.insert("version".into(), Value::from(version));
    shaped.extend(ip);
    shaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;

    fn convert(result: &str, wanted: &'static str) -> String {
        String::from_utf8(in_version(result.as_bytes().to_vec(), wanted).unwrap()).unwrap()
    }

    fn refused(result: &str, wanted: &'static str) -> ConversionError {
        in_version(result.as_bytes().to_vec(), wanted).unwrap_err()
    }

    #[test]
    fn a_result_in_the_wanted_version_or_none_passes_as_written() {
        for result in [
            r#"{"cniVersion":"1.0.0", "ips":[{"address":"10.0.0.2/24"}], "x":1.50}"#,
            r#"{ "ips": [ {"address":"10.0.0.2/24"} ] }"#,
            r#"{"cniVersion":"", "ips":[]}"#,
            r#"{"cniVersion":1, "ips":[]}"#,
        ] {
            assert_eq!(convert(result, "1.0.0"), result);
        }
    }

    #[test]
    fn within_a_shape_only_the_version_changes() {
        assert_eq!(
            convert(
                r#"{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24"}],"pools":[{"name":"p"}],"n":1e3}"#,
                "1.0.0"
            ),
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}],"pools":[{"name":"p"}],"n":1e3}"#
        );
        assert_eq!(
            convert(
                r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24"}]}"#,
                "0.4.0"
            ),
            r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/24"}]}"#
        );
        assert_eq!(
            convert(r#"{"cniVersion":"1.0.0","ips":null}"#, "0.4.0"),
            r#"{"cniVersion":"0.4.0","ips":null}"#
        );
    }

    #[test]
    fn from_1_x_to_0_x_each_ip_gains_its_version_first() {
        let result = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"interface":0,"address":"10.0.0.2/24","gateway":"10.0.0.1"},{"address":"fd00::2/64","x":{"k":2.50}},{"address":"::ffff:10.1.1.1/120"}],"routes":[{"dst":"0.0.0.0/0","mtu":1400}],"dns":{},"pools":[{"name":"p"}]}"#;
        assert_eq!(
            convert(result, "0.4.0"),
            r#"{"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],"ips":[{"version":"4","interface":0,"address":"10.0.0.2/24","gateway":"10.0.0.1"},{"version":"6","address":"fd00::2/64","x":{"k":2.50}},{"version":"4","address":"::ffff:10.1.1.1/120"}],"routes":[{"dst":"0.0.0.0/0","mtu":1400}],"dns":{},"pools":[{"name":"p"}]}"#
        );
    }

    #[test]
    fn from_0_x_to_1_x_each_ip_loses_its_version() {
        let result = r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1"}],"routes":[],"pools":[]}"#;
        assert_eq!(
            convert(result, "1.1.0"),
            r#"{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1"}],"routes":[],"pools":[]}"#
        );
    }

    #[test]
    fn an_unknown_version_is_code_1() {
        for version in ["0.2.0", "2.0.0", "1.0"] {
            let result = format!(r#"{{"cniVersion":"{version}","ips":[]}}"#);
            let e = refused(&result, "1.0.0");
            assert_eq!(e.code(), code::INCOMPATIBLE_VERSION, "{version}");
            assert_eq!(
                e.to_string(),
                format!("answered in cniVersion {version}, which cannot be converted to the configuration's 1.0.0")
            );
        }
    }

    #[test]
    fn a_result_that_cannot_be_converted_is_code_6() {
        for (result, why) in [
            (r#"{"cniVersion":"1.0.0","ips":{}}"#, "not an array"),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"gateway":"10.0.0.1"}]}"#,
                "ips[0] has no IP address",
            ),
            (
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.300/24"}]}"#,
                "ips[0] has no IP address",
            ),
        ] {
            let e = refused(result, "0.4.0");
            assert_eq!(e.code(), code::DECODING_FAILURE, "{result}");
            assert!(e.to_string().contains(why), "{e}");
        }
    }

    #[test]
    fn an_allocators_ips_follow_the_previous_ones_each_once_in_the_versions_shape() {
        let previous = serde_json::json!({"ips": [
            {"version": "4", "address": "10.1.0.5/24", "interface": 0},
            {"address": "10.2.0.9/24"},
            {"note": "no address"},
        ]});
        let mut ours = Map::new();
        ours.insert("address".into(), "10.2.0.9/24".into());
        ours.insert("gateway".into(), "10.2.0.1".into());
        let mut v6 = Map::new();
        v6.insert("address".into(), "fd00::5/64".into());
        let ips = ips_after(&previous, vec![ours.clone(), v6.clone()], "1.0.0");
        assert_eq!(
            ips,
            serde_json::json!([
                {"address": "10.1.0.5/24", "interface": 0},
                {"note": "no address"},
                {"address": "10.2.0.9/24", "gateway": "10.2.0.1"},
                {"address": "fd00::5/64"},
            ])
        );
        let ips = ips_after(&Value::Null, vec![ours, v6], "0.4.0");
        assert_eq!(
            ips,
            serde_json::json!([
                {"version": "4", "address": "10.2.0.9/24", "gateway": "10.2.0.1"},
                {"version": "6", "address": "fd00::5/64"},
            ])
        );
    }
}
