//! `podnet bgp status`: the node's BGP sessions as its agent sees them
//! (the `/bgp` page on the agent's metrics address), as a table; with
//! `--lab`, every lab node's, read from inside its namespace.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};

/// One agent's table, or why there is none.
fn one(ns: Option<&podnet_kernel::Netns>, addr: SocketAddr, json: bool) -> Result<String> {
    let r = crate::trace::agent_get(ns)
        .get(addr, "/bgp")
        .with_context(|| format!("asking the agent at {addr} (is it running?)"))?;
    if r.status != 200 {
        bail!(
            "the agent at {addr} answered /bgp with {}: {}",
            r.status,
            r.body.trim()
        );
    }
    if json {
        return Ok(r.body + "\n");
    }
    let peers = podnet_bgp::status::parse(&r.body).map_err(anyhow::Error::msg)?;
    if peers.is_empty() {
        return Ok("no BGP neighbours (is the backend bgp?)\n".into());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Ok(podnet_bgp::status::table(&peers, now))
}

/// `podnet bgp status`.
pub fn status(agent: &str, lab: Option<&str>, output: &str) -> Result<()> {
    let json = match output {
        "table" => false,
        "json" => true,
        o => bail!("-o {o:?}: want table or json"),
    };
    let addr: SocketAddr = agent
        .parse()
        .with_context(|| format!("--agent {agent:?}: want ADDRESS:PORT"))?;
    let Some(name) = lab else {
        print!("{}", one(None, addr, json)?);
        return Ok(());
    };
    let exe = std::fs::canonicalize("/proc/self/exe")?;
    let st = podnet_lab::Lab::new(name, exe)?.state()?;
    for n in &st.nodes {
        let ns = podnet_kernel::Netns::named(&n.netns)?;
        println!("{} ({}):", n.name, n.ip);
        match one(Some(&ns), addr, json) {
            Ok(t) => print!("{t}"),
            Err(e) => println!("  {e:#}"),
        }
    }
    Ok(())
}
