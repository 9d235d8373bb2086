//! Any exit status and stdout from a delegate: judging them never panics, a
//! result passed on is a JSON object (as text: numbers are not read), and
//! a failure's reply is one CNI error object.
#![no_main]

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use std::collections::HashMap;

use ipam_delegated::cni::{self, Command, Reportable};
use ipam_delegated::delegated::{judge, DelegatedError, Printed};
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((status, stdout)) = data.split_first_chunk::<4>() else {
        return;
    };
    let status = ExitStatus::from_raw(i32::from_le_bytes(*status));
    match judge(Command::Add, status, stdout.to_vec()) {
        Ok(Printed::Object(result)) => {
            // Checked as JSON text: a number beyond f64 is valid JSON.
            let object: HashMap<String, Box<RawValue>> =
                serde_json::from_slice(&result).expect("a result is a JSON object");
            drop(object);
        }
        Ok(Printed::Nothing) => {}
        Ok(Printed::Ignored { .. }) => panic!("ADD never ignores what it printed"),
        Err(failure) => {
            let error = DelegatedError::Failed {
                delegate: "fuzzed".into(),
                command: Command::Add,
                failure,
            };
            let object =
                cni::error_object("1.1.0", error.code(), &error.to_string(), &error.details());
            let reply: Value = serde_json::from_slice(&object).expect("reply is JSON");
            assert!(reply["code"].as_u64().is_some_and(|c| c > 0));
        }
    }
});
