//! kubectl exec and port-forward through the real API server (v1.26, which passes the upgrade
//! through to the kubelet unchanged) to the node's streaming endpoints, each over WebSocket
//! (kubectl 1.32's default: v5.channel.k8s.io, and SPDY tunnelled in WebSocket for
//! port-forward) and over SPDY/3.1 (the fallback, forced with KUBECTL_*_WEBSOCKETS=false).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![
        test(
            "streaming_exec_stdin_output_and_exit_code",
            exec_stdin_output_and_exit_code,
        ),
        test(
            "streaming_port_forward_reaches_a_pod_httpd",
            port_forward_reaches_a_pod_httpd,
        ),
        test("streaming_attach_to_a_stdin_container", attach_to_a_stdin_container),
    ]
}

/// The two ways kubectl 1.32 speaks: its environment for each.
const TRANSPORTS: [(&str, &str); 2] = [("websocket", "true"), ("spdy", "false")];

/// What the node logs for each transport: exec's subprotocol, port-forward's.
fn negotiated(transport: &str) -> (&'static str, &'static str) {
    match transport {
        "websocket" => ("protocol=v5.channel.k8s.io", "protocol=SPDY/3.1+portforward.k8s.io"),
        _ => ("protocol=v4.channel.k8s.io", "protocol=portforward.k8s.io"),
    }
}

