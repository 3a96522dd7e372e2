//! Nodes: a namespace on the underlay bridge, running an agent. Adding one
//! (at `lab up` or later, in Kubernetes mode also without an agent, with
//! the CNI files an agent would write), waiting until it is ready, and
//! stopping, restarting or removing its agent or the whole node.

use std::process::Command;
use std::time::{Duration, Instant};

use podnet_kernel::{Handle, Netns};

use crate::daemon::agent_caps;
use crate::error::{io, msg, LabError};
use crate::process::wait_gone;
use crate::state::{Lab, LabState, NodeInfo};
use crate::{gateway, kube, kubelet, router};

impl Lab {
    /// Node `node` of state `st`, or an error naming it.
    pub(crate) fn node_in(&self, st: &LabState, node: &str) -> Result<NodeInfo, LabError> {
        st.nodes
            .iter()
            .find(|n| n.name == node)
            .cloned()
            .ok_or_else(|| msg(format!("no node {node:?} in lab {}", self.name)))
    }

    /// A kube lab's new node joins the cluster: its Node object, the
    /// agent's kubeconfig that works inside its namespace (agent or not),
    /// and the API server's forwarder into it.
    pub(crate) async fn join_kube_node(
        &self,
        c: &::kube::Client,
        cp: &kube::ControlPlane,
        st: &LabState,
        n: &NodeInfo,
    ) -> Result<(), LabError> {
        kubelet::register_node(c, &n.name, n.ip).await?;
        cp.write_service_account_kubeconfig(
            c,
            kube::AGENT_ACCOUNT,
            Some(&n.name),
            &self.node_kubeconfig(&n.name),
        )
        .await?;
        self.ensure_forwarder(st, &format!("forward-{}", n.name), &n.netns)
    }
    pub(crate) fn start_agent(&self, st: &LabState, node: &NodeInfo) -> Result<(), LabError> {
        // An etcd on this machine's loopback is reached through a forwarder.
        self.ensure_forwarder(st, &format!("forward-{}", node.name), &node.netns)?;
        self.spawn_daemon(
            &format!("agent-{}", node.name),
            Some(&node.netns),
            &self.agent_args(st, node),
            agent_caps(st),
        )?;
        Ok(())
    }

    /// Adds one node: its namespace, its underlay link, its agent.
    pub(crate) fn add_node_ns(
        &self,
        st: &mut LabState,
        index: usize,
    ) -> Result<NodeInfo, LabError> {
        let name = format!("node{index}");
        let netns = self.ns_name(&name);
        let rack = gateway::rack_of(st.racks, index);
        let ip = gateway::node_ip_in(rack, index)?;
        let ns = Netns::create_named(&netns)?;
        let under = Netns::named(&st.underlay_ns)?;
        let mut uh = Handle::in_netns(&under)?;
        let port = format!("to-{name}");
        uh.create_veth(&port, "eth0", Some(ns.fd()), None, None)?;
        let br = uh.require_link(&gateway::bridge(rack))?;
        let p = uh.require_link(&port)?;
        uh.set_master(p.index, br.index)?;
        uh.set_up(p.index)?;
        let mut nh = Handle::in_netns(&ns)?;
        let e = nh.require_link("eth0")?;
        nh.add_addr(
            e.index,
            ipnet::IpNet::V4(
                ipnet::Ipv4Net::new(ip, gateway::underlay().prefix_len()).expect("prefix"),
            ),
            true,
        )?;
        if st.dual_stack {
            let ip6 = gateway::twin6(ip);
            let net6 = ipnet::Ipv6Net::new(ip6, 64).expect("prefix");
            nh.add_addr(e.index, ipnet::IpNet::V6(net6), true)?;
        }
        nh.set_up(e.index)?;
        // As on a real node, what nothing here handles leaves by default:
        // rack 1 to the gateway, rack 2 to the router (its only way out);
        // with two racks, rack 1 reaches rack 2 through the router.
        if rack == 1 {
            nh.add_route(&gateway::default_route(e.index))?;
            if st.dual_stack {
                // (The router between racks is IPv4 only.)
                nh.add_route(&gateway::default_route6(e.index))?;
            }
            if st.racks > 1 {
                nh.add_route(&router::route_to_rack(2, e.index))?;
            }
        } else {
            nh.add_route(&router::default_route(rack, e.index))?;
        }
        std::fs::create_dir_all(self.node_dir(&name)).map_err(|e| io("creating node dir", e))?;
        let info = NodeInfo { name, netns, ip };
        st.nodes.push(info.clone());
        Ok(info)
    }

