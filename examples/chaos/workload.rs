//! A node's runtime: ADD, CHECK, DEL and GC through ipam-delegated over
//! [ipam-ds-static, ipam-da-pool], one at a time, as a kubelet would run
//! them: plain containers, containers of sticky workloads that move from
//! node to node as a StatefulSet's pods do (one container of a workload at
//! a time, the next only once the last one's DEL succeeded and the
//! workload has rested a while), and ADDs
//! that ask for an address. A failed or killed ADD is followed by a DEL,
//! retried until it succeeds; a node reclaim fenced tries one more ADD of
//! each kind (which the fence must refuse), is drained (every container
//! deleted) and then readmitted.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::history::{lock, Operation};
use crate::nodes::Node;
use crate::{Rng, World};

/// How long settling may take once every fault is undone.
const SETTLING: Duration = Duration::from_secs(60);

/// The most containers a node runs at once.
const MOST: usize = 24;

/// A container the runtime started, as it knows it.
#[derive(Debug, Clone)]
struct Container {
    id: String,
    workload: Option<String>,
    /// Its ADD's result, if the ADD succeeded.
    result: Option<Value>,
}

/// One node's runtime.
pub struct Runtime<'w> {
    world: &'w World,
    node: &'w Node,
    rng: Rng,
    /// Containers whose ADD succeeded and whose DEL has not started.
    live: Vec<Container>,
    /// Containers to delete: a DEL that failed, or one after a failed ADD.
    doomed: Vec<Container>,
    made: usize,
    /// What went wrong while settling: a DEL, a GC or a readmit that kept
    /// failing once every fault was undone.
    pub trouble: Vec<String>,
}

