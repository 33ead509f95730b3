//! A worker's own network namespace, joined to the host by a veth pair, where nftables rules
//! make partitions: `drop` is a silent partition (packets vanish, timeouts fire), `reject with
//! tcp reset` a fast failure. The worker reaches its proxies at the host end of the pair.
//! Dropping the value deletes the namespace, and with it the pair and every rule.

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Whether `tool` is installed: an executable of that name in a folder of the PATH.
pub(crate) fn installed(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// One namespace, named after the orchestrator's pid and the worker's id.
#[derive(Debug)]
pub(crate) struct NetNs {
    name: String,
    host_if: String,
    /// The host end's address, where the worker's proxies listen.
    pub(crate) host_ip: Ipv4Addr,
    cut: bool,
}

fn run(args: &[&str], input: Option<&str>) -> Result<(), String> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetNs {
    /// Creates the namespace of worker `id` (incarnation `inc`), with its veth pair and
    /// addresses.
    pub(crate) fn create(id: usize, inc: u64) -> Result<NetNs, String> {
        let pid = std::process::id();
        // Interface names have at most 15 bytes; the subnet is a /30 per worker.
        let tag = pid % 250;
        let name = format!("distlock-faults-{pid}-{id}-{inc}");
        let host_if = format!("dlf{tag}h{id}");
        let ns_if = format!("dlf{tag}n{id}");
        let octet = u8::try_from(4 * id % 256).map_err(|e| e.to_string())?;
        let host_ip = Ipv4Addr::new(10, 213, tag as u8, octet + 1);
        let ns_ip = Ipv4Addr::new(10, 213, tag as u8, octet + 2);
        // The pair of this worker's previous incarnation (killed), if its namespace is still
        // there: the name is reused.
        let _ = run(&["ip", "link", "del", &host_if], None);
        run(&["ip", "netns", "add", &name], None)?;
        let ns = NetNs {
            name,
            host_if: host_if.clone(),
            host_ip,
            cut: false,
        };
        let host_cidr = format!("{host_ip}/30");
        let ns_cidr = format!("{ns_ip}/30");
        run(
            &[
                "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ],
            None,
        )?;
        run(&["ip", "link", "set", &ns_if, "netns", &ns.name], None)?;
        run(&["ip", "addr", "add", &host_cidr, "dev", &host_if], None)?;
        run(&["ip", "link", "set", &host_if, "up"], None)?;
        ns.exec(&["ip", "addr", "add", &ns_cidr, "dev", &ns_if])?;
        ns.exec(&["ip", "link", "set", &ns_if, "up"])?;
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn exec(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend_from_slice(args);
        run(&all, None)
    }

    /// The command that runs `program` inside the namespace.
    pub(crate) fn command(&self, program: &std::path::Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Cuts the worker off from the proxies on `ports` (every port if empty): `reject` sends
    /// TCP resets, otherwise packets are dropped both ways.
    pub(crate) fn cut(&mut self, ports: &[u16], reject: bool) -> Result<(), String> {
        self.heal()?;
        let host = self.host_ip;
        let ports_match = if ports.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = ports.iter().map(u16::to_string).collect();
            format!("tcp dport {{ {} }} ", list.join(", "))
        };
        let sports_match = ports_match.replace("dport", "sport");
        let verdict = if reject {
            "reject with tcp reset"
        } else {
            "drop"
        };
        let rules = format!(
            "table inet distlock_cut {{\n\
             chain out {{ type filter hook output priority 0; policy accept; \
             ip daddr {host} meta l4proto tcp {ports_match}{verdict}; }}\n\
             chain in {{ type filter hook input priority 0; policy accept; \
             ip saddr {host} meta l4proto tcp {sports_match}drop; }}\n\
             }}\n"
        );
        run(
            &["ip", "netns", "exec", &self.name, "nft", "-f", "-"],
            Some(&rules),
        )?;
        self.cut = true;
        Ok(())
    }

    /// Removes the partition's rules.
    pub(crate) fn heal(&mut self) -> Result<(), String> {
        if self.cut {
            self.exec(&["nft", "delete", "table", "inet", "distlock_cut"])?;
            self.cut = false;
        }
        Ok(())
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The namespace takes its end of the veth pair with it once its last process is gone;
        // the host end is deleted now (which removes the pair as a whole).
        let _ = run(&["ip", "link", "del", &self.host_if], None);
        let _ = run(&["ip", "netns", "del", &self.name], None);
    }
}
