//! Any values of the CNI variables, one per line of input, in any bytes:
//! reading the environment never panics.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use ipam_delegated::cni::Environment;
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_PATH",
    "CNI_ARGS",
];

fuzz_target!(|data: &[u8]| {
    let values: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    let var = |name: &str| {
        let i = NAMES.iter().position(|n| *n == name)?;
        values.get(i).map(|v| OsString::from_vec(v.to_vec()))
    };
    if let Ok(Some(env)) = Environment::from_vars(var) {
        assert!(!env.path.is_empty() || env.command.as_str() == "VERSION");
    }
});