impl<'w> Runtime<'w> {
    pub fn new(world: &'w World, node: &'w Node, seed: u64) -> Runtime<'w> {
        Runtime {
            world,
            node,
            rng: Rng::new(seed),
            live: Vec::new(),
            doomed: Vec::new(),
            made: 0,
            trouble: Vec::new(),
        }
    }

    /// Runs until the world stops.
    pub fn run(&mut self) {
        while !self.world.stopping() {
            if self.node.fenced.load(Ordering::SeqCst) {
                // A kubelet that has not heard of the fence still starts
                // pods: the fence must refuse each kind of ADD.
                for roll in [0, 5, 9] {
                    self.add_as(roll);
                }
                self.drain_and_readmit(None);
                continue;
            }
            if let Some(container) = self.doomed.first().cloned() {
                if !self.del(&container) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            match self.rng.below(100) {
                0..=39 if self.live.len() < MOST => self.add(),
                0..=59 if !self.live.is_empty() => {
                    let container = self
                        .live
                        .remove(self.rng.below(self.live.len() as u64) as usize);
                    self.del(&container);
                }
                60..=84 if !self.live.is_empty() => {
                    let container =
                        self.live[self.rng.below(self.live.len() as u64) as usize].clone();
                    self.check(&container);
                }
                85..=94 => {
                    self.gc();
                }
                _ => self.add(),
            }
        }
    }

    /// The end of the run, first: every container to delete deleted, the
    /// node readmitted if it is fenced; what keeps failing for a minute is
    /// trouble.
    pub fn settle_dels(&mut self) {
        self.drain_and_readmit(Some(Instant::now() + SETTLING));
    }

    /// The end of the run, last: a GC with the runtime's true list; one
    /// that keeps failing for a minute is trouble.
    pub fn settle_gc(&mut self) {
        let give_up = Instant::now() + SETTLING;
        while !self.gc() {
            if Instant::now() > give_up {
                self.trouble.push(format!(
                    "{}: GC kept failing once the faults were undone",
                    self.node.name
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The live containers, each with the addresses its ADD gave.
    pub fn live(&self) -> Vec<(String, Vec<String>)> {
        self.live
            .iter()
            .map(|c| {
                (
                    c.id.clone(),
                    c.result.as_ref().map(addresses).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Deletes what must be deleted (every container, if the node is
    /// fenced), retrying each DEL until it succeeds; then readmits a
    /// fenced node. While the run goes on (`settling` none), every
    /// container goes and a readmit is tried until the run stops; while
    /// it settles, the live containers of a node not fenced stay, and
    /// what still fails at `settling` is trouble.
    fn drain_and_readmit(&mut self, settling: Option<Instant>) {
        let fenced = self.node.fenced.load(Ordering::SeqCst);
        if fenced || settling.is_none() {
            self.doomed.append(&mut self.live);
        }
        while let Some(container) = self.doomed.first().cloned() {
            if self.del(&container) {
                continue;
            }
            if settling.is_none() && self.world.stopping() {
                // Settling goes on with it.
                return;
            }
            if settling.is_some_and(|end| Instant::now() > end) {
                self.trouble.push(format!(
                    "{}: the DEL of {} kept failing once the faults were undone",
                    self.node.name, container.id
                ));
                self.doomed.retain(|c| c.id != container.id);
                continue;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if !self.node.fenced.load(Ordering::SeqCst) {
            return;
        }
        loop {
            // Never while the fences are read (see faults::see_fences).
            let fencing = lock(&self.world.fencing);
            // The fence is lifted during the command: counted from its start.
            let started = self.world.recorder.now();
            let out = crate::nodes::run(
                self.world.bin.join("ipam-da-pool").to_str().unwrap(),
                &[
                    "readmit",
                    "--config",
                    self.world.operator_config.to_str().unwrap(),
                    "--node",
                    &self.node.name,
                ],
            );
            let said = String::from_utf8_lossy(&out.stderr);
            if out.status.success() || said.contains("is not fenced") {
                self.world
                    .recorder
                    .event_at(started, "readmitted", &self.node.name, "");
                self.node.fenced.store(false, Ordering::SeqCst);
                return;
            }
            drop(fencing);
            match settling {
                // Settling will try again.
                None if self.world.stopping() => return,
                Some(end) if Instant::now() > end => {
                    self.trouble.push(format!(
                        "{} stays fenced once the faults were undone: {}",
                        self.node.name,
                        said.trim()
                    ));
                    return;
                }
                // Not registered yet (its keeper cut off or stopped): later.
                _ => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    }

    /// An ADD of a new container: plain, of a sticky workload that runs
    /// nowhere, or asking for an address.
    fn add(&mut self) {
        let roll = self.rng.below(10);
        self.add_as(roll);
    }

    /// An ADD of a new container as `roll` (below 10) says: below 4 of a
    /// sticky workload (if one runs nowhere), 9 asking for an address,
    /// plain otherwise.
    fn add_as(&mut self, roll: u64) {
        self.made += 1;
        let id = format!("{}-c{}", self.node.name, self.made);
        let mut args = String::from("IgnoreUnknown=1");
        let workload = if roll < 4 {
            self.world.take_workload(&self.node.name, &id)
        } else {
            None
        };
        if let Some(workload) = &workload {
            let (namespace, name) = workload.split_once('/').unwrap_or(("db", workload));
            args.push_str(&format!(
                ";K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
            ));
        } else if roll == 9 {
            args.push_str(&format!(";IP={}", self.world.some_address(&mut self.rng)));
        }
        let container = Container {
            id,
            workload,
            result: None,
        };
        let (ran, stdout) = self.call("ADD", &container, &args, None);
        if ran {
            let result: Value = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
            self.live.push(Container {
                result: Some(result),
                ..container
            });
        } else {
            // Whatever it may have left, its DEL frees.
            self.doomed.push(container);
        }
    }

    /// A DEL of `container`: whether it succeeded (if not, it is doomed
    /// still, to try again).
    fn del(&mut self, container: &Container) -> bool {
        let prev = container.result.clone();
        let (done, _) = self.call("DEL", container, "IgnoreUnknown=1", prev);
        self.doomed.retain(|c| c.id != container.id);
        if done {
            if let Some(workload) = &container.workload {
                // Away for up to twice its stickyFor: back in time for its
                // hold about half the time.
                let rest = self.rng.below(2 * crate::STICKY_FOR * 1_000);
                self.world
                    .free_workload(workload, &self.node.name, &container.id, rest);
            }
        } else {
            self.doomed.push(container.clone());
        }
        done
    }

    fn check(&mut self, container: &Container) {
        let prev = container.result.clone();
        self.call("CHECK", container, "IgnoreUnknown=1", prev);
    }

    /// GC with the runtime's list of live containers: whether it succeeded.
    fn gc(&mut self) -> bool {
        let valid: Vec<Value> = self
            .live
            .iter()
            .map(|c| json!({"containerID": c.id, "ifname": "eth0"}))
            .collect();
        let mut config = self.node.config.clone();
        config["cni.dev/valid-attachments"] = json!(valid);
        let none = Container {
            id: String::new(),
            workload: None,
            result: None,
        };
        self.call_with("GC", &none, "", config).0
    }

    /// Runs `command` for `container` with `args` in CNI_ARGS and `prev`
    /// as prevResult: whether it succeeded, and what it printed.
    fn call(
        &mut self,
        command: &str,
        container: &Container,
        args: &str,
        prev: Option<Value>,
    ) -> (bool, Vec<u8>) {
        let mut config = self.node.config.clone();
        if let Some(prev) = prev {
            config["prevResult"] = prev;
        }
        self.call_with(command, container, args, config)
    }

    fn call_with(
        &mut self,
        command: &str,
        container: &Container,
        args: &str,
        config: Value,
    ) -> (bool, Vec<u8>) {
        let mut env = vec![
            ("CNI_COMMAND", command.to_owned()),
            ("CNI_PATH", self.world.bin.display().to_string()),
        ];
        if command != "GC" {
            env.extend([
                ("CNI_CONTAINERID", container.id.clone()),
                ("CNI_IFNAME", "eth0".to_owned()),
                ("CNI_NETNS", "/var/run/netns/chaos".to_owned()),
            ]);
        }
        if !args.is_empty() {
            env.push(("CNI_ARGS", args.to_owned()));
        }
        let start = self.world.recorder.now();
        let ran = self.node.plugin(
            &self.world.bin.join("ipam-delegated"),
            &env,
            config.to_string().as_bytes(),
        );
        let end = self.world.recorder.now();
        if let Some(kill) = ran.kill {
            let what = if kill.tree {
                "with its delegates"
            } else {
                "alone"
            };
            self.world.recorder.event_at(
                start + kill.after.as_millis() as u64,
                &format!("kill-{}", command.to_lowercase()),
                &self.node.name,
                &format!(
                    "{} after {} ms, {what}",
                    container.id,
                    kill.after.as_millis()
                ),
            );
        }
        let succeeded = ran.status == Some(0);
        let result: Option<Value> = serde_json::from_slice(&ran.stdout).ok();
        self.world.recorder.operation(Operation {
            node: self.node.name.clone(),
            command: command.to_owned(),
            container: container.id.clone(),
            workload: container.workload.clone(),
            start,
            end,
            status: ran.status,
            addresses: match (&result, succeeded && command == "ADD") {
                (Some(result), true) => addresses(result),
                _ => Vec::new(),
            },
            said: if succeeded {
                String::new()
            } else {
                String::from_utf8_lossy(&ran.stdout)
                    .chars()
                    .take(300)
                    .collect()
            },
        });
        if !succeeded {
            // A node cut off fails fast and often: not in a hot loop.
            std::thread::sleep(Duration::from_millis(20));
        }
        (succeeded, ran.stdout)
    }
}

/// The addresses of an ADD result, without their prefix lengths.
pub fn addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .map(|cidr| cidr.split('/').next().unwrap_or(cidr).to_owned())
        .collect()
}

/// Forget `workload`'s binding to a node whose containers cannot be
/// trusted any more (fenced): it may start elsewhere.
pub fn free_on(world: &World, node: &str) -> Vec<String> {
    let mut freed = Vec::new();
    for (workload, placement) in lock(&world.workloads).iter_mut() {
        if placement.running.as_ref().is_some_and(|(n, _)| n == node) {
            placement.running = None;
            freed.push(workload.clone());
        }
    }
    freed
}
