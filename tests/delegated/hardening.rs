//! Whatever a delegate does, the plugin answers with one CNI error object,
//! in bounded time, with everything it started undone: delegates that hang
//! (leaving children behind), that are the plugin itself, that die, and a
//! runtime that asks the plugin to stop. Time bounds are generous: seconds
//! where the work takes milliseconds.

use crate::common;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{config, run_plugin, Answer, Outcome, Stack, PLUGIN};
use serde_json::json;

/// A result the scripted delegates print.
fn result(name: &str) -> String {
    json!({"cniVersion": "1.0.0", "ips": [], "by": name}).to_string()
}

/// A config for `delegates` with `ipam.timeout` set to `seconds`.
fn with_timeout(delegates: &[&str], seconds: f64) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "ipam": {"type": "ipam-delegated", "delegates": delegates, "timeout": seconds},
    })
    .to_string()
}

/// Hangs, with a child of its own that holds the inherited stderr: what
/// keeps a Go runtime waiting after the plugin has exited, unless the
/// whole process group is killed.
const HANG_WITH_CHILD: &str = "sleep 300 &\nsleep 300\n";

/// Runs the plugin and returns its outcome and how long it took.
fn timed(stack: &Stack, command: &str, input: &str) -> (Outcome, Duration) {
    let started = Instant::now();
    let out = stack.run(command, input.as_bytes());
    (out, started.elapsed())
}

#[test]
fn a_hanging_delegate_is_killed_with_its_children_and_the_add_rolled_back() {
    let stack = Stack::of(&["a", "hangs"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("hangs", "ADD", Answer::default().after(HANG_WITH_CHILD));
    // The run returns only once the plugin's stderr closes: a surviving
    // grandchild would hold it for 300 s.
    let (out, took) = timed(&stack, "ADD", &with_timeout(&["a", "hangs"], 1.0));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let error = out.assert_error(11);
    assert_eq!(
        error["msg"],
        "hangs (ADD): did not finish within 1s and was killed"
    );
    assert_eq!(
        stack.call_list(),
        ["a ADD", "hangs ADD", "a DEL", "hangs DEL"]
    );
}

#[test]
fn rollback_dels_are_bounded_too() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("a", "DEL", Answer::default().after(HANG_WITH_CHILD));
    stack.answer(
        "b",
        "ADD",
        Answer::fails(1, r#"{"code":11,"msg":"no lease"}"#),
    );
    let (out, took) = timed(&stack, "ADD", &with_timeout(&["a", "b"], 0.5));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let error = out.assert_error(11);
    assert_eq!(error["msg"], "no lease");
    let details = error["details"].as_str().unwrap();
    assert!(
        details.contains("- a (DEL): did not finish within 500ms and was killed"),
        "{details}"
    );
    assert_eq!(stack.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
}

#[test]
fn del_check_gc_and_status_are_bounded() {
    for command in ["DEL", "CHECK", "GC", "STATUS"] {
        let stack = Stack::of(&["hangs", "b"]);
        stack.answer("hangs", command, Answer::default().after(HANG_WITH_CHILD));
        let input = common::with_state_dir(
            &stack,
            &with_timeout(&["hangs", "b"], 0.5).replace("1.0.0", "1.1.0"),
        );
        let env = stack.env(command);
        let started = Instant::now();
        let out = run_plugin(&env, input.as_bytes());
        assert!(started.elapsed() < Duration::from_secs(20), "{command}");
        let error = out.assert_error(11);
        assert!(error["msg"]
            .as_str()
            .unwrap()
            .starts_with(&format!("hangs ({command}): did not finish")));
        // DEL and GC go on to the next delegate; CHECK and STATUS stop.
        let expected_b = matches!(command, "DEL" | "GC");
        assert_eq!(
            stack.call_list().len(),
            if expected_b { 2 } else { 1 },
            "{command}"
        );
    }
}

#[test]
fn a_delegate_that_never_reads_a_large_stdin_is_bounded() {
    let stack = Stack::new();
    stack.file("deaf", "#!/bin/sh\nexec sleep 300\n", 0o755);
    let input = json!({
        "cniVersion": "1.0.0",
        "name": "n",
        "ipam": {"delegates": ["deaf"], "timeout": 1, "blob": "x".repeat(4 << 20)},
    })
    .to_string();
    let (out, took) = timed(&stack, "ADD", &input);
    assert!(took < Duration::from_secs(20), "took {took:?}");
    out.assert_error(11);
}

#[test]
fn a_bad_timeout_is_code_7_and_runs_nothing() {
    for bad in [
        json!(0),
        json!(-2),
        json!("5"),
        json!(null),
        json!([1]),
        json!(1e19),
        json!(1e-300),
    ] {
        let stack = Stack::of(&["a"]);
        let input = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"delegates": ["a"], "timeout": bad}});
        let error = stack
            .run("ADD", input.to_string().as_bytes())
            .assert_error(7);
        assert!(
            error["msg"].as_str().unwrap().contains("\"ipam.timeout\""),
            "{error}"
        );
        assert!(stack.calls().is_empty());
    }
}