fn kubectl(env: &[(&str, &str)], args: &[&str], stdin: Option<&str>) -> Output {
    let c = cluster();
    let mut cmd = c.net.command("kubectl");
    cmd.env("KUBECONFIG", &c.kubeconfig)
        .envs(env.iter().copied())
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("running kubectl");
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// A pod on `node` serving `hello-from-NAME` with busybox httpd on 8080.
fn httpd_pod(name: &str, node: &str) {
    let c = cluster();
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "mkdir -p /www && echo hello-from-{name} > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#
    ));
    c.wait("the pod to run", Duration::from_secs(60), || {
        c.get_json(&["pod", name])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
}

fn exec_stdin_output_and_exit_code() {
    let c = cluster();
    let node = c.node("exec");
    httpd_pod("execed", &node.node);

    // /run through the API server's node proxy: the output, or kubelet's errors.
    let run = |path: &str| kubectl(&[], &["create", "--raw", path, "-f", "-"], Some(""));
    let base = format!("/api/v1/nodes/{}/proxy", node.node);
    let out = run(&format!("{base}/run/default/execed/app?cmd=echo%20hello%20run"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello run\n");
    // kubectl shows a 404 without its body.
    let out = run(&format!("{base}/run/default/nope/app?cmd=true"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&format!("{base}/run/default/execed/nope?cmd=true"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("container not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uid = c.get_json(&["pod", "execed"]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let out = run(&format!("{base}/run/default/execed/{uid}/app?cmd=echo%20by%20uid"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "by uid\n");
    let out = run(&format!("{base}/run/default/execed/not-the-uid/app?cmd=true"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
    for (transport, ws) in TRANSPORTS {
        let env = [("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", ws)];
        // stdin reaches the command and its end ends `cat`.
        let out = kubectl(&env, &["exec", "-i", "execed", "--", "cat"], Some("hi\nthere\n"));
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\nthere\n", "{transport}");

        // stdout and stderr apart, and the exit code as kubectl reports it.
        let out = kubectl(
            &env,
            &["exec", "execed", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
            None,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{transport}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n", "{transport}");
        assert!(stderr.contains("err\n"), "{transport}: {stderr}");
        assert!(
            stderr.contains("command terminated with exit code 3"),
            "{transport}: {stderr}"
        );

        // A command that does not exist: the runtime's error, not a hang.
        let out = kubectl(&env, &["exec", "execed", "--", "/no/such/command"], None);
        assert!(!out.status.success(), "{transport}");

        // A large output arrives whole (many frames, no flow-control stall).
        let out = kubectl(
            &env,
            &[
                "exec",
                "execed",
                "--",
                "sh",
                "-c",
                "head -c 3000000 /dev/zero | tr '\\0' x",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout.len(), 3_000_000, "{transport}");

        // A terminal: kubectl needs one of its own, so it runs under script(1), whose terminal
        // is given a size (its own stdin is no terminal to take one from); kubectl sends it
        // as a resize, which the container's terminal takes (kubectl sends it as the session
        // starts, so the command waits a moment for it, as a shell waits for its user).
        let c = cluster();
        let in_terminal = |shell: &str| {
            c.net
                .command("script")
                .args(["-qec", shell, "/dev/null"])
                .env("KUBECONFIG", &c.kubeconfig)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .output()
                .unwrap()
        };
        let out = in_terminal("stty cols 123 rows 45; kubectl exec -it execed -- sh -c 'tty; sleep 1; stty size'");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{transport}: {text}");
        assert!(text.contains("/dev/pts/"), "{transport}: {text}");
        assert!(text.contains("45 123"), "{transport}: the terminal size: {text:?}");
        // More output than a terminal buffers flows while the command runs.
        let out =
            in_terminal("kubectl exec -t execed -- sh -c 'head -c 200000 /dev/zero | tr \"\\0\" x; echo; echo done'");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{transport}: {}", out.status);
        assert!(
            text.matches('x').count() == 200_000 && text.contains("done"),
            "{transport}: {} bytes of a terminal's output",
            text.len()
        );

        // The transport was the one meant, not a fallback.
        let log = node.agent_log();
        assert!(log.contains(negotiated(transport).0), "{transport}: {log}");
    }
}

/// kubectl attach to a container started with `stdin: true, stdinOnce: true`: what is typed
/// reaches the container, the end of input closes its stdin, the session ends with it.
fn attach_to_a_stdin_container() {
    let c = cluster();
    let node = c.node("attach");
    for (transport, ws) in TRANSPORTS {
        let name = format!("attached-{transport}");
        c.apply(&format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  restartPolicy: Never
  containers:
  - name: app
    image: {IMAGE}
    stdin: true
    stdinOnce: true
    command: [sh, -c, "while read l; do echo got:$l; done; echo bye"]
"#,
            node = node.node
        ));
        c.wait("the pod to run", Duration::from_secs(60), || {
            c.get_json(&["pod", &name])
                .is_some_and(|p| p["status"]["phase"] == "Running")
        });
        let env = [("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", ws)];
        let out = kubectl(&env, &["attach", "-i", &name], Some("a\nb\n"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{transport}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout, "got:a\ngot:b\nbye\n", "{transport}");
        c.wait("the container to end with its stdin", Duration::from_secs(30), || {
            c.get_json(&["pod", &name])
                .is_some_and(|p| p["status"]["phase"] == "Succeeded")
        });
    }
}

/// `kubectl port-forward` running in the test's namespace until dropped.
struct PortForward {
    child: Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl PortForward {
    fn start(env: &[(&str, &str)], pod: &str, local: u16, remote: u16) -> PortForward {
        let c = cluster();
        let mut child = c
            .net
            .command("kubectl")
            .env("KUBECONFIG", &c.kubeconfig)
            .envs(env.iter().copied())
            .args([
                "port-forward",
                "--address",
                "127.0.0.1",
                &format!("pod/{pod}"),
                &format!("{local}:{remote}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl port-forward");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        {
            let (pipe, buf) = (child.stderr.take().unwrap(), stderr.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut b = buf.lock().unwrap();
                    b.push_str(&line);
                    b.push('\n');
                }
            });
        }
        // kubectl prints "Forwarding from 127.0.0.1:LOCAL -> REMOTE" once listening.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut pf = PortForward { child, stderr };
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("Forwarding from") => break,
                Some(Ok(_)) => {}
                _ => {
                    let _ = pf.child.try_wait();
                    panic!("kubectl port-forward did not start: {}", pf.stderr());
                }
            }
            assert!(Instant::now() < deadline, "kubectl port-forward did not start");
        }
        std::thread::spawn(move || for _ in lines {});
        pf
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `curl` from the test's namespace: (success, body).
fn http_get(port: u16) -> (bool, String) {
    let out = cluster()
        .net
        .command("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            &format!("http://127.0.0.1:{port}/index.html"),
        ])
        .output()
        .expect("running curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn port_forward_reaches_a_pod_httpd() {
    let c = cluster();
    let node = c.node("portfwd");
    httpd_pod("forwarded", &node.node);
    for (i, (transport, ws)) in TRANSPORTS.into_iter().enumerate() {
        let env = [("KUBECTL_PORT_FORWARD_WEBSOCKETS", ws)];
        let local = 18080 + i as u16 * 2;
        let pf = PortForward::start(&env, "forwarded", local, 8080);
        // Two connections one after the other: one stream pair each.
        for _ in 0..2 {
            let (ok, body) = http_get(local);
            assert!(ok, "{transport}: {body}\nkubectl: {}", pf.stderr());
            assert_eq!(body, "hello-from-forwarded\n", "{transport}");
        }
        drop(pf);
        let log = node.agent_log();
        assert!(log.contains(negotiated(transport).1), "{transport}: {log}");

        // Nothing listens on 9999: that connection fails with kubelet's message, and the
        // forwarder keeps serving.
        let pf = PortForward::start(&env, "forwarded", local + 1, 9999);
        let (ok, _) = http_get(local + 1);
        assert!(!ok, "{transport}: a connection to a closed port succeeded");
        c.wait("kubectl to report the error", Duration::from_secs(10), || {
            pf.stderr().contains("error forwarding port 9999")
        });
        assert!(
            pf.stderr().contains("an error occurred forwarding"),
            "{transport}: {}",
            pf.stderr()
        );
    }
}