    /// Waits until `node` has its subnet.env and routes to every other node.
    pub(crate) fn wait_node_ready(
        &self,
        st: &LabState,
        node: &NodeInfo,
        deadline: Instant,
    ) -> Result<(), LabError> {
        // The userspace tunnels route the whole network into their device.
        let want = if st.backend == "udp" || st.encrypt {
            1
        } else {
            st.nodes.len().saturating_sub(1)
        };
        loop {
            let env_ok = self.node_dir(&node.name).join("subnet.env").exists();
            let routes = Netns::named(&node.netns)?.run(
                || -> Result<usize, podnet_kernel::KernelError> {
                    let mut h = Handle::new()?;
                    Ok(h.routes(false, None)?
                        .into_iter()
                        .filter(|r| r.protocol == Some(112))
                        .count())
                },
            )??;
            if env_ok && routes >= want {
                return Ok(());
            }
            // In Kubernetes mode an agent that exits says why at once (the
            // daemons' --kubeconfig support may lag the lab's).
            if st.kube && !self.role_alive(&format!("agent-{}", node.name)) {
                return Err(msg(format!(
                    "the agent on {} exited; see {}",
                    node.name,
                    self.log_path(&format!("agent-{}", node.name)).display()
                )));
            }
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "node {} not ready after waiting (subnet.env: {env_ok}, routes {routes}/{want}); see {}",
                    node.name,
                    self.log_path(&format!("agent-{}", node.name)).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What a node's agent writes for the CNI side (subnet.env and the
    /// conflist), written by the lab for a node that runs no agent.
    pub(crate) fn write_cni_files(
        &self,
        node: &NodeInfo,
        subnet: ipnet::Ipv4Net,
    ) -> Result<(), LabError> {
        use podnet_overlay::files;
        let d = self.node_dir(&node.name);
        let network: ipnet::Ipv4Net = kube::CLUSTER_CIDR.parse().expect("cluster CIDR");
        let subnet_file = d.join("subnet.env");
        files::write_if_changed(
            &subnet_file,
            &files::subnet_env(network, subnet, 1450, true, None),
        )
        .map_err(|e| io(format!("writing {}", subnet_file.display()), e))?;
        let mut list = files::conflist(&subnet_file, Some(&d.join("cni")));
        // No agent runs here (yet): ADD must not wait for one. The agent,
        // once started, writes its own conflist, which requires it.
        list["plugins"][0]["requireAgent"] = serde_json::json!(false);
        let p = d.join("net.d").join(files::CONFLIST_NAME);
        files::write_if_changed(&p, &serde_json::to_string_pretty(&list).expect("json"))
            .map_err(|e| io(format!("writing {}", p.display()), e))?;
        Ok(())
    }

    /// Adds a node to a running lab.
    pub fn add_node(&self) -> Result<NodeInfo, LabError> {
        let mut st = self.state()?;
        if st.kube {
            return Err(msg("add-node is not supported in a --kube lab yet"));
        }
        let next = next_node_index(&st);
        let n = self.add_node_ns(&mut st, next)?;
        self.save(&st)?;
        self.start_agent(&st, &n)?;
        self.wait_node_ready(&st, &n, Instant::now() + Duration::from_secs(30))?;
        Ok(n)
    }

    /// Kubernetes mode: adds a node with no network daemon yet, as a
    /// kubelet joins a cluster: its namespace and underlay link, its Node
    /// object, its kubeconfig and forwarder, and (once kube-controller-
    /// manager gave it a podCIDR) the CNI files a daemon would write, so
    /// pods can start on it. The caller then starts the node's network
    /// daemon (`restart_agent`, or another one such as flanneld) and times
    /// how soon the node's pods are reachable (`flannel-bench`).
    pub async fn add_kube_node_without_agent(&self) -> Result<NodeInfo, LabError> {
        let mut st = self.state()?;
        if !st.kube {
            return Err(msg("add_kube_node_without_agent: a --kube lab only"));
        }
        let next = next_node_index(&st);
        let n = self.add_node_ns(&mut st, next)?;
        self.save(&st)?;
        let cp = kube::ControlPlane::open(&self.dir)?;
        let c = cp.client().await?;
        self.join_kube_node(&c, &cp, &st, &n).await?;
        let cidrs = kubelet::wait_pod_cidrs(
            &c,
            std::slice::from_ref(&n.name),
            Instant::now() + Duration::from_secs(60),
        )
        .await?;
        self.write_cni_files(&n, cidrs[&n.name])?;
        Ok(n)
    }

    /// Removes a node: stops its agent, runs `agent --cleanup` (which gives
    /// its subnet back), and deletes its namespace.
    pub fn remove_node(&self, node: &str) -> Result<(), LabError> {
        if self.state()?.kube {
            return Err(msg("remove-node is not supported in a --kube lab yet"));
        }
        self.stop_agent(node, true)?;
        let mut st = self.state()?;
        let n = self.node_in(&st, node)?;
        self.kill_role(&format!("forward-{node}"));
        Netns::delete_named(&n.netns)?;
        if let Ok(u) = Netns::named(&st.underlay_ns) {
            if let Ok(mut h) = Handle::in_netns(&u) {
                let _ = h.delete_link_by_name(&format!("to-{node}"));
            }
        }
        st.nodes.retain(|x| x.name != node);
        self.save(&st)
    }

    /// Stops a node's agent (SIGTERM: the data plane stays) and, with
    /// `cleanup`, runs `agent --cleanup` there, which removes everything
    /// the agent installed and gives the node's subnet back. The node's
    /// namespace stays, so what is left can be inspected.
    pub fn stop_agent(&self, node: &str, cleanup: bool) -> Result<Vec<String>, LabError> {
        let st = self.state()?;
        let n = self.node_in(&st, node)?;
        self.kill_role(&format!("agent-{node}"));
        if !cleanup {
            return Ok(vec![]);
        }
        let mut args = self.agent_args(&st, &n);
        args.push("--cleanup".into());
        let out = Netns::named(&n.netns)?
            .run(|| Command::new(&self.exe).args(&args).output())?
            .map_err(|e| io("running agent --cleanup", e))?;
        if !out.status.success() {
            return Err(msg(format!(
                "agent --cleanup on {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Kills a node's agent hard (SIGKILL) and starts it again.
    pub fn restart_agent(&self, node: &str) -> Result<(), LabError> {
        let st = self.state()?;
        let n = st
            .nodes
            .iter()
            .find(|n| n.name == node)
            .cloned()
            .ok_or_else(|| msg(format!("no node {node:?}")))?;
        let p = self.dir.join("pids").join(format!("agent-{node}"));
        if let Some(pid) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            wait_gone(pid);
        }
        self.start_agent(&st, &n)
    }
}

/// The number the next node of a lab gets (`node<N>`): one past the
/// highest, so a removed node's name is not reused.
fn next_node_index(st: &LabState) -> usize {
    st.nodes
        .iter()
        .filter_map(|n| n.name.strip_prefix("node")?.parse::<usize>().ok())
        .max()
        .unwrap_or(0)
        + 1
}
