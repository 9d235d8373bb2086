//! A network configuration's common keys (cniVersion and name, checked),
//! every member kept exactly as written, so that it can be passed on with
//! `prevResult` (or another member) set.

use std::cell::OnceCell;

use serde_json::value::RawValue;

use super::env::{is_identifier, IDENTIFIER_RULE};
use super::error::Error;
use super::json::{push_member, string, Members};
use super::version::{supported, NEWEST};

/// The key a plugin finds the previous plugin's result under.
const PREV_RESULT: &str = "prevResult";

/// A network configuration as a plugin gets it on stdin: the common keys
/// checked, every member kept as written.
#[derive(Debug)]
pub struct NetConf<'a> {
    /// Exactly the bytes the runtime wrote.
    pub raw: &'a [u8],
    /// The configuration's cniVersion, one of the supported ones.
    pub cni_version: &'static str,
    /// The network's name, which follows the specification's rule.
    pub name: String,
    members: Members<'a>,
    frame: OnceCell<Frame>,
}

impl<'a> NetConf<'a> {
    /// Parses and checks `raw`. Checks run in the order the codes matter to
    /// a runtime: not a JSON object (6), then the version (1), then the
    /// name (7).
    pub fn parse(raw: &'a [u8]) -> Result<Self, Error> {
        let members: Members = serde_json::from_slice(raw).map_err(Error::NotAnObject)?;
        let version_field = members.get("cniVersion");
        let cni_version = version_field
            .and_then(string)
            .and_then(|v| supported(&v))
            .ok_or_else(|| Error::UnsupportedVersion(version_field.map(|v| v.get().to_owned())))?;
        let name = members.get("name").and_then(string).unwrap_or_default();
        if name.is_empty() {
            return Err(Error::InvalidConfig(
                "\"name\" must be a non-empty string".into(),
            ));
        }
        if !is_identifier(&name) {
            return Err(Error::InvalidConfig(format!(
                "\"name\" {name:?} {IDENTIFIER_RULE}"
            )));
        }
        Ok(NetConf {
            raw,
            cni_version,
            name,
            members,
            frame: OnceCell::new(),
        })
    }

    /// The value of top-level member `key`, as written.
    pub fn member(&self, key: &str) -> Option<&'a RawValue> {
        self.members.get(key)
    }

    /// The members of top-level member `key`, which must be an object if
    /// it is there (code 7 otherwise).
    pub fn object(&self, key: &str) -> Result<Option<Members<'a>>, Error> {
        self.member(key)
            .map(|value| {
                serde_json::from_str(value.get())
                    .map_err(|_| Error::InvalidConfig(format!("\"{key}\" must be an object")))
            })
            .transpose()
    }

    /// The configuration with `prevResult` set to `result`, a printed JSON
    /// object, inserted as printed. Every other member keeps its place and
    /// is copied byte for byte; a `prevResult` the runtime sent is
    /// replaced where it stood.
    pub fn with_prev_result(&self, result: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_with_prev_result(result, &mut out);
        out
    }

    /// [`Self::with_prev_result`] written into `out`, replacing what it
    /// held and reusing its allocation.
    pub fn write_with_prev_result(&self, result: &[u8], out: &mut Vec<u8>) {
        let frame = self
            .frame
            .get_or_init(|| Frame::new(&self.members, PREV_RESULT));
        out.clear();
        out.reserve_exact(frame.head.len() + result.len() + frame.tail.len());
        out.extend_from_slice(&frame.head);
        out.extend_from_slice(result);
        out.extend_from_slice(&frame.tail);
    }

    /// The configuration with member `key` set to `value` (JSON text), in
    /// place if it is there, else at the end; everything else as it came.
    pub fn with_member(&self, key: &str, value: &[u8]) -> Vec<u8> {
        Frame::new(&self.members, key).around(value)
    }

    /// A result that amends `prevResult` (or `{}` without one), for a
    /// plugin that adds to what came before it: each of `set` (key, JSON
    /// text) replaces the member of its key where it stands or comes last,
    /// `cniVersion` is the configuration's (first when it was missing),
    /// and every other member is kept as written, in its place.
    pub fn result_on_previous(&self, set: &[(&str, &str)]) -> Vec<u8> {
        let version = serde_json::Value::from(self.cni_version).to_string();
        let previous: Option<Members> = self
            .member(PREV_RESULT)
            .and_then(|raw| serde_json::from_str(raw.get()).ok());
        let kept: Vec<(&str, &str)> = previous
            .iter()
            .flat_map(|members| members.iter())
            .map(|(key, value)| (key, value.get()))
            .collect();
        let mut members: Vec<(&str, &str)> = Vec::with_capacity(kept.len() + set.len() + 1);
        if !kept.iter().any(|(key, _)| *key == "cniVersion") {
            members.push(("cniVersion", &version));
        }
        for (key, value) in kept {
            let new = match key {
                "cniVersion" => Some(version.as_str()),
                _ => set.iter().find(|(k, _)| *k == key).map(|(_, v)| *v),
            };
            members.push((key, new.unwrap_or(value)));
        }
        for (key, value) in set {
            if !members.iter().any(|(k, _)| k == key) {
                members.push((key, value));
            }
        }
        let mut out = b"{".to_vec();
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_member(&mut out, key, value.as_bytes());
        }
        out.push(b'}');
        out
    }
}