/// Starts the plugin without waiting for it.
fn spawn(stack: &Stack, command: &str, input: &str) -> Child {
    common::start_plugin(&stack.env(command), input.as_bytes(), Stdio::piped())
}

/// Waits until the scripted delegates have recorded `n` calls.
fn wait_for_calls(stack: &Stack, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stack.calls().len() < n {
        assert!(Instant::now() < deadline, "only {:?}", stack.call_list());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_or_sigint_during_add_stops_the_delegate_and_rolls_back() {
    for signal in ["TERM", "INT"] {
        let stack = Stack::of(&["a", "hangs", "c"]);
        stack.answer("a", "ADD", Answer::prints(result("a")));
        stack.answer("hangs", "ADD", Answer::default().after(HANG_WITH_CHILD));
        let child = spawn(&stack, "ADD", &config("1.0.0", &["a", "hangs", "c"]));
        wait_for_calls(&stack, 2);
        terminate(&child, signal);
        let error = finish(child).assert_error(105);
        let msg = error["msg"].as_str().unwrap();
        assert!(
            msg.starts_with("hangs (ADD): was stopped: the plugin received signal"),
            "{msg}"
        );
        // c never ran; a and the stopped delegate were deleted, in order.
        assert_eq!(
            stack.call_list(),
            ["a ADD", "hangs ADD", "a DEL", "hangs DEL"],
            "{signal}"
        );
    }
}

#[test]
fn sigterm_during_del_stops_it_and_starts_no_further_delegate() {
    let stack = Stack::of(&["hangs"]);
    // b cannot even start: had the plugin tried, the error would say so.
    stack.file("b", "\u{7f}ELF not really\n", 0o755);
    stack.answer("hangs", "DEL", Answer::default().after(HANG_WITH_CHILD));
    let child = spawn(&stack, "DEL", &config("1.0.0", &["hangs", "b"]));
    wait_for_calls(&stack, 1);
    terminate(&child, "TERM");
    let error = finish(child).assert_error(105);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .starts_with("hangs (DEL): was stopped"),
        "{error}"
    );
    let details = error["details"].as_str().unwrap();
    assert!(
        details.contains("- b (DEL): was not run: the plugin had received signal 15"),
        "{details}"
    );
    assert_eq!(stack.call_list(), ["hangs DEL"]);
}

#[test]
fn a_second_signal_cuts_a_hanging_rollback_short() {
    let stack = Stack::of(&["a", "hangs"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("a", "DEL", Answer::default().after(HANG_WITH_CHILD));
    stack.answer("hangs", "ADD", Answer::default().after(HANG_WITH_CHILD));
    let child = spawn(&stack, "ADD", &config("1.0.0", &["a", "hangs"]));
    wait_for_calls(&stack, 2);
    // The first request stops the ADD; the rollback's DEL on a hangs …
    terminate(&child, "TERM");
    wait_for_calls(&stack, 3);
    // … and a second request stops that too, and the DEL still to come.
    terminate(&child, "INT");
    let error = finish(child).assert_error(105);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .starts_with("hangs (ADD): was stopped"),
        "{error}"
    );
    let details = error["details"].as_str().unwrap();
    assert!(
        details.contains("- a (DEL): was stopped: the plugin received signal 2"),
        "{details}"
    );
    assert!(details.contains("- hangs (DEL): was not run"), "{details}");
    assert_eq!(stack.call_list(), ["a ADD", "hangs ADD", "a DEL"]);
}

#[test]
fn a_signal_while_stdin_is_still_open_is_answered_at_once() {
    // Whatever the command, and even when the environment is wrong: the
    // answer comes at once, with the code it would have had.
    for (signal, command, unset, code) in [
        ("TERM", "ADD", "", 105),
        ("INT", "ADD", "", 105),
        ("TERM", "VERSION", "", 105),
        ("TERM", "DEL", "CNI_PATH", 4),
    ] {
        let stack = Stack::of(&["a"]);
        stack.answer("a", "ADD", Answer::prints(result("a")));
        let mut child = Command::new(PLUGIN)
            .env_clear()
            .envs(stack.env(command).unset(unset).0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Half a configuration, and the runtime never closes stdin: the
        // plugin has taken the signals over and is waiting for the rest.
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(br#"{"cniVersion":"1.0.0","#).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        terminate(&child, signal);
        // Closed after 5 s all the same, so that a plugin that cannot be
        // stopped fails this test rather than hanging it.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(5));
            drop(stdin);
        });
        let out = finish(child);
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "took {:?}",
            asked.elapsed()
        );
        let error = out.assert_error(code);
        let msg = error["msg"].as_str().unwrap();
        if code == 105 {
            assert!(
                msg.contains("while reading the network configuration from stdin"),
                "{msg}"
            );
        }
        assert!(stack.calls().is_empty(), "{:?}", stack.call_list());
    }
}

#[test]
fn a_delegate_flooding_stdout_and_staying_alive_is_killed() {
    let stack = Stack::of(&["floods"]);
    // 5 MiB, then it would linger for 5 minutes: only a kill ends it soon.
    let flood = "head -c 5242880 /dev/zero | tr '\\0' ' '\nexec sleep 300\n";
    stack.answer("floods", "ADD", Answer::default().after(flood));
    let (out, took) = timed(&stack, "ADD", &config("1.0.0", &["floods"]));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    out.assert_error(104);
    assert_eq!(stack.call_list(), ["floods ADD", "floods DEL"]);
}

#[test]
fn a_child_left_holding_stderr_or_stdout_does_not_hold_the_plugin() {
    // Each delegate succeeds at once but leaves a child behind holding one
    // of its pipes: the plugin's own pipe, not the runtime's, for stderr;
    // for stdout, everything the delegate printed is in it already.
    for (holds, snippet) in [
        ("stderr", "sleep 8 >/dev/null &\n"),
        ("stdout", "sleep 8 2>/dev/null &\n"),
    ] {
        let stack = Stack::of(&["lingers"]);
        stack.answer(
            "lingers",
            "ADD",
            Answer {
                stderr: Some("lingers: one line\nand a last one without its newline".into()),
                ..Answer::prints(result("lingers")).after(snippet)
            },
        );
        // The run ends once both of the plugin's pipes close.
        let (out, took) = timed(&stack, "ADD", &config("1.0.0", &["lingers"]));
        assert!(took < Duration::from_secs(5), "{holds}: took {took:?}");
        assert!(out.status.success(), "{holds}: {out:?}");
        assert_eq!(out.json()["by"], "lingers", "{holds}");
        assert!(
            out.stderr
                .contains("lingers: one line\nand a last one without its newline\n"),
            "{holds}: {}",
            out.stderr
        );
    }
}

#[test]
fn a_first_signal_lets_the_running_delegate_finish_then_undoes_the_add() {
    // b takes a while after the request comes: it is not killed mid-way
    // (a torn reservation could be left), c is not started, and the ADD
    // is rolled back, b included.
    for (names, answer) in [
        (
            &["a", "b", "c"][..],
            "c (ADD): was not run: the plugin had received signal 15",
        ),
        (
            &["a", "b"][..],
            "b (ADD): finished after the plugin received signal 15; its ADD is undone",
        ),
    ] {
        let stack = Stack::of(names);
        let rec = stack.rec().display().to_string();
        stack.answer("a", "ADD", Answer::prints(result("a")));
        stack.answer(
            "b",
            "ADD",
            Answer::prints(result("b")).after(&format!("sleep 0.7\ntouch {rec}/b-finished\n")),
        );
        let child = spawn(&stack, "ADD", &config("1.0.0", names));
        wait_for_calls(&stack, 2);
        terminate(&child, "TERM");
        let error = finish(child).assert_error(105);
        assert_eq!(error["msg"], answer);
        assert!(stack.rec().join("b-finished").exists(), "b was cut short");
        assert_eq!(stack.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
    }
}

#[test]
fn the_grace_after_a_signal_ends_at_the_calls_deadline() {
    let stack = Stack::of(&["a", "hangs"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("hangs", "ADD", Answer::default().after(HANG_WITH_CHILD));
    let started = Instant::now();
    let child = spawn(&stack, "ADD", &with_timeout(&["a", "hangs"], 2.0));
    wait_for_calls(&stack, 2);
    // 1.5 s into a 2 s call: the grace would run to 3.5 s if the
    // deadline did not still stand.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(started.elapsed()));
    terminate(&child, "TERM");
    let error = finish(child).assert_error(105);
    assert!(
        started.elapsed() < Duration::from_millis(3300),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        error["msg"],
        "hangs (ADD): was stopped: the plugin received signal 15"
    );
}

#[test]
fn a_plugin_killed_outright_takes_its_running_gc_down() {
    // A runtime that gives up kills the plugin alone, with SIGKILL. A GC's
    // delegate that ran on would free what ADDs made after the list it
    // was given; it is asked to stop as if the plugin had been. (An ADD's
    // runs on, to finish its write: see the next test.)
    let stack = Stack::of(&["a"]);
    let rec = stack.rec().display().to_string();
    let stopped = stack.rec().join("a-stopped");
    stack.answer(
        "a",
        "GC",
        Answer::default().after(&format!(
            "trap 'touch {rec}/a-stopped; kill $!; exit 143' TERM\ntouch {rec}/a-ready\nsleep 30 &\nwait\n"
        )),
    );
    let input = common::with_state_dir(
        &stack,
        &with_timeout(&["a"], 20.0).replace("1.0.0", "1.1.0"),
    );
    let child = spawn(&stack, "GC", &input);
    let ready = stack.rec().join("a-ready");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the delegate never set its trap");
        std::thread::sleep(Duration::from_millis(20));
    }
    terminate(&child, "KILL");
    let killed = finish(child);
    assert!(!killed.status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stopped.exists() {
        assert!(Instant::now() < deadline, "the delegate ran on");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_plugin_killed_outright_lets_its_running_add_finish() {
    // Cut short, a delegate could leave a reservation half-written that
    // nothing frees; finished, what it made is the runtime's DEL's.
    let stack = Stack::of(&["a"]);
    let rec = stack.rec().display().to_string();
    stack.answer(
        "a",
        "ADD",
        Answer::prints(result("a")).after(&format!(
            "touch {rec}/a-ready\nsleep 0.5\ntouch {rec}/a-finished\n"
        )),
    );
    let child = spawn(&stack, "ADD", &with_timeout(&["a"], 20.0));
    let (ready, finished) = (stack.rec().join("a-ready"), stack.rec().join("a-finished"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the delegate never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    terminate(&child, "KILL");
    assert!(!finish(child).status.success());
    while !finished.exists() {
        assert!(Instant::now() < deadline, "the delegate was cut short");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_signal_kills_the_running_delegate_at_once() {
    let stack = Stack::of(&["a", "hangs"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("hangs", "ADD", Answer::default().after(HANG_WITH_CHILD));
    let child = spawn(&stack, "ADD", &config("1.0.0", &["a", "hangs"]));
    wait_for_calls(&stack, 2);
    let asked = Instant::now();
    terminate(&child, "TERM");
    std::thread::sleep(Duration::from_millis(100));
    terminate(&child, "INT");
    let error = finish(child).assert_error(105);
    // Well within the grace a first request gives.
    assert!(
        asked.elapsed() < Duration::from_millis(1500),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        error["msg"],
        "hangs (ADD): was stopped: the plugin received signal 2"
    );
}

#[test]
fn a_timeout_sends_sigterm_first_then_sigkill() {
    // One delegate finishes its work on SIGTERM; one ignores it and is
    // killed all the same.
    let stack = Stack::of(&["cleans-up", "ignores-term"]);
    let rec = stack.rec().display().to_string();
    stack.answer(
        "cleans-up",
        "ADD",
        Answer::default().after(&format!(
            "trap 'touch {rec}/got-term; exit 1' TERM\nsleep 300 &\nwait\n"
        )),
    );
    stack.answer(
        "ignores-term",
        "ADD",
        Answer::default().after("trap '' TERM\nsleep 300\n"),
    );
    let (out, took) = timed(&stack, "ADD", &with_timeout(&["cleans-up"], 0.3));
    out.assert_error(11);
    assert!(stack.rec().join("got-term").exists(), "no SIGTERM first");
    assert!(took < Duration::from_secs(3), "took {took:?}");

    let (out, took) = timed(&stack, "ADD", &with_timeout(&["ignores-term"], 0.3));
    let error = out.assert_error(11);
    assert_eq!(
        error["msg"],
        "ignores-term (ADD): did not finish within 300ms and was killed"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn delegates_start_with_termination_unblocked_and_sigpipe_at_its_default() {
    // Not a shell: sh clears the signal mask it inherits, so only a program
    // that keeps it shows whether the plugin's block on SIGTERM and SIGINT
    // (taken through its signalfd) leaks into the delegates.
    let stack = Stack::new();
    let rec = stack.rec().display().to_string();
    stack.file(
        "perl-delegate",
        &format!(
            r#"#!/usr/bin/perl
open(my $in, "<", "/proc/self/status") or die;
open(my $out, ">", "{rec}/status") or die;
print $out grep {{ /^Sig(Blk|Ign):/ }} <$in>;
close($out);
$SIG{{TERM}} = sub {{ open(my $f, ">", "{rec}/got-term"); exit 1; }};
sleep 300;
"#
        ),
        0o755,
    );
    // Long enough for perl to have set its handler on a loaded machine.
    let (out, took) = timed(&stack, "ADD", &with_timeout(&["perl-delegate"], 1.0));
    out.assert_error(11);
    let status = std::fs::read_to_string(stack.rec().join("status")).unwrap();
    let mask = |field: &str| {
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
    };
    assert_eq!(mask("SigBlk:"), 0, "{status}");
    let sigpipe = 1 << (libc::SIGPIPE - 1);
    assert_eq!(mask("SigIgn:") & sigpipe, 0, "SIGPIPE ignored: {status}");
    assert!(stack.rec().join("got-term").exists(), "no SIGTERM seen");
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

/// Sends `signal` to the plugin.
fn terminate(child: &Child, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status();
    assert!(sent.unwrap().success());
}

/// Waits for the plugin, within a generous bound.
fn finish(child: Child) -> Outcome {
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    Outcome {
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn a_runtime_that_ignores_sigchld_does_not_lose_the_delegates_exit() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("b", "ADD", Answer::fails(3, ""));
    // An ignored SIGCHLD survives exec; the kernel would then reap
    // delegates itself, and their exit statuses would be lost. (bash, as
    // dash does not really ignore it.)
    let out = Command::new("bash")
        .args(["-c", "trap '' CHLD; exec \"$0\"", PLUGIN])
        .env_clear()
        .envs(stack.env("ADD").0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(config("1.0.0", &["a", "b"]).as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["code"], 102, "{error}");
    assert_eq!(
        error["msg"],
        "b (ADD): exited with status 3 and no CNI error object"
    );
    assert_eq!(stack.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
}

#[test]
fn a_stack_naming_the_plugin_by_a_link_fails_before_running_anything() {
    let stack = Stack::of(&["a"]);
    stack.link("ipam-ds-loop", Path::new(PLUGIN));
    for command in ["ADD", "CHECK"] {
        let error = stack
            .run(command, config("1.0.0", &["a", "ipam-ds-loop"]).as_bytes())
            .assert_error(7);
        let msg = error["msg"].as_str().unwrap();
        assert!(
            msg.starts_with("delegate \"ipam-ds-loop\" is ipam-delegated itself"),
            "{msg}"
        );
        assert!(stack.calls().is_empty(), "{command}");
    }
    // DEL still runs the others.
    stack
        .run("DEL", config("1.0.0", &["a", "ipam-ds-loop"]).as_bytes())
        .assert_error(7);
    assert_eq!(stack.call_list(), ["a DEL"]);
}

#[test]
fn a_stack_naming_a_copy_of_the_plugin_fails_fast_and_rolls_back() {
    let stack = Stack::of(&["a"]);
    std::fs::copy(PLUGIN, stack.bin().join("ipam-da-copy")).unwrap();
    stack.answer("a", "ADD", Answer::prints(result("a")));
    let (out, took) = timed(&stack, "ADD", &config("1.0.0", &["a", "ipam-da-copy"]));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let error = out.assert_error(7);
    let msg = error["msg"].as_str().unwrap();
    assert!(
        msg.starts_with("ipam-delegated was started as a delegate of ipam-delegated"),
        "{msg}"
    );
    // The copy refused at once, on ADD and on its rollback DEL: two
    // processes at most, never a chain of them. Its DEL was refused for
    // the ADD's own reason, which the details do not repeat.
    assert_eq!(stack.call_list(), ["a ADD", "a DEL"]);
    assert_eq!(error["details"], "", "{error}");
}

#[test]
fn delegates_are_told_who_started_them() {
    let stack = Stack::of(&["a"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    let child = spawn(&stack, "ADD", &config("1.0.0", &["a"]));
    let pid = child.id().to_string();
    assert!(child.wait_with_output().unwrap().status.success());
    let env = stack.env_of(&stack.calls()[0]);
    assert_eq!(env.get("IPAM_DELEGATED_PARENT"), Some(&pid));
}

/// The two ways a reply cannot reach the runtime: a full device, and a
/// pipe whose reading end is closed.
fn unwritable_stdouts() -> Vec<(&'static str, Stdio)> {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    vec![("/dev/full", full.into()), ("a closed pipe", writer.into())]
}

#[test]
fn an_add_whose_result_cannot_be_written_is_undone() {
    for (what, stdout) in unwritable_stdouts() {
        let stack = Stack::of(&["a", "b"]);
        stack.answer("a", "ADD", Answer::prints(result("a")));
        stack.answer("b", "ADD", Answer::prints(result("b")));
        let input = config("1.0.0", &["a", "b"]);
        let (status, stderr) = common::run_plugin_to(&stack.env("ADD"), input.as_bytes(), stdout);
        assert!(!status.success(), "{what}");
        assert!(stderr.contains("could not be written"), "{what}: {stderr}");
        // Undone as a runtime's DEL would: every delegate, with the result.
        assert_eq!(
            stack.call_list(),
            ["a ADD", "b ADD", "a DEL", "b DEL"],
            "{what}"
        );
        let calls = stack.calls();
        assert_eq!(
            stack.stdin_of(&calls[2]),
            common::with_prev(&input, &result("b")),
            "{what}"
        );
    }
}

#[test]
fn an_empty_parent_variable_does_not_make_the_plugin_refuse() {
    let stack = Stack::of(&["a"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    let env = stack.env("ADD").set("IPAM_DELEGATED_PARENT", "");
    let out = run_plugin(&env, config("1.0.0", &["a"]).as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["by"], "a");
}

#[test]
fn a_file_that_is_not_a_program_is_named() {
    let stack = Stack::new();
    stack.file("garbage", "\u{7f}ELF not really\n", 0o755);
    let error = stack
        .run("ADD", config("1.0.0", &["garbage"]).as_bytes())
        .assert_error(101);
    assert!(error["msg"]
        .as_str()
        .unwrap()
        .starts_with("garbage (ADD): could not be started"));
}

#[test]
fn deep_and_huge_values_pass_through_and_deep_garbage_is_code_6() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result("a")));
    stack.answer("b", "ADD", Answer::prints(result("b")));
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let input = format!(
        r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"delegates":["a","b"],"deep":{deep}}},"huge":1e99999,"big":123456789012345678901234567890}}"#
    );
    let out = stack.run("ADD", input.as_bytes());
    assert!(out.status.success(), "{}", out.stderr);
    let second = String::from_utf8(stack.stdin_of(&stack.calls()[1])).unwrap();
    assert!(
        second.contains(&deep)
            && second.contains(r#""huge":1e99999,"big":123456789012345678901234567890"#)
    );

    let garbage = "[".repeat(1_000_000);
    stack.run("ADD", garbage.as_bytes()).assert_error(6);
    stack
        .run("ADD", b"{\"cniVersion\":1e99999}")
        .assert_error(1);
}
