//! An agent's world for the tests: a stack, its conflist, host-local's
//! store and agent mode's state directory, and the command line it runs.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use serde_json::json;

use crate::common::{run_cli, temp_dir, Answer, Env, Outcome, Stack, TempDir};

/// A stack and the files an agent uses: its conflist, host-local's store
/// and agent mode's state directory.
pub struct Agent {
    pub stack: Stack,
    pub conflist: PathBuf,
    pub data: PathBuf,
    pub state: PathBuf,
    _dir: TempDir,
}

impl Agent {
    /// A conflist whose bridge plugin's IPAM is ipam-delegated over `delegates`.
    pub fn new(stack: Stack, delegates: &[&str]) -> Agent {
        let dir = temp_dir("agent");
        let (data, state) = (dir.path().join("data"), dir.path().join("state"));
        let conflist = dir.path().join("agents.conflist");
        let list = json!({
            "cniVersion": "1.0.0",
            "name": "agents",
            "plugins": [
                {"type": "bridge", "bridge": "agents0", "ipam": {
                    "type": "ipam-delegated",
                    "delegates": delegates,
                    "ranges": [[{"subnet": "10.250.77.0/24"}]],
                    "dataDir": data,
                    "stateDir": state,
                }},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        fs::write(&conflist, serde_json::to_string_pretty(&list).unwrap()).unwrap();
        Agent {
            stack,
            conflist,
            data,
            state,
            _dir: dir,
        }
    }

    /// The environment an agent runs with: no CNI_* but CNI_PATH.
    pub fn env(&self) -> Env {
        let env = self.stack.env("ADD");
        Env(env
            .0
            .into_iter()
            .filter(|(k, _)| !k.starts_with("CNI_") || k == "CNI_PATH")
            .collect())
    }

    pub fn run(&self, command: &str, id: &str) -> Outcome {
        self.run_with(command, id, &[])
    }

    pub fn run_with(&self, command: &str, id: &str, more: &[&str]) -> Outcome {
        let config = self.conflist.display().to_string();
        let mut args = vec![command, "--config", &config, "--id", id];
        args.extend(more);
        run_cli(&args, &self.env())
    }

    pub fn ensure(&self, id: &str) -> String {
        let out = self.run("ensure", id);
        assert!(out.status.success(), "{out:?}");
        out.json()["ips"][0]["address"].as_str().unwrap().to_owned()
    }

    pub fn reservations(&self) -> BTreeSet<String> {
        let Ok(entries) = fs::read_dir(self.data.join("agents")) else {
            return BTreeSet::new();
        };
        entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    pub fn state_of(&self, id: &str) -> PathBuf {
        self.state.join("agents").join(format!("{id}:eth0"))
    }
}

/// An agent over one scripted delegate `a` that allocates on ADD.
pub fn fixture_agent() -> Agent {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.1.0","ips":[{"address":"10.250.78.9/24"}]}"#),
    );
    let agent = Agent::new(stack, &["a"]);
    let list = fs::read_to_string(&agent.conflist)
        .unwrap()
        .replace("\"1.0.0\"", "\"1.1.0\"");
    fs::write(&agent.conflist, list).unwrap();
    agent
}
