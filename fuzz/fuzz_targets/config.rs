//! Any stdin: parsing never panics, and a configuration it accepts always
//! becomes, for the delegates after the first, a JSON object holding the
//! result exactly as printed. Values are checked as JSON text, not as
//! numbers: a number too large for f64 is valid JSON, passed on as written.
#![no_main]

use std::collections::HashMap;

use ipam_delegated::cni::version_for_reply;
use ipam_delegated::delegated::config::Config;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

const RESULT: &str = r#"{"fuzz":[1,{"x":null}]}"#;

fuzz_target!(|data: &[u8]| {
    let _ = version_for_reply(data);
    let Ok(config) = Config::parse(data) else {
        return;
    };
    let spliced = config.net.with_prev_result(RESULT.as_bytes());
    let members: HashMap<String, Box<RawValue>> =
        serde_json::from_slice(&spliced).expect("spliced config is a JSON object");
    assert_eq!(members["prevResult"].get(), RESULT);
    assert!(members.contains_key("ipam"));
});
