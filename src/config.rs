//! The network configuration from stdin: the few keys the plugin reads,
//! checked, and the whole object kept to hand on to delegates with a
//! `prevResult` set.

use std::cell::OnceCell;

use serde_json::{Map, Value};

use crate::error::Error;
use crate::version;

/// The key a delegate finds the previous delegate's result under.
const PREV_RESULT: &str = "prevResult";

/// A checked network configuration.
#[derive(Debug)]
pub struct Config<'a> {
    /// Exactly the bytes the runtime wrote; the first delegate gets these.
    pub raw: &'a [u8],
    /// The configuration's cniVersion, one of [`version::SUPPORTED`].
    pub cni_version: String,
    /// `ipam.delegates`: names to look up in CNI_PATH, in the order to run them.
    pub delegates: Vec<String>,
    object: Map<String, Value>,
    frame: OnceCell<Frame>,
}

impl<'a> Config<'a> {
    /// Parses and checks stdin. Checks run in the order the codes matter to
    /// a runtime: not JSON (6), then the version (1), then the rest (7).
    pub fn parse(raw: &'a [u8]) -> Result<Self, Error> {
        let value: Value = serde_json::from_slice(raw).map_err(Error::ConfigNotJson)?;
        let Value::Object(object) = value else {
            return Err(Error::ConfigNotObject);
        };
        let cni_version = object.get("cniVersion").and_then(Value::as_str);
        version::check_supported(cni_version)?;
        let cni_version = cni_version.unwrap_or_default().to_owned();

        match object.get("name") {
            Some(Value::String(name)) if !name.is_empty() => {}
            _ => return Err(invalid("\"name\" must be a non-empty string")),
        }
        let delegates = delegates(&object)?;
        Ok(Config {
            raw,
            cni_version,
            delegates,
            object,
            frame: OnceCell::new(),
        })
    }

    /// The configuration with `prevResult` set to `result`, a delegate's
    /// printed JSON object, inserted as printed. Every other key keeps its
    /// value and place; a `prevResult` the runtime sent is replaced in place.
    pub fn with_prev_result(&self, result: &[u8]) -> Vec<u8> {
        let frame = self.frame.get_or_init(|| Frame::new(&self.object));
        [frame.head.as_slice(), result, frame.tail.as_slice()].concat()
    }
}

/// The cniVersion a reply should carry: the input's when it has a readable
/// one, whether supported or not, else the newest supported.
pub fn reply_version(raw: &[u8]) -> String {
    serde_json::from_slice::<Value>(raw)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(String::from))
        .unwrap_or_else(|| version::NEWEST.to_owned())
}

fn invalid(reason: &str) -> Error {
    Error::InvalidConfig(reason.to_owned())
}

/// `ipam.delegates`: a non-empty array of names, each safe to look up as a
/// file name in a CNI_PATH directory.
fn delegates(object: &Map<String, Value>) -> Result<Vec<String>, Error> {
    let ipam = match object.get("ipam") {
        Some(Value::Object(ipam)) => ipam,
        Some(_) => return Err(invalid("\"ipam\" must be an object")),
        None => return Err(invalid("\"ipam\" is missing")),
    };
    let list = match ipam.get("delegates") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => return Err(invalid("\"ipam.delegates\" is empty")),
        Some(_) => {
            return Err(invalid(
                "\"ipam.delegates\" must be an array of plugin names",
            ))
        }
        None => return Err(invalid("\"ipam.delegates\" is missing")),
    };
    list.iter()
        .enumerate()
        .map(|(i, entry)| match entry {
            Value::String(name) => check_name(name).map(|()| name.clone()),
            other => Err(Error::InvalidConfig(format!(
                "\"ipam.delegates\"[{i}] must be a plugin name, not {other}"
            ))),
        })
        .collect()
}

/// Names select files inside CNI_PATH directories and must not leave them.
fn check_name(name: &str) -> Result<(), Error> {
    let bad = name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']);
    if bad {
        Err(Error::InvalidConfig(format!(
            "delegate name {name:?} is not a plain file name (empty, '.', '..', or holds '/', '\\' or NUL)"
        )))
    } else {
        Ok(())
    }
}

/// The configuration serialised once, split where the `prevResult` value
/// goes, so each delegate's stdin is a copy of both halves around a result.
#[derive(Debug)]
struct Frame {
    /// Up to and including `"prevResult":`.
    head: Vec<u8>,
    /// Everything after the value, closing brace included.
    tail: Vec<u8>,
}

impl Frame {
    fn new(object: &Map<String, Value>) -> Frame {
        let mut head = b"{".to_vec();
        let mut tail = Vec::new();
        let mut placed = false;
        for (key, value) in object {
            if key == PREV_RESULT {
                if head.len() > 1 {
                    head.push(b',');
                }
                push_key(&mut head, key);
                placed = true;
                continue;
            }
            let out = if placed { &mut tail } else { &mut head };
            if out.len() > 1 || placed {
                out.push(b',');
            }
            push_key(out, key);
            // Display on a Value writes compact JSON and cannot fail.
            out.extend_from_slice(value.to_string().as_bytes());
        }
        if !placed {
            if head.len() > 1 {
                head.push(b',');
            }
            push_key(&mut head, PREV_RESULT);
        }
        tail.push(b'}');
        Frame { head, tail }
    }
}