/// The cniVersion a reply should carry: the input's when it has a string
/// one, whether supported or not, else the newest supported.
pub fn version_for_reply(raw: &[u8]) -> String {
    serde_json::from_slice::<Members>(raw)
        .ok()
        .and_then(|members| string(members.get("cniVersion")?))
        .unwrap_or_else(|| NEWEST.to_owned())
}

/// The configuration written out once without one member (`prevResult`,
/// mostly), split where that member's value goes, so each delegate's stdin
/// is both halves copied around a result.
#[derive(Debug)]
struct Frame {
    /// Up to and including `"<key>":`.
    head: Vec<u8>,
    /// Everything after the value, closing brace included.
    tail: Vec<u8>,
}

impl Frame {
    fn new(members: &Members, member: &str) -> Frame {
        let mut head = b"{".to_vec();
        let mut tail = Vec::new();
        let mut placed = false;
        for (key, value) in members.iter() {
            if key == member {
                // The first one's place takes the new value; duplicates go,
                // or a reader taking the last would see a stale one.
                if !placed {
                    separate(&mut head);
                    push_member(&mut head, key, b"");
                    placed = true;
                }
                continue;
            }
            let out = if placed { &mut tail } else { &mut head };
            if placed {
                out.push(b',');
            } else {
                separate(out);
            }
            push_member(out, key, value.get().as_bytes());
        }
        if !placed {
            separate(&mut head);
            push_member(&mut head, member, b"");
        }
        tail.push(b'}');
        Frame { head, tail }
    }

    fn around(&self, value: &[u8]) -> Vec<u8> {
        [self.head.as_slice(), value, self.tail.as_slice()].concat()
    }
}