fn push_key(out: &mut Vec<u8>, key: &str) {
    out.extend_from_slice(Value::from(key).to_string().as_bytes());
    out.push(b':');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    const GOOD: &str = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipam-delegated","delegates":["a","b"]}}"#;

    fn parse_err(text: &str) -> Error {
        Config::parse(text.as_bytes()).expect_err("should be refused")
    }

    #[test]
    fn a_good_config_is_read() {
        let c = Config::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.delegates, ["a", "b"]);
        assert_eq!(c.raw, GOOD.as_bytes());
    }

    #[test]
    fn not_json_or_not_an_object_is_code_6() {
        for text in ["", "nope", "{", "[1]", "\"s\"", "3", "null", "{\"a\":1}x"] {
            assert_eq!(parse_err(text).code(), code::DECODING_FAILURE, "{text:?}");
        }
        let e = Config::parse(b"{\"cniVersion\":\"1.0.0\xff\"}").unwrap_err();
        assert_eq!(e.code(), code::DECODING_FAILURE);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000);
        assert_eq!(parse_err(&deep).code(), code::DECODING_FAILURE);
    }

    #[test]
    fn version_missing_or_unsupported_is_code_1_before_anything_else() {
        for text in [r#"{}"#, r#"{"cniVersion":"0.2.0"}"#, r#"{"cniVersion":1}"#] {
            assert_eq!(parse_err(text).code(), code::INCOMPATIBLE_VERSION, "{text}");
        }
    }

    #[test]
    fn name_must_be_a_non_empty_string() {
        for name in [None, Some("1"), Some("\"\"")] {
            let text = match name {
                Some(n) => GOOD.replace(r#""name":"n""#, &format!(r#""name":{n}"#)),
                None => GOOD.replace(r#""name":"n","#, ""),
            };
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{text}");
            assert!(e.to_string().contains("\"name\""));
        }
    }

    #[test]
    fn delegates_must_be_a_non_empty_list_of_names() {
        let cases = [
            (r#""ipam":{}"#, "is missing"),
            (r#""ipam":3"#, "\"ipam\" must be an object"),
            (r#""ipam":{"delegates":"a"}"#, "must be an array"),
            (r#""ipam":{"delegates":[]}"#, "is empty"),
            (
                r#""ipam":{"delegates":["a",1]}"#,
                "[1] must be a plugin name, not 1",
            ),
            (
                r#""ipam":{"delegates":[null]}"#,
                "[0] must be a plugin name",
            ),
        ];
        for (ipam, expect) in cases {
            let text = format!(r#"{{"cniVersion":"0.3.1","name":"n",{ipam}}}"#);
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{ipam}");
            assert!(e.to_string().contains(expect), "{ipam}: {e}");
        }
        let e = parse_err(r#"{"cniVersion":"0.3.1","name":"n"}"#);
        assert!(e.to_string().contains("\"ipam\" is missing"));
    }

    #[test]
    fn names_that_could_leave_cni_path_are_refused() {
        for name in ["", ".", "..", "../x", "a/b", "/bin/sh", "a\\b", "a\u{0}b"] {
            let e = check_name(name).unwrap_err();
            assert_eq!(e.code(), code::INVALID_CONFIG, "{name:?}");
        }
        for name in ["host-local", "ipam-ds-x", "...", "a.b", "é"] {
            assert!(check_name(name).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn prev_result_is_appended_with_everything_else_in_order() {
        let text = r#"{"cniVersion":"1.0.0", "name":"n","zeta":1.50,"ipam":{"delegates":["a"],"big":123456789012345678901234567890},"alpha":"\u00e9"}"#;
        let c = Config::parse(text.as_bytes()).unwrap();
        let out = c.with_prev_result(br#"{"ips":[], "x":1e3}"#);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"cniVersion":"1.0.0","name":"n","zeta":1.50,"ipam":{"delegates":["a"],"big":123456789012345678901234567890},"alpha":"é","prevResult":{"ips":[], "x":1e3}}"#
        );
    }

    #[test]
    fn a_runtime_prev_result_is_replaced_in_place() {
        let text = r#"{"cniVersion":"1.0.0","prevResult":{"old":true},"name":"n","ipam":{"delegates":["a"]}}"#;
        let c = Config::parse(text.as_bytes()).unwrap();
        let out = c.with_prev_result(br#"{"new":true}"#);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"cniVersion":"1.0.0","prevResult":{"new":true},"name":"n","ipam":{"delegates":["a"]}}"#
        );
        let first =
            r#"{"prevResult":{},"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["a"]}}"#;
        let c = Config::parse(first.as_bytes()).unwrap();
        assert!(c
            .with_prev_result(b"{}")
            .starts_with(br#"{"prevResult":{},"cniVersion""#));
    }

    #[test]
    fn the_spliced_config_is_valid_json_each_time() {
        let c = Config::parse(GOOD.as_bytes()).unwrap();
        for result in [&b"{}"[..], br#"{"a":[1,2]}"#] {
            let v: Value = serde_json::from_slice(&c.with_prev_result(result)).unwrap();
            assert_eq!(
                v["prevResult"],
                serde_json::from_slice::<Value>(result).unwrap()
            );
            assert_eq!(v["ipam"]["delegates"][1], "b");
        }
    }

    #[test]
    fn reply_version_is_the_inputs_or_the_newest() {
        assert_eq!(reply_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(reply_version(br#"{"cniVersion":"9.9.9"}"#), "9.9.9");
        assert_eq!(reply_version(b"not json"), version::NEWEST);
        assert_eq!(reply_version(br#"{"cniVersion":4}"#), version::NEWEST);
        assert_eq!(reply_version(b"[]"), version::NEWEST);
    }
}