/// A comma, unless `head` holds only the opening brace so far.
fn separate(head: &mut Vec<u8>) {
    if head.len() > 1 {
        head.push(b',');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::Reportable;

    const GOOD: &str = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipam-delegated","delegates":["a","b"]}}"#;

    fn parse_err(text: &str) -> Error {
        NetConf::parse(text.as_bytes()).expect_err("should be refused")
    }

    fn spliced(input: &str, result: &str) -> String {
        let config = NetConf::parse(input.as_bytes()).unwrap();
        String::from_utf8(config.with_prev_result(result.as_bytes())).unwrap()
    }

    #[test]
    fn a_result_on_the_previous_keeps_its_members_in_place() {
        let on = |input: &str, set: &[(&str, &str)]| {
            let config = NetConf::parse(input.as_bytes()).unwrap();
            String::from_utf8(config.result_on_previous(set)).unwrap()
        };
        assert_eq!(
            on(
                r#"{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"0.4.0","ips":[],"dns":{"x":1.50}}}"#,
                &[("ips", "[1]"), ("pools", "[]")]
            ),
            r#"{"cniVersion":"1.0.0","ips":[1],"dns":{"x":1.50},"pools":[]}"#
        );
        assert_eq!(
            on(
                r#"{"cniVersion":"0.4.0","name":"n","prevResult":{"dns":{}}}"#,
                &[("ips", "[]")]
            ),
            r#"{"cniVersion":"0.4.0","dns":{},"ips":[]}"#
        );
        assert_eq!(
            on(r#"{"cniVersion":"1.1.0","name":"n"}"#, &[("ips", "[]")]),
            r#"{"cniVersion":"1.1.0","ips":[]}"#
        );
    }

    #[test]
    fn a_good_config_is_read() {
        let c = NetConf::parse(GOOD.as_bytes()).unwrap();
        assert_eq!((c.cni_version, c.name.as_str()), ("1.0.0", "n"));
        assert_eq!(c.raw, GOOD.as_bytes());
        assert!(c.object("ipam").unwrap().is_some());
        assert!(c.object("absent").unwrap().is_none());
        let e = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n","ipam":3}"#)
            .unwrap()
            .object("ipam")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid network configuration: \"ipam\" must be an object"
        );
    }

    #[test]
    fn duplicated_keys_read_as_the_last_one() {
        let text = r#"{"cniVersion":"0.2.0","cniVersion":"1.0.0","name":"x","name":"n"}"#;
        let c = NetConf::parse(text.as_bytes()).unwrap();
        assert_eq!((c.cni_version, c.name.as_str()), ("1.0.0", "n"));
    }

    #[test]
    fn not_json_or_not_an_object_is_code_6() {
        for text in [
            "",
            "nope",
            "{",
            "[1]",
            "\"s\"",
            "3",
            "null",
            "{\"a\":1}x",
            "{\"a\":}",
        ] {
            assert_eq!(parse_err(text).code(), code::DECODING_FAILURE, "{text:?}");
        }
        let e = NetConf::parse(b"{\"cniVersion\":\"1.0.0\xff\"}").unwrap_err();
        assert_eq!(e.code(), code::DECODING_FAILURE);
    }

    #[test]
    fn version_missing_unsupported_or_not_a_string_is_code_1_and_shown() {
        let cases = [
            (r#"{}"#, "cniVersion (missing)"),
            (r#"{"cniVersion":"0.2.0"}"#, r#"cniVersion "0.2.0" is"#),
            (r#"{"cniVersion":1}"#, "cniVersion 1 is"),
        ];
        for (text, shown) in cases {
            let e = parse_err(text);
            assert_eq!(e.code(), code::INCOMPATIBLE_VERSION, "{text}");
            assert!(e.to_string().starts_with(shown), "{e}");
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
    fn name_follows_the_specs_rule_for_network_names() {
        for good in ["n", "0", "pods-v4", "a_b.c-d", "x..y"] {
            let text = GOOD.replace(r#""name":"n""#, &format!(r#""name":"{good}""#));
            assert_eq!(NetConf::parse(text.as_bytes()).unwrap().name, good);
        }
        for bad in ["-n", "_n", ".n", "a b", "a/b", "../x", "a:b", "é", "n\\n"] {
            let text = GOOD.replace(r#""name":"n""#, &format!(r#""name":"{bad}""#));
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{bad}");
            assert!(
                e.to_string().contains("must start with a letter or digit"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn other_members_are_copied_exactly_and_prev_result_appended() {
        let input = r#"{"cniVersion":"1.0.0", "name":"n","zeta":1.50,"ipam":{ "delegates":["a"], "big":123456789012345678901234567890, "e":1e3 },"alpha":"\u00e9\ud800","$serde_json::private::Number":"x"}"#;
        assert_eq!(
            spliced(input, r#"{"ips":[], "x":1e3}"#),
            r#"{"cniVersion":"1.0.0","name":"n","zeta":1.50,"ipam":{ "delegates":["a"], "big":123456789012345678901234567890, "e":1e3 },"alpha":"\u00e9\ud800","$serde_json::private::Number":"x","prevResult":{"ips":[], "x":1e3}}"#
        );
    }

    #[test]
    fn numbers_beyond_f64_pass_through_as_written() {
        // Found by fuzzing: valid JSON, out of f64's range, and no business
        // of the plugin's.
        let input = "   {\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"ipam\":{\"delegates\":[\"a\",\"b\"],\n\"4imiiii]]]]]]]iciii.iiiexut\":1E44222222}}";
        let out = spliced(input, "{}");
        assert!(
            out.contains(r#""4imiiii]]]]]]]iciii.iiiexut":1E44222222}"#),
            "{out}"
        );
        serde_json::from_str::<&RawValue>(&out).unwrap();
    }

    #[test]
    fn deep_values_pass_through_unparsed() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let input = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"delegates":["a"]}},"deep":{deep}}}"#
        );
        assert!(spliced(&input, "{}").contains(&deep));
    }

    #[test]
    fn a_runtime_prev_result_is_replaced_in_place_and_duplicates_dropped() {
        let input = r#"{"cniVersion":"1.0.0","prevResult":{"old":1},"name":"n","prevResult":{"old":2},"ipam":{"delegates":["a"]}}"#;
        assert_eq!(
            spliced(input, r#"{"new":true}"#),
            r#"{"cniVersion":"1.0.0","prevResult":{"new":true},"name":"n","ipam":{"delegates":["a"]}}"#
        );
        let first =
            r#"{"prevResult":{},"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["a"]}}"#;
        assert!(spliced(first, "{}").starts_with(r#"{"prevResult":{},"cniVersion""#));
    }

    #[test]
    fn keys_are_re_escaped_as_json() {
        let input =
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["a"]},"q\"k\u0041":0}"#;
        let out = spliced(input, "{}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["q\"kA"], 0);
    }

    #[test]
    fn the_version_for_a_reply_is_the_inputs_or_the_newest() {
        assert_eq!(version_for_reply(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(version_for_reply(br#"{"cniVersion":"9.9.9"}"#), "9.9.9");
        assert_eq!(version_for_reply(b"not json"), NEWEST);
        assert_eq!(version_for_reply(br#"{"cniVersion":4}"#), NEWEST);
        assert_eq!(version_for_reply(b"[]"), NEWEST);
    }
}
